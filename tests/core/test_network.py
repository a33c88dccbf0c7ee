"""The pieces of remote reading that need no server: the settings, read-ahead, the shard cache.
(With servers that misbehave: tests/interop/test_faults.py.)"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
from tarhelpers import run

from tarproc.cli.tarcat import main as tarcat_main
from tarproc.dataset import Dataset
from tarproc.errors import OptionError, SourceError
from tarproc.sources import Network
from tarproc.sources.cache import ShardCache
from tarproc.sources.prefetch import Ahead, Budget, Prefetcher
from tarproc.sources.remote import Identity


@pytest.mark.parametrize("bad", [{"retries": -1}, {"retries": True}, {"timeout": 0}, {"prefetch": -5},
                                 {"cache_size": 10}, {"cache_dir": "c", "cache_size": 0},
                                 {"min_speed": -1}, {"speed_time": 0}])
def test_bad_settings_are_named(bad: dict[str, Any]) -> None:
    with pytest.raises(OptionError, match=list(bad)[-1]):
        Network(**bad)


def test_the_dataset_checks_them_at_construction(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="bad retries"):
        Dataset(str(tmp_path / "a.tar"), retries=-1, lengths=None)


def test_cache_size_needs_cache() -> None:
    r = run(tarcat_main, ["--cache-size", "1G", "x.tar"])
    assert r.exit_code == 2 and "--cache-size bounds the --cache" in r.stderr


class Pieces:
    """A raw stream of given pieces, then an error or the end; counts its reads."""

    def __init__(self, pieces: list[bytes], error: Exception | None = None) -> None:
        self.pieces = list(pieces)
        self.error = error
        self.closed = threading.Event()

    def read(self, n: int = -1) -> bytes:
        if self.pieces:
            return self.pieces.pop(0)
        if self.error is not None:
            raise self.error
        return b""

    def close(self) -> None:
        self.closed.set()


def test_read_ahead_hands_out_every_byte_then_the_error_where_it_happened() -> None:
    raw = Pieces([b"a" * 10, b"b" * 5], SourceError("read failed at byte 15: reset", "u"))
    ahead = Ahead(raw, max_bytes=4)
    got = b""
    with pytest.raises(SourceError, match="byte 15"):
        while True:
            got += ahead.read(3)
    assert got == b"a" * 10 + b"b" * 5
    ahead.close()
    assert raw.closed.wait(5)


def test_prefetcher_opens_in_the_background_and_closes_what_is_not_taken() -> None:
    opened: list[tuple[str, int]] = []
    raws: dict[str, Pieces] = {}

    def open_raw(url: str, offset: int, budget: Any, end: int | None) -> Pieces:
        if url == "missing":
            raise SourceError("not found", url)
        opened.append((url, offset))
        raws[url] = Pieces([url.encode()])
        return raws[url]

    with Prefetcher(open_raw) as ahead:
        ahead.schedule("a", 0)
        ahead.schedule("b", 7)
        ahead.schedule("missing")
        assert ahead.take("a", 0).read() == b"a"
        assert ahead.take("a", 0) is None  # taken once
        assert ahead.take("b", 0) is None  # not what was scheduled: opened as usual by the caller
        assert ahead.take("missing") is None  # its opening failed: opened again by the reader, with fresh retries
    assert raws["b"].closed.wait(5)
    assert sorted(opened) == [("a", 0), ("b", 7)]


def identity(data: bytes, stamp: str | None = '"etag"') -> Identity:
    return Identity(len(data), stamp)


def store(url: str, data: bytes) -> None:
    """Put an object in fsspec's in-process memory store (the cache reads it as any remote URL)."""
    import fsspec

    with fsspec.open(url, "wb") as f:
        f.write(data)


def fill(cache: ShardCache, url: str, data: bytes, stamp: str | None = '"etag"') -> str | None:
    store(url, data)
    return cache.ensure(url, identity(data, stamp), Network())


