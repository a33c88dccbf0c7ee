"""Per-shard sample counts (tarproc.dataset.counts): sidecar indexes (tarproc and DALI), manifests,
wids descriptors, given lists and dicts, counting with a persistent cache, stale and malformed
sidecars, damaged shards, and shards served over HTTP by a real server on 127.0.0.1."""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
from tarhelpers import tarfile_shard, write_tar

import tarproc.dataset.counts as counts_mod
from tarproc.dataset.counts import ShardCounts, default_cache_dir, shard_counts
from tarproc.errors import (
    DataWarning,
    IndexFileError,
    OptionError,
    SourceError,
    TarFormatError,
    TarprocError,
    TarprocWarning,
)
from tarproc.index import build_index, default_index_url, wids_descriptor
from tarproc.sources import Network


def make_samples(n: int, prefix: str = "k", size: int = 100) -> list[dict[str, Any]]:
    return [{"__key__": f"{prefix}/{i:04d}", "txt": f"sample {i}".encode() * (size // 8 + 1), "cls": str(i)}
            for i in range(n)]


def shard(path: Path, n: int, **kw: Any) -> str:
    write_tar(path, make_samples(n, path.stem, **kw))
    return str(path)


def cache_files(cache: Path) -> list[Path]:
    folder = cache / "counts"
    return sorted(folder.iterdir()) if folder.exists() else []


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def no_build(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counting by build_index or read_samples fails the test; returns nothing is ever called."""
    calls: list[str] = []

    def refuse(url: str, *a: Any, **kw: Any) -> Any:
        calls.append(url)
        raise AssertionError(f"{url} was read, but its count should have come from elsewhere")

    monkeypatch.setattr(counts_mod, "build_index", refuse)
    monkeypatch.setattr(counts_mod, "read_samples", refuse)
    return calls


class Warnings(list):  # type: ignore[type-arg]
    def __call__(self, message: str) -> None:
        self.append(message)


# ---------------------------------------------------------------------------------------------
# sources


def test_tarproc_sidecar_reads_only_the_header(tmp_path, cache, no_build):
    url = shard(tmp_path / "train-0.tar", 5)
    idx = Path(default_index_url(url))
    text = build_index(url).jsonl_bytes()
    # everything after the header is garbage: only the first line may be read
    idx.write_bytes(text.split(b"\n", 1)[0] + b"\nnot json at all \xff\xfe\n" + b"x" * 100000)
    got = shard_counts([url], cache_dir=str(cache))
    assert got == ShardCounts({url: 5}, {url: f"index {idx}"}, [])
    assert cache_files(cache) == []  # nothing counted, nothing cached


def test_dali_sidecar(tmp_path, cache, no_build):
    url = shard(tmp_path / "train-1.tar", 4)
    idx = default_index_url(url, "dali")
    assert idx == str(tmp_path / "train-1.idx")
    Path(idx).write_text(build_index(url).dali_text())
    got = shard_counts([url], cache_dir=str(cache))
    assert got.counts == {url: 4} and got.sources == {url: f"DALI index {idx}"}


def test_dali_content_under_the_tarproc_name(tmp_path, cache, no_build):
    url = shard(tmp_path / "s.tar", 3)
    Path(default_index_url(url)).write_text(build_index(url).dali_text())
    got = shard_counts([url], cache_dir=str(cache))
    assert got.counts == {url: 3} and got.sources[url].startswith("DALI index ")


def test_tarproc_sidecar_wins_over_dali(tmp_path, cache, no_build):
    url = shard(tmp_path / "s.tar", 3)
    Path(default_index_url(url)).write_bytes(build_index(url).jsonl_bytes())
    Path(default_index_url(url, "dali")).write_text("v1.2 99\n")  # never read: bad, but second
    assert shard_counts([url], cache_dir=str(cache)).sources[url] == f"index {default_index_url(url)}"


def test_shard_without_extension_has_one_sidecar_name(tmp_path, cache, no_build):
    url = shard(tmp_path / "plain", 2)
    assert default_index_url(url) == default_index_url(url, "dali")
    Path(default_index_url(url)).write_text(build_index(url).dali_text())
    assert shard_counts([url], cache_dir=str(cache)).counts == {url: 2}


def test_manifest_matches_exactly_or_by_base_name(tmp_path, no_build):
    a, b = str(tmp_path / "d" / "a.tar"), "s3://bucket/b.tar"
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"shard": "elsewhere/a.tar", "samples": 7, "bytes": 1}) + "\n\n"
                        + json.dumps({"shard": "s3://bucket/b.tar", "samples": 0}) + "\n")
    got = shard_counts([a, b], str(manifest))
    assert got == ShardCounts({a: 7, b: 0}, {a: f"manifest {manifest}", b: f"manifest {manifest}"}, [])
    assert shard_counts([a], manifest).counts == {a: 7}  # a PathLike


def test_manifest_missing_entry(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"shard": "a.tar", "samples": 3}) + "\n")
    with pytest.raises(OptionError) as e:
        shard_counts(["a.tar", "x/b.tar"], str(manifest))
    assert str(manifest) in str(e.value) and "x/b.tar" in str(e.value)


@pytest.mark.parametrize("line, what", [
    ("not json", "row 2"),
    ('{"shard": "b.tar"}', "row 2"),
    ('{"shard": "b.tar", "samples": -1}', "row 2: samples is -1"),
    ('{"shard": "b.tar", "samples": 2.5}', "row 2: samples is 2.5"),
    ('{"shard": "b.tar", "samples": "3"}', "row 2: samples is '3'"),
    ('{"shard": "a.tar", "samples": 4}', "row 2: shard a.tar is listed again"),
])
def test_manifest_bad_rows(tmp_path, line, what):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps({"shard": "a.tar", "samples": 3}) + "\n" + line + "\n")
    with pytest.raises(OptionError, match=what) as e:
        shard_counts(["a.tar"], str(manifest))
    assert str(manifest) in str(e.value)


def test_manifest_ambiguous_base_name(tmp_path):
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"shard": "x/a.tar", "samples": 3}\n{"shard": "y/a.tar", "samples": 4}\n')
    assert shard_counts(["x/a.tar"], str(manifest)).counts == {"x/a.tar": 3}  # exact wins
    with pytest.raises(OptionError, match="several entries"):
        shard_counts(["z/a.tar"], str(manifest))


def test_lengths_file_missing_or_unreadable(tmp_path):
    with pytest.raises(OptionError, match="no such file") as e:
        shard_counts(["a.tar"], str(tmp_path / "nope.jsonl"))
    assert "nope.jsonl" in str(e.value)
    bad = tmp_path / "bin.jsonl"
    bad.write_bytes(b'{"shard": "a.tar", "samples": 1}\n\xff\n')
    with pytest.raises(OptionError, match="line 2: not UTF-8"):
        shard_counts(["a.tar"], str(bad))


def test_wids_descriptor(tmp_path, no_build):
    a, b = shard(tmp_path / "a.tar", 3), shard(tmp_path / "b.tar", 2)
    desc = wids_descriptor([("a.tar", build_index(a)), ("http://h/b.tar", build_index(b))])
    path = tmp_path / "w.json"
    path.write_text(json.dumps(desc, indent=1))
    got = shard_counts([a, "http://h/b.tar"], str(path))
    assert got.counts == {a: 3, "http://h/b.tar": 2}
    assert set(got.sources.values()) == {f"wids {path}"}
    with pytest.raises(OptionError) as e:
        shard_counts([a, str(tmp_path / "c.tar")], str(path))
    assert str(path) in str(e.value) and "c.tar" in str(e.value)


@pytest.mark.parametrize("desc, what", [
    ({"__kind__": "wids-shard-index-v1"}, "shardlist"),
    ({"__kind__": "wids-shard-index-v1", "shardlist": [{"url": "a.tar", "nsamples": -2}]}, "nsamples is -2"),
    ({"__kind__": "wids-shard-index-v1", "shardlist": [{"nsamples": 2}]}, "entry 0"),
    ({"__kind__": "something-else", "shardlist": []}, "unknown kind"),
])
def test_wids_descriptor_malformed(tmp_path, desc, what):
    path = tmp_path / "w.json"
    path.write_text(json.dumps(desc))
    with pytest.raises(OptionError, match=what) as e:
        shard_counts(["a.tar"], str(path))
    assert str(path) in str(e.value)


def test_given_list_and_dict(no_build):
    urls = ["a.tar", "b.tar", "c.tar"]
    assert shard_counts(urls, [1, 0, 5]) == ShardCounts({"a.tar": 1, "b.tar": 0, "c.tar": 5},
                                                        dict.fromkeys(urls, "given"), [])
    assert shard_counts(urls, (1, 0, 5)).counts == {"a.tar": 1, "b.tar": 0, "c.tar": 5}
    got = shard_counts(urls, {"c.tar": 2, "a.tar": 1, "b.tar": 3, "unused.tar": 9})
    assert got.counts == {"a.tar": 1, "b.tar": 3, "c.tar": 2} and set(got.sources.values()) == {"given"}


@pytest.mark.parametrize("lengths, what", [
    ([1, 2], "2 sample counts for 3 shards"),
    ([1, -1, 2], "sample count 1 .shard b.tar. is -1"),
    ([1, 2.0, 2], "sample count 1 .shard b.tar. is 2.0"),
    ([1, "2", 2], "is '2'"),
    ([1, True, 2], "is True"),
    ({"a.tar": 1, "b.tar": 2}, "no sample count for shard c.tar"),
    ({"a.tar": 1, "b.tar": 2, "c.tar": -3}, "the count of shard c.tar is -3"),
    (3, "bad lengths int"),
])
def test_given_bad_counts(lengths, what):
    with pytest.raises(OptionError, match=what):
        shard_counts(["a.tar", "b.tar", "c.tar"], lengths)


def test_no_counts():
    assert shard_counts(["a.tar", "b.tar"], None) == ShardCounts(None, {}, ["a.tar", "b.tar"])
    assert shard_counts(["a.tar"], False) == ShardCounts(None, {}, ["a.tar"])


def test_pipe_urls_are_missing(tmp_path, cache):
    url = shard(tmp_path / "a.tar", 2)
    pipe = f"pipe:cat {url}"
    got = shard_counts([url, pipe], cache_dir=str(cache))
    assert got.counts is None and got.missing == [pipe] and got.sources == {url: "counted"}
    assert shard_counts([pipe], "count", cache_dir=str(cache)).missing == [pipe]


def test_default_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TARPROC_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "explicit")
    monkeypatch.delenv("TARPROC_CACHE_DIR")
    assert default_cache_dir() == str(tmp_path / "xdg" / "tarproc")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir() == str(tmp_path / "home" / ".cache" / "tarproc")


def test_default_cache_dir_is_used(monkeypatch, tmp_path):
    monkeypatch.setenv("TARPROC_CACHE_DIR", str(tmp_path / "env-cache"))
    url = shard(tmp_path / "a.tar", 2)
    assert shard_counts([url]).counts == {url: 2}
    assert len(cache_files(tmp_path / "env-cache")) == 1


# ---------------------------------------------------------------------------------------------
# counting and the cache


def test_counted_then_from_cache(tmp_path, cache, monkeypatch):
    urls = [shard(tmp_path / f"s-{i}.tar", n) for i, n in enumerate([3, 0, 7])]
    got = shard_counts(urls, cache_dir=str(cache))
    assert got == ShardCounts(dict(zip(urls, [3, 0, 7], strict=True)), dict.fromkeys(urls, "counted"), [])
    files = cache_files(cache)
    assert len(files) == 3 and all(len(f.stem) == 64 for f in files)
    monkeypatch.setattr(counts_mod, "build_index", lambda *a, **kw: pytest.fail("counted again"))
    again = shard_counts(urls, cache_dir=str(cache))
    assert again.counts == got.counts and set(again.sources.values()) == {"counted (cache)"}


def test_rewritten_shard_is_counted_again(tmp_path, cache):
    url = shard(tmp_path / "s.tar", 3)
    assert shard_counts([url], cache_dir=str(cache)).counts == {url: 3}
    shard(tmp_path / "s.tar", 5)
    os.utime(url, ns=(1, 1))  # another mtime for sure, whatever the clock's resolution
    got = shard_counts([url], cache_dir=str(cache))
    assert got.counts == {url: 5} and got.sources == {url: "counted"}


def test_sixteen_shards_are_each_read_once(tmp_path, cache, monkeypatch):
    urls = [shard(tmp_path / f"s-{i:02d}.tar", i + 1) for i in range(16)]
    calls: list[str] = []
    real = counts_mod.build_index

    def counting(url: str, *a: Any, **kw: Any) -> Any:
        calls.append(url)
        return real(url, *a, **kw)

    monkeypatch.setattr(counts_mod, "build_index", counting)
    monkeypatch.setattr(counts_mod, "read_samples", lambda *a, **kw: pytest.fail("plain shards are indexed, not read"))
    got = shard_counts(urls + urls[:3], cache_dir=str(cache))  # repeats are looked up once
    assert got.counts == {u: i + 1 for i, u in enumerate(urls)}
    assert calls == urls
    shard_counts(urls, cache_dir=str(cache))
    assert calls == urls  # all from the cache


def test_compressed_shard_is_counted_by_reading(tmp_path, cache):
    plain = shard(tmp_path / "p.tar", 4)
    url = str(tmp_path / "c.tar.gz")
    Path(url).write_bytes(gzip.compress(Path(plain).read_bytes()))
    got = shard_counts([url], cache_dir=str(cache))
    assert got.counts == {url: 4} and got.sources == {url: "counted"}
    assert shard_counts([url], cache_dir=str(cache)).sources == {url: "counted (cache)"}


def test_shard_with_hard_links_is_counted_by_reading(tmp_path, cache):
    url = str(tarfile_shard(tmp_path / "l.tar", [("a.txt", b"1"), ("b.txt", "->a.txt"), ("c.txt", b"3")],
                            link=tarfile.LNKTYPE))
    assert shard_counts([url], cache_dir=str(cache)).counts == {url: 3}


def test_file_url(tmp_path, cache):
    path = shard(tmp_path / "a.tar", 2)
    assert shard_counts([f"file://{path}"], cache_dir=str(cache)).counts == {f"file://{path}": 2}


def test_missing_local_shard(tmp_path, cache):
    url = str(tmp_path / "nope.tar")
    with pytest.raises(SourceError) as e:
        shard_counts([url], cache_dir=str(cache))
    assert url in str(e.value)


def test_damaged_shard_raises_the_readers_error(tmp_path, cache):
    url = shard(tmp_path / "d.tar", 4, size=3000)
    data = Path(url).read_bytes()
    Path(url).write_bytes(data[: len(data) // 2 + 100])
    with pytest.raises(TarFormatError) as e:
        shard_counts([url], cache_dir=str(cache))
    assert url in str(e.value) and "byte" in str(e.value)
    assert cache_files(cache) == []


def test_damaged_compressed_shard(tmp_path, cache):
    plain = shard(tmp_path / "p.tar", 4, size=3000)
    url = str(tmp_path / "c.tar.gz")
    Path(url).write_bytes(gzip.compress(Path(plain).read_bytes())[:-30])
    with pytest.raises(TarprocError) as e:  # CompressionError or TarFormatError, naming the shard
        shard_counts([url], cache_dir=str(cache))
    assert url in str(e.value)


@pytest.mark.parametrize("damage", [b"", b"{not json", b"[1, 2]", b"\x00\x01garbage",
                                    b'{"version": 1, "key": "x", "samples": -1}'])
def test_damaged_cache_file_is_ignored_and_rewritten(tmp_path, cache, damage):
    url = shard(tmp_path / "a.tar", 3)
    shard_counts([url], cache_dir=str(cache))
    (entry,) = cache_files(cache)
    good = entry.read_bytes()
    entry.write_bytes(damage)
    got = shard_counts([url], cache_dir=str(cache))
    assert got.counts == {url: 3} and got.sources == {url: "counted"}
    assert entry.read_bytes() == good


def test_cache_entry_for_another_key_is_ignored(tmp_path, cache):
    a, b = shard(tmp_path / "a.tar", 3), shard(tmp_path / "b.tar", 5)
    shard_counts([a], cache_dir=str(cache))
    (entry,) = cache_files(cache)
    record = json.loads(entry.read_text())
    record["key"][1] = os.path.realpath(b)  # as if the hash named another shard
    entry.write_text(json.dumps(record))
    assert shard_counts([a], cache_dir=str(cache)).sources == {a: "counted"}


def test_unwritable_cache_dir_is_no_cache(tmp_path):
    url = shard(tmp_path / "a.tar", 3)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    for _ in range(2):
        got = shard_counts([url], cache_dir=str(blocker))
        assert got.counts == {url: 3} and got.sources == {url: "counted"}
    assert blocker.read_text() == "not a directory"


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes anywhere")
def test_read_only_cache_dir_is_no_cache(tmp_path):
    url = shard(tmp_path / "a.tar", 3)
    ro = tmp_path / "ro"
    (ro / "counts").mkdir(parents=True)
    os.chmod(ro / "counts", 0o500)
    try:
        assert shard_counts([url], cache_dir=str(ro)).counts == {url: 3}
        assert os.listdir(ro / "counts") == []
    finally:
        os.chmod(ro / "counts", 0o700)


def _write_entry(root: str, key: list[Any], n: int, times: int) -> None:
    cache = counts_mod._Cache(root)
    for _ in range(times):
        cache.put(key, n)


def _count_one(url: str, root: str, out: Any) -> None:
    out.put(shard_counts([url], cache_dir=root).counts[url])


# forked, not spawned: the children have tarproc imported already (and spawn can't import this
# module by name under --import-mode=importlib)
_fork = multiprocessing.get_context("fork")


def test_concurrent_writers_never_leave_a_partial_file(tmp_path, cache):
    key = ["local", "/data/shared.tar", 123, 456]
    target = counts_mod._Cache(str(cache))._path(key)
    procs = [_fork.Process(target=_write_entry, args=(str(cache), key, 1234567, 200)) for _ in range(4)]
    for p in procs:
        p.start()
    try:
        while any(p.is_alive() for p in procs):
            try:
                raw = Path(target).read_bytes()
            except FileNotFoundError:
                continue
            assert json.loads(raw)["samples"] == 1234567, raw  # whole, every time
    finally:
        for p in procs:
            p.join(timeout=60)
    assert [p.exitcode for p in procs] == [0] * 4
    assert json.loads(Path(target).read_bytes()) == {"version": 1, "key": key, "samples": 1234567}
    assert [f.name for f in cache_files(cache)] == [os.path.basename(target)]  # no temporaries left


def test_concurrent_counts_of_one_shard(tmp_path, cache):
    url = shard(tmp_path / "a.tar", 6)
    out = _fork.Queue()
    procs = [_fork.Process(target=_count_one, args=(url, str(cache), out)) for _ in range(4)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert got == [6] * 4 and [p.exitcode for p in procs] == [0] * 4
    assert len(cache_files(cache)) == 1
    assert shard_counts([url], cache_dir=str(cache)).sources == {url: "counted (cache)"}


# ---------------------------------------------------------------------------------------------
# stale and malformed sidecars


def test_stale_tarproc_sidecar_is_recounted_with_one_warning(tmp_path, cache):
    url = shard(tmp_path / "s.tar", 3)
    other = shard(tmp_path / "other.tar", 9)
    idx = default_index_url(url)
    Path(idx).write_bytes(build_index(other).jsonl_bytes())
    warnings = Warnings()
    got = shard_counts([url, url], cache_dir=str(cache), warn=warnings)
    assert got.counts == {url: 3} and got.sources == {url: "counted"}
    assert len(warnings) == 1 and idx in warnings[0] and url in warnings[0] and "stale" in warnings[0]


def test_stale_dali_sidecar_is_recounted(tmp_path, cache):
    url = shard(tmp_path / "s.tar", 2)
    other = shard(tmp_path / "other.tar", 9)
    idx = default_index_url(url, "dali")
    Path(idx).write_text(build_index(other).dali_text())
    warnings = Warnings()
    got = shard_counts([url], cache_dir=str(cache), warn=warnings)
    assert got.counts == {url: 2} and got.sources == {url: "counted"}
    assert len(warnings) == 1 and idx in warnings[0] and url in warnings[0]


def test_stale_warning_goes_to_stderr_by_default(tmp_path, cache):
    url = shard(tmp_path / "s.tar", 3)
    Path(default_index_url(url)).write_bytes(build_index(shard(tmp_path / "o.tar", 5)).jsonl_bytes())
    with pytest.warns(DataWarning, match="stale index"):  # a warning of Python's, which shows it on stderr
        assert shard_counts([url], cache_dir=str(cache)).counts == {url: 3}


def header(**fields: Any) -> bytes:
    base = {"format": "tarproc-index", "version": 1, "shard": "s.tar", "size": 10240, "samples": 2}
    base.update(fields)
    return (json.dumps({k: v for k, v in base.items() if v is not None}) + "\n").encode()


@pytest.mark.parametrize("content, line, what", [
    (b"", 1, "empty file"),
    (b"\n" + header(), 1, "empty first line"),
    (b"{not json\n", 1, "not a JSON object"),
    (b'"a string"\n', 1, "neither a tarproc index"),
    (b"[1, 2]\n", 1, "neither a tarproc index"),
    (b"hello world\n", 1, "neither a tarproc index"),
    (header(format="other"), 1, "not a tarproc index"),
    (header(format=None), 1, "not a tarproc index"),
    (header(version=2), 1, "version 2 is not supported"),
    (header(samples=-1), 1, "samples is -1"),
    (header(samples="2"), 1, "samples is '2'"),
    (header(samples=2.0), 1, "samples is 2.0"),
    (header(samples=None), 1, "samples is None"),
    (header(size=None), 1, "size is None"),
    (b'\xff\xfe{"format": "tarproc-index"}\n', 1, "not UTF-8"),
    (b"x" * (2 << 20), 1, "over 1 MiB"),
    (b"v1.2 3\na 0 1 a.a\nb 512 1 b.b\n", 3, "announces 3 samples, but the file has 2"),
    (b"v1.2 1\na 0 1 a.a\n\nb 512 1 b.b\n", 4, "announces 1 samples, but the file has more"),
    (b"v1.2 x\n", 1, "bad DALI index header"),
    (b"v1.2 -1\n", 1, "bad DALI index header"),
    (b"v1.2\n", 1, "bad DALI index header"),
    (b"v9.9 0\n", 1, "DALI index version 'v9.9' is not supported"),
])
@pytest.mark.parametrize("name", ["tarproc", "dali"])
def test_malformed_sidecar(tmp_path, cache, no_build, content, line, what, name):
    url = shard(tmp_path / "s.tar", 2)  # 2 samples of ~100 bytes each: fits the DALI lines' offsets
    idx = default_index_url(url, name)
    Path(idx).write_bytes(content)
    with pytest.raises(IndexFileError, match=what) as e:
        shard_counts([url], cache_dir=str(cache))
    assert str(e.value).startswith(f"{idx}: line {line}: "), str(e.value)


def test_dali_index_read_in_pieces(tmp_path, cache, no_build):
    # many samples: the DALI index is longer than one read, lines are cut between reads
    url = shard(tmp_path / "many.tar", 3000, size=1)
    Path(default_index_url(url, "dali")).write_text(build_index(url).dali_text())
    assert os.path.getsize(default_index_url(url, "dali")) > 1 << 16
    assert shard_counts([url], cache_dir=str(cache)).counts == {url: 3000}


def test_dali_v11_is_counted(tmp_path, cache, no_build):
    url = shard(tmp_path / "s.tar", 2)
    Path(default_index_url(url, "dali")).write_text("v1.1 2\ncls 0 1 txt 512 10\ncls 2048 1 txt 2560 10\n")
    assert shard_counts([url], cache_dir=str(cache)).counts == {url: 2}


def test_directory_in_place_of_a_sidecar_is_skipped(tmp_path, cache, no_build):
    url = shard(tmp_path / "s.tar", 2)
    os.mkdir(default_index_url(url))  # a directory where the index should be: not a file, skipped
    Path(default_index_url(url, "dali")).write_text(build_index(url).dali_text())
    assert shard_counts([url], cache_dir=str(cache)).counts == {url: 2}


# ---------------------------------------------------------------------------------------------
# over HTTP, from a real server on 127.0.0.1


@pytest.fixture
def web(http_server):  # type: ignore[no-untyped-def]
    """tests/conftest.py's server: GETs recorded, ``/error/`` answering 500."""
    (http_server.root / "error").mkdir()
    return http_server


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def test_http_sidecars_then_the_rest_read_once_and_remembered(web, cache, monkeypatch):
    a = shard(web.root / "a.tar", 3)
    Path(default_index_url(a)).write_bytes(build_index(a).jsonl_bytes())
    b = shard(web.root / "b.tar", 4)
    Path(default_index_url(b, "dali")).write_text(build_index(b).dali_text())
    shard(web.root / "c.tar", 5)  # no sidecar: read once and counted, by default
    ua, ub, uc = (f"{web.url}/{n}.tar" for n in "abc")
    # why the first batch waits is said (by rank 0): here one shard must be read to be counted
    with pytest.warns(TarprocWarning, match="1 remote shards have no index file and no count remembered"):
        got = shard_counts([ua, ub, uc], cache_dir=str(cache))
    assert got == ShardCounts({ua: 3, ub: 4, uc: 5},
                              {ua: f"index {ua}.idx", ub: f"DALI index {web.url}/b.idx", uc: "counted"}, [])
    assert web.requests.count("/c.tar") == 1 and "/a.tar" not in web.requests and "/b.tar" not in web.requests
    assert len(cache_files(cache)) == 1
    monkeypatch.setattr(counts_mod, "read_samples", lambda *a, **kw: pytest.fail("read again"))
    again = shard_counts([ua, ub, uc], "count", cache_dir=str(cache))  # "count": the older name of the same
    assert again.counts == got.counts and again.sources[uc] == "counted (cache)"
    assert shard_counts([uc], None).missing == [uc]  # None: no counts, asked for


def test_http_rewritten_shard_is_counted_again(web, cache):
    shard(web.root / "c.tar", 5)
    uc = f"{web.url}/c.tar"
    assert shard_counts([uc], "count", cache_dir=str(cache)).counts == {uc: 5}
    before = (web.root / "c.tar").stat().st_size
    time.sleep(1.1)  # Last-Modified has one-second resolution
    write_tar(web.root / "c.tar", make_samples(5, "d"))  # the same size, other bytes, a later time
    assert (web.root / "c.tar").stat().st_size == before
    got = shard_counts([uc], "count", cache_dir=str(cache))
    assert got.counts == {uc: 5} and got.sources == {uc: "counted"}


def test_http_server_error_on_sidecar_is_no_sidecar(web, cache):
    shard(web.root / "error" / "e.tar", 2)
    url = f"{web.url}/error/e.tar"
    with pytest.raises(SourceError) as e:  # no sidecar, so the shard is read: and it can't be
        shard_counts([url], cache_dir=str(cache), network=Network(retries=0))
    assert str(e.value).startswith(url) and "/error/e.tar.idx" not in str(e.value)


def test_http_malformed_sidecar_is_an_error(web, cache):
    shard(web.root / "a.tar", 2)
    (web.root / "a.tar.idx").write_text('{"format": "tarproc-index", "version": 1, "size": 1, "samples": -4}\n')
    with pytest.raises(IndexFileError) as e:
        shard_counts([f"{web.url}/a.tar"], cache_dir=str(cache))
    assert str(e.value).startswith(f"{web.url}/a.tar.idx: line 1: ")


def test_http_damaged_shard_when_counting(web, cache):
    path = shard(web.root / "d.tar", 4, size=3000)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: len(data) // 2 + 100])
    url = f"{web.url}/d.tar"
    with pytest.raises(TarFormatError) as e:
        shard_counts([url], "count", cache_dir=str(cache))
    assert url in str(e.value)


def test_http_missing_shard_when_counting(web, cache):
    url = f"{web.url}/nope.tar"
    assert shard_counts([url], None).missing == [url]
    with pytest.raises(SourceError) as e:
        shard_counts([url], "count", cache_dir=str(cache))
    assert url in str(e.value)
