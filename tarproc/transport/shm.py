"""Batches in shared memory, for a sender and a receiver on one host (``ipc://`` endpoints).

A batch of decoded images is tens of megabytes: through a Unix socket it is copied into the
kernel and out again, and the receiver (the trainer's process) pays for the second copy. On one
host the sender instead decodes straight into shared memory and sends where it is; the receiver
maps it. This is what DataLoader workers do (``tarproc.dataset.pool``), the same way:

- A block is a memory file (``memfd_create``) of the sender process, with no name anywhere: it
  goes with the processes that map it, however they end (nothing is left in ``/dev/shm``). The
  receiver opens it as ``/proc/PID/fd/FD``, PID being the peer the ipc socket's credentials name
  (a peer can only point at its own files), and checks it is one of ours and big enough.
- A fresh block costs the kernel a page fault and a zeroed page every 4 KiB, so each sender keeps
  a ring of blocks and writes into one again once the receiver's consumer has let go of it: the
  block's first 8 bytes hold a lease, a random number written before the batch goes out, and the
  receiver clears it when the last array over its mapping dies (a finalizer on the mapping). A
  block whose lease is still set is never written to; with none free, the sender takes a fresh one.
- A batch sent again (its receiver went away) goes inline, and its block leaves the ring.

A receiver says in its greeting (``shm: true``) that it maps shared batches: only on ``ipc://``
sockets.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import secrets
import stat
import sys
import weakref
from typing import Any

import numpy as np

from ..errors import WireError

HEADER = 4096  # bytes before the data: the lease, and page alignment for the array
MEMFD_NAME = "tarproc-batch"
RING = 6  # blocks a sender keeps: the batches in flight (--hwm 4), the one its consumer holds, one spare


def available() -> bool:
    """Whether batches can go through shared memory here (Linux: memory files, /proc)."""
    return sys.platform.startswith("linux") and hasattr(os, "memfd_create") and os.path.isdir(f"/proc/{os.getpid()}/fd")


class SharedBlock:
    """One batch array in a memory file of this process: decode into ``array``, then ``lend``
    it and send ``descriptor()``."""

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(shape)) * self.dtype.itemsize
        self.fd = os.memfd_create(MEMFD_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, HEADER + self.nbytes)
            # its size is final: a receiver maps only a file that can't shrink under it (SIGBUS)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
            self._map = mmap.mmap(self.fd, HEADER + self.nbytes)
        except BaseException:
            os.close(self.fd)
            raise
        self.array = np.frombuffer(self._map, dtype=self.dtype, count=int(np.prod(shape)), offset=HEADER).reshape(shape)
        # the descriptor is what receivers open: it stays open as long as this block is (a batch
        # holds its block until acknowledged, by when its receiver has opened it)
        self._close = weakref.finalize(self, _close_quietly, self.fd)
        self.lease = 0
        self.held = False  # its batch is the sender's (to send, or to send again until acknowledged)
        self.released = False

    def free(self) -> bool:
        """Neither the sender nor a receiver holds it: it may be written to."""
        return not self.released and not self.held and int.from_bytes(self._map[:8], "little") == 0

    def lend(self) -> None:
        """A new lease, set before the batch goes out (the receiver clears it when done)."""
        self.lease = secrets.randbits(63) | 1
        self._map[:8] = self.lease.to_bytes(8, "little")

    def unlend(self) -> None:
        """The batch did not go out after all: the block is free again."""
        self._map[:8] = bytes(8)

    def descriptor(self) -> dict[str, int]:
        return {"fd": self.fd, "lease": self.lease}

    def release(self) -> None:
        """Not to be used again by this sender (the receiver's mapping, if any, stays valid)."""
        if not self.released:
            self.released = True
            self._close()


class SharedRing:
    """A sender's blocks: ``take`` gives one that nobody holds, of that shape and dtype, held by
    the sender until its batch is acknowledged (``held = False``) and by the receiver until its
    consumer lets go (the lease)."""

    def __init__(self, size: int = RING) -> None:
        self.size = size
        self.blocks: list[SharedBlock] = []

    def take(self, shape: tuple[int, ...], dtype: Any) -> SharedBlock:
        self.blocks = [b for b in self.blocks if not b.released]
        for block in self.blocks:
            if block.shape == tuple(shape) and block.dtype == np.dtype(dtype) and block.free():
                block.lease, block.held = 0, True
                return block
        block = SharedBlock(shape, dtype)
        block.held = True
        if len(self.blocks) < self.size:
            self.blocks.append(block)
        return block

    def close(self) -> None:
        for block in self.blocks:
            block.release()
        self.blocks = []


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def open_shared(descriptor: Any, nbytes: int, peer_pid: int | None) -> memoryview:
    """The ``nbytes`` of a batch that the sender process ``peer_pid`` (from the socket's
    credentials) put in shared memory (``descriptor``: its ``fd`` and ``lease``), mapped; its
    lease is cleared when the last array over them dies. Anything else is a ``WireError``."""
    if not (isinstance(descriptor, dict) and set(descriptor) == {"fd", "lease"}
            and all(type(descriptor[k]) is int and 0 < descriptor[k] < 1 << 63 for k in ("fd", "lease"))):
        raise WireError("bad shared-memory descriptor")
    if peer_pid is None:
        raise WireError("a batch in shared memory from a peer whose process is not known")
    path = f"/proc/{peer_pid}/fd/{descriptor['fd']}"
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        raise WireError(f"shared batch {path}: {e.strerror}") from None
    try:
        # the file opened, not the name read before (the peer may have put another file there since)
        target = os.readlink(f"/proc/self/fd/{fd}")
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not target.startswith(f"/memfd:{MEMFD_NAME}"):
            raise WireError(f"shared batch {path}: not a tarproc batch ({target[:80]})")
        if not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK:
            raise WireError(f"shared batch {path}: its file may shrink (it is not sealed)")
        if info.st_size < HEADER + nbytes:
            raise WireError(f"shared batch {path}: {info.st_size - HEADER} bytes, the header says {nbytes}")
        lease = mmap.mmap(fd, HEADER)
        if int.from_bytes(lease[:8], "little") != descriptor["lease"]:
            lease.close()
            raise WireError(f"shared batch {path}: its lease is not this batch's (written to since)")
        data = mmap.mmap(fd, HEADER + nbytes)
    except OSError as e:  # (a file sealed against writing, no memory left for the mapping)
        raise WireError(f"shared batch {path}: cannot map it: {e.strerror}") from None
    finally:
        os.close(fd)
    weakref.finalize(data, _give_back, lease, descriptor["lease"], os.getpid())
    return memoryview(data)[HEADER:]


def _give_back(lease: mmap.mmap, number: int, pid: int) -> None:
    """The consumer let go of the batch: its sender may write into the block again. (Not in a
    forked child: its copy of the mapping is the same memory, which its parent may still hold.)"""
    with contextlib.suppress(ValueError, OSError):
        if os.getpid() == pid and int.from_bytes(lease[:8], "little") == number:
            lease[:8] = bytes(8)
        lease.close()
