"""tarproc.process: per-sample shell jobs and mapped functions, order, window, errors, cleanup."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from tarhelpers import PATIENCE, live_group_members, live_processes_with, settled, wait_for

from tarproc.errors import OptionError
from tarproc.process import JobError, JobStats, field_filter, load_function, map_samples, shell_samples


def make(n: int, **extra: bytes) -> list[dict]:
    return [{"__key__": f"k{i:03d}", "__url__": "in.tar", "txt": f"text {i}".encode(), **extra} for i in range(n)]


def fields(samples) -> list[tuple[str, dict]]:
    return [(s["__key__"], {k: bytes(v) for k, v in s.items() if not k.startswith("__")}) for s in samples]


def processes_with(marker: str) -> list[int]:
    """Live processes running ``marker``, once killed ones are gone (or after a minute)."""
    return settled(lambda: live_processes_with(marker), interval=0.05)


@pytest.fixture
def tmp(tmp_path: Path) -> Path:
    """A private directory for the sample directories, checked empty by the tests."""
    d = tmp_path / "jobs"
    d.mkdir()
    return d


# ---------------------------------------------------------------------------------------------
# shell jobs


def test_true_passes_samples_through_unchanged(tmp):
    samples = make(30, cls=b"3")
    stats = JobStats()
    out = list(shell_samples(samples, "true", workers=3, tmpdir=str(tmp), stats=stats))
    assert fields(out) == fields(samples)
    assert [s["__url__"] for s in out] == ["in.tar"] * 30
    assert (stats.inputs, stats.outputs, stats.failed) == (30, 30, 0)
    assert os.listdir(tmp) == []


def test_files_added_removed_and_modified(tmp):
    cmd = "tr a-z A-Z < sample.txt > sample.up; rm sample.txt; printf x >> sample.cls; touch other.txt; mkdir sample.d"
    out = list(shell_samples(make(3, cls=b"7"), cmd, workers=2, tmpdir=str(tmp)))
    assert fields(out) == [(f"k{i:03d}", {"up": f"TEXT {i}".encode(), "cls": b"7x"}) for i in range(3)]
    assert os.listdir(tmp) == []


def test_upper_case_extension_becomes_lower_case_field(tmp):
    out = list(shell_samples(make(1), "mv sample.txt sample.TXT", tmpdir=str(tmp)))
    assert fields(out) == [("k000", {"txt": b"text 0"})]


def test_environment_and_key_never_in_file_names(tmp):
    samples = [{"__key__": "../../evil", "txt": b"a"}, {"__key__": "/etc/evil2", "txt": b"b"}]
    cmd = 'printf "%s|%s|%s" "$KEY" "$INDEX" "$(basename "$SAMPLE_DIR")" > sample.env; ls -A > sample.ls; pwd > sample.pwd'
    out = list(shell_samples(samples, cmd, tmpdir=str(tmp)))
    for i, s in enumerate(out):
        key, index, dirname = s["env"].decode().split("|")
        assert (key, index) == (samples[i]["__key__"], str(i))
        assert s["ls"] == b"sample.env\nsample.ls\nsample.txt\n"
        assert s["pwd"].decode().strip() == str(tmp / dirname)
    assert not (tmp.parent.parent / "evil").exists() and not Path("/etc/evil2").exists()
    assert os.listdir(tmp) == []


def test_field_name_that_is_not_a_file_name_is_rejected(tmp):
    bad = {"__key__": "k", "a/../../x": b"1"}
    with pytest.raises(JobError, match="can't be a file name"):
        list(shell_samples([bad], "true", tmpdir=str(tmp)))
    assert list(shell_samples([bad], "true", tmpdir=str(tmp), on_error="skip", warn=lambda m: None)) == []
    assert not (tmp.parent / "x").exists() and os.listdir(tmp) == []


def test_symlinks_are_not_collected(tmp):
    warnings: list[str] = []
    out = list(shell_samples(make(1), "ln -s /etc/passwd sample.pw", tmpdir=str(tmp), warn=warnings.append))
    assert fields(out) == [("k000", {"txt": b"text 0"})]
    assert warnings and "sample.pw" in warnings[0] and "not a regular file" in warnings[0]


def test_no_files_left_drops_the_sample(tmp):
    stats = JobStats()
    cmd = '[ "$INDEX" = 1 ] || rm sample.*'
    out = list(shell_samples(make(3), cmd, tmpdir=str(tmp), stats=stats))
    assert [s["__key__"] for s in out] == ["k001"]
    assert (stats.outputs, stats.dropped) == (1, 2)


def test_fields_and_exclude_filter_what_is_collected(tmp):
    cmd = "echo 1 > sample.a.json; echo 2 > sample.b.json; echo 3 > sample.tmp"
    out = list(shell_samples(make(1), cmd, fields=["*.json", "txt"], exclude=["b.*"], tmpdir=str(tmp)))
    assert sorted(fields(out)[0][1]) == ["a.json", "txt"]


def test_order_is_kept_with_random_durations(tmp):
    # durations decreasing over each group of 4 so that later samples finish first
    samples = [dict(s, cls=str((3 - i % 4) * 0.03).encode()) for i, s in enumerate(make(16))]
    out = list(shell_samples(samples, "sleep $(cat sample.cls)", workers=4, tmpdir=str(tmp)))
    assert [s["__key__"] for s in out] == [s["__key__"] for s in samples]


def test_unordered_emits_as_completed_same_multiset(tmp):
    samples = [dict(s, cls=b"0.6" if i == 0 else b"0") for i, s in enumerate(make(8))]
    out = list(shell_samples(samples, "sleep $(cat sample.cls)", workers=2, ordered=False, tmpdir=str(tmp)))
    assert sorted(fields(out)) == sorted(fields(samples))
    assert out[0]["__key__"] != "k000" and out[-1]["__key__"] == "k000"


@pytest.mark.parametrize("ordered", [True, False])
def test_window_bounds_samples_in_flight_or_waiting(tmp, ordered):
    # a slow first sample and fast others: an ordered run must not read ahead beyond the window
    consumed = 0
    worst = 0
    emitted = 0

    def source():
        nonlocal consumed
        for s in [dict(s, cls=b"0.5" if i == 0 else b"0") for i, s in enumerate(make(40))]:
            consumed += 1
            yield s

    for _ in shell_samples(source(), "sleep $(cat sample.cls)", workers=2, window=5, ordered=ordered,
                           tmpdir=str(tmp)):
        emitted += 1
        worst = max(worst, consumed - emitted + 1)  # + 1: the one being handed to us
    assert emitted == 40
    assert worst <= 5


def test_command_stdout_and_stderr_go_to_on_log_never_into_samples(tmp):
    logs: list[tuple[str, bytes]] = []
    out = list(shell_samples(make(2), "echo out-$KEY; echo err >&2", tmpdir=str(tmp),
                             on_log=lambda key, log: logs.append((key, log))))
    assert fields(out) == fields(make(2))
    assert logs == [("k000", b"out-k000\nerr\n"), ("k001", b"out-k001\nerr\n")]


def test_log_field(tmp):
    logs: list = []
    out = list(shell_samples(make(1), "echo hello; echo oops >&2", log_field="LOG", tmpdir=str(tmp),
                             on_log=lambda *a: logs.append(a)))
    assert out[0]["log"] == b"hello\noops\n" and logs == []


FAILING = '[ "$INDEX" != 1 ] || { echo "bad thing in $KEY" >&2; exit 3; }'


def test_on_error_fail_names_key_status_and_output_tail(tmp):
    with pytest.raises(JobError) as e:
        list(shell_samples(make(3), FAILING, workers=2, tmpdir=str(tmp)))
    message = str(e.value)
    assert message.startswith("in.tar: sample 'k001' (input #1): command exited with status 3")
    assert "bad thing in k001" in message and "\n" not in message
    assert e.value.key == "k001"
    assert os.listdir(tmp) == []


def test_on_error_skip_and_keep(tmp):
    warnings: list[str] = []
    stats = JobStats()
    out = list(shell_samples(make(3), FAILING + "; echo new > sample.new", on_error="skip", tmpdir=str(tmp),
                             stats=stats, warn=warnings.append))
    assert [s["__key__"] for s in out] == ["k000", "k002"]
    assert (stats.failed, stats.skipped) == (1, 1)
    assert len(warnings) == 1 and "'k001'" in warnings[0] and "skipping" in warnings[0]

    stats = JobStats()
    out = list(shell_samples(make(3), FAILING + "; echo new > sample.new", on_error="keep", tmpdir=str(tmp),
                             stats=stats, warn=lambda m: None))
    assert [sorted(s) for s in out] == [["__key__", "__url__", "new", "txt"], ["__key__", "__url__", "txt"],
                                        ["__key__", "__url__", "new", "txt"]]
    assert fields(out)[1] == fields(make(3))[1]
    assert (stats.failed, stats.kept, stats.outputs) == (1, 1, 3)


@pytest.mark.parametrize("policy", ["fail", "skip", "keep"])
def test_timeout_kills_the_whole_group(tmp, policy):
    marker = f"631.{os.getpid()}{ord(policy[0])}"  # seconds: past pytest's timeout, were the group waited for
    cmd = f'if [ "$INDEX" = 1 ]; then (sleep {marker}; echo late > sample.late) & sleep {marker}; fi'
    stats = JobStats()
    run = shell_samples(make(3), cmd, workers=2, timeout=0.5, on_error=policy, tmpdir=str(tmp), stats=stats,
                        warn=lambda m: None)
    if policy == "fail":
        with pytest.raises(JobError, match=r"'k001' \(input #1\): command timed out after 0.5 s"):
            list(run)
    else:
        out = list(run)
        assert [s["__key__"] for s in out] == (["k000", "k002"] if policy == "skip" else ["k000", "k001", "k002"])
        assert "late" not in out[1]
        assert stats.timed_out == 1
    assert processes_with(marker) == []
    assert os.listdir(tmp) == []


def test_background_jobs_are_killed_when_the_command_exits(tmp):
    marker = f"632.{os.getpid()}"  # seconds: past pytest's timeout, were the jobs waited for
    out = list(shell_samples(make(2), f"sleep {marker} & echo started", tmpdir=str(tmp), on_log=lambda *a: None))
    assert len(out) == 2
    assert processes_with(marker) == []


def test_closing_early_kills_running_commands_and_removes_directories(tmp):
    marker = f"633.{os.getpid()}"  # seconds: past pytest's timeout, were the commands waited for
    run = shell_samples(make(10), f'[ "$INDEX" = 0 ] || sleep {marker}', workers=3, tmpdir=str(tmp))
    assert next(run)["__key__"] == "k000"
    wait_for(lambda: live_processes_with(marker), what="the other commands sleeping")
    assert len(os.listdir(tmp)) >= 1
    run.close()
    assert processes_with(marker) == []
    assert os.listdir(tmp) == []


def test_script_file(tmp, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text('cat sample.txt sample.txt > sample.twice\n')
    out = list(shell_samples(make(1), script=str(script), tmpdir=str(tmp)))
    assert out[0]["twice"] == b"text 0text 0"


def test_collected_file_over_the_size_limit_is_an_error(tmp):
    with pytest.raises(JobError, match="larger than 10 bytes"):
        list(shell_samples(make(1), "head -c 11 /dev/zero > sample.big", max_file_size=10, tmpdir=str(tmp)))


def test_missing_tmpdir_is_a_clear_error(tmp):
    from tarproc.errors import TarprocError

    with pytest.raises(TarprocError, match="cannot run a job in .*nowhere"):
        list(shell_samples(make(2), "true", tmpdir=str(tmp / "nowhere")))


def test_bad_arguments():
    with pytest.raises(OptionError):
        shell_samples([], "true", on_error="ignore")
    with pytest.raises(OptionError):
        shell_samples([], "true", workers=4, window=2)
    with pytest.raises(OptionError):
        shell_samples([], None)
    with pytest.raises(OptionError):
        shell_samples([], "true", timeout=0)


def test_field_filter():
    keep = field_filter(exclude=["j*"])
    assert [f for f in ["jpg", "json", "cls"] if keep(f)] == ["cls"]


# ---------------------------------------------------------------------------------------------
# Python functions


@pytest.fixture
def funcs(tmp_path, monkeypatch):
    """A module ``tpfuncs`` importable by name (on sys.path) and as a file."""
    path = tmp_path / "tpfuncs.py"
    path.write_text(textwrap.dedent("""
        import os, time

        def upper(sample):
            sample["txt"] = sample["txt"].upper()
            sample["n"] = str(os.getpid())
            return sample

        def new(sample):
            return {"out": sample["txt"] + b"!"}

        def odd_only(sample):
            return sample if int(sample["__key__"][1:]) % 2 else None

        def boom(sample):
            if sample["__key__"] == "k001":
                raise ValueError("no good\\nsecond line")
            return sample

        def slow_first(sample):
            if sample["__key__"] == "k000":
                time.sleep(0.4)
            return sample

        def not_a_dict(sample):
            return 3

        def die(sample):
            if sample["__key__"] == "k002":
                os._exit(7)
            return sample
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("tpfuncs", None)
    return path


