"""Shard indexes and IndexedShard: offsets, formats, loading, random access, stale and bad input."""

from __future__ import annotations

import gzip
import io
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import pytest

import tarproc.index as index_mod
from tarproc import TarWriter, read_samples
from tarproc.errors import DataWarning, DuplicateError, OptionError, SourceError, TarFormatError
from tarproc.index import (
    CompressedShardError,
    IndexedShard,
    IndexFileError,
    build_index,
    default_index_url,
    index_stream,
    load_index,
    parse_index,
)

LONG_KEY = "deep/" + "d" * 120 + "/sample-long"  # a GNU long-name record (no ustar split fits)
PREFIX_KEY = "p" * 90 + "/" + "q" * 60  # fits ustar with the 155-byte prefix field


def make_samples(n: int = 6, big: int = 3000) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        key = LONG_KEY if i == 2 else PREFIX_KEY if i == 3 else f"s/{i:04d}"
        out.append({"__key__": key, "jpg": bytes([i]) * (big + 37 * i), "cls": str(i), "json": {"i": i}})
    return out


def write(path: Path, samples: list[dict[str, Any]]) -> Path:
    with open(path, "wb") as f, TarWriter(f) as w:
        for s in samples:
            w.write_sample(s)
    return path


def as_dicts(samples: Any) -> list[tuple[str, dict[str, bytes]]]:
    return [(s["__key__"], {k: bytes(v) for k, v in s.items() if not k.startswith("__")}) for s in samples]


@pytest.fixture
def shard(tmp_path: Path) -> Path:
    return write(tmp_path / "s.tar", make_samples())


