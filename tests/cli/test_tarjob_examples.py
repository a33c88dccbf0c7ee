"""Every tarjob line of the help, the README and docs/recipes.md runs as written (with --dry-run
where it would run commands; the manifests are written for real and parsed; --status reads an
empty journal)."""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
import yaml

from tarproc.cli.tarjob import EPILOG
from tarproc.cli.tarjob import main as tarjob

REPO = Path(__file__).resolve().parents[2]


def tarjob_lines(text: str) -> list[str]:
    """The ``tarjob ...`` commands of ``text``, continuation lines joined, cut at ``&&``."""
    out = []
    lines = iter(text.splitlines())
    for line in lines:
        line = line.strip()
        if not line.startswith("tarjob "):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + next(lines).strip()
        out.append(line.split(" && ")[0])
    return out


def readme_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("### tarjob: one job per shard")
    return text[start:text.index("\n### ", start + 1)]


EXAMPLES = [("help", line) for line in tarjob_lines(EPILOG)] + \
    [("README", line) for line in tarjob_lines(readme_section())] + \
    [("recipes", line) for line in tarjob_lines((REPO / "docs" / "recipes.md").read_text())]


def test_examples_are_found():
    assert {where for where, _ in EXAMPLES} == {"help", "README", "recipes"} and len(EXAMPLES) >= 12


@pytest.mark.parametrize("where, line", EXAMPLES)
def test_example_runs(cli, tmp_path, monkeypatch, where, line):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("failed", "3,17,40-42")  # what kubectl prints as failedIndexes
    monkeypatch.setenv("day", "20261121")
    for name in ["books-0000.tar", "books-0001.tar", "shards/a.tar", "shards/b.tar"]:
        Path(name).parent.mkdir(exist_ok=True)
        Path(name).write_bytes(b"")
    Path("failed.txt").write_text("0003\n0017\n")
    args = [os.path.expandvars(a) for a in shlex.split(line)[1:]]
    writes = "--k8s-manifest" in args or "--slurm" in args
    runs_nothing = writes or "--status" in args
    r = cli.run(tarjob, args if runs_nothing else ["--dry-run", *args])
    assert r.exit_code == 0, f"{where}: {line}\n{r.stderr}"
    if "--status" in args and "-q" in args:
        assert re.fullmatch(r"0-\d+\n", r.stdout)  # the --only list: all of them
    elif "--status" in args:
        assert re.match(r"\d+ shards of .*: 0 done, 0 failed, \d+ missing\n", r.stdout)
    elif not writes:
        assert r.stdout.count("\n") >= 2 and "{}" not in r.stdout
    elif "--k8s-manifest" in args:
        docs = list(yaml.safe_load_all(Path(args[args.index("--k8s-manifest") + 1]).read_text()))
        assert docs[-1]["spec"]["completionMode"] == "Indexed"
    else:
        text = Path(args[args.index("--slurm") + 1]).read_text()
        array = re.search(r"^#SBATCH --array=([-,0-9]+)", text, re.M)
        assert array and array[1] == (args[args.index("--only") + 1] if "--only" in args else array[1])
        assert "--only" in args or array[1].startswith("0-")
