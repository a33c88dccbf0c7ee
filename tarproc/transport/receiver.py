"""The receiving side: ``Receiver`` iterates the batches tarserve sends, as dicts of numpy arrays.

It knows the senders from the messages themselves (every header names its sender, the sender's
group and how many senders the group has), so it can start before or after them, be restarted,
and still tell when the stream has ended: when every sender of every group it has heard from has
sent its final end-of-epoch message. A sender that goes silent for ``timeout`` seconds (no batch
and no heartbeat) is a ``TransportError``, not an endless hang; so is a sender that stopped early
(an interrupted or failed tarserve says so before it goes), and a failed CURVE handshake (keys
that don't match) on a socket no sender has got through on yet. A message that is not wire
format v2 (a stray client, garbage, an older tarproc) is reported through ``warn``, naming where
it came from, counted, and skipped.

On PUSH-style endpoints (``zpull``, ``zrpull``) the receiver grants each sender credit for
``hwm`` batches and acknowledges each batch once its consumer has taken it: with
``ack="auto"``, when the consumer asks for the next batch; with ``ack="manual"``, when the
consumer calls ``ack(batch)`` (after writing it somewhere safe, say). A batch sent again
because an earlier receiver died before acknowledging it arrives with ``redelivered`` set; one
this receiver already took (its acknowledgement was lost with a connection) is dropped.
"""

from __future__ import annotations

import os
import socket as socketlib
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import DatasetError, NetworkWarning, OptionError, TransportError, WireError, warner
from .curve import Handshakes, handshake_events
from .sender import DEFAULT_HWM
from .shm import available as shm_available
from .sockets import MAX_C_INT, MAX_INT64, attach, close_sockets, destroy, monitor_event, open_socket, set_option
from .urls import parse_endpoints
from .wire import Batch, MessageError, decode, to_batch
from .wire import ack as ack_message

DEFAULT_TIMEOUT = 30.0
# The largest frame (one tensor of a batch, or one sample's raw field) a receiver accepts: ZMQ
# drops a connection that sends a bigger one before allocating it. A 256 x 3 x 224 x 224 float32
# batch is 154 MB; 256 RGB photos of 2048 x 1536 as uint8 are 2.4 GB and need a higher limit.
DEFAULT_MAX_MESSAGE_SIZE = 1 << 30
CLOSE_LINGER_MS = 2000
TAKEN_MEMORY = 1 << 16  # batch numbers per sender remembered as taken, to drop a second copy
MAX_SENDERS = 4096  # senders (group, rank) one receiver keeps track of: a peer can't grow the table for ever
MAX_FRAMES = 4096  # frames of one message (a batch has a few a column): past it, the rest is dropped unkept
_CONNECTION_EVENTS = 0x0001 | 0x0020 | 0x0200  # EVENT_CONNECTED | EVENT_ACCEPTED | EVENT_DISCONNECTED
_ACCEPTED, _DISCONNECTED = 0x0020, 0x0200
MIN_RATE_SECONDS = 0.1  # a rate measured over less time than this is noise
# Receiver.dataset() read in a DataLoader worker (or pickled for one): the sockets are the main
# process's, and the batches need no workers
NO_WORKERS = ("Receiver.dataset() can't be read in DataLoader worker processes (its ZMQ sockets live in the main "
              "process, and a forked copy of them would receive nothing): tarserve sends batches already decoded "
              "and batched, so use DataLoader(receiver.dataset(), batch_size=None, num_workers=0)")
_malloc_tuned: bool | None = None


def tune_malloc() -> bool:
    """Have glibc keep freed message buffers for reuse instead of mapping fresh pages each time.

    libzmq allocates every received message anew; a 40-80 MB batch is over glibc's mmap
    threshold, so each one is fresh memory that the kernel must fault in and zero, which halves
    the transfer rate. With one arena, no mmap for large blocks and no trimming, a freed batch
    buffer is reused by the next one (peak memory is unchanged: the batches in flight). This is
    process-wide and must happen before the ZMQ context starts its I/O thread; it is done once,
    and is a no-op where the C library is not glibc. Returns whether it is in effect.
    """
    global _malloc_tuned
    if _malloc_tuned is None:
        _malloc_tuned = False
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                mallopt = ctypes.CDLL("libc.so.6").mallopt
            except (OSError, AttributeError):
                return False
            m_trim_threshold, m_top_pad, m_mmap_max, m_arena_max = -1, -2, -4, -8
            settings = ((m_arena_max, 1), (m_mmap_max, 0), (m_trim_threshold, 2**31 - 1), (m_top_pad, 64 << 20))
            _malloc_tuned = all(mallopt(option, value) == 1 for option, value in settings)
    return _malloc_tuned