def pax_shard(kit: Any) -> bytes:
    """Pax headers (a long path and a non-ASCII one), an upper-case extension, a directory entry
    and a metadata member, written by hand and by Python's tarfile."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name, data in [
            ("__meta__/info.json", b"{}"),
            ("x/" + "é" * 80 + ".cls", b"7"),
            ("x/" + "é" * 80 + ".JPG", b"pax jpeg"),
            ("y/" + "z" * 150 + ".cls", b"8"),
            ("y/" + "z" * 150 + ".txt", b"pax long"),
        ]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
        d = tarfile.TarInfo("y/dir")
        d.type = tarfile.DIRTYPE
        tf.addfile(d)
        info = tarfile.TarInfo("w.cls")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"9"))
    return buf.getvalue()


# -------------------------------------------------------------------------------------------
# building


def check_offsets(data: bytes, index: Any) -> None:
    """Every field's [data_offset, size] holds the bytes read_samples reads, and each sample's
    [offset, offset + size) is a piece of tar holding exactly that sample."""
    expected = as_dicts(read_samples_bytes(data))
    assert [e.key for e in index.entries] == [k for k, _ in expected]
    for entry, (key, fields) in zip(index.entries, expected, strict=True):
        assert set(entry.fields) == set(fields)
        for field, (offset, size) in entry.fields.items():
            assert data[offset : offset + size] == fields[field]
        piece = data[entry.offset : entry.offset + entry.size] + bytes(1024)
        assert as_dicts(read_samples_bytes(piece)) == [(key, fields)]


def read_samples_bytes(data: bytes) -> list[dict[str, Any]]:
    from tarproc.samples import group_samples
    from tarproc.tar import iter_members

    return list(group_samples(iter_members(io.BytesIO(data), "mem"), "mem"))


def test_offsets_long_and_prefix_names(shard, reader):
    data = shard.read_bytes()
    index = build_index(str(shard))
    assert index.size == len(data) and index.shard == "s.tar" and len(index) == 6
    check_offsets(data, index)
    assert index.entries[0].offset == 0
    assert index.entries[2].key == LONG_KEY
    # the long-name record belongs to its sample: it starts right after the previous sample
    assert index.entries[2].offset == index.entries[1].offset + index.entries[1].size


def test_offsets_pax_uppercase_directory_metadata(kit, reader):
    data = pax_shard(kit)
    index = index_stream(io.BytesIO(data), "pax.tar")
    check_offsets(data, index)
    keys = [e.key for e in index.entries]
    assert keys == ["x/" + "é" * 80, "y/" + "z" * 150, "w"]
    assert index.entries[0].names == {"jpg": "x/" + "é" * 80 + ".JPG"}
    # the directory entry before w.cls lies inside w's range
    assert index.entries[2].offset == index.entries[1].offset + index.entries[1].size


def test_jsonl_round_trip(shard, kit):
    for index in (build_index(str(shard)), index_stream(io.BytesIO(pax_shard(kit)), "pax.tar")):
        text = index.jsonl_text()
        again = parse_index(text, "x.idx")
        assert again.entries == index.entries and again.size == index.size and again.shard == index.shard
        assert text.splitlines()[0].startswith('{"format": "tarproc-index", "version": 1')


def test_dup_policies(tmp_path):
    path = tmp_path / "dup.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        w.add("a.txt", b"1")
        w.add("b.txt", b"2")
        w.add("a.cls", b"3")
    with pytest.raises(DuplicateError, match="reappears"):
        build_index(str(path))
    assert [e.key for e in build_index(str(path), dup="skip").entries] == ["a", "b"]


def test_compressed_shard_is_refused(shard, tmp_path):
    gz = tmp_path / "s.tar.gz"
    gz.write_bytes(gzip.compress(shard.read_bytes()))
    with pytest.raises(CompressedShardError) as e:
        build_index(str(gz))
    assert str(e.value) == (
        f"{gz}: compressed (gzip) shard: random access needs a plain tar; decompress it first "
        f"(tarcat {gz} -o {tmp_path / 's.tar'})"
    )
    with pytest.raises(CompressedShardError):
        IndexedShard(gz)


def test_truncated_shard(shard, tmp_path):
    cut = tmp_path / "cut.tar"
    cut.write_bytes(shard.read_bytes()[:5000])
    with pytest.raises(TarFormatError) as e:
        build_index(str(cut))
    assert e.value.url == str(cut) and e.value.offset > 0 and "truncated" in str(e.value)


def test_stdin_and_pipes_are_refused():
    for url in ("-", "pipe:cat x.tar"):
        with pytest.raises(OptionError, match="random access"):
            build_index(url)


def test_default_index_names():
    assert default_index_url("a/b.c/train-01.tar") == "a/b.c/train-01.tar.idx"
    assert default_index_url("a/b.c/train-01.tar", "dali") == "a/b.c/train-01.idx"
    assert default_index_url("s3://b/x.tar.gz", "dali") == "s3://b/x.idx"


# -------------------------------------------------------------------------------------------
# IndexedShard


def test_indexed_shard_access(shard):
    expected = as_dicts(read_samples(str(shard)))
    with IndexedShard(shard) as ds:
        assert len(ds) == 6 and ds.keys() == [k for k, _ in expected]
        assert as_dicts(ds) == expected
        assert as_dicts([ds[-1]]) == [expected[-1]] and as_dicts([ds[2]]) == [expected[2]]
        assert ds[LONG_KEY]["jpg"] == expected[2][1]["jpg"]
        assert ds[0]["__url__"] == str(shard) and ds[0]["__key__"] == "s/0000"
        assert LONG_KEY in ds and "nope" not in ds
        with pytest.raises(IndexError):
            ds[6]
        with pytest.raises(IndexError):
            ds[-7]
        with pytest.raises(KeyError, match="nope"):
            ds["nope"]
        only = ds.get("s/0005", fields=["cls", "nothere"])
        assert only == {"__key__": "s/0005", "__url__": str(shard), "cls": b"5"}
    with pytest.raises(ValueError, match="closed"):
        ds[0]


def test_reads_only_the_bytes_asked_for(shard):
    with IndexedShard(shard) as ds:
        ds.reads = ds.bytes_read = 0
        s = ds[4]
        assert ds.reads == 1  # the sample's members are adjacent: one read
        entry = ds.index.entries[4]
        assert ds.bytes_read == entry.size and len(s["jpg"]) == 3000 + 37 * 4
        ds.reads = ds.bytes_read = 0
        ds.sample(4, fields=["cls"])  # cls is the first member: its header and its one block
        assert (ds.reads, ds.bytes_read) == (1, 1024)
        ds.reads = ds.bytes_read = 0
        ds.sample(4, fields=["cls", "json"])  # cls, jpg, json in tar order: two reads, jpg skipped
        assert ds.reads == 2 and ds.bytes_read < 3000
    with IndexedShard(shard, fields=["json"]) as ds:
        assert [set(s) for s in ds] == [{"__key__", "__url__", "json"}] * 6


def test_pax_names_through_indexed_shard(kit, tmp_path, reader):
    path = tmp_path / "pax.tar"
    path.write_bytes(pax_shard(kit))
    with IndexedShard(path) as ds:
        assert as_dicts(ds) == as_dicts(read_samples(str(path)))
        assert ds.get("x/" + "é" * 80, fields=["jpg"])["jpg"] == b"pax jpeg"


def test_uses_the_sibling_index(shard, monkeypatch):
    sibling = Path(default_index_url(str(shard)))
    sibling.write_text(build_index(str(shard)).jsonl_text())

    def no_scan(*a: Any, **k: Any) -> None:
        raise AssertionError("scanned although a valid index exists")

    monkeypatch.setattr(index_mod, "build_index", no_scan)
    with IndexedShard(shard) as ds:
        assert ds["s/0001"]["cls"] == b"1" and ds.index_url == str(sibling)


def test_stale_sibling_index_is_an_error(shard, capsys):
    """The README's promise: a stale index is an error naming both files and the command that
    rebuilds it (it used to be rebuilt in memory on every open, without a word)."""
    sibling = Path(default_index_url(str(shard)))
    sibling.write_text(build_index(str(shard)).jsonl_text())
    old_size = shard.stat().st_size
    write(shard, make_samples(3, big=10))
    with pytest.raises(IndexFileError) as e:
        IndexedShard(shard)
    assert str(e.value) == (
        f"{sibling}: stale index: made for a shard of {old_size} bytes ('s.tar'), but {shard} has "
        f"{shard.stat().st_size} bytes; rebuild it with: tarindex {shard}"
    )
    assert capsys.readouterr().err == ""


def test_stale_index_rebuilt_on_request_warns_once(shard, tmp_path, capsys):
    sibling = Path(default_index_url(str(shard)))
    sibling.write_text(build_index(str(shard)).jsonl_text())
    elsewhere = tmp_path / "other.idx"
    elsewhere.write_text(sibling.read_text())
    write(shard, make_samples(3, big=10))
    warnings: list[str] = []
    with IndexedShard(shard, stale="rebuild", warn=warnings.append) as ds:
        assert len(ds) == 3 and ds.index_url is None
        assert as_dicts(ds) == as_dicts(read_samples(str(shard)))
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{sibling}: stale index (made for a shard of ")
    assert warnings[0].endswith(f"indexing {shard} in memory instead (rebuild the index with: tarindex {shard})")
    # an index named explicitly: the same policy, and the command writes that file
    with pytest.warns(DataWarning) as said, IndexedShard(shard, index=elsewhere, stale="rebuild") as ds:
        assert len(ds) == 3
    err = "".join(f"warning: {w.message}\n" for w in said)  # a warning of Python's, which shows it on stderr
    assert err.count("warning: ") == 1 and f"tarindex {shard} -o {elsewhere})" in err
    assert sibling.read_text() == elsewhere.read_text()  # nothing is written behind the caller's back
    with pytest.raises(OptionError, match="stale-index policy 'ignore'"):
        IndexedShard(shard, stale="ignore")


def test_no_index_file_is_scanned_silently(shard, capsys):
    with IndexedShard(shard) as ds:
        assert len(ds) == 6 and ds.index_url is None
    assert capsys.readouterr().err == ""


def test_explicit_stale_index_is_an_error(shard, tmp_path):
    idx = tmp_path / "s.idx"
    index = build_index(str(shard))
    idx.write_text(index.jsonl_text())
    write(shard, make_samples(3, big=10))
    with pytest.raises(IndexFileError, match=r"s\.idx: stale index: made for a shard of \d+ bytes") as e:
        IndexedShard(shard, index=idx)
    assert str(e.value).endswith(f"rebuild it with: tarindex {shard} -o {idx}")
    with pytest.raises(IndexFileError, match=f"^{re.escape(str(shard))}: stale index: "):
        IndexedShard(shard, index=index)


def test_rewritten_shard_of_the_same_size_is_detected(tmp_path):
    """Same size, other content: the checked headers give a clear error, never wrong bytes."""
    path = tmp_path / "s.tar"
    write(path, [{"__key__": f"a{i}", "txt": b"x" * 600} for i in range(4)])
    index = build_index(str(path))
    size = path.stat().st_size
    # other keys, same sizes
    write(path, [{"__key__": f"b{i}", "txt": b"x" * 600} for i in range(4)])
    assert path.stat().st_size == size
    with IndexedShard(path, index=index) as ds, pytest.raises(IndexFileError) as e:
        ds[1]
    header = index.entries[1].fields["txt"][0] - 512
    assert e.value.url == str(path)
    assert str(e.value) == (
        f"{path}: the index doesn't match the shard at byte {header}: expected member 'a1.txt' of 600 bytes "
        f"(field 'txt' of sample 'a1'), found member 'b1.txt' of 600 bytes; the shard changed after it was "
        f"indexed: index it again (tarindex {path})"
    )
    # the same through an index file: the error names it and the command that rebuilds it
    idx = Path(default_index_url(str(path)))
    idx.write_text(index.jsonl_text())
    with IndexedShard(path) as ds, pytest.raises(IndexFileError) as e:
        ds["a1"]
    assert str(e.value).startswith(f"{idx}: index doesn't match {path} at byte {header}: expected member 'a1.txt'")
    assert str(e.value).endswith(f"or the index is damaged: rebuild it with: tarindex {path}")
    idx.unlink()
    # members shifted: the index points into the middle of data
    write(path, [{"__key__": f"a{i}", "txt": b"y" * 100} for i in range(6)])
    assert path.stat().st_size == size
    with IndexedShard(path, index=index) as ds, pytest.raises(IndexFileError, match="index it again"):
        ds[3]


def test_shard_shorter_than_its_index(shard, tmp_path):
    index = build_index(str(shard))
    data = shard.read_bytes()
    shard.write_bytes(data[: index.entries[3].offset + 700] + bytes(len(data) - index.entries[3].offset - 700))
    with IndexedShard(shard, index=index) as ds:
        assert ds[2]["cls"] == b"2"
        with pytest.raises(IndexFileError, match="found no member there; the shard changed"):
            ds[3]
        assert str(shard) in str(pytest.raises(IndexFileError, ds.__getitem__, 4).value)


def edit(lineno: int, old: str, new: str) -> Any:
    """A mangle that replaces ``old`` with ``new`` on line ``lineno`` (1 = the header)."""

    def mangle(lines: list[str]) -> list[str]:
        assert old in lines[lineno - 1]
        return lines[: lineno - 1] + [lines[lineno - 1].replace(old, new)] + lines[lineno:]

    return mangle


@pytest.mark.parametrize(
    "mangle, message",
    [
        (lambda lines: lines[:2] + ["{not json"] + lines[3:], r"line 3: not JSON"),
        (lambda lines: [lines[0].replace('"version": 1', '"version": 9')] + lines[1:], r"line 1: index version 9"),
        (lambda lines: lines[:-1], r"line 6: the header announces 6 samples but the file has 5"),
        (lambda lines: ["v1.2 6"] + lines[1:], r"line 1: not a tarproc index"),
        (lambda lines: lines[:3] + [lines[3].replace('"offset":', '"offset":-')] + lines[4:], r"line 4: .*bad offset"),
        (lambda lines: lines[:2] + [lines[1]] + lines[3:], r"line 3: .*overlaps"),
        (lambda lines: lines[:4] + [lines[4].replace('"fields":{', '"fields":{"x":[3,1],')] + lines[5:],
         r"line 5: .*field 'x'"),
        (lambda lines: [], r"line 1: empty file"),
        # issue 14: whatever the bytes, IndexFileError naming the file and the line
        (edit(2, '"offset":0', '"offset":' + "1" * 5000), r"line 2: not JSON \(a number with too many digits\)"),
        (edit(1, '"size": ', '"size": ' + "4" * 4400),
         r"line 1: not a tarproc index \(the first line is not JSON: a number with too many digits\)"),
        (lambda lines: [lines[0], _sum_over_4300_digits()] + lines[2:], r"line 2: sample 's/0000': bad offset or size"),
        (edit(2, '"fields":', '"x":' + "[" * 100_000 + "]" * 100_000 + ',"fields":'),
         r"line 2: not JSON \(nested too deeply\)"),
        (lambda lines: ['{"format":' + '{"a":' * 50_000] + lines[1:], r"line 1: .*nested too deeply"),
        (edit(2, '"offset":0', '"offset":NaN'), r"line 2: not JSON \(NaN"),
        (edit(2, '"size":5632', '"size":-Infinity'), r"line 2: not JSON \(-Infinity"),
        (edit(2, '"size":5632', '"size":1e400'), r"line 2: .*bad offset"),
        (edit(2, '"offset":0', '"offset":true'), r"line 2: .*bad offset"),
        (edit(2, '"key":"s/0000"', '"key":7'), r"line 2: bad or missing key"),
        (edit(2, '"cls":[512,1]', '"cls":{"a":1}'), r"line 2: .*field 'cls' must be \[data_offset, size\]"),
        (edit(1, '"version": 1', '"version": [[[1]]]'), r"line 1: index version a JSON array is not supported"),
        (edit(2, "]}}", ']},"names":["s/0000.cls"]}'), r"line 2: .*names must map"),
        (edit(2, "]}}", ']},"names":{"cls":"s/0009.cls"}}'),
         r"line 2: sample 's/0000': member 's/0009.cls' is not field 'cls' of this key"),
        (edit(2, '"offset":0', '"offset":1'), r"line 2: .*bad offset"),
        (edit(2, '"size":5632', '"size":6144'),
         r"line 2: sample 's/0000': its size \(6144\) doesn't end where its last member ends \(5632 bytes\)"),
        (edit(1, '"size": 40960', '"size": 30720'),
         r"line 7: sample 's/0005' ends at byte 35840, past the shard's 30720 bytes"),
    ],
)
def test_corrupt_index_file(shard, tmp_path, mangle, message):
    lines = build_index(str(shard)).jsonl_text().splitlines()
    idx = tmp_path / "bad.idx"
    mangled = mangle(lines)
    idx.write_text("\n".join(mangled) + "\n" if mangled else "")
    with pytest.raises(IndexFileError, match=message) as e:
        IndexedShard(shard, index=idx)
    assert str(e.value).startswith(f"{idx}: line ")
    with pytest.raises(IndexFileError):
        load_index(str(idx))


def _sum_over_4300_digits() -> str:
    """A sample line whose numbers each fit the 4300-digit limit but whose end (offset + size)
    doesn't, so that printing it in a message used to raise ValueError."""
    offset = 10**4299
    return f'{{"key":"s/0000","offset":{offset},"size":{"9" * 4300},"fields":{{"cls":[{offset + 512},1]}}}}'


