"""The ZMQ transport (tarserve -> Receiver) against raw pyzmq, tensorcom's figure and the decode stage.

Rows: loopback GB/s of 38.5 MB uint8 batches through ``tarproc.transport`` (acknowledged
delivery, the default) against raw pyzmq PUSH/PULL sending the same buffer without copies
(target ≥ 0.90×) and against the same transport without acknowledgements (``Sender(ack=False)``, fire
and forget: target within 10 %); the same with 77 MB float16
batches against tensorcom's published 1.26 GB/s (target ≥ 1.7×; raw pyzmq float16 in a note);
``tarserve --device cpu`` end to end (shards -> decoded batches at a Receiver) against
``tardecode`` alone (target ≥ 0.85×); ``--device gpu`` when a GPU is present.

Everything runs on 127.0.0.1. The sender is always a separate process; the receiver is this one.
Transfer rows time from the first batch received to the last (connection set-up and the sender's
start-up excluded; the bytes are those of the batches after the first); end-to-end rows time
whole commands, start-up included.
"""

from __future__ import annotations

import gc
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from common import BIN, Context, Row, log, spread, yes_no

SECTION = "zmq"
HWM = 4
BATCH = 256
SHAPE = (BATCH, 3, 224, 224)  # 38.5 MB in uint8, 77 MB in float16
TENSORCOM_GBS = 1.26  # PRIOR_ART §4: tensorcom's loopback PUSH/PULL figure, 77 MB messages

# The sending side, a child process: ``mode`` is "tarproc" (tarproc.transport.Sender, acknowledged),
# "noack" (the same, fire and forget) or "raw" (pyzmq PUSH, the same buffer sent without copies);
# all send ``n`` batches of the same preallocated array, then the end of the stream.
SENDER_CHILD = """
import sys
import numpy as np
mode, dtype, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
shape = tuple(int(d) for d in sys.argv[5].split(","))
hwm = int(sys.argv[6])
rng = np.random.default_rng(0)
if dtype == "uint8":
    array = rng.integers(0, 256, shape, dtype=np.uint8)
else:
    array = rng.random(shape, dtype=np.float32).astype(dtype)
if mode in ("tarproc", "noack"):
    from tarproc.transport import Sender
    keys = [f"k{i:06d}" for i in range(shape[0])]
    with Sender(f"zpush://127.0.0.1:{port}", hwm=hwm, ack=mode == "tarproc") as s:
        for _ in range(n):
            s.send(keys, {"image": array}, epoch=0)
        s.end_epoch(0, final=True)
else:
    import zmq
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.connect(f"tcp://127.0.0.1:{port}")
    header = b"batch"
    for _ in range(n):
        sock.send_multipart([header, array], copy=False)
    sock.send_multipart([b"end"])
    sock.close(-1)
    context.term()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_sender(mode: str, dtype: str, port: int, n: int) -> subprocess.Popen[bytes]:
    args = [mode, dtype, str(port), str(n), ",".join(map(str, SHAPE)), str(HWM)]
    return subprocess.Popen([sys.executable, "-c", SENDER_CHILD, *args])


def finish(proc: subprocess.Popen[bytes], what: str) -> None:
    try:
        rc = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise RuntimeError(f"{what}: the sender did not exit") from None
    if rc != 0:
        raise RuntimeError(f"{what}: the sender exited with status {rc}")


def receive_tarproc(dtype: str, n: int, mode: str = "tarproc") -> tuple[float, int]:
    """Batches from a tarproc Sender (``mode``: "tarproc", acknowledged, or "noack") into a
    Receiver; (seconds from the first batch to the last, batches)."""
    from tarproc.transport import Receiver

    port = free_port()
    count = 0
    first = last = 0.0
    with Receiver(f"zpull://127.0.0.1:{port}", hwm=HWM, reuse_memory=True) as receiver:
        proc = start_sender(mode, dtype, port, n)
        try:
            for batch in receiver:
                _ = batch["image"][0, 0, 0, 0]  # touch it, as a consumer would
                last = time.perf_counter()
                if count == 0:
                    first = last
                count += 1
        finally:
            finish(proc, "tarproc transport")
    return last - first, count


def receive_raw(dtype: str, n: int, tuned: bool = False) -> tuple[float, int]:
    """The same over raw pyzmq PULL (copy=False, np.frombuffer); ``tuned``: with the Receiver's malloc settings."""
    import numpy as np
    import zmq

    if tuned:
        from tarproc.transport.receiver import tune_malloc

        tune_malloc()

    port = free_port()
    context = zmq.Context()
    sock = context.socket(zmq.PULL)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)
    sock.bind(f"tcp://127.0.0.1:{port}")
    count = 0
    first = last = 0.0
    proc = start_sender("raw", dtype, port, n)
    try:
        while True:
            frames = sock.recv_multipart(copy=False)
            if len(frames) == 1:
                break
            array = np.frombuffer(frames[1].buffer, dtype=dtype).reshape(SHAPE)
            _ = array[0, 0, 0, 0]
            last = time.perf_counter()
            if count == 0:
                first = last
            count += 1
            del frames, array
    finally:
        finish(proc, "raw pyzmq")
        sock.close(0)
        context.term()
    return last - first, count


