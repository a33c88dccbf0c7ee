"""Batch buffers that DataLoader workers use again once the training loop has let go of them.

A worker decodes each batch of images straight into a tensor in shared memory, which the main
process maps instead of copying. A fresh shared-memory tensor per batch costs the kernel a page
fault and a zeroed page every 4 KiB (about a tenth of the worker's time on 224x224 float batches),
so each worker keeps a small ring of them and writes into one again -- but only once the main
process holds no tensor or view of it, which only the main process can know:

- For each batch, a worker claims a free cell of a shared array (under a lock shared by every
  process that uses the dataset: workers of several loaders, ranks) and writes a lease number into
  it, 63 random bits that no other batch has.
- The batch leaves wrapped (``_SharedTuple`` / ``_SharedDict``), whose pickling names the cell and
  lease of each tensor it carries. Unpickled in the main process it is a plain tuple or dict, and
  each such tensor's storage gets a finalizer, which runs when the last tensor or view on it dies
  (torch keeps a storage's Python object alive as long as any tensor uses it; checked once here,
  and without that guarantee nothing is reused).
- The finalizer clears the cell if it still holds that lease; a worker writes into a buffer again
  only once its cell no longer holds its lease. So a batch kept for as long as one likes (a list of
  batches, a view of one row) is never written to, and a new worker process (each epoch, unless
  the workers persist) starts with an empty ring and never touches a buffer of an earlier one.
- A batch the main process sends on to another process (a queue, a pipe) is let go of when the
  main process drops it, while the other still maps it: clone it first (``docs/training.md``).

If every buffer of the ring is in use, the worker takes a fresh one, as without the pool.

A ring buffer's file descriptor goes to the main process once, with the first batch in it; later
batches name it (``_Handle``) and the main process maps it again from the descriptor it kept
(torch passes a descriptor for every tensor of every batch, through the worker's resource-sharer
thread, which waits for the worker's GIL). The batch's small tensors (labels) travel in the pickle.
"""

from __future__ import annotations

import mmap
import multiprocessing
import os
import sys
import uuid
import weakref
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from .fields import BatchDict, BatchTuple

RING = 4  # buffers per worker: the DataLoader's prefetch (2 by default), the loop's batch, one spare
CELLS = 4096  # lease cells shared by all the workers of a dataset (of every loader and rank using it)

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


def _new_lease() -> int:
    """A lease number no other batch has (63 random bits): a cell holds it while the batch is out."""
    return (int.from_bytes(os.urandom(8), "little") >> 1) | 1


class _Buffer:
    """One buffer of a worker's ring, and the cell and lease of the batch it went out with;
    ``told``: its descriptor has gone to the main process (see ``_Handle``)."""

    __slots__ = ("tensor", "cell", "lease", "told")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.cell, self.lease, self.told = tensor, -1, 0, False


