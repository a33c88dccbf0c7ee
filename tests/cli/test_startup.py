"""Start-up: the commands that run many times in shell pipelines start without the standard-library
modules that only some runs need (tarproc imports each where it is used)."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from tarhelpers import write_tar

REPO = Path(__file__).resolve().parents[2]

# imported on demand: pipe: and --post (subprocess, shlex), sha256 manifests (hashlib), output
# files (tempfile), manifests and JSON previews (json), .bz2/.xz (bz2, lzma), --traceback
# (traceback), --shuffle and --summary (random), --view (shutil)
LAZY = {"bz2", "hashlib", "json", "lzma", "random", "shlex", "shutil", "subprocess", "tempfile", "traceback"}

# what a command's own work needs on every run, so its modules import it at the top
NEEDED = {
    "tarproc.cli.tarindex": {"json"},  # tarproc.index writes (and reads) JSON Lines
    "tarproc.cli.tar2tsv": {"hashlib", "json"},  # tarproc.tables: sha256 and JSON columns
}


def _loaded_by(module: str) -> set[str]:
    """The modules that importing ``module`` loads in a fresh interpreter, beyond click's own."""
    code = (
        "import sys, click\n"
        "before = set(sys.modules)\n"
        f"import {module}\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    return set(r.stdout.split())


@pytest.mark.parametrize(
    "module",
    ["tarproc.cli.tarcat", "tarproc.cli.tarsplit", "tarproc.cli.tarindex", "tarproc.cli.tarshow",
     "tarproc.cli.tar2tsv"],
)
def test_commands_start_without_modules_only_some_runs_need(module):
    loaded = _loaded_by(module)
    assert module in loaded  # the import really happened in the child
    unexpected = sorted((loaded & LAZY) - NEEDED.get(module, set()))
    assert unexpected == [], f"importing {module} loads {unexpected}: import them where they are used"


@pytest.mark.parametrize("runner", ["console", "bin"])
def test_a_command_process_freezes_what_importing_made(runner, tmp_path):
    """A command run as a program (a console script, or bin/'s ``python -m tarproc.cli.run``)
    moves what importing made out of the collector's way (gc.freeze) before it works; in-process
    callers that pass args (CliRunner, the tests) keep their process as it is."""
    probe = (
        "import gc, sys\n"
        "from tarproc.cli import run\n"
        "from tarproc.cli.common import TarprocCommand\n"
        "real = TarprocCommand.invoke\n"
        "def invoke(self, ctx):\n"
        "    print(gc.get_freeze_count() > 0, file=sys.stderr)\n"
        "    return real(self, ctx)\n"
        "TarprocCommand.invoke = invoke\n"
    )
    probe += ("sys.argv = ['x', 'tarcat', '-q', sys.argv[1]]\nrun.main()\n" if runner == "bin" else
              "from tarproc.cli.tarcat import main\nsys.argv = ['tarcat', '-q', sys.argv[1]]\nmain()\n")
    shard = write_tar(tmp_path / "s.tar", [{"__key__": "a", "txt": b"x"}])
    r = subprocess.run([sys.executable, "-c", probe, str(shard)], capture_output=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().split() == ["True"]

    from tarproc.cli.tarcat import main as tarcat

    frozen = gc.get_freeze_count()
    assert CliRunner().invoke(tarcat, ["-q", str(shard), "-o", str(tmp_path / "o.tar")]).exit_code == 0
    assert gc.get_freeze_count() == frozen
