"""tarpcat: read many shards concurrently and interleave their samples into one tar stream."""

from __future__ import annotations

import contextlib

import click

from ..errors import OptionError
from ..pcat import DEFAULT_PREFETCH, DEFAULT_PREFETCH_BYTES, DEFAULT_READERS, ORDERS, parallel_samples
from ..stages import shuffle, slice_samples
from ..tar import ReadStats
from .common import (
    MAX_PROCESSES,
    SIZE,
    ReadOptions,
    TarprocCommand,
    WriteOptions,
    common_options,
    count_option,
    number,
    output_option,
    parallel_input_options,
    progress,
    report_stats,
    seed_option,
    shared_option,
    shuffle_option,
    sliced_total,
    stats_option,
    write_tar,
    writer_options,
)

EPILOG = """\b
Examples:
  tarpcat -p 8 'https://host/train-{0000..0147}.tar' | tarsplit -n 10000 -o mixed
  tarpcat 's3://b/train-{0000..0099}.tar' --order random --seed 1 --shuffle 5000 -c 100000 > sub.tar
  tarpcat -p 4 'pipe:gsutil cat gs://b/val-{00..15}.tar' -o val.tar --stats
  tarpcat -p 1 shards/*.tar > all.tar          # -p 1: the same order as tarcat

\b
Order: there are P = min(-p, number of inputs) lanes; lane i starts with input i, and when its
shard ends it takes the next input not started yet. --order roundrobin takes one sample from each
lane in turn (deterministic: it depends only on the inputs, -p and the shards' sample counts);
--order random draws the lane for each sample (reproducible with --seed). Every sample comes out
exactly once. --shuffle then mixes further with a buffer of N samples.
"""


@click.command("tarpcat", cls=TarprocCommand, epilog=EPILOG)
@parallel_input_options
@output_option
@shared_option("-p", "--readers", type=number(1, MAX_PROCESSES), default=DEFAULT_READERS, show_default=True,
              help="Shards read at once. 4 hides the latency of http/s3 shards and keeps a 2-core machine "
                   "busy; raise it for slow, high-latency stores.")
@click.option("--prefetch-samples", "prefetch", type=number(1), default=DEFAULT_PREFETCH, show_default=True,
              metavar="N",
              help="Samples read ahead per shard being read.")
@click.option("--prefetch-bytes", type=SIZE, default=DEFAULT_PREFETCH_BYTES, show_default="2MiB",
              help="Bytes read ahead per shard being read (all buffers together: up to about 4 x -p x this).")
@click.option("--order", type=click.Choice(ORDERS), default="roundrobin", show_default=True,
              help="How samples of the shards being read are interleaved.")
@seed_option("--order random and --shuffle")
@shuffle_option
@count_option
@stats_option()
@writer_options
@common_options
def main(
    reading: ReadOptions,
    writing: WriteOptions,
    quiet: bool,
    output: str,
    readers: int,
    prefetch: int,
    prefetch_bytes: int,
    order: str,
    seed: int | None,
    shuffle_size: int | None,
    count: int | None,
    show_stats: bool,
) -> None:
    """Read many tar shards concurrently and interleave their samples into one tar stream.

    INPUTS are paths, '-' (stdin, the default), pipe:CMD, http(s)://, s3://, gs:// or any fsspec
    URL, with brace lists ('train-{0000..0147}.tar') and '::' joins; -p of them are read at once,
    each with its own read-ahead. With --on-error skip-shard a damaged input's samples before the
    damage are kept; with fail the first error stops everything.
    """
    if seed is not None and shuffle_size is None and order != "random":
        raise OptionError("--seed has no effect without --order random or --shuffle N")
    if prefetch_bytes < 1:
        raise OptionError("--prefetch-bytes must be at least 1 byte")
    stats = ReadStats()
    source = parallel_samples(
        reading.urls, readers=readers, prefetch=prefetch, prefetch_bytes=prefetch_bytes, order=order, seed=seed,
        policy=reading.policy, stats=stats, views=not shuffle_size,
    )
    with contextlib.closing(source):
        samples = iter(source)
        if shuffle_size:
            samples = shuffle(samples, shuffle_size, seed)
        if count is not None:
            samples = slice_samples(samples, 0, count)
        writer = write_tar(progress(samples, quiet, "tarpcat", total=sliced_total(reading, count=count)), output, writing)
    if show_stats:
        report_stats("tarpcat", stats, writer, output)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarpcat")
