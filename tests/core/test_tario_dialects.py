"""The reader understands every common tar dialect: GNU tar's four formats, Python's tarfile
formats, pax extended/global headers, base-256 numbers, signed checksums and old v7 headers.

Every reading test runs twice (``reader`` fixture): with the C fast path and the pure-Python path.
"""

from __future__ import annotations

import io
import os
import tarfile

import pytest
from tarhelpers import write_sparse_file

from tarproc.errors import LinkError
from tarproc.sources import open_source
from tarproc.tar import ReadStats, iter_keyed_members, iter_members

SIZES = [0, 1, 511, 512, 513, 70001]

SHORT = "short.txt"
UNICODE = "ünïcödé/日本語.txt"
PREFIXED = "d" * 60 + "/" + "e" * 60 + "/file.bin"  # 127 bytes: fits ustar only with the prefix field
LONG_COMPONENT = "x" * 120 + ".dat"  # a basename over 100 bytes: needs GNU or pax long names
VERY_LONG = "L" * 200 + "/" + "M" * 200 + ".txt"  # over 255 bytes


def _payload(i: int, size: int) -> bytes:
    return bytes((i * 7 + j * 13) % 256 for j in range(size))


def _sized_names(base: list[str]) -> list[str]:
    """The base names plus files of every interesting size."""
    return base + [f"sizes/{size:06d}.bin" for size in SIZES]


NAMES_BY_FORMAT = {
    "gnu": _sized_names([SHORT, UNICODE, PREFIXED, LONG_COMPONENT, VERY_LONG]),
    "pax": _sized_names([SHORT, UNICODE, PREFIXED, LONG_COMPONENT, VERY_LONG]),
    "ustar": _sized_names([SHORT, UNICODE, PREFIXED]),
    "v7": _sized_names([SHORT, UNICODE]),
}


@pytest.mark.parametrize("fmt", ["gnu", "pax", "ustar", "v7"])
def test_gnu_tar_formats_read_with_identical_names_and_bytes(tmp_path, kit, reader, fmt):
    src = tmp_path / "src"
    src.mkdir()
    names = NAMES_BY_FORMAT[fmt]
    expected = []
    for i, name in enumerate(names):
        data = _payload(i, SIZES[i % len(SIZES)]) if not name.startswith("sizes/") else _payload(i, int(name[6:12]))
        path = src / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        expected.append((name, data))
    out = tmp_path / f"{fmt}.tar"
    kit.gnu_tar("-cf", str(out), f"--format={fmt}", "-C", str(src), *names)
    raw = out.read_bytes()
    if fmt == "ustar":
        assert raw[257:263] == b"ustar\x00"
    if fmt == "v7":
        assert raw[257:263] == bytes(6)  # no magic at all

    stats = ReadStats()
    got = kit.read_all(raw, str(out), stats=stats)
    assert [(n, d) for n, d, _ in got] == expected
    assert stats.members == len(expected)
    assert stats.bytes == sum(len(d) for _, d in expected)
    # offsets point at the member's own header (for long names: the header after the extension records)
    for _name, data, offset in got:
        header = raw[offset : offset + 512]
        assert header[156:157] in (b"0", b"\x00")
        assert tarfile.nti(header[124:136]) == len(data)
    # the same through irregular short reads and through open_source on the file
    assert kit.read_all(raw, str(out), chunked=3) == got
    with open_source(str(out)) as stream:
        assert list(iter_members(stream, str(out))) == got


