"""Damage is always noticed: truncation anywhere before the end-of-archive block, bad checksums,
non-tar input, garbage after the end, oversized members -- each a ``TarFormatError`` with the URL
and a sensible byte offset. Every test runs with the C fast path and the pure-Python path.
"""

from __future__ import annotations

import io
import itertools
import os
import random
import resource
import tracemalloc

import pytest

from tarproc.errors import TarFormatError
from tarproc.sources import open_source
from tarproc.tar import ReadStats, iter_members

URL = "damaged.tar"


def _sweep_archive(kit):
    long_name = ("long/" + "n" * 120 + "/" + "m" * 120 + ".txt").encode()
    parts = [
        kit.member("a.txt", b"hello"),  # data + padding
        kit.member("empty.txt", b""),  # header only
        kit.pax({"path": "pax/" + "p" * 200 + ".bin", "mtime": "1.5"}),
        kit.header("pax-short", 700) + kit.pad(b"P" * 700),
        kit.member("././@LongLink", long_name + b"\x00", typeflag=b"L", magic=b"ustar  \x00"),
        kit.member(long_name[:100], b"L" * 512, magic=b"ustar  \x00"),  # exactly one block, no padding
        kit.header("dir/", typeflag=b"5"),
        kit.member("name.txt", b"q" * 1025, prefix=b"pre/fix"),
        kit.member("z.bin", bytes(range(256)) * 4),
    ]
    body = b"".join(parts)
    raw = body + kit.end(len(body))
    members = [
        ("a.txt", b"hello"),
        ("empty.txt", b""),
        ("pax/" + "p" * 200 + ".bin", b"P" * 700),
        (long_name.decode(), b"L" * 512),
        ("pre/fix/name.txt", b"q" * 1025),
        ("z.bin", bytes(range(256)) * 4),
    ]
    return raw, len(body) + 512, members


def _expect_error(kit, data, url=URL, **kw) -> TarFormatError:
    with pytest.raises(TarFormatError) as info:
        kit.read_all(data, url, **kw)
    err = info.value
    assert err.url == url
    assert str(err).startswith(f"{url}: ")
    assert f"at byte {err.offset}" in str(err)
    return err


def test_truncation_sweep_every_byte_until_end_of_first_zero_block(kit, reader):
    raw, first_zero_end, members = _sweep_archive(kit)
    assert [(n, d) for n, d, _ in kit.read_all(raw, URL)] == members
    reasons = set()
    for cut in range(first_zero_end):
        try:
            kit.read_all(raw[:cut], URL)
        except TarFormatError as e:
            assert e.url == URL, cut
            assert 0 <= e.offset <= cut, (cut, e)
            reasons.add(e.reason.split(" (")[0])
        else:
            pytest.fail(f"archive cut at byte {cut} of {len(raw)} read without error")
    # every kind of truncation was met on the way
    assert {
        "empty stream, not a tar archive",
        "not a tar archive",
        "truncated tar header",
        "truncated member data",
        "truncated member padding",
        "stream ends before the end-of-archive blocks",
        "stream ends after an extension header",
    } <= reasons, reasons


def test_truncation_sweep_with_short_reads(kit, reader):
    """The same with a stream that returns small irregular pieces (buffer boundaries everywhere)."""
    raw, first_zero_end, _ = _sweep_archive(kit)
    for cut in range(0, first_zero_end, 7):
        with pytest.raises(TarFormatError) as info:
            kit.read_all(raw[:cut], URL, chunked=cut)
        assert 0 <= info.value.offset <= cut


def test_cutting_inside_trailing_zero_padding_is_fine(kit, reader):
    raw, first_zero_end, members = _sweep_archive(kit)
    cuts = list(range(first_zero_end, len(raw) + 1, 512)) + [first_zero_end + 1, first_zero_end + 511, len(raw) - 1]
    for cut in cuts:
        got = kit.read_all(raw[:cut], URL)
        assert [(n, d) for n, d, _ in got] == members, cut


