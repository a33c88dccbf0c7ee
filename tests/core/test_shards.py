"""ShardWriter: limits, no split samples, no empty shards, maxshards, post commands, ShardInfo."""

from __future__ import annotations

import hashlib
import io
import os
import random

import pytest

from tarproc.errors import OptionError, SinkError, TarprocError
from tarproc.samples import read_samples
from tarproc.shards import ShardInfo, ShardWriter, parse_size, shard_pattern
from tarproc.tar import iter_members


def _samples(n: int, seed: int = 0, max_size: int = 5000) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "__key__": f"s{i:05d}",
            "__url__": "in.tar",
            "bin": rng.randbytes(rng.randint(0, max_size)),
            "txt": f"sample {i}",
            "cls": i % 7,
        }
        for i in range(n)
    ]


def _read_all_shards(paths) -> list[dict]:
    return [s for path in paths for s in read_samples(str(path))]


def _shards(directory) -> list:
    return sorted(p for p in directory.iterdir() if not p.name.startswith("."))


def _same_samples(written, read):
    assert [s["__key__"] for s in read] == [s["__key__"] for s in written]
    for w, r in zip(written, read, strict=True):
        assert r["bin"] == w["bin"]
        assert r["txt"] == w["txt"].encode()
        assert r["cls"] == str(w["cls"]).encode()
        assert sorted(r) == ["__key__", "__url__", "bin", "cls", "txt"]


def test_maxcount(tmp_path):
    samples = _samples(23)
    with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=5) as w:
        for s in samples:
            w.write(s)
    paths = _shards(tmp_path)
    assert [p.name for p in paths] == [f"s-{i:03d}.tar" for i in range(5)]
    counts = [len(list(read_samples(str(p)))) for p in paths]
    assert counts == [5, 5, 5, 5, 3]
    assert [info.closed_by for info in w.shards] == ["maxcount"] * 4 + ["end"]
    _same_samples(samples, _read_all_shards(paths))


@pytest.mark.parametrize("maxsize", [20_000, 30_720, 51_200, 100_000])
def test_maxsize_counts_every_byte_and_never_splits(tmp_path, maxsize):
    samples = _samples(60, seed=maxsize, max_size=9000)
    with ShardWriter(str(tmp_path / "s-%04d.tar"), maxsize=maxsize) as w:
        for s in samples:
            w.write(s)
    paths = _shards(tmp_path)
    assert len(paths) > 2
    for path, info in zip(paths, w.shards, strict=True):
        size = path.stat().st_size
        n = len(list(read_samples(str(path))))
        assert n >= 1
        assert size <= maxsize or n == 1, (path.name, size, n)
        assert size % 10240 == 0
        assert info.bytes == info.tar_bytes == size
        assert info.samples == n
    # closing later would not have fit: the next sample would have pushed the shard over
    _same_samples(samples, _read_all_shards(paths))


def test_maxsize_is_filled_when_samples_fit(tmp_path):
    """With 1000-byte samples in 10240-byte records, a 30720 limit holds more than one record's worth."""
    samples = [{"__key__": f"k{i:03d}", "bin": b"x" * 1000} for i in range(40)]
    with ShardWriter(str(tmp_path / "s-%02d.tar"), maxsize=30720) as w:
        for s in samples:
            w.write(s)
    # each sample is 512 + 1024 bytes; 30720 - 1024 end blocks = 29696 -> 19 samples per shard
    assert [info.samples for info in w.shards] == [19, 19, 2]
    assert all(p.stat().st_size <= 30720 for p in _shards(tmp_path))


def test_sample_bigger_than_maxsize_gets_its_own_shard(tmp_path):
    samples = [
        {"__key__": "a", "bin": b"a" * 100},
        {"__key__": "big", "bin": b"b" * 50_000},
        {"__key__": "c", "bin": b"c" * 100},
    ]
    with ShardWriter(str(tmp_path / "s-%d.tar"), maxsize=20_480) as w:
        for s in samples:
            w.write(s)
    keys = [[s["__key__"] for s in read_samples(str(p))] for p in _shards(tmp_path)]
    assert keys == [["a"], ["big"], ["c"]]
    assert [info.closed_by for info in w.shards] == ["maxsize", "maxsize", "end"]


def test_no_samples_no_file(tmp_path):
    with ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=3) as w:
        pass
    assert w.shards == [] and os.listdir(tmp_path) == []
    w = ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=3)
    for s in _samples(6):
        w.write(s)
    w.close()
    assert len(os.listdir(tmp_path)) == 2  # exactly full: no trailing empty shard
    assert w.close() == w.shards  # closing again writes nothing
    assert len(os.listdir(tmp_path)) == 2