def test_gnu_tar_directory_walk_skips_and_counts_directories(tmp_path, kit, reader):
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "b" / "x.txt").write_bytes(b"x" * 10)
    (src / "a" / "y.txt").write_bytes(b"y" * 600)
    (src / "z.txt").write_bytes(b"")
    for fmt in ("gnu", "pax", "ustar", "v7"):
        out = tmp_path / f"walk-{fmt}.tar"
        kit.gnu_tar("-cf", str(out), f"--format={fmt}", "--sort=name", "-C", str(src), ".")
        stats = ReadStats()
        got = kit.read_all(out.read_bytes(), stats=stats)
        assert [(n, d) for n, d, _ in got] == [
            ("./a/b/x.txt", b"x" * 10),
            ("./a/y.txt", b"y" * 600),
            ("./z.txt", b""),
        ], fmt
        assert stats.skipped_entries == {"directory": 3}, fmt


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_long_symlink_target_is_read_whole(tmp_path, kit, reader, fmt):
    src = tmp_path / "src"
    src.mkdir()
    target = "t" * 150 + "/" + "u" * 150
    os.symlink(target, src / "a-link")
    (src / "b.txt").write_bytes(b"after the link")
    hard_target = src / "c.txt"
    hard_target.write_bytes(b"hard")
    os.link(hard_target, src / "d.txt")
    out = tmp_path / "links.tar"
    kit.gnu_tar("-cf", str(out), f"--format={fmt}", "-C", str(src), "a-link", "b.txt", "c.txt", "d.txt")
    raw = out.read_bytes()
    if fmt == "gnu":
        assert raw[156:157] == b"K"  # the first record is the GNU long link name
    stats = ReadStats()
    got = kit.read_all(raw, stats=stats, links="skip")
    assert [(n, d) for n, d, _ in got] == [("b.txt", b"after the link"), ("c.txt", b"hard")]
    assert stats.skipped_entries == {"symlink": 1, "hard link": 1}
    # --links strict: the symbolic link's target is not in the archive (followed, the default, leaves it out)
    with pytest.raises(LinkError, match="symbolic link 'a-link' -> 'tttt.*no earlier member.*--links skip"):
        kit.read_all(raw, links="strict")


def test_long_link_record_followed_by_regular_member_hand_made(kit, reader):
    """A ``K`` record applies to the next entry only; it must not rename the regular file after it."""
    target = b"/" + b"q" * 300 + b"\x00"
    raw = kit.archive(
        kit.member("././@LongLink", target, typeflag=b"K", magic=b"ustar  \x00"),
        kit.header("link", 0, typeflag=b"2", linkname=b"q" * 100, magic=b"ustar  \x00"),
        kit.member("next.txt", b"payload"),
    )
    stats = ReadStats()
    assert kit.read_all(raw, stats=stats, links="skip") == [("next.txt", b"payload", 1536)]
    assert stats.skipped_entries == {"symlink": 1}
    with pytest.raises(LinkError, match="symbolic link 'link' -> '/qqqq.*it leaves the archive"):
        kit.read_all(raw, links="strict")


# -- Python's tarfile ----------------------------------------------------------------------------


def _tarfile_bytes(fmt: int, members: list[tuple[str, bytes]], **kw) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, encoding="utf-8", **kw) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1234567890
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


TARFILE_MEMBERS = {
    tarfile.USTAR_FORMAT: [("a.txt", b"a"), (PREFIXED, b"p" * 1000), ("b/c.bin", bytes(range(256)) * 3)],
    tarfile.GNU_FORMAT: [
        ("a.txt", b"a"),
        (PREFIXED, b"p" * 1000),
        (LONG_COMPONENT, b"long"),
        (VERY_LONG, b"v" * 513),
        (UNICODE, "ü".encode() * 100),
    ],
    tarfile.PAX_FORMAT: [
        ("a.txt", b"a"),
        (PREFIXED, b"p" * 1000),
        (LONG_COMPONENT, b"long"),
        (VERY_LONG, b"v" * 513),
        (UNICODE, "ü".encode() * 100),
    ],
}


@pytest.mark.parametrize("fmt", list(TARFILE_MEMBERS), ids=["ustar", "gnu", "pax"])
def test_python_tarfile_formats(kit, reader, fmt):
    members = TARFILE_MEMBERS[fmt]
    raw = _tarfile_bytes(fmt, members)
    got = kit.read_all(raw)
    assert [(n, d) for n, d, _ in got] == members
    assert kit.read_all(raw, chunked=11) == got


