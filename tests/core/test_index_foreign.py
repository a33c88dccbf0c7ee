"""Other tools' index files beside shards (issue 35): recognised by content, never fatal to a reader.

megatron-energon's ``energon prepare`` writes ``SHARD.tar.idx`` (the name tarproc's index takes) as
little-endian uint64 offsets: each sample's first header, then the end of the last sample. These
tests write such files by hand; tests/interop/test_energon.py runs the real ``energon prepare``.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import warnings
from pathlib import Path

import pytest
from tarhelpers import write_tar

from tarproc.dataset.counts import shard_counts
from tarproc.errors import DataWarning, IndexFileError
from tarproc.index import (
    ForeignIndexError,
    IndexedShard,
    build_index,
    check_energon_index,
    check_index_file,
    index_kind,
    load_energon_index,
    load_index,
)


def energon_bytes(offsets: list[int]) -> bytes:
    return b"".join(n.to_bytes(8, "little") for n in offsets)


def energon_offsets_of(path: Path) -> list[int]:
    """What ``energon prepare`` writes for a shard: Python's tarfile ``offset`` (the first header of
    the member, long-name headers included) of each sample's first regular member, then the
    offset where tarfile stopped (the end-of-archive blocks)."""
    offsets, last = [], None
    with tarfile.open(path) as tar:
        for member in tar:
            if not member.isreg():
                continue
            key = member.name.split(".", 1)[0]
            if key != last:
                offsets.append(member.offset)
                last = key
        offsets.append(tar.offset)
    return offsets


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    long_key = "k/" + "x" * 120  # a GNU long name: its extra headers belong to the sample
    samples = [{"__key__": f"k/{i:03d}", "txt": f"text {i}" * (i + 1), "cls": str(i)} for i in range(5)]
    samples.insert(2, {"__key__": long_key, "txt": "long"})
    return write_tar(tmp_path / "s.tar", samples)


def with_energon_index(shard: Path, offsets: list[int] | None = None) -> Path:
    idx = Path(str(shard) + ".idx")
    idx.write_bytes(energon_bytes(energon_offsets_of(shard) if offsets is None else offsets))
    return idx


@pytest.mark.parametrize(
    "head, kind",
    [
        (energon_bytes([0, 2048, 4096]), "energon"),
        (energon_bytes([1536, 10 * 512]), "energon"),
        (b"v1.2 3\ncls 512 1 a.cls\n", "dali"),
        (b"v1.1 7\n", "dali"),
        (b'{"format": "tarproc-index", "version": 1, "shard": "s.tar"}\n{"key": "a"}\n', "tarproc"),
        (b'{\n  "__kind__": "wids-shard-index-v1",\n  "shardlist": []\n}\n', "wids"),
        (b"", None),
        (b"\x00" * 5, None),  # too short to hold one offset
        (energon_bytes([0, 1000]), None),  # 1000: not a header's offset
        (b"{not json\n", None),
        (b"hello world\n", None),
    ],
)
def test_index_kind(head, kind):
    assert index_kind(head) == kind


def test_energon_index_gives_counts_and_offsets(shard):
    idx = with_energon_index(shard)
    energon = load_energon_index(str(idx))
    index = build_index(str(shard))
    assert energon.samples == len(index) == 6 and energon.end <= index.size
    # each offset is the sample's start: the long name's extra headers are part of it
    assert list(energon.offsets[:-1]) == [e.offset for e in index.entries]
    check_energon_index(energon, index, str(shard))
    assert check_index_file(str(shard), str(idx)) == ("energon", 6)


def test_energon_offsets_after_directories(tmp_path):
    """energon skips directory entries: its offset is the first file's header, after the
    directories that tarproc's index counts into the sample."""
    path = tmp_path / "dirs.tar"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(3):
            d = tarfile.TarInfo(f"d{i}")
            d.type = tarfile.DIRTYPE
            tar.addfile(d)
            data = f"sample {i}".encode()
            info = tarfile.TarInfo(f"d{i}/s.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buf.getvalue())
    idx = with_energon_index(path)
    energon = load_energon_index(str(idx))
    index = build_index(str(path))
    assert energon.offsets[0] == 512 and index.entries[0].offset == 0
    check_energon_index(energon, index, str(path))


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", r"byte 0: empty file"),
        (energon_bytes([0, 2048]) + b"\x00\x08\x00\x00", r"byte 16: 20 bytes, not a whole number of 8-byte offsets"),
        (energon_bytes([0, 2048, 2049]), r"byte 16: offset 2049 is not the start of a tar header"),
        (energon_bytes([0, 4096, 2048]), r"byte 16: offset 2048 is not after the one before it \(4096\)"),
        (energon_bytes([0, 2048, 2048]), r"byte 16: offset 2048 is not after"),
        (energon_bytes([0, 1 << 63]), r"byte 8: offset 9223372036854775808 is past any file's end"),
    ],
)
def test_damaged_energon_index(tmp_path, data, message):
    idx = tmp_path / "bad.tar.idx"
    idx.write_bytes(data)
    with pytest.raises(IndexFileError, match=message) as e:
        load_energon_index(str(idx))
    assert str(e.value).startswith(f"{idx}: byte ")


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda o: o[:1] + [o[1] + 512] + o[2:], r"byte 8: sample 1 \('k/001'\) begins at byte 2048 of the shard, "
                                                  r"not at byte 2560"),
        (lambda o: o[:-2] + o[-1:], r"byte 40: it lists 5 samples, the shard has 6 \(sample 5, 'k/004', at byte"),
        (lambda o: o[:-1] + [o[-1] + 512, o[-1] + 1024], r"byte 48: it lists 7 samples, the shard has 6"),
        (lambda o: o[:-1] + [o[-1] + 512 * 100], r"byte 48: the last sample ends at byte \d+ of the shard "
                                                 r"\(\d+ bytes\), not at byte \d+"),
    ],
)
def test_energon_index_that_disagrees_with_the_shard(shard, edit, message):
    idx = with_energon_index(shard, edit(energon_offsets_of(shard)))
    with pytest.raises(IndexFileError, match=message) as e:
        check_index_file(str(shard), str(idx))
    assert str(e.value).startswith(f"{idx}: energon index doesn't match {shard}: ")
    assert "energon prepare --tar-index-only" in str(e.value)


