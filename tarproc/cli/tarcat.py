"""tarcat: concatenate tar shards into one tar stream, selecting, renaming and shuffling samples."""

from __future__ import annotations

import contextlib
from collections import Counter

import click

from ..errors import OptionError, SampleError
from ..fieldspec import legacy_note, parse_specs
from ..stages import SELECT_SPECS, field_pairs, parse_slice, select_fields, shuffle, slice_samples
from ..stages import rekey as rekey_samples
from ..tar import ReadStats
from .common import (
    ReadOptions,
    TarprocCommand,
    WriteOptions,
    common_options,
    count_option,
    fields_option,
    input_options,
    number,
    output_option,
    progress,
    report_stats,
    seed_option,
    shared_option,
    shuffle_option,
    sliced_total,
    stats_option,
    warn,
    write_tar,
    writer_options,
)

EPILOG = """\b
Examples:
  tarcat 'train-{0000..0147}.tar' -c 1000 > first1000.tar
  tarcat http://host/train-{0000..0009}.tar --shuffle 5000 --seed 1 | tarsplit -n 10000 -o mixed
  tarcat 's3://bucket/train-{0000..0147}.tar' --retries 8 --cache /nvme/cache -o all.tar   # cut connections resume
  tar -cf - --sort=name -C /data train | tarcat -f 'image=jpg;jpeg;png cls' --rekey %09d > train.tar
  tarcat --stats -o /dev/null shards/*.tar      # check shards: counts, damage, duplicates
  cat a.tar b.tar | tarcat -i --links skip > ab.tar   # concatenated archives; links left out
  tarcat a.tar a.tar b.tar --shuffle 1000 --rekey 'mix-%09d' -o mix.tar   # a's samples twice, b's once

Samples are selected in this order: --skip, --slice, -f, --shuffle, -c, --rekey.
An input listed more than once (to oversample it) repeats its samples' keys: give --rekey.
"""


@click.command("tarcat", cls=TarprocCommand, epilog=EPILOG)
@input_options
@output_option
@count_option
@shared_option("--skip", type=number(0), default=0, help="Skip this many input samples first.")
@click.option("--slice", "slice_spec", metavar="LO:HI[:STEP]", help="Keep input samples LO..HI-1 every STEP.")
@fields_option("Keep and rename fields: 'image=jpg;jpeg;png cls' keeps cls and the first of jpg/jpeg/png as "
               "image.")
@shared_option("--missing", type=click.Choice(["error", "skip", "keep"]), default="error", show_default=True,
              help="With -f: a sample lacking a field is an error, dropped, or written without it.")
@shuffle_option
@seed_option("--shuffle")
@click.option("--rekey", metavar="FORMAT",
              help="Renumber keys with a printf FORMAT, e.g. %09d (needed when an input is listed twice).")
@stats_option()
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
    field_spec = None
    if fields is not None:
        specs = parse_specs(fields, SELECT_SPECS)
        if note := legacy_note(specs):
            warn(note)
        field_spec = field_pairs(specs)
    lo, hi, step = parse_slice(slice_spec) if slice_spec else (0, None, 1)
    stats = ReadStats()
    repeated = {url: n for url, n in Counter(reading.urls).items() if n > 1}
    if repeated and not rekey:
        warn(f"{_listing(repeated)}: every copy of a sample is written with the same key, and readers refuse a key "
             "that reappears (--dup), or read two copies next to each other as one sample; give --rekey "
             f"{REKEY_EXAMPLE} to give every sample a new key")

    # each sample is written before the next is read, so big values can be views of what was read
    # instead of copies -- except in a shuffle buffer, where they would keep whole reads in memory
    source = reading.samples(stats, views=not shuffle_size)
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
        try:
            writer = write_tar(progress(samples, quiet, "tarcat", total=sliced_total(
                reading, skip + lo, None if hi is None else skip + hi, step, count)), output, writing)
        except SampleError as e:
            # the writer's error for a key written twice in a row: an input listed twice (or two
            # inputs with the same keys) next to each other, as a shuffle can put them
            if rekey or type(e) is not SampleError or e.key is None or "twice in a row" not in e.message:
                raise
            cause = "an input listed more than once repeats its keys" if repeated else "two inputs share keys"
            raise SampleError(f"{e.message}: {cause}; give --rekey {REKEY_EXAMPLE} to give every sample a new key",
                              e.url, key=e.key) from e
    if show_stats:
        report_stats("tarcat", stats, writer, output)


REKEY_EXAMPLE = "'mix-%09d'"


def _listing(repeated: dict[str, int]) -> str:
    """``a.tar is listed 2 times`` or ``a.tar (2 times), b.tar (3 times) are listed more than once``."""
    if len(repeated) == 1:
        (url, n), = repeated.items()
        return f"{url} is listed {n} times"
    named = [f"{url} ({n} times)" for url, n in list(repeated.items())[:3]]
    more = f" and {len(repeated) - 3} more" if len(repeated) > 3 else ""
    return f"{', '.join(named)}{more} are listed more than once"


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarcat")