def test_gnu_tar_archive_truncated_at_every_block_boundary_and_inside_blocks(tmp_path, kit, reader):
    src = tmp_path / "src"
    src.mkdir()
    names = []
    for i, size in enumerate([3, 512, 0, 1500]):
        name = f"{'d' * 110}{i}.bin" if i == 1 else f"f{i}.bin"
        (src / name).write_bytes(bytes([i + 1]) * size)
        names.append(name)
    out = tmp_path / "g.tar"
    kit.gnu_tar("-cf", str(out), "--format=gnu", "-C", str(src), *names)
    raw = out.read_bytes()
    assert len(kit.read_all(raw)) == 4
    # L header + name, then 4 headers and 1 + 1 + 0 + 3 data blocks: the end block follows
    body_end = 512 * (2 + 4 + 5)
    assert raw[body_end : body_end + 512] == bytes(512) and raw[body_end - 512 : body_end] != bytes(512)
    for cut in list(range(0, body_end + 512, 512)) + list(range(5, body_end + 512, 97)):
        with pytest.raises(TarFormatError):
            kit.read_all(raw[:cut])


def test_error_offsets_and_reasons_of_each_truncation(kit, reader):
    one = kit.member("a.txt", b"hello")  # header 0..512, data 512..517, padding ..1024
    raw = kit.archive(one)
    e = _expect_error(kit, b"")
    assert (e.offset, e.reason) == (0, "empty stream, not a tar archive")
    e = _expect_error(kit, raw[:100])
    assert e.offset == 0 and "not a tar archive" in e.reason and "100 bytes" in e.reason
    e = _expect_error(kit, raw[:515])
    assert e.offset == 515 and e.reason.startswith("truncated member data (expected 5 bytes, got 3)")
    assert e.member == "a.txt"
    e = _expect_error(kit, raw[:600])
    assert e.offset == 600 and e.reason == "truncated member padding" and e.member == "a.txt"
    e = _expect_error(kit, raw[:1024])
    assert e.offset == 1024 and e.reason == "stream ends before the end-of-archive blocks" and e.member == "a.txt"
    e = _expect_error(kit, raw[:1300])
    assert e.offset == 1024 and e.reason == "truncated tar header" and e.member == "a.txt"
    ext = kit.pax({"path": "x.txt"})
    e = _expect_error(kit, ext)
    assert e.offset == len(ext) and e.reason == "stream ends after an extension header"


# -- checksums and non-tar input -----------------------------------------------------------------


def test_bad_checksum_in_a_later_header(kit, reader):
    first = kit.member("a.txt", b"A" * 600)
    raw = bytearray(kit.archive(first, kit.member("b.txt", b"B"), kit.member("c.txt", b"C")))
    raw[len(first) + 1] ^= 0x01  # flip a bit in the name of b.txt
    e = _expect_error(kit, bytes(raw))
    assert e.offset == len(first)
    assert "checksum" in e.reason
    assert e.member == "a.txt"  # the last member read before the damage


@pytest.mark.parametrize("where", [0, 100, 124, 148, 150, 156, 257, 345, 511])
def test_any_flipped_header_byte_is_noticed(kit, reader, where):
    first = kit.member("a.txt", b"A")
    raw = bytearray(kit.archive(first, kit.member("b.txt", b"B" * 10, prefix=b"pfx")))
    raw[len(first) + where] ^= 0x04
    e = _expect_error(kit, bytes(raw))
    assert e.offset == len(first)


def test_bad_checksum_in_first_header_is_not_a_tar_archive(kit, reader):
    raw = kit.archive(kit.member("a.txt", b"A", chksum="bad"))
    e = _expect_error(kit, raw)
    assert e.offset == 0 and "not a tar archive" in e.reason


