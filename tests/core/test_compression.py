"""Compressed inputs: detected by magic bytes (never by name), read to the end of multi-member
streams, and any damage -- truncation, bad CRC, corrupt data, garbage -- is a ``CompressionError``.
"""

from __future__ import annotations

import io
import random
import shutil
import subprocess

import pytest

from tarproc.compression import DecompressingReader, compression_for_name, detect
from tarproc.errors import CompressionError, TarFormatError
from tarproc.sources import open_source
from tarproc.tar import TarWriter, iter_members

TOOLS = {"gzip": "gzip", "zstd": "zstd", "bz2": "bzip2", "xz": "xz"}


def _compress(kind: str, data: bytes) -> bytes:
    tool = TOOLS[kind]
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed")
    args = [tool, "-c"] + (["-q"] if kind == "zstd" else [])
    return subprocess.run(args, input=data, capture_output=True, check=True).stdout


@pytest.fixture(scope="module")
def plain_tar() -> tuple[bytes, list[tuple[str, bytes]]]:
    rng = random.Random(1)
    members = [
        ("s/000.txt", b"hello"),
        ("s/000.bin", rng.randbytes(200_000)),  # incompressible: many input feeds
        ("s/001.txt", b"x" * 300_000),  # very compressible: output limited per call
        ("s/002.json", b'{"a": 1}'),
    ]
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        for name, data in members:
            w.add(name, data)
    return buf.getvalue(), members


def _read(path: str) -> tuple[str | None, list[tuple[str, bytes]]]:
    with open_source(path) as stream:
        items = [(n, d) for n, d, _ in iter_members(stream, path)]
        return stream.compression, items


@pytest.mark.parametrize("kind", list(TOOLS))
def test_detected_by_magic_not_by_name(tmp_path, plain_tar, kind):
    raw, members = plain_tar
    comp = _compress(kind, raw)
    for name in ("shard.tar", "shard.tar.gz" if kind != "gzip" else "shard.tar.zst", "noext"):
        path = tmp_path / name
        path.write_bytes(comp)
        assert _read(str(path)) == (kind, members), name


def test_plain_tar_named_like_a_compressed_file(tmp_path, plain_tar):
    raw, members = plain_tar
    for name in ("x.tar.gz", "x.tgz", "x.tar.zst", "x.tar.xz", "x.tar.bz2"):
        path = tmp_path / name
        path.write_bytes(raw)
        assert _read(str(path)) == (None, members)


