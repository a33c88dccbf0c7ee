"""Fixtures for the command tests (tarcat, tarsplit, docs, real pipelines).

Test modules are imported with ``--import-mode=importlib`` and cannot import each other, so the
helpers live here and are handed out through the ``cli`` fixture (a namespace of functions) and
a few data fixtures:

- ``cli.run(command, args, input=...)``: run a click command in-process with ``CliRunner``
  (stdout and stderr kept apart) and return the ``Result``.
- ``cli.write_tar(path, samples)`` / ``cli.tar_bytes(samples)``: build shards with ``TarWriter``.
- ``cli.samples(data_or_path)``: our reader's samples as ``[(key, {field: bytes})]``.
- ``cli.members(data)``: ``[(name, bytes)]`` read by Python's ``tarfile`` (an independent reader).
- ``shards``: three small shards on disk with known samples (``shards.expected``).
- ``scripts``: paths of the installed console scripts (for real subprocess pipelines).
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import sys
import tarfile
from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from tarhelpers import run, samples, tar_bytes, tarfile_members, write_tar

from tarproc.cli import COMMANDS
from tarproc.cli.run import load
from tarproc.cli.tarcat import main as tarcat_main
from tarproc.cli.tarsplit import main as tarsplit_main

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def _forget_cached_help_options() -> None:
    # click >= 8.2 caches each command's help option on first use, from the names of the context
    # it is first asked with; a context built without the command's settings (as docs.render()
    # once did) breaks '-h' for the rest of the process. Start each test clean.
    for name in COMMANDS:
        command = load(name)
        if hasattr(command, "_help_option"):
            command._help_option = None


@pytest.fixture(autouse=True)
def _isolated_cli_state(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Output must not depend on the caller's environment; the SIGTERM handler the commands
    install in-process is put back afterwards."""
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    old_term = signal.getsignal(signal.SIGTERM)
    _forget_cached_help_options()
    yield
    _forget_cached_help_options()
    signal.signal(signal.SIGTERM, old_term)


# -------------------------------------------------------------------------------------------
# helpers


def infos(data: bytes) -> list[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tf:
        return list(tf)


def expected_of(sample_dicts: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, bytes]]]:
    return [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}) for s in sample_dicts]


def leftovers(directory: str | os.PathLike[str]) -> list[str]:
    """Temporary files a sink may leave behind (``.NAME.tmp-XXXX``)."""
    return sorted(n for n in os.listdir(directory) if ".tmp-" in n)


def one_line_error(result: Any, prog: str) -> str:
    """The single ``PROG: error: ...`` line of a failed run (asserting there is exactly one)."""
    err = result.stderr
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert lines[0].startswith(f"{prog}: error: "), err
    assert "Traceback" not in err
    return lines[0]


def make_sample(key: str, i: int, size: int = 300, ext: str = "jpg") -> dict[str, Any]:
    body = (f"{key}:".encode() + bytes(range(256)) * (size // 256 + 1))[:size]
    return {"__key__": key, ext: body, "cls": str(i % 10).encode(), "json": b'{"i": %d}' % i}


@pytest.fixture(scope="session")
def cli() -> SimpleNamespace:
    return SimpleNamespace(
        run=run,
        tar_bytes=tar_bytes,
        write_tar=write_tar,
        samples=samples,
        members=tarfile_members,
        infos=infos,
        expected_of=expected_of,
        leftovers=leftovers,
        one_line_error=one_line_error,
        make_sample=make_sample,
        tarcat=tarcat_main,
        tarsplit=tarsplit_main,
        repo=REPO,
    )


@pytest.fixture
def shards(tmp_path: Path) -> SimpleNamespace:
    """Three shards of four samples each; sample 1 of each shard has a png instead of a jpg."""
    paths = []
    expected: list[dict[str, Any]] = []
    for s in range(3):
        shard_samples = []
        for i in range(4):
            n = 4 * s + i
            sample = make_sample(f"s{s}/{n:04d}", n, size=200 + 97 * n, ext="png" if i == 1 else "jpg")
            shard_samples.append(sample)
        paths.append(write_tar(tmp_path / f"shard-{s}.tar", shard_samples))
        expected.extend(shard_samples)
    return SimpleNamespace(dir=tmp_path, paths=[str(p) for p in paths], expected=expected_of(expected))


@pytest.fixture(scope="session")
def scripts() -> SimpleNamespace:
    """The installed console scripts (``pip install -e .``) and GNU tar."""
    tarcat = VENV_BIN / "tarcat"
    tarsplit = VENV_BIN / "tarsplit"
    if not (tarcat.exists() and tarsplit.exists()):
        pytest.skip(f"console scripts are not installed next to {sys.executable}")
    return SimpleNamespace(tarcat=str(tarcat), tarsplit=str(tarsplit), tar=shutil.which("tar"))


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a fresh directory, with our commands on PATH (tarjob runs them by name)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(VENV_BIN) + os.pathsep + os.environ.get("PATH", ""))
    return tmp_path