def test_map_applies_function_in_worker_processes(funcs):
    stats = JobStats()
    out = list(map_samples(make(20), "tpfuncs:upper", workers=2, stats=stats))
    assert [s["txt"] for s in out] == [f"TEXT {i}".encode() for i in range(20)]
    pids = {s["n"] for s in out}
    assert str(os.getpid()) not in pids and 1 <= len(pids) <= 2
    assert (stats.inputs, stats.outputs) == (20, 20)


def test_map_from_file_key_defaults_and_none_drops(funcs):
    out = list(map_samples(make(2), f"{funcs}:new"))
    assert fields(out) == [("k000", {"out": b"text 0!"}), ("k001", {"out": b"text 1!"})]
    stats = JobStats()
    out = list(map_samples(make(6), "tpfuncs:odd_only", workers=2, stats=stats))
    assert [s["__key__"] for s in out] == ["k001", "k003", "k005"] and stats.dropped == 3


def test_map_order_and_unordered(funcs):
    out = list(map_samples(make(12), "tpfuncs:slow_first", workers=2, window=4))
    assert [s["__key__"] for s in out] == [f"k{i:03d}" for i in range(12)]
    out = list(map_samples(make(12), "tpfuncs:slow_first", workers=2, window=4, chunk=1, ordered=False))
    assert sorted(s["__key__"] for s in out) == [f"k{i:03d}" for i in range(12)]
    assert out[0]["__key__"] != "k000"