def test_cache_entries_are_published_whole_and_looked_up_by_version(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path))
    data = os.urandom(5000)
    path = fill(cache, "memory://h/a.tar", data)
    assert path == cache.lookup("memory://h/a.tar", identity(data))
    assert path is not None and Path(path).read_bytes() == data
    assert cache.lookup("memory://h/a.tar", Identity(5000, '"other"')) is None  # changed on the server
    assert cache.lookup("memory://h/a.tar") is None  # the version unknown: no guess
    assert os.listdir(tmp_path / "shards" / ".tmp") == []


def hold(cache_dir: Path, cache: ShardCache, url: str, data: bytes) -> tuple[int, Path]:
    """Play another process filling ``url``'s entry: its lock taken, its part file started."""
    import fcntl

    name = cache.name(url, identity(data))
    for sub in ("locks", ".tmp"):
        (cache_dir / "shards" / sub).mkdir(parents=True, exist_ok=True)
    lock = os.open(cache_dir / "shards" / "locks" / name, os.O_RDWR | os.O_CREAT)
    fcntl.flock(lock, fcntl.LOCK_EX)
    return lock, cache_dir / "shards" / ".tmp" / (name + ".part")


def read_all(raw: Any, into: list[bytes]) -> None:
    while chunk := raw.read(1000):
        into.append(chunk)


def test_a_reader_reads_the_copy_another_process_fills_as_it_grows(tmp_path: Path) -> None:
    from tarproc.sources.cache import Growing

    cache = ShardCache(str(tmp_path))
    url, data = "memory://h/grow.tar", os.urandom(3000)
    store(url, b"not what the other process fills: the store is not asked")
    lock, part = hold(tmp_path, cache, url, data)
    part.write_bytes(data[:1000])
    got: list[bytes] = []
    reader = threading.Thread(target=read_all, args=(Growing(cache, url, identity(data), Network(), 500), got))
    reader.start()
    with open(part, "ab") as f:  # the rest arrives, then the entry is published
        f.write(data[1000:])
    os.replace(part, tmp_path / "shards" / cache.name(url, identity(data)))
    os.close(lock)
    reader.join(30)
    assert b"".join(got) == data[500:]


def test_when_the_filler_dies_a_reader_fills_it_itself(tmp_path: Path) -> None:
    from tarproc.sources.cache import Growing

    cache = ShardCache(str(tmp_path))
    url, data = "memory://h/dies.tar", os.urandom(3000)
    store(url, data)
    lock, part = hold(tmp_path, cache, url, data)
    part.write_bytes(data[:700])  # what the dead process had written, never published
    got: list[bytes] = []
    reader = threading.Thread(target=read_all, args=(Growing(cache, url, identity(data), Network()), got))
    reader.start()
    os.close(lock)  # the filler is gone
    reader.join(30)
    cache.wait()
    assert b"".join(got) == data
    assert Path(cache.lookup(url, identity(data)) or "").read_bytes() == data
    assert os.listdir(tmp_path / "shards" / ".tmp") == []


def test_a_store_that_names_no_version_has_its_copy_checked_before_use(tmp_path: Path) -> None:
    said: list[str] = []
    url, data = "memory://h/noetag.tar", os.urandom(20_000)
    assert fill(ShardCache(str(tmp_path)), url, data, stamp=None) is not None
    later = ShardCache(str(tmp_path), warn=said.append)  # another process: checks before its first use
    assert later.lookup(url, identity(data, None), Network()) is not None and said == []
    store(url, bytes(reversed(data)))  # rewritten at the same size
    again = ShardCache(str(tmp_path), warn=said.append)
    assert again.lookup(url, identity(data, None), Network()) is None
    assert len(said) == 1 and "changed on the server since it was cached" in said[0]
    assert Path(fill(again, url, bytes(reversed(data)), stamp=None) or "").read_bytes() == bytes(reversed(data))


def test_one_filler_at_a_time_and_a_damaged_entry_is_a_miss(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path))
    data = os.urandom(3000)
    lock, _ = hold(tmp_path, cache, "memory://h/a.tar", data)
    store("memory://h/a.tar", data)
    assert cache.ensure("memory://h/a.tar", identity(data), Network(), wait=False) is None  # another one fills it
    os.close(lock)
    path = cache.ensure("memory://h/a.tar", identity(data), Network())
    assert path is not None
    Path(path).write_bytes(data[:100])  # cut short on disk
    assert cache.lookup("memory://h/a.tar", identity(data)) is None


