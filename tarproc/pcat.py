"""Read many shards at once and interleave their samples (what ``tarpcat`` does).

``parallel_samples(urls, readers=4)`` reads up to ``readers`` shards concurrently, each in its own
thread with a bounded buffer in front of it, and yields their samples interleaved. Threads are
right here: the work is waiting for pipes and network connections, and the tar parsing in
between is the C fast path. When every input is a local file, which the kernel serves without
waiting, the same lanes are read in the consumer's own thread instead: under the GIL, threads
would only add their hand-offs (the output is the same either way).

**Order.** There are ``P = min(readers, number of shards)`` *lanes*. Lane ``i`` starts with shard
``i``; when a lane's shard is used up it goes on with the next shard not started yet, in input
order (an empty shard is passed over at once), and when none is left the lane closes. With
``order="roundrobin"`` the output takes one sample from each open lane in turn (lane 0, 1, ...,
P-1, 0, ...; a lane that moves to its next shard keeps its place in the cycle). So the order
depends only on the inputs, ``readers`` and the shards' sample counts, never on timing, and
``readers=1`` reads the shards one after another, like ``read_samples``. With ``order="random"``
each output sample comes from a lane drawn uniformly among the open lanes with a
``random.Random(seed)``: reproducible for a given seed. Every sample of every shard comes out
exactly once, whatever the order.

**Memory.** Each shard being read has a buffer that takes more samples while it holds fewer
than ``prefetch`` samples and ``prefetch_bytes`` bytes of sample data (so one sample always fits,
however large). Samples move in chunks of a quarter of those bounds, so with the chunk being
gathered and the one being emitted a shard holds up to about 2 x ``prefetch_bytes``. At most
``2 * P`` shards are started and not yet fully emitted (the P lanes, plus one read-ahead shard per
reader, so that a lane's next shard is already open when its current one ends).

**Errors.** With ``on_error="fail"`` the first error any reader meets (a ``TarprocError`` naming
the URL and byte offset) is raised in the consumer's thread as soon as it is met, after the other
readers are stopped. With ``"skip-shard"`` the samples a failing shard gave before the damage
are emitted, then ``warn`` reports the error (counted in ``stats``) and its lane goes on with the
next shard, as ``read_samples`` does. Errors that are not ``TarprocError`` (bugs, memory) always
fail.

**Stopping.** Closing the generator (``-c``, ``| head``, an error downstream, Ctrl-C) stops every
reader, kills ``pipe:`` children that are still producing, and waits for the threads to close
their sources, so no thread or child outlives the generator.
"""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .errors import DataWarning, OptionError, TarprocError, warner
from .handoff import Condition
from .procgroup import SIGNAL_CHECK, signal_group
from .samples import Sample, group_keyed
from .sources import Source, expand_urls, local_path, open_source
from .tar import ReadPolicy, ReadStats, iter_keyed_members
from .tar.policy import SAMPLE_FIELDS, policy_with_keywords

ORDERS = ("roundrobin", "random")
DEFAULT_READERS = 4
DEFAULT_PREFETCH = 256
DEFAULT_PREFETCH_BYTES = 2 << 20

_SAMPLES, _WARNING, _END = 0, 1, 2
_LATENCY = 0.02  # seconds a waiting consumer may wait for a reader's chunk to fill


class _Stopped(Exception):
    """Raised inside a reader thread when the consumer has gone away."""


class _Buffer:
    """The bounded queue between the reader of one shard and the consumer.

    Samples travel in chunks, and a reader waiting on a full buffer is woken only once it is half
    empty: handing samples over one by one would cost two thread switches per sample.
    """

    def __init__(self, pool: _Pool, max_items: int, max_bytes: int) -> None:
        self.pool = pool
        self.cond = Condition()  # the consumer is the main thread: see handoff
        self.items: deque[tuple[int, Any, int]] = deque()  # (kind, value, bytes)
        self.samples = 0  # samples in ``items``
        self.nbytes = 0
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.consumer_waiting = False  # read without the lock by the reader: a hint to hand over now
        self.producer_waiting = False

    def put(self, kind: int, value: Any, size: int = 0) -> None:
        """Append an item; samples wait while the buffer is full. Raises _Stopped when stopping."""
        with self.cond:
            if kind == _SAMPLES:
                while self.samples and (self.samples >= self.max_items or self.nbytes >= self.max_bytes):
                    if self.pool.stopping:
                        raise _Stopped()
                    self.producer_waiting = True
                    self.cond.wait()
                self.producer_waiting = False
                self.samples += len(value)
                self.nbytes += size
            if self.pool.stopping:
                raise _Stopped()
            self.items.append((kind, value, size))
            if self.consumer_waiting:
                self.cond.notify()

    def get(self) -> tuple[int, Any]:
        """The next item, waiting for it; raises the pool's failure as soon as there is one."""
        with self.cond:
            while True:
                failure = self.pool.failure
                if failure is not None:
                    raise failure
                if self.items:
                    self.consumer_waiting = False
                    kind, value, size = self.items.popleft()
                    if kind == _SAMPLES:
                        self.samples -= len(value)
                        self.nbytes -= size
                        if self.producer_waiting and (
                            self.samples <= self.max_items // 2 and self.nbytes <= self.max_bytes // 2
                        ):
                            self.cond.notify()
                    return kind, value
                self.consumer_waiting = True
                self.cond.wait(SIGNAL_CHECK)  # the consumer is the main thread: see SIGNAL_CHECK

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()


