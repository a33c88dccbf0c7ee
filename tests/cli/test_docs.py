"""The command reference in docs/ is current, and every command has help, examples and --version."""

from __future__ import annotations

import sys

import pytest

import tarproc
from tarproc.cli import COMMANDS
from tarproc.cli.docs import render
from tarproc.cli.run import load

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = None


def test_reference_is_current(cli):
    path = cli.repo / "docs" / "commands.md"
    assert path.exists(), "docs/commands.md is missing; run `make docs`"
    assert render() == path.read_text(encoding="utf-8"), (
        "docs/commands.md is out of date with the commands' --help; run `make docs` and commit the result"
    )


@pytest.mark.parametrize("name", list(COMMANDS))
def test_reference_matches_the_real_help(cli, name):
    real = cli.run(load(name), ["--help"], terminal_width=100).stdout
    reference = (cli.repo / "docs" / "commands.md").read_text(encoding="utf-8")
    section = reference.split(f"## {name}\n\n```\n", 1)[1].split("```", 1)[0]
    assert section == real


def test_render_leaves_the_commands_intact(cli):
    # click >= 8.2 caches a command's help option from the first context it is asked with
    render()
    for name in COMMANDS:
        r = cli.run(load(name), ["-h"])
        assert r.exit_code == 0, r.stderr


def test_reference_covers_every_command():
    text = render()
    for name in COMMANDS:
        assert f"## {name}\n" in text
        assert f"Usage: {name} [OPTIONS]" in text


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_has_examples(cli, name):
    command = load(name)
    for flag in ["-h", "--help"]:
        r = cli.run(command, [flag])
        assert r.exit_code == 0, r.stderr
        assert r.stderr == ""
        assert r.stdout.startswith(f"Usage: {name} ")
        assert "Example" in r.stdout
        assert "--version" in r.stdout and "--traceback" in r.stdout


@pytest.mark.parametrize("name", list(COMMANDS))
def test_version(cli, name):
    r = cli.run(load(name), ["--version"])
    assert r.exit_code == 0
    assert r.stdout == f"{name} (tarproc) {tarproc.__version__}\n"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_unknown_option_is_a_usage_error(cli, name):
    r = cli.run(load(name), ["--no-such-option"])
    assert r.exit_code == 2
    assert "No such option" in r.stderr and f"{name} --help" in r.stderr


def test_console_scripts_and_shims_follow_commands(cli):
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    project = tomllib.loads((cli.repo / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == COMMANDS
    for name in COMMANDS:
        shim = cli.repo / "bin" / name
        assert shim.exists(), f"bin/{name} is missing"
        assert shim.stat().st_mode & 0o111, f"bin/{name} is not executable"


def test_version_matches_package_metadata(cli):
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    project = tomllib.loads((cli.repo / "pyproject.toml").read_text())
    assert project["project"]["version"] == tarproc.__version__
