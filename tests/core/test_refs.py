"""Data left in the file (``refs=True``, ``tario.FileRange``) and copied by the kernel
(``Sink.write_range``: ``os.sendfile``): the same members, the same errors and the same output
bytes as reading and writing the data, on both reader paths and to every kind of destination.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import random
import subprocess
import sys

import pytest

import tarproc.tar.writer as tar_writer
from tarproc.errors import SourceError, TarFormatError, TarprocError
from tarproc.sinks import open_sink
from tarproc.sources import open_source
from tarproc.tar import FileRange, TarWriter, iter_keyed_members, iter_members

from .test_parity import _damaged_variants, _varied_archives

BIG = 1 << 16  # data this big may be left in the file


def _archives(kit) -> dict[str, bytes]:
    rng = random.Random(7)
    archives = dict(_varied_archives(kit))
    # big members at and around the threshold, across the reader's reads, between small ones
    sizes = [BIG - 1, BIG, BIG + 1, 100_000, 3, 1 << 20, (1 << 20) - 512, 700_000, 0, 2_500_001, 90_000, 90_000]
    archives["big-members"] = kit.writer_tar(
        (f"s{i // 3:04d}.{'abc'[i % 3]}", rng.randbytes(size)) for i, size in enumerate(sizes * 4)
    )
    # what the C scanner leaves to Python around big data: pax and long names, links to big members
    archives["big-dialects"] = kit.archive(
        kit.member("k0.jpg", b"J" * 150_000),
        kit.pax({"path": "k1." + "p" * 150, "size": "80000"}),
        kit.header("ignored", 7) + kit.pad(b"P" * 80_000),
        kit.member("././@LongLink", b"k2." + b"L" * 150 + b"\x00", typeflag=b"L", magic=b"ustar  \x00"),
        kit.member("short-in-header", b"G" * 70_000, magic=b"ustar  \x00"),
        kit.header("k3.lnk", typeflag=b"1", linkname=b"k0.jpg"),
        kit.member("k4.bin", b"V" * 200_000, typeflag=b"\x00", magic=b""),
        kit.member("k5.txt", b"end"),
    )
    return archives


def _read(path, mode: str, **kw):
    """The keyed members of a local file, read as mode says ("refs": ranges, read at once, before the
    file closes; "file": plain reading; "memory": the same bytes from a BytesIO, the reference),
    and the types of data seen."""
    items, kinds = [], set()
    with (open_source(str(path)) if mode != "memory" else io.BytesIO(path.read_bytes())) as stream:
        try:
            for key, field, data, offset in iter_keyed_members(stream, str(path), views=mode == "refs",
                                                               refs=mode == "refs", **kw):
                kinds.add(type(data))
                items.append((key, field, data.read() if type(data) is FileRange else bytes(data), offset))
        except TarprocError as e:
            return items, (type(e).__name__, e.offset, e.reason, e.member), kinds
    return items, None, kinds


def test_ranges_give_the_members_and_errors_of_reading(kit, reader, tmp_path):
    """Valid and damaged archives: with refs, and reading a file plainly, the same members, offsets
    and errors (offset, reason, member) as reading the bytes from memory; and big members of a
    plain file do come as ranges with refs, as bytes without."""
    path = tmp_path / "a.tar"
    ranged = 0
    for name, raw in _archives(kit).items():
        variants = [("whole", raw)]
        if name.startswith("big"):
            variants += list(_damaged_variants(raw, seed=len(name), count=30))
            # views, not copies: some seventy cuts of a 5.7 MB archive took 9 s to copy here
            variants += [(f"cut@{cut}", memoryview(raw)[:cut]) for cut in range(BIG, len(raw), 77_777)]
        for label, data in variants:
            path.write_bytes(data)
            got = _read(path, "refs")
            plain = _read(path, "file")
            want = _read(path, "memory")
            assert got[:2] == want[:2], (name, label)
            assert plain[:2] == want[:2], (name, label)
            ranged += FileRange in got[2]
            assert plain[2] <= {bytes} and want[2] <= {bytes}
    assert ranged > 40


def test_range_reading_skips_the_data(kit, tmp_path):
    """Most bytes of big members are never read into the process."""
    raw = _archives(kit)["big-members"]
    path = tmp_path / "a.tar"
    path.write_bytes(raw)
    with open_source(str(path)) as stream:
        reads = []
        read = stream.read
        stream.read = lambda n=-1: reads.append(len(got := read(n))) or got  # type: ignore[method-assign]
        members = list(iter_keyed_members(stream, views=True, refs=True))
        assert len(members) == 48
    assert sum(reads) < len(raw) / 4


def test_plain_reading_of_a_file_reads_big_data_once(kit, reader, tmp_path):
    """Without refs, a plain file's big members that run past the buffer are read with pread into
    bytes of their own (the stream skips them), not through the buffer; all data is bytes."""
    raw = _archives(kit)["big-members"]
    path = tmp_path / "a.tar"
    path.write_bytes(raw)
    preads = []
    real_pread = os.pread
    with open_source(str(path)) as stream:
        reads = []
        read = stream.read
        stream.read = lambda n=-1: reads.append(len(got := read(n))) or got  # type: ignore[method-assign]
        os.pread = lambda fd, n, at: preads.append(n) or real_pread(fd, n, at)  # type: ignore[assignment]
        try:
            members = [(k, f, d, o) for k, f, d, o in iter_keyed_members(stream, str(path))]
        finally:
            os.pread = real_pread
    assert members == _read(path, "memory")[0] and {type(d) for _, _, d, _ in members} == {bytes}
    assert sum(reads) < len(raw) / 4 and sum(preads) > len(raw) * 3 / 4


def test_a_link_to_big_data_read_with_pread_is_its_bytes(kit, reader, tmp_path):
    """A link to a member that was read with pread (the last of a scanned buffer) gets its bytes,
    from the buffers the link cache keeps, as from a stream."""
    target = bytes(range(256)) * 1200  # 307,200 bytes: past the end of the first 512 KiB read
    raw = kit.archive(
        kit.member("a.bin", b"A" * 400_000),
        kit.member("b.bin", target),
        kit.header("c.bin", typeflag=b"1", linkname=b"b.bin"),
        kit.header("d.bin", typeflag=b"1", linkname=b"a.bin"),
    )
    path = tmp_path / "a.tar"
    path.write_bytes(raw)
    with open_source(str(path)) as stream:
        got = {k: d for k, _, d, _ in iter_keyed_members(stream, str(path))}
    assert got == {"a": b"A" * 400_000, "b": target, "c": target, "d": b"A" * 400_000}
    assert {type(d) for d in got.values()} == {bytes}
    assert got == {k: d for k, _, d, _ in _read(path, "memory")[0]} | {"c": target, "d": b"A" * 400_000}


def test_ranges_only_from_plain_local_files(kit, tmp_path):
    raw = _archives(kit)["big-members"]
    gz = tmp_path / "a.tar.gz"
    gz.write_bytes(gzip.compress(raw))
    for stream in (open_source(str(gz)), open_source(f"pipe:cat {tmp_path / 'a.tar.gz'}")):
        with stream:
            kinds = {type(d) for _, _, d, _ in iter_keyed_members(stream, views=True, refs=True)}
        assert FileRange not in kinds


def _open_fds():
    return len(os.listdir("/proc/self/fd"))


def test_a_range_holds_its_file_until_it_is_let_go_of(kit, tmp_path):
    """A range stays valid after its stream is closed (a shuffle buffer keeps it) and reads the
    file it came from, even once another file has its name; the file closes with the last range."""
    path = tmp_path / "a.tar"
    original = _archives(kit)["big-members"]
    path.write_bytes(original)
    before = _open_fds()
    with open_source(str(path)) as stream:
        ranges = [d for _, _, d, _ in iter_keyed_members(stream, str(path), refs=True) if type(d) is FileRange]
    assert len(ranges) > 1 and len({id(r.file) for r in ranges}) == 1  # one descriptor for the stream's ranges
    assert _open_fds() == before + 1
    replaced = tmp_path / "new.tar"
    replaced.write_bytes(b"\0" * len(original))
    os.replace(replaced, path)  # what a rewrite of the shard does
    for r in ranges:
        assert r.read() == original[r.offset : r.offset + r.size]
        assert bytes(r.read_into(bytearray(r.size + 7))) == original[r.offset : r.offset + r.size]
    del r, ranges
    assert _open_fds() == before


@pytest.mark.parametrize("preadv", [True, False])
def test_read_into_gives_the_bytes_with_or_without_preadv(tmp_path, monkeypatch, preadv):
    import tarproc.tar.ranges as ranges

    if not preadv:
        monkeypatch.setattr(ranges, "_preadv", None)  # as on macOS
    monkeypatch.setattr(ranges, "PIECE", 64)  # several reads a range
    path = tmp_path / "a.bin"
    data = bytes(range(256)) * 4
    path.write_bytes(data)
    with open(path, "rb", buffering=0) as f:
        buffer = bytearray(600)
        assert bytes(FileRange(f, 7, 500, str(path)).read_into(buffer)) == data[7:507]


def test_a_range_on_a_closed_file_is_refused(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"x" * 100)
    with open(path, "rb", buffering=0) as f:
        r = FileRange(f, 10, 20, str(path))
    with pytest.raises(ValueError):
        r.read()
    with pytest.raises(ValueError):
        r.fileno()


def test_reading_a_range_into_a_buffer_of_a_file_changed_since_is_an_error_naming_it(kit, tmp_path):
    """A range the reader made (its file held) checks that the file was not modified since (its
    mtime); on any open file, a file now short of the data says where it ends."""
    path = tmp_path / "a.tar"
    path.write_bytes(_archives(kit)["big-members"])
    with open_source(str(path)) as stream:
        ranges = [d for _, _, d, _ in iter_keyed_members(stream, str(path), refs=True) if type(d) is FileRange]
    last = ranges[-1]
    os.truncate(path, last.offset + 10)
    with pytest.raises(SourceError, match=r"a\.tar: the file was modified after its member headers were read"):
        last.read_into(bytearray(last.size))
    with open(path, "rb", buffering=0) as f:
        with pytest.raises(SourceError, match=rf"a\.tar: the file ends at byte {last.offset + 10}, short of member data"):
            FileRange(f, last.offset, last.size, str(path)).read_into(bytearray(last.size))


def _write_all(sink_or_stream, path):
    """tarcat's work: every sample of the local file at path written to the sink as it comes."""
    from tarproc.samples import read_samples

    writer = TarWriter(sink_or_stream)
    for sample in read_samples(str(path), views=True, refs=True):
        writer.write_sample(sample)
    writer.close()