def test_maxshards_exceeded(tmp_path):
    samples = _samples(10)
    with pytest.raises(TarprocError) as info:
        with ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=3, maxshards=2) as w:
            for s in samples:
                w.write(s)
    assert "s00006" in str(info.value) and "2 shard" in str(info.value)
    paths = _shards(tmp_path)
    assert [p.name for p in paths] == ["s-0.tar", "s-1.tar"]
    assert sorted(os.listdir(tmp_path)) == ["s-0.tar", "s-1.tar"]  # no temporaries left
    _same_samples(samples[:6], _read_all_shards(paths))


def test_exception_aborts_current_shard_only(tmp_path):
    samples = _samples(7)
    with pytest.raises(RuntimeError):
        with ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=3) as w:
            for s in samples:
                w.write(s)
            raise RuntimeError
    assert sorted(os.listdir(tmp_path)) == ["s-0.tar", "s-1.tar"]


def test_unwritable_value_aborts_and_leaves_finished_shards(tmp_path):
    with pytest.raises(TypeError):
        with ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=2) as w:
            w.write({"__key__": "a", "txt": "1"})
            w.write({"__key__": "b", "txt": "2"})
            w.write({"__key__": "c", "txt": "3"})
            w.write({"__key__": "d", "bad": object()})
    assert sorted(os.listdir(tmp_path)) == ["s-0.tar"]


def test_post_command_runs_per_shard(tmp_path):
    log = tmp_path / "post.log"
    out = tmp_path / "out"
    out.mkdir()
    with ShardWriter(str(out / "s-%d.tar"), maxcount=2, post=f"echo {{}} >> {log}") as w:
        for s in _samples(5):
            w.write(s)
    assert log.read_text().splitlines() == [str(out / f"s-{i}.tar") for i in range(3)]
    log2 = tmp_path / "post2.log"
    with ShardWriter(str(out / "t-%d.tar"), maxcount=5, post=f"ls -l >> {log2}; echo") as w:
        for s in _samples(5):
            w.write(s)
    assert log2.exists()  # without {} the URL is appended as the last argument


def test_post_command_with_special_characters_in_name(tmp_path):
    log = tmp_path / "post.log"
    out = tmp_path / "dir with space"
    out.mkdir()
    with ShardWriter(str(out / "it's-%d.tar"), maxcount=10, post=f"cat {{}} | wc -c >> {log}") as w:
        w.write({"__key__": "a", "txt": "x"})
    assert log.read_text().split() == [str((out / "it's-0.tar").stat().st_size)]


def test_failing_post_raises_sink_error(tmp_path):
    with pytest.raises(SinkError) as info:
        with ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=2, post="test $(basename {}) != s-1.tar") as w:
            for s in _samples(6):
                w.write(s)
    assert "status 1" in str(info.value)
    assert info.value.url == str(tmp_path / "s-1.tar")
    assert sorted(os.listdir(tmp_path)) == ["s-0.tar", "s-1.tar"]  # the shard itself was written


def test_on_shard_info(tmp_path):
    infos: list[ShardInfo] = []
    samples = _samples(9)
    with ShardWriter(str(tmp_path / "s-%d.tar.gz"), maxcount=4, on_shard=infos.append, digest=True) as w:
        for s in samples:
            w.write(s)
    assert infos == w.shards
    assert [(i.samples, i.first_key, i.last_key, i.closed_by) for i in infos] == [
        (4, "s00000", "s00003", "maxcount"),
        (4, "s00004", "s00007", "maxcount"),
        (1, "s00008", "s00008", "end"),
    ]
    for info in infos:
        raw = open(info.shard, "rb").read()
        assert raw[:2] == b"\x1f\x8b"
        assert info.bytes == len(raw)
        assert info.sha256 == hashlib.sha256(raw).hexdigest()
        assert info.tar_bytes % 10240 == 0 and info.tar_bytes > info.bytes
    assert '"sha256": "' in infos[0].to_json()
    _same_samples(samples, _read_all_shards(i.shard for i in infos))


def test_without_digest_sha256_is_none(tmp_path):
    with ShardWriter(str(tmp_path / "s-%d.tar"), maxcount=4) as w:
        w.write({"__key__": "a", "txt": "x"})
    assert w.shards[0].sha256 is None


