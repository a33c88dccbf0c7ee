"""tarsort: sort the samples of tar shards by key or field value, or shuffle them, in bounded memory."""

from __future__ import annotations

import contextlib
import os

import click

from ..errors import OptionError
from ..sort import DEFAULT_MEMORY, MISSING_POLICIES, UNIQUE_POLICIES, SortStats, sort_samples
from ..tar import ReadStats
from .common import (
    SIZE,
    ReadOptions,
    TarprocCommand,
    WriteOptions,
    common_options,
    input_options,
    output_option,
    progress,
    report_stats,
    seed_option,
    shared_option,
    stats_option,
    write_tar,
    writer_options,
)

EPILOG = """\b
Examples:
  tarsort 'train-{0000..0147}.tar' --buffer-size 2GiB --tmpdir /scratch -o train-sorted.tar
  tarsort --unique last a.tar b.tar | tarsplit -n 10000 -o merged   # b.tar's copies win
  tarsort -k cls --numeric --reverse shard.tar > by-class.tar
  tarsort -k json.label --missing last shard.tar | tar -tvf - | head
  tarsort --random --seed 1 shards/*.tar | tarsplit -s 1e9 -o shuffled   # a full shuffle

Keys and text values sort by code point (the C locale's byte order); --numeric reads values as
integers or floats. The sort is stable: equal values keep their input order. Input larger than
--buffer-size is sorted in temporary tar files under --tmpdir (removed when done, also on errors and
Ctrl-C); it needs as much free space there as the input takes.

Duplicate keys are checked only when sorting by __key__, where they end up next to each other.
"""


@click.command("tarsort", cls=TarprocCommand, epilog=EPILOG)
@input_options
@output_option
@click.option("-k", "--key-field", "key_field", default="__key__", show_default=True, metavar="FIELD",
              help="Sort by this field's value (UTF-8 text, stripped); 'json.a.b' reads a JSON field.")
@click.option("-n", "--numeric", is_flag=True, help="Compare values (or keys) as numbers: int or float.")
@click.option("-r", "--reverse", is_flag=True, help="Largest first (still stable).")
@click.option("--random", "shuffle", is_flag=True, help="Shuffle: sort by a random key instead.")
@seed_option("--random (same seed, same input: same order)")
@click.option("-S", "--buffer-size", "memory", type=SIZE, default=DEFAULT_MEMORY, show_default="512MiB",
              help="Memory bound for buffered samples and merge buffers: 512M, 2GiB... (at least 256K).")
@shared_option("--tmpdir", "tmpdir", default=None, metavar="DIR",
              help="Directory for temporary runs [default: $TMPDIR or /tmp].")
@click.option("-u", "--unique", type=click.Choice(UNIQUE_POLICIES), default=None,
              help="Keep the first or last (in input order) of samples with the same key, instead of an error.")
@shared_option("--missing", type=click.Choice(MISSING_POLICIES), default="error", show_default=True,
              help="With -k: a sample lacking the field is an error, or sorts after all others.")
@stats_option("samples read, runs spilled to disk, merge passes and duplicates dropped")
@writer_options
@common_options
def main(
    reading: ReadOptions,
    writing: WriteOptions,
    quiet: bool,
    output: str,
    key_field: str,
    numeric: bool,
    reverse: bool,
    shuffle: bool,
    seed: int | None,
    memory: int,
    tmpdir: str | None,
    unique: str | None,
    missing: str,
    show_stats: bool,
) -> None:
    """Sort samples by key or by a field's value, or shuffle them, in bounded memory.

    Reads INPUTS (default stdin) like tarcat and writes one tar stream (stdout or -o) once all
    input is read.
    """
    if seed is not None and not shuffle:
        raise OptionError("--seed has no effect without --random")
    if shuffle and (key_field != "__key__" or numeric or reverse or unique):
        raise OptionError("--random cannot be combined with -k, --numeric, --reverse or --unique")
    if unique and key_field != "__key__":
        raise OptionError("--unique works only when sorting by __key__ (duplicate keys are not checked with -k)")
    if missing != "error" and key_field == "__key__":
        raise OptionError("--missing has no effect without -k FIELD (every sample has a key)")
    if tmpdir is not None and not os.path.isdir(tmpdir):
        raise OptionError(f"--tmpdir {tmpdir!r} is not a directory")
    read_stats = ReadStats()
    sort_stats = SortStats()

    source = reading.samples(read_stats)
    with contextlib.closing(source):
        # the bar follows the reading; the merge that follows a spill writes as fast as it reads
        ordered = sort_samples(
            progress(source, quiet, "tarsort: reading"), key_field, numeric=numeric, reverse=reverse, shuffle=shuffle, seed=seed, memory=memory,
            tmpdir=tmpdir, unique=unique, missing=missing, stats=sort_stats,
        )
        # closing the sort removes its temporaries at once, whatever stops the writing loop
        with contextlib.closing(ordered):
            writer = write_tar(ordered, output, writing)
    if show_stats:
        report_stats("tarsort", read_stats, writer, output, sort_stats.describe())


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarsort")
