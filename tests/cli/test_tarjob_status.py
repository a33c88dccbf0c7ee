"""tarjob --status: the shards of SPEC the journal has done, failed or missing, and the --only list
to run the others again (journals as a local run, Slurm array tasks and Kubernetes pods write them)."""

from __future__ import annotations

import json

import pytest

from tarproc.cli.tarjob import main as tarjob
from tarproc.jobs.spec import format_index_list, parse_index_list

COMMAND = ["--", "bash", "-c", "[ $0 != 05 ] || [ -e fixed ]", "{}"]
TEXT = "bash -c '[ $0 != 05 ] || [ -e fixed ]' '{}'"  # as the journal has it


def rec(shard, status="ok", command=TEXT, **kw):
    return {"shard": shard, "index": int(shard) if shard.isdigit() else 0, "status": status, "attempt": 1, "seconds": 0.1, "host": "node-3",
            "exit_code": 0 if status == "ok" else 4, "output_tail": "", "start": "2026-11-21T02:31:07.25Z",
            "engine": "index", "command": command, **kw}


def write_journal(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def status(cli, *args):
    return cli.run(tarjob, ["-s", "{00..09}", "--status", *args])


def test_after_a_run_with_a_failure(cli, here):
    r = cli.run(tarjob, ["-q", "-s", "{00..07}", "--retries", "1", "--backoff", "0", *COMMAND])
    assert r.exit_code == 1
    r = status(cli, *COMMAND)
    assert r.exit_code == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[:4] == ["10 shards of '{00..09}' in tarjob.jsonl: 7 done, 1 failed, 2 missing",
                         "done: 0-4,6-7", "failed: 5", "missing: 8-9"]
    assert lines[4].startswith("  shard 05 (number 5) exited with status 1 (2 attempts, last on ")
    assert lines[5:] == ["re-run: --only 5,8-9"]
    r = status(cli, "-q", *COMMAND)
    assert (r.exit_code, r.stdout, r.stderr) == (0, "5,8-9\n", "")
    # what it says to run runs exactly those, and then all is done
    (here / "fixed").write_text("")
    r = cli.run(tarjob, ["-s", "{00..09}", "--only", "5,8-9", *COMMAND])
    assert r.exit_code == 0 and "3 shards: 3 done, 0 skipped" in r.stderr
    assert status(cli, *COMMAND).stdout.splitlines() == [
        "10 shards of '{00..09}' in tarjob.jsonl: 10 done, 0 failed, 0 missing", "done: 0-9", "all done"]
    assert status(cli, "-q", *COMMAND).stdout == ""


def test_only_some_shards(cli, here):
    write_journal(here / "tarjob.jsonl", [rec("01"), rec("02", "failed"), rec("02", "timeout")])
    r = status(cli, "--only", "1-3", *COMMAND)
    assert r.stdout.splitlines()[0] == "3 shards of '{00..09}' in tarjob.jsonl: 1 done, 1 failed, 1 missing"
    assert "  shard 02 (number 2) timed out (2 attempts, last on node-3 at 2026-11-21T02:31:07.25Z)" in r.stdout
    assert r.stdout.splitlines()[-1] == "re-run: --only 2-3"


def test_shards_are_matched_by_id_not_by_the_records_index(cli, here):
    """Pods of a Kubernetes Job of --only 3,7 number their shards 0 and 1 (the ConfigMap's list)."""
    write_journal(here / "tarjob.jsonl", [rec("03", index=0), rec("07", "failed", index=1), rec("07", index=1)])
    r = status(cli, *COMMAND)
    assert "done: 3,7" in r.stdout.splitlines() and r.stdout.splitlines()[-1] == "re-run: --only 0-2,4-6,8-9"


def test_records_of_other_commands_and_shards(cli, here):
    write_journal(here / "tarjob.jsonl", [rec("01"), rec("02", command="other {}"), rec("99"), rec("x")])
    r = status(cli, *COMMAND)  # the job's own records only
    assert "1 done, 0 failed, 9 missing" in r.stdout and r.stderr == ""
    r = status(cli)  # without COMMAND: any command's, with a word about it
    assert "2 done, 0 failed, 8 missing" in r.stdout
    assert r.stderr == ("tarjob: warning: tarjob.jsonl has records of 2 commands for these shards: counting them "
                        "all (give the job's COMMAND after -- to count its own)\n")


def test_a_failure_after_an_ok_keeps_the_shard_done(cli, here):
    """A shard run again (--force, or two array tasks of it) that failed the second time: its output
    was made once; it stays done."""
    write_journal(here / "tarjob.jsonl", [rec("04"), rec("04", "failed")])
    assert status(cli, "--only", "4", *COMMAND).stdout.splitlines()[-1] == "all done"


def test_no_journal_yet(cli, here):
    r = status(cli, "--journal", "j.jsonl", *COMMAND)
    assert r.exit_code == 0 and r.stdout.splitlines()[-1] == "re-run: --only 0-9"
    assert r.stderr == "tarjob: warning: j.jsonl: no such journal (yet): every shard is missing\n"


def test_many_failures_are_cut_short(cli, here):
    write_journal(here / "tarjob.jsonl", [rec(f"{i:03d}", "failed") for i in range(30)])
    r = cli.run(tarjob, ["-s", "{000..029}", "--status", *COMMAND])
    lines = r.stdout.splitlines()
    assert sum(1 for line in lines if line.startswith("  shard ")) == 20
    assert "  ... and 10 more (jq 'select(.status != \"ok\")' tarjob.jsonl)" in lines
    assert lines[-1] == "re-run: --only 0-29"


@pytest.mark.parametrize("args, text", [
    (["--dry-run"], "--status and --dry-run can't be used together"),
    (["--redo"], "--status and --redo can't be used together"),
    (["--slurm", "job.sh"], "--slurm and --status can't be used together"),
    (["--only", "10"], "SPEC has 10 shards"),
    (["--", "echo", "hi"], "the command has no '{}'"),
])
def test_usage_errors(cli, here, args, text):
    r = status(cli, *args)
    assert r.exit_code == 2 and text in r.stderr.splitlines()[0]


def test_a_bad_journal_is_a_one_line_error(cli, here):
    (here / "tarjob.jsonl").write_text("garbage\n")
    r = status(cli)
    assert r.exit_code == 1
    assert cli.one_line_error(r, "tarjob") == "tarjob: error: tarjob.jsonl: line 1: not a JSON record of tarjob"


@pytest.mark.parametrize("numbers", [[0], [3, 17, 40, 41, 42], [1, 2], list(range(10)), [0, 2, 4, 5, 6, 9]])
def test_index_lists_round_trip(numbers):
    assert parse_index_list(format_index_list(numbers)) == numbers