@pytest.mark.parametrize("writer_path", ["c", "python"])
def test_written_ranges_are_the_same_bytes_to_every_destination(kit, tmp_path, monkeypatch, writer_path):
    """A file (sendfile), a file opened to append (sendfile refuses: read and write), a pipe,
    a sha256 sink, a gzip sink and a BytesIO: all get what writing the bytes gives."""
    if writer_path == "python":
        monkeypatch.setattr(tar_writer, "_pack", None)
    raw = _archives(kit)["big-members"]
    src = tmp_path / "a.tar"
    src.write_bytes(raw)
    want = io.BytesIO()
    writer = TarWriter(want)
    for sample in __import__("tarproc").read_samples(str(src)):
        writer.write_sample(sample)
    writer.close()
    want_bytes = want.getvalue()

    out = tmp_path / "out.tar"
    with open_sink(str(out), digest=True) as sink:
        _write_all(sink, src)
    assert out.read_bytes() == want_bytes
    assert sink.sha256 == hashlib.sha256(want_bytes).hexdigest() and sink.bytes == len(want_bytes)

    with open_sink(str(tmp_path / "out.tar.gz")) as sink:
        _write_all(sink, src)
    assert gzip.decompress((tmp_path / "out.tar.gz").read_bytes()) == want_bytes

    appended = tmp_path / "appended.tar"
    appended.write_bytes(b"x" * 512)
    with open(appended, "ab", buffering=0) as fh:
        sink = open_sink("-", force=True)
        sink._start(fh)  # stdout redirected with >>: O_APPEND, where sendfile says EINVAL
        _write_all(sink, src)
        sink.commit()
    assert appended.read_bytes() == b"x" * 512 + want_bytes

    memory = io.BytesIO()
    _write_all(memory, src)
    assert memory.getvalue() == want_bytes

    r, w = os.pipe()
    piped = tmp_path / "piped.tar"
    with open(piped, "wb") as copy:
        reader = subprocess.Popen(["cat"], stdin=r, stdout=copy)
    os.close(r)
    with open(w, "wb", buffering=0) as fh:
        sink = open_sink("-", force=True)
        sink._start(fh)
        _write_all(sink, src)
        sink.commit()
    assert reader.wait(timeout=60) == 0 and piped.read_bytes() == want_bytes