def test_random_bytes_are_not_a_tar_archive(kit, reader):
    data = random.Random(5).randbytes(20000)
    e = _expect_error(kit, data)
    assert e.offset == 0 and "not a tar archive" in e.reason


def test_text_file_is_not_a_tar_archive(tmp_path, kit, reader):
    text = tmp_path / "notes.txt"
    text.write_text("just some text\n" * 300)
    with open_source(str(text)) as stream, pytest.raises(TarFormatError) as info:
        list(iter_members(stream, str(text)))
    assert info.value.offset == 0 and "not a tar archive" in info.value.reason
    assert info.value.url == str(text)
    short = tmp_path / "short.txt"
    short.write_text("hello\n")
    with open_source(str(short)) as stream, pytest.raises(TarFormatError) as info:
        list(iter_members(stream, str(short)))
    assert info.value.offset == 0 and "6 bytes" in info.value.reason


def test_empty_file_is_an_error(tmp_path, kit, reader):
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    with open_source(str(empty)) as stream, pytest.raises(TarFormatError) as info:
        list(iter_members(stream, str(empty)))
    assert info.value.offset == 0 and "empty" in info.value.reason


def test_only_zero_blocks_is_an_empty_archive(kit, reader):
    assert kit.read_all(bytes(10240)) == []


# -- garbage after the end -----------------------------------------------------------------------


@pytest.mark.parametrize("where", ["second-zero-block", "record-padding", "appended", "after-a-megabyte"])
def test_garbage_after_end_of_archive_names_the_offset(kit, reader, where):
    raw = bytearray(kit.archive(kit.member("a.txt", b"x" * 700)))
    assert len(raw) == 10240
    if where == "second-zero-block":
        pos = 1536 + 512 + 17
        raw[pos] = 7
    elif where == "record-padding":
        pos = 9000
        raw[pos : pos + 3] = b"abc"
    elif where == "appended":
        pos = len(raw)
        raw += b"\x00\x00" + kit.member("b.txt", b"second archive")
        pos += 2
    else:
        pos = len(raw) + 3 * (1 << 20) + 5
        raw += bytes(pos - len(raw)) + b"\x01"
    e = _expect_error(kit, bytes(raw))
    assert e.offset == pos
    assert e.reason == "garbage after the end-of-archive blocks"
    assert e.member == "a.txt"


# -- sizes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["octal12", "base256"])
def test_huge_claimed_size_fails_without_allocating_it(kit, reader, field):
    size = 8 << 30
    size_field = b"%012o" % size if field == "octal12" else b"\x80" + size.to_bytes(11, "big")
    assert len(size_field) == 12
    data = kit.header("huge.bin", size_field=size_field) + os.urandom(1 << 20)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    tracemalloc.start()
    try:
        with pytest.raises(TarFormatError) as info:
            list(iter_members(io.BytesIO(data), URL, max_member_size=16 << 30))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rss_delta = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    e = info.value
    assert e.reason == f"truncated member data (expected {size} bytes, got {1 << 20})"
    assert e.offset == len(data) and e.member == "huge.bin"
    assert peak < 64 << 20, peak
    assert rss_delta < 64 << 10, rss_delta


def test_huge_claimed_size_through_a_real_file(tmp_path, kit, reader):
    path = tmp_path / "huge.tar"
    path.write_bytes(kit.header("huge.bin", size_field=b"%012o" % (8 << 30)) + bytes(3 << 20))
    tracemalloc.start()
    try:
        with open_source(str(path)) as stream, pytest.raises(TarFormatError) as info:
            list(iter_members(stream, str(path), max_member_size=16 << 30))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "truncated member data" in info.value.reason and info.value.offset == 512 + (3 << 20)
    assert peak < 64 << 20, peak