@pytest.mark.parametrize("kind", list(TOOLS))
def test_multi_member_streams_are_read_to_the_end(tmp_path, plain_tar, kind):
    """``cat a.gz b.gz`` (and multi-frame zstd, multi-stream bz2/xz) is one stream."""
    raw, members = plain_tar
    cuts = [0, 1000, 150_000, 400_000, len(raw)]
    comp = b"".join(_compress(kind, raw[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True))
    path = tmp_path / "multi"
    path.write_bytes(comp)
    assert _read(str(path)) == (kind, members)


def test_gzip_trailing_zero_padding_is_allowed(tmp_path, plain_tar):
    raw, members = plain_tar
    path = tmp_path / "padded.gz"
    path.write_bytes(_compress("gzip", raw) + bytes(1000))
    assert _read(str(path)) == ("gzip", members)


@pytest.mark.parametrize("kind", list(TOOLS))
@pytest.mark.parametrize("drop", [1, 4, 8, 100, "half", "all-but-10"])
def test_truncated_compressed_stream(tmp_path, plain_tar, kind, drop):
    raw, _ = plain_tar
    comp = _compress(kind, raw)
    keep = {"half": len(comp) // 2, "all-but-10": 10}.get(drop, len(comp) - drop if isinstance(drop, int) else 0)
    path = tmp_path / f"cut.{kind}"
    path.write_bytes(comp[:keep])
    with pytest.raises(CompressionError) as info:
        _read(str(path))
    assert info.value.url == str(path)
    assert kind in str(info.value)


@pytest.mark.parametrize("kind", list(TOOLS))
def test_truncated_second_member_of_multi_member_stream(tmp_path, plain_tar, kind):
    raw, _ = plain_tar
    comp = _compress(kind, raw[:10240]) + _compress(kind, raw[10240:])
    path = tmp_path / "cut-multi"
    path.write_bytes(comp[:-3])
    with pytest.raises(CompressionError):
        _read(str(path))


def test_gzip_bad_crc_and_bad_length(tmp_path, plain_tar):
    raw, _ = plain_tar
    comp = bytearray(_compress("gzip", raw))
    for where in (-8, -5, -4, -1):  # CRC32 is the 8th to 5th last byte, ISIZE the last four
        bad = bytearray(comp)
        bad[where] ^= 0x10
        path = tmp_path / "bad.gz"
        path.write_bytes(bytes(bad))
        with pytest.raises(CompressionError) as info:
            _read(str(path))
        assert "gzip" in str(info.value), where


@pytest.mark.parametrize("kind", list(TOOLS))
def test_corrupt_compressed_data(tmp_path, plain_tar, kind):
    raw, _ = plain_tar
    comp = bytearray(_compress(kind, raw))
    comp[len(comp) // 3] ^= 0xFF
    path = tmp_path / "corrupt"
    path.write_bytes(bytes(comp))
    with pytest.raises(CompressionError):
        _read(str(path))


@pytest.mark.parametrize("kind", list(TOOLS))
def test_garbage_after_compressed_stream(tmp_path, plain_tar, kind):
    raw, _ = plain_tar
    path = tmp_path / "trailing"
    path.write_bytes(_compress(kind, raw) + b"this is not compressed data at all")
    with pytest.raises(CompressionError):
        _read(str(path))


@pytest.mark.parametrize("kind", ["gzip", "zstd"])
def test_damaged_tar_inside_intact_compression_is_a_tar_error(tmp_path, plain_tar, kind):
    raw, _ = plain_tar
    cut = 150_001
    path = tmp_path / "tar-cut"
    path.write_bytes(_compress(kind, raw[:cut]))
    with pytest.raises(TarFormatError) as info:
        _read(str(path))
    assert info.value.offset == cut  # offsets are in the uncompressed stream
    assert info.value.member == "s/000.bin"


def test_compressed_through_a_pipe(tmp_path, plain_tar):
    raw, members = plain_tar
    path = tmp_path / "p.tar.zst"
    path.write_bytes(_compress("zstd", raw))
    assert _read(f"pipe:cat {path}") == ("zstd", members)


@pytest.mark.parametrize("kind", list(TOOLS))
def test_decompressing_reader_never_returns_more_than_asked(plain_tar, kind):
    raw, _ = plain_tar
    comp = _compress(kind, raw)
    reader = DecompressingReader(io.BytesIO(comp[8:]), kind, prefix=comp[:8], url="u")
    out = []
    sizes = [1, 7, 512, 100_000, 3]
    i = 0
    while True:
        n = sizes[i % len(sizes)]
        i += 1
        piece = reader.read(n)
        assert len(piece) <= n
        if not piece:
            break
        out.append(piece)
    assert b"".join(out) == raw
    reader = DecompressingReader(io.BytesIO(comp), kind, url="u")
    assert reader.read() == raw  # read() with no size: everything


def test_detect_table():
    assert detect(b"\x1f\x8b\x08\x00") == "gzip"
    assert detect(b"\x28\xb5\x2f\xfd\x00") == "zstd"
    assert detect(b"BZh9") == "bz2"
    assert detect(b"BZhx") is None  # "BZh" must be followed by the block size digit
    assert detect(b"BZh") is None
    assert detect(b"\xfd7zXZ\x00\x00") == "xz"
    assert detect(b"ustar") is None
    assert detect(b"") is None


def test_compression_for_name_table():
    table = {
        "a.tar.gz": "gzip",
        "a.TGZ": "gzip",
        "a.tar.zst": "zstd",
        "a.tzst": "zstd",
        "a.tar.xz": "xz",
        "a.txz": "xz",
        "a.tar.bz2": "bz2",
        "a.tbz2": "bz2",
        "a.tar": None,
        "a": None,
    }
    assert {name: compression_for_name(name) for name in table} == table


def test_xz_stream_padding_is_allowed(tmp_path, plain_tar):
    raw, members = plain_tar
    path = tmp_path / "padded.xz"
    path.write_bytes(_compress("xz", raw) + bytes(8))
    subprocess.run(["xz", "-t", str(path)], check=True)
    assert _read(str(path)) == ("xz", members)


def test_zstd_stream_that_starts_with_a_skippable_frame(tmp_path, plain_tar):
    import struct

    import pyzstd

    raw, members = plain_tar
    skippable = struct.pack("<II", 0x184D2A5E, 6) + b"meta!!"
    path = tmp_path / "skip.tar.zst"
    path.write_bytes(skippable + pyzstd.compress(raw[: len(raw) // 2]) + skippable + pyzstd.compress(raw[len(raw) // 2:]))
    assert detect(path.read_bytes()[:8]) == "zstd"
    assert _read(str(path)) == ("zstd", members)


@pytest.mark.parametrize("magic,name,command", [(b"\x1f\x9d\x90", "compress(1) .Z", "gzip -dc"),
                                                (b"\x04\x22\x4d\x18\x64", "lz4", "lz4 -dc"), (b"LZIP\x01", "lzip", "lzip -dc")])
def test_other_compressed_formats_are_named(tmp_path, magic, name, command):
    path = tmp_path / "x.tar.z"
    path.write_bytes(magic + bytes(600))
    with pytest.raises(CompressionError) as e:
        open_source(str(path))
    assert str(e.value) == f"{path}: {name} compressed data, not read here: decompress it first, e.g. 'pipe:{command} FILE'"


def test_a_tar_whose_first_name_begins_like_a_magic_is_a_tar(tmp_path):
    """A tar starts with its first member's name: "LZIPtest.txt" is not lzip data (found in review)."""
    for name in ("LZIPtest.txt", "LZIP.txt"):
        buf = io.BytesIO()
        with TarWriter(buf) as w:
            w.add(name, b"x")
        path = tmp_path / "t.tar"
        path.write_bytes(buf.getvalue())
        assert _read(str(path)) == (None, [(name, b"x")])
