"""tarcat: concatenate tar shards into one tar stream, selecting, renaming and shuffling samples."""

from __future__ import annotations

import contextlib

import click

from ..errors import OptionError
from ..sinks import open_sink
from ..stages import parse_fields, parse_slice, select_fields, shuffle, slice_samples
from ..stages import rekey as rekey_samples
from ..tario import ReadStats, TarWriter
from .common import (
    ReadOptions,
    TarprocCommand,
    WriteOptions,
    common_options,
    format_stats,
    input_options,
    progress,
    writer_options,
)

EPILOG = """\b
Examples:
  tarcat 'train-{0000..0147}.tar' -c 1000 > first1000.tar
  tarcat http://host/train-{0000..0009}.tar --shuffle 5000 --seed 1 | tarsplit -n 10000 -o mixed
  tar -cf - --sort=name -C /data train | tarcat -f 'image:jpg,jpeg,png cls' --rekey %09d > train.tar
  tarcat --stats -o /dev/null shards/*.tar      # check shards: counts, damage, duplicates

Samples are selected in this order: --skip, --slice, -f, --shuffle, -c, --rekey.
"""


@click.command("tarcat", cls=TarprocCommand, epilog=EPILOG)
@input_options
@click.option("-o", "--output", default="-", show_default=True, metavar="URL",
              help="Where to write: '-' (stdout), a path (compressed by suffix) or a URL.")
@click.option("-c", "--count", type=click.IntRange(min=0), default=None, help="Stop after this many samples.")
@click.option("--skip", type=click.IntRange(min=0), default=0, help="Skip this many input samples first.")
@click.option("--slice", "slice_spec", metavar="LO:HI[:STEP]", help="Keep input samples LO..HI-1 every STEP.")
@click.option("-f", "--fields", metavar="SPEC",
              help="Keep and rename fields: 'image:jpg,jpeg,png cls' keeps cls and the first of jpg/jpeg/png as image.")
@click.option("--missing", type=click.Choice(["error", "skip", "keep"]), default="error", show_default=True,
              help="With -f: a sample lacking a field is an error, dropped, or written without it.")
@click.option("--shuffle", "shuffle_size", type=click.IntRange(min=1), default=None, metavar="N",
              help="Shuffle with a buffer of N samples (filled before the first output).")
@click.option("--seed", type=int, default=None, help="Random seed for --shuffle.")
@click.option("--rekey", metavar="FORMAT", help="Renumber keys with a printf FORMAT, e.g. %09d.")
@click.option("--stats", "show_stats", is_flag=True,
              help="Report shards, samples, members, bytes, skipped names and duplicates on stderr.")
@writer_options
@common_options
def main(
    reading: ReadOptions,
    writing: WriteOptions,
    quiet: bool,
    output: str,
    count: int | None,
    skip: int,
    slice_spec: str | None,
    fields: str | None,
    missing: str,
    shuffle_size: int | None,
    seed: int | None,
    rekey: str | None,
    show_stats: bool,
) -> None:
    """Concatenate tar shards into one tar stream (stdout or -o).

    INPUTS are paths, '-' (stdin, the default), pipe:CMD, http(s)://, s3://, gs:// or any fsspec
    URL, with brace lists ('train-{0000..0147}.tar') and '::' joins. Compressed inputs (gzip, zstd,
    bz2, xz) are detected from their data. Output is deterministic: fields in sorted order, fixed
    mtime and owner.
    """
    if seed is not None and shuffle_size is None:
        raise OptionError("--seed has no effect without --shuffle N")
    if missing != "error" and fields is None:
        raise OptionError("--missing has no effect without -f")
    field_spec = parse_fields(fields) if fields is not None else None
    lo, hi, step = parse_slice(slice_spec) if slice_spec else (0, None, 1)
    stats = ReadStats()

    source = reading.samples(stats)
    with contextlib.closing(source):
        samples = iter(source)
        if skip or slice_spec:
            samples = slice_samples(samples, skip + lo, None if hi is None else skip + hi, step)
        if field_spec is not None:
            samples = select_fields(samples, field_spec, missing)
        if shuffle_size:
            samples = shuffle(samples, shuffle_size, seed)
        if count is not None:
            samples = slice_samples(samples, 0, count)
        if rekey:
            samples = rekey_samples(samples, rekey)
        with open_sink(output, force=writing.force) as sink:
            writer = TarWriter(sink, **writing.tar)
            for sample in progress(samples, quiet, "tarcat"):
                writer.write_sample(sample)
            writer.close()
    if show_stats:
        written = f"wrote {writer.samples} samples, {writer.members} members to {output}"
        click.echo(format_stats("tarcat", stats, written), err=True)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarcat")
