"""Ctrl-C on tarjob --dask: 130, and no command (nor what it started) left on the workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tarhelpers import live_processes_with, settled

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
