"""The tarproc command: per-sample shell jobs and --map, through the CLI and real pipes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from tarhelpers import PATIENCE, live_processes_with, settled, wait_for

from tarproc.cli.tarproc import main as tarproc


@pytest.fixture
def data(cli, tmp_path):
    samples = [cli.make_sample(f"d/{i:04d}", i, size=100 + i) for i in range(12)]
    path = cli.write_tar(tmp_path / "in.tar", samples)
    return path, cli.expected_of(samples)


@pytest.fixture
def jobs_tmp(tmp_path):
    d = tmp_path / "jobs"
    d.mkdir()
    return d


def run(cli, args, **kw):
    return cli.run(tarproc, args, **kw)


def test_true_output_is_byte_identical_to_tarcat(cli, data, jobs_tmp):
    path, expected = data
    r = run(cli, ["-p", "3", "-c", "true", "--tmpdir", jobs_tmp, path])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == cli.run(cli.tarcat, [path]).stdout_bytes
    assert cli.samples(r.stdout_bytes) == expected
    assert r.stderr.startswith("tarproc: 12 samples in, 12 out in ")
    assert os.listdir(jobs_tmp) == []


def test_reads_stdin_and_writes_output_file(cli, data, tmp_path):
    path, expected = data
    out = tmp_path / "out.tar"
    r = run(cli, ["-q", "-c", "rm sample.json; echo $KEY > sample.key", "-o", out], input=path.read_bytes())
    assert r.exit_code == 0, r.stderr
    assert r.stderr == ""
    got = cli.samples(str(out))
    assert [k for k, _ in got] == [k for k, _ in expected]
    assert all(sorted(f) == ["cls", "jpg", "key"] and f["key"] == k.encode() + b"\n" for k, f in got)


def test_command_output_goes_to_stderr_prefixed_with_the_key(cli, data):
    path, _ = data
    r = run(cli, ["-p", "2", "-c", "echo to-stdout; echo to-stderr >&2", path])
    assert r.exit_code == 0, r.stderr
    lines = r.stderr.splitlines()
    assert lines[:4] == ["d/0000: to-stdout", "d/0000: to-stderr", "d/0001: to-stdout", "d/0001: to-stderr"]
    assert b"to-std" not in r.stdout_bytes


def test_log_field(cli, data):
    path, _ = data
    r = run(cli, ["-q", "-c", "echo hello $INDEX", "--log", "log", "-f", "log", path])
    assert r.exit_code == 0, r.stderr
    assert r.stderr == ""
    assert cli.samples(r.stdout_bytes)[3] == ("d/0003", {"log": b"hello 3\n"})


def test_fields_and_exclude(cli, data):
    path, _ = data
    r = run(cli, ["-q", "-c", "true", "--exclude", "jpg", "--exclude", "json", path])
    assert {tuple(f) for _, f in cli.samples(r.stdout_bytes)} == {("cls",)}
    r = run(cli, ["-q", "-c", "true", "-f", "jpg,js*", path])
    assert {tuple(sorted(f)) for _, f in cli.samples(r.stdout_bytes)} == {("jpg", "json")}


def test_on_error_fail_one_line_error_and_no_output_file(cli, data, tmp_path, jobs_tmp):
    path, _ = data
    out = tmp_path / "out.tar"
    cmd = '[ "$INDEX" != 5 ] || { echo "cannot convert" >&2; exit 4; }'
    r = run(cli, ["-q", "-p", "2", "--log", "log", "-c", cmd, "-o", out, "--tmpdir", jobs_tmp, path])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarproc")
    assert line == (f"tarproc: error: {path}: sample 'd/0005' (input #5): command exited with status 4; "
                    "its output ends: cannot convert")
    assert not out.exists() and cli.leftovers(tmp_path) == []
    assert os.listdir(jobs_tmp) == []


def test_on_error_skip_keep_and_summary(cli, data):
    path, expected = data
    cmd = '[ "$INDEX" != 5 ] || exit 4; echo x > sample.new'
    r = run(cli, ["-e", "skip", "-c", cmd, path])
    assert r.exit_code == 0, r.stderr
    assert [k for k, _ in cli.samples(r.stdout_bytes)] == [k for k, _ in expected if k != "d/0005"]
    assert "warning: sample 'd/0005' (input #5): command exited with status 4; skipping it" in r.stderr
    assert "12 samples in, 11 out" in r.stderr and "1 failed, 0 timed out: 1 skipped, 0 kept" in r.stderr
    r = run(cli, ["--on-error", "keep", "-c", cmd, path])
    got = cli.samples(r.stdout_bytes)
    assert got[5] == expected[5] and "new" in got[4][1]
    assert "1 failed, 0 timed out: 0 skipped, 1 kept" in r.stderr


def test_timeout(cli, data):
    path, _ = data
    # 600 s: past pytest's timeout, were the command waited for
    r = run(cli, ["-q", "--command-timeout", "0.3", "-c", '[ "$INDEX" != 2 ] || sleep 600', path])
    assert r.exit_code == 1
    assert "sample 'd/0002' (input #2): command timed out after 0.3 s" in cli.one_line_error(r, "tarproc")


def test_unordered_same_samples(cli, data):
    path, expected = data
    r = run(cli, ["-q", "-p", "3", "--unordered", "-c", '[ "$INDEX" != 0 ] || sleep 0.3', path])
    assert r.exit_code == 0, r.stderr
    got = cli.samples(r.stdout_bytes)
    assert sorted(got) == sorted(expected) and got[0][0] != "d/0000"


def test_script(cli, data, tmp_path):
    path, _ = data
    script = tmp_path / "job.sh"
    script.write_text("wc -c < sample.jpg > sample.size\n")
    r = run(cli, ["-q", "-s", script, "-f", "size", path])
    assert cli.samples(r.stdout_bytes)[1] == ("d/0001", {"size": b"101\n"})


def test_map(cli, data, tmp_path):
    path, expected = data
    module = tmp_path / "mapfns.py"
    module.write_text(textwrap.dedent("""
        def size(sample):
            return {"size": len(sample["jpg"])}
        def fail_on_3(sample):
            if sample["__key__"].endswith("3"):
                raise RuntimeError("bad sample")
            return sample
    """))
    r = run(cli, ["-q", "-p", "2", "--map", f"{module}:size", path])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == [(k, {"size": str(len(f["jpg"])).encode()}) for k, f in expected]
    r = run(cli, ["-q", "--map", f"{module}:fail_on_3", path])
    assert r.exit_code == 1
    assert "sample 'd/0003' (input #3): function" in cli.one_line_error(r, "tarproc")
    assert "raised RuntimeError: bad sample" in r.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give one of -c CMD, -s SCRIPT or --map"),
        (["-c", "true", "--map", "os:getcwd"], "(not -c and --map)"),
        (["--map", "os:getcwd", "--command-timeout", "1"], "--command-timeout works with -c and -s only"),
        (["--map", "no_such_module_xyz:f"], "cannot import 'no_such_module_xyz'"),
        (["-c", "true", "-p", "4", "--window", "2"], "window (2) must be at least"),
    ],
)
def test_usage_errors(cli, data, args, message):
    path, _ = data
    r = run(cli, [*args, path])
    assert r.exit_code == 2, r.stderr
    assert message in r.stderr


def test_damaged_input_is_a_one_line_error(cli, data, tmp_path, jobs_tmp):
    path, _ = data
    bad = tmp_path / "bad.tar"
    bad.write_bytes(path.read_bytes()[:3000])
    out = tmp_path / "out.tar"
    r = run(cli, ["-q", "-c", "true", "--tmpdir", jobs_tmp, bad, "-o", out])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarproc")
    assert str(bad) in line and "at byte" in line
    assert not out.exists() and cli.leftovers(tmp_path) == [] and os.listdir(jobs_tmp) == []


def test_bad_shard_policy_skips_a_damaged_input(cli, data, tmp_path):
    path, expected = data
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"garbage" * 200)
    r = run(cli, ["-q", "-c", "true", "--on-bad-shard", "skip-shard", bad, path])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == expected


def test_help_has_examples(cli):
    r = run(cli, ["--help"])
    assert r.exit_code == 0
    assert "Examples:" in r.stdout and "tarproc -p 8 -c" in r.stdout


# ---------------------------------------------------------------------------------------------
# real processes


def _command(*args):
    return [sys.executable, "-m", "tarproc.cli.tarproc", *map(str, args)]


def test_real_pipeline(cli, data, tmp_path):
    path, expected = data
    pipeline = (
        f"{sys.executable} -m tarproc.cli.tarcat {path} -c 5 "
        f"| {sys.executable} -m tarproc.cli.tarproc -q -p 2 -c 'tr a-z A-Z < sample.json > sample.up' "
        f"| tar -tf - | head -n 4"
    )
    r = subprocess.run(["bash", "-o", "pipefail", "-c", pipeline], capture_output=True, timeout=60)
    assert r.stdout.decode().split() == ["d/0000.cls", "d/0000.jpg", "d/0000.json", "d/0000.up"]


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_kills_commands_and_removes_directories(data, tmp_path, sig, status):
    path, _ = data
    private = tmp_path / "tmp"
    private.mkdir()
    marker = f"630.{os.getpid()}{sig}"  # seconds: only a kill ends the commands within the wait below
    env = dict(os.environ, TMPDIR=str(private))
    proc = subprocess.Popen(_command("-p", "2", "-c", f"sleep {marker}", path, "-o", tmp_path / "out.tar"),
                            env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    wait_for(lambda: len([d for d in os.listdir(private) if d.startswith("tarproc-")]) >= 2,
             what="the commands' directories")
    # the directories come first, then bash, then the command: wait for both commands (tarproc's
    # own command line holds the marker too)
    wait_for(lambda: len(live_processes_with(marker)) >= 3, what="the commands starting")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=PATIENCE)
    assert proc.returncode == status, err
    assert err.decode().strip().splitlines()[-1] in ("tarproc: interrupted", "tarproc: terminated")
    assert os.listdir(private) == []
    assert not (tmp_path / "out.tar").exists() and [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []
    assert settled(lambda: live_processes_with(marker)) == []


def test_full_tmpdir_is_a_one_line_error_naming_it_and_the_cause(cli, data, tmp_path, jobs_tmp, monkeypatch):
    import types

    path, _ = data
    real = os.statvfs
    monkeypatch.setattr(os, "statvfs", lambda p: types.SimpleNamespace(f_bavail=0, f_frsize=4096)
                        if str(p).startswith(str(jobs_tmp)) else real(p))
    out = tmp_path / "out.tar"
    r = run(cli, ["-q", "-p", "2", "-c", "exit 1", "-e", "skip", "--tmpdir", jobs_tmp, path, "-o", out])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarproc")
    assert f"cannot run jobs in {jobs_tmp}: No space left on device" in line
    assert "exited with status 1" in line
    assert not out.exists() and os.listdir(jobs_tmp) == []
