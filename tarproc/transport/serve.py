"""tarserve's core: shards -> samples -> (decode, augment) -> batches -> ZMQ, in 1..N sender processes.

Each epoch, sender ``rank`` of ``N`` reads every N-th shard of the (optionally shuffled) shard
list, so the senders together read every shard once per epoch; each ends each epoch with an eof
message carrying its counts.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import OptionError, SampleError, TarprocError, TransportError
from ..samples import Sample, field_names, read_samples
from ..stages import chunked, shuffle
from ..tario import ReadStats
from .sender import DEFAULT_HEARTBEAT, DEFAULT_HWM, DEFAULT_SEND_TIMEOUT, Sender, SendStats
from .urls import parse_endpoints

LAST_BATCH = ("keep", "drop")


@dataclass
class ServeConfig:
    """Everything tarserve does besides reading: batching, decoding, sending."""

    urls: list[str]
    batch_size: int = 64
    epochs: int | None = 1  # None: repeat until stopped
    shuffle_shards: bool = False
    shuffle: int | None = None  # sample shuffle buffer
    seed: int = 0
    raw: bool = False  # send the encoded fields, decode nothing
    spec: Any = None  # tarproc.decode.AugmentSpec when decoding
    device: str = "auto"
    threads: int = 1
    image_field: str = "jpg;jpeg;png;webp"
    output_field: str = "image"
    labels: list[str] = field(default_factory=list)  # text fields sent as int64 tensors
    fields: list[str] | None = None  # other fields to send (None: all)
    last_batch: str = "keep"
    senders: int = 1
    on_error: str = "fail"  # bad images: fail or skip
    reading: dict[str, Any] = field(default_factory=dict)  # read_samples keyword arguments
    hwm: int = DEFAULT_HWM
    send_timeout: float | None = DEFAULT_SEND_TIMEOUT
    heartbeat: float = DEFAULT_HEARTBEAT
    curve: str | None = None


@dataclass
class ServeStats(SendStats):
    """What all senders together sent, what decoding skipped, and how long it took."""

    skipped: int = 0
    seconds: float = 0.0

    def add(self, sent: SendStats, skipped: int) -> None:
        self.batches += sent.batches
        self.samples += sent.samples
        self.bytes += sent.bytes
        self.epochs = max(self.epochs, sent.epochs)
        self.skipped += skipped


def check_config(inputs: list[str], config: ServeConfig) -> None:
    """Usage errors before anything starts."""
    endpoints = parse_endpoints(config.urls, sending=True)
    if config.batch_size < 1:
        raise OptionError(f"bad batch size {config.batch_size}; must be >= 1")
    if config.senders < 1:
        raise OptionError(f"bad number of senders {config.senders}; must be >= 1")
    if config.last_batch not in LAST_BATCH:
        raise OptionError(f"bad last-batch policy {config.last_batch!r}; use keep or drop")
    if config.epochs is not None and config.epochs < 1:
        raise OptionError(f"bad number of epochs {config.epochs}; must be >= 1")
    if "-" in inputs and (config.senders > 1 or config.epochs != 1):
        raise OptionError("stdin can be read once, by one sender: give shard paths or URLs for -p > 1 or --epochs")
    bound = [e for e in endpoints if e.bind]
    if bound and config.senders > len(bound):
        raise OptionError(f"-p {config.senders} senders can't share {len(bound)} bound endpoint(s); "
                          "give one per sender (zrpush://:78{80..83}) or let the receivers bind (zpush)")
    if not config.raw and config.spec is None:
        raise OptionError("decoding needs an augmentation spec (or send raw fields)")
    if config.output_field in config.labels:
        raise OptionError(f"--label {config.output_field} is also the image tensor's name")


def serve(
    inputs: list[str],
    config: ServeConfig,
    *,
    warn: Callable[[str], None],
    wrap: Callable[[Iterator[Sample]], Iterator[Sample]] | None = None,
    report: Callable[[str], None] | None = None,
) -> ServeStats:
    """Send the shards as batches to ``config.urls``; returns what was sent.

    ``wrap`` (e.g. a progress bar) sees the samples of a single sender process; ``report`` is
    told which decoder the first sender uses.
    """
    check_config(inputs, config)
    if config.senders > len(inputs):  # a sender with no shard would only send empty epochs
        config = replace(config, senders=len(inputs))
    started = time.monotonic()
    group = uuid.uuid4().hex
    if config.senders == 1:
        stats = ServeStats()
        sent, skipped = _send_share(inputs, config, 0, group, warn, wrap, report)
        stats.add(sent, skipped)
    else:
        stats = _serve_in_processes(inputs, config, group, warn, report)
    stats.seconds = time.monotonic() - started
    return stats


def _send_share(
    inputs: list[str], config: ServeConfig, rank: int, group: str, warn: Callable[[str], None],
    wrap: Callable[[Iterator[Sample]], Iterator[Sample]] | None = None, report: Callable[[str], None] | None = None,
) -> tuple[SendStats, int]:
    """One sender process's work: its share of the shards, every epoch."""
    endpoints = parse_endpoints(config.urls, sending=True)
    urls = [e.url for e in endpoints]
    if any(e.bind for e in endpoints) and config.senders > 1:
        urls = urls[rank::config.senders]
    decoder = None
    decode_stats = None
    if not config.raw:
        from ..decode import DecodeStats, make_decoder

        decoder = make_decoder(config.spec, config.device, config.batch_size, config.threads)
        decode_stats = DecodeStats()
        if report is not None and rank == 0:
            report(decoder.describe())
    try:
        sender = Sender(urls, hwm=config.hwm, send_timeout=config.send_timeout, heartbeat=config.heartbeat,
                        curve=config.curve, rank=rank, senders=config.senders, group=group)
        with sender:
            epoch = 0
            while config.epochs is None or epoch < config.epochs:
                shards = list(inputs)
                if config.shuffle_shards:
                    random.Random(f"{config.seed}:{epoch}").shuffle(shards)
                mine = shards[rank::config.senders]  # a sender with no shard still ends its epochs
                samples: Iterator[Sample] = (read_samples(mine, stats=ReadStats(), warn=warn, **config.reading)
                                             if mine else _no_samples())
                if config.shuffle:
                    samples = shuffle(samples, config.shuffle, seed=random.Random(f"{config.seed}:{epoch}:{rank}").getrandbits(63))
                if wrap is not None:
                    samples = wrap(samples)
                with contextlib.closing(samples):  # type: ignore[type-var]
                    for keys, tensors, text in _batches(samples, config, decoder, decode_stats, epoch, warn):
                        sender.send(keys, tensors, epoch=epoch, text=text)
                sender.end_epoch(epoch, final=config.epochs is not None and epoch == config.epochs - 1)
                epoch += 1
        return sender.stats, decode_stats.skipped if decode_stats is not None else 0
    finally:
        if decoder is not None:
            decoder.close()