def test_tarfile_non_regular_entries_are_skipped_and_counted(kit, reader):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        entries = [
            ("dir", tarfile.DIRTYPE),
            ("k.sym", tarfile.SYMTYPE),
            ("k.hard", tarfile.LNKTYPE),
            ("k.fifo", tarfile.FIFOTYPE),
            ("k.chr", tarfile.CHRTYPE),
            ("k.blk", tarfile.BLKTYPE),
        ]
        for name, kind in entries:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "k.txt" if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE) else ""
            tf.addfile(info)
            data = f"after {name}".encode()
            info = tarfile.TarInfo(f"k{len(name)}-{kind.decode()}.txt")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    stats = ReadStats()
    got = kit.read_all(buf.getvalue(), stats=stats, links="skip")
    assert [d for _, d, _ in got] == [f"after {name}".encode() for name, _ in entries]
    assert stats.skipped_entries == {
        "directory": 1,
        "symlink": 1,
        "hard link": 1,
        "fifo": 1,
        "character device": 1,
        "block device": 1,
    }
    assert stats.members == len(entries)


# -- pax headers ---------------------------------------------------------------------------------


def test_pax_extended_header_path_size_mtime(kit, reader):
    """path and size from an ``x`` header override the ustar fields (the ustar size here is wrong)."""
    long_path = "pax/" + "p" * 300 + ".bin"
    data = bytes(range(256)) * 5 + b"tail"
    raw = kit.archive(
        kit.pax({"mtime": "1700000000.123456789", "path": long_path, "size": str(len(data))}),
        kit.header("pax/truncated-name.bin", 7) + kit.pad(data),  # ustar size 7 is overridden
        kit.member("plain.txt", b"plain"),  # the pax header applied to one member only
    )
    got = kit.read_all(raw)
    assert [(n, d) for n, d, _ in got] == [(long_path, data), ("plain.txt", b"plain")]
    assert got[0][2] == 1024  # the offset of the member's own header, after the pax header


def test_pax_size_larger_than_ustar_octal_field(kit, reader):
    """Writers put sizes the octal field can't hold in pax; the header field may then be zero."""
    data = b"z" * 3000
    raw = kit.archive(kit.pax({"size": "3000"}), kit.header("big.bin", 0) + kit.pad(data))
    assert [(n, d) for n, d, _ in kit.read_all(raw)] == [("big.bin", data)]


def test_tarfile_pax_headers_mtime_and_global_header(kit, reader):
    buf = io.BytesIO()
    with tarfile.open(
        fileobj=buf, mode="w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "global ünïcode"}
    ) as tf:
        for name, data in [("a.txt", b"aa"), ("ünï.txt", b"u"), ("b.txt", b"b" * 700)]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1700000000.5  # fractional mtime goes into a pax record
            info.pax_headers = {"comment": "per member"}
            tf.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    assert raw[156:157] == b"g"
    got = kit.read_all(raw)
    assert [(n, d) for n, d, _ in got] == [("a.txt", b"aa"), ("ünï.txt", b"u"), ("b.txt", b"b" * 700)]


def test_pax_global_header_does_not_disturb_following_members(kit, reader):
    raw = kit.archive(
        kit.pax({"mtime": "1", "comment": "hello"}, typeflag=b"g", name="GlobalHead.0"),
        kit.member("a.txt", b"A"),
        kit.pax({"mtime": "2"}, typeflag=b"g", name="GlobalHead.1"),
        kit.member("b.txt", b"B"),
    )
    assert [(n, d, o) for n, d, o in kit.read_all(raw)] == [("a.txt", b"A", 1024), ("b.txt", b"B", 3072)]


def test_pax_header_with_utf8_path(kit, reader):
    raw = kit.archive(kit.pax({"path": "ördner/日本.txt"}), kit.member("ascii-fallback.txt", b"x"))
    assert kit.read_all(raw) == [("ördner/日本.txt", b"x", 1024)]


# -- numeric fields, checksums, v7 ---------------------------------------------------------------


def test_tarfile_gnu_base256_uid(kit, reader):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("huge-uid.txt")
        info.uid = 8**9  # does not fit 7 octal digits: tarfile writes base-256
        info.size = 5
        tf.addfile(info, io.BytesIO(b"hello"))
    raw = buf.getvalue()
    assert raw[108] == 0x80
    assert kit.read_all(raw) == [("huge-uid.txt", b"hello", 0)]


