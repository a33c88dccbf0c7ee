"""One meaning per flag across the commands (tarproc/cli/vocabulary.py), and the old spellings.

A flag that several commands have must be declared through the shared vocabulary (an option
bundle or ``shared_option`` in tarproc/cli/common.py) in each of them, or be a documented
exception; a command that declares such a flag on its own gives it a second meaning, and fails here.
"""

from __future__ import annotations

from collections import defaultdict

import click
import pytest

from tarproc.cli import COMMANDS
from tarproc.cli.common import DeprecatedOption
from tarproc.cli.run import load
from tarproc.cli.vocabulary import DEPRECATED, VOCABULARY, Deprecation


def _module(name: str) -> str:
    """Where a command is declared: tarcreate and tsv2tar share their options."""
    return COMMANDS[name].split(":")[0]


def _flags() -> dict[str, list[tuple[str, str]]]:
    """Each flag of each command, with its meaning there: the vocabulary's (``shared``), the command's
    own (``MODULE:PARAM``), or a documented exception."""
    uses: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for name in COMMANDS:
        for param in load(name).params:
            if not isinstance(param, click.Option) or isinstance(param, DeprecatedOption) or param.hidden:
                continue
            for flag in param.opts + param.secondary_opts:
                entry = VOCABULARY.get(flag)
                if entry is not None and name in entry.exceptions:
                    meaning = f"exception in {name}"
                elif getattr(param, "vocabulary", False):
                    meaning = "shared"
                else:
                    meaning = f"{_module(name)}:{param.name}"
                uses[flag].append((name, meaning))
    return uses


def test_every_flag_means_one_thing():
    problems = []
    for flag, uses in sorted(_flags().items()):
        meanings = {meaning for _, meaning in uses if not meaning.startswith("exception")}
        if len(meanings) > 1:
            own = [name for name, meaning in uses if meaning not in ("shared",) and not meaning.startswith("exc")]
            problems.append(f"{flag}: {len(meanings)} meanings ({', '.join(f'{n}: {m}' for n, m in uses)}); "
                            f"declare it with common.shared_option in {', '.join(own)}, or rename it there")
    assert not problems, "\n".join(problems)


def test_shared_flags_are_in_the_vocabulary():
    """A flag declared as shared, and any flag two commands have, has its meaning written down."""
    missing = sorted(
        flag for flag, uses in _flags().items()
        if flag not in VOCABULARY and (any(m == "shared" for _, m in uses) and len({n for n, _ in uses}) > 1
                                       or len({_module(n) for n, _ in uses}) > 1)
    )
    assert not missing, f"add these flags to tarproc/cli/vocabulary.py's VOCABULARY: {missing}"


def test_the_vocabulary_holds_no_stale_entries():
    uses = _flags()
    stale = [flag for flag in VOCABULARY if flag not in uses]
    assert not stale, f"no command has {stale}: remove them from VOCABULARY"
    for flag, entry in VOCABULARY.items():
        names = {name for name, _ in uses[flag]}
        for name in entry.exceptions:
            assert name in names, f"{flag}: the exception for {name}, which doesn't have {flag}"


def test_the_table_lists_every_flag():
    from tarproc.cli.docs import render

    text = render()
    for flag in VOCABULARY:
        assert f"| `{flag}` |" in text
    for name, deprecations in DEPRECATED.items():
        for d in deprecations:
            assert f"| {name} | `{d.old}` | `{d.new}` |" in text


# ---------------------------------------------------------------------------------------------
# old spellings: they work, say so once, and hide from --help

REQUIRED = {"tarjob": ["-s", "0"], "tarrecv": ["zpull://127.0.0.1:1"], "tarkeys": ["keys"]}

DEPRECATIONS = [(name, d) for name, ds in DEPRECATED.items() for d in ds]


def _target(command: click.Command, flag: str) -> click.Option:
    return next(p for p in command.params if isinstance(p, click.Option) and flag in p.opts + p.secondary_opts
                and not isinstance(p, DeprecatedOption))


def _value(option: click.Option) -> list[str]:
    """A value for ``option`` that differs from its default."""
    if option.is_flag:
        return []
    if isinstance(option.type, click.Choice):
        return [next(c for c in option.type.choices if c != option.default)]
    if isinstance(option.type, click.IntRange):
        return ["3"]
    if isinstance(option.type, click.FloatRange):
        return ["2.5"]
    if option.type.name == "SIZE":
        return ["1MiB"]
    return ["%06d"]


def _params(command: click.Command, name: str, args: list[str]) -> dict:
    with command.make_context(name, [*REQUIRED.get(name, []), *args]) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("name, deprecation", DEPRECATIONS, ids=[f"{n}{d.old}" for n, d in DEPRECATIONS])
def test_an_old_spelling_still_works_and_says_so_once(name: str, deprecation: Deprecation, capsys):
    command = load(name)
    value = _value(_target(command, deprecation.new))
    new = _params(command, name, [deprecation.new, *value])
    assert capsys.readouterr().err == ""
    old = _params(command, name, [deprecation.old, *value])
    assert old == new
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: {deprecation.message()}"]
    assert old != _params(command, name, []), "the test's value should differ from the default"


