"""The C fast path and the pure-Python reference path give identical results: the same
(name, data, offset) lists for valid archives and the same errors (type, offset, reason, member)
for damaged ones, with the same members yielded before the error.
"""

from __future__ import annotations

import io
import random
import tarfile

import pytest

import tarproc.tar as tario
import tarproc.tar.reader as tar_reader
from tarproc.errors import TarprocError


@pytest.fixture
def compare(monkeypatch, kit, c_scan):
    """compare(data, **kw): read with both paths (plain, keyed; whole and short reads) and compare."""
    calls = {"c_items": 0}

    def counting_scan(*args):
        result = c_scan(*args)
        calls["c_items"] += len(result[0])
        return result

    def run(scan, data, keyed, chunked, kw):
        monkeypatch.setattr(tar_reader, "_scan", scan)
        if chunked is None:
            stream = io.BytesIO(data)
        else:
            stream = kit.ChunkedReader(data, seed=chunked, max_piece=5000)
        fn = tario.iter_keyed_members if keyed else tario.iter_members
        items = []
        try:
            for item in fn(stream, "p.tar", **kw):
                items.append(item)
        except TarprocError as e:
            return items, (type(e).__name__, e.offset, e.reason, e.member, str(e))
        return items, None

    def check(data: bytes, *, chunked_too: bool = True, **kw):
        results = []
        for keyed in (False, True):
            for chunked in (None, 1) if chunked_too else (None,):
                fast = run(counting_scan, data, keyed, chunked, kw)
                pure = run(None, data, keyed, chunked, kw)
                assert fast == pure, (keyed, chunked)
                results.append(fast)
        return results[0]

    check.calls = calls
    return check


def _varied_archives(kit) -> dict[str, bytes]:
    rng = random.Random(42)
    archives = {}
    archives["small-members"] = kit.writer_tar(
        (f"s/{i:04d}.{ext}", rng.randbytes(rng.randint(0, 1100))) for i in range(60) for ext in ("a", "b")
    )
    archives["large-members"] = kit.writer_tar(
        [
            ("big/0.bin", rng.randbytes(1_500_000)),
            ("big/1.txt", b"t"),
            ("big/2.bin", rng.randbytes((1 << 20) - 700)),
            ("big/3.bin", rng.randbytes(2_000_001)),
            ("big/4.txt", b"end"),
        ]
    )
    archives["long-and-prefix-names"] = kit.writer_tar(
        [
            ("p" * 120 + "/x.txt", b"prefix"),
            ("l" * 300 + ".txt", b"long"),
            ("a" * 100, b"exact100"),
            ("q" * 155 + "/" + "r" * 96 + ".bin", b"255"),
            ("ünïcödé/" * 20 + "x.txt", b"unicode long"),
        ]
    )
    archives["hand-made-dialects"] = kit.archive(
        kit.pax({"path": "pax/" + "p" * 200 + ".bin", "size": "700", "mtime": "1.5"}),
        kit.header("ignored", 7) + kit.pad(b"P" * 700),
        kit.member("after-pax.txt", b"x"),
        kit.pax({"comment": "g"}, typeflag=b"g", name="GlobalHead"),
        kit.member("b256.bin", b"B" * 1000, size_field=b"\x80" + (1000).to_bytes(11, "big")),
        kit.member("é-signed.txt", b"signed", chksum="signed"),
        kit.member("v7.txt", b"v7", typeflag=b"\x00", magic=b""),
        kit.member("name.txt", b"prefixed", prefix=b"some/prefix"),
        kit.member("gnu.txt", b"gnu", prefix=b"ignored", magic=b"ustar  \x00"),
        kit.header("dir/", typeflag=b"5"),
        kit.header("sym", typeflag=b"2", linkname=b"v7.txt"),
        kit.header("hard.txt", 5, typeflag=b"1", linkname=b"gnu.txt"),  # an old tar's size, no data
        kit.header("olddir/", 100, typeflag=b"\x00", magic=b""),  # an old-style directory: no data
        kit.header("dir5/", 3, typeflag=b"5"),
        kit.member("././@LongLink", b"L" * 150 + b".txt\x00", typeflag=b"L", magic=b"ustar  \x00"),
        kit.member("short-in-header", b"long named", magic=b"ustar  \x00"),
        kit.member("KEY.lower.ext", b"case"),
        kit.member("no-key", b"nokey"),
        kit.member(".hidden", b"hidden"),
        kit.member("", b"empty name"),
        kit.member(b"\xff\xfe-not-utf8.t\xc3xt", b"bad utf-8"),
        kit.member(b"caf\xc3\xa9.\xc3\xa9t\xc3\xa9", b"utf-8 field", prefix=b"pr\xe9fix"),
    )
    # upper-case fields are lower-cased by the key rule (see test_keyed_error_names_the_real_member for
    # the error-message difference; this archive is only compared undamaged)
    archives["case-fields"] = kit.archive(
        kit.member("KEY.UPPER.Ext", b"case"),
        kit.member(b"\xff\xfe-not-utf8.T\xc3XT", b"bad utf-8"),
        kit.member(b"caf\xc3\xa9.\xc3\x89T\xc3\xa9", b"utf-8 upper field", prefix=b"pr\xe9fix"),
        kit.member("\u0130stanbul.\u0130\u03a3", b"special lower()"),
    )
    # links, sparse files and old-style entries (the reader's newer paths), and "./" names
    old_sparse = bytearray(kit.header("./s/old.bin", 5, typeflag=b"S", magic=b"ustar  \x00"))
    old_sparse[386:434] = b"%011o\x00%011o\x00%011o\x00%011o\x00" % (0, 2, 10, 3)
    old_sparse[483:495] = b"%011o\x00" % 16
    old_sparse[148:156] = b" " * 8
    old_sparse[148:156] = b"%06o\x00 " % sum(old_sparse)
    sparse_map = kit.pad(b"2\n0\n3\n10\n2\n")
    archives["links-sparse-old"] = kit.archive(
        kit.member("./s/a.txt", b"target"),
        kit.header("./s/b.txt", typeflag=b"1", linkname=b"./s/a.txt"),
        kit.header("./s/c.txt", 6, typeflag=b"1", linkname=b"./s/a.txt"),  # an old tar's size, no data
        kit.header("./s/d.txt", typeflag=b"2", linkname=b"a.txt"),
        kit.header("./s/", 100, typeflag=b"\x00", magic=b""),  # an old-style directory
        bytes(old_sparse) + kit.pad(b"abxyz"),
        kit.pax({"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "s/new.bin",
                 "GNU.sparse.realsize": "20"}),
        kit.header("GNUSparseFile.0/new.bin", len(sparse_map) + 5) + kit.pad(sparse_map + b"abcde"),
        kit.member("./s/z.txt", b"last"),
    )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for i, name in enumerate(["a.txt", "ü" * 80 + ".txt", "d/" * 70 + "deep.bin", "z.txt"]):
            info = tarfile.TarInfo(name)
            data = bytes([i]) * (i * 900)
            info.size = len(data)
            info.mtime = 1.25
            tf.addfile(info, io.BytesIO(data))
    archives["tarfile-pax"] = buf.getvalue()
    return archives


