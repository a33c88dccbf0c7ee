"""Sinks: atomic local files, compression by suffix, stdout safety, devices, pipes."""

from __future__ import annotations

import hashlib
import io
import os
import random
import shutil
import stat
import subprocess
import threading

import pytest

import tarproc.sinks as sinks
from tarproc.errors import SinkError
from tarproc.sinks import open_sink
from tarproc.sources import open_source
from tarproc.tar import TarWriter, iter_members


def _tar_bytes() -> bytes:
    buf = io.BytesIO()
    with TarWriter(buf, mtime=0) as w:
        for i in range(20):
            w.write_sample({"__key__": f"{i:04d}", "txt": f"text {i} " * 100, "cls": i})
    return buf.getvalue()


def _temps(directory) -> list[str]:
    return [n for n in os.listdir(directory) if ".tmp-" in n]


def test_local_sink_is_atomic(tmp_path):
    path = tmp_path / "out.tar"
    data = _tar_bytes()
    with open_sink(str(path)) as sink:
        sink.write(data[:5000])
        assert not path.exists()
        temps = _temps(tmp_path)
        assert len(temps) == 1 and temps[0].startswith(".out.tar.tmp-")
        sink.write(data[5000:])
        assert not path.exists()
    assert path.read_bytes() == data
    assert _temps(tmp_path) == []
    assert sink.bytes == len(data)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_exception_leaves_nothing_behind(tmp_path, exc):
    path = tmp_path / "out.tar.gz"
    with pytest.raises(exc):
        with open_sink(str(path)) as sink:
            sink.write(b"x" * 100_000)
            raise exc()
    assert os.listdir(tmp_path) == []


def test_exception_keeps_the_previous_file(tmp_path):
    path = tmp_path / "out.tar"
    path.write_bytes(b"old contents")
    with pytest.raises(RuntimeError):
        with open_sink(str(path)) as sink:
            sink.write(b"new")
            assert path.read_bytes() == b"old contents"
            raise RuntimeError
    assert path.read_bytes() == b"old contents"
    assert os.listdir(tmp_path) == ["out.tar"]
    with open_sink(str(path)) as sink:
        sink.write(b"new")
    assert path.read_bytes() == b"new"


def test_explicit_commit_and_abort(tmp_path):
    path = tmp_path / "a.tar"
    sink = open_sink(str(path))
    sink.write(b"abc")
    sink.abort()
    assert os.listdir(tmp_path) == []
    sink.abort()  # twice is harmless
    sink = open_sink(str(path))
    sink.write(b"abc")
    sink.commit()
    sink.commit()
    assert path.read_bytes() == b"abc"


CHECKS = {
    ".tar.gz": ["gzip", "-t"],
    ".tgz": ["gzip", "-t"],
    ".tar.zst": ["zstd", "-q", "-t"],
    ".tar.xz": ["xz", "-t"],
    ".tar.bz2": ["bzip2", "-t"],
}
DECOMPRESS = {"gzip": ["gzip", "-dc"], "zstd": ["zstd", "-qdc"], "xz": ["xz", "-dc"], "bzip2": ["bzip2", "-dc"]}


@pytest.mark.parametrize("suffix", list(CHECKS))
def test_compressed_outputs_by_suffix(tmp_path, suffix, reader):
    tool = CHECKS[suffix][0]
    if shutil.which(tool) is None:
        pytest.skip(f"{tool} not installed")
    data = _tar_bytes()
    path = tmp_path / f"out{suffix}"
    with open_sink(str(path), digest=True) as sink:
        for i in range(0, len(data), 3000):
            sink.write(data[i : i + 3000])
    comp = path.read_bytes()
    assert comp != data and len(comp) < len(data)
    subprocess.run([*CHECKS[suffix], str(path)], check=True, capture_output=True)
    plain = subprocess.run([*DECOMPRESS[tool], str(path)], check=True, capture_output=True).stdout
    assert plain == data
    assert sink.bytes == len(comp)
    assert sink.sha256 == hashlib.sha256(comp).hexdigest()
    with open_source(str(path)) as stream:
        assert len(list(iter_members(stream))) == 40


def test_gzip_output_is_byte_identical_across_runs(tmp_path):
    data = _tar_bytes()
    outputs = []
    for i in range(2):
        path = tmp_path / f"run{i}" / "same.tar.gz"
        path.parent.mkdir()
        with open_sink(str(path)) as sink:
            sink.write(data)
        outputs.append(path.read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0][4:8] == bytes(4)  # gzip header mtime 0
    assert outputs[0][3] & 0x08 == 0  # no file name stored