def test_index_file_that_is_not_utf8(shard, tmp_path):
    idx = tmp_path / "bad.idx"
    idx.write_bytes(build_index(str(shard)).jsonl_text().encode().replace(b"s/0001", b"s/\xff001"))
    with pytest.raises(IndexFileError, match=r"bad\.idx: line 3: not UTF-8 text"):
        IndexedShard(shard, index=idx)


def test_line_separators_inside_a_key(tmp_path):
    """Lines end at \n only: U+2028 or \x1c in a key (written unescaped by hand or by another
    JSON writer) used to split the line, and a valid index read as 'not JSON'."""
    path = tmp_path / "sep.tar"
    keys = ["a\u2028b", "c\x1cd", "e\x85f"]
    with open(path, "wb") as f, TarWriter(f) as w:
        for key in keys:
            w.write_sample({"__key__": key, "txt": key})
    index = build_index(str(path))
    lines = index.jsonl_text().splitlines()
    unescaped = [lines[0]] + [json.dumps(json.loads(line), ensure_ascii=False) for line in lines[1:]]
    assert "\u2028" in unescaped[1]
    (tmp_path / "sep.tar.idx").write_text("\n".join(unescaped) + "\n")
    with IndexedShard(path) as ds:
        assert ds.index.entries == index.entries
        assert [ds[key]["txt"] for key in keys] == [key.encode() for key in keys]


