"""parallel_samples: every sample exactly once, the documented order, errors, stopping and cleanup."""

from __future__ import annotations

import io
import itertools
import os
import random
import shlex
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from tarhelpers import children

from tarproc import TarWriter, read_samples
from tarproc.errors import OptionError, SourceError, TarFormatError
from tarproc.pcat import parallel_samples
from tarproc.tar import ReadStats

# 37 shards of varying sizes, four of them empty: keys "sNN/iiii"
SIZES = [random.Random(7).choice([0, 1, 2, 3, 5, 8, 13, 21]) for _ in range(37)]
SIZES[0], SIZES[5], SIZES[36] = 0, 0, 0  # empties at the start, inside and at the end
SIZES[1] = 40  # one long shard


def tar_of(keys: list[str], size: int = 64) -> bytes:
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        for key in keys:
            w.write_sample({"__key__": key, "txt": (key.encode() + b"x" * size)[:size], "cls": b"1"})
    return buf.getvalue()


def shard_keys(s: int, n: int) -> list[str]:
    return [f"s{s:02d}/{i:04d}" for i in range(n)]


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    d = tmp_path_factory.mktemp("many")
    urls = []
    for s, n in enumerate(SIZES):
        path = d / f"shard-{s:02d}.tar"
        path.write_bytes(tar_of(shard_keys(s, n)))
        urls.append(str(path))
    return urls


def model_roundrobin(sizes: list[int], readers: int) -> list[str]:
    """The documented order, computed independently: P lanes, lane i starts with shard i, takes the
    next unstarted shard when its own ends (empty ones at once), one sample per open lane in turn."""
    shards = [shard_keys(s, n) for s, n in enumerate(sizes)]
    pending = list(range(len(sizes)))
    lanes = [[pending.pop(0), 0] for _ in range(min(readers, len(sizes)))]
    out, turn = [], 0
    while lanes:
        shard, pos = lanes[turn]
        if pos < len(shards[shard]):
            out.append(shards[shard][pos])
            lanes[turn][1] += 1
            turn = (turn + 1) % len(lanes)
        elif pending:
            lanes[turn] = [pending.pop(0), 0]
        else:
            del lanes[turn]
            turn = turn % len(lanes) if lanes else 0
    return out


def all_keys() -> list[str]:
    return [k for s, n in enumerate(SIZES) for k in shard_keys(s, n)]


def via(paths: list[str], how: str) -> list[str]:
    """The shards as local files (read in the consumer's thread) or through pipe: (reader threads)."""
    return paths if how == "file" else [f"pipe:cat {shlex.quote(p)}" for p in paths]


def test_local_files_are_read_without_threads(many):
    baseline = threading.active_count()
    gen = parallel_samples(many, readers=8)
    first = list(itertools.islice(gen, 20))
    assert len(first) == 20 and threading.active_count() == baseline
    gen.close()


@pytest.mark.parametrize("how", ["file", "pipe"])
@pytest.mark.parametrize("order", ["roundrobin", "random"])
@pytest.mark.parametrize("readers", [1, 3, 8, 60])
def test_every_sample_exactly_once(many, order, readers, how):
    stats = ReadStats()
    urls = via(many, how)
    samples = list(parallel_samples(urls, readers=readers, order=order, seed=1, prefetch=4, stats=stats))
    keys = [s["__key__"] for s in samples]
    assert Counter(keys) == Counter(all_keys())
    assert len(keys) == sum(SIZES)
    for s in samples:  # fields and __url__ belong to the sample's own shard
        shard = int(s["__key__"][1:3])
        assert s["__url__"] == urls[shard]
        assert s["txt"].startswith(s["__key__"].encode())
    assert stats.shards == len(SIZES) and stats.samples == sum(SIZES) and stats.members == 2 * sum(SIZES)


