"""Read-ahead: remote bytes fetched by a thread before the reader asks for them.

``Ahead`` wraps an opened remote stream: a thread keeps up to ``max_bytes`` of it read ahead of
the reader, so that parsing and the network overlap. ``Prefetcher`` opens the reader's **next**
shard in the background while it reads the current one (the same bound applies to each), so that
a reader never waits at a shard boundary for a slow store's first byte. Errors reach the reader at
the byte where they happened, after what was read before them.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

_CHUNK = 1 << 20


class Ahead:
    """A raw stream read ahead by a thread, at most ``max_bytes`` ahead of ``read``."""

    def __init__(self, raw: Any, max_bytes: int) -> None:
        self.raw = raw
        self.max_bytes = max(max_bytes, 1)
        self._chunks: collections.deque[bytes] = collections.deque()
        self._held = 0
        self._error: BaseException | None = None
        self._eof = False
        self._closed = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._fill, name="tarproc-read-ahead", daemon=True)
        self._thread.start()

    def __getattr__(self, name: str) -> Any:  # identity, pos... of the stream underneath
        return getattr(self.raw, name)

    def _fill(self) -> None:
        try:
            while True:
                with self._cond:
                    while self._held >= self.max_bytes and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                data = self.raw.read(min(_CHUNK, self.max_bytes))
                with self._cond:
                    if data:
                        self._chunks.append(data)
                        self._held += len(data)
                    else:
                        self._eof = True
                    self._cond.notify_all()
                if not data:
                    return
        except BaseException as e:  # noqa: BLE001 - handed to the reader, raised there
            with self._cond:
                self._error = e
                self._cond.notify_all()
        finally:
            with self._cond:
                closed = self._closed
            if closed:
                self.raw.close()

    def read(self, n: int = -1) -> bytes:
        with self._cond:
            while not self._chunks and not self._eof and self._error is None:
                self._cond.wait()
            if not self._chunks:
                if self._error is not None:
                    raise self._error
                return b""
            head = self._chunks[0]
            if 0 <= n < len(head):
                self._chunks[0] = head[n:]
                head = head[:n]
            else:
                self._chunks.popleft()
            self._held -= len(head)
            self._cond.notify_all()
            return head

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._chunks.clear()
            running = self._thread.is_alive() and not self._eof and self._error is None
            self._cond.notify_all()
        if not running:  # else the thread closes it when its read returns: not under its feet
            self.raw.close()


class Prefetcher:
    """Opens sources before they are wanted: ``schedule(url, offset)`` starts opening one in the
    background (``open_raw(url, offset)`` in a thread), ``take(url, offset)`` returns it (or None if
    it wasn't scheduled; then open it as usual). ``close`` closes what was never taken."""

    def __init__(self, open_raw: Callable[[str, int], Any]) -> None:
        self.open_raw = open_raw
        self._pending: dict[tuple[str, int], _Pending] = {}

    def schedule(self, url: str, offset: int = 0) -> None:
        if (url, offset) not in self._pending:
            self._pending[(url, offset)] = _Pending(self.open_raw, url, offset)

    def take(self, url: str, offset: int = 0) -> Any | None:
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
    def __init__(self, open_raw: Callable[[str, int], Any], url: str, offset: int) -> None:
        self._raw: Any = None
        self._error: BaseException | None = None
        self._discarded = False
        self._lock = threading.Lock()

        def run() -> None:
            try:
                raw = open_raw(url, offset)
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
        if self._error is not None:
            raise self._error
        return self._raw

    def discard(self) -> None:
        with self._lock:
            self._discarded = True
            raw = self._raw
        if raw is not None:
            raw.close()


__all__ = ["Ahead", "Prefetcher"]