def _recv_bounded(sock: Any) -> list[Any] | None:
    """One message's frames, or None (its frames received and let go) when it has more than
    MAX_FRAMES: the size limit is a frame's, and millions of empty frames must not become as many
    objects held at once."""
    frames = [sock.recv(copy=False)]
    while frames[-1].more:
        if len(frames) > MAX_FRAMES:
            while sock.recv(copy=False).more:
                pass
            return None
        frames.append(sock.recv(copy=False))
    return frames


@dataclass
class EpochEnd:
    """Every sender has finished ``epoch``: ``batches`` and ``samples`` are what they say they sent."""

    epoch: int
    batches: int
    samples: int


@dataclass
class ReceiveStats:
    """Counts since the receiver started, and rates over the time since the first batch."""

    batches: int = 0
    samples: int = 0
    bytes: int = 0
    rejected: int = 0  # messages that were not wire format v2
    lost: int = 0  # batches a sender numbered but that never arrived (PUB drops)
    redelivered: int = 0  # batches sent again after an earlier receiver died holding them
    duplicates: int = 0  # second copies of batches this receiver had taken, dropped
    epochs: int = 0
    senders: int = 0
    first: float | None = None
    last: float | None = None

    first_samples: int = 0  # of the first batch, which arrived at ``first``
    first_bytes: int = 0

    @property
    def seconds(self) -> float:
        """From the arrival of the first batch to that of the last."""
        return (self.last - self.first) if self.first is not None and self.last is not None else 0.0

    @property
    def rated(self) -> bool:
        """There is a rate to speak of: two batches or more, over ``MIN_RATE_SECONDS`` or more."""
        return self.batches > 1 and self.seconds >= MIN_RATE_SECONDS

    def rates(self) -> dict[str, float]:
        """batches/s, samples/s and MB/s (10^6 bytes) of what arrived after the first batch, over
        the time since it arrived (NaN without a second batch; see ``rated``)."""
        s = self.seconds or float("nan")
        return {"batches/s": (self.batches - 1) / s, "samples/s": (self.samples - self.first_samples) / s,
                "MB/s": (self.bytes - self.first_bytes) / s / 1e6}


@dataclass
class _Sender:
    """What a receiver knows of one sender (a group's rank: a sender restarted from a checkpoint
    is the same one); ``sockets`` are the receiver's sockets it was seen on."""

    id: str
    group: str
    rank: int
    last_heard: float
    sockets: set[int] = field(default_factory=set)
    next_seq: dict[int, int] = field(default_factory=dict)  # the sender's socket (dest) -> next number
    eofs: dict[int, tuple[int, int]] = field(default_factory=dict)  # epoch -> (batches, samples)
    eof_sockets: dict[int, set[int]] = field(default_factory=dict)  # epoch -> sockets its eof came on
    final_sockets: set[int] = field(default_factory=set)
    taken: set[int] = field(default_factory=set)  # batch numbers the consumer took (the latest ones)
    taken_order: deque[int] = field(default_factory=deque)
    paused: bool = False  # stopped politely, to be resumed from its checkpoint: waited for, however long

    def take(self, seq: int) -> bool:
        """Remember batch ``seq`` as taken; False if it was already."""
        if seq in self.taken:
            return False
        self.taken.add(seq)
        self.taken_order.append(seq)
        if len(self.taken_order) > TAKEN_MEMORY:
            self.taken.discard(self.taken_order.popleft())
        return True

    def ended(self, epoch: int) -> bool:
        """Its eof for ``epoch`` came on every socket it was seen on (each socket is in order)."""
        return self.sockets <= self.eof_sockets.get(epoch, set())

    @property
    def final(self) -> bool:
        return bool(self.final_sockets) and self.sockets <= self.final_sockets