@pytest.mark.parametrize("how", ["file", "pipe"])
@pytest.mark.parametrize("readers", [1, 2, 3, 8, 36, 37, 100])
@pytest.mark.parametrize("prefetch", [1, 3, 256])
def test_roundrobin_order_is_exactly_as_documented(many, readers, prefetch, how):
    keys = [s["__key__"] for s in parallel_samples(via(many, how), readers=readers, prefetch=prefetch)]
    assert keys == model_roundrobin(SIZES, readers)


@pytest.mark.parametrize("seed", [1, 2])
def test_random_order_is_the_same_with_and_without_threads(many, seed):
    def keys(how: str) -> list[str]:
        return [s["__key__"] for s in parallel_samples(via(many, how), readers=5, order="random", seed=seed)]

    assert keys("file") == keys("pipe")


def test_small_roundrobin_example(tmp_path):
    urls = []
    for name, n in (("a", 3), ("b", 1), ("c", 0), ("d", 2)):
        (tmp_path / f"{name}.tar").write_bytes(tar_of([f"{name}{i}" for i in range(n)]))
        urls.append(str(tmp_path / f"{name}.tar"))
    keys = [s["__key__"] for s in parallel_samples(urls, readers=2)]
    # lanes: a | b; b ends -> c (empty) -> d, in b's place in the cycle
    assert keys == ["a0", "b0", "a1", "d0", "a2", "d1"]


def test_one_reader_is_read_samples(many):
    ours = [(s["__key__"], s["txt"]) for s in parallel_samples(many, readers=1)]
    assert ours == [(s["__key__"], s["txt"]) for s in read_samples(many)]


def test_random_order_is_reproducible_with_a_seed(many):
    def keys(seed: int, readers: int = 4) -> list[str]:
        return [s["__key__"] for s in parallel_samples(many, readers=readers, order="random", seed=seed, prefetch=2)]

    first = keys(3)
    assert keys(3) == first  # chunking and thread timing don't change it
    assert keys(4) != first
    assert first != model_roundrobin(SIZES, 4)
    assert sorted(first) == sorted(all_keys())
    # within a shard the order is kept
    for s in range(len(SIZES)):
        assert [k for k in first if k.startswith(f"s{s:02d}/")] == shard_keys(s, SIZES[s])


def test_stats_match_read_samples(many):
    ours, theirs = ReadStats(), ReadStats()
    list(parallel_samples(many, readers=5, stats=ours))
    list(read_samples(many, stats=theirs))
    assert ours.as_dict() == theirs.as_dict()


def test_bad_arguments():
    with pytest.raises(OptionError):
        parallel_samples(["a.tar"], readers=0)
    with pytest.raises(OptionError):
        parallel_samples(["a.tar"], order="sorted")
    with pytest.raises(OptionError):
        parallel_samples(["a.tar"], on_error="ignore")
    with pytest.raises(OptionError):
        parallel_samples(["a.tar"], prefetch=0)
    with pytest.raises(OptionError):
        parallel_samples(["-", "-"])
    assert list(parallel_samples([])) == []


# ------------------------------------------------------------------------------------------------
# stopping early: no thread, no child process, no open source left


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
@pytest.mark.parametrize("order", ["roundrobin", "random"])
def test_stopping_early_leaves_no_threads_and_no_children(many, order):
    baseline_threads = threading.active_count()
    baseline_children = children()
    urls = [f"pipe:cat {shlex.quote(u)}" for u in many]
    gen = parallel_samples(urls, readers=8, order=order, prefetch=2)
    first = list(itertools.islice(gen, 5))
    assert len(first) == 5
    assert threading.active_count() > baseline_threads  # readers are running
    gen.close()
    assert threading.active_count() == baseline_threads
    assert children() == baseline_children


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_stopping_kills_a_slow_pipe_promptly(many):
    baseline_threads = threading.active_count()
    baseline_children = children()
    # 600 s: past pytest's timeout, were the pipe waited for
    urls = [many[1], f"pipe:sleep 600; cat {shlex.quote(many[2])}"]
    gen = parallel_samples(urls, readers=2)
    assert next(gen)["__key__"] == "s01/0000"
    gen.close()
    assert threading.active_count() == baseline_threads
    assert children() == baseline_children


