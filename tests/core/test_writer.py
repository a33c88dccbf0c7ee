"""TarWriter: deterministic, standard archives that GNU tar and tarfile read back exactly.

Every test runs twice: with the C writer (``tarproc._speedups.pack``) and with the pure-Python
reference writer (``tar.writer._pack`` set to None); test_writer_parity.py compares the two byte for byte.
"""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from tarhelpers import c_or_python

import tarproc.tar.writer as tar_writer
from tarproc.errors import SampleError
from tarproc.tar import TarWriter, encode_value, iter_members, tar_end_size

_C_PACK = tar_writer._pack  # None when the extension is not built (or TARPROC_PURE_PYTHON is set)


@pytest.fixture(autouse=True, params=["c-writer", "python-writer"])
def writer_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with the C writer, then with the Python one (module global read at each call)."""
    return c_or_python(request, monkeypatch, tar_writer, "_pack", _C_PACK)


NAME_100 = "n" * 96 + ".txt"
NAME_PREFIX = "dir-" + "d" * 80 + "/" + "f" * 60 + ".bin"  # 146 bytes, fits with the ustar prefix
NAME_LONG_COMPONENT = "c" * 140 + ".txt"  # no slash to split at: GNU long name
NAME_255 = "p" * 154 + "/" + "q" * 96 + ".txt"  # 255 bytes: the longest ustar name
NAME_256 = "p" * 155 + "/" + "q" * 96 + ".txt"  # prefix of 155 + name of 100
NAME_300 = "r" * 150 + "/" + "s" * 145 + ".txt"  # over 255: GNU long name
NAME_UNICODE = "ünïcödé/日本語/" + "ü" * 60 + ".txt"  # over 100 bytes in UTF-8
NAMES = ["a.txt", NAME_100, NAME_PREFIX, NAME_LONG_COMPONENT, NAME_255, NAME_256, NAME_300, NAME_UNICODE, "é.bin"]


def _members() -> list[tuple[str, bytes]]:
    sizes = [0, 1, 511, 512, 513, 10000, 3, 70000, 5]
    return [
        (name, bytes((i + j) % 251 for j in range(size)))
        for i, (name, size) in enumerate(zip(NAMES, sizes, strict=True))
    ]


def _write(members, **kw) -> bytes:
    buf = io.BytesIO()
    with TarWriter(buf, **kw) as w:
        for name, data in members:
            w.add(name, data)
    return buf.getvalue()


def test_writer_output_is_deterministic(no_source_date_epoch):
    members = _members()
    a = _write(members)
    b = _write(members)
    assert a == b
    info = tarfile.open(fileobj=io.BytesIO(a)).getmembers()
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in info} == {(0, 0, 0, "", "", 0o644)}


def test_source_date_epoch_is_respected(monkeypatch):
    members = _members()[:3]
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    a = _write(members)
    assert a == _write(members)
    assert {m.mtime for m in tarfile.open(fileobj=io.BytesIO(a))} == {1700000000}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1600000000")
    b = _write(members)
    assert a != b
    assert {m.mtime for m in tarfile.open(fileobj=io.BytesIO(b))} == {1600000000}
    # an explicit mtime wins over the environment
    c = _write(members, mtime=42)
    assert {m.mtime for m in tarfile.open(fileobj=io.BytesIO(c))} == {42}


def test_readable_by_tarfile_with_identical_names_and_bytes(no_source_date_epoch):
    members = _members()
    raw = _write(members)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        got = [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()]
        assert all(m.isreg() for m in tf.getmembers())
    assert got == members


def test_read_back_by_our_reader(no_source_date_epoch, reader):
    members = _members()
    raw = _write(members)
    assert [(n, d) for n, d, _ in iter_members(io.BytesIO(raw))] == members


def test_readable_by_gnu_tar_list_and_extract(tmp_path, kit, no_source_date_epoch):
    members = _members()
    path = tmp_path / "w.tar"
    path.write_bytes(_write(members))
    listing = kit.gnu_tar("-tf", str(path)).stdout.decode("utf-8").splitlines()
    assert listing == [name for name, _ in members]
    verbose = kit.gnu_tar("-tvf", str(path)).stdout.decode("utf-8").splitlines()
    assert len(verbose) == len(members)
    assert all(line.startswith("-rw-r--r-- 0/0") for line in verbose), verbose[:2]
    out = tmp_path / "x"
    out.mkdir()
    kit.gnu_tar("-xf", str(path), "-C", str(out))
    for name, data in members:
        assert (out / name).read_bytes() == data, name
    extracted = sorted(os.path.relpath(os.path.join(d, f), out) for d, _, fs in os.walk(out) for f in fs)
    assert extracted == sorted(name for name, _ in members)


def test_gnu_tar_sees_no_problem_in_compare_mode(tmp_path, kit):
    """``tar --compare`` re-reads every header and data block against the extracted files."""
    members = _members()
    path = tmp_path / "w.tar"
    path.write_bytes(_write(members))
    kit.gnu_tar("-xf", str(path), "-C", str(tmp_path))
    proc = kit.gnu_tar("--compare", "-f", str(path), "-C", str(tmp_path), check=False)
    # mtimes differ (extraction sets them from the header, which is 0 -> same); contents must not
    assert b"Contents differ" not in proc.stdout + proc.stderr
    assert b"Size differs" not in proc.stdout + proc.stderr


def test_header_choice_ustar_prefix_and_gnu_long_names(no_source_date_epoch):
    raw = _write([(NAME_PREFIX, b"x")])
    assert raw[257:263] == b"ustar\x00" and raw[156:157] == b"0"
    assert raw[345:500].rstrip(b"\x00") == NAME_PREFIX.rsplit("/", 1)[0].encode()
    raw = _write([(NAME_300, b"x")])
    assert raw[156:157] == b"L" and raw[0:13] == b"././@LongLink"
    assert raw[512 : 512 + 300] == NAME_300.encode()
    raw = _write([(NAME_256, b"x")])  # prefix 155 + name 100: still plain ustar
    assert raw[156:157] == b"0"


@pytest.mark.parametrize("count", [0, 1, 2, 17, 18, 19, 40])
def test_total_size_is_a_multiple_of_10240(count):
    for size in (0, 1, 600, 9000):
        raw = _write([(f"{i:03d}.bin", b"z" * size) for i in range(count)])
        assert len(raw) % 10240 == 0 and len(raw) >= 10240
        assert raw[-1024:] == bytes(1024)


def test_member_size_equals_bytes_written():
    buf = io.BytesIO()
    w = TarWriter(buf)
    names = NAMES + ["x" * 100, "x" * 101, "a/" + "x" * 99, "a/" + "x" * 100, "y" * 255, "é" * 51]
    for name in names:
        for size in (0, 1, 511, 512, 513, 1024, 70000):
            before = w.offset
            w.add(name, bytes(size))
            assert w.offset - before == TarWriter.member_size(name, size), (name, size)
    w.close()
    assert len(buf.getvalue()) == w.offset
    assert tar_end_size(0) == 10240
    assert tar_end_size(10240 - 1024) == 1024
    assert tar_end_size(10240 - 1023) == 1024 + 10239


def test_write_sample_sorted_fields_and_no_dunder_members(no_source_date_epoch, reader):
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        w.write_sample(
            {
                "__key__": "dir/k1",
                "__url__": "somewhere.tar",
                "__local_path__": "/tmp/x",
                "txt": "ünï",
                "cls": 3,
                "json": {"b": 1, "a": [1, 2]},
                "jpg": b"\xff\xd8",
                "seg.png": bytearray(b"png"),
                "npy": memoryview(b"mv"),
                "f": 0.5,
            }
        )
    got = [(n, d) for n, d, _ in iter_members(io.BytesIO(buf.getvalue()))]
    assert got == [
        ("dir/k1.cls", b"3"),
        ("dir/k1.f", b"0.5"),
        ("dir/k1.jpg", b"\xff\xd8"),
        ("dir/k1.json", b'{"a":[1,2],"b":1}'),
        ("dir/k1.npy", b"mv"),
        ("dir/k1.seg.png", b"png"),
        ("dir/k1.txt", "ünï".encode()),
    ]
    assert b"__url__" not in buf.getvalue() and b"__key__" not in buf.getvalue()
    assert b"/tmp/x" not in buf.getvalue()


def test_encode_value_rejects_bools_and_unknown_types():
    with pytest.raises(TypeError):
        encode_value(True, "k", "cls")
    with pytest.raises(TypeError):
        encode_value(object(), "k", "x")
    assert encode_value(7) == b"7"


def test_writer_rejects_bad_input_and_use_after_close():
    w = TarWriter(io.BytesIO())
    with pytest.raises(ValueError):
        w.add("", b"x")
    w.close()
    with pytest.raises(ValueError):
        w.add("a.txt", b"x")
    w.close()  # closing twice is harmless


def test_writer_does_not_close_the_stream_and_exception_skips_end_blocks():
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        w.add("a.txt", b"a")
    assert not buf.closed
    buf = io.BytesIO()
    with pytest.raises(RuntimeError), TarWriter(buf) as w:
        w.add("a.txt", b"a")
        raise RuntimeError("stop")
    assert len(buf.getvalue()) < 10240  # no end blocks: a reader sees a truncated archive


def test_multibyte_memoryview_values_are_written_by_bytes(reader):
    import array

    values = memoryview(array.array("i", range(12)))
    assert len(values) == 12 and values.nbytes == 48
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        w.write_sample({"__key__": "k", "npy": values, "txt": "after"})
    raw = buf.getvalue()
    assert len(raw) % 10240 == 0
    assert [(n, d) for n, d, _ in iter_members(io.BytesIO(raw))] == [("k.npy", values.tobytes()), ("k.txt", b"after")]


def test_names_that_would_not_read_back_are_refused_at_write_time(reader):
    """A NUL ends a tar name (readers would cut the name there: samples vanish or merge), and
    fields that differ only in case are one field to readers (a duplicate): refused, named."""
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        with pytest.raises(SampleError, match="tar names end at a NUL byte"):
            w.write_sample({"__key__": "a\x00b", "txt": b"x"})
        with pytest.raises(SampleError, match=r"field 'j\\x00pg' cannot contain '/' or a NUL byte"):
            w.write_sample({"__key__": "a", "j\x00pg": b"x"})
        with pytest.raises(SampleError, match="fields 'TXT' and 'txt' differ only in case"):
            w.write_sample({"__key__": "a", "txt": b"x", "TXT": b"y"})
        with pytest.raises(SampleError, match="member name 'x\\\\x00.txt' cannot be written"):
            w.add("x\x00.txt", b"x")
        w.write_sample({"__key__": "ok", "txt": b"fine"})
    assert [(n, d) for n, d, _ in iter_members(io.BytesIO(buf.getvalue()))] == [("ok.txt", b"fine")]


def test_a_sink_gets_the_same_bytes_as_a_plain_stream(tmp_path):
    """A sink takes a big member's data and the headers before it in one writev (write_pieces)."""
    from tarproc.sinks import open_sink

    members = _members() + [(f"big/{i}.bin", bytes([i]) * (65_536 + i * 5000)) for i in range(6)] + _members()
    path = tmp_path / "s.tar"
    with open_sink(str(path)) as sink, TarWriter(sink) as w:
        for name, data in members:
            w.add(name, memoryview(data) if len(data) % 2 else data)
    assert path.read_bytes() == _write(members)


@pytest.mark.parametrize("sample", [{"__key__": "k\ud800", "txt": b"x"}, {"__key__": "a", "f\ud800": b"x"}])
def test_a_lone_surrogate_in_a_name_is_a_sample_error(sample):
    """Surrogate escapes (undecodable bytes read back) are written as they were; a lone surrogate can't be."""
    with pytest.raises(SampleError, match=r"lone surrogate '\\ud800'"):
        TarWriter(io.BytesIO()).write_sample(sample)