def test_member_over_max_member_size_names_the_member(kit, reader):
    raw = kit.archive(kit.member("ok.bin", b"o" * 1000), kit.member("big.bin", b"b" * 1001))
    assert len(kit.read_all(raw, max_member_size=1001)) == 2
    e = _expect_error(kit, raw, max_member_size=1000)
    assert e.offset == 1536 and e.member == "big.bin"
    assert "1001" in e.reason and "1000" in e.reason and "exceeds" in e.reason
    assert "big.bin" in str(e)


def test_default_max_member_size_is_enforced_before_reading(kit, reader):
    raw = kit.header("three-gig.bin", size_field=b"%011o\x00" % (3 << 30)) + bytes(512)
    e = _expect_error(kit, raw)
    assert e.offset == 0 and e.member == "three-gig.bin" and "exceeds" in e.reason


def test_oversized_extension_header(kit, reader):
    raw = kit.header("././@LongLink", 5000, typeflag=b"L", magic=b"ustar  \x00") + bytes(5120)
    e = _expect_error(kit, raw, max_member_size=4096)
    assert e.offset == 0 and "extension header" in e.reason


def test_bad_size_fields(kit, reader):
    for field in [b"12345678901x", b"\xff" + (5).to_bytes(11, "big", signed=False), b"\x81" + bytes(11), b"0x12\x00"]:
        raw = kit.archive(kit.member("a.txt", b"a"), kit.header("b.txt", size_field=field.ljust(12, b"\x00")))
        e = _expect_error(kit, raw)
        assert e.offset == 1024, field
        assert "size" in e.reason, field


def test_negative_octal_size_field_is_an_error(kit, reader):
    """int() accepts a sign; a size of -512 would otherwise re-read the same header forever."""
    raw = kit.archive(kit.header("neg.txt", size_field=b"-0000001000\x00"), kit.member("b.txt", b"b"))
    items = []
    with pytest.raises(TarFormatError) as info:
        for item in itertools.islice(iter_members(io.BytesIO(raw), URL), 20):
            items.append(item)
    assert "size" in info.value.reason and info.value.offset == 0
    assert items == []


@pytest.mark.parametrize("value", ["-1", "-512"])
def test_negative_pax_size_is_an_error(kit, reader, value):
    raw = kit.archive(kit.pax({"size": value}), kit.member("a.txt", b"a" * 10))
    items = []
    with pytest.raises(TarFormatError) as info:
        for item in itertools.islice(iter_members(io.BytesIO(raw), URL), 20):
            items.append(item)
    assert "size" in info.value.reason and info.value.offset == 1024
    assert items == []


def test_malformed_pax_records(kit, reader):
    for data in [b"99 path=x\n", b"5 path=x\n", b"12 pathx.txt\n", b"path=x\n", b"abc path=x\n"]:
        raw = kit.archive(kit.member("PaxHeaders/a", data, typeflag=b"x"), kit.member("a.txt", b"a"))
        e = _expect_error(kit, raw)
        assert e.offset == 0 and e.reason == "malformed pax extended header", data
    raw = kit.archive(kit.pax({"size": "twelve"}), kit.member("a.txt", b"a"))
    e = _expect_error(kit, raw)
    assert e.offset == 1024 and "pax" in e.reason and "size" in e.reason


def test_stats_only_counted_for_complete_streams_of_members(kit, reader):
    raw = kit.archive(kit.member("a.txt", b"12345"), kit.member("b.txt", b"678"))
    stats = ReadStats()
    kit.read_all(raw, stats=stats)
    assert (stats.members, stats.bytes) == (2, 8)
    kit.read_all(raw, stats=stats)
    assert (stats.members, stats.bytes) == (4, 16)


def test_stats_count_members_when_reading_stops_early(kit, reader):
    raw = kit.archive(kit.member("a.txt", b"12345"), kit.member("b.txt", b"678"))
    stats = ReadStats()
    gen = iter_members(io.BytesIO(raw), URL, stats=stats)
    assert next(gen)[0] == "a.txt"
    gen.close()
    assert stats.members == 1 and stats.bytes == 5
