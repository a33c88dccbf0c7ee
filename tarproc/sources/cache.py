"""A local cache of remote shards, shared by the processes of a node.

Where: ``CACHE_DIR/shards/`` (``Dataset(cache_dir=...)``, the commands' ``--cache DIR``). Keyed by
the URL, the object's size and its ETag (or last-modified time): a shard changed on the server is
a new entry, and the old one ages out. Each entry is ``<sha256 of the key>-<file name>`` beside a
``.json`` that says which URL, size and ETag it holds.

**One download per shard per node.** The first process that wants a shard the cache lacks takes
the entry's lock (a file lock in ``locks/``) and fills it in a thread of its own (``Fill``): the
whole shard, from its first byte to its last, whatever part of it the reader wanted, into
``.tmp/NAME.part``. Every reader of that shard, in this process or in another one sharing the
directory (the ranks of a node), reads that growing copy (``Growing``) and waits where the bytes
have not arrived yet: none of them asks the store. The entry is published (an atomic rename) when
every byte is there: as many as the server announced, and matching a sha256 when one is known
(``tarsplit --manifest``). A cut download is retried by the filler (``remote.RemoteReader``); a
filler that dies leaves its lock free, and the next reader that needs the shard takes over.

**Never stale bytes.** A store that names no version (no ETag, no Last-Modified) can rewrite a
shard at the same size unseen. An entry of such a URL is checked before its first use in a
process: ``CHECKS`` ranges of ``CHECK_BYTES`` (the start, a random place, the end) are read from the
store and compared with the copy. A copy that differs is dropped, said once, and fetched again.

``max_bytes`` bounds the entries' total: the least recently used go first (each use touches an
entry's modification time). Every failure of the cache (a full disk, a directory that can't be
written) means no cache, said once: the readers then read the store.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import CacheWarning, SourceError, TarprocError, warner
from ..handoff import Condition
from ..procgroup import wait_set
from .remote import Identity, Network, RemoteReader

CHUNK = 1 << 20  # bytes a filler asks the store for at once
CHECK_BYTES = 4096  # bytes of each range compared for a store that names no version
CHECKS = 3
_POLL_MAX = 0.05  # seconds between two looks at a copy another process fills


class ShardCache:
    """Verified copies of remote shards in ``directory/shards``; see the module's docstring."""

    def __init__(self, directory: str, max_bytes: int | None = None, warn: Callable[[str], None] | None = None) -> None:
        self.root = os.path.join(os.path.expanduser(directory), "shards")
        self.max_bytes = max_bytes
        self.warn = warner(warn, CacheWarning)  # the caller's callback, else a CacheWarning
        self.known: dict[str, Identity] = {}  # identities learned before reading (no request then)
        self.digests: dict[str, str] = {}  # sha256 a manifest gives: an entry must match
        self.broken = False
        self._checked: set[tuple[str, int]] = set()  # entries of version-less URLs checked here (path, inode)
        self._fills: dict[str, Fill] = {}  # this process's fills, by entry name
        self._lock = threading.Lock()
        _instances.add(self)

    def _failed(self, what: str, e: OSError) -> None:
        if not self.broken and self.warn is not None:
            self.warn(f"shard cache {self.root}: {what} failed ({e.strerror or e}); reading without the cache")
        self.broken = True

    def name(self, url: str, identity: Identity) -> str:
        key = json.dumps([url, identity.size, identity.stamp], separators=(",", ":"))
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        base = "".join(c if c.isalnum() or c in "-_." else "_" for c in url.rstrip("/").rsplit("/", 1)[-1])[-80:]
        return f"{digest}-{base}"

    def _final(self, name: str) -> str:
        return os.path.join(self.root, name)

    def _part(self, name: str) -> str:
        return os.path.join(self.root, ".tmp", name + ".part")

    def _complete(self, name: str, identity: Identity) -> bool:
        try:
            return os.stat(self._final(name)).st_size == identity.size
        except OSError:
            return False

    def lookup(self, url: str, identity: Identity | None = None, network: Network | None = None) -> str | None:
        """The path of the entry for this version of ``url``, or None. ``identity`` None: the one
        learned earlier (``learn``), else None (there is no way to know the version then). An
        entry of a URL whose store names no version is checked against the store first
        (``network``: how to read it)."""
        identity = identity or self.known.get(url)
        if identity is None or self.broken:
            return None
        path = self._final(self.name(url, identity))
        try:
            st = os.stat(path)
        except OSError:
            return None
        if st.st_size != identity.size:
            return None
        if identity.stamp is None and not self._check(url, path, st, network):
            return None
        with contextlib.suppress(OSError):  # a cache shared read-only is read all the same
            os.utime(path)  # last used now (the eviction order)
        return path

    def _check(self, url: str, path: str, st: os.stat_result, network: Network | None) -> bool:
        """Whether a copy of a URL whose store names no version still holds the store's bytes
        (sampled ranges); a copy that doesn't is removed, said."""
        if (path, st.st_ino) in self._checked:
            return True
        size = st.st_size
        starts = sorted({0, max(0, size - CHECK_BYTES), random.randrange(max(1, size - CHECK_BYTES + 1))})[:CHECKS]
        try:
            with open(path, "rb") as f:
                for start in starts:
                    stop = min(size, start + CHECK_BYTES)
                    f.seek(start)
                    if f.read(stop - start) != read_range(url, start, stop, network):
                        self._drop(path)
                        if self.warn is not None:
                            self.warn(f"{url}: changed on the server since it was cached (bytes {start}-{stop - 1} "
                                      "differ; the server names no version: no ETag or Last-Modified): fetched again")
                        return False
        except OSError:
            return False  # gone meanwhile: a miss
        except TarprocError as e:
            if self.warn is not None:
                self.warn(f"{url}: the cached copy could not be checked against the store ({e}); using it")
        self._checked.add((path, st.st_ino))
        return True

    def _drop(self, path: str) -> None:
        for p in (path, path + ".json"):
            with contextlib.suppress(OSError):
                os.unlink(p)

    def learn(self, identities: dict[str, Identity], digests: dict[str, str] | None = None) -> None:
        """Remember the versions of these URLs, so that ``lookup`` needs no request, and the sha256
        their copies must have (a ``tarsplit --manifest``'s)."""
        self.known.update(identities)
        self.digests.update(digests or {})

    def cacheable(self, identity: Identity | None) -> bool:
        """Whether a shard of this version can have an entry (its size known, and not over the bound)."""
        return identity is not None and not self.broken and (self.max_bytes is None or identity.size <= self.max_bytes)

    def open(self, url: str, identity: Identity, network: Network, offset: int = 0) -> Any:
        """A raw stream of this version of ``url`` from byte ``offset``, read from the cache: the
        entry, else the copy being filled (by this process, from now on if nobody fills it yet,
        or by another one). Check ``cacheable`` first."""
        path = self.lookup(url, identity, network)
        if path is not None:
            try:
                return open_at(path, offset)
            except OSError:  # evicted since
                pass
        return Growing(self, url, identity, network, offset)

    def ensure(self, url: str, identity: Identity, network: Network, wait: bool = True) -> str | None:
        """The entry's path once this version of ``url`` is in the cache: filled here (this thread
        waits for it), or by another process (``wait``: waited for; else None at once). None also
        when the cache fails (said). Raises the store's ``SourceError``."""
        name = self.name(url, identity)
        pause = 0.001
        while True:
            path = self.lookup(url, identity, network)
            if path is not None:
                return path
            if self.broken:
                return None
            fill = self._filling(url, identity, network, name)
            if fill is not None:
                wait_set(fill.done)
                if isinstance(fill.error, _CacheFailed):
                    return None
                if fill.error is not None:
                    raise fill.error
                continue
            if not wait:
                return None
            time.sleep(pause)  # another process fills it
            pause = min(pause * 2, _POLL_MAX)

    def _filling(self, url: str, identity: Identity, network: Network, name: str) -> Fill | None:
        """This process's fill of the entry: running already, or started now; None when another
        process fills it (or it was published meanwhile, or the cache failed)."""
        with self._lock:
            fill = self._fills.get(name)
            if fill is not None:
                return fill
            if self.broken:
                return None
            try:
                for sub in ("locks", ".tmp"):
                    os.makedirs(os.path.join(self.root, sub), exist_ok=True)
                lock = os.open(os.path.join(self.root, "locks", name), os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                self._failed("creating its directory", e)
                return None
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                os.close(lock)
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):  # no locks on this filesystem
                    self._failed("locking an entry", e)
                return None  # another process fills it now
            if self._complete(name, identity):  # published while we looked
                os.close(lock)
                return None
            self._drop(self._final(name))  # damaged (cut short on disk): filled again
            self._remove_leftovers(name)
            try:
                fd = os.open(self._part(name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            except OSError as e:
                os.close(lock)
                self._failed("creating a file", e)
                return None
            fill = self._fills[name] = Fill(self, url, identity, name, fd, lock, network)
        fill.start()
        return fill

    def _remove_leftovers(self, name: str) -> None:
        """Temporary files of this entry left by a process that was killed (we hold its lock)."""
        tmp_dir = os.path.join(self.root, ".tmp")
        with contextlib.suppress(OSError):
            for other in os.listdir(tmp_dir):
                if other.startswith(name + "."):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(tmp_dir, other))

    def wait(self) -> None:
        """Wait for this process's fills to end (a reader done with its shards: what it started
        is published before the process may exit)."""
        while True:
            with self._lock:
                running = list(self._fills.values())
            if not running:
                return
            for fill in running:
                wait_set(fill.done)

    def publish(self, name: str, url: str, identity: Identity, sha256: str | None) -> bool:
        final = self._final(name)
        meta = {"url": url, "size": identity.size, "etag": identity.stamp, "sha256": sha256,
                "cached": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        part = self._part(name)
        try:
            with open(part + ".json", "w") as f:
                json.dump(meta, f)
            os.replace(part + ".json", final + ".json")
            os.replace(part, final)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(part + ".json")
            self._failed("publishing an entry", e)
            return False
        if self.max_bytes is not None:
            self.evict(keep=final)
        return True

    def entries(self) -> list[tuple[float, int, str]]:
        """``(last used, size, path)`` of every entry, least recently used first."""
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                if entry.is_file() and not entry.name.endswith(".json") and not entry.name.startswith("."):
                    with contextlib.suppress(OSError):
                        st = entry.stat()
                        found.append((st.st_mtime, st.st_size, entry.path))
        return sorted(found)

    def evict(self, keep: str | None = None) -> None:
        """Remove the least recently used entries until they fit in ``max_bytes``."""
        assert self.max_bytes is not None
        try:
            lock = os.open(os.path.join(self.root, "locks", ".evict"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            return
        try:
            for _ in range(100):  # at most ~5 s: eviction is best effort, never a reader's hang
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError:
                    time.sleep(0.05)
            else:
                return
            entries = self.entries()
            total = sum(size for _, size, _ in entries)
            for _, size, path in entries:
                if total <= self.max_bytes:
                    break
                if path == keep:
                    continue
                with contextlib.suppress(OSError):
                    os.unlink(path)  # a reader that has it open reads on (POSIX)
                    total -= size
                with contextlib.suppress(OSError):
                    os.unlink(path + ".json")
        finally:
            os.close(lock)


_instances: weakref.WeakSet[ShardCache] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) inherits the parent's fills as objects, without their
    threads: forget them (their done events would never be set here) and close its copies of their
    files (else the child would hold an entry's lock after the parent's fill failed)."""
    for cache in list(_instances):
        cache._lock = threading.Lock()
        for fill in cache._fills.values():
            for fd in (fill.fd, fill.lock):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        cache._fills.clear()


def _before_fork() -> None:
    """Fork between two of a cache's steps never: a child would hold a lock taken in the middle."""
    for cache in list(_instances):
        cache._lock.acquire()


def _after_fork_in_parent() -> None:
    for cache in list(_instances):
        cache._lock.release()


os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)


class _CacheFailed(Exception):
    """The cache could not be written: readers of the fill read the store instead."""


class Fill:
    """This process's download of one shard into the cache, in a thread: the whole shard into
    ``.tmp/NAME.part``, published when complete. Holds the entry's lock until it ends; ``done``
    is set then, ``error`` says why it failed (None: published)."""

    def __init__(self, cache: ShardCache, url: str, identity: Identity, name: str, fd: int, lock: int,
                 network: Network) -> None:
        self.cache, self.url, self.identity, self.name = cache, url, identity, name
        self.fd, self.lock, self.network = fd, lock, network
        self.written = 0
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.advanced = Condition()  # notified at each write and at the end (waited on by readers: see handoff)
        self._thread = threading.Thread(target=self._run, name="tarproc-cache-fill", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        expected = self.cache.digests.get(self.url)
        digest = hashlib.sha256() if expected is not None else None
        published = False
        try:
            reader = RemoteReader(self.url, 0, self.network)
            try:
                got = reader.identity
                if got is not None and (got.size != self.identity.size or (
                        got.stamp and self.identity.stamp and got.stamp != self.identity.stamp)):
                    raise SourceError(f"changed on the server (was {self.identity}, now {got}); read it again", self.url)
                while self.written < self.identity.size:
                    data = reader.read(min(CHUNK, self.identity.size - self.written))
                    if not data:
                        break
                    self._write(data)
                    if digest is not None:
                        digest.update(data)
            finally:
                reader.close()
            if self.written != self.identity.size:
                raise SourceError(f"the store sent {self.written:,} bytes of {self.identity.size:,}", self.url)
            if digest is not None and digest.hexdigest() != expected:
                if self.cache.warn is not None:
                    self.cache.warn(f"{self.url}: its sha256 is {digest.hexdigest()}, the manifest says {expected}: "
                                    "not cached")
                raise _CacheFailed("sha256")
            os.close(self.fd)
            self.fd = -1
            published = self.cache.publish(self.name, self.url, self.identity,
                                           digest.hexdigest() if digest is not None else None)
            if not published:
                raise _CacheFailed("publish")
            with contextlib.suppress(OSError):  # just read from the store: no need to check it against it
                final = self.cache._final(self.name)
                self.cache._checked.add((final, os.stat(final).st_ino))
        except BaseException as e:  # noqa: BLE001 - handed to the readers that wait for it
            self.error = e
        finally:
            with self.cache._lock:
                self.cache._fills.pop(self.name, None)
            if self.fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(self.fd)
            if not published:
                with contextlib.suppress(OSError):
                    os.unlink(self.cache._part(self.name))
            with contextlib.suppress(OSError):
                os.close(self.lock)
            self.done.set()
            with self.advanced:
                self.advanced.notify_all()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as e:
            self.cache._failed("writing", e)
            raise _CacheFailed("write") from None
        with self.advanced:
            self.written += len(data)
            self.advanced.notify_all()


class Growing:
    """A shard's bytes from ``offset`` on, read from its cache entry, or from the copy being
    filled (``Fill``: this process's, or another's) while it grows: a read waits until the bytes
    it wants are there. When the filler dies, this reader fills it itself; when the cache fails,
    it reads the store from the byte reached."""

    def __init__(self, cache: ShardCache, url: str, identity: Identity, network: Network, offset: int = 0) -> None:
        self.cache, self.url, self.identity, self.network = cache, url, identity, network
        self.name = cache.name(url, identity)
        self.pos = offset
        self._fd = -1
        self._fill: Fill | None = None
        self._store: RemoteReader | None = None
        self._look()

    def _look(self) -> None:
        """Find the copy: the entry, else this process's fill (started now if nobody fills it),
        else the part file another process writes (not there yet: looked for again later)."""
        self._close_fd()
        self._fill = self.cache._filling(self.url, self.identity, self.network, self.name)
        for path in (self.cache._final(self.name), self.cache._part(self.name)):
            try:
                self._fd = os.open(path, os.O_RDONLY)
                return
            except OSError:
                continue

    def read(self, n: int = -1) -> bytes:
        if self._store is not None:
            data = self._store.read(n)
            self.pos += len(data)
            return data
        n = min(CHUNK if n < 0 else n, self.identity.size - self.pos)
        if n <= 0:
            return b""
        pause = 0.001
        while True:
            if self._fd >= 0:
                data = os.pread(self._fd, n, self.pos)
                if data:
                    self.pos += len(data)
                    return data
            fill = self._fill
            if fill is not None:  # this process fills it: wait for the bytes, or for its end
                stuck = self._fd < 0 or fill.written <= self.pos  # nothing to read here until it moves on
                with fill.advanced:
                    if stuck and not fill.done.is_set():
                        fill.advanced.wait(0.05 if self._fd < 0 else 1.0)
                if fill.done.is_set() and stuck:
                    if isinstance(fill.error, _CacheFailed):
                        return self._from_store(n)
                    if fill.error is not None:
                        raise fill.error
                    self._look()  # published: read the entry
                elif self._fd < 0:
                    self._look()  # its part file, created before it started
                continue
            if self.cache.broken:
                return self._from_store(n)
            if self.cache._complete(self.name, self.identity):
                self._look()  # published meanwhile: read the entry
                continue
            time.sleep(pause)  # another process fills it
            pause = min(pause * 2, _POLL_MAX)
            if pause == _POLL_MAX or self._fd < 0:
                self._look()  # its part file there yet? is it still alive? (its lock free: we fill it now)

    def _from_store(self, n: int) -> bytes:
        self._close_fd()
        self._store = RemoteReader(self.url, self.pos, self.network)
        return self.read(n)

    def _close_fd(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        self._close_fd()
        if self._store is not None:
            self._store.close()


def open_at(path: str, offset: int) -> Any:
    f = open(path, "rb", buffering=0)
    if offset:
        f.seek(offset)
    return f


def read_range(url: str, start: int, stop: int, network: Network | None = None) -> bytes:
    """Bytes ``[start, stop)`` of a remote object (retried as any read)."""
    reader = RemoteReader(url, start, network, end=stop)
    try:
        data = bytearray()
        while len(data) < stop - start:
            chunk = reader.read(stop - start - len(data))
            if not chunk:
                break
            data += chunk
        return bytes(data)
    finally:
        reader.close()


__all__ = ["CHECK_BYTES", "Fill", "Growing", "ShardCache", "open_at", "read_range"]