def test_a_file_cut_after_it_was_read_is_an_error_naming_it(kit, tmp_path):
    """The data is copied after the headers were read: a file cut in between is a SourceError, not
    a short member."""
    path = tmp_path / "a.tar"
    path.write_bytes(_archives(kit)["big-members"])
    out = tmp_path / "out.tar"
    with pytest.raises(SourceError, match=r"a\.tar: the file ends at byte \d+, short of member data"):
        with open_sink(str(out)) as sink, open_source(str(path)) as stream:
            for _, _, data, _ in iter_keyed_members(stream, str(path), views=True, refs=True):
                if type(data) is FileRange:
                    os.truncate(path, data.offset + 10)
                    sink.write_range(data)
    assert not out.exists() and os.listdir(tmp_path) == ["a.tar"]
    with open_source(str(path)) as stream, pytest.raises(SourceError, match="the file ends at byte"):
        os.truncate(path, 0)
        FileRange(stream.raw, 512, 1000, str(path)).read()


def _tarcat(*args, **kw):
    return subprocess.run([sys.executable, "-m", "tarproc.cli.tarcat", *args], capture_output=True, **kw)


def test_tarcat_from_a_file_equals_tarcat_from_a_pipe(kit, tmp_path):
    """Through the command: a file read with ranges (to a file, a pipe, a file opened to append,
    and a file given as stdin, at its start or further on) gives the bytes a pipe gives."""
    raw = _archives(kit)["big-members"]
    path = tmp_path / "a.tar"
    path.write_bytes(raw)
    piped = _tarcat(input=raw).stdout
    assert piped and _tarcat(str(path)).stdout == piped
    out = tmp_path / "o.tar"
    assert _tarcat(str(path), "-o", str(out)).returncode == 0 and out.read_bytes() == piped
    with open(out, "ab") as fh:
        assert subprocess.run([sys.executable, "-m", "tarproc.cli.tarcat", str(path)], stdout=fh).returncode == 0
    assert out.read_bytes() == piped * 2
    with open(path, "rb") as fh:
        assert _tarcat(stdin=fh).stdout == piped
    shifted = tmp_path / "shifted"
    shifted.write_bytes(b"\x01" * 1536 + raw)
    with open(shifted, "rb") as fh:
        fh.seek(1536)
        assert _tarcat(stdin=fh).stdout == piped


