"""The sending side: batches out over ZMQ with bounded memory, sequence numbers and heartbeats.

PUSH-style endpoints (``zpush``, ``zrpush``, ``tcp://``, ``ipc://``) deliver with
acknowledgements (``delivery.Delivery``): receivers grant credit and say which batches their
consumers took, and the batches a receiver held when it died go to another receiver, or to
its replacement. ``ack=False`` sends without waiting for credit (fire and forget: what a
receiver that dies holds is lost, and reported as lost by nobody).

PUB endpoints never wait: a subscriber that can't keep up loses batches, and its receiver
reports the gaps in the sequence numbers of its socket. One socket per endpoint, so every
subscriber gets its own end-of-epoch messages and its own sequence numbers.

A background thread owns the sockets: it sends what ``send`` queues (at most ``queue`` batches
wait) and, whenever it has had nothing to send for ``heartbeat`` seconds, tells every receiver
that this sender is alive, however long reading or decoding the next batch takes.

Closing a sender ends its stream: if the last ``end_epoch`` was not ``final``, ``close`` sends
the final end-of-epoch message, so receivers finish at once. Closing with ``abort=True`` (what
leaving a ``with`` block by an exception does) tells every receiver instead that this sender
stopped early: a receiver raises ``TransportError`` ("stopped before the end of its stream"),
since what it got is not the whole stream.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket as socketlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import OptionError, TransportError
from ..handoff import Handoff
from .curve import Handshakes, handshake_events
from .delivery import EMPTY, Delivery, Item, Progress
from .sockets import (
    MAX_C_INT,
    attach,
    check_milliseconds,
    close_sockets,
    destroy,
    monitor_event,
    open_socket,
    set_option,
)
from .urls import Endpoint, parse_endpoints
from .wire import control, encode_batch

DEFAULT_HWM = 4
DEFAULT_HEARTBEAT = 1.0
DEFAULT_SEND_TIMEOUT = 120.0
PUB_EOF_REPEATS = 5
_EVENTS, _POLLOUT = 15, 2  # zmq.EVENTS, zmq.POLLOUT (without importing zmq at module level)
ABORT_WAIT = 2.0  # seconds an interrupted sender waits for its receivers to read that it stopped
# a pause is worth more patience: a receiver that does not hear of it takes the sender for dead
# (the wait ends as soon as every receiver has been told)
PAUSE_WAIT = 10.0


def check_sending(hwm: int, heartbeat: float, send_timeout: float | None) -> None:
    """Usage errors in a sender's options: what ZMQ would refuse (or take wrong) once a socket is made."""
    if not 1 <= hwm <= MAX_C_INT - 16:  # control messages get 16 more places
        raise OptionError(f"bad high-water mark {hwm}; must be from 1 to {MAX_C_INT - 16}")
    if not heartbeat > 0:
        raise OptionError(f"bad heartbeat interval {heartbeat}; must be > 0")
    check_milliseconds(heartbeat, "heartbeat interval", factor=10)  # its timeout is ten intervals
    if send_timeout is not None:
        if not send_timeout >= 0:
            raise OptionError(f"bad send timeout {send_timeout}; must be >= 0 (None: wait for ever)")
        check_milliseconds(send_timeout, "send timeout")  # closing lingers that long


@dataclass
class SendStats:
    """What a sender sent: batches, samples and tensor bytes, over all epochs."""

    batches: int = 0
    samples: int = 0
    bytes: int = 0
    epochs: int = 0
    redelivered: int = 0  # batches sent again because the receiver that had them went away