def test_eviction_removes_the_least_recently_used(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=2500)
    blobs = {name: os.urandom(1000) for name in "abc"}
    fill(cache, "memory://h/a", blobs["a"])
    os.utime(tmp_path / "shards" / os.listdir(tmp_path / "shards")[0], (1, 1))
    fill(cache, "memory://h/b", blobs["b"])
    assert cache.lookup("memory://h/a", identity(blobs["a"])) is not None  # a used again: b is the oldest now
    os.utime(cache.lookup("memory://h/b", identity(blobs["b"])) or "", (2, 2))
    fill(cache, "memory://h/c", blobs["c"])
    assert [cache.lookup(f"memory://h/{n}", identity(blobs[n])) is not None for n in "abc"] == [True, False, True]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_cache_that_cannot_be_written_is_said_once_and_reading_goes_on(tmp_path: Path) -> None:
    said: list[str] = []
    (tmp_path / "ro").mkdir()
    os.chmod(tmp_path / "ro", stat.S_IRUSR | stat.S_IXUSR)
    cache = ShardCache(str(tmp_path / "ro"), warn=said.append)
    store("memory://h/ro-a", b"x")
    store("memory://h/ro-b", b"y")
    assert cache.ensure("memory://h/ro-a", identity(b"x"), Network()) is None
    assert cache.open("memory://h/ro-b", identity(b"y"), Network()).read() == b"y"  # from the store
    assert len(said) == 1 and "reading without the cache" in said[0]


def test_read_ahead_closed_mid_read_gives_its_budget_back() -> None:
    started, release = threading.Event(), threading.Event()

    class Slow(Pieces):
        def read(self, n: int = -1) -> bytes:
            started.set()
            release.wait(5)
            return b"x" * 1000

    budget = Budget(10_000)
    ahead = Ahead(Slow([]), 0, budget)
    assert started.wait(5)
    ahead.close()  # while its thread is in a read
    release.set()
    ahead._thread.join(5)
    assert budget.held == 0


def test_a_damaged_entry_is_filled_again(tmp_path: Path) -> None:
    cache = ShardCache(str(tmp_path))
    data = os.urandom(3000)
    path = fill(cache, "memory://h/d.tar", data)
    assert path is not None
    Path(path).write_bytes(data[:10])
    assert Path(fill(cache, "memory://h/d.tar", data) or "").read_bytes() == data


def test_a_forked_child_forgets_the_parents_fills(tmp_path: Path) -> None:
    """A DataLoader worker forked while the parent fills an entry inherits the fill as an object,
    without its thread: it must not wait for it (it never ends there), nor keep its lock."""
    import fcntl
    import multiprocessing

    from tarproc.sources.cache import Fill

    cache = ShardCache(str(tmp_path))
    data = os.urandom(1000)
    lock, part = hold(tmp_path, cache, "memory://h/f.tar", data)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT)
    cache._fills["f"] = Fill(cache, "memory://h/f.tar", identity(data), "f", fd, lock, Network())  # never started

    def child(done: Any) -> None:
        cache.wait()  # returns: nothing of this process's to wait for
        lock_path = tmp_path / "shards" / "locks" / cache.name("memory://h/f.tar", identity(data))
        done.put((cache._fills == {}, os.path.exists(lock_path)))

    done = multiprocessing.get_context("fork").Queue()
    proc = multiprocessing.get_context("fork").Process(target=child, args=(done,))
    proc.start()
    assert done.get(timeout=30) == (True, True)
    proc.join(30)
    # the parent still holds its lock: another open of the lock file can't take it
    other = os.open(tmp_path / "shards" / "locks" / cache.name("memory://h/f.tar", identity(data)), os.O_RDWR)
    with pytest.raises(OSError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(other)
    cache._fills.clear()
    os.close(fd)
    os.close(lock)