def test_ranges_from_a_source_read_in_part_first(kit, tmp_path):
    """A reader that starts where a Source already is counts offsets from there: its ranges point
    at the right bytes (they pointed that much too early once)."""
    raw = kit.writer_tar([("a.txt", b"x" * 100), ("b.bin", bytes(range(256)) * 1000), ("c.bin", b"C" * 3_000_000)])
    path = tmp_path / "a.tar"
    path.write_bytes(raw)
    for refs in (False, True):
        with open_source(str(path)) as stream:
            got = 0
            while got < 1024:  # a.txt: its header and its data block
                got += len(stream.read(1024 - got))
            members = [(k, f, d.read() if type(d) is FileRange else bytes(d), o)
                       for k, f, d, o in iter_keyed_members(stream, str(path), views=True, refs=refs)]
        assert [(k, f, d) for k, f, d, _ in members] == [("b", "bin", bytes(range(256)) * 1000),
                                                          ("c", "bin", b"C" * 3_000_000)]


def test_a_destination_sendfile_refuses_is_written_by_reading(kit, tmp_path, monkeypatch):
    """sendfile failing before it sent anything (ENOTSOCK on some systems, EINVAL for a file opened
    to append) falls back to reading and writing, for the rest of the sink's life."""
    import errno

    calls = []

    def refusing(*args):
        calls.append(args)
        raise OSError(errno.ENOTSOCK, "Socket operation on non-socket")

    monkeypatch.setattr(os, "sendfile", refusing)
    raw = _archives(kit)["big-members"]
    src = tmp_path / "a.tar"
    src.write_bytes(raw)
    out = tmp_path / "out.tar"
    with open_sink(str(out)) as sink:
        _write_all(sink, src)
    assert len(calls) == 1 and out.read_bytes() == _tarcat(str(src)).stdout


