"""tarindex: write an index per shard (sample key -> byte offset, size, fields), or for DALI or wids;
check the index files beside shards, ours or other tools' (--check)."""

from __future__ import annotations

import json
import os

import click
from click.core import ParameterSource

from ..errors import OptionError, TarprocError
from ..index import (
    FOREIGN_KINDS,
    FORMATS,
    ShardIndex,
    build_index,
    check_index_file,
    check_random_access,
    default_index_url,
    index_bytes,
    index_kind_at,
    refuse_foreign_index,
    wids_descriptor,
)
from ..sinks import open_sink
from ..sources import local_path, open_source
from ..tar import ReadStats
from .common import ReadOptions, TarprocCommand, common_options, input_options, progress, say, shared_option, warn

EPILOG = """\b
Examples:
  tarindex shards/train-*.tar                       # shards/train-0000.tar.idx ...
  tarindex --format dali train-0000.tar             # train-0000.idx, for DALI's webdataset reader
  tarindex --format wids -o train.json 'train-{0000..0147}.tar'
  tarindex -o - train-0000.tar | head -3            # the index on stdout
  tarcat big.tar.gz -o big.tar && tarindex big.tar  # compressed shards must be decompressed first
  tarindex --check shards/train-*.tar               # what each index beside them is, and if it is current

\b
Formats:
  tarproc  JSON Lines, version 1: a header {"format": "tarproc-index", "version": 1, "shard",
           "size", "samples"}, then per sample {"key", "offset", "size", "fields": {field:
           [data_offset, size]}}; written to SHARD.idx. tarproc.IndexedShard(SHARD) uses it.
  dali     DALI's wds2idx index (v1.2): "EXT OFFSET SIZE NAME ..." per sample; written to the
           name wds2idx picks (train-0000.tar -> train-0000.idx).
  wids     one wids-shard-index-v1 JSON for all shards (url, nsamples, filesize), to stdout or
           -o; local shard paths are written relative to the -o file's directory.

Samples are grouped as tarcat reads them: the key rule, __name__ metadata skipped, --dup for
duplicates. Only plain tars can be indexed. Index files are written whole or not at all.

\b
Other tools' indexes:
  megatron-energon's `energon prepare` writes a binary SHARD.tar.idx (one byte offset per
  sample), the name tarproc's index takes. tarproc tells them apart by content: readers count
  samples with energon's and index the shard in memory for random access. tarindex never
  replaces another tool's index (energon's, DALI's, a wids descriptor) unless --overwrite is
  given: write yours elsewhere with -o. --check says what each index file beside a shard is
  (tarproc's SHARD.idx name, DALI's name) and whether it matches the shard; exit 1 if one doesn't.
"""


@click.command("tarindex", cls=TarprocCommand, epilog=EPILOG)
@input_options
@shared_option("--format", "fmt", type=click.Choice(FORMATS), default="tarproc", show_default=True,
              help="Index format (see below).")
@shared_option("-o", "--output", default=None, metavar="URL",
              help="Where to write ('-' = stdout). Default: next to each shard; stdout for wids. "
                   "With tarproc or dali, only for a single shard.")
@shared_option("--name", default=None, help="With --format wids: the dataset's name in the JSON.")
@shared_option("-v", "--verbose", is_flag=True, help="Say on stderr what was written for each shard.")
@shared_option("--overwrite", is_flag=True,
               help="Replace another tool's index at the target (energon's SHARD.tar.idx, DALI's, wids').")
@click.option("--check", is_flag=True,
              help="Write nothing: say what each index file beside the shards (or -o) is and check it against "
                   "its shard.")
