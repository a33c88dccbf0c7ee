"""tarserve's core: shards -> samples -> (decode, augment) -> batches -> ZMQ, in 1..N sender processes.

Each epoch, sender ``rank`` of ``N`` reads every N-th shard of the (optionally shuffled) shard
list, so the senders together read every shard once per epoch; each ends each epoch with an eof
message carrying its counts.

Every batch says where its sender's stream is after it (``pos``: epoch, batch and input sample
of the epoch, shard and index in the shard of its last sample). With a checkpoint file, the
positions that receivers acknowledged are saved as they come in, and a restart with the same
file resumes there (``checkpoint``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..errors import DataWarning, DecodeError, OptionError, SampleError, TarprocError, TransportError, warner
from ..fieldspec import DEFAULT_IMAGE_SPEC
from ..samples import Sample, field_names, read_samples
from ..stages import chunked, shuffle
from ..tar import ReadStats
from . import checkpoint as checkpoints
from .delivery import Progress
from .sender import DEFAULT_HEARTBEAT, DEFAULT_HWM, DEFAULT_SEND_TIMEOUT, Sender, SendStats, check_sending
from .shm import SharedRing
from .shm import available as shm_available
from .urls import parse_endpoints

LAST_BATCH = ("keep", "drop")
STOP_SECONDS = 20.0  # after Ctrl-C or SIGTERM, how long tarserve waits for its sender processes to stop


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
    image_field: str = DEFAULT_IMAGE_SPEC
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
    ack: bool = True  # PUSH-style endpoints: wait for receivers' acknowledgements
    checkpoint: str | None = None  # a file to save acknowledged positions in, and resume from
    seed_given: bool = True  # False: ``seed`` was drawn at random, and a checkpoint's seed takes its place

    def stream(self, inputs: list[str]) -> dict[str, Any]:
        """What shapes the stream of batches (a checkpoint is only good for the same)."""
        return {"inputs": list(inputs), "batch_size": self.batch_size, "epochs": self.epochs,
                "shuffle_shards": self.shuffle_shards, "shuffle": self.shuffle, "seed": self.seed, "raw": self.raw,
                "spec": None if self.raw else repr(self.spec), "image_field": self.image_field,
                "output_field": self.output_field, "labels": list(self.labels), "fields": self.fields,
                "last_batch": self.last_batch, "senders": self.senders, "on_error": self.on_error}


@dataclass
class ServeStats(SendStats):
    """What all senders together sent, what decoding skipped, and how long it took."""

    skipped: int = 0
    seconds: float = 0.0
    resumed: bool = False  # from a checkpoint

    def add(self, sent: SendStats, skipped: int) -> None:
        self.redelivered += sent.redelivered
        self.batches += sent.batches
        self.samples += sent.samples
        self.bytes += sent.bytes
        self.epochs = max(self.epochs, sent.epochs)
        self.skipped += skipped


def check_config(inputs: list[str], config: ServeConfig) -> None:
    """Usage errors before anything starts."""
    endpoints = parse_endpoints(config.urls, sending=True)
    check_sending(config.hwm, config.heartbeat, config.send_timeout)
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
    if config.checkpoint is not None:
        if "-" in inputs:
            raise OptionError("a checkpoint needs inputs that can be read again: give shard paths or URLs, not stdin")
        if endpoints[0].kind == "pub" or not config.ack:
            raise OptionError("a checkpoint needs acknowledged delivery (PUSH-style endpoints)")


def serve(
    inputs: list[str],
    config: ServeConfig,
    *,
    warn: Callable[[str], None] | None = None,
    wrap: Callable[[Iterator[Sample]], Iterator[Sample]] | None = None,
    report: Callable[[str], None] | None = None,
) -> ServeStats:
    """Send the shards as batches to ``config.urls``; returns what was sent.

    ``wrap`` (e.g. a progress bar) sees the samples of a single sender process; ``report`` is
    told which decoder the first sender uses. ``warn``: a callback that takes each warning (a
    shard or an image skipped) instead of ``warnings.warn`` with a ``DataWarning``; a sender
    process calls it there (forked, it writes to the same stderr).
    """
    check_config(inputs, config)
    warn = warner(warn, DataWarning)
    if config.senders > len(inputs):  # a sender with no shard would only send empty epochs
        config = replace(config, senders=len(inputs))
    started = time.monotonic()
    saved = None
    path = config.checkpoint
    if path is not None:
        seed = None if config.seed_given else checkpoints.saved_seed(path)
        if seed is not None:  # the same command resumes: a seed drawn at random is the checkpoint's
            config = replace(config, seed=seed, spec=None if config.spec is None else replace(config.spec, seed=seed))
        stream = config.stream(inputs)
        saved = checkpoints.load(path, stream)
        if saved is not None and saved.done:
            raise OptionError(f"{path}: the checkpoint says the whole stream was delivered; remove it to send again")
        if saved is None:
            saved = checkpoints.Checkpoint(path, uuid.uuid4().hex, stream)
            saved.save()  # now: a restart after a crash before the first acknowledgement is the same stream
    group = saved.group if saved is not None else uuid.uuid4().hex
    states = saved.ranks if saved is not None else {}
    stats = ServeStats(resumed=any(s.next or s.above for s in states.values()))
    if config.senders == 1:
        def progress(p: Progress) -> None:
            if saved is not None:
                saved.ranks[0] = p
                saved.save()

        sent, skipped = _send_share(inputs, config, 0, group, warn, wrap, report,
                                    resume=states.get(0), progress=progress if saved is not None else None)
        stats.add(sent, skipped)
    else:
        _serve_in_processes(inputs, config, group, warn, report, stats, saved)
    if saved is not None:
        saved.done = True
        saved.save()
    stats.seconds = time.monotonic() - started
    return stats


def _send_share(
    inputs: list[str], config: ServeConfig, rank: int, group: str, warn: Callable[[str], None],
    wrap: Callable[[Iterator[Sample]], Iterator[Sample]] | None = None, report: Callable[[str], None] | None = None,
    resume: checkpoints.RankState | None = None, progress: Callable[[Progress], None] | None = None,
    hold: GroupEnd | None = None,
) -> tuple[SendStats, int]:
    """One sender process's work: its share of the shards, every epoch (from ``resume`` on:
    the batches it says were acknowledged are left out)."""
    resume = resume or checkpoints.RankState()
    start = resume.pos or {}
    endpoints = parse_endpoints(config.urls, sending=True)
    # receivers on this host (ipc) may map batches from shared memory rather than receive them
    shm = config.ack and all(e.kind == "push" and e.address.startswith("ipc://") for e in endpoints) and shm_available()
    urls = [e.url for e in endpoints]
    if any(e.bind for e in endpoints) and config.senders > 1:
        urls = urls[rank::config.senders]
    decoder = None
    decode_stats = None
    ring = SharedRing() if shm and not config.raw else None
    if not config.raw:
        from ..decode import DecodeStats, make_decoder

        decoder = make_decoder(config.spec, config.device, config.batch_size, config.threads)
        decode_stats = DecodeStats()
        if report is not None and rank == 0:
            report(decoder.describe())
    try:
        sender = Sender(urls, hwm=config.hwm, send_timeout=config.send_timeout, heartbeat=config.heartbeat,
                        curve=config.curve, rank=rank, senders=config.senders, group=group, ack=config.ack,
                        start_seq=resume.next, skip=resume.above, resend_below=resume.resend, progress=progress,
                        hold=hold, resumable=config.checkpoint is not None)
        with sender:
            epoch = start.get("epoch", 0)
            while config.epochs is None or epoch < config.epochs:
                shards = list(inputs)
                if config.shuffle_shards:
                    random.Random(f"{config.seed}:{epoch}").shuffle(shards)
                mine = shards[rank::config.senders]  # a sender with no shard still ends its epochs
                samples: Iterator[Sample] = (read_samples(mine, stats=ReadStats(), warn=warn, **config.reading)
                                             if mine else _no_samples())
                samples = _indexed(samples)
                if config.shuffle:
                    samples = shuffle(samples, config.shuffle, seed=random.Random(f"{config.seed}:{epoch}:{rank}").getrandbits(63))
                here = start if start.get("epoch") == epoch else {}  # the acknowledged part of this epoch
                samples = _numbered(samples, skip=here.get("sample", 0))
                if wrap is not None:
                    samples = wrap(samples)
                batch, sent = here.get("batch", 0), here.get("sent", 0)
                sender.start_epoch(batch, sent)
                with contextlib.closing(samples):  # type: ignore[type-var]
                    for keys, tensors, text, last, shared in _batches(samples, config, decoder, decode_stats, epoch,
                                                                      warn, ring):
                        batch, sent = batch + 1, sent + len(keys)
                        pos = {"epoch": epoch, "batch": batch, "sample": last["__input__"] + 1, "sent": sent,
                               "shard": str(last.get("__url__", "")), "index": last["__index__"]}
                        sender.send(keys, tensors, epoch=epoch, text=text, pos=pos, shared=shared)
                sender.end_epoch(epoch, final=config.epochs is not None and epoch == config.epochs - 1)
                epoch += 1
        return sender.stats, decode_stats.skipped if decode_stats is not None else 0
    finally:
        if decoder is not None:
            decoder.close()
        if ring is not None:  # (blocks a receiver maps stay valid there)
            ring.close()


def _no_samples() -> Iterator[Sample]:
    yield from ()


def _indexed(samples: Iterator[Sample]) -> Iterator[Sample]:
    """Samples with ``__index__``, their number in their shard (for positions people can read)."""
    counts: dict[Any, int] = {}
    for sample in samples:
        url = sample.get("__url__")
        index = counts.get(url, 0)
        counts[url] = index + 1
        sample["__index__"] = index
        yield sample


def _numbered(samples: Iterator[Sample], skip: int) -> Iterator[Sample]:
    """Samples with ``__input__``, their number in this sender's epoch, from ``skip`` on (the
    ones before were acknowledged before a restart: they are read again, and not decoded)."""
    for number, sample in enumerate(samples):
        if number >= skip:
            sample["__input__"] = number
            yield sample


def _batches(
    samples: Iterator[Sample], config: ServeConfig, decoder: Any, stats: Any, epoch: int, warn: Callable[[str], None],
    ring: SharedRing | None = None,
) -> Iterator[tuple[list[str], dict[str, Any], list[str], Sample, dict[str, Any]]]:
    """(keys, tensors, text tensor names, last sample, shared-memory blocks) of each batch to send;
    ``stats`` counts skipped images. ``ring``: decoded images go into its shared-memory blocks."""
    if decoder is not None and getattr(decoder, "name", "") == "cpu" and getattr(decoder, "processes", 0) == 1 \
            and config.spec.size is not None:
        yield from _decoded_into_batches(samples, config, decoder, stats, epoch, warn, ring)
        return
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
        yield (*_tensors(chunk, config, image=decoder is not None), chunk[-1], {})


def _decoded_into_batches(
    samples: Iterator[Sample], config: ServeConfig, decoder: Any, stats: Any, epoch: int, warn: Callable[[str], None],
    ring: SharedRing | None,
) -> Iterator[tuple[list[str], dict[str, Any], list[str], Sample, dict[str, Any]]]:
    """The cpu decoder in this process, with every image of one shape: each image is decoded
    straight into its row of the batch array (a block of ``ring``, in shared memory, when there
    is one), which is sent as it is: no image array per sample, no stacking copy. A bad image
    fails or is skipped (its row is used by the next one)."""
    from ..decode.cpu import ImageError, decode_into
    from ..decode.spec import plan_key
    from ..decode.stage import parse_field_list

    spec = config.spec
    if spec.seed is None and spec.random:
        spec = replace(spec, seed=random.SystemRandom().getrandbits(63))
    names = parse_field_list(config.image_field)
    shape = (config.batch_size, *((3, spec.size, spec.size) if spec.layout == "CHW" else (spec.size, spec.size, 3)))
    block: Any = None
    array: Any = None
    rows: list[Sample] = []
    for sample in samples:
        if array is None:
            block = ring.take(shape, spec.output_dtype) if ring is not None else None
            array = block.array if block is not None else np.empty(shape, spec.output_dtype)
        name = next((n for n in names if n in sample), None)
        try:
            if name is None:
                raise ImageError(f"no image field ({';'.join(names)})")
            if config.output_field != name and config.output_field in sample:
                raise DecodeError(f"the sample already has a field {config.output_field!r}; choose another "
                                  "output field", sample.get("__url__"), sample.get("__key__"), name)
            decode_into(bytes(sample[name]), spec, plan_key(str(sample.get("__key__")), epoch), array[len(rows)],
                        dct_scaling=decoder.dct_scaling)
        except ImageError as e:
            error = DecodeError(str(e), sample.get("__url__"), sample.get("__key__"), name)
            if config.on_error == "fail":
                raise error from None
            stats.skipped += 1
            warn(f"skipped: {error}")
            continue
        del sample[name]
        rows.append(sample)
        stats.decoded += 1
        if len(rows) == config.batch_size:
            yield _decoded_batch(rows, array, config, block)
            block, array, rows = None, None, []
    if rows and config.last_batch == "keep":
        yield _decoded_batch(rows, array[: len(rows)], config, block)


def _decoded_batch(rows: list[Sample], images: Any, config: ServeConfig,
                   block: Any) -> tuple[list[str], dict[str, Any], list[str], Sample, dict[str, Any]]:
    keys, tensors, text = _tensors(rows, config, image=False)
    tensors = {config.output_field: images, **tensors}
    return keys, tensors, text, rows[-1], ({config.output_field: block} if block is not None else {})


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


class GroupEnd:
    """The sender processes of one tarserve end together. One that has delivered its whole stream
    waits for the others, still telling receivers that connect (a restarted one) that it has
    ended: else such a receiver, never hearing from it, would wait for it."""

    def __init__(self, context: Any, senders: int) -> None:
        self._count = context.Value("i", 0)
        self._senders = senders
        self._arrived = False

    def ended(self) -> bool:
        """Say this sender is done (once); whether every sender of the group is."""
        if not self._arrived:
            with self._count.get_lock():
                self._count.value += 1
            self._arrived = True
        return self._count.value >= self._senders  # type: ignore[no-any-return]


def _stop_on_sigterm() -> None:
    """A sender process's signals: Ctrl-C (SIGINT, sent to the whole process group) is the
    parent's to handle, which stops its senders with SIGTERM; the first SIGTERM stops this one
    as Ctrl-C would (with a checkpoint, a pause), and later ones must not cut that short."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def stop(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def _child(inputs: list[str], config: ServeConfig, rank: int, group: str, conn: Any, parent: int,
           warn: Callable[[str], None], report: Callable[[str], None] | None,
           resume: checkpoints.RankState | None, hold: GroupEnd) -> None:
    reply: tuple[str, Any, Any] = ("interrupted", None, 0)
    try:
        _stop_on_sigterm()
        from ..process import end_with_parent

        end_with_parent(parent)

        def progress(p: Progress) -> None:  # from the sender's socket thread; the parent saves it
            conn.send(("progress", p, 0))

        sent, skipped = _send_share(inputs, config, rank, group, warn, report=report, resume=resume,
                                    progress=progress if config.checkpoint is not None else None, hold=hold)
        reply = ("ok", sent, skipped)
    except KeyboardInterrupt:
        reply = ("interrupted", None, 0)
    except TarprocError as e:
        reply = ("error", f"sender {rank}: {e}", isinstance(e, OptionError))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which owns the exit status
        reply = ("error", f"sender {rank}: internal error: {type(e).__name__}: {e}", False)
    try:
        conn.send(reply)
    except (OSError, KeyboardInterrupt):
        pass  # the parent is gone, or stopping us: it has what it needs
    finally:
        conn.close()


