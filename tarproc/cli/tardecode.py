"""tardecode: decode and augment the images of a tar stream into .npy arrays (cpu, dali-cpu, gpu)."""

from __future__ import annotations

import contextlib

import click

from ..decode import DEFAULT_FIELDS, DecodeStats, decoded_batches, npy_bytes
from ..errors import OptionError
from ..fieldspec import SPEC_HELP
from ..samples import Sample
from ..tar import ReadStats
from .common import (
    DecodeOptions,
    ReadOptions,
    TarprocCommand,
    WriteOptions,
    common_options,
    decode_input_options,
    decode_options,
    output_option,
    progress,
    report_stats,
    say,
    shared_option,
    stats_option,
    write_tar,
    writer_options,
)

EPILOG = """\b
Examples:
  tarcat 'val-{0000..0063}.tar' | tardecode --size 224 > val-224.tar
  tardecode train-0000.tar --size 224 --random-crop --flip 0.5 --mean imagenet --std imagenet \\
      --layout CHW --seed 1 -p 2 | tarsplit -n 1000 -o decoded
  tardecode --device dali-cpu --resize 256 -b 128 shard.tar -o small.tar
  tardecode shard.tar --size 224 --random-crop --rotate 10 --jitter 0.4,0.4,0.4,0.1 | tarshow -c 2
  tardecode --on-error skip --stats -o /dev/null shards/*.tar     # find undecodable images
  tardecode --max-pixels 40000000 --size 224 photos.tar > small.tar  # refuse images over 40 Mpx

\b
Each sample's image (the first of --field it has) becomes a .npy member (numpy.load reads it)
named by --output-field; its other fields are copied unchanged. --size N alone means: shorter side
to round(N*8/7) (256 for 224), then a centre crop of N x N. Same seed, same crops and flips on
every backend; cpu and DALI results agree to within a few levels (different resize filters).
"""


@click.command("tardecode", cls=TarprocCommand, epilog=EPILOG)
@decode_input_options
@output_option
@shared_option("--field", default=DEFAULT_FIELDS, show_default=True, metavar="SPEC",
              help=f"The image field: the first of these names a sample has. {SPEC_HELP}")
@shared_option("--output-field", default="npy", show_default=True, metavar="NAME",
              help="Field name of the decoded array (written as KEY.NAME).")
@stats_option("what was read, decoded and skipped")
@decode_options
@writer_options
@common_options
def main(
    reading: ReadOptions,
    on_error: str,
    decoding: DecodeOptions,
    writing: WriteOptions,
    quiet: bool,
    output: str,
    field: str,
    output_field: str,
    show_stats: bool,
) -> None:
    """Decode and augment the images of tar shards into .npy arrays (stdout or -o).

    INPUTS are paths, '-' (stdin, the default) or URLs as for tarcat. Images (JPEG, PNG, WebP and
    whatever Pillow reads; grayscale, CMYK and alpha become RGB) are decoded, cropped, resized,
    flipped and normalized as the options say, in batches, on the backend --device picks.
    """
    if not output_field or "/" in output_field or output_field.startswith((".", "__")):
        raise OptionError(f"bad --output-field {output_field!r}; expected a field name like npy")
    stats = ReadStats()
    decode_stats = DecodeStats()
    decoder = decoding.decoder()
    try:
        if decoding.device == "auto" and not quiet:
            say(f"tardecode: decoding on {decoder.describe()}")
        source = reading.samples(stats)
        with contextlib.closing(source):
            batches = decoded_batches(
                progress(source, quiet, "tardecode", unit="image"), decoding.spec, field=field,
                output_field=output_field, device=decoder, batch_size=decoding.batch_size,
                on_error=on_error, stats=decode_stats,
            )
            arrays = (_with_npy(sample, output_field) for batch in batches for sample in batch)
            writer = write_tar(arrays, output, writing)
    finally:
        decoder.close()
    if show_stats:
        report_stats("tardecode", stats, writer, output)
        say(f"tardecode: decoded {decode_stats.decoded} images on {decoder.describe()}; "
            f"skipped {decode_stats.skipped} bad images")


def _with_npy(sample: Sample, field: str) -> Sample:
    """``sample`` with its decoded array in ``field`` replaced by the .npy bytes of it."""
    sample[field] = npy_bytes(sample[field])
    return sample


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tardecode")
