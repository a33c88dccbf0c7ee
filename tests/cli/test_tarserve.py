"""tarserve -> tarrecv as real processes: round trips, -p 2 key counts, faults, CURVE, usage errors."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pytest
from PIL import Image
from tarhelpers import free_port, lines_from, send_stray, wait_for

from tarproc.cli.tarkeys import main as tarkeys
from tarproc.cli.tarrecv import main as tarrecv
from tarproc.cli.tarserve import main as tarserve

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses Linux processes and ipc sockets")
TIMEOUT = 60


def jpeg(seed: int, w: int = 48, h: int = 40) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", quality=80)
    return buf.getvalue()


def shard_samples(shard: int, n: int) -> list[dict[str, object]]:
    return [{"__key__": f"s{shard}/{i:04d}", "jpg": jpeg(shard * 1000 + i), "cls": b"%d" % (i % 7),
             "json": b'{"i": %d}' % i} for i in range(n)]


def command(name: str, *args: object) -> list[str]:
    return [sys.executable, "-m", f"tarproc.cli.{name}", *map(str, args)]


def start(name: str, *args: object, **kw: object) -> subprocess.Popen:
    return subprocess.Popen(command(name, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def finish(process: subprocess.Popen, timeout: float = TIMEOUT) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def ended(process: subprocess.Popen) -> tuple[int, str]:
    """The exit status and stderr of a process whose stdout a ``lines_from`` thread reads."""
    code = process.wait(timeout=TIMEOUT)
    return code, process.stderr.read().decode(errors="replace")  # type: ignore[union-attr]


def test_raw_round_trip_is_byte_for_byte(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = cli.write_tar(tmp_path / "in.tar", shard_samples(0, 50))
    port = free_port()
    receiver = start("tarrecv", f"zpull://:{port}", "-o", tmp_path / "out.tar", "--stats")
    sender = start("tarserve", "--raw", src, "--to", f"zpush://127.0.0.1:{port}", "-b", 8, "-q", "--stats")
    code, _, err = finish(sender)
    assert code == 0, err
    assert "sent 7 batches, 50 samples" in err
    code, _, err = finish(receiver)
    assert code == 0, err
    assert (tmp_path / "out.tar").read_bytes() == src.read_bytes()
    assert "received 7 batches, 50 samples" in err and "lost 0, rejected 0" in err


def test_two_senders_decode_every_key_once_per_epoch(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    shards = [cli.write_tar(tmp_path / f"in-{s}.tar", shard_samples(s, 23)) for s in range(4)]
    feed = f"ipc://{tmp_path}/feed"
    receiver = start("tarrecv", f"zpull+{feed}", "-o", tmp_path / "out.tar")
    sender = start("tarserve", f"{tmp_path}/in-{{0..3}}.tar", f"zpush+{feed}", "-p", 2, "--epochs", 2,
                   "--shuffle-shards", "--shuffle", 10, "--seed", 3, "--decode", "cpu", "--size", 16,
                   "--label", "cls", "-f", "json", "-b", 8, "-q")
    code, _, err = finish(sender)
    assert code == 0, err
    code, _, err = finish(receiver)
    assert code == 0, err
    members = cli.members((tmp_path / "out.tar").read_bytes())  # keys repeat (2 epochs): read members
    counts = Counter(name.rsplit(".", 1)[0] for name, _ in members if name.endswith(".cls"))
    expected = {f"s{s}/{i:04d}" for s in range(4) for i in range(23)}
    assert set(counts) == expected and set(counts.values()) == {2}  # nothing lost, nothing twice
    fields = dict(members[:3])
    key = members[0][0].split(".", 1)[0]
    assert set(fields) == {f"{key}.image.npy", f"{key}.cls", f"{key}.json"}
    assert np.load(io.BytesIO(fields[f"{key}.image.npy"])).shape == (16, 16, 3)
    assert int(fields[f"{key}.cls"]) == int(key.rsplit("/", 1)[1]) % 7
    assert len(shards) == 4


def test_receiver_started_after_the_sender(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = cli.write_tar(tmp_path / "in.tar", shard_samples(0, 20))
    feed = f"ipc://{tmp_path}/feed"
    sender = start("tarserve", "--raw", src, "--to", f"zpush+{feed}", "-b", 4, "-q")
    time.sleep(1.5)  # the scenario: a receiver that comes late (a sender still starting is late too)
    assert sender.poll() is None  # waiting for a receiver, not failing
    receiver = start("tarrecv", f"zpull+{feed}", "-o", tmp_path / "out.tar")
    assert finish(sender)[0] == 0 and finish(receiver)[0] == 0
    assert (tmp_path / "out.tar").read_bytes() == src.read_bytes()


def test_sender_killed_is_reported_not_a_hang(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    for s in range(2):
        cli.write_tar(tmp_path / f"in-{s}.tar", shard_samples(s, 10))
    feed = f"ipc://{tmp_path}/feed"
    receiver = start("tarrecv", f"zpull+{feed}", "--timeout", 2)
    rates = lines_from(receiver.stdout)  # its first rate line comes once a batch has arrived
    sender = start("tarserve", "--raw", f"{tmp_path}/in-{{0..1}}.tar", "--to", f"zpush+{feed}", "-b", 2,
                   "--repeat", "-q", "-p", 2)
    # killed before any sender was heard of, the receiver would wait for one for ever (--wait 0)
    wait_for(lambda: rates, what="a batch reaching tarrecv")
    sender.kill()  # SIGKILL: no end-of-stream message; its sender processes die with it
    sender.communicate()
    code, err = ended(receiver)  # its --timeout of 2 s ends it; a hang fails after TIMEOUT
    assert code == 1
    assert "silent for" in err or "never sent anything" in err  # a sender still starting when killed
    # a warning when its connection closes, then the error
    lines = err.strip().splitlines()
    assert "Traceback" not in err and all("warning: " in line for line in lines[:-1]), err
    assert "hung up before the end of its stream" in err


def test_interrupted_sender_exits_130_and_the_receiver_says_so(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = cli.write_tar(tmp_path / "in.tar", shard_samples(0, 10))
    feed = f"ipc://{tmp_path}/feed"
    receiver = start("tarrecv", f"zpull+{feed}")
    rates = lines_from(receiver.stdout)  # its first rate line comes once a batch has arrived
    sender = start("tarserve", "--raw", src, "--to", f"zpush+{feed}", "-b", 2, "--repeat", "-q")
    wait_for(lambda: rates, what="a batch reaching tarrecv")
    sender.send_signal(signal.SIGINT)
    assert finish(sender)[0] == 130
    code, err = ended(receiver)
    assert code == 1 and "stopped before the end of its stream" in err


def test_garbage_on_the_port_is_rejected_and_reception_goes_on(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = cli.write_tar(tmp_path / "in.tar", shard_samples(0, 10))
    feed = f"ipc://{tmp_path}/feed"
    receiver = start("tarrecv", f"zpull+{feed}", "-o", tmp_path / "out.tar", "--stats")
    send_stray(feed, [[b"GET / HTTP/1.1", b"\r\n"]])  # from a DEALER, a wire v2 peer's socket type
    sender = start("tarserve", "--raw", src, "--to", f"zpush+{feed}", "-q")
    assert finish(sender)[0] == 0
    code, _, err = finish(receiver)
    assert code == 0, err
    assert "rejected a message" in err and "not a wire format message" in err and "rejected 1" in err
    assert (tmp_path / "out.tar").read_bytes() == src.read_bytes()


def test_curve_keys_from_the_command_line(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    keys = tmp_path / "keys"
    assert cli.run(tarkeys, [keys, "-q"]).exit_code == 0
    again = cli.run(tarkeys, [keys])
    assert again.exit_code == 1 and "use --overwrite" in again.stderr
    src = cli.write_tar(tmp_path / "in.tar", shard_samples(0, 10))
    port = free_port()
    # a receiver without the keys: both sides say so, at once (they used to wait for their timeouts)
    outsider = start("tarrecv", f"zpull://:{port}", "--wait", 3, "-o", tmp_path / "stolen.tar")
    sender = start("tarserve", "--raw", src, "--to", f"zpush://127.0.0.1:{port}", "--curve-keys", keys, "-q")
    code, _, err = finish(outsider)
    assert code == 1 and not (tmp_path / "stolen.tar").exists()
    # the receiver found out first, or the sender did and hung up (a listening receiver can't tell
    # that from a port scan: it says so, and waits on)
    assert (err.strip() == f"tarrecv: error: a sender connected to zpull://:{port} uses CURVE and this receiver "
                           "does not: give it --curve-keys"
            or ("hung up during the handshake: a sender using CURVE" in err and "no sender for 3 s" in err)), err
    code, _, err = finish(sender)  # within TIMEOUT: its send timeout, 120 s, was not waited for
    assert code == 1
    assert (f"the receiver at zpush://127.0.0.1:{port} does not use CURVE" in err
            or f"the receiver at zpush://127.0.0.1:{port} hung up during the CURVE handshake" in err), err
    receiver = start("tarrecv", f"zpull://:{port}", "--curve-keys", keys, "-o", tmp_path / "out.tar")
    sender = start("tarserve", "--raw", src, "--to", f"zpush://127.0.0.1:{port}", "--curve-keys", keys, "-q")
    assert finish(sender)[0] == 0
    code, _, err = finish(receiver)
    assert code == 0, err
    assert (tmp_path / "out.tar").read_bytes() == src.read_bytes()


def test_monitor_mode_prints_rates_to_stdout(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = cli.write_tar(tmp_path / "in.tar", shard_samples(0, 30))
    feed = f"ipc://{tmp_path}/feed"
    receiver = start("tarrecv", f"zpull+{feed}", "--interval", 0.1)
    sender = start("tarserve", src, "--to", f"zpush+{feed}", "--device", "cpu", "--size", 16, "-b", 4, "-q")
    assert finish(sender)[0] == 0
    code, out, err = finish(receiver)
    assert code == 0, err
    # rate lines come only for transfers longer than 0.1 s (test_tarrecv_messages.py)
    assert out.splitlines()[-1].startswith("received 8 batches, 30 samples") and err == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["in.tar"], "no destination"),
        (["in.tar", "--to", "http://x:1"], "bad ZMQ URL"),
        (["in.tar", "--to", "zpull://:7880"], "this side sends"),
        (["-", "--to", "zpush://h:1", "-p", "2"], "stdin can be read once"),
        (["in.tar", "--to", "zrpush://:7880", "-p", "2"], "can't share 1 bound endpoint"),
        (["in.tar", "--to", "zpush://h:1", "--label", "image"], "also the image tensor"),
    ],
)
def test_usage_errors_exit_2(cli, args, message) -> None:  # type: ignore[no-untyped-def]
    result = cli.run(tarserve, args)
    assert result.exit_code == 2 and message in result.stderr


def test_tarrecv_usage_errors(cli) -> None:  # type: ignore[no-untyped-def]
    assert cli.run(tarrecv, []).exit_code == 2
    result = cli.run(tarrecv, ["zpush://h:1"])
    assert result.exit_code == 2 and "this side receives" in result.stderr


def test_a_bad_label_is_a_one_line_error(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    src = cli.write_tar(tmp_path / "in.tar", [{"__key__": "a", "jpg": jpeg(1), "cls": b"cat"}])
    feed = f"ipc://{tmp_path}/feed"
    result = cli.run(tarserve, [src, "--to", f"zpush+{feed}", "--device", "cpu", "--label", "cls", "-q",
                                "--send-timeout", "1"])
    assert result.exit_code == 1
    assert "field 'cls' of sample 'a' is not an integer" in result.stderr and len(result.stderr.splitlines()) == 1
