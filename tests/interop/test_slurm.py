"""tarjob --slurm on a real Slurm: the generated array script submitted with sbatch to a single-node
cluster on 127.0.0.1 (the ``slurm`` fixture: munged, slurmctld, slurmd), every output shard and the
journal checked; a failed shard found with --status and run again with --only; scancel mid-run.
Skipped, with the reason, where Slurm is not installed (make test installs it as root)."""

from __future__ import annotations

import datetime
import json
import os
import re
import time
from pathlib import Path

import pytest

from tarproc.cli.tarjob import main as tarjob
from tarproc.jobs.spec import parse_index_list

SAMPLES = 3


@pytest.fixture
def job_dir(tmp_path, monkeypatch, ix):
    """A directory with in-{0..7}.tar (3 samples each); the tests run tarjob here."""
    monkeypatch.chdir(tmp_path)
    for s in range(8):
        ix.write_tar(tmp_path / f"in-{s}.tar", [ix.make_sample(f"s{s}/{i}", i, size=100) for i in range(SAMPLES)])
    return tmp_path


def tarproc_command(per_sample: str) -> list[str]:
    return ["--", "tarproc", "-q", "-p", "1", "-c", per_sample, "in-{}.tar", "-o", "out-{}.tar"]


def write_script(ix, args, name):
    r = ix.run(tarjob, [*args[:args.index("--")], "--slurm", name, *args[args.index("--"):]])
    assert r.exit_code == 0, r.stderr
    return Path(name).read_text()


def records(path="j.jsonl"):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def status(ix, args, *extra):
    r = ix.run(tarjob, [*args[:args.index("--")], "--status", *extra, *args[args.index("--"):]])
    assert r.exit_code == 0, r.stderr
    return r.stdout


def check_output(ix, shard):
    """out-SHARD.tar is complete: every sample of in-SHARD.tar, with the field the command added."""
    got = ix.samples(f"out-{shard}.tar")
    assert [key for key, _ in got] == [f"s{shard}/{i}" for i in range(SAMPLES)]
    for key, fields in got:
        assert fields["txt"] == f"{key}\n".encode() and len(fields["jpg"]) == 100


def leftovers(directory):
    return sorted(n for n in os.listdir(directory) if ".tmp-" in n)


def most_at_once(recs):
    """The most attempts that ran at the same time, from the journal's start and seconds."""
    events = []
    for r in recs:
        start = datetime.datetime.strptime(r["start"], "%Y-%m-%dT%H:%M:%S.%fZ").timestamp()
        events += [(start, 1), (start + r["seconds"], -1)]
    now = peak = 0
    for _, step in sorted(events):
        now += step
        peak = max(peak, now)
    return peak