def test_valid_archives_identical(kit, compare):
    for name, raw in _varied_archives(kit).items():
        items, error = compare(raw)
        assert error is None, (name, error)
        assert items, name
    assert compare.calls["c_items"] > 100  # the fast path really did the work for most members


def test_gnu_tar_archives_identical(tmp_path, kit, compare):
    src = tmp_path / "src"
    (src / ("d" * 90) / ("e" * 90)).mkdir(parents=True)
    (src / ("d" * 90) / ("e" * 90) / "f.txt").write_bytes(b"deep")
    (src / "ü.bin").write_bytes(bytes(range(256)) * 9)
    (src / ("x" * 150 + ".dat")).write_bytes(b"long")
    for fmt in ("gnu", "pax", "ustar", "v7"):
        out = tmp_path / f"{fmt}.tar"
        kit.gnu_tar("-cf", str(out), f"--format={fmt}", "--sort=name", "-C", str(src), ".", check=False)
        items, error = compare(out.read_bytes())
        assert error is None and items, fmt


def _damaged_variants(raw: bytes, seed: int, count: int):
    rng = random.Random(seed)
    end = len(raw.rstrip(b"\x00")) + 512
    yield "empty", b""
    for cut in sorted(
        {0, 1, 511, 512, 513, 1023, 1024, end - 1, end, end - 512} | {rng.randrange(end) for _ in range(count)}
    ):
        if 0 <= cut < len(raw):
            yield f"cut@{cut}", raw[:cut]
    for _ in range(count):
        pos = rng.randrange(end)
        bad = bytearray(raw)
        bad[pos] ^= 1 << rng.randrange(8)
        yield f"flip@{pos}", bytes(bad)
    for _ in range(count // 4):
        pos = rng.randrange(end)
        bad = bytearray(raw)
        bad[pos : pos + 8] = rng.randbytes(8)
        yield f"junk@{pos}", bytes(bad)
    yield "garbage-after-end", raw + b"\x00" * 100 + b"garbage"
    yield "garbage-in-end", raw[:-100] + b"x" + raw[-99:]


@pytest.mark.parametrize(
    "which, count",
    [("small-members", 150), ("long-and-prefix-names", 60), ("hand-made-dialects", 200), ("tarfile-pax", 60),
     ("links-sparse-old", 200)],
)
def test_damaged_archives_identical_errors(kit, compare, which, count):
    raw = _varied_archives(kit)[which]
    errors = 0
    for label, data in _damaged_variants(raw, seed=len(which), count=count):
        items, error = compare(data, chunked_too=label.startswith("cut@") and len(data) % 3 == 0)
        errors += error is not None
    assert errors > count  # most damage is an error (some flips land in data bytes)


def test_large_member_damage_identical(kit, compare):
    raw = _varied_archives(kit)["large-members"]
    first_zero_end = -(-len(raw.rstrip(b"\x00")) // 512) * 512 + 512  # the last member's data ends with b"end"
    cuts = [1_000_000, 1 << 20, (1 << 20) + 512, 1_500_512, 1_500_513, 2_600_000, first_zero_end - 1]
    cuts += [first_zero_end - 513, first_zero_end - 1024, 3_000_000, 4_000_000]
    for cut in cuts:
        items, error = compare(raw[:cut], chunked_too=False)
        assert error is not None and error[1] <= cut, cut
    items, error = compare(raw[:first_zero_end], chunked_too=False)
    assert error is None and len(items) == 5
    items, error = compare(raw, max_member_size=1_600_000, chunked_too=False)
    assert error is not None and "exceeds" in error[2] and error[3] == "big/3.bin"


def test_max_member_size_identical(kit, compare):
    raw = _varied_archives(kit)["small-members"]
    for limit in (0, 1, 500, 1000, 1099):
        compare(raw, max_member_size=limit)


def test_seven_digit_checksum_accepted_by_tarfile_and_gnu_tar(tmp_path, kit):
    """POSIX only says the checksum is octal in an 8-byte field; '%07o\\0' is as valid as '%06o\\0 '."""
    raw = kit.archive(kit.member("seven.txt", b"7 digits", chksum="7digits"))
    assert raw[148:156].endswith(b"\x00") and len(raw[148:155].strip(b"\x00")) == 7
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        assert tf.extractfile("seven.txt").read() == b"7 digits"
    path = tmp_path / "seven.tar"
    path.write_bytes(raw)
    assert kit.gnu_tar("-tf", str(path)).stdout == b"seven.txt\n"


def test_seven_digit_checksum_accepted(kit, reader, request):
    raw = kit.archive(kit.member("seven.txt", b"7 digits", chksum="7digits"), kit.member("b.txt", b"b"))
    assert kit.read_all(raw) == [("seven.txt", b"7 digits", 0), ("b.txt", b"b", 1024)]


def test_seven_digit_checksum_parity(kit, compare):
    small = kit.archive(kit.member("a.txt", b"a"), kit.member("seven.txt", b"7", chksum="7digits"))
    compare(small)


def test_keyed_error_names_the_real_member(kit, compare):
    raw = kit.archive(kit.member("KEY.UPPER.Ext", b"case"), kit.member("b.txt", b"b"))
    items, error = compare(raw[: 1024 + 100], chunked_too=False)  # cut inside the header of b.txt
    assert error[2] == "truncated tar header" and error[3] == "KEY.UPPER.Ext"


@pytest.mark.parametrize("limit", [(1 << 63) - 1, 1 << 63, 10**20])
def test_huge_max_member_size_is_accepted(kit, reader, request, limit):
    """A user "disabling" the limit (``--max-member-size 1e20``) must not crash the fast path."""
    raw = kit.archive(kit.member("a.txt", b"a"), kit.member("b.txt", b"b" * 600))
    assert kit.read_all(raw, max_member_size=limit) == [("a.txt", b"a", 0), ("b.txt", b"b" * 600, 1024)]


def test_links_sparse_and_old_entries_read_whole(kit, reader):
    raw = _varied_archives(kit)["links-sparse-old"]
    got = [(n, d) for n, d, _ in kit.read_all(raw)]
    assert got == [("./s/a.txt", b"target"), ("./s/b.txt", b"target"), ("./s/c.txt", b"target"),
                   ("./s/d.txt", b"target"), ("./s/old.bin", b"ab" + bytes(8) + b"xyz" + bytes(3)),
                   ("s/new.bin", b"abc" + bytes(7) + b"de" + bytes(8)), ("./s/z.txt", b"last")]
    assert [k for k, _, _, _ in kit.read_all(raw, keyed=True)] == ["s/a", "s/b", "s/c", "s/d", "s/old", "s/new", "s/z"]