def test_base256_size_field(kit, reader):
    data = b"b" * 1000
    size_field = b"\x80" + len(data).to_bytes(11, "big")
    raw = kit.archive(kit.header("b256.bin", size_field=size_field) + kit.pad(data), kit.member("next", b"n"))
    assert kit.read_all(raw) == [("b256.bin", data, 0), ("next", b"n", 1536)]


def test_size_field_space_terminated_and_without_terminator(kit, reader):
    raw = kit.archive(
        kit.header("space.txt", size_field=b"00000000005 ") + kit.pad(b"12345"),
        kit.header("full.txt", size_field=b"000000000006") + kit.pad(b"123456"),
        kit.header("lead.txt", size_field=b"          3\x00") + kit.pad(b"123"),
    )
    assert [(n, d) for n, d, _ in kit.read_all(raw)] == [
        ("space.txt", b"12345"),
        ("full.txt", b"123456"),
        ("lead.txt", b"123"),
    ]


def test_signed_checksum_accepted(kit, reader):
    """Some old tars summed signed chars; with bytes > 127 in the name only the signed sum matches."""
    name = "é-ü.txt".encode()
    header = kit.header(name, 4, chksum="signed")
    unsigned = sum(header[:148]) + 256 + sum(header[156:])
    assert int(header[148:154], 8) != unsigned  # really only right as a signed sum
    raw = kit.archive(header + kit.pad(b"data"), kit.member("b.txt", b"b"))
    assert kit.read_all(raw) == [("é-ü.txt", b"data", 0), ("b.txt", b"b", 1024)]


def test_old_v7_header_without_magic(kit, reader):
    raw = kit.archive(
        kit.member("v7-old.txt", b"seven", typeflag=b"\x00", magic=b""),
        kit.member("v7-new.txt", b"eight!!!", typeflag=b"0", magic=b""),
        # a v7 header has no prefix field: bytes there must not be glued to the name
        kit.member("v7-noprefix.txt", b"9", typeflag=b"\x00", magic=b"", prefix=b"junk"),
    )
    assert kit.read_all(raw) == [
        ("v7-old.txt", b"seven", 0),
        ("v7-new.txt", b"eight!!!", 1024),
        ("v7-noprefix.txt", b"9", 2048),
    ]


def test_ustar_prefix_field_joined_and_gnu_magic_prefix_ignored(kit, reader):
    raw = kit.archive(
        kit.member("name.txt", b"u", prefix=b"some/prefix"),
        # old GNU headers ("ustar  \0") have no prefix field; those bytes are not part of the name
        kit.member("gnu.txt", b"g", prefix=b"not-a-prefix", magic=b"ustar  \x00"),
    )
    assert kit.read_all(raw) == [("some/prefix/name.txt", b"u", 0), ("gnu.txt", b"g", 1024)]


def test_name_of_exactly_100_bytes_and_255_bytes(kit, reader):
    n100 = "a" * 96 + ".txt"
    prefix = "p" * 155
    n100b = "b" * 96 + ".bin"
    raw = kit.archive(kit.member(n100, b"1"), kit.member(n100b, b"2", prefix=prefix.encode()))
    assert [(n, d) for n, d, _ in kit.read_all(raw)] == [(n100, b"1"), (prefix + "/" + n100b, b"2")]


def test_gnu_long_name_record_hand_made(kit, reader):
    long_name = ("n" * 150 + "/" + "m" * 150 + ".txt").encode()
    raw = kit.archive(
        kit.member("././@LongLink", long_name + b"\x00", typeflag=b"L", magic=b"ustar  \x00"),
        kit.member(long_name[:100], b"long", magic=b"ustar  \x00"),
        kit.member("short.txt", b"short"),
    )
    assert kit.read_all(raw) == [(long_name.decode(), b"long", 1024), ("short.txt", b"short", 2048)]


def test_keyed_members_follow_key_rule(kit, reader):
    raw = kit.writer_tar(
        [("dir.v2/img.seg.PNG", b"1"), ("README", b"2"), ("a/.hidden.txt", b"3"), ("k.TXT", b"4"), ("é.ÜX", b"5")]
    )
    stream = io.BytesIO(raw)
    assert [(k, f, d) for k, f, d, _ in iter_keyed_members(stream, "u")] == [
        ("dir.v2/img", "seg.png", b"1"),
        (None, "README", b"2"),
        (None, "a/.hidden.txt", b"3"),
        ("k", "txt", b"4"),
        ("é", "üx", b"5"),
    ]


