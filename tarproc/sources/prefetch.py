"""Read-ahead: the reader's next shards opened and read by threads while it reads the current one.

``Prefetcher`` opens the shards a reader will read next (up to ``DEPTH``) in the background, each
as an ``Ahead``: a thread reads it ahead within a byte bound shared by all of them and by the
shard being read (``Budget``), so that a reader never waits at a shard boundary for a slow store's
first bytes, and the network and the reader's work overlap. Errors reach the reader at the byte
where they happened, after what was read before them.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

from ..errors import TarprocError
from ..handoff import Condition
from ..procgroup import SIGNAL_CHECK

CHUNK = 1 << 19  # bytes a read-ahead thread asks for at once: what the tar reader asks for (tar/reader.py's _CHUNK), handed on whole
DEPTH = 4  # following shards a Prefetcher opens at most


class Budget:
    """Bytes held by a set of ``Ahead`` streams, at most ``limit`` (and one chunk each)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 1)
        self.held = 0
        self.cond = Condition()  # the reader's (main) thread: see handoff


class Ahead:
    """A raw stream read ahead by a thread, within ``budget`` (its own, of ``max_bytes``, if None):
    the network and the reader's work overlap (the thread lets the GIL go while it waits on a
    socket). The stream being read may always hold one chunk: a full budget never stalls it. The
    thread stops at the stream's ``end`` (where the reader expects to stop): the reader then reads
    on itself. A failure after the stream's own retries reaches the reader, unless it came before
    the reader got to this stream (a store down for a while): then the reader tries again itself."""

    def __init__(self, raw: Any, max_bytes: int, budget: Budget | None = None) -> None:
        self.raw = raw
        self.budget = budget if budget is not None else Budget(max_bytes)
        self._cond = self.budget.cond
        self._chunks: collections.deque[bytes] = collections.deque()
        self._pos = 0  # into the first chunk: a partial read moves it, no copy of the rest
        self._held = 0
        self._error: BaseException | None = None
        self._eof = False
        self._closed = False
        self._done = False  # the thread has ended (the end of the stream, its ``end``, an error, close)
        self._reading = False  # the reader has come to this stream
        self._early = False  # the thread failed before it did
        self._thread = threading.Thread(target=self._fill, name="tarproc-read-ahead", daemon=True)
        self._thread.start()

    def __getattr__(self, name: str) -> Any:  # identity, pos... of the stream underneath
        return getattr(self.raw, name)

    def _fill(self) -> None:
        budget = self.budget
        end = getattr(self.raw, "end", None)
        try:
            while end is None or self.raw.pos < end:
                with self._cond:
                    while self._held and budget.held >= budget.limit and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                data = self.raw.read(CHUNK if end is None else min(CHUNK, end - self.raw.pos))
                with self._cond:
                    if self._closed:
                        return
                    if data:
                        self._chunks.append(data)
                        self._held += len(data)
                        budget.held += len(data)
                    else:
                        self._eof = True
                    self._cond.notify_all()
                if not data:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the reader, raised there
            with self._cond:
                self._error = e
                self._early = not self._reading
                self._cond.notify_all()
        finally:
            with self._cond:
                closed = self._closed
                self._done = True
                self._cond.notify_all()
            if closed:
                self.raw.close()

    def read(self, n: int = -1) -> bytes:
        with self._cond:
            self._reading = True
            while not self._chunks and not self._done:
                self._cond.wait(SIGNAL_CHECK)  # the reader's thread, the main one: see SIGNAL_CHECK
            if not self._chunks:
                if self._eof:
                    return b""
                error, self._error = self._error, None
                if error is not None and not (self._early and isinstance(error, TarprocError)):
                    raise error
                # the thread stopped at the end the reader gave, or failed before it came: read on here
                return self.raw.read(n)  # type: ignore[no-any-return]
            head, pos = self._chunks[0], self._pos
            if 0 <= n < len(head) - pos:
                data = head[pos : pos + n]
                self._pos += n
            else:
                data = head[pos:] if pos else head
                self._chunks.popleft()
                self._pos = 0
            self._held -= len(data)
            self.budget.held -= len(data)
            self._cond.notify_all()
            return data

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self.budget.held -= self._held
            self._held = 0
            self._chunks.clear()
            running = not self._done
            self._cond.notify_all()
        if not running:  # else the thread closes it when its read returns: not under its feet
            self.raw.close()
        else:
            cancel = getattr(self.raw, "cancel", None)
            if cancel is not None:
                cancel()  # no more attempts at a stream nobody reads


class Prefetcher:
    """Opens sources before they are wanted: ``schedule(url, offset, end)`` starts opening one in the
    background (``open_raw(url, offset, budget, end)`` in a thread), ``take(url, offset)`` returns it
    (or None if it wasn't scheduled; then open it as usual). ``close`` closes what was never taken.
    ``budget``: the bytes all of them may hold ahead of the reader together."""

    def __init__(self, open_raw: Callable[[str, int, Budget, int | None], Any], max_bytes: int = 0) -> None:
        self.open_raw = open_raw
        self.budget = Budget(max_bytes)
        self._pending: dict[tuple[str, int], _Pending] = {}

    def schedule(self, url: str, offset: int = 0, end: int | None = None) -> None:
        if (url, offset) not in self._pending:
            self._pending[(url, offset)] = _Pending(lambda: self.open_raw(url, offset, self.budget, end))

    def take(self, url: str, offset: int = 0) -> Any | None:
        """The source scheduled at ``(url, offset)``, or None: not scheduled, or its opening failed
        (then open it as usual, with fresh retries: a store may be back by now)."""
        pending = self._pending.pop((url, offset), None)
        return None if pending is None else pending.result()

    def close(self) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            p.discard()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Pending:
    def __init__(self, open_raw: Callable[[], Any]) -> None:
        self._raw: Any = None
        self._error: BaseException | None = None
        self._discarded = False
        self._lock = threading.Lock()

        def run() -> None:
            try:
                raw = open_raw()
            except BaseException as e:  # noqa: BLE001 - raised when the reader takes it
                self._error = e
                return
            with self._lock:
                self._raw = raw
                discarded = self._discarded
            if discarded:
                raw.close()

        self._thread = threading.Thread(target=run, name="tarproc-prefetch", daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None and not isinstance(self._error, Exception):
            raise self._error
        return self._raw  # None after an error: opened again by the reader

    def discard(self) -> None:
        with self._lock:
            self._discarded = True
            raw = self._raw
        if raw is not None:
            raw.close()


__all__ = ["CHUNK", "DEPTH", "Ahead", "Budget", "Prefetcher"]