def test_read_ahead_is_bounded(tmp_path):
    urls = []
    for s in range(6):
        path = tmp_path / f"{s}.tar"
        path.write_bytes(tar_of(shard_keys(s, 200)))
        urls.append(str(path))
    stats = ReadStats()
    gen = parallel_samples(via(urls, "pipe"), readers=2, prefetch=8, stats=stats)  # read-ahead: threads
    next(gen)
    time.sleep(0.3)  # the scenario: the readers fill every buffer they may (the bound holds however full)
    gen.close()
    # 2 lanes + 2 read-ahead shards, each at most prefetch samples plus one chunk (prefetch // 4)
    # plus the sample being grouped: far fewer than the 1200 samples there are
    assert stats.samples <= 4 * (8 + 2 + 1) + 1


def test_byte_bound_holds_for_big_samples(tmp_path):
    path = tmp_path / "big.tar"
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        for i in range(50):
            w.write_sample({"__key__": f"k{i:03d}", "bin": bytes(100_000)})
    path.write_bytes(buf.getvalue())
    stats = ReadStats()
    gen = parallel_samples(via([str(path)], "pipe"), readers=1, prefetch=1000, prefetch_bytes=300_000, stats=stats)
    next(gen)
    time.sleep(0.3)  # the scenario: the reader fills its buffer (the bound holds however full)
    gen.close()
    assert stats.bytes <= 800_000  # 3 samples in the buffer, a chunk of 1, one being read, one given out


# ------------------------------------------------------------------------------------------------
# errors


def damaged(tmp_path: Path, name: str = "bad.tar", n: int = 10) -> tuple[str, int]:
    """A shard cut inside the data of its 5th member (sample 2): samples 0 and 1 read fine."""
    data = tar_of([f"bad/{i:04d}" for i in range(n)], size=1000)
    cut = 4 * (512 + 1024) + 512 + 300  # inside the 5th member's data
    path = tmp_path / name
    path.write_bytes(data[:cut])
    return str(path), cut


@pytest.mark.parametrize("readers", [1, 4])
@pytest.mark.parametrize("how", ["file", "pipe"])
def test_damaged_shard_fails_with_url_and_offset(many, tmp_path, readers, how):
    bad, _ = damaged(tmp_path)
    baseline_threads = threading.active_count()
    urls = via(many[:10], how) + [bad] + via(many[10:], how)
    with pytest.raises(TarFormatError) as info:
        list(parallel_samples(urls, readers=readers))
    assert info.value.url == bad
    assert "truncated" in str(info.value) and f"at byte {info.value.offset}" in str(info.value)
    assert threading.active_count() == baseline_threads


def test_failure_is_raised_promptly_not_after_the_other_shards(tmp_path):
    # the damaged shard is read by a second reader; the first lane's long shard must not be
    # consumed to its end before the error comes out
    good = tmp_path / "long.tar"
    good.write_bytes(tar_of(shard_keys(0, 3000)))
    bad, _ = damaged(tmp_path, n=3)
    gen = parallel_samples([str(good), bad], readers=2, prefetch=4)
    got = 0
    with pytest.raises(TarFormatError):
        for _ in gen:
            got += 1
            time.sleep(0.0005)
    assert got < 500


@pytest.mark.parametrize("readers", [1, 3])
@pytest.mark.parametrize("order", ["roundrobin", "random"])
@pytest.mark.parametrize("how", ["file", "pipe"])
def test_skip_shard_keeps_everything_else(many, tmp_path, readers, order, how):
    bad, cut = damaged(tmp_path)
    missing = str(tmp_path / "missing.tar")
    urls = via(many[:3], how) + [bad] + via(many[3:20], how) + [missing] + via(many[20:], how)
    warnings: list[str] = []
    stats = ReadStats()
    keys = [
        s["__key__"]
        for s in parallel_samples(
            urls, readers=readers, order=order, seed=0, on_error="skip-shard", warn=warnings.append, stats=stats
        )
    ]
    # the other shards complete, plus the samples of the damaged shard before the damage
    assert Counter(keys) == Counter(all_keys() + ["bad/0000", "bad/0001"])
    assert stats.shards_failed == 2 and len(stats.errors) == 2
    assert len(warnings) == 2
    assert any(bad in w and "truncated" in w for w in warnings)
    assert any(missing in w and "no such file" in w for w in warnings)
    assert threading.active_count() >= 1


