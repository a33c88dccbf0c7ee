"""tarrecv: receive tarserve's batches: print the rates (like tensormon) or write the samples as a tar."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import click
import numpy as np

from ..errors import TransportError
from ..samples import Sample
from ..transport import Receiver
from ..transport.collect import check_output, write_received
from ..transport.receiver import MIN_RATE_SECONDS
from ..transport.wire import Batch
from .common import (
    MAX_PROCESSES,
    Finite,
    TarprocCommand,
    WriteOptions,
    common_options,
    number,
    say,
    shared_option,
    transport_options,
    writer_options,
)

EPILOG = """\b
Examples:
  tarrecv zpull://:7880                                   # rates once a second, until the senders end
  tarrecv zpull://:7880 -o received.tar --stats
  tarserve --raw 'shard-{00..07}.tar' -p 2 --to zpush://:7880 & tarrecv zpull://:7880 -o - | tarshow -c 3
  tarrecv 'zsub://feeder:78{80..83}' --count 1000 -q      # a subscriber: reports batches PUB dropped
  tarrecv zpull://:7880 -o copy.tar     # killed? run it again: copy.tar.part resumes, nothing twice
  tarrecv zpull://:7880 --max-message-size 4GiB -o - | tarsplit -s 1e9 -o photos-%04d.tar   # big raw photos

\b
Without -o it prints one line per --interval to stdout: batches/s, samples/s and MB/s over the
interval, then a summary. With -o it writes the samples it receives as a tar (the rates go to
stderr): raw fields as they were sent (tarserve --raw round-trips byte for byte with -p 1),
--label tensors as decimal text, arrays as .npy members (field NAME.npy). It ends when every
sender has finished (end of stream), after --count batches, or with an error when a sender goes
silent for --idle-timeout seconds.