def test_a_file_given_as_stdin_is_read_as_a_file(kit, tmp_path):
    """'< file' is a regular file on stdin: read from where it stands, with seeks and ranges, and
    left open; a pipe on stdin is read as a stream."""
    raw = _archives(kit)["big-members"]
    path = tmp_path / "a.tar"
    path.write_bytes(b"\x01" * 1024 + raw)
    with open(path, "rb", buffering=0) as fh:
        fh.seek(1024)
        with open_source("-", stdin=fh) as stream:
            assert stream.file_origin() is not None
            items = [(k, f, d.read() if type(d) is FileRange else bytes(d), o)
                     for k, f, d, o in iter_keyed_members(stream, "-", views=True, refs=True)]
        assert not fh.closed
    with open(tmp_path / "b.tar", "wb") as f:
        f.write(raw)
    assert items == _read(tmp_path / "b.tar", "memory")[0]
    r, w = os.pipe()
    with open(r, "rb") as piped, open(w, "wb") as writer:
        writer.write(b"x")
        writer.close()
        assert open_source("-", stdin=piped).file_origin() is None


class _StreamOnly:
    """A Source as a stream alone: read (and links read back), no seeks, no ranges -- the reference."""

    def __init__(self, source):
        self.read, self.member_rereader = source.read, source.member_rereader


def _read_while(path, raw, change, wrap):
    """Members' names read from path (holding raw) while ``change(path)`` runs after the first
    member, and the error (type, offset, reason, member) that ended the read, if any."""
    path.write_bytes(raw)
    names = []
    try:
        with open_source(str(path)) as source:
            members = iter_members(wrap(source), str(path))
            names.append(next(members)[0])
            change(path)
            for name, _, _ in members:
                names.append(name)
    except TarprocError as e:
        return names, (type(e).__name__, e.offset, e.reason, e.member)
    return names, None