def test_map_error_policies(funcs):
    with pytest.raises(JobError) as e:
        list(map_samples(make(4), "tpfuncs:boom", workers=2))
    assert "sample 'k001' (input #1): function tpfuncs:boom raised ValueError: no good (at tpfuncs.py:" in str(e.value)
    out = list(map_samples(make(4), "tpfuncs:boom", on_error="skip", warn=lambda m: None))
    assert [s["__key__"] for s in out] == ["k000", "k002", "k003"]
    out = list(map_samples(make(4), "tpfuncs:boom", on_error="keep", warn=lambda m: None))
    assert fields(out) == fields(make(4))
    with pytest.raises(JobError, match="returned a int, not a dict"):
        list(map_samples(make(1), "tpfuncs:not_a_dict"))


def test_map_worker_death_is_an_error_naming_the_sample(funcs):
    with pytest.raises(JobError, match=r"worker process exited with status 7 while processing sample 'k002'"):
        list(map_samples(make(6), "tpfuncs:die", workers=2, chunk=1))


def test_map_fields_filter(funcs):
    out = list(map_samples(make(1), "tpfuncs:upper", exclude=["n"]))
    assert fields(out) == [("k000", {"txt": b"TEXT 0"})]


@pytest.mark.parametrize("spec", ["nocolon", "tpfuncs:missing", "no_such_module_xyz:f", "tpfuncs:", "nofile.py:f"])
def test_bad_function_specs_are_usage_errors(funcs, spec):
    with pytest.raises(OptionError):
        map_samples([], spec)


