"""Sources: URL expansion, local files, ``file:``, ``pipe:`` (exit status, early stop, reaping)."""

from __future__ import annotations

import io
import os

import pytest
from tarhelpers import children, live_group_members, settled

from tarproc.errors import SourceError, TarFormatError
from tarproc.samples import read_samples
from tarproc.sources import expand_urls, local_path, open_source
from tarproc.tar import TarWriter, iter_members


def _tar(n: int = 5, size: int = 2000) -> bytes:
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        for i in range(n):
            w.write_sample({"__key__": f"{i:04d}", "txt": f"sample {i}".encode(), "bin": bytes([i]) * size})
    return buf.getvalue()


@pytest.fixture
def tar_file(tmp_path):
    path = tmp_path / "data.tar"
    path.write_bytes(_tar())
    return path


# -- expand_urls ---------------------------------------------------------------------------------


def test_expand_brace_lists_and_joins():
    assert expand_urls(["a-{0..2}.tar::b.tar"]) == ["a-0.tar", "a-1.tar", "a-2.tar", "b.tar"]
    assert expand_urls(["s-{000..002}.tar"]) == ["s-000.tar", "s-001.tar", "s-002.tar"]
    assert expand_urls(["{a,b}/{1..2}.tar"]) == ["a/1.tar", "a/2.tar", "b/1.tar", "b/2.tar"]
    assert expand_urls(["x.tar", "y.tar::z.tar", "::w.tar::"]) == ["x.tar", "y.tar", "z.tar", "w.tar"]
    assert expand_urls(["pipe:cat a-{0..1}.tar"]) == ["pipe:cat a-0.tar", "pipe:cat a-1.tar"]
    assert expand_urls([]) == []