def test_compression_can_be_turned_off(tmp_path):
    path = tmp_path / "plain.tar.gz"
    with open_sink(str(path), compression=None) as sink:
        sink.write(b"plain")
    assert path.read_bytes() == b"plain"


def test_stdout_refuses_a_terminal(monkeypatch, capsysbinary):
    monkeypatch.setattr(sinks, "stdout_is_terminal", lambda: True)
    with pytest.raises(SinkError) as info:
        open_sink("-")
    assert "terminal" in str(info.value)
    with open_sink("-", force=True) as sink:
        sink.write(b"forced bytes")
    assert capsysbinary.readouterr().out == b"forced bytes"


def test_stdout_when_not_a_terminal(monkeypatch, capsysbinary):
    monkeypatch.setattr(sinks, "stdout_is_terminal", lambda: False)
    with open_sink("-") as sink:
        sink.write(b"to stdout")
    assert capsysbinary.readouterr().out == b"to stdout"


def test_bad_local_destinations(tmp_path):
    with pytest.raises(SinkError) as info:
        open_sink(str(tmp_path))
    assert "directory" in str(info.value)
    with pytest.raises(SinkError) as info:
        open_sink(str(tmp_path / "no" / "such" / "dir" / "x.tar"))
    assert info.value.url == str(tmp_path / "no" / "such" / "dir" / "x.tar")


def test_symlink_destination_replaces_the_target_not_the_link(tmp_path):
    target = tmp_path / "real.tar"
    target.write_bytes(b"old")
    link = tmp_path / "link.tar"
    link.symlink_to(target)
    with open_sink(str(link)) as sink:
        sink.write(b"new")
    assert link.is_symlink()
    assert target.read_bytes() == b"new"
    assert sorted(os.listdir(tmp_path)) == ["link.tar", "real.tar"]


def test_dev_null_is_written_directly():
    with open_sink("/dev/null") as sink:
        sink.write(b"x" * 1000)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sink.bytes == 1000


