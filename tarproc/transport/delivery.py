"""Acknowledged delivery: the sender's side of the credit protocol (PUSH-style endpoints).

Each receiver grants credit (how many batches it may be sent) and acknowledges, by batch
number, what its consumer has taken. A batch goes only to a receiver that has credit for it,
and the sender keeps every batch it sent until it is acknowledged. When a receiver goes away
(its connection closes: the process died, was stopped, or ZMTP heartbeats found the host
gone), the batches it held and had not acknowledged go, marked ``redelivered``, to the next
receiver with credit: another one, or the same one restarted. So nothing is lost as long as a
receiver is there or comes back within the send timeout, and a batch is sent twice only when
its first receiver died before acknowledging it.

An epoch's end goes out once every batch of the epoch is acknowledged, so no redelivered batch
can follow it; a sender finishes when every receiver it knows has acknowledged the end of the
stream.

Sockets: a sender that connects (``zpush``) uses a DEALER per endpoint (one receiver each, which
binds a ROUTER); a sender that binds (``zrpush``) uses a ROUTER, to which any number of receivers
connect with a DEALER. A DEALER says ``hello`` first (a ROUTER can't address a peer it has not
heard from); receivers that connect greet first with an ``ack`` carrying their credit.
"""

from __future__ import annotations

import contextlib
import os
import socket as socketlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import TransportError, WireError
from .curve import Handshakes, handshake_events
from .sockets import attach, close_sockets, monitor_event, open_socket, set_option
from .urls import Endpoint
from .wire import control, decode_ack, encode_batch, may_map_from

_CONNECTION_EVENTS = 0x0001 | 0x0020 | 0x0200  # EVENT_CONNECTED | EVENT_ACCEPTED | EVENT_DISCONNECTED
_DISCONNECTED = 0x0200
PROBE_SECONDS = 2.0  # after a disconnect, how long a bound socket keeps probing its receivers
PROGRESS_SECONDS = 0.2  # at most this often, the progress callback hears of acknowledged batches
MAX_TRIES = 8  # receivers that went away holding one batch, before the sender gives up on it
IDLE_SECONDS = 0.02  # with nothing queued, how long the socket thread waits before reading acks again
_DEALER_PEER = b""  # the routing id of a DEALER socket's one peer
EMPTY = object()  # what the ``take`` of ``Delivery.run`` returns when nothing is queued
MIN_FRAME = 256  # bytes: a receiver that takes no frame this big takes no batch (its header alone): not ours


@dataclass
class Item:
    """One batch on its way: what to send, and where the stream is after it."""

    seq: int
    keys: list[str]
    tensors: dict[str, Any]
    epoch: int
    text: tuple[str, ...]
    bfloat16: tuple[str, ...]
    pos: dict[str, Any] | None
    redelivered: bool = False
    largest: int = -1  # bytes in its largest frame (the header's too), once encoded
    tries: int = 0  # receivers it was given to that went away before acknowledging it
    shared: dict[str, Any] = field(default_factory=dict)  # tensor name -> shm.SharedBlock holding it
    shared_bytes: int = 0  # tensor bytes the last receiver it went to mapped from shared memory

    def release(self) -> None:
        """Its shared-memory blocks leave their ring (never written to again: a receiver that went
        away may have held them, or their bytes go inline); its arrays stay valid."""
        for block in self.shared.values():
            block.release()
        self.shared = {}


@dataclass
class Peer:
    """A receiver this sender knows: on socket ``index``, with ZMQ routing id ``rid``."""

    index: int
    rid: bytes
    receiver: str = "?"
    credit: int = 0
    max_frame: int | None = None
    unacked: dict[int, Item] = field(default_factory=dict)
    final_acked: bool = False
    shm: bool = False  # it maps batches in shared memory (a receiver on this host, over ipc)
    read_stop: bool = False  # it acknowledged our stop (an aborted eof): it has read it


