"""Regression tests for problems found in review: each would lose, merge or corrupt data."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import textwrap

import pytest
import pyzstd

from tarproc import ShardWriter, TarWriter, read_samples
from tarproc.errors import OptionError, SampleError, SinkError, TarFormatError
from tarproc.shards import shard_pattern
from tarproc.sinks import open_sink
from tarproc.stages import rekey
from tarproc.tar import iter_members


@pytest.mark.parametrize(
    "key",
    ["v1.0-000001", "a/b.c", "dir/", "", "a/.hidden", "__meta__/x", "__index__"],
)
def test_writer_refuses_keys_that_would_not_read_back(key):
    with pytest.raises(SampleError):
        TarWriter(io.BytesIO()).write_sample({"__key__": key, "txt": b"x"})


def test_keys_with_dots_in_directories_are_fine(tmp_path):
    path = tmp_path / "ok.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        w.write_sample({"__key__": "dir.v2/img", "seg.png": b"p", "jpg": b"j"})
    [sample] = read_samples(str(path))
    assert sample["__key__"] == "dir.v2/img" and sample["seg.png"] == b"p"


@pytest.mark.parametrize(
    "sample",
    [{"__key__": "a", "x/y": b"1"}, {"__key__": "a"}, {"__key__": "a", "__url__": "u"}],
    ids=["slash-in-field", "no-fields", "only-metadata"],
)
def test_writer_refuses_fields_that_would_not_read_back(sample):
    with pytest.raises(SampleError):
        TarWriter(io.BytesIO()).write_sample(sample)


def test_same_key_twice_in_a_row_is_an_error_not_a_merge():
    w = TarWriter(io.BytesIO())
    w.write_sample({"__key__": "a", "jpg": b"1"})
    with pytest.raises(SampleError, match="twice in a row"):
        w.write_sample({"__key__": "a", "txt": b"2"})


def test_shard_writer_checks_keys_before_opening_a_shard(tmp_path):
    with pytest.raises(SampleError):
        with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=5) as w:
            w.write({"__key__": "a.b", "jpg": b"x"})
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fmt", ["v1.0-%06d", "%d/", "same%.0s"])
def test_rekey_refuses_formats_that_merge_or_lose_samples(fmt):
    with pytest.raises(OptionError):
        list(rekey(iter([{"__key__": "a"}]), fmt))


@pytest.mark.parametrize("pattern", ["q%.0s.tar", "-", "w%c.tar"])
def test_shard_pattern_must_give_distinct_usable_names(pattern):
    with pytest.raises(OptionError):
        shard_pattern(pattern)


@pytest.mark.parametrize("field", [b"+0000000005\x00", b"0000000_005", b"0000 000005\x00"])
def test_size_fields_are_strict_octal(kit, reader, field):
    member = bytearray(kit.member("a.txt", b"hello"))
    member[124:136] = field.ljust(12, b"\x00")[:12]
    member[148:156] = b"        "
    member[148:156] = b"%06o\x00 " % sum(member[:512])
    with pytest.raises(TarFormatError, match="bad size field"):
        list(iter_members(io.BytesIO(kit.archive(bytes(member)))))


def test_zstd_bomb_reads_in_bounded_memory(tmp_path):
    """1 GiB of zeros after a tiny tar, compressed to a few KB: memory must not follow the ratio."""
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        w.add("a.txt", b"x")
    comp = pyzstd.ZstdCompressor(3)
    data = comp.compress(buf.getvalue())
    zeros = bytes(64 << 20)
    for _ in range(16):
        data += comp.compress(zeros)
    data += comp.flush()
    path = tmp_path / "bomb.tar.zst"
    path.write_bytes(data)
    assert len(data) < 1 << 20
    code = textwrap.dedent(
        f"""
        from tarproc import read_samples
        n = sum(1 for _ in read_samples({str(path)!r}))
        assert n == 1, n
        # VmHWM is this process image's own peak; ru_maxrss would carry over the peak of the
        # (large) pytest process that forked it
        print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    maxrss_kb = int(out.stdout.strip())
    assert maxrss_kb < 300 * 1024, f"{maxrss_kb} KB"


def test_replacing_a_file_keeps_its_mode(tmp_path):
    path = tmp_path / "private.tar"
    path.write_bytes(b"old")
    os.chmod(path, 0o600)
    with open_sink(str(path)) as sink:
        sink.write(b"new")
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write read-only files")
def test_a_read_only_file_is_not_replaced(tmp_path):
    path = tmp_path / "ro.tar"
    path.write_bytes(b"keep")
    os.chmod(path, 0o444)
    with pytest.raises(SinkError, match="not writable"):
        open_sink(str(path))
    assert path.read_bytes() == b"keep"


def test_pipe_sink_names_the_commands_exit_status():
    with pytest.raises(SinkError, match="status 3"):
        with open_sink("pipe:exit 3") as sink:
            for _ in range(64):
                sink.write(bytes(1 << 16))


def test_post_command_cannot_read_the_input(tmp_path):
    """--post runs while the input is still being read: it must not get our stdin."""
    log = tmp_path / "post.log"
    with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=1, post=f"wc -c >> {log}; true") as w:
        for i in range(2):
            w.write({"__key__": f"k{i}", "txt": b"x"})
    assert log.read_text().split() == ["0", "0"]