def test_fifo_is_written_directly(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader_thread = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader_thread.start()
    with open_sink(str(fifo)) as sink:
        sink.write(b"through the fifo")
    reader_thread.join(5)
    assert got == [b"through the fifo"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def test_pipe_sink(tmp_path):
    out = tmp_path / "piped.tar"
    with open_sink(f"pipe:cat > {out}") as sink:
        sink.write(b"piped bytes")
    assert out.read_bytes() == b"piped bytes"
    with pytest.raises(SinkError) as info:
        with open_sink("pipe:cat > /dev/null; exit 4") as sink:
            sink.write(b"x")
    assert "status 4" in str(info.value)


@pytest.mark.parametrize("size", [10, 3 << 20])
def test_write_errors_are_sink_errors(size):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with pytest.raises(SinkError) as info:
        with open_sink("/dev/full") as sink:
            sink.write(b"x" * size)
    assert "No space left" in str(info.value) and info.value.url == "/dev/full"


def test_fsspec_sink_uploads_only_on_commit():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    data = _tar_bytes()
    url = "memory://tarproc-core-tests/out.tar.gz"
    try:
        with open_sink(url) as sink:
            sink.write(data)
            assert not fs.exists("/tarproc-core-tests/out.tar.gz")
        with open_source(url) as stream:
            assert stream.compression == "gzip"
            assert len(list(iter_members(stream, url))) == 40
        with pytest.raises(RuntimeError):
            with open_sink("memory://tarproc-core-tests/aborted.tar") as sink:
                sink.write(data)
                raise RuntimeError
        assert not fs.exists("/tarproc-core-tests/aborted.tar")
    finally:
        if fs.exists("/tarproc-core-tests"):
            fs.rm("/tarproc-core-tests", recursive=True)


def test_the_digest_thread_hashes_every_byte_in_order_and_ends():
    import hashlib
    import threading

    from tarproc.sinks import _Hasher

    pieces = [bytes([i % 251]) * (i * 977 % 70_000) for i in range(300)]
    hasher = _Hasher()
    for piece in pieces:
        hasher.update(piece if len(piece) % 2 else bytearray(piece))  # a bytearray is copied first
    assert hasher.hexdigest() == hashlib.sha256(b"".join(pieces)).hexdigest() == hasher.hexdigest()
    assert not any(t.name == "tarproc-sha256" and t.is_alive() for t in threading.enumerate())


def test_the_digest_thread_takes_views_of_bytes_as_they_are_and_copies_reused_buffers():
    """A view of bytes can't change: it is hashed later as it is, even when the caller releases
    its own view; a view of a bytearray (a writer's reused gather buffer) is copied at once."""
    from tarproc.sinks import _Hasher

    hasher = _Hasher()
    whole = bytes(range(256)) * 1000
    view = memoryview(whole)[1000:90_000]
    hasher.update(view)
    view.release()  # the hasher holds a view of its own
    reused = bytearray(b"a" * 5000)
    hasher.update(memoryview(reused))
    reused[:] = b"b" * 5000  # changed after update: the hasher has its copy
    assert hasher.hexdigest() == hashlib.sha256(whole[1000:90_000] + b"a" * 5000).hexdigest()


def test_a_digest_sink_behind_a_writer_hashes_what_is_written(tmp_path):
    """TarWriter writes from a reused buffer and big data as views: the sha256 is the file's."""
    path = tmp_path / "d.tar"
    block = bytes(range(256)) * 2000
    with open_sink(str(path), digest=True) as sink, TarWriter(sink) as w:
        for i in range(300):
            w.write_sample({"__key__": f"k{i:04d}", "bin": memoryview(block)[i : i + 100_000], "txt": b"t" * i})
    assert sink.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def _pieces() -> list:
    return [b"head" * 100, memoryview(b"data" * 40_000), bytearray(b"tail"), b""]


def test_write_pieces_is_one_writev_in_order_counted_and_hashed(tmp_path, monkeypatch):
    calls = []
    real = os.writev

    def counting(fd, buffers):
        calls.append(len(buffers))
        return real(fd, buffers)

    monkeypatch.setattr(sinks.os, "writev", counting)
    path = tmp_path / "p.bin"
    with open_sink(str(path), digest=True) as sink:
        sink.write(b"first")
        sink.write_pieces(_pieces())
    want = b"first" + b"".join(bytes(p) for p in _pieces())
    assert path.read_bytes() == want and sink.bytes == len(want)
    assert sink.sha256 == hashlib.sha256(want).hexdigest()
    assert calls == [4]


def test_write_pieces_finishes_a_partial_writev(tmp_path, monkeypatch):
    real = os.writev

    def short(fd, buffers):  # at most 1000 bytes a call, as after a signal
        out, left = [], 1000
        for b in buffers:
            if left <= 0:
                break
            out.append(memoryview(b)[:left])
            left -= len(out[-1])
        return real(fd, out)

    monkeypatch.setattr(sinks.os, "writev", short)
    path = tmp_path / "p.bin"
    with open_sink(str(path)) as sink:
        sink.write_pieces(_pieces())
    assert path.read_bytes() == b"".join(bytes(p) for p in _pieces())


def test_write_pieces_after_buffered_stdout_bytes_and_without_a_descriptor(tmp_path):
    path = tmp_path / "out.bin"
    with open(path, "wb") as f:  # a buffered writer, as sys.stdout.buffer is
        sink = sinks.StdoutSink(stream=f)
        sink.write(b"buffered-")  # still in the writer's buffer: it must come first
        sink.write_pieces(_pieces())
        sink.commit()
    assert path.read_bytes() == b"buffered-" + b"".join(bytes(p) for p in _pieces())
    buf = io.BytesIO()  # no file descriptor: one write each
    sink = sinks.StdoutSink(stream=buf)
    sink.write_pieces(_pieces())
    assert buf.getvalue() == b"".join(bytes(p) for p in _pieces())


def test_write_pieces_through_a_compressor_and_to_a_full_device(tmp_path, reader):
    path = tmp_path / "w.tar.gz"
    members = [(f"m{i}.bin", bytes([i]) * 100_000) for i in range(5)]
    with open_sink(str(path)) as sink, TarWriter(sink) as w:  # gzip: no writev, writes in order
        for name, data in members:
            w.add(name, data)
    with open_source(str(path)) as source:
        assert [(n, d) for n, d, _ in iter_members(source)] == members
    if os.path.exists("/dev/full"):
        with pytest.raises(SinkError, match="No space left"), open_sink("/dev/full") as sink:
            sink.write_pieces(_pieces())


@pytest.mark.parametrize("name", ["d.tar", "d.tar.gz", "memory://tarproc-core-tests/hashed.tar"])
def test_a_file_sink_hashes_the_file_it_wrote_data_sent_by_the_kernel_included(kit, tmp_path, monkeypatch, name):
    """A sink writing a temporary file (local, compressed or to upload) hashes that file as it is
    written, read back: member data left in the input file goes over with sendfile, never read
    into the process, and the sha256 is still that of every byte written."""
    import fsspec

    from tarproc.samples import read_samples
    from tarproc.tar import FileRange

    src = tmp_path / "in.tar"
    src.write_bytes(kit.writer_tar((f"k{i:03d}.bin", bytes([i]) * (70_000 + 997 * i)) for i in range(60)))
    monkeypatch.setattr(FileRange, "read", lambda self: pytest.fail("data was read into the process"))
    if name.endswith(".gz"):
        monkeypatch.undo()  # a compressor needs the bytes
    url = name if "://" in name else str(tmp_path / name)
    with open_sink(url, digest=True) as sink:
        assert type(sink._sha) is sinks._FileHasher
        writer = TarWriter(sink)
        for sample in read_samples(str(src), views=True, refs=True):
            writer.write_sample(sample)
        writer.close()
    written = fsspec.open(url, "rb").open().read() if "://" in url else (tmp_path / name).read_bytes()
    assert sink.sha256 == hashlib.sha256(written).hexdigest() and sink.bytes == len(written)
    if "://" in url:
        fsspec.filesystem("memory").rm("/tarproc-core-tests", recursive=True)
    assert not any(t.name == "tarproc-sha256" and t.is_alive() for t in threading.enumerate())


@pytest.mark.parametrize("total", [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 5])
def test_a_file_sink_hashes_every_byte_whatever_the_batches(tmp_path, total):
    """The writer tells the hashing thread its count a MiB at a time, and the rest when the digest
    is asked for: short files, files of whole batches and files with a partial last batch are all
    hashed whole."""
    assert sinks._FileHasher._BATCH == 1 << 20
    rng = random.Random(total)
    data = rng.randbytes(total)
    with open_sink(str(tmp_path / "d.tar"), digest=True) as sink:
        at = 0
        while at < total:
            n = min(total - at, rng.choice([1, 511, 4096, 70_000, 600_000]))
            sink.write(data[at : at + n])
            at += n
    assert sink.sha256 == hashlib.sha256(data).hexdigest() and sink.bytes == total


def test_a_file_sink_that_cannot_read_back_what_it_wrote_publishes_nothing(tmp_path, monkeypatch):
    """The digest is finished before the file is renamed into place: a file that can't be read
    back (cut behind the writer, here a read that comes up short) is an error naming the
    destination, and neither the file nor its temporary is left."""
    monkeypatch.setattr(sinks.os, "preadv", lambda fd, buffers, offset: 0)
    path = tmp_path / "d.tar"
    with pytest.raises(SinkError, match=r"d\.tar: cannot read back what was written, for its sha256: the file ends"):
        with open_sink(str(path), digest=True) as sink:
            sink.write(b"x" * 100_000)
    assert os.listdir(tmp_path) == []
    assert not any(t.name == "tarproc-sha256" and t.is_alive() for t in threading.enumerate())


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _hash_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tarproc-sha256" and t.is_alive()]


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc")
def test_an_aborted_or_failed_file_sink_ends_its_hash_thread_and_closes_its_descriptor(tmp_path):
    """Abort stops the read-back at once (no hashing on through a discarded file), and the
    thread's own descriptor is closed; a sink that fails while opening leaves nothing either."""
    before = _open_fds()
    with pytest.raises(RuntimeError):
        with open_sink(str(tmp_path / "a.tar"), digest=True) as sink:
            for _ in range(64):
                sink.write(b"x" * (1 << 20))
            thread = sink._sha._thread
            raise RuntimeError("the writer failed")
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert _open_fds() == before and os.listdir(tmp_path) == [] and not _hash_threads()
    with pytest.raises(ValueError):
        open_sink(str(tmp_path / "b.tar.gz"), digest=True, level=99)  # the compressor refuses the level
    assert _open_fds() == before and os.listdir(tmp_path) == [] and not _hash_threads()
