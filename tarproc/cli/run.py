"""``python -m tarproc.cli.run COMMAND [ARGS]``: run a command by name (used by the bin/ shims)."""

from __future__ import annotations

import importlib
import sys

from . import COMMANDS


def load(name: str):  # type: ignore[no-untyped-def]
    """The click command object for a command name."""
    module, _, attr = COMMANDS[name].partition(":")
    return getattr(importlib.import_module(module), attr)


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.stderr.write(f"usage: python -m tarproc.cli.run {{{','.join(COMMANDS)}}} [ARGS]...\n")
        sys.exit(2)
    name = sys.argv[1]
    sys.argv = [name, *sys.argv[2:]]
    load(name).main(prog_name=name)  # no args: the command reads sys.argv, as a console script does


if __name__ == "__main__":
    main()