class _Feeder:
    """A reader's side of a buffer: gathers samples into chunks, hands them over in order."""

    def __init__(self, buf: _Buffer) -> None:
        self.buf = buf
        self.pending: list[Sample] = []
        self.nbytes = 0
        self.last = time.monotonic()  # time of the last hand-over
        self.chunk = max(1, buf.max_items // 4)
        self.chunk_bytes = max(1, buf.max_bytes // 4)

    def add(self, sample: Sample) -> None:
        pending = self.pending
        pending.append(sample)
        try:
            # a read sample holds only bytes and the __key__/__url__ strings: summing in C is cheap
            self.nbytes += sum(map(len, sample.values()))
        except TypeError:
            self.nbytes += sum(len(v) for v in sample.values() if isinstance(v, (bytes, bytearray, memoryview)))
        if len(pending) >= self.chunk or self.nbytes >= self.chunk_bytes:
            self.flush()
        elif self.buf.consumer_waiting and time.monotonic() - self.last > _LATENCY:
            # a slow source: hand over what there is rather than keep the consumer waiting for a chunk
            self.flush()

    def flush(self) -> None:
        if self.pending:
            pending, nbytes = self.pending, self.nbytes
            self.pending, self.nbytes, self.last = [], 0, time.monotonic()
            self.buf.put(_SAMPLES, pending, nbytes)

    def warn(self, message: str) -> None:
        self.flush()
        self.buf.put(_WARNING, message)


class _Pool:
    """Reader threads taking shards in input order, each shard into its own buffer."""

    def __init__(
        self,
        urls: list[str],
        readers: int,
        prefetch: int,
        prefetch_bytes: int,
        on_error: str,
        read_shard: Callable[[int, ReadStats, Callable[[str], None]], Iterator[Sample]],
        stats: ReadStats,
    ) -> None:
        self.urls = urls
        self.lanes = min(readers, len(urls))
        self.prefetch = prefetch
        self.prefetch_bytes = prefetch_bytes
        self.on_error = on_error
        self.read_shard = read_shard
        self.stats = stats
        self.lock = threading.RLock()
        self.cond = Condition(self.lock)  # the window of started shards (see handoff)
        self.buffers: dict[int, _Buffer] = {}
        self.next_start = 0  # next shard a reader takes
        self.finished = 0  # shards fully emitted by the consumer
        self.window = 2 * self.lanes
        self.stopping = False
        self.failure: BaseException | None = None
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # shard index -> its running pipe: command
        self.threads = [
            threading.Thread(target=self._work, name=f"tarproc-pcat-{i}", daemon=True) for i in range(self.lanes)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def buffer(self, index: int) -> _Buffer:
        with self.lock:
            buf = self.buffers.get(index)
            if buf is None:
                buf = self.buffers[index] = _Buffer(self, self.prefetch, self.prefetch_bytes)
            return buf

    def shard_done(self, index: int) -> None:
        """The consumer has emitted all of shard ``index``: a reader may start another."""
        with self.cond:
            self.buffers.pop(index, None)
            self.finished += 1
            self.cond.notify()

    def _claim(self) -> int | None:
        with self.cond:
            # shards start in input order, so the shard a lane waits for is always started before
            # any read-ahead shard: the window can't starve it
            while not self.stopping and self.next_start < len(self.urls) and (
                self.next_start - self.finished >= self.window
            ):
                self.cond.wait()
            if self.stopping or self.next_start >= len(self.urls):
                return None
            index = self.next_start
            self.next_start += 1
            return index

    def _work(self) -> None:
        while True:
            index = self._claim()
            if index is None:
                return
            buf = self.buffer(index)
            local = ReadStats()
            error: BaseException | None = None
            feeder = _Feeder(buf)
            samples = self.read_shard(index, local, feeder.warn)
            try:
                for sample in samples:
                    feeder.add(sample)
                feeder.flush()
            except _Stopped:
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the consumer's thread
                error = e
            finally:
                samples.close()  # type: ignore[attr-defined]
                with self.lock:
                    self.procs.pop(index, None)
                    _merge_stats(self.stats, local)
            if self.stopping:
                return
            if error is not None and (self.on_error == "fail" or not isinstance(error, TarprocError)):
                self.fail(error)
                return
            try:
                feeder.flush()  # the samples before the damage (skip-shard)
                buf.put(_END, error)
            except _Stopped:
                return

    def fail(self, error: BaseException) -> None:
        with self.lock:
            if self.failure is None:
                self.failure = error
            buffers = list(self.buffers.values())
        for buf in buffers:
            buf.wake()

    def stop(self) -> None:
        """Stop every reader and wait for them; kills ``pipe:`` children still producing."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
            buffers = list(self.buffers.values())
        for buf in buffers:
            buf.wake()
        # a reader blocked on a slow pipe: end the command so the read returns (the reader reaps it)
        with self.lock:
            procs = list(self.procs.values())
        for proc in procs:
            _terminate(proc)
        for thread in self.threads:
            if thread.is_alive():
                thread.join()


class _InlinePool:
    """The lanes' shards read in the consumer's own thread, for inputs that are all local files.

    Threads only pay off while a reader waits (network, pipes): on files, which the kernel serves
    at once, they would add a hand-off per chunk under the GIL. The lanes, and so the order of the
    output, are exactly those of ``_Pool``.
    """

    def __init__(
        self,
        urls: list[str],
        readers: int,
        on_error: str,
        read_shard: Callable[[int, ReadStats, Callable[[str], None]], Iterator[Sample]],
        stats: ReadStats,
        warn: Callable[[str], None],
    ) -> None:
        self.lanes = min(readers, len(urls))
        self.on_error = on_error
        self.read_shard = read_shard
        self.stats = stats
        self.warn = warn
        self.lock = threading.Lock()
        self.stopping = False
        self.procs: dict[int, subprocess.Popen[bytes]] = {}  # stays empty: no pipe: inputs here
        self.buffers: dict[int, _InlineBuffer] = {}

    def start(self) -> None:
        pass

    def buffer(self, index: int) -> _InlineBuffer:
        buf = self.buffers[index] = _InlineBuffer(self.read_shard(index, self.stats, self.warn), self.on_error)
        return buf

    def shard_done(self, index: int) -> None:
        self.buffers.pop(index).close()

    def stop(self) -> None:
        for buf in self.buffers.values():
            buf.close()
        self.buffers.clear()


class _InlineBuffer:
    """One shard's samples, read when the consumer asks (``_Buffer.get``'s protocol)."""

    def __init__(self, samples: Iterator[Sample], on_error: str) -> None:
        self.samples = samples
        self.on_error = on_error

    def get(self) -> tuple[int, Any]:
        try:
            return _SAMPLES, (next(self.samples),)
        except StopIteration:
            return _END, None
        except TarprocError as e:
            if self.on_error == "fail":
                raise
            return _END, e

    def close(self) -> None:
        self.samples.close()  # type: ignore[attr-defined]


def _terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a pipe: command's process group (its reader's Source reaps it)."""
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGTERM)


def _open(url: str, index: int, pool: _Pool | _InlinePool) -> Source:
    """``open_source``, with a ``pipe:`` command known to the pool before its first byte is read.

    ``Source`` reads the first bytes when it is made, so a stalled command would keep the reader
    (and a stopping consumer) waiting: the pool must be able to end it from the start.
    """

    def started(proc: subprocess.Popen[bytes]) -> None:
        with pool.lock:
            pool.procs[index] = proc
            stopping = pool.stopping
        if stopping:
            _terminate(proc)

    return open_source(url, on_start=started)


def _merge_stats(into: ReadStats, part: ReadStats) -> None:
    """Add one shard's counters to the total (generic, so new ReadStats counters are summed too)."""
    for name, value in vars(part).items():
        total = getattr(into, name, None)
        if isinstance(value, bool) or total is None:
            continue
        if isinstance(value, int):
            setattr(into, name, total + value)
        elif isinstance(value, dict):
            for k, v in value.items():
                total[k] = total.get(k, 0) + v
        elif isinstance(value, list):
            room = 10 - len(total) if name == "no_key" else len(value)
            total.extend(value[: max(room, 0)])


def parallel_samples(
    urls: str | Iterable[str],
    *,
    readers: int = DEFAULT_READERS,
    prefetch: int = DEFAULT_PREFETCH,
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES,
    order: str = "roundrobin",
    seed: int | None = None,
    policy: ReadPolicy = ReadPolicy(),
    stats: ReadStats | None = None,
    warn: Callable[[str], None] | None = None,
    views: bool = False,
    **old: Any,
) -> Iterator[Sample]:
    """Read up to ``readers`` shards concurrently and yield their samples interleaved.

    See the module docstring for the exact order, memory bound, errors and stopping. ``urls`` are
    expanded like ``read_samples``'s; ``policy`` (a ``ReadPolicy``; its keywords given directly
    still work, deprecated), ``stats`` and ``warn`` work as there. Close the generator
    (or exhaust it) to stop the reader threads. ``views=True`` is for a consumer that writes each
    sample out before asking for the next (``tarpcat``): where every input is a local file (read in
    the consumer's thread, each sample handed out as it is read), big values may then be views of
    what was read or data left in the file, as with ``read_samples``' ``views`` and ``refs``;
    elsewhere samples wait in buffers, and it changes nothing.

    >>> import os, tempfile
    >>> from tarproc import TarWriter
    >>> d = tempfile.mkdtemp()
    >>> for s, n in (("a", 3), ("b", 1), ("c", 2)):
    ...     with open(os.path.join(d, s + ".tar"), "wb") as f, TarWriter(f) as w:
    ...         for i in range(n):
    ...             w.write_sample({"__key__": f"{s}{i}", "txt": b"x"})
    >>> urls = [os.path.join(d, s + ".tar") for s in "abc"]
    >>> [s["__key__"] for s in parallel_samples(urls, readers=2)]
    ['a0', 'b0', 'a1', 'c0', 'a2', 'c1']
    """
    if readers < 1:
        raise OptionError("readers must be at least 1")
    if prefetch < 1 or prefetch_bytes < 1:
        raise OptionError("prefetch must be at least 1 sample and 1 byte")
    if order not in ORDERS:
        raise OptionError(f"bad order {order!r}; use one of {', '.join(ORDERS)}")
    policy = policy_with_keywords(policy, old, SAMPLE_FIELDS, "parallel_samples")
    url_list = expand_urls([urls] if isinstance(urls, str) else urls)
    if url_list.count("-") > 1:
        raise OptionError("stdin ('-') can be read only once")
    return _interleave(
        url_list, readers, prefetch, prefetch_bytes, order, seed, policy,
        stats if stats is not None else ReadStats(), warner(warn, DataWarning), views,
    )




def _interleave(
    urls: list[str],
    readers: int,
    prefetch: int,
    prefetch_bytes: int,
    order: str,
    seed: int | None,
    policy: ReadPolicy,
    stats: ReadStats,
    warn: Callable[[str], None],
    views: bool = False,
) -> Iterator[Sample]:
    if not urls:
        return
    inline = all(local_path(url) is not None for url in urls)
    # views and refs where each sample is written before the next is read: see parallel_samples
    views = views and inline

    def read_shard(index: int, local: ReadStats, shard_warn: Callable[[str], None]) -> Iterator[Sample]:
        url = urls[index]
        local.shards += 1
        if local.warn is None:
            local.warn = shard_warn  # the reader's own warnings (a link left out) go where the grouper's go
        with _open(url, index, pool) as stream:
            members: Iterator[Any] = iter_keyed_members(stream, url, policy=policy, stats=local, views=views,
                                                        refs=views)
            yield from group_keyed(members, url, dup=policy.dup, stats=local, warn=shard_warn)

    pool: _Pool | _InlinePool
    if inline:
        pool = _InlinePool(urls, readers, policy.on_error, read_shard, stats, warn)
    else:
        pool = _Pool(urls, readers, prefetch, prefetch_bytes, policy.on_error, read_shard, stats)
    rng = random.Random(seed) if order == "random" else None
    # a lane: [shard index, its buffer, samples of the chunk taken from the buffer, not yet emitted]
    lanes: list[tuple[int, _Buffer | _InlineBuffer, deque[Sample]]] = [(i, pool.buffer(i), deque()) for i in range(pool.lanes)]
    next_shard = pool.lanes
    turn = 0
    draw = True  # random order: draw a lane once per sample (not per chunk: chunking depends on timing)
    pool.start()
    try:
        while lanes:
            if rng is not None and draw:
                turn = rng.randrange(len(lanes))
                draw = False
            index, buf, ready = lanes[turn]
            if ready:
                yield ready.popleft()
                turn = (turn + 1) % len(lanes)
                draw = True
                continue
            kind, value = buf.get()
            if kind == _SAMPLES:
                ready.extend(value)
            elif kind == _WARNING:
                warn(value)
            else:  # the shard ended; ``value`` is the error that skipped its rest, if any
                if value is not None:
                    with pool.lock:
                        stats.shards_failed += 1
                        stats.errors.append(str(value))
                    warn(f"{value}; skipping the rest of this shard")
                pool.shard_done(index)
                if next_shard < len(urls):
                    lanes[turn] = (next_shard, pool.buffer(next_shard), ready)
                    next_shard += 1
                else:
                    del lanes[turn]
                    draw = True
                    if lanes:
                        turn %= len(lanes)
    finally:
        pool.stop()


__all__ = ["DEFAULT_PREFETCH", "DEFAULT_PREFETCH_BYTES", "DEFAULT_READERS", "ORDERS", "parallel_samples"]
