"""Batch arrays used again by the process that made them, once nothing refers to them.

Decoding into a fresh 64 x 3 x 224 x 224 float array for every batch costs the kernel a page fault
and a zeroed page every 4 KiB: on a 2-core VM, about 0.25 ms an image, as much as the resample
itself. A Dataset iterated in the training loop's process (no DataLoader workers, or workers
that send numpy arrays) takes its batch arrays from an ``ArrayPool``, which hands the memory of an
array out again once the array and every view of it are gone -- never while the loop (or anything
else: a list of batches, a tensor made with ``torch.from_numpy``, one row) still holds it.

How it knows: each array is a view of one flat array made over a ``bytearray`` (``np.frombuffer``).
numpy makes every view of a view refer to the flat array (its base, since the flat array does not
own its memory and its own base is no array), and torch's ``from_numpy`` keeps the array alive, so
the flat array dies with the last of them; a finalizer then gives its block back. One thing it
can't see: a batch tensor sent to another process (a ``torch.multiprocessing`` queue) is moved to
shared memory and lets go of the array, while a ``t.numpy()`` taken before still points at the old
memory -- clone a batch before sending it on, as for workers' batches (``pool.py``, which DataLoader
workers use instead of this).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import weakref
from typing import Any

import numpy as np

KEEP = 4  # free blocks kept per size: the loop's batch, the one being made, spares
KEEP_BYTES = 512 << 20  # and no more than this in all


class ArrayPool:
    """Arrays whose memory comes back once they (and their views) are gone.

    >>> pool = ArrayPool()
    >>> a = pool.take((2, 3), "float32")
    >>> a.shape, a.flags.writeable, pool.allocated
    ((2, 3), True, 1)
    >>> row = a[1]
    >>> del a
    >>> b = pool.take((2, 3), "float32")  # a row of the first is still held: new memory
    >>> del row, b
    >>> c = pool.take((2, 3), "float32")
    >>> pool.allocated, pool.reused
    (2, 1)
    >>> other = ArrayPool()
    >>> e = other.take((2,), "float32")
    >>> memory = e.base.base  # the memoryview np.frombuffer took of the block
    >>> del e
    >>> f = other.take((2,), "float32")  # that block is still exported: not used again
    >>> other.allocated, other.reused
    (2, 0)
    """

    def __init__(self) -> None:
        self._free: dict[int, list[bytearray]] = {}
        self._kept = 0  # bytes in _free
        # re-entrant: a finalizer may run inside ``_give_back`` (the collector, on an allocation there)
        self._lock = threading.RLock()
        self.allocated = 0  # blocks made
        self.reused = 0  # arrays given a block again

    def take(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """An uninitialized writable array of ``shape`` and ``dtype``."""
        dtype = np.dtype(dtype)
        size = math.prod(shape) * dtype.itemsize
        block = None
        with self._lock:
            free = self._free.get(size)
            while free and block is None:
                block = free.pop()
                self._kept -= size
                if sys.getrefcount(block) > 2:  # still exported (a memoryview of it kept): not used again
                    block = None
            if block is None:
                self.allocated += 1
            else:
                self.reused += 1
        if block is None:
            block = bytearray(size)
        flat = np.frombuffer(block, dtype)  # every view of the array below refers to this one
        weakref.finalize(flat, self._give_back, block).atexit = False
        return flat.reshape(shape)

    def _give_back(self, block: bytearray) -> None:
        """A finalizer, in whichever thread dropped the last view."""
        with self._lock:
            free = self._free.setdefault(len(block), [])
            if len(free) < KEEP and self._kept + len(block) <= KEEP_BYTES:
                free.append(block)
                self._kept += len(block)

    def forked(self) -> None:
        """In a forked child: its copies of the free blocks would be copied again on their first
        write (let go of them), and the lock may have been held by a thread the child lacks."""
        self._free, self._kept = {}, 0
        self._lock = threading.RLock()


ARRAYS = ArrayPool()  # one per process: what a batch array of any Dataset here is taken from
os.register_at_fork(after_in_child=ARRAYS.forked)