def test_start_index_and_pattern_from_prefix(tmp_path):
    assert shard_pattern("out/train") == "out/train-%06d.tar"
    assert shard_pattern("x-%03d.tar.gz") == "x-%03d.tar.gz"
    with pytest.raises(OptionError):
        shard_pattern("bad-%s-%d")
    with ShardWriter(str(tmp_path / "train"), maxcount=2, start=7) as w:
        for s in _samples(3):
            w.write(s)
    assert sorted(os.listdir(tmp_path)) == ["train-000007.tar", "train-000008.tar"]


def test_written_shards_fields_sorted_and_no_dunder(tmp_path):
    with ShardWriter(str(tmp_path / "s-%d.tar")) as w:
        w.write({"__key__": "k", "__url__": "u", "txt": "t", "cls": 1, "jpg": b"j"})
    names = [n for n, _, _ in iter_members(io.BytesIO((tmp_path / "s-0.tar").read_bytes()))]
    assert names == ["k.cls", "k.jpg", "k.txt"]


def test_bad_limits():
    for kw in ({"maxsize": 0}, {"maxcount": 0}, {"maxshards": 0}, {"maxcount": -1}):
        with pytest.raises(OptionError):
            ShardWriter("x-%d.tar", **kw)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("1e9", 10**9),
        ("1G", 10**9),
        ("1g", 10**9),
        ("500MB", 500 * 10**6),
        ("64MiB", 64 * 2**20),
        ("2GiB", 2 * 2**30),
        ("1.5K", 1500),
        ("10kib", 10240),
        ("1048576", 1048576),
        (" 7 ", 7),
        ("3T", 3 * 10**12),
        ("100B", 100),
        (12345, 12345),
        (2.5e3, 2500),
    ],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "abc", "1X", "MB", "-5", "1 G B", "1GiBB", "1e", "0x10", "1,5G", "1..2G", ".", "1.2.3MB", "1e999", "1e19", "inf"],
)
def test_parse_size_bad(text):
    with pytest.raises(OptionError):
        parse_size(text)


# -------------------------------------------------------------------------------------------------
# shard names from an output name (issue 14)


@pytest.mark.parametrize(
    "output, pattern",
    [
        ("train-%06d.tar", "train-%06d.tar"),
        ("out/train", "out/train-%06d.tar"),
        ("out/val.tar.gz", "out/val-%06d.tar.gz"),
        ("y.tar", "y-%06d.tar"),
        ("y.TGZ", "y-%06d.TGZ"),
        ("a.b.tar.zst", "a.b-%06d.tar.zst"),
        ("v.tar.xz", "v-%06d.tar.xz"),
        ("v.tar.bz2", "v-%06d.tar.bz2"),
        ("v.tzst", "v-%06d.tzst"),
        ("out/", "out/shard-%06d.tar"),
        ("s3://bucket/train/", "s3://bucket/train/shard-%06d.tar"),
        ("s3://bucket/train.tar.gz", "s3://bucket/train-%06d.tar.gz"),
        ("train.v2", "train.v2-%06d.tar"),
    ],
)
def test_shard_pattern_rule(output, pattern):
    assert shard_pattern(output) == pattern


def test_shard_pattern_of_an_existing_directory_puts_shards_inside(tmp_path):
    d = tmp_path / "existing"
    d.mkdir()
    assert shard_pattern(str(d)) == f"{d}/shard-%06d.tar"
    assert shard_pattern(str(d) + "/") == f"{d}/shard-%06d.tar"
    assert shard_pattern(f"file://{d}") == f"file://{d}/shard-%06d.tar"
    assert shard_pattern(str(tmp_path / "not-there")) == f"{tmp_path}/not-there-%06d.tar"


@pytest.mark.parametrize("output", ["", ".tar", "out/.tar.gz", "-x", "out/-%d.tar", "dir/-", "%d.tar/-"])
def test_shard_pattern_refuses_names_starting_with_a_dash(output):
    with pytest.raises(OptionError, match="start|'-'|named like"):
        shard_pattern(output)


def test_shard_pattern_refuses_a_compression_suffix_without_tar():
    with pytest.raises(OptionError, match=r"val\.tar\.gz"):
        shard_pattern("out/val.gz")
    with pytest.raises(OptionError, match=r"\.tar\.zst"):
        shard_pattern("val.zst")


def test_writer_compresses_by_the_suffix_of_a_tar_name(tmp_path):
    with ShardWriter(str(tmp_path / "val.tar.gz"), maxcount=2) as w:
        for s in _samples(3):
            w.write(s)
    assert sorted(os.listdir(tmp_path)) == ["val-000000.tar.gz", "val-000001.tar.gz"]
    for name in os.listdir(tmp_path):
        assert (tmp_path / name).read_bytes()[:2] == b"\x1f\x8b"
