"""tarcreate (also tsv2tar): build a tar of samples from a TSV/CSV/JSONL plan, streaming."""

from __future__ import annotations

import contextlib
from typing import Any

import click

from ..sources import open_source
from ..stages import check_key_format
from ..tables import KEY_COLUMN, TABLE_FORMATS, format_for_name, plan_samples, read_table
from .common import TarprocCommand, WriteOptions, common_options, output_option, progress, write_tar, writer_options

EPILOG = """\b
Examples:
  tarcreate plan.tsv -C /data/images -o train.tar
  tar2tsv shard.tar -f '__key__ cls txt' | tarcreate -o copy.tar
  find imgs -name '*.jpg' | sort | sed '1i @jpg' | tarcreate --key %06d | tarsplit -n 1000 -o shards/s
  tarcreate labels.jsonl -C /data | tarcat --shuffle 1000 > train.tar

\b
A plan has a header row (TSV/CSV; JSONL rows are objects) and one row per sample:
  __key__   the sample's key (another column with --key-column, or numbered with --key FORMAT)
  cls       a field: the member KEY.cls holds the cell's text (UTF-8)
  @jpg      a file field: the cell is a path relative to -C DIR; the member KEY.jpg holds the file
Empty cells (and JSON nulls) leave the field out; __name__ columns (__url__) are ignored.
Format from the suffix (.tsv .csv .jsonl, also compressed: .tsv.gz), else --format, else from
the first line. TSV cells use the backslash escapes tar2tsv writes (\\\\ \\t \\n \\r).

\b
Errors name the plan, the row (its line number; the header is row 1) and the column:
  tarcreate: error: plan.tsv: row 17, column jpg: no such file 'imgs/x.jpg'
Paths that are absolute or climb out of -C DIR are refused unless -P. The plan is read one row
at a time; keys are remembered (to refuse duplicates), file contents are not.
"""


def _options(f: Any) -> Any:
    decorators = [
        click.argument("plan", default="-", metavar="[PLAN]"),
        output_option,
        click.option("-C", "--directory", "base_dir", default=".", show_default=True, metavar="DIR",
                     help="Directory that @FIELD paths are relative to."),
        click.option("--format", "fmt", type=click.Choice(TABLE_FORMATS), default=None,
                     help="Plan format [default: from the suffix, else from the first line]."),
        click.option("--key", "key_format", metavar="FORMAT",
                     help="Number samples with a printf FORMAT (e.g. %06d, from 0) instead of a key column."),
        click.option("--key-column", default=KEY_COLUMN, show_default=True, metavar="NAME",
                     help="The column holding sample keys."),
        click.option("-P", "--absolute-names", is_flag=True,
                     help="Allow absolute @FIELD paths and paths with '..' out of -C DIR."),
        writer_options,
        common_options,
    ]
    for decorator in reversed(decorators):
        f = decorator(f)
    return f


def create(
    writing: WriteOptions,
    quiet: bool,
    plan: str,
    output: str,
    base_dir: str,
    fmt: str | None,
    key_format: str | None,
    key_column: str,
    absolute_names: bool,
) -> None:
    """Build a tar of samples from a TSV, CSV or JSONL plan (stdout or -o).

    PLAN is a path, '-' (stdin, the default), pipe:CMD or a URL; one row per sample. Output is
    deterministic: fields in sorted order, fixed mtime and owner.
    """
    if key_format is not None:
        check_key_format(key_format)
    if fmt is None:
        fmt = format_for_name(plan) if plan != "-" else None
    prog = click.get_current_context().info_name or "tarcreate"
    with open_source(plan) as stream:
        rows = read_table(stream, plan, fmt)
        samples = plan_samples(
            rows, plan, base_dir=base_dir, key_column=key_column, key_format=key_format,
            absolute_names=absolute_names,
        )
        with contextlib.closing(samples):
            write_tar(progress(samples, quiet, prog), output, writing)


main = click.command("tarcreate", cls=TarprocCommand, epilog=EPILOG)(_options(create))
tsv2tar = click.command("tsv2tar", cls=TarprocCommand, epilog=EPILOG.replace("tarcreate", "tsv2tar"))(
    _options(create)
)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarcreate")