def test_array_of_8_shards_2_at_a_time_then_the_failed_one_again_with_only(slurm, job_dir, ix):
    fixed = job_dir / "fixed"
    # shard 5's second sample fails until 'fixed' exists: tarproc stops, its output is not written
    args = ["-s", "{0..7}", "-j", "2", "--retries", "1", "--backoff", "0.1", "--journal", "j.jsonl",
            *tarproc_command(f'[ "$KEY" != s5/1 ] || [ -e {fixed} ] || {{ echo "s5/1 is bad" >&2; exit 3; }}; '
                             'sleep 0.2; echo "$KEY" > sample.txt')]
    script = write_script(ix, args, "job.sh")
    assert "#SBATCH --array=0-7%2" in script
    job = slurm.sbatch("job.sh", job_dir)
    slurm.wait(job)

    # Slurm's own view: task 5 failed (exit status 1: tarjob's), the others completed
    tasks = slurm.tasks(job)
    assert {t: s.split()[0] for t, s in tasks.items()} == {
        str(i): ("FAILED" if i == 5 else "COMPLETED") for i in range(8)}, tasks
    assert tasks["5"].split()[1] == "1:0"
    for s in (0, 1, 2, 3, 4, 6, 7):
        check_output(ix, s)
    assert not (job_dir / "out-5.tar").exists() and leftovers(job_dir) == []
    recs = records()
    assert sorted((r["shard"], r["status"], r["attempt"]) for r in recs) == sorted(
        [(str(s), "ok", 1) for s in range(8) if s != 5] + [("5", "failed", 1), ("5", "failed", 2)])
    assert all(r["engine"] == "index" and r["index"] == int(r["shard"]) for r in recs)
    assert {r["exit_code"] for r in recs if r["status"] == "failed"} == {1}
    assert "s5/1 is bad" in next(r for r in recs if r["status"] == "failed")["output_tail"]
    assert most_at_once(recs) == 2  # %2: two tasks at a time on the 2 CPUs, never more
    log = (job_dir / f"tarjob-{job}_5.out").read_text()
    assert "tarjob: error: shard 5 (number 5) failed: exited with status 1" in log

    report = status(ix, args)
    assert report.splitlines()[0] == "8 shards of '{0..7}' in j.jsonl: 7 done, 1 failed, 0 missing"
    assert "  shard 5 (number 5) exited with status 1 (2 attempts, last on " in report
    assert report.splitlines()[-1] == "re-run: --only 5"
    only = status(ix, args, "-q").strip()
    assert only == "5"

    fixed.write_text("")
    retry = write_script(ix, ["--only", only, *args], "retry.sh")
    assert "#SBATCH --array=5%2" in retry  # the task id is the shard number, as in the first array
    retry_job = slurm.sbatch("retry.sh", job_dir)
    slurm.wait(retry_job)
    assert slurm.tasks(retry_job) == {"5": "COMPLETED 0:0"}
    check_output(ix, 5)
    assert status(ix, args).splitlines()[-1] == "all done" and status(ix, args, "-q") == ""
    assert [(r["shard"], r["index"], r["status"]) for r in records()[len(recs):]] == [("5", 5, "ok")]


def test_scancel_mid_run_leaves_no_partial_output_then_only_the_missing_ones_run(slurm, job_dir, ix):
    args = ["-s", "{0..5}", "-j", "2", "--retries", "0", "--journal", "j.jsonl",
            *tarproc_command('echo "$KEY" > sample.txt; sleep 1')]
    write_script(ix, args, "job.sh")
    job = slurm.sbatch("job.sh", job_dir)
    deadline = time.monotonic() + 60
    # mid-run: two tasks writing their shards (under temporary names), some samples in
    while len(leftovers(job_dir)) < 2 or len(slurm.running(job)) < 2:
        assert time.monotonic() < deadline, f"no two shards being written: {slurm.log_tail()}"
        time.sleep(0.1)
    slurm.client("scancel", job)
    slurm.wait(job, timeout=60)

    states = {t: s.split()[0] for t, s in slurm.tasks(job).items()}
    assert "CANCELLED" in states.values(), states
    outputs = sorted(p.name for p in job_dir.glob("out-*.tar"))
    for name in outputs:  # whatever is under a final name is whole
        check_output(ix, re.fullmatch(r"out-(\d+)\.tar", name)[1])
    assert leftovers(job_dir) == []  # the writers stopped by the signal removed their temporary files
    done = {r["shard"] for r in records()} if (job_dir / "j.jsonl").exists() else set()
    assert all(r["status"] == "ok" for r in (records() if done else []))  # a cancelled attempt records nothing
    assert {f"out-{s}.tar" for s in done} <= set(outputs)
    missing = [s for s in range(6) if str(s) not in done]
    assert len(missing) >= 2

    only = status(ix, args, "-q").strip()
    assert parse_index_list(only) == missing
    report = status(ix, args)
    assert f"{len(missing)} missing" in report.splitlines()[0] and report.splitlines()[-1] == f"re-run: --only {only}"
    write_script(ix, ["--only", only, *args], "retry.sh")
    retry_job = slurm.sbatch("retry.sh", job_dir)
    slurm.wait(retry_job)
    for s in range(6):
        check_output(ix, s)
    assert status(ix, args, "-q") == "" and leftovers(job_dir) == []