def test_dotdot_and_absolute_names_are_kept_as_names(tmp_path, kit, reader, monkeypatch):
    """Names are data: nothing is ever created from them."""
    monkeypatch.chdir(tmp_path)
    evil = [("../escape.txt", b"e"), ("/etc/absolute.txt", b"a"), ("a/../../up.txt", b"u")]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in evil:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    assert raw[0:14] == b"../escape.txt\x00"  # tarfile kept the name as given
    before = sorted(os.listdir(tmp_path.parent))
    assert [(n, d) for n, d, _ in kit.read_all(raw)] == evil
    assert os.listdir(tmp_path) == []
    assert sorted(os.listdir(tmp_path.parent)) == before
    assert not os.path.exists("/etc/absolute.txt")


def test_pure_python_env_var_disables_fast_path():
    import subprocess
    import sys

    code = "import tarproc.tar.reader as t; print(t._scan is None)"
    env = dict(os.environ, TARPROC_PURE_PYTHON="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
    env.pop("TARPROC_PURE_PYTHON")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("False" if _built() else "True")


def _built() -> bool:
    try:
        from tarproc import _speedups  # noqa: F401
    except ImportError:
        return False
    return True


# -- GNU sparse files (tar --sparse) -------------------------------------------------------------


def _sparse_tar(tmp_path, kit, fmt: str, regions: int) -> tuple[bytes, bytes]:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    path = src / "sparse.bin"
    write_sparse_file(path, regions)
    (src / "z.txt").write_bytes(b"after the sparse file")
    out = tmp_path / f"sparse-{fmt}-{regions}.tar"
    kit.gnu_tar("-cf", str(out), f"--format={fmt}", "--sparse", "-C", str(src), "sparse.bin", "z.txt")
    raw = out.read_bytes()
    if (fmt == "gnu" and raw[156:157] != b"S") or (fmt == "pax" and b"GNUSparseFile" not in raw[:4096]):
        pytest.skip("this file system does not keep holes: GNU tar stored the file as a plain one")
    return raw, path.read_bytes()


def test_gnu_sparse_member_with_few_regions_is_expanded(tmp_path, kit, reader):
    raw, content = _sparse_tar(tmp_path, kit, "gnu", regions=3)
    assert raw[482] == 0  # the sparse map fits the header: no extension blocks
    stats = ReadStats()
    got = [(n, d) for n, d, _ in kit.read_all(raw, stats=stats)]
    assert got == [("sparse.bin", content), ("z.txt", b"after the sparse file")]
    assert stats.skipped_entries == {}


def test_gnu_sparse_member_with_extension_blocks_is_expanded(tmp_path, kit, reader):
    raw, content = _sparse_tar(tmp_path, kit, "gnu", regions=10)
    assert raw[482] == 1  # the sparse map continues in extension blocks
    got = [(n, d) for n, d, _ in kit.read_all(raw, chunked=3)]  # short reads: the map crosses them
    assert got == [("sparse.bin", content), ("z.txt", b"after the sparse file")]


def test_pax_sparse_member_is_not_yielded_with_wrong_name_and_bytes(tmp_path, kit, reader):
    raw, content = _sparse_tar(tmp_path, kit, "pax", regions=3)
    for name, data, _ in kit.read_all(raw):
        assert "GNUSparseFile" not in name
        if name == "sparse.bin":
            assert data == content


def test_gnu_volume_label_is_skipped_and_counted(tmp_path, kit, reader):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"labelled")
    out = tmp_path / "v.tar"
    kit.gnu_tar("-cf", str(out), "-V", "MY LABEL", "-C", str(src), "a.txt")
    stats = ReadStats()
    assert [(n, d) for n, d, _ in kit.read_all(out.read_bytes(), stats=stats)] == [("a.txt", b"labelled")]
    assert stats.skipped_entries == {"volume label": 1}
