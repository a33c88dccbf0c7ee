"""tarserve: read shards, decode and augment, batch, and send the batches over ZeroMQ to trainers."""

from __future__ import annotations

import click
from click.core import ParameterSource

from ..errors import OptionError
from ..fieldspec import DEFAULT_IMAGE_SPEC, SPEC_HELP
from ..transport.serve import LAST_BATCH, ServeConfig, serve
from ..transport.urls import is_zmq_url
from .common import (
    MAX_PROCESSES,
    DecodeOptions,
    ReadOptions,
    TarprocCommand,
    common_options,
    decode_input_options,
    number,
    progress,
    say,
    server_decode_options,
    shared_option,
    shuffle_option,
    stats_option,
    transport_options,
)

EPILOG = """\b
Examples:
  tarserve 'train-{0000..0147}.tar' --to zpush://trainer:7880 --size 224 --random-crop --flip 0.5 \\
      --mean imagenet --std imagenet --dtype float16 --layout CHW --label cls -b 256 -p 2 --repeat
  tarserve --decode gpu -b 256 'train-{0000..0147}.tar' zpush://trainer:7880
  tarcat 's3://b/val-{00..15}.tar' | tarserve --raw -b 64 --to 'zpush://gpu{1..4}:7880'
  tarserve --raw shard.tar --to zpush://:7880 & tarrecv zpull://:7880 -o copy.tar   # byte for byte
  tarserve 'train-{0000..0147}.tar' --to zpush://trainer:7880 --checkpoint feed.ckpt --epochs 90 ...
                                       # killed? the same command resumes where the receivers were

\b
Destinations (--to, or arguments that are ZMQ URLs) use tensorcom's grammar: zpush://host:port
connects to a receiver that binds (tarrecv zpull://:port); zrpush binds instead (receivers
connect with zrpull); zpub/zrpub publish to subscribers (they DROP batches a slow
subscriber can't take: the receiver reports the gaps); +ipc uses a Unix socket
(zpush+ipc:///tmp/feed); a brace list gives several endpoints, which take batches in turn. A bind
with no host listens on 127.0.0.1 only.

\b
Each batch is one message: a msgpack header (keys, and name, dtype and shape of each tensor) and
one raw frame per tensor, sent without copying (wire format v2, docs/wire.md). Decoded images are
the tensor --output-field; --label fields become int64 tensors; the other fields (or --fields)
travel as bytes. --raw decodes nothing: the receiver gets the encoded fields (e.g. to decode on
its own GPU). Every epoch ends with an end-of-epoch message from each sender; receivers end when
all have finished.

\b
Delivery is acknowledged: a receiver grants credit for --hwm batches and acknowledges each one
its consumer takes, so a slow receiver slows tarserve down, and the batches a receiver held when
it died go to another receiver or to its replacement, marked as sent again: nothing is lost while
a receiver is there or comes back within --send-timeout (it costs no measurable speed: make
bench). --checkpoint FILE saves what was acknowledged; the same command with the same FILE
resumes there (the stream is the same: shuffles and batches come from --seed, or from the seed
FILE saved). With --checkpoint a polite stop (Ctrl-C, SIGTERM) is a pause: tarserve saves FILE
and tells the receivers, which wait until the same command is run again. Over ipc:// a decoded
batch goes through shared memory, not the socket.
"""


@click.command("tarserve", cls=TarprocCommand, epilog=EPILOG)
@decode_input_options
@click.option("--to", "destinations", multiple=True, metavar="URL",
              help="Where to send: zpush://host:port (default pattern), zpub://…, +ipc; repeatable.")
@click.option("--raw", is_flag=True, help="Send the encoded fields unchanged; decode nothing.")
@shared_option("-p", "--senders", type=number(1, MAX_PROCESSES), default=1, show_default=True,
              help="Sender processes, each reading its share of the shards (and decoding them); "
                   "at most one per shard.")