def _upper_case_shard(path: Path) -> Path:
    """Samples whose every member name differs from KEY.FIELD: the index lists them all in names."""
    with open(path, "wb") as f, TarWriter(f) as w:
        for key in ("a", "b"):
            w.add(f"{key}.JPG", f"jpeg of {key}".encode())
            w.add(f"{key}.TXT", f"text of {key}".encode())
    return path


def test_changed_key_never_returns_another_keys_bytes(tmp_path):
    """Issue 14: with a names map, one changed character of a key used to serve a's bytes as 'c'."""
    path = _upper_case_shard(tmp_path / "u.tar")
    text = build_index(str(path)).jsonl_text()
    assert '"key":"a"' in text and '"names":{"jpg":"a.JPG","txt":"a.TXT"}' in text
    idx = tmp_path / "u.tar.idx"
    idx.write_text(text.replace('"key":"a"', '"key":"c"'))
    with pytest.raises(IndexFileError) as e:
        IndexedShard(path)
    assert str(e.value) == f"{idx}: line 2: sample 'c': member 'a.JPG' is not field 'jpg' of this key"
    # a ShardIndex made in memory isn't parsed: IndexedShard checks its names the same way
    index = build_index(str(path))
    index.entries[0] = index.entries[0]._replace(key="c")
    with pytest.raises(IndexFileError) as e:
        IndexedShard(path, index=index)
    assert str(e.value) == (
        f"{path}: the index given is wrong: sample 0 ('c'): member 'a.JPG' is not field 'jpg' of this key"
    )


