"""tar2tsv: write a table of samples (TSV, CSV or JSONL): keys, text fields, JSON values, sizes, hashes."""

from __future__ import annotations

import contextlib
import itertools

import click

from ..errors import OptionError
from ..sinks import open_sink
from ..stages import slice_samples
from ..tables import TABLE_FORMATS, RowExtractor, default_columns, format_for_name, format_table, parse_columns
from ..tar import ReadStats
from .common import (
    ReadOptions,
    TarprocCommand,
    common_options,
    count_option,
    fields_option,
    input_options,
    number,
    progress,
    shared_option,
    sliced_total,
    warn,
)

EPILOG = """\b
Examples:
  tar2tsv train-0000.tar -f '__key__ cls json.label jpg;png:size' | head
  tar2tsv 'train-{0000..0147}.tar' -f '__key__ image=jpg:sha256 cls' -o index.tsv.gz
  tar2tsv shard.tar -f '__key__ cls txt' --format jsonl | jq -c 'select(.cls == "3")'
  tar2tsv shard.tar -f '__key__ cls txt' | tarcreate -o copy.tar     # and back

\b
Columns (-f) are field specs, the whole grammar ('Field specs' in the README), except that here a
',' is part of a field name ('a,b' is the field a,b; ';' separates alternatives). A cell holds:
  __key__ __url__       the sample's key, its shard
  cls, txt, seg.png     a field's text (UTF-8); binary fields need a modifier:
  jpg:size jpg:sha256   byte count, SHA-256 hex digest,
  jpg:type              kind of data from its magic bytes (jpeg, png, text, json, binary...)
  json.label json.a.0   a value inside a JSON field (objects and arrays as compact JSON)
Without -f: __key__ and the first sample's fields (binary ones as FIELD:size).

\b
A binary field without a modifier is an error naming the sample and field (binary is never
dumped raw). A missing field gives an empty cell (null in JSONL), or an error with --strict.
TSV escapes backslash, tab, newline and CR as \\\\ \\t \\n \\r; CSV quotes as RFC 4180 says;
tarcreate reads all three back exactly.
"""


@click.command("tar2tsv", cls=TarprocCommand, epilog=EPILOG)
@input_options
@fields_option("Columns, e.g. '__key__ cls json.label jpg:size' (see below).", dest="spec")
@shared_option("--format", "fmt", type=click.Choice(TABLE_FORMATS), default=None,
              help="Table format [default: from the -o suffix, else tsv].")
@click.option("--header/--no-header", default=True, show_default=True, help="Write a header row (TSV/CSV).")
@click.option("--noheader", "noheader", is_flag=True, hidden=True)
@shared_option("--strict", is_flag=True, help="A sample missing a column is an error naming its key.")
@count_option
@shared_option("--skip", type=number(0), default=0, help="Skip this many input samples first.")
@shared_option("-o", "--output", default="-", show_default=True, metavar="URL",
              help="Where to write: '-' (stdout), a path (compressed by suffix, e.g. .tsv.gz) or a URL.")
@common_options
def main(
    reading: ReadOptions,
    quiet: bool,
    spec: str | None,
    fmt: str | None,
    header: bool,
    noheader: bool,
    strict: bool,
    count: int | None,
    skip: int,
    output: str,
) -> None:
    """Write a table of samples (TSV, CSV or JSONL) to stdout or -o.

    One row per sample, one column per -f item. INPUTS are tar shards as for tarcat (paths, '-',
    pipe:CMD, URLs, brace lists).
    """
    columns = parse_columns(spec) if spec is not None else None
    if fmt is None:
        fmt = (format_for_name(output) if output != "-" else None) or "tsv"
    if noheader:
        header = False
    if not header and fmt == "jsonl":
        raise OptionError("--no-header has no effect with --format jsonl (every line names its columns)")
    stats = ReadStats()
    source = reading.samples(stats)
    with contextlib.closing(source):
        samples = iter(source)
        if skip:
            samples = slice_samples(samples, skip)
        if count is not None:
            samples = slice_samples(samples, 0, count)
        samples = progress(samples, quiet, "tar2tsv", total=sliced_total(reading, skip, count=count))
        if columns is None:
            first = next(samples, None)
            columns = default_columns(first) if first is not None else parse_columns("__key__")
            if first is not None:
                samples = itertools.chain([first], samples)
        extract = RowExtractor(columns, strict=strict)
        lines = format_table(map(extract, samples), extract.names, fmt, header=header)
        # a table on a terminal is fine (it is text); force skips the tar-to-terminal refusal
        with open_sink(output, force=True) as sink:
            while True:
                batch = "".join(itertools.islice(lines, 1000))
                if not batch:
                    break
                sink.write(batch.encode("utf-8", "surrogateescape"))
        if extract.rows:
            for name in extract.never_matched():
                warn(f"column {name!r} is empty in all {extract.rows:,} rows: no sample has that field or JSON path "
                     "(see the samples' fields with: tarshow -c 1 INPUT)")


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tar2tsv")
