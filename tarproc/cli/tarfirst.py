"""tarfirst: write the first member matching field alternatives, a key or a name pattern."""

from __future__ import annotations

import contextlib

import click

from ..errors import NoMatchError, SinkError
from ..first import find_member, make_matcher
from ..sinks import open_sink, stdout_is_terminal
from ..sniff import is_text, sniff_type
from ..tar import ReadStats
from .common import (
    ReadOptions,
    TarprocCommand,
    common_options,
    fields_option,
    input_options,
    number,
    say,
    shared_option,
)

EPILOG = """\b
Examples:
  tarfirst train-0000.tar > first.jpg                 # the first image (jpg, jpeg, png, webp...)
  tarfirst shard.tar -f cls --nth 10                     # the 10th sample's class, on the terminal
  tarfirst shard.tar --key n01440764/000123 -f 'jpg;png' -o x.jpg
  tarfirst 'pipe:curl -s http://host/train-0000.tar' --regex '^n014.*\\.json$' | jq .
  tarcat shards/*.tar --shuffle 1000 | tarfirst -v | display -

\b
A sample offers its first field in -f's order (default: common image types); with only --regex,
every member whose name matches. Conditions combine. Reading stops at the match. Binary data is
not written to a terminal unless --force. Nothing matching: exit 1 with a message.
"""


@click.command("tarfirst", cls=TarprocCommand, epilog=EPILOG)
@input_options
@fields_option("Field alternatives, e.g. 'jpg;jpeg;png' [default: common image types, unless --regex].")
@click.option("--key", metavar="KEY", help="Only members of the sample with this key.")
@click.option("--regex", metavar="RE", help="Only members whose name (KEY.FIELD) matches this regex (re.search).")
@click.option("--nth", "nth", type=number(1), default=1, show_default=True, metavar="N",
              help="Write the N-th match.")
@shared_option("-o", "--output", default="-", show_default=True, metavar="URL",
              help="Where to write: '-' (stdout), a path or a URL; the bytes as they are.")
@shared_option("--force", is_flag=True, help="Write binary data even when stdout is a terminal.")
@shared_option("-v", "--verbose", is_flag=True, help="Say which member was written (on stderr).")
@common_options
def main(
    reading: ReadOptions,
    quiet: bool,
    fields: str | None,
    key: str | None,
    regex: str | None,
    nth: int,
    output: str,
    force: bool,
    verbose: bool,
) -> None:
    """Write the first member matching fields, a key or a regex (stdout or -o).

    INPUTS are tar shards as for tarcat (paths, '-', pipe:CMD, URLs, brace lists).
    """
    matcher = make_matcher(fields, key, regex)
    source = reading.samples(ReadStats())
    with contextlib.closing(source):  # closing stops reading (and any pipe: child) at the match
        found = find_member(source, matcher, nth)
    if isinstance(found, int):
        inputs = ", ".join(reading.urls[:3]) + (f" and {len(reading.urls) - 3} more" if len(reading.urls) > 3 else "")
        asked = f" (found {found}, asked for number {nth})" if found else ""
        raise NoMatchError(f"no member with {matcher.describe()} in {inputs}{asked}")
    sample, field = found
    data = sample[field]
    if output == "-" and not force and stdout_is_terminal() and not is_text(data[:4096], complete=len(data) <= 4096):
        raise SinkError(f"refusing to write binary data ({sniff_type(data)}, {len(data)} bytes) to a terminal; "
                        "redirect it, use -o FILE or --force", "stdout")
    with open_sink(output, force=True, compression=None) as sink:  # the bytes as they are, even for x.gz
        sink.write(data)
    if verbose:
        say(f"tarfirst: wrote {sample['__key__']}.{field} ({len(data)} bytes) from {sample['__url__']}")


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarfirst")
