"""tarjob's journal across jobs, and the errors found before any shard runs."""

from __future__ import annotations

import json

import pytest

from tarproc.cli.tarjob import main as tarjob


def test_two_jobs_over_the_same_ids_share_a_journal_without_skipping_each_other(cli, here):
    first = ["-s", "{0..2}", "--", "bash", "-c", "echo a > $0.a", "{}"]
    second = ["-s", "{0..2}", "--", "bash", "-c", "echo b > $0.b", "{}"]
    assert cli.run(tarjob, first).exit_code == 0
    r = cli.run(tarjob, second)
    assert r.exit_code == 0, r.stderr
    assert "warning: tarjob.jsonl has 3 of these shards done by another command: running them" in r.stderr
    assert sorted(p.name for p in here.glob("*.b")) == ["0.b", "1.b", "2.b"]
    r = cli.run(tarjob, second)  # the same command again: all done
    assert "3 shards: 0 done, 3 skipped" in r.stderr and "another command" not in r.stderr
    records = [json.loads(line) for line in (here / "tarjob.jsonl").read_text().splitlines()]
    assert {r["command"] for r in records} == {"bash -c 'echo a > $0.a' '{}'", "bash -c 'echo b > $0.b' '{}'"}


def test_an_unwritable_journal_is_an_error_before_any_shard_runs(cli, here):
    r = cli.run(tarjob, ["-s", "{0..1}", "--journal", "no/such/dir/j.jsonl", "--", "touch", "{}.ran"])
    assert r.exit_code == 1
    assert cli.one_line_error(r, "tarjob") == "tarjob: error: no/such/dir/j.jsonl: cannot write the journal: " \
                                              "No such file or directory"
    assert list(here.glob("*.ran")) == []


def test_nothing_to_do_starts_no_cluster(cli, here):
    (here / "tarjob.jsonl").write_text('{"shard": "0", "status": "ok", "command": "true \'{}\'"}\n')
    r = cli.run(tarjob, ["-s", "0", "--dask", "tcp://127.0.0.1:9", "--", "true", "{}"])
    assert r.exit_code == 0, r.stderr
    assert "1 shards: 0 done, 1 skipped, 0 failed" in r.stderr


def test_a_bad_dask_address_is_a_one_line_error(cli, here):
    pytest.importorskip("distributed")
    r = cli.run(tarjob, ["-s", "{0..1}", "--dask", "scheduler", "--", "true", "{}"])
    assert r.exit_code == 1
    assert cli.one_line_error(r, "tarjob").startswith("tarjob: error: scheduler: cannot connect to the Dask scheduler")


@pytest.mark.parametrize("args, text", [
    (["--k8s-manifest", "j.yaml", "--image", "i", "--name", "OCR_job"], "a Kubernetes Job name is lower-case"),
    (["--k8s-manifest", "j.yaml", "--image", "i", "--name", "x" * 64], "63 at most"),
    (["--slurm", "j.sh", "--name", "ocr job"], "a Slurm job name here has no spaces"),
])
def test_job_names_the_scheduler_would_refuse(cli, here, args, text):
    r = cli.run(tarjob, ["-s", "{0..1}", *args, "--", "true", "{}"])
    assert r.exit_code == 2 and text in r.stderr.splitlines()[0]
    assert not (here / "j.yaml").exists() and not (here / "j.sh").exists()


def test_a_log_dir_that_cannot_be_made_is_a_one_line_error(cli, here):
    (here / "afile").write_text("")
    r = cli.run(tarjob, ["-s", "0", "--log-dir", "afile/logs", "--", "touch", "{}.ran"])
    assert r.exit_code == 1
    assert cli.one_line_error(r, "tarjob") == "tarjob: error: afile/logs: cannot create the log directory: Not a directory"
    assert not (here / "0.ran").exists()
