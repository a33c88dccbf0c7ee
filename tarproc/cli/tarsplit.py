"""tarsplit: read one tar stream and write it as shards of bounded size and sample count."""

from __future__ import annotations

import contextlib

import click

from ..shards import ShardInfo, ShardWriter, shard_pattern
from ..sinks import open_sink
from ..tar import ReadStats
from .common import (
    SIZE,
    ReadOptions,
    TarprocCommand,
    WriteOptions,
    common_options,
    format_stats,
    input_options,
    number,
    progress,
    say,
    shared_option,
    sliced_total,
    stats_option,
    writer_options,
)

DEFAULT_MAXSIZE = 10**9

EPILOG = """\b
Examples:
  tar -cf - --sort=name -C /data train | tarsplit -s 1e9 -o train-%06d.tar
  tarcat big.tar | tarsplit -n 10000 -o s3://bucket/train --manifest train.jsonl
  tarsplit -s 500MB -o out/val-%04d.tar.zst --post 'gsutil cp {} gs://bucket/val/' val.tar

\b
Shard names (-o):
  train-%06d.tar     a printf pattern, used as is
  out/val.tar.gz     out/val-000000.tar.gz ...: the number goes before a tar suffix
                     (.tar, .tar.gz, .tgz, .tar.zst, .tar.xz, .tar.bz2), which sets the compression
  out/ or out        out/shard-000000.tar ...: inside a directory (ending in /, or existing)
  train              train-000000.tar ...: any other name is a prefix
A name that would make shard files start with '-' is an error.

Without -s or -n, shards are limited to 1e9 bytes. With both, a shard closes at whichever comes
first, and -v says which one closed each shard.
"""


@click.command("tarsplit", cls=TarprocCommand, epilog=EPILOG)
@input_options
@shared_option("-o", "--output", required=True, metavar="PATTERN",
              help="Shard names: a printf pattern (train-%06d.tar), a tar name (val.tar.gz -> val-000000.tar.gz), "
                   "a directory (out/ -> out/shard-000000.tar) or a prefix (train -> train-000000.tar); "
                   "any path or URL; compressed by suffix (.tar.gz, .tgz, .tar.zst, .tar.xz, .tar.bz2).")
@click.option("-s", "--maxsize", type=SIZE, default=None,
              help="Close a shard before it would pass SIZE bytes of tar (headers and padding counted): "
                   "1e9, 1G, 500MB, 64MiB.")
@click.option("-n", "--maxcount", type=number(1), default=None, help="Samples per shard at most.")
@click.option("--start", type=number(0), default=0, show_default=True, help="Number of the first shard.")
@click.option("--maxshards", type=number(1), default=None,
              help="Write at most this many shards; more input is an error.")
@click.option("--post", metavar="CMD",
              help="Shell command run on each finished shard: '{}' is replaced by its path, else the path is appended.")
@click.option("--manifest", metavar="FILE", help="Write one JSON line per shard: shard, samples, bytes, sha256...")
@shared_option("-v", "--verbose", is_flag=True, help="Report each shard on stderr, with the limit that closed it.")
@stats_option("samples, members, bytes and skipped names")
@writer_options
@common_options
def main(
    reading: ReadOptions,
    writing: WriteOptions,
    quiet: bool,
    output: str,
    maxsize: int | None,
    maxcount: int | None,
    start: int,
    maxshards: int | None,
    post: str | None,
    manifest: str | None,
    verbose: bool,
    show_stats: bool,
) -> None:
    """Split a tar stream into shards, never splitting a sample and never writing an empty shard.

    Reads INPUTS (default stdin) like tarcat. Each shard is written under a temporary name and
    renamed (or uploaded) only when complete.
    """
    pattern = shard_pattern(output)  # a bad name is a usage error before anything is read
    if maxsize is None and maxcount is None:
        maxsize = DEFAULT_MAXSIZE
    stats = ReadStats()
    manifest_lines: list[str] = []

    def on_shard(info: ShardInfo) -> None:
        manifest_lines.append(info.to_json())
        if verbose:
            say(
                f"tarsplit: wrote {info.shard}: {info.samples} samples, {info.bytes} bytes "
                f"(closed by {info.closed_by})"
            )

    # the manifest is opened first, so a bad path fails before any shard is written
    manifest_sink = open_sink(manifest, compression=None, force=True) if manifest is not None else None
    # each sample is written before the next is read: big values can be views of what was read, or
    # data left in the input file (the manifest's sha256 is read back from the shards written)
    source = reading.samples(stats, views=True)
    with contextlib.ExitStack() as stack:
        if manifest_sink is not None:
            stack.enter_context(manifest_sink)
        stack.enter_context(contextlib.closing(source))
        with ShardWriter(
            pattern,
            maxsize=maxsize,
            maxcount=maxcount,
            start=start,
            maxshards=maxshards,
            post=post,
            on_shard=on_shard,
            digest=manifest is not None,
            writer_options=writing.tar,
        ) as writer:
            for sample in progress(source, quiet, "tarsplit", total=sliced_total(reading)):
                writer.write(sample)
        if manifest_sink is not None:
            manifest_sink.write("".join(line + "\n" for line in manifest_lines).encode("utf-8"))
    if verbose and not manifest_lines:
        say("tarsplit: no samples in the input; no shard written")
    if show_stats:
        written = f"wrote {sum(s.samples for s in writer.shards)} samples in {len(writer.shards)} shard(s)"
        say(format_stats("tarsplit", stats, written))


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarsplit")