def test_load_function():
    assert load_function("os.path:join")("a", "b") == "a/b"


# ---------------------------------------------------------------------------------------------
# found in review: per-sample failures, --log collisions, long outputs


def test_log_field_that_the_command_also_wrote_is_a_sample_error(tmp):
    warnings: list[str] = []
    out = list(shell_samples(make(2), "echo data > sample.log", log_field="log", on_error="skip", tmpdir=str(tmp),
                             warn=warnings.append))
    assert out == []
    assert len(warnings) == 2 and "which --log also names" in warnings[0]


def test_a_field_that_cannot_be_a_file_fails_only_its_sample(tmp):
    samples = make(3)
    samples[1]["f" * 300] = b"x"  # a file name longer than the file system allows
    warnings: list[str] = []
    out = list(shell_samples(samples, "true", on_error="skip", tmpdir=str(tmp), warn=warnings.append))
    assert [s["__key__"] for s in out] == ["k000", "k002"]
    assert "k001" in warnings[0] and "cannot write field" in warnings[0]
    assert os.listdir(tmp) == []


def test_a_command_removing_its_own_directory_fails_only_its_sample(tmp):
    cmd = 'if [ "$INDEX" = 1 ]; then rm -rf "$SAMPLE_DIR"; fi'
    out = list(shell_samples(make(3), cmd, on_error="skip", tmpdir=str(tmp), warn=lambda m: None))
    assert [s["__key__"] for s in out] == ["k000", "k002"]


