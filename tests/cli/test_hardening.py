"""Command-level regression tests for problems found in review."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from tarhelpers import PATIENCE, wait_for


def test_manifest_in_a_missing_directory_fails_before_any_shard(cli, shards, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    r = cli.run(cli.tarsplit, ["-n", "2", "-o", str(out / "s"), "--manifest", str(tmp_path / "nodir" / "m.jsonl"),
                               *shards.paths])
    assert r.exit_code == 1
    assert "nodir" in cli.one_line_error(r, "tarsplit")
    assert os.listdir(out) == []


def test_rekey_with_a_dot_is_a_usage_error(cli, shards):
    r = cli.run(cli.tarcat, ["--rekey", "v1.0-%06d", shards.paths[0]])
    assert r.exit_code == 2 and "dot" in r.stderr


def test_tarsplit_to_stdout_is_a_usage_error(cli, shards):
    r = cli.run(cli.tarsplit, ["-o", "-", shards.paths[0]])
    assert r.exit_code == 2


@pytest.mark.parametrize(
    "args",
    [["--seed", "1"], ["--missing", "skip"], ["-f", ""], ["--slice", "5:1"], ["-f", "a/b:jpg"]],
)
def test_options_that_would_be_ignored_or_select_nothing_are_usage_errors(cli, shards, args):
    r = cli.run(cli.tarcat, [*args, shards.paths[0]])
    assert r.exit_code == 2, r.stderr


def test_pipe_output_reports_the_commands_status(cli, shards):
    r = cli.run(cli.tarcat, ["-o", "pipe:exit 3", *shards.paths])
    assert r.exit_code == 1
    assert "status 3" in cli.one_line_error(r, "tarcat")


def test_post_does_not_eat_tarsplits_stdin(cli, shards, tmp_path):
    data = b"".join(open(p, "rb").read() for p in shards.paths[:1])
    r = cli.run(cli.tarsplit, ["-n", "1", "-o", str(tmp_path / "p"), "--post", "head -c 100000 >/dev/null; true"],
                input=data)
    assert r.exit_code == 0, r.stderr
    assert len([n for n in os.listdir(tmp_path) if n.startswith("p-")]) == 4


def test_sighup_cleans_up_like_sigterm(scripts, tmp_path):
    out = tmp_path / "x.tar"
    started = tmp_path / "started"
    proc = subprocess.Popen(
        [scripts.tarcat, f"pipe:touch {started}; head -c 20000 /dev/zero | tail -c 0; sleep 600", "-o", str(out)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    wait_for(started.exists, what="tarcat starting its pipe: command")
    proc.send_signal(signal.SIGHUP)
    _, err = proc.communicate(timeout=PATIENCE)  # were the pipe waited for, this would time out
    assert proc.returncode == 128 + signal.SIGHUP, err
    assert not out.exists()
    assert [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []


@pytest.mark.parametrize("command, option", [
    ("tarcat", "-c"), ("tarshow", "-c"), ("tarcat", "--skip"), ("tar2tsv", "--skip"), ("tarsplit", "-n"),
    ("tardecode", "-p"), ("tarpcat", "-p"), ("tarproc", "-p"), ("tarfirst", "-n"), ("tarserve", "--hwm"),
])
def test_numbers_past_their_bound_are_usage_errors(cli, shards, command, option):
    """10**23 (or 100,000 processes, an HWM past a C int) is refused by the option, not an internal error."""
    import importlib

    main = importlib.import_module(f"tarproc.cli.{command}").main
    value = {"-p": "100000", "--hwm": str(2**31)}.get(option, str(10**23))
    r = cli.run(main, [option, value, shards.paths[0]])
    assert r.exit_code == 2 and "is not in the range" in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize("command, option", [
    ("tarserve", "--heartbeat"), ("tarserve", "--send-timeout"), ("tarshow", "-d"), ("tardecode", "--flip"),
    ("tarcat", "--timeout"), ("tarproc", "--timeout"),
])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_seconds_and_probabilities_must_be_finite(cli, shards, command, option, value):
    import importlib

    main = importlib.import_module(f"tarproc.cli.{command}").main
    r = cli.run(main, [option, value, shards.paths[0]])
    assert r.exit_code == 2 and ("is not a finite number" in r.stderr or "is not in the range" in r.stderr)