class Sender:
    """Send batches to ZMQ endpoints (``zpush://host:port``, ``zpub://:port``, …).

    >>> # with Sender("zpush://trainer:7880") as s:
    >>> #     s.send(keys, {"image": array, "cls": labels}, epoch=0)
    >>> #     s.end_epoch(0)     # optional for the last epoch: leaving the block ends the stream

    An exception that leaves the ``with`` block aborts the stream (see ``close``).

    ``rank``/``senders`` say which of several cooperating sender processes this is (receivers
    wait for all of them); ``group`` names the run they belong to. ``send_timeout`` (seconds,
    ``None`` = wait for ever) bounds the wait for a receiver to take a batch.

    PUSH-style endpoints wait for receivers' acknowledgements (``ack=False``: they don't).
    Batches are numbered from ``start_seq``; numbers in ``skip`` (with their positions) are
    counted but not sent (they were acknowledged before a restart), and those below
    ``resend_below`` go out marked as sent again (they may have been); ``progress`` is called with a
    ``delivery.Progress`` as acknowledgements come in (from the socket thread), and once more when
    the sender stops. ``resumable`` (a checkpoint keeps the progress, and the same stream can be
    started again from it): an interrupt (Ctrl-C, SIGTERM) that leaves the ``with`` block pauses
    the stream instead of aborting it: receivers are told to wait for it to resume. ``hold``
    (an object with ``ended()``, true once every sender of the group has delivered all): a
    sender whose stream is delivered stays until then, telling receivers that connect (a
    restarted one) that it has ended, so they don't wait for it.
    """

    def __init__(
        self,
        urls: str | list[str] | tuple[str, ...],
        *,
        hwm: int = DEFAULT_HWM,
        send_timeout: float | None = DEFAULT_SEND_TIMEOUT,
        heartbeat: float = DEFAULT_HEARTBEAT,
        curve: str | os.PathLike[str] | None = None,
        rank: int = 0,
        senders: int = 1,
        group: str | None = None,
        queue_size: int = 2,
        context: Any = None,
        ack: bool = True,
        start_seq: int = 0,
        skip: dict[int, dict[str, Any] | None] | None = None,
        resend_below: int = 0,
        progress: Callable[[Progress], None] | None = None,
        hold: Any = None,
        resumable: bool = False,
    ) -> None:
        import zmq

        check_sending(hwm, heartbeat, send_timeout)
        self.endpoints = parse_endpoints(list(urls) if not isinstance(urls, str) else urls, sending=True)
        self.send_timeout = send_timeout
        self.heartbeat = heartbeat
        self.resumable = resumable
        self.id = f"{socketlib.gethostname()}:{os.getpid()}:{rank}"
        self.common: dict[str, Any] = {
            "sender": self.id, "group": group or uuid.uuid4().hex, "rank": rank, "senders": senders,
        }
        self.stats = SendStats()
        self._epoch_counts = [0, 0]  # batches, samples in the current epoch
        self._epoch = 0  # of the last batch sent
        self._epoch_open = False  # batches sent since the last end_epoch
        self._last_eof: dict[str, Any] | None = None
        self._ended = False  # a final end_epoch went out
        self._own_context = context is None
        self._context = context or zmq.Context()
        self._auth = None
        self._sockets: list[Any] = []
        self._monitors: list[Any] = []  # PUB: handshakes are watched (see _check_handshakes)
        self._handshakes: list[Handshakes] = []
        self._seq: list[int] = []
        self._greeted: list[bool] = []
        self._next = 0
        self._queue: Handoff[Any] = Handoff(queue_size)  # see handoff: a Ctrl-C leaves no lock held
        self._error: BaseException | None = None
        self._closed = False
        self._abort = threading.Event()
        self._abort_reason = "interrupted"
        self._next_seq = start_seq  # the number of the next batch (acknowledged delivery)
        self._skip = dict(skip or {})
        self._resend_below = resend_below
        self._delivery: Delivery | None = None
        try:
            keys = None
            if curve is not None:
                from .curve import Authenticator, server_keys

                keys = server_keys(curve)
                self._auth = Authenticator(self._context, keys[2])
            if self.endpoints[0].kind == "push":
                self._delivery = Delivery(self._context, self.endpoints, hwm=hwm, heartbeat=heartbeat,
                                          send_timeout=send_timeout, common=self.common, keys=keys, acked=ack,
                                          start_seq=start_seq, done=self._skip, progress=progress, hold=hold,
                                          sent=lambda item, frames: self._count(item.keys, frames, item.redelivered,
                                                                                item.shared_bytes))
            else:
                for endpoint in self.endpoints:
                    self._open(endpoint, hwm, heartbeat, keys)
                    self._seq.append(0)
                    self._greeted.append(False)
        except BaseException:
            self._shutdown(linger=0, failed=True)
            raise
        self._poller = zmq.Poller()
        for sock in self._sockets:
            self._poller.register(sock, zmq.POLLOUT)
        self._thread = threading.Thread(target=self._run, name="tarproc-sender", daemon=True)
        self._thread.start()

    def _open(self, endpoint: Endpoint, hwm: int, heartbeat: float, keys: Any) -> None:
        """A PUB socket, in ``_sockets`` (PUSH-style endpoints are ``Delivery``'s)."""
        import zmq

        sock = open_socket(self._context, zmq.PUB, self._sockets)  # closed on any error
        set_option(sock, zmq.SNDHWM, hwm, endpoint)
        # ZMTP heartbeats: a subscriber that vanished without closing (host down) is disconnected
        set_option(sock, zmq.HEARTBEAT_IVL, max(1, int(heartbeat * 1000)), endpoint)
        set_option(sock, zmq.HEARTBEAT_TIMEOUT, max(1, int(heartbeat * 10_000)), endpoint)
        if not endpoint.bind:
            set_option(sock, zmq.IMMEDIATE, 1, endpoint)  # queue nothing for a receiver that isn't there
        if keys is not None:
            from .curve import make_server

            make_server(sock, keys)
        events = handshake_events()  # before bind/connect, so that no handshake goes unseen
        self._monitors.append(sock.get_monitor_socket(events) if events else None)
        self._handshakes.append(Handshakes("sender", keys is not None, endpoint.url, endpoint.bind))
        attach(sock, endpoint)
        return sock

    # -- the caller's side ------------------------------------------------------------------------

    def send(self, keys: list[str], tensors: dict[str, Any], *, epoch: int, text: Iterable[str] = (),
             bfloat16: Iterable[str] = (), pos: dict[str, Any] | None = None,
             shared: dict[str, Any] | None = None) -> None:
        """Queue one batch (see ``wire.encode_batch`` for what ``tensors`` may hold); ``pos``
        says where the stream is after it (``epoch``, ``batch`` and ``sample`` of the epoch, the
        ``shard`` and ``index`` of its last sample) for receivers and checkpoints. ``shared``
        maps tensors to the ``shm.SharedBlock`` whose array they are: a receiver on this host
        maps it instead of receiving its bytes (the sender releases the blocks)."""
        shared = dict(shared or {})
        if self._delivery is not None:
            seq = self._next_seq
            self._next_seq += 1
            item = Item(seq, keys, tensors, epoch, tuple(text), tuple(bfloat16), pos,
                        redelivered=seq < self._resend_below, shared=shared)
            if seq in self._skip:
                item.release()
            else:
                self._put(("batch", item))
        else:
            for block in shared.values():  # PUB: bytes on the wire (the mapping stays ours)
                block.release()
            self._put(("batch", keys, tensors, epoch, tuple(text), tuple(bfloat16)))
        self._epoch_counts[0] += 1
        self._epoch_counts[1] += len(keys)
        self._epoch, self._epoch_open = epoch, True

    def start_epoch(self, batches: int = 0, samples: int = 0) -> None:
        """Start counting an epoch's batches and samples at these (a resumed epoch's, acknowledged
        before a restart)."""
        self._epoch_counts = [batches, samples]

    def end_epoch(self, epoch: int, *, final: bool = False) -> None:
        """Tell every receiver this sender has sent all of ``epoch`` (``final``: and everything)."""
        batches, samples = self._epoch_counts
        eof = {"epoch": epoch, "final": final, "batches": batches, "samples": samples}
        self._put(("eof", eof))
        self._epoch_counts = [0, 0]
        self._epoch_open, self._last_eof, self._ended = False, eof, final
        self.stats.epochs += 1

    def close(self, *, abort: bool = False, reason: str = "interrupted") -> None:
        """End the stream and wait until everything queued has gone out, and the receivers have
        read it; or, with ``abort``, tell the receivers this sender stopped early (``reason``:
        ``interrupted`` or ``failed``: they stop with an error; ``paused``: a stream that will be
        resumed from a checkpoint, which they wait for) and drop what is queued.

        Without a final ``end_epoch``, ending the stream sends one: for the epoch of the last batch
        if it was not ended, else the last end of epoch again, now final.
        """
        if self._closed:
            return
        try:
            if not abort and self._error is None and not self._ended:
                self._end_stream()
        except BaseException:
            if self._error is None:  # interrupted while the queue was full
                self.close(abort=True)
                raise
            # else the socket thread failed: raised below, after the shutdown
        self._closed = True
        self._abort_reason = reason
        try:
            if not abort and self._error is None:
                self._put(None)
                self._thread.join()
            else:
                self._abort.set()
                # the socket thread's say_aborted, and after an error in it a second one (ABORT_WAIT / 2)
                self._thread.join(timeout=2 * self.heartbeat + 1 + self._say_wait() + ABORT_WAIT / 2)
        finally:
            # closing waits (up to the send timeout) until the queued messages are delivered
            clean = not abort and self._error is None
            # an aborting sender gets a moment to deliver its "interrupted" or "paused" message
            self._shutdown(linger=(-1 if self.send_timeout is None else int(self.send_timeout * 1000)) if clean
                           else int(1000 * self._say_wait()))
        if not abort and self._error is not None:
            raise self._error

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        # an error is not an end: receivers must not take a partial stream for a whole one
        failed = exc_type is not None and issubclass(exc_type, Exception)
        # a resumable stream stopped politely (Ctrl-C, SIGTERM) is paused: its receivers wait
        stopped = "paused" if self.resumable and self._delivery is not None else "interrupted"
        self.close(abort=exc_type is not None, reason="failed" if failed else stopped)

    def _say_wait(self) -> float:
        """How long the socket thread may take to tell receivers the stream stopped."""
        return PAUSE_WAIT if self._abort_reason == "paused" else ABORT_WAIT / 2

    def _end_stream(self) -> None:
        if self._epoch_open or self._last_eof is None:
            self.end_epoch(self._epoch, final=True)
        else:  # the last epoch ended, not finally: say it again, final (receivers count it once)
            self._put(("eof", {**self._last_eof, "final": True}))
            self._ended = True

    def _put(self, item: Any) -> None:
        if self._closed and item is not None:
            raise TransportError("sender is closed")
        while True:
            if self._error is not None:
                raise self._error
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _check_handshakes(self) -> None:
        """Stop on a handshake that failed over keys before any subscriber got through on that
        socket (later ones: a stray client, ignored)."""
        import zmq
        for index, monitor in enumerate(self._monitors):
            while monitor is not None and monitor.poll(0):
                event, value = monitor_event(monitor, zmq.NOBLOCK)
                handshakes = self._handshakes[index]
                reason = handshakes.failure(event, value)
                if reason is not None and not handshakes.succeeded:
                    raise TransportError(reason)

    def _shutdown(self, linger: int, failed: bool = False) -> None:
        """Close the sockets (``failed``: a set-up error, linger 0, and an own context destroyed,
        so that nothing it made can keep term waiting)."""
        if self._delivery is not None:
            # acknowledged: what matters has arrived (the end of the stream too), and what is left
            # queued (heartbeats, for a receiver that went) would hold the context for the linger
            # (a stop's message waits behind the batches a slow receiver has not read yet: it gets
            # a moment to go out, a pause more, since a receiver that misses it takes us for dead)
            self._delivery.shutdown(int(1000 * self._say_wait()) if self._abort.is_set() else 0)
        close_sockets(self._sockets, linger)
        close_sockets(self._monitors)
        while True:  # batches queued and never taken: their shared-memory files go too
            try:
                queued = self._queue.get_nowait()
            except queue.Empty:
                break
            if isinstance(queued, tuple) and queued[0] == "batch" and isinstance(queued[1], Item):
                queued[1].release()
        if self._auth is not None:
            self._auth.stop()
        if self._own_context:
            if failed:
                destroy(self._context)
            else:
                self._context.term()

    # -- the socket thread ------------------------------------------------------------------------

    def _count(self, keys: list[str], frames: list[Any], redelivered: bool = False, shared: int = 0) -> None:
        """A batch went out (a second time: ``redelivered``, counted apart); ``shared``: bytes of
        its tensors that went in shared memory, not in frames."""
        if redelivered:
            self.stats.redelivered += 1
            return
        self.stats.batches += 1
        self.stats.samples += len(keys)
        self.stats.bytes += sum(len(memoryview(f)) for f in frames[1:]) + shared

    def _take(self, timeout: float) -> Any:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return EMPTY

    def _run(self) -> None:
        if self._delivery is not None:
            try:
                delivery = self._delivery
                delivery.run(self._take, self._abort.is_set,
                             lambda: delivery.say_aborted(self._abort_reason, self._say_wait()))
            except BaseException as e:  # reported to the caller by the next send/close
                self._error = e
                with contextlib.suppress(Exception):  # receivers must not wait for a stream that stopped
                    self._delivery.say_aborted("failed", ABORT_WAIT / 2)
            return
        try:
            while True:
                if self._abort.is_set():
                    self._say_aborted()
                    return
                try:
                    item = self._queue.get(timeout=self.heartbeat)
                except queue.Empty:
                    self._send_all(control("heartbeat", **self.common), block=False)
                    self._check_handshakes()
                    continue
                if item is None:
                    return
                if item[0] == "batch":
                    self._send_batch(*item[1:])
                else:
                    self._send_eof(item[1])
        except BaseException as e:  # reported to the caller by the next send/close
            self._error = e

    def _wait_writable(self, what: str) -> int | None:
        """The next socket (in turn) that can take a message now, waiting up to the send timeout."""
        self._check_handshakes()
        if len(self._sockets) == 1 and self._sockets[0].get(_EVENTS) & _POLLOUT:
            return 0  # the common case, without a poll
        started = time.monotonic()
        last_beat = started
        while True:
            ready = dict(self._poller.poll(timeout=int(min(self.heartbeat, 0.25) * 1000)))
            if ready:
                for i in range(len(self._sockets)):
                    index = (self._next + i) % len(self._sockets)
                    if self._sockets[index] in ready:
                        self._next = index + 1
                        return index
            if self._abort.is_set():
                return None
            self._check_handshakes()  # a failed handshake is said within a poll, not after the send timeout
            now = time.monotonic()
            if now - last_beat >= self.heartbeat:  # the receivers we can't reach are full, or gone
                self._send_all(control("heartbeat", **self.common), block=False)
                last_beat = now
            if self.send_timeout is not None and now - started > self.send_timeout:
                where = ", ".join(e.url for e in self.endpoints)
                raise TransportError(f"no receiver took {what} for {self.send_timeout:g} s on {where}{self._doubts()}")

    def _doubts(self) -> str:
        """What the handshakes saw that might explain a timeout: ``; PEER hung up during ...``."""
        self._check_handshakes()
        return "".join(f"; {h.doubt}" for h in self._handshakes if h.doubt and not h.succeeded)

    def _greet(self, index: int) -> None:
        import zmq

        if not self._greeted[index]:
            hello = control("hello", **self.common, host=socketlib.gethostname(), pid=os.getpid(),
                            pattern=self.endpoints[index].kind, dest=index)
            self._sockets[index].send_multipart(hello, flags=zmq.NOBLOCK)
            self._greeted[index] = True

    def _send_batch(self, keys: list[str], tensors: dict[str, Any], epoch: int, text: tuple[str, ...],
                    bfloat16: tuple[str, ...]) -> None:
        import zmq

        while True:
            index = self._wait_writable("a batch")
            if index is None:
                return
            frames = encode_batch(keys, tensors, text=text, bfloat16=bfloat16, **self.common, epoch=epoch,
                                  seq=self._seq[index], dest=index)
            try:
                self._greet(index)
                self._sockets[index].send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:  # the peer went away between poll and send: try the next one
                continue
            self._seq[index] += 1
            self._count(keys, frames)
            return

    def _send_eof(self, counts: dict[str, Any]) -> None:
        # PUB drops what a subscriber's full queue can't take, end-of-epoch included: say it a few
        # times, a tenth of a second apart (receivers count an epoch's end once)
        repeats = PUB_EOF_REPEATS if self.endpoints[0].kind == "pub" else 1
        for repeat in range(repeats):
            if repeat:
                time.sleep(0.1)
            for index in range(len(self._sockets)):
                message = control("eof", **self.common, **counts, seq=self._seq[index], dest=index)
                self._send_to(index, message, "the end of the epoch")

    def _send_to(self, index: int, message: list[bytes], what: str) -> None:
        import zmq

        sock = self._sockets[index]
        started = time.monotonic()
        while True:
            try:
                self._greet(index)
                sock.send_multipart(message, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                pass
            if self._abort.is_set():
                return
            if self.send_timeout is not None and time.monotonic() - started > self.send_timeout:
                raise TransportError(f"no receiver took {what} for {self.send_timeout:g} s{self._doubts()}",
                                     self.endpoints[index].url)
            sock.poll(timeout=int(min(self.heartbeat, 0.25) * 1000), flags=zmq.POLLOUT)

    def _say_aborted(self) -> None:
        """Tell every receiver this sender stopped early, waiting a moment for room in full queues."""
        import zmq

        message = control("eof", **self.common, aborted=True, final=True, reason=self._abort_reason)
        deadline = time.monotonic() + ABORT_WAIT / 2
        for sock in self._sockets:
            while True:
                try:
                    sock.send_multipart(message, flags=zmq.NOBLOCK)
                    break
                except zmq.Again:
                    if time.monotonic() > deadline:
                        break
                    sock.poll(timeout=50, flags=zmq.POLLOUT)

    def _send_all(self, message: list[bytes], *, block: bool) -> None:
        import zmq

        for index, sock in enumerate(self._sockets):
            if block:
                self._send_to(index, message, "a message")
                continue
            try:
                sock.send_multipart(message, flags=zmq.NOBLOCK)
            except zmq.Again:  # full: that receiver has batches to work on and knows we're alive
                pass
