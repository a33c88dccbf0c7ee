"""tarjpeg: re-lay the JPEGs of tar shards with restart markers, losslessly, for faster crops."""

from __future__ import annotations

import click

from ..relayout import MAX_INTERVAL, RelayoutStats, relayout_samples
from ..tar import ReadStats
from .common import (
    MAX_PROCESSES,
    ReadOptions,
    TarprocCommand,
    WriteOptions,
    common_options,
    input_options,
    number,
    output_option,
    progress,
    say,
    shared_option,
    write_tar,
    writer_options,
)

EPILOG = """\b
Examples:
  tarjpeg -p 2 train-0000.tar -o relaid/train-0000.tar
  tarcat 'train-{0000..0147}.tar' | tarjpeg -p 8 | tarsplit -n 10000 -o relaid/train
  tarjpeg --restart-interval 4 shard.tar > shard-k4.tar     # a marker every 4 MCUs (64 pixels of 4:2:0)

The pixels decoded from the output are exactly the input's; the size grows by the markers, about
1% (--optimize: usually a few percent smaller than the input). Training crops from re-laid shards decode only the
restart segments under the window (docs/training.md, "Re-laying a dataset"). Fields passed through
unchanged, and counted: progressive, restart markers already, CMYK, arithmetic coding, not a JPEG,
and damaged JPEGs (a warning names each; --strict makes it an error).
"""


@click.command("tarjpeg", cls=TarprocCommand, epilog=EPILOG)
@input_options
@output_option
@click.option("--restart-interval", "interval", type=number(0, MAX_INTERVAL), default=0, show_default=True, metavar="MCUS",
              help="A restart marker every MCUS MCUs (16x16 pixels in 4:2:0); 0 = per image, about 16 segments "
                   "across its width.")
@click.option("--optimize", is_flag=True,
              help="Optimize every image's Huffman tables: a few percent smaller, about half the speed "
                   "[default: the input's tables where they can code the re-laid data].")
@shared_option("-p", "--threads", type=number(1, MAX_PROCESSES), default=1, show_default=True,
               help="Threads re-laying JPEGs (libjpeg runs without the GIL: one core each).")
@shared_option("--strict", is_flag=True, help="A damaged JPEG is an error naming its sample (else passed through).")
@writer_options
@common_options
def main(
    reading: ReadOptions,
    writing: WriteOptions,
    quiet: bool,
    output: str,
    interval: int,
    optimize: bool,
    threads: int,
    strict: bool,
) -> None:
    """Rewrite every .jpg/.jpeg field with restart markers (lossless), keeping all else.

    INPUTS are paths, '-' (stdin, the default), pipe:CMD or URLs, as for tarcat. Each baseline
    JPEG is transcoded with libjpeg (the same coefficients, as jpegtran -restart does), its EXIF,
    ICC and other markers kept; the other fields and the sample order are unchanged. A summary
    (fields re-laid, passed through, bytes before and after) goes to stderr unless -q.
    """
    stats = ReadStats()
    counts = RelayoutStats()
    source = reading.samples(stats)
    samples = relayout_samples(source, interval=interval, optimize=optimize, threads=threads, strict=strict, stats=counts)
    try:
        write_tar(progress(samples, quiet, "tarjpeg", total=reading.total_samples), output, writing)
    finally:  # stop the threads and the readers (an error, -c upstream, a closed pipe)
        samples.close()
        getattr(source, "close", lambda: None)()
    if not quiet:
        say(f"tarjpeg: {counts.summary()}")


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarjpeg")