@click.option("--epochs", type=number(1), default=1, show_default=True, help="Passes over the shards.")
@click.option("--repeat", is_flag=True, help="Pass over the shards until stopped (instead of --epochs).")
@click.option("--shuffle-shards", is_flag=True, help="Shuffle the shard order every epoch (see --seed).")
@shuffle_option
@click.option("--last-batch", type=click.Choice(LAST_BATCH), default="keep", show_default=True,
              help="A last batch shorter than -b: send it, or drop it.")
@shared_option("--field", default=DEFAULT_IMAGE_SPEC, show_default=True, metavar="SPEC",
              help=f"The image field: the first of these names a sample has. {SPEC_HELP}")
@shared_option("--output-field", default="image", show_default=True, metavar="NAME",
              help="Name of the decoded image tensor.")
@click.option("--label", "labels", multiple=True, metavar="FIELD",
              help="Send this text field (e.g. cls) as an int64 tensor; repeatable.")
@click.option("-f", "--fields", metavar="NAMES",
              help="Other fields to send as bytes, comma/space separated, all of them (a list, not a field spec) "
                   "[default: all]; '' sends none.")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Save what receivers acknowledged in FILE; if FILE exists, resume where it says.")
@transport_options(sending=True)
@stats_option("batches, samples and bytes sent")
@server_decode_options
@common_options
def main(
    reading: ReadOptions,
    on_error: str,
    decoding: DecodeOptions,
    quiet: bool,
    destinations: tuple[str, ...],
    raw: bool,
    senders: int,
    epochs: int,
    repeat: bool,
    shuffle_shards: bool,
    shuffle_size: int | None,
    last_batch: str,
    field: str,
    output_field: str,
    labels: tuple[str, ...],
    fields: str | None,
    transport: dict[str, object],
    show_stats: bool,
    checkpoint: str | None,
) -> None:
    """Send the samples of tar shards as batches over ZeroMQ, decoded and augmented or raw.

    INPUTS are paths, '-' (stdin, the default) or URLs as for tarcat; arguments that are ZMQ URLs
    are destinations, like --to. Reads the shards, decodes and augments the images (the options of
    tardecode), forms batches of -b samples and sends them, for --epochs passes or --repeat.
    """
    urls = [u for u in reading.urls if is_zmq_url(u)]
    inputs = [u for u in reading.urls if not is_zmq_url(u)] or ["-"]
    urls += list(destinations)
    if not urls:
        raise OptionError("no destination: give --to zpush://host:port (or a ZMQ URL argument)")
    if output_field in ("", "__key__") or "/" in output_field:
        raise OptionError(f"bad --output-field {output_field!r}")
    config = ServeConfig(
        urls=urls, batch_size=decoding.batch_size, epochs=None if repeat else epochs,
        shuffle_shards=shuffle_shards, shuffle=shuffle_size, seed=decoding.spec.seed, raw=raw,
        spec=decoding.spec, device=decoding.device, threads=decoding.processes, image_field=field,
        output_field=output_field, labels=list(labels),
        fields=None if fields is None else fields.replace(",", " ").split(),
        last_batch=last_batch, senders=senders, on_error=on_error, checkpoint=checkpoint,
        seed_given=click.get_current_context().get_parameter_source("seed") is not ParameterSource.DEFAULT,
        reading={"policy": reading.policy, "network": reading.network},
        **transport,  # type: ignore[arg-type]
    )
    report = None if raw or quiet or decoding.device != "auto" else (
        lambda decoder: say(f"tarserve: decoding on {decoder}"))
    stats = serve(inputs, config, report=report,
                  wrap=lambda samples: progress(samples, quiet or senders > 1, "tarserve"))
    if show_stats:
        rate = stats.bytes / stats.seconds / 1e6 if stats.seconds else 0.0
        resumed = f" (resumed from {checkpoint})" if stats.resumed else ""
        say(f"tarserve: sent {stats.batches} batches, {stats.samples} samples, {stats.bytes / 1e6:.1f} MB "
            f"of tensors in {stats.epochs} epoch(s) from {senders} sender(s) in {stats.seconds:.1f} s "
            f"({rate:.1f} MB/s){resumed}; sent again {stats.redelivered} batches that receivers which went away "
            f"held; skipped {stats.skipped} bad images")


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarserve")