\b
Each batch is acknowledged to its sender once it is taken (with -o: once written), and the
sender gives what a receiver held unacknowledged when it died to another receiver or to its
replacement, marked as sent again. With -o NAME.tar (a local file) the tar grows as NAME.tar.part
with its state in NAME.tar.part.json, renamed NAME.tar at the end of the stream: a receiver
killed mid-stream and started again with the same -o goes on where it was, and the tar comes
out whole, each sample once. Other outputs (stdout, a URL, a compressed file) can't be resumed:
their batches are acknowledged once written, so if tarrecv dies, what it wrote there is lost
and the senders have forgotten it. PUB/SUB is best effort: batches a subscriber missed are reported
as lost; with -o that is an error, and nothing is left under the output name.
"""


@click.command("tarrecv", cls=TarprocCommand, epilog=EPILOG)
@click.argument("urls", nargs=-1, required=True, metavar="URL...")
@shared_option("-o", "--output", default=None, metavar="URL",
              help="Write the received samples as a tar here ('-' = stdout) instead of printing rates.")
@shared_option("--count", type=number(1), default=None, metavar="N", help="Stop after N batches.")
@shared_option("--senders", type=number(1, MAX_PROCESSES), default=None, metavar="N",
              help="Wait for N sender processes to finish [default: all of the groups heard from].")
@click.option("--interval", type=Finite(min=0.1), default=1.0, show_default=True, metavar="SECONDS",
              help="Seconds between rate lines.")
@shared_option("--stats", "show_stats", is_flag=True, help="Print the summary to stderr (with -o).")
@transport_options(sending=False)
@writer_options
@common_options
def main(
    urls: tuple[str, ...],
    output: str | None,
    count: int | None,
    senders: int | None,
    interval: float,
    show_stats: bool,
    transport: dict[str, Any],
    writing: WriteOptions,
    quiet: bool,
) -> None:
    """Receive batches from tarserve and print their rates, or write their samples as a tar.

    URL... are ZMQ endpoints to receive on: zpull://:PORT binds (tarserve connects with zpush),
    zrpull://host:port connects to a tarserve that binds, zsub://host:port subscribes.
    """
    if output is not None:
        check_output(output)  # before any sender is given credit
    # the process is the command's: its malloc may be tuned for the batches (twice the rate)
    receiver = Receiver(list(urls), senders=senders, ack="auto" if output is None else "manual",
                        reuse_memory=True, **transport)
    monitor = Monitor(receiver, interval, quiet, to=sys.stderr if output is not None else sys.stdout)
    try:
        batches = _batches(receiver, count, monitor)
        if output is None:
            for _ in batches:
                pass
        else:
            write_received(receiver, batches, output, batch_samples, tar=writing.tar, force=writing.force,
                           say=lambda line: say(f"tarrecv: {line}"), check=lambda: _check_lost(receiver))
    finally:
        receiver.close()
    if output is None or show_stats:
        monitor.summary()
    if output is None and receiver.stats.lost:
        raise TransportError(f"{receiver.stats.lost} batches lost on the way (see above)")


def _batches(receiver: Receiver, count: int | None, monitor: Monitor) -> Iterator[Batch]:
    for n, batch in enumerate(receiver, 1):
        monitor.tick()
        yield batch
        if count is not None and n >= count:
            break
    monitor.tick(force=True)


def _check_lost(receiver: Receiver) -> None:
    """A loss (PUB/SUB) is an error: the tar would be incomplete (the writer then aborts)."""
    if receiver.stats.lost:
        raise TransportError(f"{receiver.stats.lost} batches lost on the way: the tar would be incomplete")


def batch_samples(batch: Batch) -> Iterator[Sample]:
    """One sample dict per key: bytes fields as they came, int text tensors as text, arrays as .npy."""
    from ..decode import npy_bytes

    keys = batch["__key__"]
    for i, key in enumerate(keys):
        sample: Sample = {"__key__": key}
        for name, value in batch.items():
            if name == "__key__":
                continue
            item = value[i]
            if item is None:
                continue
            if isinstance(item, bytes):
                sample[name] = item
            elif name in batch.text:
                sample[name] = str(int(item)).encode()
            else:
                if batch.dtypes.get(name) == "bfloat16":  # .npy has no bfloat16 (ml_dtypes'): its bits
                    item = np.asarray(item).view(np.uint16)
                sample[name if name.endswith("npy") else f"{name}.npy"] = npy_bytes(item)
        yield sample


class Monitor:
    """Rate lines every ``interval`` seconds and a summary, like tensorcom's tensormon.

    Rates are over the time since the first batch arrived (waiting for the senders is not
    transfer time), and only over ``MIN_RATE_SECONDS`` or more: a batch or two in a few
    milliseconds say nothing about a rate.
    """

    def __init__(self, receiver: Receiver, interval: float, quiet: bool, to: Any) -> None:
        self.receiver = receiver
        self.interval = interval
        self.quiet = quiet
        self.to = to
        self.last: tuple[float, int, int, int] | None = None  # time, batches, samples, bytes of the last line

    def tick(self, force: bool = False) -> None:
        stats = self.receiver.stats
        if self.last is None:
            if stats.first is None:
                return
            self.last = (stats.first, 1, stats.first_samples, stats.first_bytes)  # the clock starts
        now = time.monotonic()
        then, batches, samples, nbytes = self.last
        dt = now - then
        if self.quiet or (dt < self.interval and not force) or dt < MIN_RATE_SECONDS or stats.batches == batches:
            return
        self._print(f"{(stats.batches - batches) / dt:9.1f} batches/s {(stats.samples - samples) / dt:11.1f} "
                    f"samples/s {(stats.bytes - nbytes) / dt / 1e6:9.1f} MB/s   total {stats.batches} batches "
                    f"epoch {stats.epochs}")
        self.last = (now, stats.batches, stats.samples, stats.bytes)

    def summary(self) -> None:
        stats = self.receiver.stats
        line = (f"received {_count(stats.batches, 'batch')}, {_count(stats.samples, 'sample')}, "
                f"{_size(stats.bytes)} from {stats.senders} sender(s)")
        if stats.batches > 1:
            line += f" in {_duration(stats.seconds)}"
        if stats.rated:
            rates = stats.rates()
            line += (f": {_rate(rates['batches/s'])} batches/s, {_rate(rates['samples/s'])} samples/s, "
                     f"{_rate(rates['MB/s'])} MB/s")
        line += (f"; {stats.epochs} epoch(s) ended; lost {stats.lost}, rejected {stats.rejected}, "
                 f"sent again {stats.redelivered}, dropped as taken before {stats.duplicates}")
        if self.to is sys.stdout:
            self._print(line)
        else:
            say(f"tarrecv: {line}")

    def _print(self, line: str) -> None:
        if self.to is sys.stdout:
            click.echo(line)
        else:
            say(f"tarrecv: {line}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}es" if noun.endswith("ch") else f"{n} {noun}s"


def _size(nbytes: int) -> str:
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 100_000 else f"{nbytes} bytes"


def _duration(seconds: float) -> str:
    """Three significant digits below 100 s (42.1 ms, 1.25 s), then whole seconds."""
    if seconds < 1:
        return f"{seconds * 1000:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 100 else f"{seconds:.0f} s"


def _rate(value: float) -> str:
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


if __name__ == "__main__":  # pragma: no cover
    main(prog_name="tarrecv")
