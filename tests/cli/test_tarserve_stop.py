"""A polite stop of tarserve (SIGTERM, Ctrl-C), with real processes.

With --checkpoint it is a pause: tarserve saves its checkpoint, tells its receivers, and exits
143 (SIGTERM) or 130 (Ctrl-C); a receiver says once that it waits, waits however long (past its
--timeout), and when the same command is run again the stream resumes: every sample reaches the
consumer exactly once. Without a checkpoint the receivers stop with a clear one-line error.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from tarhelpers import wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses Linux processes and ipc sockets")
TIMEOUT = 90

CONSUMER = """
import sys, time
from tarproc.transport import Receiver
url, log = sys.argv[1], sys.argv[2]
receiver = Receiver(url, timeout=4, wait=60)  # a pause lasts longer than the timeout: it is waited through
with open(log, "a") as out:
    for batch in receiver:
        for key in batch["__key__"]:
            out.write(f"{key}\\n")
        out.flush()
        time.sleep(0.01)
    out.write("END\\n")
"""


def tarserve(*args: object, group: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tarproc.cli.tarserve", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=group)


def finish(process: subprocess.Popen) -> tuple[int, str]:
    _, err = process.communicate(timeout=TIMEOUT)
    return process.returncode, err.decode(errors="replace")


def lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def shards(cli, tmp_path: Path, count: int, per_shard: int) -> tuple[list[Path], list[str]]:  # type: ignore[no-untyped-def]
    paths, keys = [], []
    for shard in range(count):
        data = [{"__key__": f"s{shard}-{i:05d}", "txt": f"{shard}-{i}".encode()} for i in range(per_shard)]
        paths.append(cli.write_tar(tmp_path / f"in-{shard}.tar", data))
        keys += [str(s["__key__"]) for s in data]
    return paths, keys


@pytest.mark.parametrize(("senders", "how"), [(1, "SIGTERM"), (1, "Ctrl-C"), (2, "SIGTERM"), (2, "Ctrl-C")])
def test_a_polite_stop_with_a_checkpoint_is_a_pause(cli, tmp_path, senders, how) -> None:  # type: ignore[no-untyped-def]
    paths, keys = shards(cli, tmp_path, 2, 1500)
    feed = f"ipc://{tmp_path}/feed"
    log = tmp_path / "taken"
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, f"zpull+{feed}", str(log)], stderr=subprocess.PIPE)
    args = ("--raw", *paths, "--to", f"zpush+{feed}", "-b", 10, "-q", "--stats", "--checkpoint",
            tmp_path / "feed.ckpt", "--shuffle", 50, "-p", senders)
    sender = tarserve(*args, group=True)
    wait_for(lambda: len(lines(log)) >= 300)
    if how == "SIGTERM":  # a kill, a pod stop: the parent process only
        sender.send_signal(signal.SIGTERM)
    else:  # Ctrl-C: the terminal signals the whole process group
        os.killpg(sender.pid, signal.SIGINT)
    code, err = finish(sender)
    assert code == (143 if how == "SIGTERM" else 130), err
    assert "Traceback" not in err and "error" not in err, err
    taken = len(lines(log))
    assert taken < len(keys), "the stream ended before the stop: make it longer"
    time.sleep(5)  # the scenario: a pause past the consumer's timeout of 4 s
    assert consumer.poll() is None, consumer.stderr.read().decode() if consumer.stderr else ""
    code, err = finish(tarserve(*args))
    assert code == 0 and "(resumed from" in err, err
    consumer.wait(timeout=TIMEOUT)
    said = consumer.stderr.read().decode() if consumer.stderr else ""
    assert consumer.returncode == 0, said
    # Python shows a warning as 'FILE:LINE: NetworkWarning: MESSAGE' and then the source line that
    # gave it, which holds these words too: count the warnings
    paused = [line for line in said.splitlines()
              if "NetworkWarning: " in line and "paused: tarserve was stopped and saved its checkpoint" in line]
    assert len(paused) == senders, said
    assert "hung up" not in said and "Traceback" not in said, said
    taken_keys = lines(log)
    assert taken_keys[-1] == "END"
    counts = Counter(taken_keys[:-1])
    assert set(counts) == set(keys) and set(counts.values()) == {1}, (
        f"missing {sorted(set(keys) - set(counts))[:5]}, twice {[k for k, n in counts.items() if n > 1][:5]}")


def test_tarrecv_writes_one_whole_tar_through_a_pause(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """tarrecv -o through a SIGTERM of tarserve -p 2 and its restart: the tar a run without a stop
    writes, each sample once, and the pause said once per sender."""
    paths, keys = shards(cli, tmp_path, 2, 3000)
    feed = f"ipc://{tmp_path}/feed"
    out = tmp_path / "y.tar"
    receiver = subprocess.Popen([sys.executable, "-m", "tarproc.cli.tarrecv", f"zpull+{feed}", "-o", out,
                                 "--timeout", "4"], stderr=subprocess.PIPE)
    args = ("--raw", *paths, "--to", f"zpush+{feed}", "-b", 10, "-q", "--checkpoint", tmp_path / "feed.ckpt",
            "-p", 2)
    sender = tarserve(*args)
    wait_for(lambda: (tmp_path / "y.tar.part").exists() and (tmp_path / "y.tar.part").stat().st_size > 200_000)
    sender.send_signal(signal.SIGTERM)
    assert finish(sender)[0] == 143
    time.sleep(5)  # the scenario: a pause past the receiver's timeout of 4 s
    assert receiver.poll() is None, receiver.stderr.read().decode() if receiver.stderr else ""
    code, err = finish(tarserve(*args))
    assert code == 0, err
    _, err_bytes = receiver.communicate(timeout=TIMEOUT)
    said = err_bytes.decode(errors="replace")
    assert receiver.returncode == 0, said
    assert said.count("waiting for the stream to resume") == 2, said
    received = [key for key, _ in cli.samples(out.read_bytes())]
    assert sorted(received) == sorted(keys)


def test_a_polite_stop_without_a_checkpoint_is_a_clear_error_for_the_receiver(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    paths, _ = shards(cli, tmp_path, 1, 6000)
    feed = f"ipc://{tmp_path}/feed"
    out = tmp_path / "y.tar"
    receiver = subprocess.Popen([sys.executable, "-m", "tarproc.cli.tarrecv", f"zpull+{feed}", "-o", out],
                                stderr=subprocess.PIPE)
    sender = tarserve("--raw", *paths, "--to", f"zpush+{feed}", "-b", 10, "-q")
    wait_for(lambda: (tmp_path / "y.tar.part").exists() and (tmp_path / "y.tar.part").stat().st_size > 100_000)
    sender.send_signal(signal.SIGTERM)
    code, err = finish(sender)
    assert code == 143 and err.strip() == "tarserve: terminated", err
    _, err_bytes = receiver.communicate(timeout=TIMEOUT)
    said = err_bytes.decode(errors="replace")
    assert receiver.returncode == 1, said
    error = [line for line in said.splitlines() if "error" in line]
    assert len(error) == 1 and "stopped before the end of its stream (interrupted)" in error[0], said
    assert "no --checkpoint to resume from" in error[0] and "Traceback" not in said