def test_key_with_a_dot_moved_into_the_field_is_refused(tmp_path):
    """'x.b.cls' is field 'b.cls' of key 'x' (the key ends at the first dot): an index that calls it
    field 'cls' of key 'x.b' names the same member, and used to serve it under the wrong key."""
    path = tmp_path / "d.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        w.add("x.b.cls", b"1")
        w.add("y.cls", b"2")
    text = build_index(str(path)).jsonl_text()
    assert '{"key":"x","offset":0,"size":1024,"fields":{"b.cls":[512,1]}}' in text
    (tmp_path / "d.tar.idx").write_text(text.replace('"key":"x"', '"key":"x.b"').replace('"b.cls"', '"cls"'))
    with pytest.raises(IndexFileError, match=r"line 2: sample 'x\.b': member 'x\.b\.cls' is not field 'cls'"):
        IndexedShard(path)
    index = build_index(str(path))
    index.entries[0] = index.entries[0]._replace(key="x.b", fields={"cls": (512, 1)})
    with pytest.raises(IndexFileError, match=r"sample 0 \('x\.b'\): member 'x\.b\.cls' is not field 'cls'"):
        IndexedShard(path, index=index)


def test_field_left_out_of_the_index_is_noticed(shard, tmp_path):
    """A line that lost a field would serve the sample without it; reading across it is an error."""
    lines = build_index(str(shard)).jsonl_text().splitlines()
    lines[1] = lines[1].replace('"jpg":[1536,3000],', "")
    idx = tmp_path / "s.idx"
    idx.write_text("\n".join(lines) + "\n")
    with IndexedShard(shard, index=idx) as ds:
        assert ds.get("s/0000", fields=["cls"])["cls"] == b"0"  # reads no byte of the lost field
        with pytest.raises(IndexFileError, match=r"at byte 1024: member 's/0000\.jpg' of sample 's/0000' is not in"):
            ds["s/0000"]