@common_options
def main(reading: ReadOptions, quiet: bool, fmt: str, output: str | None, name: str | None, verbose: bool,
         overwrite: bool, check: bool) -> None:
    """Write an index of tar shards for random access (IndexedShard, DALI, wids), or check them.

    INPUTS are shards: paths or URLs (http(s)://, s3://, ... any fsspec URL), with brace lists
    ('train-{0000..0147}.tar') and '::' joins; not stdin or pipe:, which can't be read at random.
    """
    urls = reading.urls
    if name is not None and fmt != "wids":
        raise OptionError("--name is only for --format wids")
    if urls == ["-"]:
        raise OptionError("no shards given (stdin can't be indexed: random access needs a file or a URL)")
    for url in urls:
        check_random_access(url)
    if check:
        ctx = click.get_current_context()
        given = [flag for flag, param in (("--format", "fmt"), ("--overwrite", "overwrite"), ("--name", "name"))
                 if ctx.get_parameter_source(param) == ParameterSource.COMMANDLINE]
        if given:
            raise OptionError(f"--check reads the index files as they are: {', '.join(given)} can't go with it")
        _check(reading, urls, output)
        return
    if output is not None and fmt != "wids" and len(urls) > 1:
        raise OptionError(f"-o takes a single shard with --format {fmt} ({len(urls)} given); leave it out to "
                          "write each index next to its shard")
    if not overwrite:  # before any is written: all or none
        targets = [output or "-"] if fmt == "wids" else [output or default_index_url(url, fmt) for url in urls]
        for target in dict.fromkeys(targets):
            refuse_foreign_index(target, fmt)

    stats = ReadStats()
    indexed: list[tuple[str, ShardIndex]] = []
    for url in progress(urls, quiet or len(urls) < 2, "tarindex", unit="shard"):
        try:
            index = build_index(url, policy=reading.policy, stats=stats)
            if fmt != "wids":
                data = index_bytes(index, fmt, url)
                target = output or default_index_url(url, fmt)
                with open_sink(target, force=True, compression=None) as sink:
                    sink.write(data)
                if verbose:
                    _info(f"tarindex: {url}: {len(index)} samples, {index.size} bytes -> {target}")
        except TarprocError as e:
            if reading.on_error == "fail":
                raise
            stats.shards_failed += 1
            warn(f"{e}; no index for this shard")
            continue
        indexed.append((url, index))

    if fmt == "wids":
        target = output or "-"
        base = _local_dir(target)
        descriptor = wids_descriptor([(_relative(url, base), index) for url, index in indexed], name)
        with open_sink(target, force=True, compression=None) as sink:
            sink.write((json.dumps(descriptor, indent=2) + "\n").encode("utf-8"))
        if verbose:
            total = sum(len(index) for _, index in indexed)
            _info(f"tarindex: {len(indexed)} shards, {total} samples -> {target}")


def _check(reading: ReadOptions, urls: list[str], output: str | None) -> None:
    """``--check``: a line on stdout for each index file found and checked; a shard without one, or
    an index that doesn't match its shard, is an error (with ``--on-error skip-shard``, each is a
    warning and the exit status 1 at the end)."""
    if output == "-":
        raise OptionError("--check reads index files: -o names the one to check, not stdout")
    if output is not None and len(urls) > 1 and index_kind_at(output) != "wids":
        raise OptionError(f"-o names one shard's index with --check ({len(urls)} shards given; a wids descriptor may "
                          "list several)")
    failed = 0
    for url in urls:
        candidates = [output] if output is not None else list(dict.fromkeys(
            [default_index_url(url), default_index_url(url, "dali")]))
        try:
            found = [c for c in candidates if _exists(c)]
            if not found:
                raise TarprocError(f"no index file (looked for {' and '.join(candidates)}); write one with: "
                                   f"tarindex {url}", url)
            for index_url in found:
                kind, n = check_index_file(url, index_url, policy=reading.policy)
                click.echo(f"{index_url}: {_KINDS[kind]} ({n} samples) matches {url}")
        except TarprocError as e:
            if reading.on_error == "fail":
                raise
            failed += 1
            warn(str(e))
    if failed:
        raise TarprocError(f"{failed} of {len(urls)} shards have no index that matches them")


_KINDS = {"tarproc": "tarproc index", **{kind: what.split(" (")[0].removeprefix("a ").removeprefix("an ")
                                         for kind, what in FOREIGN_KINDS.items()}}


def _exists(url: str) -> bool:
    """Whether a file is at ``url`` (a local path, or a URL asked once)."""
    path = local_path(url)
    if path is not None:
        return os.path.isfile(path)
    try:
        with open_source(url) as source:
            source.read(1)
    except TarprocError:
        return False
    return True


def _info(message: str) -> None:
    """An informational line on stderr (stdout may carry an index)."""
    say(message)


def _local_dir(target: str) -> str | None:
    """The directory of a local output file (shard paths are written relative to it), else None."""
    if target == "-":
        return None
    path = local_path(target)
    return None if path is None else os.path.dirname(os.path.abspath(path))


def _relative(url: str, base: str | None) -> str:
    """A local shard's path relative to ``base``; URLs and shards outside a base stay as given."""
    path = local_path(url)
    if base is None or path is None:
        return url
    return os.path.relpath(os.path.abspath(path), base)


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarindex")