@dataclass
class Progress:
    """What every receiver together acknowledged: all batches below ``next`` and those in
    ``above``; ``pos`` is the stream's position after batch ``next - 1``. It is reported before
    a batch at or past ``resend`` is sent (write-ahead), so ``resend`` bounds what went out.
    A checkpoint keeps one per rank, and a restarted sender starts from it."""

    next: int = 0
    above: dict[int, dict[str, Any] | None] = field(default_factory=dict)  # later acknowledged ones, with positions
    pos: dict[str, Any] | None = None
    resend: int = 0  # batches below this one may have been sent: after a restart they go out marked

    def as_json(self) -> dict[str, Any]:
        return {"next": self.next, "above": [[seq, pos] for seq, pos in sorted(self.above.items())],
                "pos": self.pos, "resend": self.resend}

class Delivery:
    """The sockets and the socket thread of an acknowledging sender (see the module's text).

    ``common`` are the header fields of every message (sender id, group, rank, senders).
    ``progress`` (optional) is called from the socket thread with a ``Progress`` as
    acknowledgements come in (at most every ``PROGRESS_SECONDS``) and once at the end;
    ``sent(item, frames)`` after each batch that went out.
    """

    def __init__(self, context: Any, endpoints: list[Endpoint], *, hwm: int, heartbeat: float,
                 send_timeout: float | None, common: dict[str, Any], keys: Any, acked: bool,
                 start_seq: int = 0, done: dict[int, dict[str, Any] | None] | None = None,
                 progress: Callable[[Progress], None] | None = None, hold: Any = None,
                 sent: Callable[[Item, list[Any]], None] = lambda item, frames: None) -> None:
        import zmq

        self.endpoints = endpoints
        self.heartbeat = heartbeat
        self.send_timeout = send_timeout
        self.common = common
        self.acked = acked
        self.hwm = hwm
        self._context = context
        self._sockets: list[Any] = []
        self._monitors: list[Any] = []
        self._handshakes: list[Handshakes] = []
        self._routers: list[bool] = []
        self._hello_sent: list[bool] = []  # DEALER sockets: said hello on the current connection
        self._probe_until: list[float] = []  # ROUTER sockets: probing receivers after a disconnect
        self._probed: list[float] = []  # when they last did
        self.peers: dict[tuple[int, bytes], Peer] = {}
        self._turn = 0
        self.redeliver: deque[Item] = deque()
        self.final_eof: dict[str, Any] | None = None
        self._eof_told: set[tuple[int, bytes]] = set()  # the receivers told of the epoch end on its way
        self._final_told = False  # a receiver acknowledged the end of the stream
        self._progress = progress
        self._sent = sent
        self._hold = hold  # see Sender: the senders of a group end together
        self._next_ack = start_seq  # every batch below this one is acknowledged
        self._above: set[int] = set(done or ())  # acknowledged before a restart: not sent again
        self._positions: dict[int, dict[str, Any] | None] = dict(done or {})
        self._pos: dict[str, Any] | None = None
        self._progress_told = 0.0
        self._resend = start_seq  # what the last report said may have been sent (see Progress)
        self._last_eof: dict[str, Any] | None = None  # said to receivers that come before the next batch
        self._last_beat = time.monotonic()
        self._held: Item | None = None  # the batch the socket thread took last (see shutdown)
        try:
            for endpoint in endpoints:
                self._open(endpoint, hwm, heartbeat, keys)
        except BaseException:
            self.shutdown(linger=0)
            raise
        # waiting for acknowledgements: anything coming in; without them (ack=False), for room in a
        # full queue too, which a DEALER says (a ROUTER always looks writable: short polls there)
        self._poller = zmq.Poller()
        self._room_poller = zmq.Poller()
        for sock, router in zip(self._sockets, self._routers, strict=True):
            self._poller.register(sock, zmq.POLLIN)
            self._room_poller.register(sock, zmq.POLLIN if router else zmq.POLLIN | zmq.POLLOUT)
        for monitor in self._monitors:
            self._poller.register(monitor, zmq.POLLIN)
            self._room_poller.register(monitor, zmq.POLLIN)
        self._room_wait = 250 if acked or not any(self._routers) else 2  # milliseconds

    def _open(self, endpoint: Endpoint, hwm: int, heartbeat: float, keys: Any) -> None:
        import zmq

        router = endpoint.bind
        sock = open_socket(self._context, zmq.ROUTER if router else zmq.DEALER, self._sockets)  # closed on any error
        # credit bounds the batches in flight; the high-water mark leaves room for control messages
        set_option(sock, zmq.SNDHWM, hwm + 16 if self.acked else hwm, endpoint)
        set_option(sock, zmq.RCVHWM, 0, endpoint)  # acks are small, and must never be refused
        set_option(sock, zmq.HEARTBEAT_IVL, max(1, int(heartbeat * 1000)), endpoint)
        set_option(sock, zmq.HEARTBEAT_TIMEOUT, max(1, int(heartbeat * 10_000)), endpoint)
        if router:
            set_option(sock, zmq.ROUTER_MANDATORY, 1, endpoint)  # a receiver that is gone is an error, not a drop
        # no IMMEDIATE on a DEALER: with it, ZMQ throws away what a connection had received and
        # not yet been read when it closes (a receiver's last acknowledgements). Without it, what
        # was queued for a receiver that went away goes to the next one, before our hello: that
        # receiver drops it, and it is sent again (credit, not the queue, says what may be sent)
        if keys is not None:
            from .curve import make_server

            make_server(sock, keys)
        self._monitors.append(sock.get_monitor_socket(_CONNECTION_EVENTS | handshake_events()))
        attach(sock, endpoint)
        self._handshakes.append(Handshakes("sender", keys is not None, endpoint.url, endpoint.bind))
        self._routers.append(router)
        self._hello_sent.append(False)
        self._probe_until.append(0.0)
        self._probed.append(0.0)

    # -- the socket thread's loop -----------------------------------------------------------------

    def run(self, take: Callable[[float], Any], aborted: Callable[[], bool], say_aborted: Callable[[], None]) -> None:
        """Send what ``take(timeout)`` hands out (``("batch", Item)``, ``("eof", counts)``, None at
        the end) until the end of the stream is acknowledged, or ``aborted()``."""
        item: Any = None
        have_item = False
        stuck_since: float | None = None  # something to send, and no receiver to take it
        while True:
            self._service()
            if aborted():
                say_aborted()
                self._report(force=True)  # the acknowledgements read while saying it count too
                return
            sent = False
            while self.redeliver:
                first = self.redeliver.popleft()  # out first: sending may find more to send again
                if not self._send_batch(first):
                    self.redeliver.appendleft(first)
                    break
                sent = True
            if not have_item and not self.redeliver:
                item, have_item = take(IDLE_SECONDS), True  # waits only while nothing is queued
                if item is EMPTY:
                    item, have_item = None, False
                elif item is not None and item[0] == "batch":
                    self._held = item[1]  # released at shutdown if it never goes out
            waiting = bool(self.redeliver)
            if have_item and not self.redeliver:
                if item is None:  # the end of the stream: wait until it is acknowledged
                    if self._finished():
                        self._report(force=True)
                        if self._hold is None or self._hold.ended():
                            return
                        self._poller.poll(timeout=50)  # the others are not done: greet latecomers
                        stuck_since = None
                        continue
                    waiting = True
                elif item[0] == "batch":
                    if self._send_batch(item[1]):
                        have_item, sent = False, True
                    else:
                        waiting = True
                elif self._in_flight() == 0 and self._send_eof(item[1]):  # when all of the epoch is acknowledged
                    have_item, sent = False, True
                else:
                    waiting = True
            now = time.monotonic()
            if sent or not waiting:
                stuck_since = None
            elif stuck_since is None:
                stuck_since = now
            elif self.send_timeout is not None and now - stuck_since > self.send_timeout:
                raise TransportError(self._stuck(item if have_item else None))
            if waiting and not sent:  # until an ack or an event comes in (or room, without acks)
                if self.acked:
                    self._poller.poll(timeout=250)
                else:
                    self._room_poller.poll(timeout=self._room_wait)

    def _service(self) -> None:
        """Read what came in (acks, monitor events), greet, probe, and send heartbeats; then raise
        for a first handshake's hang-up that is overdue (``Handshakes.overdue``), once what came
        in is read (so that a caller that goes on, ``say_aborted``, waits on new input only)."""
        import zmq
        for index, monitor in enumerate(self._monitors):
            while monitor.poll(0):
                self._connection_event(index, *monitor_event(monitor, zmq.NOBLOCK))
        for index, sock in enumerate(self._sockets):
            while sock.poll(0):
                frames = sock.recv_multipart(copy=False)
                rid = _DEALER_PEER
                if self._routers[index]:
                    rid, frames = frames[0].bytes, frames[1:]
                self._incoming(index, rid, frames)
        now = time.monotonic()
        for index in range(len(self._sockets)):
            if not self._routers[index] and not self._hello_sent[index]:
                self._hello(index, _DEALER_PEER)
            elif self._routers[index] and now < self._probe_until[index] and now - self._probed[index] >= 0.05:
                self._probed[index] = now
                self._beat(index)
        if now - self._last_beat >= self.heartbeat:
            self._last_beat = now
            for index in range(len(self._sockets)):
                self._beat(index)
        self._report()
        for handshakes in self._handshakes:
            reason = handshakes.overdue(now)
            if reason is not None:
                raise TransportError(reason)

    def _connection_event(self, index: int, event: int, value: int) -> None:
        handshakes = self._handshakes[index]
        if event == _DISCONNECTED:
            if not handshakes.succeeded and handshakes.doubt is None:
                role = "a receiver connected to" if handshakes.bound else "the receiver at"
                handshakes.doubt = (f"{role} {handshakes.url} hung up during the handshake: a tarproc that speaks "
                                    "wire format v1 (PUSH/PULL sockets; run the same version on both sides), "
                                    "a receiver with other CURVE keys, or not a ZMQ peer")
            if self._routers[index]:
                self._probe_until[index] = time.monotonic() + PROBE_SECONDS  # which one went is found by probing
            else:  # a DEALER's one receiver is gone: hello again to whoever comes next
                self._hello_sent[index] = False
                self._lost(index, _DEALER_PEER)
            return
        if event & _CONNECTION_EVENTS:
            return
        reason = handshakes.verdict(event, value, time.monotonic())
        if reason is not None:
            raise TransportError(reason)

    def _incoming(self, index: int, rid: bytes, frames: list[Any]) -> None:
        url = self.endpoints[index].url
        try:
            ack = decode_ack(frames, url)
        except WireError:
            return  # not from a receiver of ours: nothing to act on (the receiver side reports garbage)
        key = (index, rid)
        peer = self.peers.get(key)
        mine = (ack.get("to", self.common["sender"]), ack.get("to_group", self.common["group"])) == (
            self.common["sender"], self.common["group"])
        if peer is None and (not mine or ack.get("max_frame", MIN_FRAME) < MIN_FRAME):
            # meant for another sender (it must not become a peer this stream waits for at its end), or
            # one that takes no frame a batch could be: not a receiver of ours
            return
        if peer is None:
            if self._routers[index]:  # a receiver that connected to us greets first
                self._hello(index, rid)
            if self._last_eof is not None and ack.get("final") is not True:  # a latecomer: that end is news
                self._send(index, rid, control("eof", **self.common, **self._last_eof, seq=0, dest=index))
            peer = self.peers[key] = Peer(index, rid)
        if not mine:
            return  # meant for an earlier sender on this endpoint (queued while it was gone)
        peer.receiver = ack["receiver"]
        peer.credit = min(peer.credit + ack["credit"], self.hwm)  # more would hold batches in memory unbounded
        if "max_frame" in ack and ack["max_frame"] >= MIN_FRAME:
            peer.max_frame = ack["max_frame"]
            peer.shm = (ack.get("shm") is True and self.endpoints[index].address.startswith("ipc://")
                        and may_map_from(frames[0]))  # a receiver of another user can't open our files
        for seq in ack["seqs"]:
            item = peer.unacked.pop(seq, None)
            if item is not None:
                self._acknowledged(item)
            else:  # acknowledged late, after its receiver was taken for gone: don't send it again
                for waiting in list(self.redeliver):
                    if waiting.seq == seq:
                        self.redeliver.remove(waiting)
                        self._acknowledged(waiting)
        if ack.get("final") is True:
            peer.final_acked = True
            self._final_told = True
        if ack.get("stop") is True:
            peer.read_stop = True

    def _lost(self, index: int, rid: bytes) -> None:
        """A receiver went away: what it held and had not acknowledged is sent again, first."""
        peer = self.peers.pop((index, rid), None)
        if peer is None:
            return
        items = sorted(peer.unacked.values(), key=lambda item: item.seq)
        for item in items:
            item.release()  # its receiver may have mapped (and unlinked) it: it goes inline now
            item.redelivered = True
            item.tries += 1
            if item.tries >= MAX_TRIES:
                raise TransportError(
                    f"batch {item.seq} (keys {item.keys[0]!r}...) was given to receivers {item.tries} times, and each "
                    "went away before acknowledging it: they crash on it, or their connection drops it (its largest "
                    f"frame is {item.largest} bytes; see --max-message-size)")
        self.redeliver.extendleft(reversed(items))  # in their order, before anything new

    def _acknowledged(self, item: Item) -> None:
        for block in item.shared.values():  # never sent again: the ring has it back once the
            block.held = False  # receiver's consumer lets go of it too
        self._positions[item.seq] = item.pos
        self._above.add(item.seq)
        while self._next_ack in self._above:
            self._above.discard(self._next_ack)
            self._pos = self._positions.pop(self._next_ack, self._pos)  # none: acknowledged before a restart
            self._next_ack += 1

    def _report(self, force: bool = False) -> None:
        if self._progress is None:
            return
        now = time.monotonic()
        if force or now - self._progress_told >= PROGRESS_SECONDS:
            self._progress_told = now
            above = {seq: self._positions.get(seq) for seq in self._above}
            self._progress(Progress(self._next_ack, above, self._pos, self._resend))

    # -- sending ----------------------------------------------------------------------------------

    def _send(self, index: int, rid: bytes, frames: list[Any], copy: bool = True) -> bool:
        """One message to one receiver, without waiting: False when it can't take it now; a
        receiver found gone (a bound socket says so) is taken for lost."""
        import zmq

        sock = self._sockets[index]
        try:
            if self._routers[index]:
                sock.send_multipart([rid, *frames], copy=copy, flags=zmq.NOBLOCK)
            else:
                sock.send_multipart(frames, copy=copy, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False
        except zmq.ZMQError as e:
            if e.errno == zmq.EHOSTUNREACH:
                self._lost(index, rid)
                return False
            raise

    def _hello(self, index: int, rid: bytes) -> None:
        hello = control("hello", **self.common, host=socketlib.gethostname(), pid=os.getpid(),
                        pattern="push", dest=index, acked=self.acked)
        if self._send(index, rid, hello) and not self._routers[index]:
            self._hello_sent[index] = True

    def _beat(self, index: int) -> None:
        beat = control("heartbeat", **self.common)
        for peer in [p for p in self.peers.values() if p.index == index]:
            self._send(index, peer.rid, beat)

    def _send_batch(self, item: Item) -> bool:
        """Give ``item`` to the next receiver (in turn) with credit for it and room for its largest
        frame; False if none can take it now. A batch no receiver here can take is an error."""
        peers = list(self.peers.values())

        def fits(peer: Peer) -> bool:  # ZMQ's limit is on every frame, the header's too
            return peer.max_frame is None or item.largest < 0 or item.largest <= peer.max_frame

        for turn in range(len(peers)):
            peer = peers[(self._turn + turn) % len(peers)]
            if (self.acked and peer.credit <= 0) or not fits(peer):
                continue
            # shared memory: only to a receiver on this host that takes it, and that acknowledges it
            # (the file must stay until it has been mapped)
            shared = None
            if item.shared and peer.shm and self.acked:
                for block in item.shared.values():
                    block.lend()
                shared = {name: block.descriptor() for name, block in item.shared.items()}
            elif item.shared:
                item.release()  # inline: ZMQ sends from the block, which must not be written to again
            frames = encode_batch(item.keys, item.tensors, text=item.text, bfloat16=item.bfloat16, **self.common,
                                  epoch=item.epoch, seq=item.seq, dest=peer.index, acked=self.acked,
                                  redelivered=item.redelivered, shared=shared,
                                  **({"pos": item.pos} if item.pos else {}))
            item.largest = max(len(memoryview(f)) for f in frames)
            item.shared_bytes = sum(_as_nbytes(item.tensors[name]) for name in shared) if shared else 0
            if not fits(peer):
                for block in item.shared.values():
                    block.unlend()
                continue
            if self._progress is not None and item.seq >= self._resend:  # write-ahead (see Progress)
                self._resend = item.seq + 1 + self.hwm * max(4, 2 * len(self.peers))
                self._report(force=True)
            if self._last_eof is not None and item.epoch != self._last_eof["epoch"]:
                self._last_eof = None  # a batch of a later epoch: that end is old news
            if not self._send(peer.index, peer.rid, frames, copy=False):
                for block in item.shared.values():
                    block.unlend()
                continue
            self._turn = (self._turn + turn + 1) % len(peers)
            if self.acked:
                peer.credit -= 1
                peer.unacked[item.seq] = item
            else:
                self._acknowledged(item)
            self._sent(item, frames)
            return True
        if peers and not any(fits(p) for p in peers):
            limits = ", ".join(sorted({f"{p.receiver} ({p.max_frame} bytes)" for p in peers}))
            raise TransportError(f"batch {item.seq} (keys {item.keys[0]!r}...) has a frame of {item.largest} "
                                 f"bytes, over what the receivers accept: {limits}; raise their --max-message-size "
                                 "or send smaller batches")
        return False

    def _send_eof(self, counts: dict[str, Any]) -> bool:
        """Tell every receiver the epoch ended; False while some can't take it yet (a full queue:
        without acknowledgements, batches fill it), so that it is tried again."""
        told = self._eof_told  # one end at a time: the run loop holds it until everyone is told
        for key, peer in list(self.peers.items()):
            if key not in told and self._send(peer.index, peer.rid,
                                              control("eof", **self.common, **counts, seq=0, dest=peer.index)):
                told.add(key)
        if not told >= set(self.peers):
            return False
        told.clear()
        if counts.get("final"):
            self.final_eof = counts
        self._last_eof = counts
        return True

    def _in_flight(self) -> int:
        return len(self.redeliver) + sum(len(p.unacked) for p in self.peers.values())

    def _finished(self) -> bool:
        """The end of the stream went out, and every receiver still here has acknowledged it (and
        at least one has: a stream nobody heard end is not over)."""
        if self.final_eof is None:
            return True  # nothing was ever sent: no stream to end (closing before the first epoch)
        return self._final_told and all(p.final_acked for p in self.peers.values())

    def _stuck(self, item: Any) -> str:
        where = ", ".join(e.url for e in self.endpoints)
        held = self._in_flight()
        what = ("the end of the stream" if item is None else "a batch" if item[0] == "batch" else "the end of an epoch")
        doubts = "".join(f"; {h.doubt}" for h in self._handshakes if h.doubt and not h.succeeded)
        if not self.peers:
            lost = f"; {held} batch(es) sent to receivers that went away are not delivered" if held else ""
            return f"no receiver took {what} for {self.send_timeout:g} s on {where}: none is there{lost}{doubts}"
        if item is None and held == 0:
            return (f"no receiver acknowledged the end of the stream for {self.send_timeout:g} s on {where} "
                    "(every batch was delivered and acknowledged)")
        return (f"no receiver took {what} for {self.send_timeout:g} s on {where} ({held} batch(es) sent and not yet "
                f"acknowledged){doubts}")

    def say_aborted(self, reason: str, wait: float) -> None:
        """Tell every receiver this sender stopped early, and wait (up to ``wait`` s) until each has
        acknowledged it: a receiver whose queue from us is full (a consumer that fell behind)
        stops reading our connection, and when we close it libzmq drops what it had not read yet
        (the pause would be lost, and that receiver take us for dead). One that goes is not waited for."""
        message = control("eof", **self.common, aborted=True, final=True, reason=reason)
        deadline = time.monotonic() + wait
        told: set[tuple[int, bytes]] = set()
        while time.monotonic() < deadline:
            with contextlib.suppress(TransportError):
                self._service()  # a receiver whose greeting is on its way is told too
            for key, peer in list(self.peers.items()):
                if key not in told and self._send(peer.index, peer.rid, message):
                    told.add(key)
            if told and told >= set(self.peers) and all(p.read_stop for p in self.peers.values()):
                return
            self._poller.poll(timeout=20)  # until an ack or an event comes in

    def shutdown(self, linger: int) -> None:
        held = [self._held] if self._held is not None else []
        for item in [*held, *self.redeliver, *(i for p in self.peers.values() for i in p.unacked.values())]:
            item.release()
        close_sockets(self._sockets, linger)
        close_sockets(self._monitors)



def _as_nbytes(value: Any) -> int:
    return int(getattr(value, "nbytes", 0))