class BufferPool:
    """The shared lease cells of one dataset's workers (made in the main process, before the
    DataLoader starts its workers) and, in each worker, that worker's ring.

    A worker claims a free cell (0) for each batch, under a lock shared by every process that uses
    the pool, and writes a lease number no other batch has into it; only the process holding that
    batch clears the cell, and only while it still holds that lease. A buffer is free again when its
    cell no longer holds its lease."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self._cells = multiprocessing.RawArray("q", CELLS)  # 0: free; else the lease of a batch that is out
        self._stats = multiprocessing.RawArray("q", 2)  # buffers allocated, buffers reused (by workers)
        # claiming a free cell; a spawn-context lock is inherited by forked workers and pickled to
        # spawned and forkserver ones alike (a fork-context lock refuses to be pickled)
        self._lock = multiprocessing.get_context("spawn").Lock()
        self._setup()

    def _setup(self) -> None:
        _POOLS[self.token] = self
        self._ring: list[_Buffer] = []  # this process's buffers
        self._leased: dict[int, tuple[int, int]] = {}  # a buffer's data_ptr -> (cell, lease) of its batch
        self._buffers: dict[int, _Buffer] = {}  # a ring buffer's data_ptr -> it
        # the main process's side: (worker pid, buffer data_ptr there) -> the descriptor of each
        # ring buffer a batch came in (closed with the pool, or once that worker has ended)
        self._fds: dict[tuple[int, int], int] = {}
        weakref.finalize(self, _close_fds, self._fds)
        self._pending: list[tuple[int, int]] = []  # (cell, lease) taken for the batch being made
        self._pid = os.getpid()

    def __reduce__(self) -> tuple[object, ...]:
        from multiprocessing.context import get_spawning_popen

        if get_spawning_popen() is not None:  # a spawned worker: share the cells
            return _shared_pool, (self.token, self._cells, self._stats, self._lock)
        return BufferPool, ()  # a copy (pickle, deepcopy): a pool of its own

    @property
    def allocated(self) -> int:
        """Buffers the workers have allocated for their rings (about: the count is not locked)."""
        return int(self._stats[0])

    @property
    def reused(self) -> int:
        """Batches written into a buffer the main process had let go of (about, as ``allocated``)."""
        return int(self._stats[1])

    # -- the worker's side -------------------------------------------------------------------------

    def take(self, worker: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """A tensor in shared memory for one batch of ``shape``, leased to the batch that leaves next."""
        if os.getpid() != self._pid:  # forked: this process's ring starts empty
            self._setup()
        if not _storages_are_preserved():
            return _new_shared(shape, dtype)
        free = [b for b in self._ring if b.cell < 0 or self._cells[b.cell] != b.lease]  # let go of
        buffer = next((b for b in free if tuple(b.tensor.shape) == shape and b.tensor.dtype == dtype), None)
        if buffer is not None:
            self._stats[1] += 1
        elif len(self._ring) < RING or free:
            buffer = _Buffer(_new_shared(shape, dtype))
            if len(self._ring) < RING:
                self._ring.append(buffer)
            else:  # a free one of another shape
                old = free[0]
                self._ring[self._ring.index(old)] = buffer
                self._leased.pop(old.tensor.untyped_storage().data_ptr(), None)
                self._buffers.pop(old.tensor.untyped_storage().data_ptr(), None)
            self._stats[0] += 1
        else:
            return _new_shared(shape, dtype)  # all out: a fresh one, as without the pool
        cell = self._claim(worker)
        if cell < 0:  # no free cell: this batch goes out unleased, its buffer not reused
            self._ring.remove(buffer)
            self._leased.pop(buffer.tensor.untyped_storage().data_ptr(), None)
            self._buffers.pop(buffer.tensor.untyped_storage().data_ptr(), None)
            return buffer.tensor
        buffer.cell, buffer.lease = cell, self._cells[cell]
        self._leased[buffer.tensor.untyped_storage().data_ptr()] = (cell, buffer.lease)
        self._buffers[buffer.tensor.untyped_storage().data_ptr()] = buffer
        self._pending.append((cell, buffer.lease))
        return buffer.tensor

    def _claim(self, worker: int) -> int:
        """A free cell, now holding a new lease; -1 when every cell is taken."""
        lease = _new_lease()
        start = (worker * RING) % CELLS
        with self._lock:
            for i in range(CELLS):
                cell = (start + i) % CELLS
                if self._cells[cell] == 0:
                    self._cells[cell] = lease
                    return cell
        return -1

    def settle(self, batch: Any) -> Any:
        """The batch, wrapped so that the main process hands its buffers back; a buffer leased for it
        that it does not carry (every row rejected, a copy instead of a view) is free again now."""
        items = list(enumerate(batch)) if isinstance(batch, tuple) else list(batch.items())
        carried = {cell for _, _, cell, _ in _marks(items)}
        for cell, lease in self._pending:
            if cell not in carried and self._cells[cell] == lease:
                self._cells[cell] = 0
        self._pending.clear()
        if not carried:  # nothing of the pool's: as torch sends it (the plain types it makes, tests/core/test_first_steps.py)
            return batch
        return _SharedTuple(*batch) if isinstance(batch, tuple) else _SharedDict(batch)

    # -- the main process's side ------------------------------------------------------------------

    def release(self, cell: int, lease: int) -> None:
        # no lock (this runs in a finalizer, at any moment): a cell holding this lease is touched by
        # no one else until it is 0, so the check and the write can't be overtaken
        if self._cells[cell] == lease:
            self._cells[cell] = 0


def _shared_pool(token: str, cells: Any, stats: Any, lock: Any) -> BufferPool:
    pool = BufferPool.__new__(BufferPool)
    pool.token, pool._cells, pool._stats, pool._lock = token, cells, stats, lock
    pool._setup()
    return pool


def _new_shared(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    numel = 1
    for n in shape:
        numel *= n
    try:
        storage = torch.UntypedStorage._new_shared(numel * dtype.itemsize)
        _populate(storage.data_ptr(), storage.nbytes())
        return torch.empty(0, dtype=dtype).set_(storage).view(shape)
    except (AttributeError, RuntimeError, TypeError):  # torch without _new_shared: one copy
        return torch.empty(shape, dtype=dtype).share_memory_()


_MADV_POPULATE_WRITE = 23  # Linux 5.14 and later
_MADVISE: list[Any] = []


def _populate(address: int, size: int) -> None:
    """Give a fresh shared-memory buffer its pages in one call (``MADV_POPULATE_WRITE``) instead of
    a page fault every 4 KiB as the batch is written: ~25 ms instead of ~31 ms to fill the 38.5 MB
    of 64 224x224 float images the first time (each new worker's ring pays it four times). Where the kernel or
    the platform has no such call, the pages come with the faults, as before."""
    if not _MADVISE:
        madvise = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                madvise = ctypes.CDLL(None, use_errno=True).madvise
                madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            except (OSError, AttributeError):
                madvise = None
        _MADVISE.append(madvise)
    madvise = _MADVISE[0]
    if madvise is None or size <= 0:
        return
    start = address & ~(mmap.PAGESIZE - 1)
    if madvise(start, size + address - start, _MADV_POPULATE_WRITE) != 0:  # EINVAL before 5.14: faults, then
        _MADVISE[0] = None


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


# A tensor of at most this many bytes (a batch's labels, say) travels in the batch's pickle, as
# numpy's bytes, not as a shared-memory file: torch hands such a file over by passing its
# descriptor, over a connection of its own to the worker's resource-sharer thread, which must take
# the worker's GIL from the decode to answer -- the loop waits. Labels inline: a bench epoch
# 1.565 -> 1.462 s (docs/training.md, "Batch memory")
INLINE_BYTES = 256 << 10
_NUMPY_DTYPES = {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.float32, torch.float64, torch.complex64, torch.complex128}


def _small(value: Any) -> bool:
    """Whether ``value`` is a tensor to send inline (see INLINE_BYTES)."""
    return (type(value) is torch.Tensor and value.dtype in _NUMPY_DTYPES and value.device.type == "cpu"
            and value.numel() * value.element_size() <= INLINE_BYTES and not value.requires_grad)


class _Handle(NamedTuple):
    """A ring buffer's tensor as it goes to the main process: the buffer named, its descriptor
    (multiprocessing's DupFd, as torch's reducer sends for every tensor, each time) only the first
    time a batch in it goes. The main process keeps the descriptor and maps the buffer again from
    it for each batch (a storage of its own, so that the lease's finalizer still sees the batch
    die). Each descriptor torch hands over costs a connection to the worker's resource-sharer
    thread, which must take the worker's GIL from the decode: the loop waits (docs/training.md)."""

    place: Any
    token: str  # the pool's
    pid: int  # the worker's
    key: int  # the buffer's data_ptr in the worker
    nbytes: int
    dtype: str
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dupfd: Any  # None once the main process has the descriptor


def _outgoing(items: list[tuple[Any, Any]]) -> tuple[list[tuple[Any, Any]], list[tuple[Any, str, int, int]], list[Any],
                                                   list[_Handle]]:
    """A batch's items as they are pickled: small tensors as numpy arrays (which pickle by value),
    ring buffers as ``_Handle`` s (None in their place); the marks of its pooled buffers, the places
    of the tensors sent as arrays, and the handles."""
    marks = _marks(items)
    values = dict(items)
    handles = [h for place, token, _, _ in marks if (h := _handle(token, place, values[place])) is not None]
    pooled = {place for place, *_ in marks}
    inline = [place for place, value in items if place not in pooled and _small(value)]
    handled = {h.place for h in handles}
    sent = [(place, None if place in handled else value.resolve_conj().resolve_neg().numpy() if place in inline else value)
            for place, value in items]
    return sent, marks, inline, handles


def _handle(token: str, place: Any, value: torch.Tensor) -> _Handle | None:
    """The handle of a ring buffer's tensor; None where torch's own reducer must send it (not a
    ring buffer, or shared otherwise than by a descriptor)."""
    storage = value.untyped_storage()
    pool = _POOLS.get(token)
    buffer = pool._buffers.get(storage.data_ptr()) if pool is not None else None
    if buffer is None or not _by_descriptor():
        return None
    dupfd = None
    if not buffer.told:
        try:
            fd, _ = storage._share_fd_cpu_()
        except (RuntimeError, AttributeError):
            return None
        from multiprocessing.reduction import DupFd

        dupfd, buffer.told = DupFd(fd), True
    return _Handle(place, token, os.getpid(), storage.data_ptr(), storage.nbytes(), str(value.dtype).removeprefix("torch."),
                   int(value.storage_offset()), tuple(value.shape), tuple(value.stride()), dupfd)


def _by_descriptor() -> bool:
    import torch.multiprocessing

    return (hasattr(torch.UntypedStorage, "_new_shared_fd_cpu")
            and torch.multiprocessing.get_sharing_strategy() == "file_descriptor")


def _mapped(pool: BufferPool | None, handle: _Handle) -> torch.Tensor:
    """The main process's side of a handle: a tensor on the worker's buffer (a new mapping of it,
    from the descriptor the pool keeps; with no pool, from this handle's, then closed)."""
    fds = pool._fds if pool is not None else {}
    key = (handle.pid, handle.key)
    if handle.dupfd is not None:
        if not any(pid == handle.pid for pid, _ in fds):
            _forget_ended_workers(fds, handle.pid)
        old = fds.pop(key, None)  # a buffer at the same address of a worker with the same pid
        if old is not None:
            os.close(old)
        fds[key] = handle.dupfd.detach()
    fd = fds.get(key)
    if fd is None:
        raise RuntimeError(f"tarproc: a batch from DataLoader worker {handle.pid} is in a buffer whose descriptor "
                           "this process never received (its first batch was not unpickled here)")
    try:
        storage = torch.UntypedStorage._new_shared_fd_cpu(fd, handle.nbytes)  # type: ignore[attr-defined]
    finally:
        if pool is None:
            _close_fds(fds)
    return torch.empty(0, dtype=getattr(torch, handle.dtype)).set_(storage, handle.offset, handle.shape, handle.stride)


def _forget_ended_workers(fds: dict[tuple[int, int], int], pid: int) -> None:
    """A new worker's first buffer: close the descriptors of workers that have ended (their buffers'
    memory goes with the last batch on it), so that new workers every epoch hold no more."""
    alive = {p.pid for p in multiprocessing.active_children()} | {pid}
    _close_fds({key: fds.pop(key) for key in [k for k in fds if k[0] not in alive]})


def _close_fds(fds: dict[tuple[int, int], int]) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


def _received(batch: Any, marks: list[tuple[Any, str, int, int]], inline: Sequence[Any] = (),
              handles: Sequence[_Handle] = ()) -> Any:
    """Unpickling a batch in the main process: the plain batch, the tensors sent inline made
    tensors again, each ring buffer mapped, and each buffer handed back to its worker when the last
    tensor on it dies."""
    if inline or handles:
        items = list(batch) if isinstance(batch, tuple) else batch
        for place in inline:
            array = items[place]
            items[place] = torch.from_numpy(array if array.flags.writeable else array.copy())
        for handle in handles:
            items[handle.place] = _mapped(_POOLS.get(handle.token), handle)
        batch = tuple(items) if isinstance(batch, tuple) else items
    for place, token, cell, lease in marks:
        pool = _POOLS.get(token)
        if pool is not None:
            weakref.finalize(batch[place].untyped_storage(), pool.release, cell, lease)
    return batch


class _SharedTuple(BatchTuple):
    """A tuple batch on its way out of a worker. ``_fields`` makes torch's default_convert rebuild
    it as it rebuilds a namedtuple (``type(batch)(*items)``), keeping the wrapper."""

    _fields = ()

    def __new__(cls, *items: Any) -> _SharedTuple:
        return super().__new__(cls, items)

    def __reduce__(self) -> tuple[object, ...]:
        items, marks, inline, handles = _outgoing(list(enumerate(self)))
        return _received, (tuple(value for _, value in items), marks, inline, handles)


class _SharedDict(BatchDict):
    """A dict batch on its way out of a worker (default_convert copies it with ``copy.copy``)."""

    def __copy__(self) -> _SharedDict:
        return _SharedDict(self)

    def __reduce__(self) -> tuple[object, ...]:
        items, marks, inline, handles = _outgoing(list(self.items()))
        return _received, (dict(items), marks, inline, handles)