def test_skip_shard_warning_comes_after_the_shards_good_samples(tmp_path):
    bad, _ = damaged(tmp_path)
    events: list[str] = []
    for s in parallel_samples([bad], on_error="skip-shard", warn=lambda m: events.append("warn")):
        events.append(s["__key__"])
    assert events == ["bad/0000", "bad/0001", "warn"]


def test_missing_input_fails(many, tmp_path):
    missing = str(tmp_path / "missing.tar")
    with pytest.raises(SourceError, match="no such file") as info:
        list(parallel_samples([*many[:4], missing], readers=2))
    assert info.value.url == missing


def test_duplicate_warnings_reach_warn_in_order(tmp_path):
    path = tmp_path / "dup.tar"
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        w.add("a.txt", b"1")
        w.add("b.txt", b"2")
        w.add("a.cls", b"3")  # key 'a' reappears
    path.write_bytes(buf.getvalue())
    warnings: list[str] = []
    stats = ReadStats()
    keys = [s["__key__"] for s in parallel_samples([str(path)], dup="warn", warn=warnings.append, stats=stats)]
    assert keys == ["a", "b"]
    assert len(warnings) == 1 and "reappears" in warnings[0]
    assert stats.duplicates == 1


def test_a_reader_bug_is_not_skipped(many, monkeypatch):
    import tarproc.pcat as pcat

    def broken(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr(pcat, "group_keyed", broken)
    with pytest.raises(ZeroDivisionError):
        list(parallel_samples(many, readers=3, on_error="skip-shard"))


def test_ctrl_c_handed_to_a_reader_thread_still_stops_the_read(tmp_path: Path) -> None:
    """The kernel may hand Ctrl-C to a reader thread rather than the main one (Python then only
    sets a flag): the main thread, waiting for samples from stalled ``pipe:`` commands, still
    raises KeyboardInterrupt, and the commands are ended (see ``procgroup.SIGNAL_CHECK``)."""
    import subprocess
    import sys
    import textwrap

    from tarhelpers import PATIENCE, live_processes_with, settled

    marker = f"632.{os.getpid()}"  # seconds: the commands never write a byte
    script = textwrap.dedent(f"""
        import signal, threading
        import tarproc.pcat as pcat

        waiting = threading.Event()  # the main thread has begun waiting for samples
        real_init = pcat._Buffer.__init__

        def init(self, *args, **kw):
            real_init(self, *args, **kw)
            real_wait = self.cond.wait

            def wait(timeout=None):
                if threading.current_thread() is threading.main_thread():
                    waiting.set()
                return real_wait(timeout)

            self.cond.wait = wait

        def kick():  # then Ctrl-C to a reader thread, not to the main one
            waiting.wait()
            reader = next(t for t in threading.enumerate() if t.name.startswith("tarproc-pcat"))
            signal.pthread_kill(reader.ident, signal.SIGINT)

        pcat._Buffer.__init__ = init
        threading.Thread(target=kick, daemon=True).start()
        try:
            list(pcat.parallel_samples(["pipe:sleep {marker}"] * 2, readers=2))
        except KeyboardInterrupt:
            print("interrupted")
    """)
    try:
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=PATIENCE)
        assert r.stdout.strip() == "interrupted", r.stderr
        assert settled(lambda: live_processes_with(marker)) == []
    finally:  # a run that hung left its commands behind
        subprocess.run(["pkill", "-f", marker])