def _no_samples() -> Iterator[Sample]:
    yield from ()


def _batches(
    samples: Iterator[Sample], config: ServeConfig, decoder: Any, stats: Any, epoch: int, warn: Callable[[str], None]
) -> Iterator[tuple[list[str], dict[str, Any], list[str]]]:
    """(keys, tensors, text tensor names) of each batch to send; ``stats`` counts skipped images."""
    if decoder is not None:
        from ..decode import decoded_batches

        decoded = decoded_batches(samples, config.spec, field=config.image_field, output_field=config.output_field,
                                  device=decoder, batch_size=config.batch_size, on_error=config.on_error,
                                  stats=stats, warn=warn, epoch=epoch)
        # skipped images leave short batches behind: re-cut them to the batch size
        samples = (sample for batch in decoded for sample in batch)
    for chunk in chunked(samples, config.batch_size):
        if len(chunk) < config.batch_size and config.last_batch == "drop":
            break
        yield _tensors(chunk, config, image=decoder is not None)


def _tensors(chunk: list[Sample], config: ServeConfig, image: bool) -> tuple[list[str], dict[str, Any], list[str]]:
    keys = [str(s["__key__"]) for s in chunk]
    tensors: dict[str, Any] = {}
    if image:
        arrays = [s[config.output_field] for s in chunk]
        same = all(a.shape == arrays[0].shape and a.dtype == arrays[0].dtype for a in arrays)
        tensors[config.output_field] = np.stack(arrays) if same else arrays
    for name in config.labels:
        tensors[name] = np.array([_label(s, name) for s in chunk], dtype=np.int64)
    taken = set(tensors)
    names: list[str] = []
    for sample in chunk:
        for name in field_names(sample):
            if name not in taken and (config.fields is None or name in config.fields):
                taken.add(name)
                names.append(name)
    for name in names:
        tensors[name] = [_raw(s.get(name)) for s in chunk]
    return keys, tensors, list(config.labels)


