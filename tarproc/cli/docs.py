"""Generate the command reference (docs/commands.md) from each command's --help.

``python -m tarproc.cli.docs > docs/commands.md`` (``make docs``); a test fails when the file in
the repository differs from what this prints.
"""

from __future__ import annotations

import sys

import click

from . import COMMANDS
from .run import load


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
    return "\n".join(parts)


def main() -> None:
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