def test_a_file_cut_or_grown_while_read_reads_as_a_stream_does(kit, reader, tmp_path):
    """Data read with pread that the file no longer holds is truncated member data, after the
    members before it, as reading the same file as a stream says; data appended since reading
    began (a file still being written) is read, not called truncated."""
    rng = random.Random(0)
    small = [kit.member(f"s{i}.txt", b"x" * 100) for i in range(10)]
    # cut past what a stream reads ahead before it hands out m1 (a chunk, 512 KiB, past m1's end)
    raw = kit.archive(kit.member("m1.bin", rng.randbytes(600_000)), *small, kit.member("m2.bin", rng.randbytes(1_200_000)))
    cut = raw.index(b"m2.bin") + 512 + 700_000
    path = tmp_path / "a.tar"

    def shrink(p):
        os.truncate(p, cut)

    got = _read_while(path, raw, shrink, lambda s: s)
    assert got == _read_while(path, raw, shrink, _StreamOnly)
    assert len(got[0]) == 11 and got[1] == ("TarFormatError", cut, "truncated member data (expected 1200000 "
                                            "bytes, got 700000)", "m2.bin")

    first = 600_000 + 2 * 512 + 100_000  # m1, m2's header and some of its data

    two = kit.archive(kit.member("m1.bin", rng.randbytes(600_000)), kit.member("m2.bin", rng.randbytes(600_000)))

    def grow(p):
        with open(p, "ab") as f:
            f.write(two[first:])

    path.write_bytes(two[:first])
    names = []
    with open_source(str(path)) as source:
        members = iter_members(source, str(path))
        names.append(next(members)[0])
        grow(path)
        names += [name for name, _, _ in members]
    assert names == ["m1.bin", "m2.bin"]


def test_a_link_read_back_from_stdin_positioned_further_on(kit, tmp_path):
    """stdin, a file positioned past an earlier archive: a link whose target the reader no longer
    holds is read back from where the reader started, not from the file's first byte."""
    first = kit.archive(kit.member("a.bin", b"FIRST" * 60_000))
    second = kit.archive(kit.member("a.bin", b"SECOND" * 20_000), kit.header("l.bin", typeflag=b"1", linkname=b"a.bin"))
    path = tmp_path / "two.tar"
    path.write_bytes(first + second)
    with open(path, "rb", buffering=0) as fh:
        fh.seek(len(first))
        with open_source("-", stdin=fh) as source:
            got = {name: data for name, data, _ in iter_members(source, "-", link_cache=0)}
    assert got == {"a.bin": b"SECOND" * 20_000, "l.bin": b"SECOND" * 20_000}


def test_big_members_after_small_ones_are_left_in_the_file_too(tmp_path):
    """Captions of a few KiB between the images (LAION's layout): after the small read that
    follows a skipped member comes one of 64 KiB, not a whole chunk, so the next images' data is
    still past what was read, and left in the file like the first one's."""
    from tarproc.samples import read_samples

    rng = random.Random(0)
    samples = [{"__key__": f"k{i:03d}", "json": b"{" + b"x" * rng.randrange(3000, 9000) + b"}",
                "jpg": rng.randbytes(rng.randrange(70_000, 120_000))} for i in range(40)]
    path = tmp_path / "laion.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        for sample in samples:
            w.write_sample(sample)
    got = list(read_samples(str(path), refs=True))
    assert [type(s["jpg"]) for s in got] == [FileRange] * 40
    assert [s["jpg"].read() for s in got] == [s["jpg"] for s in samples]
    assert [s["json"] for s in got] == [s["json"] for s in samples]


def test_without_a_descriptor_to_spare_the_data_is_read(kit, tmp_path, monkeypatch):
    """refs where os.dup fails (EMFILE): the members' bytes, as reading gives them; a cut member
    is the reader's own truncation error."""
    import errno

    import tarproc.tar.ranges as ranges

    def no_dup(fd):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(ranges.os, "dup", no_dup)
    path = tmp_path / "a.tar"
    data = _archives(kit)["big-members"]
    path.write_bytes(data)
    with open_source(str(path)) as stream:
        got = [(k, f, d) for k, f, d, _ in iter_keyed_members(stream, str(path), refs=True)]
    with open_source(str(path)) as stream:
        want = [(k, f, bytes(d)) for k, f, d, _ in iter_keyed_members(stream, str(path))]
    assert got == want and all(type(d) is bytes for _, _, d in got)
    path.write_bytes(data[: len(data) // 2])
    with open_source(str(path)) as stream, pytest.raises(TarFormatError, match="truncated member data"):
        list(iter_keyed_members(stream, str(path), refs=True))
