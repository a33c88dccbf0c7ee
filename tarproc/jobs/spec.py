"""Shard ids from a SPEC, and the command line of each shard.

A SPEC is a brace expression (``'{0000..0999}'``, ``'{train,val}-{00..09}'``), ``@FILE`` (one id a
line; blank and ``#`` lines ignored; ``@-`` reads stdin) or a glob of existing paths
(``'shards/*.tar'``: the ids are the matched paths, sorted). Braces expand first, then each piece
with glob characters is matched against the file system.

>>> expand_spec("shard-{00..02}")
['shard-00', 'shard-01', 'shard-02']
>>> shard_argv(["tarproc", "-c", "true", "in-{}.tar", "-o", "out-{}.tar"], "0007")
['tarproc', '-c', 'true', 'in-0007.tar', '-o', 'out-0007.tar']
>>> shard_argv(["echo {} > log-{}"], "a b", shell=True)
['bash', '-c', "echo 'a b' > log-'a b'"]
>>> parse_index_list("3,17,40-42")
[3, 17, 40, 41, 42]
>>> format_index_list([3, 17, 40, 41, 42])
'3,17,40-42'
"""

from __future__ import annotations

import glob
import shlex
from dataclasses import dataclass

from ..errors import OptionError, SourceError, TarprocError
from ..sources import expand_braces, read_list_file

PLACEHOLDER = "{}"


class SpecError(TarprocError):
    """A SPEC names a list file that can't be read, or a glob that matches nothing."""


@dataclass(frozen=True)
class Shards:
    """The expanded SPEC: ``ids`` in order, and whether they came from the file system or a list
    (then another machine can't expand the SPEC itself: the ids travel with a manifest)."""

    spec: str
    ids: list[str]
    portable: bool  # a pure brace expression: expands to the same ids anywhere


def _has_magic(text: str) -> bool:
    return glob.has_magic(text)


def expand_spec(spec: str) -> list[str]:
    """The shard ids of ``spec`` (see the module docstring)."""
    return load_shards(spec).ids


def load_shards(spec: str) -> Shards:
    """Expand ``spec``; a duplicate id is a usage error (two jobs would write the same output)."""
    if not spec:
        raise OptionError("empty shard spec (-s)")
    portable = False
    if spec.startswith("@"):
        ids = _read_list(spec[1:])
    else:
        ids = []
        portable = True
        try:
            pieces = expand_braces(spec)  # bounded, as for every command's inputs
        except OptionError as e:
            raise OptionError(f"bad shard spec {spec!r}: {e}") from None
        for piece in pieces:
            if _has_magic(piece):
                portable = False
                matched = sorted(glob.glob(piece))
                if not matched:
                    raise SpecError(f"shard spec {spec!r}: no files match {piece!r}")
                ids.extend(matched)
            else:
                ids.append(piece)
    if not ids:
        raise SpecError(f"shard spec {spec!r} names no shards")
    seen: set[str] = set()
    for shard in ids:
        if shard in seen:
            raise OptionError(f"shard spec {spec!r} names {shard!r} twice")
        seen.add(shard)
    return Shards(spec, ids, portable)


def _read_list(path: str) -> list[str]:
    try:
        return read_list_file(path, "shard list")
    except SourceError as e:
        raise SpecError(e.message, e.url) from None


def check_command(command: list[str], shell: bool) -> None:
    """A command must mention ``{}`` (else every shard would do the same thing)."""
    if not command:
        raise OptionError("no command: give it after '--', e.g. tarjob -s '{0..9}' -- tarproc ... in-{}.tar")
    if not any(PLACEHOLDER in arg for arg in command):
        raise OptionError("the command has no '{}': every shard would run the same command")
    if shell and len(command) != 1:
        raise OptionError("with --shell give the command as one string: -- 'CMD {} | ...'")


def shard_argv(command: list[str], shard: str, shell: bool = False) -> list[str]:
    """The argument vector run for ``shard``: ``{}`` replaced in every argument (shell-quoted with
    ``shell``, then run by ``bash -c``)."""
    if shell:
        return ["bash", "-c", " ".join(command).replace(PLACEHOLDER, shlex.quote(shard))]
    return [arg.replace(PLACEHOLDER, shard) for arg in command]


def parse_index_list(text: str) -> list[int]:
    """Indexes like Kubernetes prints a Job's ``failedIndexes``: ``'3,17,40-42'``."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise OptionError(f"bad index list {text!r}: expected numbers like 3,17,40-42") from None
        if first < 0 or last < first:
            raise OptionError(f"bad index range {part!r} in {text!r}")
        out.extend(range(first, last + 1))
    if not out:
        raise OptionError(f"empty index list {text!r}")
    return sorted(set(out))


def format_index_list(indexes: list[int]) -> str:
    """The inverse of ``parse_index_list``, in Kubernetes' way: sorted, each run as ``a-b``."""
    out: list[str] = []
    numbers = sorted(set(indexes))
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        out.append(f"{numbers[i]}-{numbers[j]}" if j > i else str(numbers[i]))
        i = j + 1
    return ",".join(out)