def _collect(pending: dict[Any, Any], ranks: dict[Any, int], stats: ServeStats, saved: checkpoints.Checkpoint | None,
             until: float | None = None) -> None:
    """Read the sender processes' pipes (saving their progress) until every one has ended, or
    ``until`` (a time): the stop after an interrupt, when their errors no longer matter."""
    from multiprocessing.connection import wait

    while pending:
        left = None if until is None else until - time.monotonic()
        if left is not None and left <= 0:
            return
        for conn in wait(list(pending), timeout=left):
            process = pending[conn]
            try:
                reply: tuple[str, Any, Any] = conn.recv()  # type: ignore[union-attr,call-arg,assignment]
            except EOFError:
                del pending[conn]
                process.join()
                if until is not None:
                    continue
                raise TransportError(f"sender process {process.name} died (exit status {process.exitcode})") from None
            status, first, second = reply
            if status == "progress":
                if saved is not None:
                    saved.ranks[ranks[conn]] = first
                    saved.save()
                continue
            del pending[conn]
            if until is not None:
                continue
            if status == "error":
                raise OptionError(first) if second else TarprocError(first)
            if status == "interrupted":
                raise KeyboardInterrupt
            stats.add(first, second)


def _serve_in_processes(
    inputs: list[str], config: ServeConfig, group: str, warn: Callable[[str], None],
    report: Callable[[str], None] | None, stats: ServeStats, saved: checkpoints.Checkpoint | None,
) -> None:
    method = "fork" if os.uname().sysname == "Linux" else "spawn"
    context: Any = multiprocessing.get_context(method)
    # what every sender imports, imported once here rather than in each (a tenth of a second apiece)
    import zmq  # noqa: F401

    from ..process import end_with_parent  # noqa: F401
    if not config.raw:
        from ..decode import make_decoder  # noqa: F401
    children = []
    pending: dict[Any, Any] = {}
    ranks: dict[Any, int] = {}
    hold = GroupEnd(context, config.senders)
    try:
        for rank in range(config.senders):
            receive, send = context.Pipe(duplex=False)
            resume = saved.ranks.get(rank) if saved is not None else None
            process = context.Process(target=_child, name=f"tarserve-sender-{rank}",
                                      args=(inputs, replace(config), rank, group, send, os.getpid(), warn, report,
                                            resume, hold))
            process.start()
            send.close()
            children.append(process)
            pending[receive] = process
            ranks[receive] = rank
        try:
            _collect(pending, ranks, stats, saved)
        except BaseException as e:
            if isinstance(e, Exception):
                raise
            # Ctrl-C or SIGTERM: each sender stops (with a checkpoint: pauses, telling its receivers),
            # and what they say until they are gone is saved
            for process in children:
                if process.is_alive() and process.pid is not None:
                    with contextlib.suppress(OSError):
                        os.kill(process.pid, signal.SIGTERM)
            with contextlib.suppress(Exception):
                _collect(pending, ranks, stats, saved, until=time.monotonic() + STOP_SECONDS)
            raise
    finally:
        for process in children:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + STOP_SECONDS
        for process in children:  # a sender stopping takes a few seconds at most: never wait for ever
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
