"""Thread hand-offs that a Ctrl-C can't leave locked.

Ctrl-C raises ``KeyboardInterrupt`` in the main thread between two bytecodes, wherever it is.
``queue.Queue`` and ``threading.Condition`` take their lock in Python code (``Condition.__enter__``
calls the lock's ``__enter__`` and returns): an interrupt raised in between, after the lock is
taken and before the ``with`` block has begun, leaves the lock held for ever. The main thread's
clean-up, and the other thread, then wait on it for ever: a ``tarserve`` stopped with Ctrl-C
hung instead of exiting 130 (CI, once in many runs), since its clean-up drains the queue its
socket thread reads.

``Handoff`` is a bounded queue of two ``queue.SimpleQueue`` (C: every operation is one call, no
lock of ours); ``Condition`` is a ``threading.Condition`` whose ``with`` calls the lock's own C
methods (a plain lock's ``with lock:`` is safe: its ``__enter__`` is C). Use them where the main
thread hands work to a thread, or waits on one, and cleans up after an interrupt.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Handoff(Generic[T]):
    """A bounded FIFO between threads: ``put`` waits while ``maxsize`` items wait (raising
    ``queue.Full`` after ``timeout``), ``get`` waits for one (``queue.Empty`` after ``timeout``).
    An interrupt between a ``put``'s two calls loses one place (the queue holds one less from
    then on) and that item; never a lock, so the other side and a clean-up go on."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"a Handoff holds at least 1 item, not {maxsize}")
        self._items: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._room: queue.SimpleQueue[None] = queue.SimpleQueue()  # one token a free place
        for _ in range(maxsize):
            self._room.put(None)

    def put(self, item: T, timeout: float | None = None) -> None:
        try:
            self._room.get(timeout=timeout)
        except queue.Empty:
            raise queue.Full from None
        self._items.put(item)

    def get(self, timeout: float | None = None) -> T:
        item = self._items.get(timeout=timeout)  # queue.Empty after timeout
        self._room.put(None)
        return item

    def get_nowait(self) -> T:
        item = self._items.get_nowait()
        self._room.put(None)
        return item

    def qsize(self) -> int:
        return self._items.qsize()


class _LockMethod:
    """The condition's lock's own method of that name: a C call, in which no interrupt comes."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, condition: Any, owner: Any = None) -> Any:
        return getattr(condition._lock, self.name)


class Condition(threading.Condition):
    """``threading.Condition`` whose ``with`` can't leave its lock held after a Ctrl-C; on an
    ``RLock`` (``lock``, shared with plain ``with lock:`` blocks, or its own), whose ``wait``
    bookkeeping is C too (a ``Lock``'s is Python code: an interrupt there releases it twice)."""

    __enter__ = _LockMethod("__enter__")  # type: ignore[assignment]
    __exit__ = _LockMethod("__exit__")  # type: ignore[assignment]

    def __init__(self, lock: Any = None) -> None:
        super().__init__(threading.RLock() if lock is None else lock)
