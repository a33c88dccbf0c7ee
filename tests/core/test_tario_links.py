"""Links, sparse files, old-style entries and concatenated archives, read as GNU tar extracts them.

Each archive is written by GNU tar (or by hand where only old tars write it), read with both reader
paths (the ``reader`` fixture), and compared byte for byte with what ``tar -x`` puts on disk.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tracemalloc
from pathlib import Path

import pytest
from tarhelpers import write_sparse_file

from tarproc import read_samples
from tarproc.errors import LinkError, OptionError, TarFormatError
from tarproc.sources import open_source
from tarproc.tar import ReadStats, iter_keyed_members, iter_members


def extracted(kit, archive: Path, tmp_path: Path, *flags: str) -> dict[str, bytes]:
    """What GNU tar extracts: {name as in the archive: bytes} for every regular file."""
    out = tmp_path / f"x-{archive.stem}"
    out.mkdir()
    kit.gnu_tar(*flags, "-xf", str(archive), "-C", str(out))
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file() and not p.is_symlink()}


class Unseekable(io.RawIOBase):
    """A stream that can only be read forward (a pipe, a decompressor)."""

    def __init__(self, data: bytes) -> None:
        self.inner = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        return self.inner.read(n)


@pytest.fixture
def linked_tree(tmp_path: Path) -> Path:
    """d/000.jpg, its hard link d/001.jpg, a symbolic link d/002.jpg -> 000.jpg and a text file."""
    src = tmp_path / "src" / "d"
    src.mkdir(parents=True)
    (src / "000.jpg").write_bytes(b"\xff\xd8 first image" * 50)
    os.link(src / "000.jpg", src / "001.jpg")
    os.symlink("000.jpg", src / "002.jpg")
    (src / "000.txt").write_bytes(b"caption")
    return tmp_path / "src"


def test_hard_and_symbolic_links_read_as_gnu_tar_extracts_them(tmp_path, kit, reader, linked_tree):
    archive = tmp_path / "links.tar"
    kit.gnu_tar("--sort=name", "-cf", str(archive), "-C", str(linked_tree), ".")
    stats = ReadStats()
    got = {name: data for name, data, _ in kit.read_all(archive.read_bytes(), stats=stats)}
    want = extracted(kit, archive, tmp_path)
    want["d/002.jpg"] = want["d/000.jpg"]  # tar -x makes a symbolic link; we give its target's bytes
    assert {n.removeprefix("./"): d for n, d in got.items()} == want
    assert stats.members == 4 and stats.skipped_entries == {"directory": 2}
    # the samples have every field
    samples = list(read_samples(str(archive)))
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples] == [
        ("d/000", ["jpg", "txt"]), ("d/001", ["jpg"]), ("d/002", ["jpg"])]
    # --links skip: today's behaviour, counted
    stats = ReadStats()
    names = [n for n, _, _ in kit.read_all(archive.read_bytes(), stats=stats, links="skip")]
    assert names == ["./d/000.jpg", "./d/000.txt"]
    assert stats.skipped_entries == {"directory": 2, "hard link": 1, "symlink": 1}


def test_a_link_whose_target_fell_out_of_the_cache_is_read_again_where_the_file_can_be(tmp_path, kit, reader, linked_tree):
    archive = tmp_path / "links.tar"
    kit.gnu_tar("--sort=name", "-cf", str(archive), "-C", str(linked_tree), ".")
    first = (linked_tree / "d" / "000.jpg").read_bytes()
    # a plain local file: read again from the start (pread), whatever the cache holds
    with open(archive, "rb") as f:
        got = dict((n, d) for n, d, _ in iter_members(f, str(archive), link_cache=0))
    assert got["./d/001.jpg"] == got["./d/002.jpg"] == first
    with open_source(str(archive)) as source:
        got = dict((n, d) for n, d, _ in iter_members(source, str(archive), link_cache=0))
    assert got["./d/001.jpg"] == first
    # a stream that can't go back, with nothing cached: one line naming the link, its target, the option
    with pytest.raises(LinkError, match=r"links.tar: hard link './d/001.jpg' -> './d/000.jpg': no earlier member .*"
                                        r"within the last 0 MiB read \(--links skip skips links\) at byte \d+"):
        list(iter_members(Unseekable(archive.read_bytes()), str(archive), link_cache=0))


def test_symbolic_links_that_cannot_be_had_are_left_out_and_said_strict_makes_them_errors(kit, reader):
    """A symbolic link carries no data: one to a later member, to a directory, dangling or leaving
    the archive is left out (said, counted), and reading goes on; ``links="strict"`` refuses it."""
    forward = kit.archive(kit.header("a.jpg", typeflag=b"2", linkname=b"b.jpg"), kit.member("b.jpg", b"B"))
    said: list[str] = []
    stats = ReadStats()
    stats.warn = said.append
    assert [(n, d) for n, d, _ in iter_members(io.BytesIO(forward), "mem.tar", stats=stats)] == [("b.jpg", b"B")]
    assert stats.skipped_entries == {"symlink": 1}
    assert "symbolic link 'a.jpg' -> 'b.jpg' at byte 0 left out: no earlier member" in said[0]
    assert "the target of symbolic link 'a.jpg' -> 'b.jpg' is a later member (at byte 512)" in said[1]
    with pytest.raises(LinkError, match="symbolic link 'a.jpg' -> 'b.jpg': no earlier member"):
        kit.read_all(forward, links="strict")
    outside = kit.archive(kit.member("x/a.txt", b"a"), kit.header("x/b.txt", typeflag=b"2", linkname=b"../../etc/passwd"))
    assert [n for n, _, _ in kit.read_all(outside)] == ["x/a.txt"]
    with pytest.raises(LinkError, match="it leaves the archive"):
        kit.read_all(outside, links="strict")
    to_dir = kit.archive(kit.header("train/", typeflag=b"5"), kit.member("train/a.jpg", b"a"),
                         kit.header("latest", typeflag=b"2", linkname=b"train"), kit.member("train/b.jpg", b"b"))
    assert [n for n, _, _ in kit.read_all(to_dir)] == ["train/a.jpg", "train/b.jpg"]  # 'tar -C dir .' with a link
    hard = kit.archive(kit.header("a.jpg", typeflag=b"1", linkname=b"b.jpg"), kit.member("b.jpg", b"B"))
    with pytest.raises(LinkError, match="hard link 'a.jpg' -> 'b.jpg': no earlier member"):
        kit.read_all(hard)  # its data would be lost
    inside = kit.archive(kit.member("x/a.txt", b"a"), kit.header("y/b.txt", typeflag=b"2", linkname=b"../x/a.txt"))
    assert [(n, d) for n, d, _ in kit.read_all(inside)] == [("x/a.txt", b"a"), ("y/b.txt", b"a")]
    with pytest.raises(OptionError, match="bad links policy"):
        kit.read_all(inside, links="copy")


@pytest.mark.parametrize("magic", [b"ustar\x0000", b"ustar  \x00"], ids=["ustar", "gnu"])
def test_an_old_hard_link_with_a_size_and_no_data(tmp_path, kit, reader, magic):
    """Old tars stored the file's size in a hard link's header, with no data after it."""
    raw = kit.archive(
        kit.member("a.txt", b"hello", magic=magic),
        kit.header("b.txt", 5, typeflag=b"1", linkname=b"a.txt", magic=magic),
        kit.member("c.txt", b"abc", magic=magic),
    )
    archive = tmp_path / "old.tar"
    archive.write_bytes(raw)
    want = extracted(kit, archive, tmp_path)
    assert want == {"a.txt": b"hello", "b.txt": b"hello", "c.txt": b"abc"}
    assert {n: d for n, d, _ in kit.read_all(raw)} == want
    assert [n for n, _, _ in kit.read_all(raw, links="skip")] == ["a.txt", "c.txt"]


def test_a_pax_hard_link_that_carries_data_is_that_file(kit, reader):
    raw = kit.archive(kit.member("a.txt", b"hello"), kit.pax({"size": "4"}),
                      kit.header("b.txt", 4, typeflag=b"1", linkname=b"a.txt") + kit.pad(b"own!"),
                      kit.member("c.txt", b"abc"))
    assert [(n, d) for n, d, _ in kit.read_all(raw)] == [("a.txt", b"hello"), ("b.txt", b"own!"), ("c.txt", b"abc")]


def test_damage_after_a_sized_link_or_directory_is_an_error(kit, reader):
    """The block after a link or directory whose size field is not 0 is a header, never its data:
    a damaged one is a checksum error, not data taken silently (found in review)."""
    damaged = bytearray(kit.member("m.txt", b"M" * 488))
    damaged[0] ^= 1
    for entry in (kit.header("d/", 1000, typeflag=b"5"), kit.header("l.txt", 1000, typeflag=b"1", linkname=b"t.txt")):
        raw = kit.archive(kit.member("t.txt", b"T"), entry, bytes(damaged), kit.member("n.txt", b"N"))
        with pytest.raises(TarFormatError, match="bad tar header checksum"):
            kit.read_all(raw)


def test_ignore_zeros_still_finds_a_truncated_later_archive(kit, reader):
    first = kit.writer_tar([("a.txt", b"a")])
    cut = kit.writer_tar([("b.txt", b"b"), ("c.txt", b"c")])
    cut = cut[: 4 * 512]  # ends after c.txt, without end-of-archive blocks
    with pytest.raises(TarFormatError, match="stream ends before the end-of-archive blocks"):
        kit.read_all(first + cut, ignore_zeros=True)


@pytest.mark.parametrize("typeflag", [b"\x00", b"0", b"5"], ids=["aregtype", "regtype", "dirtype"])
def test_old_style_directory_entries_have_no_data(tmp_path, kit, reader, typeflag):
    """A directory (or a regular type with a name ending in '/', as old tars wrote them) whose size
    field is not 0 and no data follows: GNU tar, tarfile and libarchive read a directory."""
    raw = kit.archive(kit.header("d/", 100, typeflag=typeflag, magic=b"" if typeflag == b"\x00" else b"ustar\x0000"),
                      kit.member("d/a.txt", b"hello"))
    stats = ReadStats()
    assert [(n, d) for n, d, _ in kit.read_all(raw, stats=stats)] == [("d/a.txt", b"hello")]
    assert [(k, f) for k, f, _, _ in kit.read_all(raw, keyed=True)] == [("d/a", "txt")]
    assert stats.skipped_entries == {"directory": 1}
    if typeflag != b"0":  # tarfile reads a '0' with a slash as a file named 'd/'
        assert [m.name for m in tarfile.open(fileobj=io.BytesIO(raw)) if m.isfile()] == ["d/a.txt"]


@pytest.mark.parametrize("version", ["0.0", "0.1", "1.0"])
def test_pax_sparse_files_are_expanded(tmp_path, kit, reader, version):
    src = tmp_path / "src"
    src.mkdir()
    write_sparse_file(src / "sparse.bin", regions=10)
    (src / "z.txt").write_bytes(b"after")
    archive = tmp_path / f"pax{version}.tar"
    kit.gnu_tar("-cf", str(archive), "--format=pax", "--sparse", f"--sparse-version={version}", "-C", str(src),
                "sparse.bin", "z.txt")
    raw = archive.read_bytes()
    if b"GNU.sparse" not in raw[:8192]:
        pytest.skip("this file system does not keep holes: GNU tar stored the file as a plain one")
    assert {n: d for n, d, _ in kit.read_all(raw, chunked=5)} == extracted(kit, archive, tmp_path)
    with pytest.raises(TarFormatError, match="member size 2000100 exceeds the limit of 1000000 bytes"):
        kit.read_all(raw, max_member_size=1_000_000)


def test_sparse_maps_that_do_not_fit_are_errors(kit, reader):
    def sparse(entries: list[tuple[int, int]], real: int, data: bytes) -> bytes:
        head = bytearray(kit.header("s.bin", len(data), typeflag=b"S", magic=b"ustar  \x00"))
        for i, (at, n) in enumerate(entries):
            head[386 + 24 * i: 386 + 24 * i + 24] = b"%011o\x00%011o\x00" % (at, n)
        head[483:495] = b"%011o\x00" % real
        head[148:156] = b" " * 8
        head[148:156] = b"%06o\x00 " % sum(head)
        return kit.archive(bytes(head) + kit.pad(data))

    assert kit.read_all(sparse([(0, 2), (10, 3)], 16, b"abxyz")) == [("s.bin", b"ab" + bytes(8) + b"xyz" + bytes(3), 0)]
    with pytest.raises(TarFormatError, match="regions overlap or pass the file's size"):
        kit.read_all(sparse([(0, 2), (15, 3)], 16, b"abxyz"))
    with pytest.raises(TarFormatError, match="covers 4 of the member's 5 bytes"):
        kit.read_all(sparse([(0, 2), (10, 2)], 16, b"abxyz"))


def test_a_long_old_gnu_sparse_map_is_read_in_linear_time_and_memory(kit):
    """Extension blocks that claim to go on for 32 MiB: read block by block (the map is checked as
    it goes), not by growing one buffer (quadratic time, twice the memory)."""
    head = bytearray(kit.header("s.bin", 0, typeflag=b"S", magic=b"ustar  \x00"))
    head[482] = 1
    head[148:156] = b" " * 8
    head[148:156] = b"%06o\x00 " % sum(head)
    ext = bytearray(512)
    ext[504] = 1
    raw = bytes(head) + bytes(ext) * (32 << 11)  # 32 MiB of extension blocks, then the stream ends
    tracemalloc.start()
    try:
        with pytest.raises(TarFormatError, match="truncated GNU sparse header"):
            list(iter_members(Unseekable(raw), "s.tar"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak


def test_a_huge_pax_size_is_a_format_error(kit, reader):
    raw = kit.archive(kit.pax({"size": "9" * 5000}), kit.member("a.txt", b"x"))
    with pytest.raises(TarFormatError, match="bad size in pax header"):
        kit.read_all(raw)


def test_concatenated_archives_with_ignore_zeros(tmp_path, kit, reader):
    first = kit.writer_tar([("a/1.txt", b"one"), ("a/1.cls", b"1")])
    second = kit.writer_tar([("b/2.txt", b"two")])
    raw = first + second
    with pytest.raises(TarFormatError, match="garbage after the end-of-archive blocks"):
        kit.read_all(raw)
    got = [(n, d) for n, d, _ in kit.read_all(raw, ignore_zeros=True, chunked=7)]
    assert got == [("a/1.txt", b"one"), ("a/1.cls", b"1"), ("b/2.txt", b"two")]
    archive = tmp_path / "cat.tar"
    archive.write_bytes(raw)
    listed = subprocess.run(["tar", "-i", "-tf", str(archive)], capture_output=True, text=True, check=True).stdout.split()
    assert listed == [n for n, _ in got]
    assert [k for k, _, _, _ in iter_keyed_members(io.BytesIO(raw), ignore_zeros=True)] == ["a/1", "a/1", "b/2"]
    # still an error: garbage after the zeros, or a stream that ends inside a header
    with pytest.raises(TarFormatError, match="bad tar header checksum"):
        kit.read_all(first + b"x" * 512, ignore_zeros=True)


def test_the_file_is_read_again_only_before_the_link(tmp_path, kit, reader):
    """Read again from the file, a link gets the last member of its target's name *before* it: not
    a later one, and a forward link stays an error (found in review)."""
    later = kit.archive(kit.member("x.txt", b"OLD"), kit.header("y.txt", typeflag=b"1", linkname=b"x.txt"),
                        kit.member("x.txt", b"NEW"))
    forward = kit.archive(kit.member("a.txt", b"A"), kit.header("b.txt", typeflag=b"1", linkname=b"c.txt"),
                          kit.member("c.txt", b"C"))
    for name, raw in (("later", later), ("forward", forward)):
        (tmp_path / f"{name}.tar").write_bytes(raw)
    with open(tmp_path / "later.tar", "rb") as f:
        assert [(n, d) for n, d, _ in iter_members(f, link_cache=0)] == [("x.txt", b"OLD"), ("y.txt", b"OLD"),
                                                                         ("x.txt", b"NEW")]
    with open(tmp_path / "forward.tar", "rb") as f, pytest.raises(LinkError, match="'b.txt' -> 'c.txt'"):
        list(iter_members(f, link_cache=0))


def test_a_fifo_is_not_read_again(tmp_path, kit):
    """A named pipe (bash's <(...)) is a FileIO that can't seek: a link outside the recent members
    is a LinkError, not an internal error (found in review)."""
    import threading

    raw = kit.archive(kit.member("t.bin", b"T" * 5000), kit.header("l.bin", typeflag=b"1", linkname=b"t.bin"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(raw))
    writer.start()
    try:
        with open_source(str(fifo)) as source, pytest.raises(LinkError, match="'l.bin' -> 't.bin'"):
            list(iter_members(source, str(fifo), link_cache=0))
    finally:
        writer.join(timeout=10)


def test_links_to_members_many_reads_back_with_the_same_window_on_both_paths(kit, reader):
    """Thousands of small members over many 1 MiB reads, hard and symbolic links to members read
    just now and a read or so back, and one to a member out of the 4 MiB cache: found or refused
    alike by both paths (the C path remembers its buffers and scans them again on the first link;
    it forgets whole buffers, so the window of a small cache is not the same on the two paths)."""
    parts = []
    want: dict[str, bytes] = {}
    for i in range(6000):
        name, data = f"s/{i:05d}.bin", bytes([i % 251]) * (100 + i % 900)
        parts.append(kit.member(name, data))
        want[name] = data
        if i % 997 == 996:  # links to members 1, 50 and 500 back
            for back, kind in ((1, b"1"), (50, b"2"), (500, b"1")):
                target = f"s/{i - back:05d}.bin"
                link = f"s/{i:05d}-{back}.lnk"
                parts.append(kit.header(link, typeflag=kind, linkname=(target if kind == b"1" else target[2:]).encode()))
                want[link] = want[target]
    parts.append(kit.header("s/late.lnk", typeflag=b"1", linkname=b"s/00000.bin"))  # some 5 MiB back
    archive = kit.archive(*parts)
    # a stream that can't go back: the 4 MiB default holds all but the first member's link
    with pytest.raises(LinkError, match="'s/late.lnk' -> 's/00000.bin': no earlier member .* within the last 4 MiB"):
        list(iter_members(Unseekable(archive)))
    got = {}
    with pytest.raises(LinkError):
        for name, data, _ in iter_members(Unseekable(archive)):
            got[name] = data
    assert got == want
    got_keyed = []
    with pytest.raises(LinkError, match="'s/late.lnk' -> 's/00000.bin'"):
        for key, field, data, _ in iter_keyed_members(Unseekable(archive)):
            got_keyed.append((f"{key}.{field}", data))
    assert dict(got_keyed) == want


def test_views_give_the_same_members_as_copies_and_stay_valid(kit, reader):
    """iter_keyed_members(views=True): big data may come as read-only views of what was read; the
    same bytes as without views, whatever is read after, on both reader paths (the Python path
    gives bytes)."""
    sizes = [0, 1, 70_000, 65_535, 65_536, 300_000, 5, 2_000_000, 100_000, 100_000, 100_000]
    members = [(f"k{i:03d}.bin", bytes([i % 251]) * size) for i, size in enumerate(sizes)]
    archive = kit.writer_tar(members)
    stream = kit.ChunkedReader(archive, seed=3, max_piece=1 << 20)
    got = list(iter_keyed_members(stream, views=True))  # all read before any is looked at
    assert [(f"{k}.{f}", bytes(d)) for k, f, d, _ in got] == members
    kinds = {type(d) for _, _, d, _ in got if len(d) >= 1 << 16}
    assert kinds == ({bytes, memoryview} if reader == "c-fastpath" else {bytes})  # a member across reads: bytes
    for _, _, data, _ in got:
        if isinstance(data, memoryview):
            assert data.readonly and isinstance(data.obj, bytes) and len(data) >= 1 << 16
    plain = list(iter_keyed_members(kit.ChunkedReader(archive, seed=3, max_piece=1 << 20)))
    assert {type(d) for _, _, d, _ in plain} == {bytes}
    assert [(k, f, bytes(d), o) for k, f, d, o in got] == plain


def test_a_link_finds_its_target_by_exact_name(kit, reader):
    """The sample readers know fields lower-cased; a link still names a member: ``a.TXT`` is not ``a.txt``."""
    raw = kit.archive(kit.member("a.txt", b"lower"), kit.header("b.txt", typeflag=b"1", linkname=b"a.TXT"))
    with pytest.raises(LinkError, match="hard link 'b.txt' -> 'a.TXT': no earlier member"):
        kit.read_all(raw, keyed=True)
    same = kit.archive(kit.member("a.TXT", b"upper"), kit.header("b.txt", typeflag=b"1", linkname=b"a.TXT"))
    assert [(k, f, d) for k, f, d, _ in kit.read_all(same, keyed=True)] == [("a", "txt", b"upper"), ("b", "txt", b"upper")]


def test_links_read_again_from_the_file_are_charged_to_the_cache(tmp_path, kit, reader):
    """300 hard links to an 8 MiB member that has left the 4 MiB cache: each is read again from the
    file, and those bytes count against the cache, so they leave it too (not 2.4 GB held)."""
    parts = [kit.member("big.bin", b"b" * (8 << 20)), kit.member("pad.bin", b"p" * (5 << 20))]
    parts += [kit.header(f"l{i:03d}.bin", typeflag=b"1", linkname=b"big.bin") for i in range(300)]
    path = tmp_path / "links.tar"
    path.write_bytes(kit.archive(*parts))
    tracemalloc.start()
    try:
        n = 0
        with open_source(str(path)) as source:
            for _, data, _ in iter_members(source, str(path)):
                n += 1
                del data
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert n == 302 and peak < 100 << 20


def test_a_symbolic_link_whose_target_name_comes_again_is_said(kit, reader):
    """Streaming reads the link as the earlier member's bytes; GNU tar's extracted link would read the
    later one's: said when the name comes again (once)."""
    raw = kit.archive(kit.member("a.txt", b"first"), kit.header("b.txt", typeflag=b"2", linkname=b"a.txt"),
                      kit.member("a.txt", b"second"), kit.member("a.txt", b"third"))
    said: list[str] = []
    stats = ReadStats()
    stats.warn = said.append
    got = [(n, d) for n, d, _ in iter_members(io.BytesIO(raw), "mem.tar", stats=stats)]
    assert got == [("a.txt", b"first"), ("b.txt", b"first"), ("a.txt", b"second"), ("a.txt", b"third")]
    assert said == ["mem.tar: 'a.txt' comes again (at byte 1536) after symbolic link 'b.txt' -> 'a.txt' was read as "
                    "its earlier bytes (GNU tar's extracted link would read the later)"]


def test_a_link_to_an_earlier_link_is_found_when_both_have_left_the_cache(tmp_path, kit, reader):
    parts = [kit.member("a.bin", b"a" * (5 << 20)), kit.header("b.bin", typeflag=b"1", linkname=b"a.bin"),
             kit.member("pad.bin", b"p" * (5 << 20)), kit.header("c.bin", typeflag=b"2", linkname=b"b.bin")]
    archive = tmp_path / "chain.tar"
    archive.write_bytes(kit.archive(*parts))
    with open_source(str(archive)) as source:
        got = {n: d for n, d, _ in iter_members(source, str(archive))}
    assert got["c.bin"] == got["b.bin"] == b"a" * (5 << 20)  # was: "no earlier member of this shard has that name"
    assert {n: d for n, d in got.items() if n != "c.bin"} == extracted(kit, archive, tmp_path)  # c: a symlink there


def test_links_to_a_sparse_member_expand_it_once(tmp_path, kit, reader, monkeypatch):
    """Each link to a sparse member that left the cache used to scan the shard from its start and
    expand every sparse member before it again: now the last expanded ones are kept."""
    import tarproc.tar as tario

    src = tmp_path / "src"
    src.mkdir()
    write_sparse_file(src / "sparse.bin", regions=10)
    (src / "pad.bin").write_bytes(b"p" * (5 << 20))
    for i in range(8):
        os.link(src / "sparse.bin", src / f"l{i}.bin")
    archive = tmp_path / "sparse-links.tar"
    kit.gnu_tar("-cf", str(archive), "--format=pax", "--sparse", "-C", str(src), "sparse.bin", "pad.bin",
                *[f"l{i}.bin" for i in range(8)])
    if b"GNU.sparse" not in archive.read_bytes()[:8192]:
        pytest.skip("this file system does not keep holes: GNU tar stored the file as a plain one")
    scans = []
    real = tario.MemberFinder._scan
    monkeypatch.setattr(tario.MemberFinder, "_scan", lambda self, record: scans.append(record) or real(self, record))
    with open_source(str(archive)) as source:
        got = {n: d for n, d, _ in iter_members(source, str(archive))}
    assert got == extracted(kit, archive, tmp_path)
    assert sum(1 for record in scans if record is None) == 1  # one re-expansion for 8 links
