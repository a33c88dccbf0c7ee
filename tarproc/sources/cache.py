"""A local cache of remote shards, written while they are read.

Where: ``CACHE_DIR/shards/`` (``Dataset(cache_dir=...)``, the commands' ``--cache DIR``). Keyed by
the URL, the object's size and its ETag (or last-modified time): a shard changed on the server is
a new entry, and the old one ages out. Each entry is ``<sha256 of the key>-<file name>`` beside a
``.json`` that says which URL, size and ETag it holds.

An entry is written while the first reader streams the shard from its first byte (the read
starts at once) into a temporary file under ``.tmp/``, and published under its final name (an
atomic rename) only when the reader came to the end and the bytes are all there: as many as the
server announced, and matching a sha256 when one is known (``tarsplit --manifest``). A cut
download, a reader that stopped early, or a damaged one never becomes an entry. One process fills
an entry at a time (a file lock in ``locks/``); others wanting it then read the server as if there
were no cache. ``max_bytes`` bounds the entries' total: the least recently used go first (each use
touches an entry's modification time). Every failure of the cache (a full disk, a directory that
can't be written) means no cache, said once, never a failed read.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from ..errors import TarprocError
from .remote import Identity

DRAIN_MAX = 1 << 20  # bytes a reader that stopped near the end still reads, to finish an entry


class ShardCache:
    """Verified copies of remote shards in ``directory/shards``; see the module's docstring."""

    def __init__(self, directory: str, max_bytes: int | None = None, warn: Callable[[str], None] | None = None) -> None:
        self.root = os.path.join(os.path.expanduser(directory), "shards")
        self.max_bytes = max_bytes
        self.warn = warn
        self.known: dict[str, Identity] = {}  # identities learned before reading (no request then)
        self.digests: dict[str, str] = {}  # sha256 a manifest gives: an entry must match
        self.broken = False

    def _failed(self, what: str, e: OSError) -> None:
        if not self.broken and self.warn is not None:
            self.warn(f"shard cache {self.root}: {what} failed ({e.strerror or e}); reading without the cache")
        self.broken = True

    def name(self, url: str, identity: Identity) -> str:
        key = json.dumps([url, identity.size, identity.stamp], separators=(",", ":"))
        digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        base = "".join(c if c.isalnum() or c in "-_." else "_" for c in url.rstrip("/").rsplit("/", 1)[-1])[-80:]
        return f"{digest}-{base}"

    def lookup(self, url: str, identity: Identity | None = None) -> str | None:
        """The path of the entry for this version of ``url``, or None. ``identity`` None: the one
        learned earlier (``learn``), else None (there is no way to know the version then)."""
        identity = identity or self.known.get(url)
        if identity is None or self.broken:
            return None
        path = os.path.join(self.root, self.name(url, identity))
        try:
            if os.stat(path).st_size != identity.size:
                return None
        except OSError:
            return None
        with contextlib.suppress(OSError):  # a cache shared read-only is read all the same
            os.utime(path)  # last used now (the eviction order)
        return path

    def learn(self, identities: dict[str, Identity], digests: dict[str, str] | None = None) -> None:
        """Remember the versions of these URLs, so that ``lookup`` needs no request, and the sha256
        their copies must have (a ``tarsplit --manifest``'s)."""
        self.known.update(identities)
        self.digests.update(digests or {})

    def fill(self, url: str, identity: Identity | None) -> Filling | None:
        """A ``Filling`` for this version of ``url``, or None: the version isn't known, the shard is
        larger than the whole cache, another process is filling it, or the cache can't be written."""
        if identity is None or self.broken or (self.max_bytes is not None and identity.size > self.max_bytes):
            return None
        name = self.name(url, identity)
        try:
            for sub in ("locks", ".tmp"):
                os.makedirs(os.path.join(self.root, sub), exist_ok=True)
            lock = os.open(os.path.join(self.root, "locks", name), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            self._failed("creating its directory", e)
            return None
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(lock)
            return None  # another process fills it now
        final = os.path.join(self.root, name)
        try:
            if os.stat(final).st_size == identity.size:  # filled while we looked
                os.close(lock)
                return None
            os.unlink(final)  # damaged (cut short on disk): filled again
        except OSError:
            pass
        self._remove_leftovers(name)
        tmp = os.path.join(self.root, ".tmp", f"{name}.{os.getpid()}.{secrets.token_hex(4)}")
        try:
            f = open(tmp, "wb")
        except OSError as e:
            os.close(lock)
            self._failed("creating a file", e)
            return None
        return Filling(self, url, identity, name, tmp, f, lock, self.digests.get(url))

    def _remove_leftovers(self, name: str) -> None:
        """Temporary files of this entry left by a process that was killed (we hold its lock)."""
        tmp_dir = os.path.join(self.root, ".tmp")
        with contextlib.suppress(OSError):
            for other in os.listdir(tmp_dir):
                if other.startswith(name + "."):
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(tmp_dir, other))

    def publish(self, filling: Filling) -> None:
        final = os.path.join(self.root, filling.name)
        meta = {"url": filling.url, "size": filling.identity.size, "etag": filling.identity.stamp,
                "sha256": filling.digest.hexdigest() if filling.digest is not None else None,
                "cached": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        try:
            with open(filling.tmp + ".json", "w") as f:
                json.dump(meta, f)
            os.replace(filling.tmp + ".json", final + ".json")
            os.replace(filling.tmp, final)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(filling.tmp + ".json")
            self._failed("publishing an entry", e)
            return
        if self.max_bytes is not None:
            self.evict(keep=final)

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
            fcntl.flock(lock, fcntl.LOCK_EX)
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


class Filling:
    """An entry being written as its shard is read: ``write`` what was read, then ``finish`` (publish
    when complete and verified) or ``abandon``. Holds the entry's lock until then."""

    def __init__(self, cache: ShardCache, url: str, identity: Identity, name: str, tmp: str, f: Any, lock: int,
                 sha256: str | None) -> None:
        self.cache, self.url, self.identity, self.name, self.tmp = cache, url, identity, name, tmp
        self.file = f
        self.lock = lock
        self.written = 0
        self.expected_sha256 = sha256
        self.digest = hashlib.sha256() if sha256 is not None else None
        self.done = False

    @property
    def missing(self) -> int:
        return self.identity.size - self.written

    def write(self, data: bytes) -> None:
        if self.done:
            return
        try:
            self.file.write(data)
        except OSError as e:
            self.cache._failed("writing", e)
            self.abandon()
            return
        self.written += len(data)
        if self.digest is not None:
            self.digest.update(data)

    def finish(self) -> bool:
        """Publish the entry if every byte is there (and the sha256 matches); else drop it."""
        if self.done:
            return False
        complete = self.written == self.identity.size
        if complete and self.digest is not None and self.digest.hexdigest() != self.expected_sha256:
            if self.cache.warn is not None:
                self.cache.warn(f"{self.url}: its sha256 is {self.digest.hexdigest()}, the manifest says "
                                f"{self.expected_sha256}: not cached")
            complete = False
        try:
            self.file.close()
        except OSError as e:
            self.cache._failed("writing", e)
            complete = False
        if complete:
            self.cache.publish(self)
        self._release(remove=not complete)
        return complete

    def abandon(self) -> None:
        if not self.done:
            with contextlib.suppress(OSError):
                self.file.close()
            self._release(remove=True)

    def _release(self, remove: bool) -> None:
        self.done = True
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.tmp)
        os.close(self.lock)


