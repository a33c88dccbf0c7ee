"""Batch buffers that DataLoader workers use again once the training loop has let go of them.

A worker decodes each batch of images straight into a tensor in shared memory, which the main
process maps instead of copying. A fresh shared-memory tensor per batch costs the kernel a page
fault and a zeroed page every 4 KiB (about a tenth of the worker's time on 224x224 float batches),
so each worker keeps a small ring of them and writes into one again -- but only once the main
process holds no tensor or view of it, which only the main process can know:

- A worker *leases* a ring slot: it writes a lease number (its pid and a counter) into the slot's
  cell of a shared array before the batch leaves.
- The batch leaves wrapped (``_SharedTuple`` / ``_SharedDict``), whose pickling names the slot and
  lease of each tensor it carries. Unpickled in the main process it is a plain tuple or dict, and
  each such tensor's storage gets a finalizer, which runs when the last tensor or view on it dies
  (torch keeps a storage's Python object alive as long as any tensor uses it; checked once here,
  and without that guarantee nothing is reused).
- The finalizer clears the cell if it still holds that lease; the worker reuses a buffer whose
  cell is clear. A cell is cleared only by the process holding the batch, for the lease that
  batch carries, so a batch kept for as long as one likes (a list of batches, a view of one row)
  is never written to; a new worker process (each epoch, unless the workers persist) starts with an
  empty ring and never touches a buffer of an earlier one.

If every buffer of the ring is in use, the worker takes a fresh one, as without the pool.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import uuid
import weakref
from typing import Any

import torch

RING = 4  # buffers per worker: the DataLoader's prefetch (2 by default), the loop's batch, one spare
WORKERS = 1024  # DataLoader workers per process with a ring; more work without one

_POOLS: weakref.WeakValueDictionary[str, BufferPool] = weakref.WeakValueDictionary()  # token -> pool, per process
_SAFE: list[bool] = []  # whether a storage outlives its views' Python objects (checked once)


def _storages_are_preserved() -> bool:
    """Whether torch keeps a storage's Python object (and so its finalizer) alive while any tensor
    on it lives: true since torch 2.1's PyObject preservation for storages."""
    if not _SAFE:
        fired: list[bool] = []
        base = torch.empty(4)
        weakref.finalize(base.untyped_storage(), fired.append, True)
        view = base[1:]
        del base
        kept = not fired
        del view
        _SAFE.append(kept and bool(fired))
    return _SAFE[0]


class BufferPool:
    """The shared lease cells of one dataset's workers (made in the main process, before the
    DataLoader starts its workers) and, in each worker, that worker's ring."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self._cells = multiprocessing.RawArray("q", WORKERS * RING)  # 0: free; else the lease
        self._stats = multiprocessing.RawArray("q", 2)  # buffers allocated, buffers reused (by workers)
        self._setup()

    def _setup(self) -> None:
        _POOLS[self.token] = self
        self._ring: list[torch.Tensor | None] = [None] * RING  # this worker's buffers
        self._leased: dict[int, tuple[int, int]] = {}  # a leased buffer's data_ptr -> (cell, lease)
        self._pending: list[tuple[int, int]] = []  # (cell, lease) taken for the batch being made
        self._counter = itertools.count(1)
        self._pid = os.getpid()

    def __reduce__(self) -> tuple[object, ...]:
        from multiprocessing.context import get_spawning_popen

        if get_spawning_popen() is not None:  # a spawned worker: share the cells
            return _shared_pool, (self.token, self._cells, self._stats)
        return BufferPool, ()  # a copy (pickle, deepcopy): a pool of its own

    @property
    def allocated(self) -> int:
        """Buffers the workers have allocated (a fresh batch without the pool would be one each)."""
        return int(self._stats[0])

    @property
    def reused(self) -> int:
        """Batches written into a buffer the main process had let go of."""
        return int(self._stats[1])

    # -- the worker's side -------------------------------------------------------------------------

    def take(self, worker: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor in shared memory for one batch of ``shape``, leased to the batch that leaves next."""
        if os.getpid() != self._pid:  # forked: this process's ring starts empty
            self._setup()
        if not 0 <= worker < WORKERS or not _storages_are_preserved():
            return _new_shared(shape, dtype)
        free = None
        for i, tensor in enumerate(self._ring):
            cell = worker * RING + i
            if self._cells[cell] != 0 and tensor is not None:
                continue  # the main process holds it (or it is on its way there)
            if tensor is not None and tuple(tensor.shape) == shape and tensor.dtype == dtype:
                self._stats[1] += 1
                return self._lease(tensor, cell)
            if free is None:
                free = i
        if free is None:
            return _new_shared(shape, dtype)  # all in use: a fresh one, as without the pool
        tensor = _new_shared(shape, dtype)
        if (old := self._ring[free]) is not None:
            self._leased.pop(old.untyped_storage().data_ptr(), None)
        self._ring[free] = tensor
        self._stats[0] += 1
        return self._lease(tensor, worker * RING + free)

    def _lease(self, tensor: torch.Tensor, cell: int) -> torch.Tensor:
        lease = (self._pid << 32) | (next(self._counter) & 0xFFFFFFFF) or 1
        self._cells[cell] = lease
        self._leased[tensor.untyped_storage().data_ptr()] = (cell, lease)
        self._pending.append((cell, lease))
        return tensor

    def settle(self, batch: Any) -> Any:
        """The batch, wrapped so that the main process hands its buffers back; a buffer leased for it
        that it does not carry (every row rejected, a copy instead of a view) is free again now."""
        items = list(enumerate(batch)) if isinstance(batch, tuple) else list(batch.items())
        carried = {cell for _, _, cell, _ in _marks(items)}
        for cell, lease in self._pending:
            if cell not in carried and self._cells[cell] == lease:
                self._cells[cell] = 0
        self._pending.clear()
        if not carried:
            return batch
        return _SharedTuple(*batch) if isinstance(batch, tuple) else _SharedDict(batch)

    # -- the main process's side ------------------------------------------------------------------

    def release(self, cell: int, lease: int) -> None:
        if self._cells[cell] == lease:  # only the holder of this lease clears it
            self._cells[cell] = 0


