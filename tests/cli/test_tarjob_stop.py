"""Stopping tarjob: Ctrl-C on --dask leaves no command (nor what it started) on the workers; a
stopped local run gives its commands SIGTERM first, so that writers clean up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tarhelpers import live_processes_with, settled, wait_for

VENV_BIN = str(Path(sys.executable).parent)


def test_ctrl_c_on_a_dask_run_leaves_no_command_running(tmp_path):
    pytest.importorskip("distributed")
    marker = f"30.{time.time_ns()}"  # in the command line of the command's child: 'sleep 30.NNN'
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tarproc.cli.run", "tarjob", "-q", "-s", "{0..3}", "--dask", "local", "-j", "2",
         "--", "bash", "-c", f"touch {{}}.started; sleep {marker}; true"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("*.started"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(live_processes_with(f"sleep {marker}")) >= 4  # tarjob, keepers, bash, sleep
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert out == b"" and err.decode().splitlines()[-1] == "tarjob: interrupted"
    assert settled(lambda: live_processes_with(f"sleep {marker}")) == []
    assert (tmp_path / "tarjob.jsonl").read_text() == ""  # nothing recorded for what was stopped


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_run_lets_the_writers_remove_their_temporary_files(cli, here, sig):
    """A stop (Ctrl-C, kill, scancel) sends SIGTERM to the commands first: tarproc, half-way through
    writing its shard, removes the temporary file; nothing is left under a final name either."""
    for s in range(2):
        cli.write_tar(here / f"in-{s}.tar", [cli.make_sample(f"s{s}/{i}", i) for i in range(20)])
    env = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
    proc = subprocess.Popen(
        [sys.executable, "-m", "tarproc.cli.run", "tarjob", "-q", "-s", "{0..1}", "-j", "2", "--",
         "tarproc", "-q", "-p", "1", "-c", "sleep 0.2", "in-{}.tar", "-o", "out-{}.tar"],
        cwd=here, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    wait_for(lambda: len(cli.leftovers(here)) >= 2, what="both shards being written")
    assert len(cli.leftovers(here)) == 2
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig, err
    # they ended on SIGTERM, not on the SIGKILL that follows it: a killed tarproc leaves its temporaries
    assert cli.leftovers(here) == [] and list(here.glob("out-*")) == []
    assert (here / "tarjob.jsonl").read_text() == ""
