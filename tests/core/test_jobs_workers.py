"""Commands run where a worker may die (Dask): the keeper kills what they started and keeps their
statuses; ids a manifest could only pass in a list that would change them."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from tarhelpers import PATIENCE, live_processes_with, settled, wait_for

from tarproc.errors import OptionError
from tarproc.jobs import JobOptions
from tarproc.jobs.dask_engine import _remote_attempt, _stop_run
from tarproc.jobs.manifests import ClusterJob, k8s_manifest, slurm_script
from tarproc.jobs.run import run_attempt


def test_keeper_keeps_the_exit_status():
    assert run_attempt(["bash", "-c", "echo hi; exit 3"], die_with_parent=True).exit_code == 3
    killed = run_attempt(["bash", "-c", "kill -9 $$"], die_with_parent=True)
    assert (killed.status, killed.exit_code) == ("killed", -9)
    missing = run_attempt(["/no/such/program"], die_with_parent=True)
    assert missing.exit_code == 127 and "/no/such/program: No such file" in missing.output_tail


def test_a_dying_worker_takes_the_whole_command_with_it(tmp_path):
    """SIGKILL the process that started the command (a worker): the command's own children (a
    shell's background job, a pool) go too, not only its first process."""
    marker = f"{time.time_ns()}"
    worker = subprocess.Popen([sys.executable, "-c", (
        "from tarproc.jobs.run import run_attempt\n"
        f"run_attempt(['bash', '-c', 'sleep 30.{marker} & sleep 30.{marker}; : {marker}'], die_with_parent=True)\n"
    )])
    wait_for(lambda: len(live_processes_with(marker)) >= 3, what="the keeper, bash and the sleeps running")
    worker.kill()
    worker.wait()
    assert settled(lambda: live_processes_with(marker)) == []


def test_stopping_a_run_kills_its_commands_on_the_worker():
    """Ctrl-C on the client: cancelling a Dask future leaves a started task running; the client
    then runs _stop_run on every worker."""
    marker = f"{time.time_ns()}"
    options = JobOptions(["bash", "-c", f"sleep 600 & sleep 600; : {marker} {{}}"])  # only a kill ends it
    task = options.task("a", 0)
    result = []
    thread = threading.Thread(target=lambda: result.append(_remote_attempt(task, options, marker)))
    thread.start()
    wait_for(lambda: live_processes_with(marker), what="the job's processes starting")
    _stop_run(marker)
    thread.join(PATIENCE)
    assert result and result[0].status == "killed"
    assert settled(lambda: live_processes_with(marker)) == []
    late = _remote_attempt(task, options, marker)  # a task that starts after the stop
    assert late.status == "killed"


@pytest.mark.parametrize("shard", ["#1.tar", " a.tar", "a\nb.tar"])
def test_ids_that_a_list_would_change_are_refused_in_manifests(shard):
    job = ClusterJob("*.tar", ["x.tar", shard], False, JobOptions(["cp", "{}", "out"]))
    with pytest.raises(OptionError, match="can't be passed in a list"):
        k8s_manifest(job, "img")
    with pytest.raises(OptionError, match="can't be passed in a list"):
        slurm_script(job)
