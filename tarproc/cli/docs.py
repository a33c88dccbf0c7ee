"""Generate the command reference (docs/commands.md) from each command's --help.

``python -m tarproc.cli.docs > docs/commands.md`` (``make docs``); a test fails when the file in
the repository differs from what this prints. After the commands comes the table of the shared
vocabulary (``vocabulary.VOCABULARY``: each flag, its meaning, the commands that have it).
"""

from __future__ import annotations

import sys

import click

from . import COMMANDS
from .run import load
from .vocabulary import render_table


def help_text(name: str) -> str:
    command = load(name)
    settings = {**command.context_settings, "terminal_width": 100, "max_content_width": 100}
    with click.Context(command, info_name=name, **settings) as ctx:
        return command.get_help(ctx)


def render() -> str:
    parts = [
        "# Command reference",
        "",
        "Generated from each command's `--help` by `make docs`; do not edit by hand.",
        "",
    ]
    for name in COMMANDS:
        parts += [f"## {name}", "", "```", help_text(name).rstrip(), "```", ""]
    return "\n".join(parts) + "\n" + render_table(flag_uses())


def flag_uses() -> dict[str, list[str]]:
    """Each flag shown in --help, with the commands that have it (in COMMANDS' order)."""
    uses: dict[str, list[str]] = {}
    for name in COMMANDS:
        for param in load(name).params:
            if isinstance(param, click.Option) and not param.hidden:
                for flag in param.opts + param.secondary_opts:
                    uses.setdefault(flag, []).append(name)
    return uses


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