def test_missing_shard():
    with pytest.raises(SourceError, match="no such file"):
        IndexedShard("/nonexistent/x.tar")


# -------------------------------------------------------------------------------------------
# URLs: fsspec range reads


def test_memory_fs_reads_ranges(shard, monkeypatch):
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe("/idx/s.tar", shard.read_bytes())
    fs.pipe("/idx/s.tar.idx", build_index(str(shard)).jsonl_text().encode())
    calls: list[tuple[Any, Any]] = []
    original = type(fs).cat_file

    def counting(self: Any, path: str, start: Any = None, end: Any = None, **kw: Any) -> bytes:
        calls.append((start, end))
        return original(self, path, start=start, end=end, **kw)  # type: ignore[no-any-return]

    monkeypatch.setattr(type(fs), "cat_file", counting)
    with IndexedShard("memory://idx/s.tar") as ds:
        calls.clear()
        assert as_dicts([ds[5]]) == as_dicts(read_samples(str(shard)))[5:]
        entry = ds.index.entries[5]
        assert calls == [(entry.offset, entry.offset + entry.size)]
    fs.rm("/idx", recursive=True)


def test_http_range_reads(shard, range_server):
    server, root, base = range_server
    big = write(root / "s.tar", make_samples(8, big=200_000))
    (root / "s.tar.idx").write_text(build_index(str(big)).jsonl_text())
    expected = as_dicts(read_samples(str(big)))
    with IndexedShard(f"{base}/s.tar") as ds:
        server.log.clear()
        ds.bytes_read = 0
        assert as_dicts([ds[6], ds["s/0001"]]) == [expected[6], expected[1]]
        assert ds.get("s/0007", fields=["cls"])["cls"] == b"7"
        shard_gets = [rng for path, rng in server.log if path == "/s.tar"]
        assert len(shard_gets) == 3 and all(rng and rng.startswith("bytes=") for rng in shard_gets)
        entries = ds.index.entries
        assert ds.bytes_read == entries[6].size + entries[1].size + 1024  # not the file