def test_long_output_reaches_stderr_shortened(tmp):
    logs: list[bytes] = []
    cmd = "head -c 2000000 /dev/zero | tr '\\0' x; echo END"
    list(shell_samples(make(1), cmd, tmpdir=str(tmp), on_log=lambda key, log: logs.append(log)))
    (log,) = logs
    assert len(log) < 600_000 and b"bytes of output left out" in log and log.endswith(b"END\n")


def test_log_field_larger_than_the_member_limit_is_a_sample_error(tmp):
    with pytest.raises(JobError, match="more than 1000 bytes of output"):
        list(shell_samples(make(1), "head -c 5000 /dev/zero", log_field="log", max_file_size=1000, tmpdir=str(tmp)))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux-only")
def test_map_workers_end_when_their_parent_is_killed(tmp_path):
    import signal
    import subprocess

    (tmp_path / "slowmod.py").write_text("import time\ndef slow(s):\n    time.sleep(0.2)\n    return s\n")
    data = tmp_path / "in.tar"
    from tarproc import TarWriter

    with open(data, "wb") as f, TarWriter(f) as w:
        for s in make(200):
            w.write_sample(s)
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = subprocess.Popen([sys.executable, "-m", "tarproc.cli.tarproc", "-q", "-p", "2", "--map", "slowmod:slow",
                             str(data), "-o", os.devnull], env=env, start_new_session=True,
                            stderr=subprocess.DEVNULL)
    # the forked workers share the parent's process group
    wait_for(lambda: len(live_group_members(proc.pid)) >= 3, what="tarproc and its two workers running")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert settled(lambda: live_group_members(proc.pid)) == [], "--map workers outlived their parent"