def _shared_pool(token: str, cells: Any, stats: Any) -> BufferPool:
    pool = BufferPool.__new__(BufferPool)
    pool.token, pool._cells, pool._stats = token, cells, stats
    pool._setup()
    return pool


def _new_shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    numel = 1
    for n in shape:
        numel *= n
    try:
        storage = torch.UntypedStorage._new_shared(numel * dtype.itemsize)
        return torch.empty(0, dtype=dtype).set_(storage).view(shape)
    except (AttributeError, RuntimeError, TypeError):  # torch without _new_shared: one copy
        return torch.empty(shape, dtype=dtype).share_memory_()


def _marks(items: list[tuple[Any, Any]]) -> list[tuple[Any, str, int, int]]:
    """``(place, pool token, cell, lease)`` for each ``(place, value)`` whose value is a tensor in a
    buffer leased by a pool of this process."""
    out = []
    for place, value in items:
        if isinstance(value, torch.Tensor):
            data_ptr = value.untyped_storage().data_ptr()
            for pool in list(_POOLS.values()):
                lease = pool._leased.get(data_ptr)
                if lease is not None:
                    out.append((place, pool.token, *lease))
                    break
    return out


def _received(batch: Any, marks: list[tuple[Any, str, int, int]]) -> Any:
    """Unpickling a batch in the main process: the plain batch, each buffer handed back to its
    worker when the last tensor on it dies."""
    for place, token, cell, lease in marks:
        pool = _POOLS.get(token)
        if pool is not None:
            weakref.finalize(batch[place].untyped_storage(), pool.release, cell, lease)
    return batch


class _SharedTuple(tuple):  # type: ignore[type-arg]
    """A tuple batch on its way out of a worker. ``_fields`` makes torch's default_convert rebuild
    it as it rebuilds a namedtuple (``type(batch)(*items)``), keeping the wrapper."""

    _fields = ()

    def __new__(cls, *items: Any) -> _SharedTuple:
        return super().__new__(cls, items)

    def __reduce__(self) -> tuple[object, ...]:
        return _received, (tuple(self), _marks(list(enumerate(self))))


class _SharedDict(dict):  # type: ignore[type-arg]
    """A dict batch on its way out of a worker (default_convert copies it with ``copy.copy``)."""

    def __copy__(self) -> _SharedDict:
        return _SharedDict(self)

    def __reduce__(self) -> tuple[object, ...]:
        return _received, (dict(self), _marks(list(self.items())))