def _raw(value: Any) -> bytes | bytearray | memoryview | None:
    if value is None or isinstance(value, (bytes, bytearray, memoryview)):
        return value
    raise SampleError(f"field of type {type(value).__name__} can't be sent as bytes")


def _label(sample: Sample, name: str) -> int:
    value = sample.get(name)
    if value is None:
        raise SampleError(f"sample {sample.get('__key__')!r} has no field {name!r} (--label)",
                          sample.get("__url__"), sample.get("__key__"))
    try:
        return int(bytes(value).decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise SampleError(f"field {name!r} of sample {sample.get('__key__')!r} is not an integer: "
                          f"{bytes(value)[:40]!r} (--label)", sample.get("__url__"), sample.get("__key__")) from None


# -- several sender processes -------------------------------------------------------------------


def _child(inputs: list[str], config: ServeConfig, rank: int, group: str, conn: Any, parent: int,
           warn: Callable[[str], None], report: Callable[[str], None] | None) -> None:
    from ..process import end_with_parent

    end_with_parent(parent)
    try:
        sent, skipped = _send_share(inputs, config, rank, group, warn, report=report)
        conn.send(("ok", sent, skipped))
    except KeyboardInterrupt:
        conn.send(("interrupted", None, 0))
    except TarprocError as e:
        conn.send(("error", f"sender {rank}: {e}", isinstance(e, OptionError)))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which owns the exit status
        conn.send(("error", f"sender {rank}: internal error: {type(e).__name__}: {e}", False))
    finally:
        conn.close()


def _serve_in_processes(
    inputs: list[str], config: ServeConfig, group: str, warn: Callable[[str], None],
    report: Callable[[str], None] | None,
) -> ServeStats:
    from multiprocessing.connection import wait

    method = "fork" if os.uname().sysname == "Linux" else "spawn"
    context: Any = multiprocessing.get_context(method)
    stats = ServeStats()
    children = []
    pending: dict[Any, Any] = {}
    try:
        for rank in range(config.senders):
            receive, send = context.Pipe(duplex=False)
            process = context.Process(target=_child, name=f"tarserve-sender-{rank}",
                                      args=(inputs, replace(config), rank, group, send, os.getpid(), warn, report))
            process.start()
            send.close()
            children.append(process)
            pending[receive] = process
        while pending:
            for conn in wait(list(pending)):
                process = pending.pop(conn)
                try:
                    reply: tuple[str, Any, Any] = conn.recv()  # type: ignore[union-attr,call-arg,assignment]
                except EOFError:
                    process.join()
                    raise TransportError(f"sender process {process.name} died (exit status {process.exitcode})") \
                        from None
                status, first, second = reply
                if status == "error":
                    raise OptionError(first) if second else TarprocError(first)
                if status == "interrupted":
                    raise KeyboardInterrupt
                stats.add(first, second)
        return stats
    finally:
        for process in children:
            if process.is_alive():
                process.terminate()
        for process in children:
            process.join()