class Receiver:
    """Receive tarserve's batches from ZMQ endpoints (``zpull://:7880``, ``zsub://host:7880``, …).

    >>> # for batch in Receiver("zpull://:7880"):
    >>> #     images, labels = batch["image"], batch["cls"]   # numpy arrays over the message, no copy

    ``timeout``: seconds a known sender may stay silent (``None``: for ever); ``wait``: seconds
    to wait for the first message (``None``: for ever); ``senders``: end only after this many
    sender processes have finished (by default, all those of every group heard from).
    ``reuse_memory``: tune glibc's malloc so that message buffers are reused (``tune_malloc``):
    about twice the transfer rate for batches of tens of MB, but it changes the malloc settings of
    the **whole process** (one arena, no mmap, no trimming) for good, so it is off unless asked
    (``tarrecv`` asks: the process is the command's).
    ``ack``: ``"auto"`` acknowledges a batch when the consumer asks for the next one,
    ``"manual"`` when it calls ``ack(batch)``. ``max_message_size``: the largest frame accepted
    (bytes; ``None``: no limit); ZMQ drops a connection that sends a bigger one, and a tarproc
    sender told the limit refuses to send it. ``shared_memory``: on ``ipc://`` endpoints, take
    batches a sender on this host put in shared memory (no copy through the socket; see ``shm``).
    """

    def __init__(
        self,
        urls: str | list[str] | tuple[str, ...],
        *,
        hwm: int = DEFAULT_HWM,
        timeout: float | None = DEFAULT_TIMEOUT,
        wait: float | None = None,
        senders: int | None = None,
        curve: str | os.PathLike[str] | None = None,
        warn: Callable[[str], None] | None = None,
        context: Any = None,
        reuse_memory: bool = False,
        ack: str = "auto",
        max_message_size: int | None = DEFAULT_MAX_MESSAGE_SIZE,
        shared_memory: bool = True,
    ) -> None:
        if not 1 <= hwm <= MAX_C_INT:
            raise OptionError(f"bad high-water mark {hwm}; must be from 1 to {MAX_C_INT}")
        if ack not in ("auto", "manual"):
            raise OptionError(f"bad acknowledgement mode {ack!r}; use auto or manual")
        if max_message_size is not None and not 1 <= max_message_size <= MAX_INT64:
            raise OptionError(f"bad maximum message size {max_message_size}; must be from 1 to {MAX_INT64}")
        self.endpoints = parse_endpoints(list(urls) if not isinstance(urls, str) else urls, sending=False)
        if reuse_memory:
            tune_malloc()
        import zmq

        self.timeout = timeout
        self.wait = wait
        self.expected = senders
        self.stats = ReceiveStats()
        # the caller's callback, else a NetworkWarning: a message rejected, a sender gone, lost batches
        self.warn = warner(warn, NetworkWarning)
        self.hwm = hwm
        self.ack_mode = ack
        self.max_message_size = max_message_size
        self._pid = os.getpid()  # the sockets are this process's: a forked child must not touch them
        self.id = f"{socketlib.gethostname()}:{self._pid}"
        self._senders: dict[tuple[str, int], _Sender] = {}  # by (group, rank)
        # (socket, routing id) -> the sender id and group that said hello there
        self._connections: dict[tuple[int, bytes], tuple[str, str]] = {}
        self._greeted: list[bool] = []  # DEALER sockets: the greeting went out on this connection
        self._shm: list[bool] = []  # sockets that take batches in shared memory
        self._routers: list[bool] = []
        self._acks: dict[tuple[int, bytes], list[int]] = {}  # acknowledgements to send, by connection
        self._peers_by_fd: dict[int, str] = {}  # accepted connections' addresses, for messages
        self._finals: list[int] = []  # final ends of stream, per socket
        self._dropped: list[list[str]] = []  # per socket: peers whose connection closed (see _check_drops)
        self._preloaded: dict[tuple[str, int], list[int]] = {}  # see taken()
        self._instances: dict[tuple[str, int], str] = {}  # (group, rank) -> the sender id heard last
        self._ends: list[tuple[int, bytes, int]] = []  # final ends of stream to acknowledge (ack_end)
        self._groups: dict[str, int] = {}  # group -> number of senders in it
        self._group_seen: dict[str, float] = {}  # group -> when its first message came
        self._epochs_done: set[int] = set()
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._sockets: list[Any] = []
        self._monitors: list[Any] = []  # handshake results of each socket (libzmq >= 4.3)
        self._handshakes: list[Handshakes] = []
        self._handshake_warned: set[str] = set()
        self._next = 0
        self._started = time.monotonic()
        self._closed = False
        try:
            keys = None
            if curve is not None:
                from .curve import client_keys

                keys = client_keys(curve)
            for endpoint in self.endpoints:
                router = endpoint.kind == "pull" and endpoint.bind
                kind = (zmq.ROUTER if router else zmq.DEALER) if endpoint.kind == "pull" else zmq.SUB
                sock = open_socket(self._context, kind, self._sockets)  # closed on any error
                set_option(sock, zmq.RCVHWM, hwm, endpoint)
                set_option(sock, zmq.LINGER, 0, endpoint)
                if max_message_size is not None:
                    set_option(sock, zmq.MAXMSGSIZE, max_message_size, endpoint)
                if endpoint.kind == "sub":
                    set_option(sock, zmq.SUBSCRIBE, b"", endpoint)
                else:
                    set_option(sock, zmq.SNDHWM, 0, endpoint)  # acknowledgements are never dropped
                self._routers.append(router)
                # a peer over ipc is on this host: it may put batches in shared memory (see shm.py)
                self._shm.append(shared_memory and endpoint.address.startswith("ipc://") and shm_available())
                self._greeted.append(False)
                self._dropped.append([])
                self._finals.append(0)
                if keys is not None:
                    from .curve import make_client

                    make_client(sock, keys)
                # before bind/connect, so that no handshake or connection goes unseen
                events = handshake_events() | _CONNECTION_EVENTS
                self._monitors.append(sock.get_monitor_socket(events))
                self._handshakes.append(Handshakes("receiver", keys is not None, endpoint.url, endpoint.bind))
                attach(sock, endpoint)
        except BaseException:
            self._closed = True
            close_sockets(self._sockets + self._monitors)
            if self._own_context:
                destroy(self._context)
            raise
        self._poller = zmq.Poller()
        for sock in self._sockets + [m for m in self._monitors if m is not None]:
            self._poller.register(sock, zmq.POLLIN)

    # -- iteration ----------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        """The batches, until every sender has finished."""
        for event in self.events():
            if isinstance(event, Batch):
                yield event

    def events(self) -> Iterator[Batch | EpochEnd]:
        """Batches, and an ``EpochEnd`` after the last batch of each epoch (of all senders).

        Each sender's end is acknowledged when it is read, and at the end of the stream the
        receiver closes its sockets. With ``ack="manual"`` it does neither: the consumer calls
        ``ack_end()`` once it has made what it received safe, then ``close()``.
        """
        if os.getpid() != self._pid:  # not in the try below: closing in a forked child is for the parent to do
            raise TransportError(f"this Receiver was made in process {self._pid} and can't receive in process "
                                 f"{os.getpid()}, forked from it (ZMQ sockets don't survive a fork): receive in the "
                                 "process that made it, or make a Receiver in each process")
        try:
            pending: set[int] = set()  # epochs with an eof seen and no EpochEnd yet
            while not (self.finished and self._nothing_unseen()):
                message = self._receive()
                if message is None:
                    continue
                kind, header = message.kind, message.header
                if kind == "batch":
                    batch = to_batch(message)
                    if not self._first_copy(batch):
                        continue
                    now = time.monotonic()
                    stats = self.stats
                    if stats.first is None:
                        stats.first, stats.first_samples, stats.first_bytes = now, len(header["keys"]), message.nbytes
                    stats.last = now
                    stats.batches += 1
                    stats.samples += len(header["keys"])
                    stats.bytes += message.nbytes
                    if batch.redelivered:
                        stats.redelivered += 1
                    yield batch
                    if self.ack_mode == "auto":  # the consumer asked for more: it took this one
                        self.ack(batch)
                elif kind == "eof" and not header.get("aborted"):  # (a pause: the sender is waited for)
                    pending.add(header["epoch"])
                for epoch in sorted(pending):
                    if self._epoch_ended(epoch):
                        pending.discard(epoch)
                        yield self._epoch_end(epoch)
        except TransportError:  # the stream is broken: let the senders see us go
            self.close()
            raise
        if self.ack_mode == "auto":
            self.close()

    def ack_end(self) -> None:
        """Acknowledge the end of the stream: its senders may go. (With ``ack="auto"`` the
        receiver does this itself at the end of the stream; with ``"manual"``, the consumer does,
        once what it received is safe: a sender whose end is not acknowledged waits for a
        receiver, a restarted one say, to acknowledge it.)"""
        if self._acks:
            self._send_acks()
        for index, rid, epoch in self._ends:
            self._ack_end(index, rid, epoch)
        self._ends.clear()
    def torch(self) -> Iterator[dict[str, Any]]:
        """The batches with their arrays as torch tensors (sharing memory, no copy), the sender's
        epoch as ``__epoch__``, and ``__redelivered__`` (see ``Batch.redelivered``)."""
        import warnings

        import torch

        for batch in self:
            out: dict[str, Any] = {}
            for name, value in batch.items():
                if name != "__key__" and hasattr(value, "dtype") and hasattr(value, "shape"):
                    with warnings.catch_warnings():
                        # message buffers are writable; torch checks anyway
                        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
                        tensor = torch.from_numpy(value)
                    if batch.dtypes.get(name) == "bfloat16" and tensor.dtype == torch.int16:
                        tensor = tensor.view(torch.bfloat16)
                    out[name] = tensor
                else:
                    out[name] = value
            out["__epoch__"] = batch.epoch
            out["__redelivered__"] = batch.redelivered
            yield out

    def dataset(self) -> Any:
        """A ``torch.utils.data.IterableDataset`` of the batches, for
        ``DataLoader(receiver.dataset(), batch_size=None)`` with ``num_workers=0`` (the default).

        The batches come decoded and batched by tarserve, so the DataLoader has no work for worker
        processes; and the receiver's sockets live in this process. Read in a worker (or pickled
        to start one), the dataset raises ``DatasetError`` saying so, which the DataLoader
        re-raises here on the first batch, instead of waiting for batches that never come.
        """
        return _dataset_class()(self)

    def _torch_in_main_process(self) -> Iterator[dict[str, Any]]:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None:
            raise DatasetError(NO_WORKERS, worker=info.id, cause="TransportError")
        return self.torch()

    @property
    def finished(self) -> bool:
        """Every sender of every group heard from (and at least ``senders`` of them) has finished."""
        if not self._groups:
            return False
        done = sum(1 for s in self._senders.values() if s.final)
        total = sum(self._groups.values())
        return done >= total and (self.expected is None or done >= self.expected)

    # -- internals --------------------------------------------------------------------------------

    def ack(self, batch: Batch) -> None:
        """Acknowledge ``batch``: its sender may forget it, and send one more. (With
        ``ack="auto"`` the receiver does this itself when the consumer asks for the next batch.)
        It goes out the next time the receiver reads, or when it is closed."""
        if batch.connection is not None and batch.acked:
            self._acks.setdefault(batch.connection, []).append(batch.seq)

    def taken(self, group: str, rank: int, seqs: list[int]) -> None:
        """Say that batches ``seqs`` of sender ``rank`` of ``group`` were taken before (by an
        earlier run of this consumer, which kept them): if they come again, they are dropped."""
        self._preloaded.setdefault((group, rank), []).extend(seqs)

    def _send_acks(self) -> None:
        for (index, rid), seqs in self._acks.items():
            to = self._connections.get((index, rid))
            if to is not None:  # else its connection closed: the sender sends these again, dropped here
                self._reply(index, rid, ack_message(self.id, to=to, credit=len(seqs), seqs=seqs))
        self._acks.clear()

    def _greet(self, index: int, rid: bytes) -> bool:
        """Give a sender credit for ``hwm`` batches, and say the largest frame we take."""
        return self._reply(index, rid, ack_message(self.id, credit=self.hwm, max_frame=self.max_message_size,
                                                   shm=self._shm[index]))

    def _reply(self, index: int, rid: bytes, message: list[bytes]) -> bool:
        """Send ``message`` to the sender at (socket, routing id), without waiting; False if it
        can't be sent (a sender gone: what it would have said is said again to its successor)."""
        import zmq

        try:
            self._sockets[index].send_multipart([rid, *message] if self._routers[index] else message,
                                                flags=zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            return False

    def _first_copy(self, batch: Batch) -> bool:
        """Whether the consumer has not taken ``batch`` before (else it is dropped, and
        acknowledged again)."""
        if batch.acked and not self._senders[(batch.group, batch.rank)].take(batch.seq):
            self.stats.duplicates += 1
            self.ack(batch)
            return False
        return True

    def _receive(self) -> Any:
        """One decoded message, or None after a poll interval without one (silence is checked)."""
        if self._acks:
            self._send_acks()
        for index, router in enumerate(self._routers):
            if not router and not self._greeted[index] and self.endpoints[index].kind == "pull":
                self._greeted[index] = self._greet(index, b"")
        ready = dict(self._poller.poll(timeout=250))
        if any(m in ready for m in self._monitors if m is not None):
            self._check_handshakes()
        if not any(sock in ready for sock in self._sockets):
            # only when nothing is queued: a consumer slower than its senders finds their messages
            # waiting, and they, not the wall clock, say who is alive
            self._check_silence()
            self._check_drops()
            return None
        count = len(self._sockets)
        for turn in range(count):
            index = (self._next + turn) % count  # in turn: no socket waits behind another
            sock = self._sockets[index]
            if sock not in ready:
                continue
            self._next = index + 1
            frames = _recv_bounded(sock)
            if frames is None:
                self.stats.rejected += 1
                self.warn(f"rejected a message on {self.endpoints[index].url}: more than {MAX_FRAMES} frames")
                continue
            rid = b""
            if self._routers[index]:
                rid, frames = frames[0].bytes, frames[1:]
            url = self.endpoints[index].url
            try:
                message = decode(frames, url, shm=self._shm[index])
                message.connection = (index, rid)
                if not self._announced(message, index, rid):
                    continue
                self._track(message.kind, message.header, index, url, rid)
            except WireError as e:
                self.stats.rejected += 1
                if isinstance(e, MessageError):
                    origin = f" {e.origin}" if e.origin else ""
                    self.warn(f"rejected a message{origin} on {url}: {e.reason}")
                else:
                    self.warn(f"rejected a message: {e}")
                continue
            return message
        return None

    def _announced(self, message: Any, index: int, rid: bytes) -> bool:
        """Whether a message comes on a connection whose sender said hello (PUSH-style sockets).

        A hello is answered with credit. A batch on a connection that said no hello was sent
        before its sender knew its old receiver here had gone: it is dropped unacknowledged,
        and comes again, after a hello.
        """
        header = message.header
        key = (header["group"], header["rank"])
        if key not in self._senders and key not in self._instances and len(self._senders) >= MAX_SENDERS:
            raise WireError(f"a message from sender {header['sender']}, after {MAX_SENDERS} others: this receiver "
                            "keeps track of no more")
        if self.endpoints[index].kind != "pull":
            return True
        if message.kind == "hello":
            self._connections[(index, rid)] = (header["sender"], header["group"])
            self._instances[key] = header["sender"]
            if self._routers[index]:
                self._greet(index, rid)
            return True
        if self._instances.get(key, header["sender"]) != header["sender"]:
            # from a sender process that was restarted (from a checkpoint) since: the new one sends
            # again whatever this one had not had acknowledged, in order
            return False
        return (index, rid) in self._connections or message.kind == "heartbeat"

    def _track(self, kind: str, header: dict[str, Any], index: int, url: str, rid: bytes = b"") -> None:
        sender_id, group = header["sender"], header["group"]
        key = (group, header["rank"])
        state = self._senders.get(key)
        now = time.monotonic()
        if state is None:
            state = self._senders[key] = _Sender(sender_id, group, header["rank"], now)
            for taken in self._preloaded.pop(key, ()):
                state.take(taken)
            self._groups[group] = max(header["senders"], self._groups.get(group, 0))
            self._group_seen.setdefault(group, now)
            self.stats.senders = len(self._senders)
        if state.paused and sender_id != state.id:
            state.paused = False
            self.warn(f"sender {sender_id} resumed the stream of {state.id}")
        state.id = sender_id  # a restarted sender has a new process id
        state.last_heard = now
        state.sockets.add(index)
        dest, seq = header.get("dest"), header.get("seq")
        # numbers have gaps only on a PUB socket: PUSH-style batches are numbered per sender, and
        # spread over receivers (what one that died held is sent again, acknowledged)
        if kind in ("batch", "eof") and dest is not None and seq is not None and self.endpoints[index].kind == "sub":
            expected = state.next_seq.get(dest)
            if expected is not None and seq > expected:
                self.stats.lost += seq - expected
                self.warn(f"lost {seq - expected} batches from sender {sender_id} "
                          f"(numbers {expected} to {seq - 1}): dropped by PUB for a subscriber that could not keep up")
            state.next_seq[dest] = seq + 1 if kind == "batch" else max(seq, expected or 0)
        if kind == "eof":
            if header.get("aborted"):
                reason = header.get("reason") or "interrupted"
                # acknowledged: the sender keeps its connection open until then, since libzmq drops
                # what a connection closed by its peer still held unread (a consumer that fell behind)
                to = self._connections.get((index, rid))
                if to is not None:
                    self._reply(index, rid, ack_message(self.id, to=to, stop=True))
                if reason == "paused" and self.endpoints[index].kind == "pull":
                    self._pause(state, index)
                    return
                raise TransportError(_stopped(sender_id, reason), url)
            epoch = header["epoch"]
            state.eofs[epoch] = (header["batches"], header["samples"])
            state.eof_sockets.setdefault(epoch, set()).add(index)
            if header["final"]:
                if index not in state.final_sockets:
                    self._finals[index] += 1  # its connection may close now (see _check_drops)
                state.final_sockets.add(index)
                if self.endpoints[index].kind == "pull":  # the sender may go once we have heard it end
                    self._ends.append((index, rid, epoch))
                    if self.ack_mode == "auto":
                        self.ack_end()

    def _pause(self, state: _Sender, index: int) -> None:
        """A sender paused (tarserve stopped politely, with a checkpoint): its connection may close
        now, and it is waited for, without a timeout, until the same stream resumes."""
        self._finals[index] += 1  # its hang-up is a goodbye (see _check_drops)
        if not state.paused:
            state.paused = True
            self.warn(f"sender {state.id} paused: tarserve was stopped and saved its checkpoint; waiting for "
                      "the stream to resume (run the same tarserve command again)")

    def _ack_end(self, index: int, rid: bytes, epoch: int) -> None:
        to = self._connections.get((index, rid))
        if to is not None:
            self._reply(index, rid, ack_message(self.id, to=to, eof=epoch, final=True))

    def _check_drops(self) -> None:
        """Warn of connections closed by senders that had not ended their stream: they died, or
        ZMQ dropped them for a frame over ``max_message_size``. Each closed connection is set
        against a sender that ended its stream on that socket; what is left over is said, once
        nothing waits on the socket (a sender's last messages, its end, are read first)."""
        for index, dropped in enumerate(self._dropped):
            while dropped and self._finals[index] > 0:  # a sender that ended and went: a goodbye
                dropped.pop(0)
                self._finals[index] -= 1
            if dropped and not self._sockets[index].poll(0):
                limit = (f", or sent a frame over --max-message-size ({self.max_message_size} bytes)"
                         if self.max_message_size is not None else "")
                self.warn(f"{', '.join(dropped)} on {self.endpoints[index].url} hung up before the end of its "
                          f"stream: it died or was stopped{limit}; receiving goes on")
                dropped.clear()

    def _nothing_unseen(self) -> bool:
        """No message waits on a socket some sender was never seen on (it may hold that sender's
        batches: an end must not overtake them)."""
        seen = set.intersection(*(s.sockets for s in self._senders.values())) if self._senders else set()
        return not any(sock.poll(timeout=10) for i, sock in enumerate(self._sockets) if i not in seen)

    def _epoch_ended(self, epoch: int) -> bool:
        if epoch in self._epochs_done:
            return False
        for group, size in self._groups.items():
            members = [s for s in self._senders.values() if s.group == group and (s.ended(epoch) or s.final)]
            if len(members) < size:
                return False
        return self._nothing_unseen()

    def _epoch_end(self, epoch: int) -> EpochEnd:
        self._epochs_done.add(epoch)
        self.stats.epochs += 1
        counts = [s.eofs[epoch] for s in self._senders.values() if epoch in s.eofs]
        return EpochEnd(epoch, sum(c[0] for c in counts), sum(c[1] for c in counts))

    def _check_handshakes(self) -> None:
        """A failed handshake over keys is an error on a socket no peer has got through on yet
        (the keys don't match: waiting would be for ever); later, only a warning (a stray or
        misconfigured client must not stop a stream that works)."""
        for index, monitor in enumerate(self._monitors):
            while monitor is not None and monitor.poll(0):
                event, value = monitor_event(monitor)
                handshakes = self._handshakes[index]
                if event & _CONNECTION_EVENTS:
                    self._connection_event(index, event, value)
                    continue
                reason = handshakes.failure(event, value)
                if reason is None:
                    if handshakes.doubt and not handshakes.succeeded and handshakes.doubt not in self._handshake_warned:
                        self._handshake_warned.add(handshakes.doubt)  # said once: port scans repeat
                        self.warn(handshakes.doubt)
                    continue
                if not handshakes.succeeded:
                    raise TransportError(reason)
                if reason not in self._handshake_warned:
                    self._handshake_warned.add(reason)
                    self.warn(reason)

    def _connection_event(self, index: int, event: int, fd: int) -> None:
        if event == _ACCEPTED:
            self._peers_by_fd[fd] = _peer_of(fd)
            return
        if event != _DISCONNECTED:
            return
        peer = self._peers_by_fd.pop(fd, None)
        handshakes = self._handshakes[index]
        if not handshakes.succeeded:
            doubt = (f"{peer or 'a peer'} on {handshakes.url} hung up during the handshake: a tarproc that speaks "
                     "wire format v1 (PUSH/PULL sockets; run the same version on both sides), one with other "
                     "CURVE keys, or not a ZMQ peer")
            if handshakes.doubt is None:
                handshakes.doubt = doubt
                self.warn(doubt)
            return
        if not self._routers[index] and self.endpoints[index].kind == "pull":
            self._greeted[index] = False  # greet whoever the DEALER connects to next
            self._connections.pop((index, b""), None)
        self._dropped[index].append(peer or "a peer")

    def _check_silence(self) -> None:
        now = time.monotonic()
        if not self._senders:
            if self.wait is not None and now - self._started > self.wait:
                where = ", ".join(e.url for e in self.endpoints)
                raise TransportError(f"no sender for {self.wait:g} s on {where}")
            return
        if self.timeout is None:
            return
        for state in self._senders.values():
            if not state.final and not state.paused and now - state.last_heard > self.timeout:
                raise TransportError(f"sender {state.id} silent for {now - state.last_heard:.0f} s "
                                     "(no batch, no heartbeat): it died or its network is down")
        for group, size in self._groups.items():
            heard = [s for s in self._senders.values() if s.group == group]
            if len(heard) < size and now - self._group_seen[group] > self.timeout:
                raise TransportError(f"{size - len(heard)} of the {size} senders of group {group} never "
                                     f"sent anything for {self.timeout:g} s")

    def close(self) -> None:
        """Close the sockets (batches already returned stay valid: they hold their own frames)."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:  # a forked child's copy (a DataLoader worker's): the sockets are the parent's
            return
        if self._acks and self._sockets:  # what the consumer took is acknowledged on the way out
            self._send_acks()
        for index, sock in enumerate(self._sockets):
            # acknowledgements (the end of the stream's too) get a moment to reach their senders
            sock.close(CLOSE_LINGER_MS if self.endpoints[index].kind == "pull" else 0)
        for monitor in self._monitors:
            if monitor is not None:
                monitor.close(0)
        if self._own_context:
            self._context.term()

    def __enter__(self) -> Receiver:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_DATASET_CLASS: list[type] = []


def _dataset_class() -> type:
    """``ReceiverDataset``, made once, on first use: torch is imported only then."""
    if not _DATASET_CLASS:
        from torch.utils.data import IterableDataset

        class ReceiverDataset(IterableDataset):  # type: ignore[misc,type-arg]
            """The batches of a ``Receiver``, as torch tensors (see ``Receiver.dataset``)."""

            def __init__(self, receiver: Receiver) -> None:
                self.receiver = receiver

            def __iter__(self) -> Iterator[dict[str, Any]]:
                return self.receiver._torch_in_main_process()

            def __reduce__(self) -> Any:
                # pickled for a worker process started by spawn or forkserver
                raise DatasetError(NO_WORKERS, cause="TransportError")

        _DATASET_CLASS.append(ReceiverDataset)
    return _DATASET_CLASS[0]


def _stopped(sender: str, reason: str) -> str:
    """What a receiver says of a sender that stopped before the end of its stream."""
    if reason == "interrupted":
        return (f"sender {sender} stopped before the end of its stream (interrupted): Ctrl-C or a signal, and "
                "with no --checkpoint to resume from; what was received is not the whole stream")
    if reason == "failed":
        return f"sender {sender} stopped before the end of its stream (failed): see the sender's error"
    return f"sender {sender} stopped before the end of its stream ({reason})"


def _peer_of(fd: int) -> str:
    """The address of the peer of an accepted connection (``127.0.0.1:52614``), by its descriptor."""
    try:
        sock = socketlib.socket(fileno=os.dup(fd))
    except OSError:
        return "a peer"
    try:
        address = sock.getpeername()
        return f"{address[0]}:{address[1]}" if isinstance(address, tuple) else "a local process"
    except OSError:
        return "a peer"
    finally:
        sock.close()
