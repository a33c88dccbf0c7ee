"""tarrecv and odd messages: whatever a peer sends, tarrecv rejects it with a line that names the
peer, or writes it, or stops with a one-line error; never an internal error. Its rate lines and
summary say nothing silly about short transfers. Mismatched CURVE keys are said within seconds."""

from __future__ import annotations

import io
import random
import re
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
import zmq
from tarhelpers import send_stray, wait_for

from tarproc.cli.tarrecv import batch_samples
from tarproc.errors import TarprocError
from tarproc.tar import TarWriter
from tarproc.transport import Sender
from tarproc.transport.curve import generate_keys
from tarproc.transport.wire import DTYPES, MessageError, decode, to_batch

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses Linux processes and ipc sockets")
TIMEOUT = 60
IDS = {"sender": "host:7:0", "group": "g", "rank": 0, "senders": 1}


def start(name: str, *args: object) -> subprocess.Popen:
    command = [sys.executable, "-m", f"tarproc.cli.{name}", *map(str, args)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def finish(process: subprocess.Popen, timeout: float = TIMEOUT) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def batch_message(keys: list[str], entries: list[dict], frames: list[bytes], **header: object) -> list[bytes]:
    """A batch message made by hand: any header, whatever encode_batch would refuse."""
    head = {"v": 2, "kind": "batch", **IDS, "epoch": 0, "seq": 0, "n": len(keys), "keys": keys, "tensors": entries}
    return [msgpack.packb({**head, **header}), *frames]


# -- odd but well-formed batches, through tarrecv's writing ---------------------------------------


def random_batch(rng: random.Random) -> list[bytes]:
    """A batch whose frames fit its header, with odd keys, names, dtypes, shapes and text flags."""
    n = rng.randrange(0, 4)
    key_pool = ["a", "b/c", "", "a.b", "../x", "__meta__", "ü", "a", "x/", "k" * 300, "\x00"]
    keys = [rng.choice(key_pool) for _ in range(n)]
    name_pool = ["x", "cls", "x.npy", "X", "a/b", "__url__", "ü", "json", "x.cls", "\x00", "jpg"]
    entries, frames = [], []
    for _ in range(rng.randrange(0, 4)):
        name = rng.choice(name_pool)
        dtype = rng.choice([*DTYPES, "bytes"])
        kind = rng.choice(["stacked", "ragged", "bytes"]) if dtype != "bytes" else "bytes"
        if kind == "bytes":
            sizes = [rng.choice([None, 0, 3]) for _ in range(n)]
            entry = {"name": name, "dtype": "bytes", "sizes": sizes}
            frames += [rng.randbytes(s) for s in sizes if s is not None]
        else:
            itemsize = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
            if kind == "stacked":
                shape = [n, *[rng.randrange(0, 3) for _ in range(rng.randrange(0, 3))]]
                entry = {"name": name, "dtype": dtype, "shape": shape}
                frames.append(rng.randbytes(int(np.prod(shape)) * itemsize))
            else:
                shapes = [[rng.randrange(0, 3) for _ in range(rng.randrange(0, 3))] for _ in range(n)]
                entry = {"name": name, "dtype": dtype, "shapes": shapes}
                frames += [rng.randbytes(int(np.prod(s)) * itemsize) for s in shapes]
        if rng.random() < 0.4:
            entry["text"] = rng.choice([True, True, False, 1])
        entries.append(entry)
    return batch_message(keys, entries, frames)


def test_odd_batches_are_rejected_written_or_a_named_error() -> None:
    """What tarrecv -o does with a batch: decode, one sample per key, the tar writer."""
    rng = random.Random(7)
    outcomes = {"rejected": 0, "written": 0, "refused by the writer": 0}
    for round_ in range(1500):
        frames = random_batch(rng)
        try:
            batch = to_batch(decode(frames, "ipc:///feed"))
        except MessageError:
            outcomes["rejected"] += 1
            continue
        try:
            writer = TarWriter(io.BytesIO())
            for sample in batch_samples(batch):
                writer.write_sample(sample)
            writer.close()
            outcomes["written"] += 1
        except TarprocError:  # a key or field the tar can't hold: one line, exit 1
            outcomes["refused by the writer"] += 1
        except Exception as e:  # noqa: BLE001 - what the test is for
            pytest.fail(f"round {round_}: {type(e).__name__}: {e}: {msgpack.unpackb(frames[0])}")
    assert all(outcomes.values()), outcomes


def test_a_text_flag_on_a_float_matrix_is_rejected_naming_the_sender(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """It used to reach the tar writer and end tarrecv with an internal error."""
    feed = f"ipc://{tmp_path}/feed"
    receiver = start("tarrecv", f"zpull+{feed}", "-o", tmp_path / "out.tar", "--stats")
    bad = batch_message(["a", "b"], [{"name": "x", "dtype": "float32", "shape": [2, 3], "text": True}],
                        [bytes(24)], sender="stray:1:0", group="other")
    send_stray(feed, [bad])  # from a DEALER, a wire v2 peer's socket type
    with Sender(f"zpush+{feed}", heartbeat=0.1) as sender:
        sender.send(["k1", "k2"], {"cls": np.array([3, 4]), "x": np.ones((2, 3), np.float32)}, epoch=0, text=["cls"])
    code, _, err = finish(receiver)
    assert code == 0, err
    assert "internal error" not in err and "Traceback" not in err
    assert ("rejected a message from process " in err and "(sender stray:1:0)" in err
            and "tensor 'x' (float32 of shape [2, 3]) is marked text: only a 1-D integer tensor can be" in err), err
    written = dict((k, v) for k, v in _members(tmp_path / "out.tar"))
    assert written["k1.cls"] == b"3" and written["k2.cls"] == b"4" and "k1.x.npy" in written


def _members(path) -> list[tuple[str, bytes]]:  # type: ignore[no-untyped-def]
    import tarfile

    with tarfile.open(path) as tf:
        return [(m.name, tf.extractfile(m).read()) for m in tf if m.isfile()]  # type: ignore[union-attr]


# -- the summary and the rate lines ---------------------------------------------------------------


def test_one_batch_says_no_rate(tmp_path) -> None:  # type: ignore[no-untyped-def]
    feed = f"ipc://{tmp_path}/feed"
    receiver = start("tarrecv", f"zpull+{feed}")
    with Sender(f"zpush+{feed}", heartbeat=0.1) as sender:
        sender.send(["a", "b"], {"x": np.zeros((2, 3), np.uint8)}, epoch=0)
    code, out, err = finish(receiver)
    assert code == 0, err
    assert out.strip() == ("received 1 batch, 2 samples, 6 bytes from 1 sender(s); 1 epoch(s) ended; "
                           "lost 0, rejected 0, sent again 0, dropped as taken before 0"), out


def test_rates_come_with_their_time_since_the_first_batch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    feed = f"ipc://{tmp_path}/feed"
    receiver = start("tarrecv", f"zpull+{feed}", "--interval", 0.1)
    wait_for((tmp_path / "feed").exists, what="tarrecv binding its socket")
    time.sleep(1.0)  # the scenario: a receiver waits for its sender, and that is not transfer time
    first_sent = time.monotonic()
    with Sender(f"zpush+{feed}", heartbeat=0.1) as sender:
        for i in range(8):
            sender.send([str(i)], {"x": np.zeros((1, 1000), np.uint8)}, epoch=0)
            time.sleep(0.05)  # batches 50 ms apart
    code, out, err = finish(receiver)
    ended = time.monotonic()
    assert code == 0, err
    *lines, summary = out.strip().splitlines()
    assert lines and all("batches/s" in line for line in lines)
    match = re.match(r"received 8 batches, 8 samples, 8000 bytes from 1 sender\(s\) in (\d+(?:\.\d+)?) (m?s): ",
                     summary)
    assert match, summary
    # the time is counted from the first batch, which was not sent before first_sent (the old
    # time, since the receiver started, was a second longer); the rate is over that time
    seconds = float(match[1]) / (1000 if match[2] == "ms" else 1)  # three significant digits
    assert seconds <= (ended - first_sent) * 1.005, summary
    rate = float(summary.split(": ")[1].split(" batches/s")[0])
    assert rate * seconds == pytest.approx(7, rel=0.01), summary  # the 7 batches after the first


# -- CURVE ------------------------------------------------------------------------------------------


@pytest.mark.skipif(not zmq.has("curve") or zmq.zmq_version_info() < (4, 3), reason="no CURVE handshake events")
def test_tarrecv_with_other_curve_keys_says_so_within_seconds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    generate_keys(tmp_path / "keys")
    generate_keys(tmp_path / "other")
    with open(tmp_path / "in.tar", "wb") as f, TarWriter(f) as writer:
        writer.write_sample({"__key__": "a", "txt": b"hello"})
    feed = f"ipc://{tmp_path}/feed"
    receiver = start("tarrecv", f"zpull+{feed}", "--curve-keys", tmp_path / "other")  # --wait 0: for ever
    wait_for((tmp_path / "feed").exists, what="tarrecv binding its socket")
    sender = start("tarserve", "--raw", tmp_path / "in.tar", "--to", f"zpush+{feed}", "--curve-keys",
                   tmp_path / "keys", "-q")  # --send-timeout 120: within TIMEOUT, neither waits for a timeout
    code, _, err = finish(receiver)
    assert code == 1
    assert err.strip().splitlines() == [
        f"tarrecv: error: a sender connected to zpull+{feed} hung up during the CURVE handshake: it has other keys "
        "(another tarkeys directory) or none, or it is not a tarserve; give both sides the same --curve-keys "
        "directory"], err
    code, _, err = finish(sender)
    assert code == 1
    assert err.strip().splitlines() == [
        f"tarserve: error: the CURVE handshake with the receiver at zpush+{feed} failed: it has other keys (another "
        "tarkeys directory); give both sides the same --curve-keys directory"], err