def test_ctrl_c_handed_to_a_job_thread_still_stops_the_run(tmp_path):
    """The kernel hands a process's Ctrl-C to any thread that doesn't block it, and Python then
    only sets a flag for the main thread to act on. Here it goes to a job thread (as it did, now and
    then, on a loaded machine: tarproc -p 2 ran on): the main thread still raises
    KeyboardInterrupt, the commands are killed and their directories removed."""
    import subprocess

    marker = f"631.{os.getpid()}"  # seconds: only a kill ends the commands
    script = textwrap.dedent(f"""
        import signal, sys, threading
        import tarproc.process as process

        def start_group(*args, **kw):
            proc = real(*args, **kw)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # to this job thread, not the main one
            return proc

        real, process.start_group = process.start_group, start_group
        try:
            list(process.shell_samples([{{"__key__": f"k{{i}}", "txt": b"x"}} for i in range(4)],
                                       "sleep {marker}", workers=2, tmpdir=sys.argv[1]))
        except KeyboardInterrupt:
            print("interrupted")
    """)
    try:
        r = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                           timeout=PATIENCE)
        assert r.stdout.strip() == "interrupted", r.stderr
        assert os.listdir(tmp_path) == []
        assert processes_with(marker) == []
    finally:  # a run that hung left its commands (in sessions of their own) behind
        subprocess.run(["pkill", "-f", marker])


# ---------------------------------------------------------------------------------------------
# a full --tmpdir (issue 14): the directory and the cause are named, and the run stops


def pretend_full(monkeypatch, directory, free_blocks=0):
    """``os.statvfs`` says the file system of ``directory`` has ``free_blocks`` blocks of 4096 bytes left."""
    import types

    real = os.statvfs

    def statvfs(path):
        if os.path.abspath(path).startswith(str(directory)):
            return types.SimpleNamespace(f_bavail=free_blocks, f_frsize=4096)
        return real(path)

    monkeypatch.setattr(os, "statvfs", statvfs)


@pytest.mark.parametrize("policy", ["fail", "skip", "keep"])
def test_command_failing_on_a_full_tmpdir_names_it_and_the_cause(tmp, monkeypatch, policy):
    from tarproc.errors import TarprocError

    pretend_full(monkeypatch, tmp)
    warnings: list[str] = []
    # the command's own message would have gone to its log, in the full directory: here it is silent
    with pytest.raises(TarprocError) as info:
        list(shell_samples(make(3), "exit 1", on_error=policy, tmpdir=str(tmp), warn=warnings.append))
    message = str(info.value)
    assert not isinstance(info.value, JobError)
    assert f"cannot run jobs in {tmp}: No space left on device (0 bytes free)" in message
    assert "sample 'k000' (input #0) exited with status 1" in message
    assert warnings == [] and os.listdir(tmp) == []


def test_command_failing_with_space_left_is_the_sample_error_it_was(tmp, monkeypatch):
    pretend_full(monkeypatch, tmp, free_blocks=1000)
    with pytest.raises(JobError, match="exited with status 1"):
        list(shell_samples(make(1), "exit 1", tmpdir=str(tmp)))
    pretend_full(monkeypatch, tmp, free_blocks=0)  # a full disk does not fail a command that succeeds
    assert len(list(shell_samples(make(2), "true", tmpdir=str(tmp)))) == 2


def test_no_space_to_write_the_fields_stops_the_run_naming_the_directory(tmp, monkeypatch):
    import errno

    from tarproc import process
    from tarproc.errors import TarprocError

    def full(path, value):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    monkeypatch.setattr(process, "_write_file", full)
    warnings: list[str] = []
    with pytest.raises(TarprocError, match=f"cannot run jobs in {tmp}: No space left on device") as info:
        list(shell_samples(make(3), "true", on_error="skip", tmpdir=str(tmp), warn=warnings.append))
    assert not isinstance(info.value, JobError)
    assert warnings == [] and os.listdir(tmp) == []
