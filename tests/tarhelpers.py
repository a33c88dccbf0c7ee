"""Helpers shared by several test folders (importable because pytest's pythonpath has tests/)."""

from __future__ import annotations

import io
import os
import socket
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner

from tarproc import TarWriter, read_samples


def tarfile_members(data: bytes) -> list[tuple[str, bytes]]:
    """``(name, data)`` of every regular member, read by Python's tarfile (an independent reader)."""
    out = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
        for info in tf:
            if info.isfile():
                f = tf.extractfile(info)
                assert f is not None
                out.append((info.name, f.read()))
    return out


def run(command: Any, args: Iterable[Any], input: bytes | str | None = None, **kw: Any) -> Any:
    """Invoke a command in-process; stdout and stderr are kept apart (click >= 8.2)."""
    return CliRunner().invoke(command, [str(a) for a in args], input=input, catch_exceptions=False, **kw)


def tar_bytes(samples: Iterable[dict[str, Any]], **writer_kw: Any) -> bytes:
    """A tar of ``samples`` written by tarproc's TarWriter."""
    buf = io.BytesIO()
    with TarWriter(buf, **writer_kw) as w:
        for sample in samples:
            w.write_sample(sample)
    return buf.getvalue()


def write_tar(path: str | os.PathLike[str], samples: Iterable[dict[str, Any]], **writer_kw: Any) -> Path:
    Path(path).write_bytes(tar_bytes(samples, **writer_kw))
    return Path(path)


def tarfile_shard(path: Path, members: Iterable[tuple[str, Any]], fmt: int = tarfile.GNU_FORMAT,
                  link: bytes = tarfile.SYMTYPE) -> Path:
    """A tar written by Python's tarfile in format ``fmt``: members are (name, bytes) files, (name,
    None) directories and (name, "->target") links of type ``link`` (tarfile.LNKTYPE: hard)."""
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            elif isinstance(data, str):
                info.type = link
                info.linkname = data[2:]
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return path


def samples(
    source: bytes | str | os.PathLike[str] | list[str], **kw: Any
) -> list[tuple[str, dict[str, bytes]]]:
    """Samples read by tarproc, ``[(key, {field: bytes})]``, from tar bytes, a URL or a list of URLs."""
    if isinstance(source, (bytes, bytearray)):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "data.tar")
            Path(path).write_bytes(source)
            return samples(path, **kw)
    urls = [str(u) for u in source] if isinstance(source, list) else str(source)
    return [
        (s["__key__"], {k: bytes(v) for k, v in s.items() if not k.startswith("__")})
        for s in read_samples(urls, **kw)
    ]


def write_sparse_file(path: str | os.PathLike[str], regions: int, gap: int = 200_000, tail: int = 100) -> bytes:
    """A file with holes: ``DATA<i>`` every ``gap`` bytes, ``regions`` times, then ``tail`` more
    bytes of hole (GNU tar --sparse stores it as a sparse member where the file system keeps holes);
    returns its bytes."""
    with open(path, "wb") as f:
        for i in range(regions):
            f.seek(i * gap)
            f.write(b"DATA%d" % i)
        f.truncate(regions * gap + tail)
    return Path(path).read_bytes()