def test_indexed_shard_beside_an_energon_index(shard):
    """The index tarproc would use is energon's: the shard is indexed in memory, no error."""
    idx = with_energon_index(shard)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with IndexedShard(shard) as ds:
            assert len(ds) == 6 and ds["k/003"]["txt"] == b"text 3" * 4
            assert ds.index_url is None
    # asked for by name, it is not a tarproc index: the error names the file and the tool
    with pytest.raises(ForeignIndexError, match=r"byte 0: not a tarproc index but an energon index") as e:
        IndexedShard(shard, index=idx)
    assert e.value.kind == "energon" and e.value.url == str(idx)


def test_load_index_names_a_dali_index(shard, tmp_path):
    dali = tmp_path / "s.idx"
    dali.write_text(build_index(str(shard)).dali_text())
    with pytest.raises(ForeignIndexError, match=r"line 1: not a tarproc index but a DALI index \(wds2idx\)") as e:
        load_index(str(dali))
    assert e.value.kind == "dali"
    assert check_index_file(str(shard), str(dali)) == ("dali", 6)


def test_dali_index_that_disagrees(shard, tmp_path):
    dali = tmp_path / "s.idx"
    text = build_index(str(shard)).dali_text()
    dali.write_text(text.replace(" 512 1 k/000.cls", " 1024 1 k/000.cls"))
    with pytest.raises(IndexFileError, match=r"line 2: sample 'k/000': .* has member 'k/000.cls' at byte 512"):
        check_index_file(str(shard), str(dali))


def test_wids_descriptor_is_checked_by_its_entry(shard, tmp_path):
    index = build_index(str(shard))
    wids = tmp_path / "train.json"
    entry = {"url": "s.tar", "nsamples": 6, "filesize": index.size}
    wids.write_text(json.dumps({"__kind__": "wids-shard-index-v1", "shardlist": [entry]}, indent=2))
    assert check_index_file(str(shard), str(wids)) == ("wids", 6)
    wids.write_text(json.dumps({"__kind__": "wids-shard-index-v1", "shardlist": [{**entry, "nsamples": 5}]}))
    with pytest.raises(IndexFileError, match=r"says 5 samples .* has 6 samples"):
        check_index_file(str(shard), str(wids))


def test_dataset_counts_from_an_energon_index(shard, tmp_path):
    """The Dataset's counts read energon's index (no read of the shard); one that lists samples
    past the shard's end is stale: a warning, and the shard is counted."""
    with_energon_index(shard)
    found = shard_counts([str(shard)], cache_dir=str(tmp_path / "cache"))
    assert found.counts == {str(shard): 6}
    assert found.sources[str(shard)] == f"energon index {shard}.idx"

    offsets = energon_offsets_of(shard)
    idx = with_energon_index(shard, offsets[:-1] + [os.path.getsize(shard) + 512])
    os.utime(idx, ns=(os.stat(shard).st_mtime_ns + 10**9,) * 2)
    with pytest.warns(DataWarning, match=rf"{idx}: stale index \(lists samples up to byte.*energon prepare"):
        found = shard_counts([str(shard)], cache_dir=str(tmp_path / "cache"))
    assert found.counts == {str(shard): 6} and found.sources[str(shard)].startswith("counted")


def test_dataset_reads_parts_of_a_shard_beside_an_energon_index(shard, tmp_path):
    """Parts that start in the middle of a shard seek there (the shard indexed in memory, energon's
    file left alone): every sample exactly once, in two parts per shard."""
    from tarproc import Dataset

    idx = with_energon_index(shard)
    before = idx.read_bytes()
    ds = Dataset([str(shard)], part_size=3, batch_size=1, to_tuple=("txt",), cache_dir=str(tmp_path / "cache"))
    got = sorted(t.encode() for (texts,) in ds for t in texts)
    with tarfile.open(shard) as tar:
        want = sorted(tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".txt"))
    assert got == want and len(got) == 6
    from tarproc import Network
    from tarproc.dataset.core import _sample_offsets

    assert len(_sample_offsets(str(shard), "", Network()).offsets) == 6  # the parts seek, not read from the start
    assert idx.read_bytes() == before


def test_dataset_counts_with_a_truncated_energon_index(shard, tmp_path):
    """A damaged energon index is an error naming the file and the byte, as a damaged DALI one is."""
    idx = Path(str(shard) + ".idx")
    idx.write_bytes(energon_bytes(energon_offsets_of(shard))[:-3])
    with pytest.raises(IndexFileError, match=rf"{idx}: byte 48: 53 bytes, not a whole number"):
        shard_counts([str(shard)], cache_dir=str(tmp_path / "cache"))