@pytest.mark.parametrize("name, deprecation", DEPRECATIONS, ids=[f"{n}{d.old}" for n, d in DEPRECATIONS])
def test_old_and_new_spelling_together_is_a_usage_error(name: str, deprecation: Deprecation, cli):
    command = load(name)
    value = _value(_target(command, deprecation.new))
    r = cli.run(command, [*REQUIRED.get(name, []), deprecation.old, *value, deprecation.new, *value])
    assert r.exit_code == 2
    assert f"{deprecation.old} is the old spelling of {deprecation.new}: give {deprecation.new} alone" in r.stderr


@pytest.mark.parametrize("name", sorted(DEPRECATED))
def test_old_spellings_are_hidden_from_help(name: str, cli):
    help_text = cli.run(load(name), ["--help"], terminal_width=100).stdout
    options = help_text.split("Options:", 1)[1]
    for d in DEPRECATED[name]:
        assert d.new in options
        if d.old not in {flag for p in load(name).params if not isinstance(p, DeprecatedOption)
                         for flag in getattr(p, "opts", [])}:
            assert f"  {d.old} " not in options and f"  {d.old}," not in options


def test_a_deprecation_names_an_option_the_command_has():
    for name, deprecations in DEPRECATED.items():
        command = load(name)
        for d in deprecations:
            assert _target(command, d.new)
            assert any(isinstance(p, DeprecatedOption) and d.old in p.opts for p in command.params)


# ---------------------------------------------------------------------------------------------
# the same, end to end: the line names the command; the old meaning wins until 1.1


@pytest.fixture
def shard(cli, tmp_path):
    return cli.write_tar(tmp_path / "in.tar", [cli.make_sample(f"k{i}", i, size=50) for i in range(3)])


def test_tarproc_timeout_is_still_the_command_timeout(cli, shard):
    from tarproc.cli.tarproc import main as tarproc

    r = cli.run(tarproc, ["-q", "--timeout", "30", "-c", "true", shard])
    assert r.exit_code == 0, r.stderr
    assert r.stderr.splitlines() == ["tarproc: warning: --timeout is deprecated here; use --command-timeout (in 1.1 "
                                     "it will mean the network timeout, now --read-timeout here)"]
    assert [k for k, _ in cli.samples(r.stdout_bytes)] == ["k0", "k1", "k2"]
    r = cli.run(tarproc, ["-q", "--command-timeout", "30", "--read-timeout", "5", "-c", "true", shard])
    assert r.exit_code == 0 and r.stderr == ""


def test_tarproc_on_error_is_still_about_failing_commands(cli, shard):
    from tarproc.cli.tarproc import main as tarproc

    old = cli.run(tarproc, ["-q", "--on-error", "skip", "-c", "[ $INDEX != 1 ]", shard])
    new = cli.run(tarproc, ["-q", "--on-command-error", "skip", "-c", "[ $INDEX != 1 ]", shard])
    assert old.exit_code == new.exit_code == 0
    assert old.stdout_bytes == new.stdout_bytes
    assert [k for k, _ in cli.samples(new.stdout_bytes)] == ["k0", "k2"]
    assert old.stderr.count("tarproc: warning: --on-error is deprecated here; use --on-command-error") == 1
    assert "deprecated" not in new.stderr
    assert old.stderr.splitlines()[1:] == new.stderr.splitlines()  # the skipped sample, said as before


def test_tarpcat_prefetch_is_still_samples(cli, shard):
    from tarproc.cli.tarpcat import main as tarpcat

    old = cli.run(tarpcat, ["-q", "--prefetch", "2", shard])
    new = cli.run(tarpcat, ["-q", "--prefetch-samples", "2", shard])
    assert old.exit_code == new.exit_code == 0 and old.stdout_bytes == new.stdout_bytes
    assert old.stderr == ("tarpcat: warning: --prefetch is deprecated here; use --prefetch-samples (in 1.1 it will "
                          "mean bytes read ahead, as --prefetch-bytes here)\n")
    assert new.stderr == ""


def test_tarkeys_force_is_overwrite(cli, tmp_path):
    from tarproc.cli.tarkeys import main as tarkeys

    keys = tmp_path / "keys"
    assert cli.run(tarkeys, ["-q", keys]).exit_code == 0
    r = cli.run(tarkeys, ["-q", "--force", keys])
    assert r.exit_code == 0 and r.stderr == "tarkeys: warning: --force is deprecated here; use --overwrite\n"
    r = cli.run(tarkeys, ["-q", "--overwrite", keys])
    assert r.exit_code == 0 and r.stderr == ""


def test_tarfirst_n_is_nth(cli, shard):
    from tarproc.cli.tarfirst import main as tarfirst

    old = cli.run(tarfirst, ["-f", "cls", "-n", "2", shard])
    new = cli.run(tarfirst, ["-f", "cls", "--nth", "2", shard])
    assert old.exit_code == new.exit_code == 0 and old.stdout_bytes == new.stdout_bytes
    assert old.stderr == "tarfirst: warning: -n is deprecated here; use --nth\n"
    assert new.stderr == ""