def test_http_server_ignoring_ranges_is_an_error(shard, range_server):
    server, root, base = range_server
    write(root / "s.tar", make_samples(3))
    with IndexedShard(f"{base}/s.tar") as ds:  # no index there: built by one streaming read
        server.ignore_ranges = True
        with pytest.raises(TarFormatError, match="ignores range requests"):
            ds[1]


def test_http_index_and_shard_not_found(range_server):
    _, _, base = range_server
    with pytest.raises(SourceError):
        IndexedShard(f"{base}/missing.tar")



def _index_outcome(make):  # type: ignore[no-untyped-def]
    try:
        idx = make()
    except Exception as e:  # noqa: BLE001 - the error itself is compared
        return ("error", type(e).__name__, str(e))
    return ("ok", idx.shard, idx.size, [tuple(e) for e in idx.entries])


def test_indexing_a_local_file_skips_data_and_gives_the_same_index(tmp_path, kit, reader):
    """build_index on a local plain file seeks past the data it doesn't buffer; the index (or the
    error, for a damaged shard) is exactly that of reading every byte."""
    import random

    rng = random.Random(5)
    members = []
    for i in range(40):
        size = rng.choice([0, 5, 511, 512, 513, 20_000, 70_000, 300_000, 1_100_000])
        name = f"d{i % 3}/{'n' * (120 if i % 7 == 0 else 3)}{i:03d}.{rng.choice(['jpg', 'cls', 'TXT'])}"
        members.append((name, rng.randbytes(size)))
    raw = kit.writer_tar(members)
    src = tmp_path / "src"
    src.mkdir()
    for i in range(6):
        (src / f"p{i}.bin").write_bytes(rng.randbytes(rng.choice([10, 40_000, 200_000])))
    gnu = tmp_path / "gnu.tar"
    kit.gnu_tar("--format=pax", "--sort=name", "-cf", str(gnu), "-C", str(src), ".")
    cases = {"writer": raw, "gnu-pax": gnu.read_bytes()}
    for cut in (700_000, 1_500_000, len(raw) - 5000, len(raw) - 1024):
        cases[f"cut@{cut}"] = raw[:cut]
    for name, data in cases.items():
        path = tmp_path / f"{name}.tar"
        path.write_bytes(data)
        skipped = _index_outcome(lambda path=path: build_index(str(path)))
        read = _index_outcome(lambda path=path, data=data: index_mod.index_stream(io.BytesIO(data), str(path)))
        assert skipped == read, name
        if name in ("writer", "gnu-pax", "cut@700000", "cut@1500000"):  # cuts inside data are truncation errors
            assert skipped[0] == ("error" if name.startswith("cut@") else "ok"), (name, skipped)