class Tee:
    """A raw stream that copies what is read from it into a cache entry: ``cache.fill(url, identity)``
    on the first read (a stream opened ahead and never read makes no file). ``finish()`` (the
    reader came to the end) reads what is left, up to ``DRAIN_MAX`` bytes, and publishes; ``close``
    without it drops the entry."""

    def __init__(self, raw: Any, cache: ShardCache, url: str, identity: Identity) -> None:
        self.raw = raw
        self.start: tuple[ShardCache, str, Identity] | None = (cache, url, identity)
        self.filling: Filling | None = None

    def read(self, n: int = -1) -> bytes:
        if self.start is not None:
            cache, url, identity = self.start
            self.start = None
            self.filling = cache.fill(url, identity)
        data = self.raw.read(n)
        if data and self.filling is not None:
            self.filling.write(data)
        return data  # type: ignore[no-any-return]

    def finish(self) -> None:
        filling = self.filling
        if filling is None or filling.done or filling.missing > DRAIN_MAX:
            return
        try:
            while filling.missing > 0:
                if not self.read(filling.missing):
                    break
        except TarprocError:  # the reader had all it wanted: a failure past it only costs the entry
            filling.abandon()
            return
        filling.finish()

    def close(self) -> None:
        if self.filling is not None:
            self.filling.abandon()
        self.raw.close()


__all__ = ["DRAIN_MAX", "Filling", "ShardCache", "Tee"]