def test_expand_list_files(tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text("# shards\n\n  a.tar  \nb-{0..1}.tar::c.tar\n   # indented comment\n\nfile:d.tar\n")
    assert expand_urls(["first.tar"], [str(lst)]) == ["first.tar", "a.tar", "b-0.tar", "b-1.tar", "c.tar", "file:d.tar"]
    with pytest.raises(SourceError) as info:
        expand_urls([], [str(tmp_path / "no-list.txt")])
    assert info.value.url == str(tmp_path / "no-list.txt")


def test_local_path_forms():
    assert local_path("file:/x/y.tar") == "/x/y.tar"
    assert local_path("file:///x/y.tar") == "/x/y.tar"
    assert local_path("rel/y.tar") == "rel/y.tar"
    assert local_path("pipe:cat x") is None
    assert local_path("-") is None
    assert local_path("s3://b/k.tar") is None


# -- local files ---------------------------------------------------------------------------------


def test_plain_path_and_file_prefix(tar_file):
    expected = list(iter_members(io.BytesIO(tar_file.read_bytes())))
    assert len(expected) == 10
    for url in (str(tar_file), f"file:{tar_file}", f"file://{tar_file}"):
        with open_source(url) as stream:
            assert stream.url == url
            assert list(iter_members(stream, url)) == expected


def test_missing_file_names_it(tmp_path):
    missing = str(tmp_path / "nope.tar")
    with pytest.raises(SourceError) as info:
        open_source(missing)
    assert info.value.url == missing
    assert missing in str(info.value) and "no such file" in str(info.value)
    with pytest.raises(SourceError) as info:
        open_source(f"file:{missing}")
    assert info.value.url == f"file:{missing}"


def test_directory_is_an_error(tmp_path):
    with pytest.raises(SourceError) as info:
        open_source(str(tmp_path))
    assert "directory" in str(info.value)


def test_source_read_returns_at_most_n(tar_file):
    raw = tar_file.read_bytes()
    with open_source(str(tar_file)) as stream:
        pieces = []
        for n in [1, 3, 5, 100, 10000, 7] * 1000:
            piece = stream.read(n)
            assert len(piece) <= n
            if not piece:
                break
            pieces.append(piece)
    assert b"".join(pieces) == raw


def test_stdin_source(tar_file):
    raw = tar_file.read_bytes()
    with open_source("-", stdin=io.BytesIO(raw)) as stream:
        assert len(list(iter_members(stream, "-"))) == 10


# -- pipe: ---------------------------------------------------------------------------------------


def test_pipe_cat_file(tar_file, reader):
    expected = list(iter_members(io.BytesIO(tar_file.read_bytes())))
    url = f"pipe:cat {tar_file}"
    with open_source(url) as stream:
        assert list(iter_members(stream, url)) == expected
    assert stream.proc.returncode == 0


def test_pipe_exit_status_after_whole_output_is_an_error(tar_file):
    url = f"pipe:cat {tar_file}; exit 3"
    with pytest.raises(SourceError) as info:
        with open_source(url) as stream:
            assert len(list(iter_members(stream, url))) == 10
    assert info.value.url == url
    assert "status 3" in str(info.value)
    with pytest.raises(SourceError) as info:
        list(read_samples(url))
    assert "status 3" in str(info.value)


def test_pipe_exit_without_output_read_directly():
    with pytest.raises(SourceError) as info:
        with open_source("pipe:exit 3") as stream:
            assert stream.read(100) == b""
    assert "status 3" in str(info.value)


def test_pipe_failing_without_output_reports_exit_status():
    with pytest.raises(SourceError) as info:
        list(read_samples("pipe:exit 3"))
    assert "status 3" in str(info.value)


def test_pipe_sigpipe_status_is_not_an_error(tar_file):
    # the whole output is read, then the shell exits 141 as if its writer had got SIGPIPE
    url = f"pipe:cat {tar_file}; exit 141"
    assert len(list(read_samples(url))) == 5


def test_empty_pipe_command_is_a_source_error():
    """An empty pipe: can come from an input list: bad input naming the URL, not a usage error."""
    with pytest.raises(SourceError, match="needs a command") as info:
        open_source("pipe:   ")
    assert info.value.url == "pipe:   "


def _wait_group_gone(pgid: int) -> list[int]:
    return settled(lambda: live_group_members(pgid))


def test_early_stop_on_infinite_pipe_closes_quietly_and_reaps(tar_file, reader):
    url = f"pipe:while true; do cat {tar_file}; done"
    with open_source(url) as stream:
        members = iter_members(stream, url)
        first = [next(members) for _ in range(3)]
        members.close()
    assert [name for name, _, _ in first] == ["0000.bin", "0000.txt", "0001.bin"]
    proc = stream.proc
    assert proc.returncode is not None  # reaped: no zombie left behind
    with pytest.raises(ChildProcessError):
        os.waitpid(proc.pid, os.WNOHANG)
    assert _wait_group_gone(proc.pid) == []  # the shell's children (cat) were stopped too


def test_early_stop_through_read_samples_generator(tar_file):
    url = f"pipe:while true; do cat {tar_file}; done"
    before = set(children())
    gen = read_samples(url)
    first = [next(gen) for _ in range(2)]
    gen.close()
    assert [s["__key__"] for s in first] == ["0000", "0001"]
    # no child process of ours is left running or unreaped
    assert settled(lambda: list(set(children()) - before)) == []


def test_error_while_reading_pipe_kills_and_reaps(tmp_path):
    # a producer that never ends but sends garbage: the tar error wins, the child is stopped
    url = "pipe:while true; do echo not a tar archive at all; done"
    before = set(children())
    with pytest.raises(TarFormatError) as info:
        with open_source(url) as stream:
            list(iter_members(stream, url))
    assert info.value.offset == 0
    assert stream.proc.returncode is not None
    assert _wait_group_gone(stream.proc.pid) == []
    assert set(children()) - before == set()


def test_read_errors_become_source_errors_with_offset():
    from tarproc.sources import Source

    class Failing:
        def __init__(self):
            self.data = io.BytesIO(_tar())

        def read(self, n=-1):
            if self.data.tell() >= 3000:
                self.failed_at = self.data.tell()
                raise OSError(5, "Input/output error")
            return self.data.read(min(n, 1000))

        def close(self):
            pass

    raw = Failing()
    stream = Source("flaky.tar", raw)
    with pytest.raises(SourceError) as info:
        list(iter_members(stream, "flaky.tar"))
    assert info.value.url == "flaky.tar"
    assert raw.failed_at >= 3000
    assert f"read failed at byte {raw.failed_at}" in str(info.value) and "Input/output error" in str(info.value)


def test_fsspec_memory_source():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("/tarproc-core-src/a.tar", _tar(3))
    try:
        samples = list(read_samples("memory://tarproc-core-src/a.tar"))
        assert [s["__key__"] for s in samples] == ["0000", "0001", "0002"]
        assert samples[0]["__url__"] == "memory://tarproc-core-src/a.tar"
        with pytest.raises(SourceError) as info:
            open_source("memory://tarproc-core-src/missing.tar")
        assert info.value.url == "memory://tarproc-core-src/missing.tar"
    finally:
        fs.rm("/tarproc-core-src", recursive=True)
