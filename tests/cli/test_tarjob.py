"""The tarjob command: local pool, Dask (a real LocalCluster), manifests run locally, resume, stops."""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tarhelpers import live_processes_with, settled, wait_for

from tarproc.cli.tarjob import main as tarjob

VENV_BIN = str(Path(sys.executable).parent)



def run(cli, args, **kw):
    return cli.run(tarjob, args, **kw)


def journal(path="tarjob.jsonl"):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def ok_counts(records):
    counts: dict[str, int] = {}
    for r in records:
        if r["status"] == "ok":
            counts[r["shard"]] = counts.get(r["shard"], 0) + 1
    return counts


def tarjob_process(args, cwd, **kw):
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""), **kw.pop("env", {}))
    return subprocess.Popen([sys.executable, "-m", "tarproc.cli.run", "tarjob", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


# -------------------------------------------------------------------------------------------
# the local pool


def test_end_to_end_with_tarproc(cli, here):
    for s in range(4):
        cli.write_tar(here / f"in-{s}.tar", [cli.make_sample(f"s{s}/{i}", i) for i in range(3)])
    r = run(cli, ["-s", "{0..3}", "-j", "2", "--", "tarproc", "-q", "-c", "echo $KEY > sample.txt",
                  "in-{}.tar", "-o", "out-{}.tar"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""
    assert "tarjob: 4 shards: 4 done, 0 skipped, 0 failed in " in r.stderr
    for s in range(4):
        members = dict(cli.members((here / f"out-{s}.tar").read_bytes()))
        assert members[f"s{s}/1.txt"] == f"s{s}/1\n".encode()
        assert f"s{s}/2.jpg" in members
    records = journal()
    assert sorted(r["shard"] for r in records) == ["0", "1", "2", "3"]
    assert all(r["status"] == "ok" and r["engine"] == "local" and r["exit_code"] == 0 for r in records)
    assert cli.leftovers(here) == []


def test_resume_skips_done_shards_and_force_reruns(cli, here):
    args = ["-s", "{0..4}", "--retries", "0", "--", "bash", "-c", "echo run >> {}.runs; [ {} != 3 ] || [ -e fixed ]"]
    r = run(cli, args)
    assert r.exit_code == 1
    assert r.stderr.splitlines()[-1] == "tarjob: error: 1 of 5 shards failed: 3 (see tarjob.jsonl)"
    (here / "fixed").write_text("")
    r = run(cli, args)
    assert r.exit_code == 0, r.stderr
    assert "tarjob: skipped 4 done" in r.stderr and "5 shards: 1 done, 4 skipped, 0 failed" in r.stderr
    assert [(here / f"{s}.runs").read_text().count("run") for s in range(5)] == [1, 1, 1, 2, 1]
    r = run(cli, ["-q", "--redo", *args])
    assert r.exit_code == 0 and r.stderr == ""
    assert ok_counts(journal()) == {"0": 2, "1": 2, "2": 2, "3": 2, "4": 2}


def test_failure_is_reported_with_its_output_tail(cli, here):
    r = run(cli, ["-s", "{a,b,c}", "--retries", "1", "--backoff", "0.05", "--", "bash", "-c",
                  "echo working on {}; [ {} != b ] || { echo 'cannot open in-b.tar' >&2; exit 4; }"])
    assert r.exit_code == 1
    err = r.stderr.splitlines()
    assert "tarjob: warning: shard b exited with status 4 (attempt 1 of 2); retrying in 0.05 s" in err
    i = err.index("tarjob: shard b exited with status 4 (after 2 attempts)")
    assert err[i + 1:i + 3] == ["b: working on b", "b: cannot open in-b.tar"]
    assert err[-1] == "tarjob: error: 1 of 3 shards failed: b (see tarjob.jsonl)"
    failed = [r for r in journal() if r["status"] == "failed"]
    assert [(r["shard"], r["attempt"], r["exit_code"]) for r in failed] == [("b", 1, 4), ("b", 2, 4)]
    assert failed[0]["output_tail"] == "working on b\ncannot open in-b.tar\n"


def test_timeout(cli, here):
    # 1000 and 2000 s: past pytest's timeout, were the jobs waited for
    r = run(cli, ["-s", "{1..2}", "--timeout", "0.3", "--retries", "0", "--", "bash", "-c", "sleep {}000"])
    assert r.exit_code == 1
    assert "tarjob: shard 1 timed out after 0.3 s" in r.stderr
    assert [r["status"] for r in journal()] == ["timeout", "timeout"]


def test_shell_dry_run_and_log_dir(cli, here):
    r = run(cli, ["-s", "{x,it's}", "--shell", "--dry-run", "--", "echo {} | wc -c > {}.n"])
    assert r.exit_code == 0
    quoted = shlex.quote("it's")
    assert [shlex.split(line) for line in r.stdout.splitlines()] == [
        ["bash", "-c", "echo x | wc -c > x.n"], ["bash", "-c", f"echo {quoted} | wc -c > {quoted}.n"]]
    assert not Path("tarjob.jsonl").exists()
    r = run(cli, ["-q", "-s", "{x,it's}", "--shell", "--log-dir", "logs", "--",
                  "echo {} | wc -c > {}.n; echo $TARJOB_INDEX"])
    assert r.exit_code == 0, r.stderr
    assert (here / "it's.n").read_text().strip() == "5"
    assert (here / "logs" / "it_s.log").read_text() == "1\n"


@pytest.mark.parametrize("args, text", [
    (["-s", "{0..2}", "--", "echo", "hi"], "the command has no '{}'"),
    (["-s", "{0..2}"], "no command"),
    (["-s", "{0,1,0}", "--", "echo", "{}"], "names '0' twice"),
    (["-s", "{0..2}", "--k8s-manifest", "j.yaml", "--", "echo", "{}"], "needs --image"),
    (["-s", "{0..2}", "--index", "3", "--", "echo", "{}"], "SPEC has 3 shards"),
    (["-s", "{0..2}", "--index", "1", "--dask", "local", "--", "echo", "{}"], "can't be used together"),
])
def test_usage_errors(cli, here, args, text):
    r = run(cli, args)
    assert r.exit_code == 2
    assert r.stderr.startswith("tarjob: error: ") and text in r.stderr.splitlines()[0]


@pytest.mark.parametrize("spec, setup, text", [
    ("@ids.txt", None, "tarjob: error: ids.txt: cannot read the shard list: No such file or directory"),
    ("nothing/*.tar", None, "no files match 'nothing/*.tar'"),
    ("{0..2}", "garbage\n", "tarjob: error: tarjob.jsonl: line 1: not a JSON record of tarjob"),
])
def test_bad_inputs_are_one_line_errors(cli, here, spec, setup, text):
    if setup:
        (here / "tarjob.jsonl").write_text(setup)
    r = run(cli, ["-s", spec, "--", "echo", "{}"])
    assert r.exit_code == 1
    assert text in cli.one_line_error(r, "tarjob")


def test_truncated_journal_line_is_a_warning(cli, here):
    (here / "tarjob.jsonl").write_text('{"shard": "0", "status": "ok", "command": "true \'{}\'"}\n{"shard": "1", "st')
    r = run(cli, ["-s", "{0..1}", "--", "true", "{}"])
    assert r.exit_code == 0, r.stderr
    assert "warning: tarjob.jsonl: line 2: a truncated record" in r.stderr and "skipped 1 done" in r.stderr
    assert ok_counts(journal_tolerant()) == {"0": 1, "1": 1}


def journal_tolerant():
    out = []
    for line in Path("tarjob.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


@pytest.mark.parametrize("sig, status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_stop_kills_running_commands_and_records_nothing(here, sig, status):
    marker = f"tarjob-stop-{sig}-{os.getpid()}"
    command = f"touch {{}}.started; sleep 30; : {marker}"
    proc = tarjob_process(["-q", "-s", "{0..3}", "-j", "2", "--", "bash", "-c", command], cwd=here)
    wait_for(lambda: len(list(here.glob("*.started"))) >= 2, what="two jobs starting")
    assert live_processes_with(marker)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == status, err
    assert settled(lambda: live_processes_with(marker)) == []
    assert not (here / "tarjob.jsonl").exists() or (here / "tarjob.jsonl").read_text() == ""


# -------------------------------------------------------------------------------------------
# clusters: manifests, executed locally


def test_k8s_manifest_and_its_index_path_run_locally(cli, here):
    for s in range(3):
        cli.write_tar(here / f"in-{s}.tar", [cli.make_sample(f"s{s}/0", 0)])
    r = run(cli, ["-s", "{0..2}", "-j", "2", "--retries", "4", "--k8s-manifest", "job.yaml", "--image", "reg/t:1",
                  "--", "tarproc", "-q", "-c", "echo $KEY > sample.k", "in-{}.tar", "-o", "out-{}.tar"])
    assert r.exit_code == 0, r.stderr
    assert "wrote job.yaml: Indexed Job 'tarjob' of 3 shards" in r.stderr
    (job,) = yaml.safe_load_all((here / "job.yaml").read_text())
    assert job["spec"]["completionMode"] == "Indexed"
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"], spec["backoffLimitPerIndex"]) == (3, 2, 4)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    # what the kubelet runs in pod 1: $(JOB_COMPLETION_INDEX) expanded, $$ turned into $
    argv = [a.replace("$(JOB_COMPLETION_INDEX)", "1").replace("$$", "$")
            for a in container["command"] + container["args"]]
    p = subprocess.run(argv, cwd=here, env=dict(os.environ, JOB_COMPLETION_INDEX="1"), capture_output=True)
    assert p.returncode == 0, p.stderr
    assert dict(cli.members((here / "out-1.tar").read_bytes()))["s1/0.k"] == b"s1/0\n"
    assert not (here / "out-0.tar").exists()
    # a pod's file system goes with it (and may be read-only): no journal there by default
    assert argv[argv.index("--journal") + 1] == "/dev/null" and not (here / "tarjob.jsonl").exists()


def test_k8s_pods_share_a_journal_given_by_path(cli, here):
    r = run(cli, ["-s", "{0..2}", "--journal", "shared/j.jsonl", "--k8s-manifest", "job.yaml", "--image", "img",
                  "--", "bash", "-c", "echo run >> $0.runs", "{}"])
    assert r.exit_code == 0, r.stderr
    (job,) = yaml.safe_load_all((here / "job.yaml").read_text())
    (container,) = job["spec"]["template"]["spec"]["containers"]
    argv = [a.replace("$(JOB_COMPLETION_INDEX)", "1").replace("$$", "$") for a in container["command"] + container["args"]]
    (here / "shared").mkdir()
    for _ in range(2):  # the second time: a pod the Job ran again finds its shard done
        p = subprocess.run(argv, cwd=here, capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    (rec,) = journal("shared/j.jsonl")
    assert (rec["shard"], rec["index"], rec["status"], rec["engine"]) == ("1", 1, "ok", "index")
    assert (here / "1.runs").read_text() == "run\n"


def test_k8s_only_failed_indexes_of_a_glob_spec(cli, here):
    for name in ["c", "a", "b"]:
        (here / f"{name}.in").write_text(name)
    r = run(cli, ["-s", "*.in", "--only", "0,2", "--k8s-manifest", "retry.yaml", "--image", "img", "--name", "again",
                  "--", "cp", "{}", "{}.out"])
    assert r.exit_code == 0, r.stderr
    cm, job = yaml.safe_load_all((here / "retry.yaml").read_text())
    assert cm["kind"] == "ConfigMap" and cm["data"]["shards"] == "a.in\nc.in\n"
    assert job["spec"]["completions"] == 2
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (here / "shards").write_text(cm["data"]["shards"])  # the mounted ConfigMap
    argv = [a.replace("$(JOB_COMPLETION_INDEX)", "1").replace("@/etc/tarjob/shards", "@shards")
            for a in container["command"] + container["args"]]
    p = subprocess.run(argv, cwd=here, capture_output=True)
    assert p.returncode == 0, p.stderr
    assert (here / "c.in.out").read_text() == "c" and not (here / "a.in.out").exists()


@pytest.mark.parametrize("spec", ["{0..2}", "*.in"])
def test_slurm_script_runs_locally(cli, here, spec):
    for s in range(3):
        (here / f"{s}.in").write_text(f"data {s}")
    shard = "1" if spec == "{0..2}" else "1.in"
    r = run(cli, ["-s", spec, "-j", "2", "--journal", "j.jsonl", "--retries", "1", "--backoff", "0.05",
                  "--slurm", "job.sh", "--",
                  "bash", "-c", "cp $0 $0.out; [ -z \"$FAIL\" ]", "{}" if spec != "{0..2}" else "{}.in"])
    assert r.exit_code == 0, r.stderr
    text = (here / "job.sh").read_text()
    assert "#SBATCH --array=0-2%2" in text and "set -euo pipefail" in text
    assert os.access(here / "job.sh", os.X_OK)
    env = dict(os.environ, SLURM_ARRAY_TASK_ID="1")
    p = subprocess.run(["bash", "job.sh"], cwd=here, env=env, capture_output=True)
    assert p.returncode == 0, p.stderr
    assert (here / "1.in.out").read_text() == "data 1" and not (here / "0.in.out").exists()
    (rec,) = journal("j.jsonl")
    assert (rec["shard"], rec["index"], rec["status"]) == (shard, 1, "ok")
    p = subprocess.run(["bash", "job.sh"], cwd=here, env=dict(env, SLURM_ARRAY_TASK_ID="2", FAIL="1"),
                       capture_output=True, text=True)
    assert p.returncode == 1
    assert p.stderr.splitlines()[-1].startswith("tarjob: error: shard ") and "exited with status 1" in p.stderr


# -------------------------------------------------------------------------------------------
# Dask: a real LocalCluster (scheduler here, worker processes, all on 127.0.0.1)

needs_dask = pytest.mark.skipif(importlib.util.find_spec("distributed") is None,
                                reason="distributed is not installed (pip install 'tarproc[dask]')")
# on a worker, the command's parent is the keeper (see run.py): the worker is the keeper's parent
WORKER_PID = "echo $(ps -o ppid= -p $PPID)"


@pytest.mark.slow
@needs_dask
def test_dask_local_cluster(cli, here):
    r = run(cli, ["-s", "{0..5}", "--dask", "local", "-j", "2", "--retries", "1", "--backoff", "0.05", "--",
                  "bash", "-c", f"{WORKER_PID} > {{}}.worker; [ {{}} != 4 ] || [ -e 4.worker.seen ] || "
                  "{ touch 4.worker.seen; echo flaky >&2; exit 9; }"])
    assert r.exit_code == 0, r.stderr
    assert "warning: shard 4 exited with status 9 (attempt 1 of 2)" in r.stderr
    records = journal()
    assert ok_counts(records) == {str(s): 1 for s in range(6)}
    assert {r["engine"] for r in records} == {"dask"}
    workers = {(here / f"{s}.worker").read_text() for s in range(6)}
    assert len(workers) <= 2 and str(os.getpid()) + "\n" not in workers  # ran in the worker processes


@pytest.mark.slow
@needs_dask
@pytest.mark.parametrize("allowed_failures", ["0", "3"])
def test_dask_worker_killed_mid_run(here, allowed_failures):
    """SIGKILL the worker running shard 1. Dask reschedules its task on another worker (3: the
    default); with 0 it gives up at once (KilledWorker): a 'killed' attempt, and tarjob retries."""
    cmd = f"{WORKER_PID} >> {{}}.pids; sleep 1; echo done {{}} > {{}}.out"
    proc = tarjob_process(["-s", "{0..3}", "--dask", "local", "-j", "2", "--retries", "2", "--backoff", "0.1",
                           "--", "bash", "-c", cmd], cwd=here,
                          env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": allowed_failures})
    victim = here / "1.pids"
    pids = wait_for(lambda: victim.exists() and victim.read_text().split(), what="shard 1's worker saying its pid")
    os.kill(int(pids[0]), signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    records = journal(here / "tarjob.jsonl")
    assert ok_counts(records) == {"0": 1, "1": 1, "2": 1, "3": 1}  # none lost, none twice
    killed = [r["shard"] for r in records if r["status"] == "killed"]
    assert ("1" in killed) if allowed_failures == "0" else killed == []
    assert len(victim.read_text().split()) == 2  # it ran again, in another worker process
    for s in range(4):
        assert (here / f"{s}.out").read_text() == f"done {s}\n"