def rank_batches(paths: Any, world: int, workers: int, *, state: dict | None = None, stop: int | None = None,
                 epoch: int | None = None, **kwargs: Any) -> tuple[list[list[list[str]]], dict | None]:
    """Every rank's batches of keys (one epoch, or ``stop`` steps) through ``ds.loader(num_workers=
    workers)`` after ``state`` if given, and rank 0's state at the stop (through JSON, as a saved one)."""
    import json

    from tarproc.dataset import Dataset

    out, saved = [], None
    for rank in range(world):
        ds = Dataset(paths, rank=rank, world_size=world, **kwargs)
        if epoch is not None:
            ds.set_epoch(epoch)
        loader = ds.loader(num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        batches: list[list[str]] = []
        for (keys,) in loader:
            batches.append(list(keys))
            if stop is not None and len(batches) == stop:
                break
        if rank == 0 and stop is not None:
            saved = json.loads(json.dumps(loader.state_dict()))
        out.append(batches)
    return out, saved


def photo(w: int, h: int, seed: int) -> Any:
    """A uint8 RGB array that compresses like a photo: smooth colour fields plus grain (seeded)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, 128 + 60 * np.sin(x / 9) * np.cos(y / 13)], axis=-1)
    return np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)


def encode_image(array: Any, fmt: str = "JPEG", mode: str | None = None, **kw: Any) -> bytes:
    """An image file (JPEG by default) of a numpy array, through Pillow; ``mode`` converts first."""
    from PIL import Image

    im = Image.fromarray(array)
    if mode:
        im = im.convert(mode)
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


# ------------------------------------------------------------------------------------------------
# processes (Linux /proc): what the tests check is left running after a stop


class Process(NamedTuple):
    pid: int
    state: str  # "R", "S", ... "Z" for a zombie
    ppid: int
    pgrp: int
    cmdline: bytes


def processes() -> list[Process]:
    """Every process, from /proc (Linux); those that vanish while being read are left out."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        out.append(Process(int(entry), fields[0].decode(), int(fields[1]), int(fields[2]), cmdline))
    return out


def children(pid: int | None = None) -> list[int]:
    """Direct child processes of ``pid`` (default: this process), zombies included."""
    parent = os.getpid() if pid is None else pid
    return [p.pid for p in processes() if p.ppid == parent]


def signal_masks(pid: int) -> tuple[int, int]:
    """(ignored, caught) signal masks of a process, from /proc: bit ``signum - 1`` set."""
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    return int(fields["SigIgn"], 16), int(fields["SigCgt"], 16)


def assert_workers_leave_signals_to_parent(workers: list[int]) -> None:
    """Each worker ignores Ctrl-C and does not run the parent's SIGTERM handler (it sets them as it
    starts: waited for)."""
    import signal

    assert workers
    for pid in workers:
        wait_for(lambda pid=pid: signal_masks(pid)[0] & (1 << (signal.SIGINT - 1)), what=f"worker {pid} ignoring Ctrl-C")
        assert not signal_masks(pid)[1] & (1 << (signal.SIGTERM - 1)), "the worker runs the parent's SIGTERM handler"


def live_processes_with(marker: str) -> list[int]:
    """Processes (not zombies) whose command line contains ``marker``."""
    return [p.pid for p in processes() if marker.encode() in p.cmdline and p.state not in ("Z", "X")]


def live_group_members(pgid: int) -> list[int]:
    """Processes (not zombies) whose process group is ``pgid``."""
    return [p.pid for p in processes() if p.pgrp == pgid and p.state not in ("Z", "X")]


def settled(probe: Callable[[], list[Any]], timeout: float = 60.0, interval: float = 0.02) -> list[Any]:
    """``probe()`` once it is empty, or its last result after ``timeout`` seconds (signals and
    reaping are asynchronous: give killed processes a moment to go)."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(interval)


# ------------------------------------------------------------------------------------------------
# waiting on events, and ports: what keeps the tests right on a busy machine

# How long a test waits for something that happens within a second on an idle machine. A busy one
# (two CPU burners beside the suite) can take ten times as long. Only a hang takes longer.
PATIENCE = 60.0


def wait_for(predicate: Callable[[], Any], timeout: float = PATIENCE, what: str = "", interval: float = 0.02) -> Any:
    """``predicate()``'s first true value, polled every ``interval`` seconds. After ``timeout``
    seconds the test fails, saying ``what`` never happened.

    >>> wait_for(lambda: 42, what="the answer")
    42
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s, and {what or 'the condition'} never happened", pytrace=False)
        time.sleep(interval)


def lines_from(stream: Any) -> list[bytes]:
    """A list that a thread fills with the lines of ``stream`` (a process's stdout) as they come.
    The pipe never fills up, and a test can ``wait_for`` a line."""
    import threading

    lines: list[bytes] = []

    def read() -> None:
        for line in stream:
            lines.append(line)

    threading.Thread(target=read, name="test-lines", daemon=True).start()
    return lines


def send_stray(address: str, messages: list[list[bytes]], kind: str = "DEALER") -> None:
    """Send ``messages`` to ``address`` from a ZMQ socket of type ``kind`` that is no tarproc peer.

    It returns once they have left (the socket lingers until then), however long the receiver takes
    to bind. A message dropped unsent would leave the test without the thing it tests.
    """
    import zmq

    context = zmq.Context()
    stray = context.socket(getattr(zmq, kind))
    stray.connect(address)
    for frames in messages:
        stray.send_multipart(frames)
    stray.close(linger=int(PATIENCE * 1000))
    context.term()  # waits for the linger


def connect_and_hang_up(address: str, kind: str) -> None:
    """Connect a ZMQ socket of type ``kind`` to ``address`` and close it once its handshake with
    the peer there has failed or the peer has let it go (a socket of a type the peer refuses)."""
    import zmq
    from zmq.utils.monitor import recv_monitor_message

    context = zmq.Context()
    sock = context.socket(getattr(zmq, kind))
    monitor = sock.get_monitor_socket()
    sock.connect(address)
    ended = zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    deadline = time.monotonic() + PATIENCE
    try:
        while True:
            if not monitor.poll(max(1, int((deadline - time.monotonic()) * 1000))):
                pytest.fail(f"a {kind} socket's handshake with {address} neither failed nor ended", pytrace=False)
            if recv_monitor_message(monitor)["event"] & ended:
                return
    finally:
        sock.disable_monitor()
        monitor.close(0)
        sock.close(0)
        context.term()


_held_ports: list[socket.socket] = []


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing else gets until the test ends.

    A socket stays bound to it, not listening, with SO_REUSEADDR. The kernel hands that port to no
    other socket. A server that sets SO_REUSEADDR too (ZMQ, http.server, Slurm) can still bind it
    and listen, and a connection while nobody listens is refused as on a free port. The
    ``_release_ports`` fixture (tests/conftest.py) closes the holders after each test.
    """
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    _held_ports.append(holder)
    return int(holder.getsockname()[1])


def release_ports() -> None:
    """Close the sockets that hold the ports ``free_port`` gave out."""
    while _held_ports:
        _held_ports.pop().close()


def built(c_value: Any) -> Any:
    """A C fast path (``c_value``), skipping the test where it is not built (None)."""
    if c_value is None:
        pytest.skip("tarproc._speedups is not built (or TARPROC_PURE_PYTHON is set)")
    return c_value


def c_or_python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, module: Any, name: str,
                c_value: Any) -> str:
    """For a fixture with params ["c-...", "python-..."]: set ``module.name`` to the C fast path
    (``c_value``; the test is skipped when it is not built) or to None (the Python reference)."""
    if request.param.startswith("c-"):
        monkeypatch.setattr(module, name, built(c_value))
    else:
        monkeypatch.setattr(module, name, None)
    return str(request.param)


TORCHRUN_JOB = Path(__file__).parent / "interop" / "torchrun_job.py"


def torchrun(directory: Path, shards: list[str], ranks: int, runs: list[dict[str, Any]], base: dict[str, Any],
             timeout: int = 60, env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]], str]:
    """Start ``torchrun`` (gloo, on 127.0.0.1) with ``ranks`` ranks on tests/interop/torchrun_job.py,
    for ``runs`` (each a name, the Dataset's keyword arguments over ``base``, workers...): its exit
    status, each rank's results, its stderr."""
    import json
    import subprocess
    import sys

    out = directory / f"out-{len(list(directory.iterdir()))}"
    out.mkdir()
    spec = {"shards": shards, "out": str(out), "timeout": timeout,
            "runs": [{"dataset": base, "workers": 1, **r} for r in runs]}
    port = free_port()  # torch's TCPStore sets SO_REUSEADDR
    env = {**os.environ, **(env or {}), "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(port), str(TORCHRUN_JOB), json.dumps(spec)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    results = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)] if proc.returncode == 0 else []
    return proc.returncode, results, proc.stderr