def isolated(fn: Callable[..., tuple[float, int]], *args: Any) -> tuple[float, int]:
    """Run a receiving side in a fresh process: malloc settings are process-wide and must not leak."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def alternate_many(
    reps: int, sides: list[tuple[str, Callable[[], tuple[float, int]]]], expect: int, what: str
) -> list[list[float]]:
    """``common.alternate`` for measures that time themselves (each returns (seconds, count)), for any
    number of sides, taken in turn each repetition."""
    times: list[list[float]] = [[] for _ in sides]
    for r in range(reps):
        line = f"  rep {r + 1}:"
        for (name, run), out in zip(sides, times, strict=True):
            gc.collect()
            t, n = run()
            if n != expect:
                raise RuntimeError(f"{what}: {name} counted {n}, expected {expect}")
            out.append(t)
            line += f" {name} {t:.3f} s"
        log(line)
    return times


def serve_images(shard: str, device: str) -> tuple[float, int]:
    """``tarserve`` as a command into a Receiver here: (seconds from its start to the end of stream, images)."""
    from tarproc.transport import Receiver

    port = free_port()
    images = 0
    with Receiver(f"zpull://127.0.0.1:{port}", hwm=HWM, reuse_memory=True) as receiver:
        t0 = time.perf_counter()
        proc = subprocess.Popen([str(BIN / "tarserve"), shard, "--to", f"zpush://127.0.0.1:{port}", "--size", "224",
                                 "--device", device, "--threads", "2", "-b", "64", "-q"])
        try:
            for batch in receiver:
                _ = batch["image"][0, 0, 0, 0]
                images += batch.size
            seconds = time.perf_counter() - t0
        finally:
            finish(proc, "tarserve")
    return seconds, images


def decode_images(shard: str, device: str) -> tuple[float, int]:
    """``tardecode`` with the same options, output to /dev/null: (seconds, images it says it decoded)."""
    t0 = time.perf_counter()
    proc = subprocess.run([str(BIN / "tardecode"), shard, "--size", "224", "--device", device, "-p", "2",
                           "-b", "64", "-q", "--stats", "-o", "/dev/null"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"tardecode failed: {proc.stderr.strip()}")
    match = re.search(r"decoded (\d+) images", proc.stderr)
    if not match:
        raise RuntimeError(f"no --stats line from tardecode: {proc.stderr!r}")
    return seconds, int(match.group(1))


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    import numpy as np

    from tarproc.decode import dali_available, gpu_count

    rows: list[Row] = []
    notes: list[str] = []
    reps = ctx.reps
    n = 12 if ctx.quick else 30  # batches per repetition; the first one only starts the clock

    def gbs(times: list[float], dtype: str) -> float:
        size = int(np.prod(SHAPE)) * np.dtype(dtype).itemsize
        return (n - 1) * size / statistics.median(times) / 1e9

    for dtype in ("uint8", "float16"):
        log(f"zmq: {n} batches of {'x'.join(map(str, SHAPE))} {dtype} over tcp://127.0.0.1: tarproc, raw pyzmq "
            "with the same malloc settings, raw pyzmq as it comes (each receiver in a fresh process)")
        sides = [
            ("tarproc", lambda d=dtype: isolated(receive_tarproc, d, n)),  # type: ignore[misc]
            ("raw-tuned", lambda d=dtype: isolated(receive_raw, d, n, True)),  # type: ignore[misc]
            ("raw", lambda d=dtype: isolated(receive_raw, d, n, False)),  # type: ignore[misc]
        ]
        if dtype == "uint8":
            sides.append(("no-ack", lambda d=dtype: isolated(receive_tarproc, d, n, "noack")))  # type: ignore[misc]
        times = alternate_many(reps, sides, n, dtype)
        ta, tt, tb = times[:3]
        a, t, b = gbs(ta, dtype), gbs(tt, dtype), gbs(tb, dtype)
        if dtype == "uint8":
            rows.append(Row(f"loopback, batches of {BATCH}×3×224×224 uint8 (38.5 MB): `Sender` → `Receiver`, "
                            "separate processes, acknowledged delivery", a, "GB/s",
                            f"raw pyzmq PUSH/PULL, zero copy, HWM {HWM}, same malloc settings", t, "≥ 0.90×",
                            yes_no(a >= 0.9 * t)))
            f = gbs(times[3], dtype)
            rows.append(Row("the same, acknowledged delivery", a, "GB/s",
                            "the same without acknowledgements (`Sender(ack=False)`, fire and forget)", f, "≥ 0.90×",
                            yes_no(a >= 0.9 * f)))
            notes.append(f"uint8 transfer without acknowledgements: {spread(times[3])} ({f:.2f} GB/s)")
            rows.append(Row("the same, against raw pyzmq with glibc's default malloc (what a hand-written "
                            "pyzmq receiver gets)", a, "GB/s", "raw pyzmq PUSH/PULL, zero copy, default malloc", b,
                            "report", "—"))
        else:
            rows.append(Row("the same, float16 (77 MB batches)", a, "GB/s",
                            "tensorcom published figure, 1.26 GB/s (PRIOR_ART §4)", TENSORCOM_GBS, "≥ 1.7×",
                            yes_no(a >= 1.7 * TENSORCOM_GBS)))
        notes.append(f"{dtype} transfer ({n - 1} timed batches a rep): tarproc {spread(ta)}; raw pyzmq, same malloc "
                     f"settings {spread(tt)} ({t:.2f} GB/s); raw pyzmq, default malloc {spread(tb)} ({b:.2f} GB/s)")

    shard = str(ctx.data.jpeg)
    images = ctx.data.jpeg_samples
    log(f"zmq: tarserve --device cpu --threads 2 -b 64 into a Receiver vs tardecode -p 2, {images} JPEGs")
    ta, tb = alternate_many(reps, [("tarproc", lambda: serve_images(shard, "cpu")),
                                   ("baseline", lambda: decode_images(shard, "cpu"))], images, "end to end cpu")
    a, b = images / statistics.median(ta), images / statistics.median(tb)
    rows.append(Row("end to end: shards → batches at a `Receiver`, `tarserve --size 224 --device cpu --threads 2 "
                    "-b 64` (start-up included)", a, "img/s",
                    "decode stage alone: `tardecode --size 224 --device cpu -p 2 -b 64 -o /dev/null`", b,
                    "≥ 0.85×", yes_no(a >= 0.85 * b)))
    notes.append(f"end to end cpu: tarserve → Receiver {spread(ta)}; tardecode {spread(tb)}")

    if dali_available() and gpu_count() > 0:
        log("zmq: the same with --device gpu")
        ta, tb = alternate_many(reps, [("tarproc", lambda: serve_images(shard, "gpu")),
                                       ("baseline", lambda: decode_images(shard, "gpu"))], images, "end to end gpu")
        a, b = images / statistics.median(ta), images / statistics.median(tb)
        rows.append(Row("the same, `--device gpu`", a, "img/s", "`tardecode --device gpu` (same options)", b,
                        "report", "—"))
        notes.append(f"end to end gpu: tarserve → Receiver {spread(ta)}; tardecode {spread(tb)}")
    else:
        notes.append("end to end gpu: not measured: no GPU in this run")
    return rows, notes
