"""The ZMQ transport: URL grammar, wire format v1, Sender/Receiver flow control, failures, CURVE."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
import time

import msgpack
import numpy as np
import pytest
import zmq
from tarhelpers import free_port, wait_for

from tarproc.errors import OptionError, TransportError, WireError
from tarproc.transport import EpochEnd, Receiver, Sender, decode, encode_batch, parse_endpoints
from tarproc.transport.curve import generate_keys
from tarproc.transport.urls import is_zmq_url, parse_endpoint
from tarproc.transport.wire import DTYPES, control, to_batch

IDS = {"sender": "s", "group": "g", "rank": 0, "senders": 1}


def ipc(tmp_path, name="feed"):
    return f"ipc://{tmp_path}/{name}"


# -- URLs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, kind, bind, address",
    [
        ("zpush://trainer:7880", "push", False, "tcp://trainer:7880"),
        ("zpull://:7880", "pull", True, "tcp://127.0.0.1:7880"),
        ("zpull://*:7880", "pull", True, "tcp://*:7880"),
        ("zpull://0.0.0.0:7880", "pull", True, "tcp://*:7880"),
        ("zpub://:7880", "pub", True, "tcp://127.0.0.1:7880"),
        ("zsub://feeder:7880", "sub", False, "tcp://feeder:7880"),
        ("zrpush://:7880", "push", True, "tcp://127.0.0.1:7880"),
        ("zrpull://host:7880", "pull", False, "tcp://host:7880"),
        ("zrpub://host:7880", "pub", False, "tcp://host:7880"),
        ("zrsub://:7880", "sub", True, "tcp://127.0.0.1:7880"),
        ("zpush+ipc:///tmp/feed", "push", False, "ipc:///tmp/feed"),
    ],
)
def test_tensorcom_url_grammar(url, kind, bind, address):
    endpoint = parse_endpoint(url)
    assert (endpoint.kind, endpoint.bind, endpoint.address) == (kind, bind, address)


def test_plain_zmq_addresses_mean_push_pull():
    [sender] = parse_endpoints("tcp://trainer:7880", sending=True)
    [receiver] = parse_endpoints("ipc:///tmp/feed", sending=False)
    assert (sender.kind, sender.bind, sender.address) == ("push", False, "tcp://trainer:7880")
    assert (receiver.kind, receiver.bind, receiver.address) == ("pull", True, "ipc:///tmp/feed")
    assert is_zmq_url("tcp://h:1") and is_zmq_url("ipc:///x")


def test_brace_lists_give_several_endpoints():
    endpoints = parse_endpoints(["zpush://h:788{0..2}"], sending=True)
    assert [e.address for e in endpoints] == ["tcp://h:7880", "tcp://h:7881", "tcp://h:7882"]


@pytest.mark.parametrize(
    "urls, sending, message",
    [
        ("http://x:1", True, "bad ZMQ URL"),
        ("zpush://host", True, "host:port"),
        ("zpush://host:0", True, "port"),
        ("zpush://*:7880", True, "needs a host"),
        ("zpull://:7880", True, "this side sends"),
        ("zpush://h:1", False, "this side receives"),
        (["zpush://h:1", "zpub://:2"], True, "mixed socket patterns"),
        (["zpush://h:1", "zpush://h:1"], True, "the same endpoint twice"),
    ],
)
def test_bad_urls_are_usage_errors(urls, sending, message):
    with pytest.raises(OptionError, match=message):
        parse_endpoints(urls, sending=sending)


def test_is_zmq_url_tells_destinations_from_inputs():
    assert is_zmq_url("zpush://h:1") and is_zmq_url("zrpub+ipc:///x")
    assert not is_zmq_url("train-0000.tar") and not is_zmq_url("s3://b/x.tar") and not is_zmq_url("zip://x")


# -- wire format --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "bfloat16"])
def test_every_dtype_round_trips(dtype):
    array = (np.arange(24) % 2 == 1) if dtype == "bool" else np.arange(24).astype(dtype)
    array = array.reshape(2, 3, 4)
    message = decode(encode_batch(["a", "b"], {"x": array}, **IDS, epoch=0, seq=0))
    assert message.tensors["x"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(message.tensors["x"], array)


def test_bfloat16_travels_as_its_bits():
    bits = np.array([[0x3F80, 0x4000]], dtype=np.uint16)  # 1.0 and 2.0 in bfloat16
    frames = encode_batch(["a"], {"x": bits}, bfloat16=["x"], **IDS, epoch=0, seq=0)
    message = decode(frames)
    assert msgpack.unpackb(frames[0])["tensors"][0]["dtype"] == "bfloat16"
    assert message.tensors["x"].view(np.uint16).tolist() == [[0x3F80, 0x4000]]
    assert to_batch(message).dtypes["x"] == "bfloat16"


def test_bytes_fields_ragged_tensors_and_missing_values():
    ragged = [np.zeros((2, 3), np.float32), np.ones((4, 1), np.float32)]
    frames = encode_batch(["a", "b"], {"json": [b'{"x": 1}', None], "mask": ragged, "cls": np.array([3, 4])},
                          text=["cls"], **IDS, epoch=2, seq=7)
    batch = to_batch(decode(frames))
    assert batch["__key__"] == ["a", "b"] and batch.epoch == 2 and batch.seq == 7
    assert batch["json"] == [b'{"x": 1}', None]
    assert [m.shape for m in batch["mask"]] == [(2, 3), (4, 1)] and batch["mask"][1].sum() == 4
    assert batch.text == {"cls"} and batch["cls"].tolist() == [3, 4]


def test_received_arrays_are_views_of_the_frames_not_copies():
    array = np.arange(256 * 1024, dtype=np.uint8).reshape(4, -1)
    frames = [zmq.Frame(f) if not isinstance(f, bytes) else zmq.Frame(f)
              for f in encode_batch(list("abcd"), {"x": array}, **IDS, epoch=0, seq=0)]
    message = decode(frames)
    assert np.shares_memory(message.tensors["x"], np.frombuffer(frames[1].buffer, np.uint8))


def test_the_sender_does_not_copy_large_arrays():
    array = np.zeros((4, 1 << 16), np.float32)
    frames = encode_batch(list("abcd"), {"x": array}, **IDS, epoch=0, seq=0)
    assert np.shares_memory(frames[1], array)


def test_a_dtype_outside_v1_is_refused():
    with pytest.raises(WireError, match="complex64 can't be sent"):
        encode_batch(["a"], {"x": np.zeros(1, np.complex64)}, **IDS, epoch=0, seq=0)


def header(**fields):
    base = {"v": 2, "kind": "batch", "sender": "s", "group": "g", "rank": 0, "senders": 1, "epoch": 0, "seq": 0,
            "n": 1, "keys": ["a"],
            "tensors": [{"name": "x", "dtype": "uint8", "shape": [1, 4]}]}
    base.update(fields)
    return msgpack.packb(base)


@pytest.mark.parametrize(
    "frames, message",
    [
        ([], "empty message"),
        ([b"\xc1garbage"], "not msgpack"),
        ([msgpack.packb([1, 2])], "not a map"),
        ([header(v=3), b"1234"], "unknown wire format version 3"),
        ([header(v=1), b"1234"], "wire format version 1, from an older tarproc: this one speaks version 2"),
        ([header(kind="pickle"), b"1234"], "unknown message kind"),
        ([header(sender=None), b"1234"], "without a sender"),
        ([header(), b"123"], "frame of 3 bytes, header says 4"),
        ([header()], "only 0 data frames"),
        ([header(), b"1234", b"extra"], "1 data frames more"),
        ([header(keys=["a", "b"]), b"1234"], "needs 1 string keys"),
        ([header(tensors=[{"name": "x", "dtype": "object", "shape": [1]}]), b"1"], "unknown dtype 'object'"),
        ([header(tensors=[{"name": "x", "dtype": "uint8", "shape": [2, 2]}]), b"1234"], "not a batch of 1"),
        ([header(tensors=[{"name": "x", "dtype": "uint8", "shape": [1, -4]}]), b""], "bad dimension"),
        ([header(tensors=[{"name": "x", "dtype": "bytes", "sizes": [1, 2]}]), b"1"], "needs 1 sizes"),
        ([header(seq=-1), b"1234"], "bad seq"),
        ([header(v=True), b"1234"], "unknown wire format version True"),
        ([header(rank=2, senders=2), b"1234"], "rank 2 of 2 senders"),
        ([header(tensors=[{"name": "x", "dtype": "uint8", "shape": [1, 0, 2**63]}]), b""], "dimension over"),
        ([header(n=0, keys=[], tensors=[{"name": "x", "dtype": "uint8", "shape": [0] + [2**39] * 30}]), b""],
         "too big for numpy"),
        ([msgpack.packb([[]] * 2_000_000)], "exceeds max_array_len"),
        ([msgpack.packb({"v": 2, "kind": "eof", "sender": "s", "group": "g", "rank": 0, "senders": 1,
                         "epoch": 0, "final": True, "batches": "x", "samples": 1})], "bad batches 'x'"),
        ([msgpack.packb({"v": 2, "kind": "eof", "sender": "s", "group": "g", "rank": 0, "senders": 1,
                         "epoch": [1], "final": True, "batches": 1, "samples": 1})], "bad epoch"),
        ([msgpack.packb({"v": 2, "kind": "eof", "sender": "s", "group": "g", "rank": 0, "senders": 1,
                         "epoch": 0, "final": "no", "batches": 1, "samples": 1})], "true or false"),
        # "text" is for a label per sample: a 1-D integer tensor, nothing else
        ([header(tensors=[{"name": "x", "dtype": "float32", "shape": [1, 2], "text": True}]), bytes(8)],
         r"tensor 'x' \(float32 of shape \[1, 2\]\) is marked text: only a 1-D integer tensor can be"),
        ([header(tensors=[{"name": "x", "dtype": "float32", "shape": [1], "text": True}]), bytes(4)],
         r"tensor 'x' \(float32 of shape \[1\]\) is marked text"),
        ([header(tensors=[{"name": "x", "dtype": "int64", "shape": [1, 1], "text": True}]), bytes(8)],
         r"tensor 'x' \(int64 of shape \[1, 1\]\) is marked text"),
        ([header(tensors=[{"name": "x", "dtype": "int64", "shapes": [[2]], "text": True}]), bytes(16)],
         r"tensor 'x' \(ragged int64\) is marked text"),
        ([header(tensors=[{"name": "x", "dtype": "bytes", "sizes": [1], "text": True}]), b"1"],
         r"field 'x' \(bytes\) is marked text"),
        ([header(tensors=[{"name": "x", "dtype": "bool", "shape": [1], "text": True}]), b"\x01"], "is marked text"),
        ([header(tensors=[{"name": "x", "dtype": "int64", "shape": [1], "text": 1}]), bytes(8)],
         "'text' must be true or false, not 1"),
        # what a peer sent is quoted short, on one line
        ([header(v="x" * 100_000), b"1234"], r"version 'x{56}\.\.\. \(this side"),
        ([header(kind=list(range(1000))), b"1234"], "unknown message kind <list of 1000 items>$"),
        ([header(sender="a\nb"), b"1234"], r"bad sender id 'a\\nb'"),
        ([header(group="g" * 1000), b"1234"], "bad group id"),
        # limits on what a header may cost
        ([msgpack.packb({"v": 1, "x": "y" * (4 << 20)})], r"header of 4194\d{3} bytes is over the limit of 4194304"),
        ([msgpack.packb([[[]] * 100_000] * 3)], "header has over 262144 lists and maps"),
        ([msgpack.packb([{}] * 300_000)], "header has over 262144 lists and maps"),
    ],
)
def test_malformed_messages_are_wire_errors(frames, message):
    with pytest.raises(WireError, match=message):
        decode(frames)


def test_a_header_that_is_all_right_is_decoded_with_its_text_tensor():
    message = decode([header(tensors=[{"name": "cls", "dtype": "uint8", "shape": [1], "text": True}]), b"\x07"])
    batch = to_batch(message)
    assert batch.text == {"cls"} and batch["cls"].tolist() == [7]


@pytest.mark.parametrize(
    "tensors, text, bfloat16, message",
    [
        ({"x": np.zeros((2, 3), np.float32)}, ["x"], [], r"tensor 'x' \(float32, shape \[2, 3\]\) can't be text"),
        ({"x": np.zeros(2, np.float32)}, ["x"], [], r"tensor 'x' \(float32, shape \[2\]\) can't be text"),
        ({"x": np.zeros((2, 1), np.int64)}, ["x"], [], r"tensor 'x' \(int64, shape \[2, 1\]\) can't be text"),
        ({"x": [np.zeros(1, np.int64), np.zeros(2, np.int64)]}, ["x"], [], "tensor 'x' can't be text"),
        ({"x": [b"1", b"2"]}, ["x"], [], "tensor 'x' can't be text"),
        ({"x": np.zeros(2, np.int64)}, ["y"], [], "text names 'y', which is not a tensor of the batch"),
        ({"x": np.zeros(2, np.float32)}, [], ["x"], "tensor 'x' of float32 can't be sent as bfloat16"),
        ({"x": [np.zeros(1, np.float32)] * 2}, [], ["x"], "tensor 'x' of float32 can't be sent as bfloat16"),
        ({"x": [b"1", b"2"]}, [], ["x"], "field 'x' of bytes can't be sent as bfloat16"),
        ({"x": np.zeros(2, np.uint16)}, ["x"], ["x"], "tensor 'x' can't be text"),
    ],
)
def test_the_sender_refuses_what_receivers_would_reject(tensors, text, bfloat16, message):
    with pytest.raises(WireError, match=message):
        encode_batch(["a", "b"], tensors, text=text, bfloat16=bfloat16, **IDS, epoch=0, seq=0)


def test_a_batch_header_over_the_limit_is_refused_by_the_sender():
    keys = [f"{i:07d}" + "k" * 100 for i in range(40_000)]  # 4.3 MB of keys
    with pytest.raises(WireError, match=r"the header of a batch of 40000 samples would be \d+ bytes, over the "
                                        "wire format's limit of 4194304: send smaller batches"):
        encode_batch(keys, {"x": np.zeros(40_000, np.uint8)}, **IDS, epoch=0, seq=0)
    # a big batch of ordinary keys is well inside it
    keys = [f"shard-{i // 1000:06d}/sample-{i:08d}" for i in range(65_536)]
    frames = encode_batch(keys, {"x": np.zeros(65_536, np.uint8), "json": [b"{}"] * 65_536}, **IDS, epoch=0, seq=0)
    assert len(frames[0]) < 3 << 20 and decode(frames).header["n"] == 65_536


def test_a_rejected_message_names_its_peer_and_sender():
    port = free_port()
    warnings = []
    context = zmq.Context()
    stray = context.socket(zmq.DEALER)  # a wire v2 peer's socket type
    with Receiver(f"zpull://127.0.0.1:{port}", wait=0.5, warn=warnings.append) as receiver:
        stray.connect(f"tcp://127.0.0.1:{port}")
        stray.send_multipart([header(sender="stray:9:0", tensors=[{"name": "x", "dtype": "uint8", "shape": [1, 4],
                                                                  "text": True}]), b"1234"])
        stray.send(b"\xc1")
        with pytest.raises(TransportError, match="no sender"):
            list(receiver)
    stray.close(0)
    context.term()
    assert warnings == [
        f"rejected a message from 127.0.0.1 (sender stray:9:0) on zpull://127.0.0.1:{port}: tensor 'x' (uint8 of "
        "shape [1, 4]) is marked text: only a 1-D integer tensor can be (a label per sample)",
        f"rejected a message from 127.0.0.1 on zpull://127.0.0.1:{port}: not a wire format message (header is not "
        "msgpack: FormatError)"], warnings
    assert receiver.stats.rejected == 2


def test_a_message_error_knows_where_the_message_came_from(tmp_path):
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)  # raw ZMQ: decode() alone
    pull.bind(ipc(tmp_path))
    push.connect(ipc(tmp_path))
    push.send_multipart([header(v=3), b"1234"])
    frames = pull.recv_multipart(copy=False)
    with pytest.raises(WireError) as e:
        decode(frames, "zpull+ipc://x")
    import os

    assert e.value.peer == f"process {os.getpid()} (uid {os.getuid()})" and e.value.sender == "s"
    assert e.value.reason == "unknown wire format version 3 (this side speaks version 2)"
    assert str(e.value) == f"zpull+ipc://x: message from {e.value.peer} (sender s): {e.value.reason}"
    for sock in (pull, push):
        sock.close(0)
    context.term()


def test_control_messages_carry_no_frames():
    ids = {"sender": "s", "group": "g", "rank": 0, "senders": 1}
    assert decode(control("heartbeat", **ids)).kind == "heartbeat"
    with pytest.raises(WireError, match="extra frames"):
        decode([*control("heartbeat", **ids), b"x"])


# -- Sender and Receiver ------------------------------------------------------------------------


def send_epochs(url, epochs=1, batches=5, n=2, **kw):
    with Sender(url, heartbeat=0.1, **kw) as sender:
        for epoch in range(epochs):
            for i in range(batches):
                keys = [f"e{epoch}-b{i}-{j}" for j in range(n)]
                sender.send(keys, {"x": np.full((n, 3), i, np.int32)}, epoch=epoch)
            sender.end_epoch(epoch, final=epoch == epochs - 1)
        return sender.stats


def in_thread(target, *args, **kw):
    thread = threading.Thread(target=target, args=args, kwargs=kw, daemon=True)
    thread.start()
    return thread


def test_batches_and_epoch_ends_arrive_in_order(tmp_path):
    with Receiver(f"zpull+{ipc(tmp_path)}", timeout=5) as receiver:
        thread = in_thread(send_epochs, f"zpush+{ipc(tmp_path)}", epochs=2)
        events = list(receiver.events())
    thread.join()
    kinds = ["end" if isinstance(e, EpochEnd) else e.epoch for e in events]
    assert kinds == [0] * 5 + ["end"] + [1] * 5 + ["end"]
    assert events[5] == EpochEnd(0, 5, 10) and receiver.stats.samples == 20 and receiver.stats.lost == 0
    assert [e.seq for e in events if not isinstance(e, EpochEnd)] == list(range(10))
    # the receiver has closed its sockets and context; the batches keep their own frames
    assert events[3]["x"].tolist() == [[3, 3, 3]] * 2 and events[3]["x"].flags.writeable


def test_receiver_started_after_the_sender(tmp_path):
    results = {}
    thread = in_thread(lambda: results.setdefault("stats", send_epochs(f"zpush+{ipc(tmp_path)}")))
    # the scenario: the sender waits, and IMMEDIATE queues nothing for a receiver that isn't there
    # (on a busy machine the sender may still be starting: the test holds, in another order)
    time.sleep(0.5)
    with Receiver(f"zpull+{ipc(tmp_path)}", timeout=5) as receiver:
        keys = [k for batch in receiver for k in batch["__key__"]]
    thread.join()
    assert len(keys) == 10 == len(set(keys)) and results["stats"].samples == 10


def test_a_slow_receiver_slows_the_sender_and_memory_stays_bounded(tmp_path):
    """With HWM 1 the sender can be at most a few batches ahead of what the receiver took."""
    url = ipc(tmp_path)
    progress = []

    def send():
        with Sender(f"zpush+{url}", hwm=1, heartbeat=0.1, queue_size=1) as sender:
            for i in range(30):
                sender.send([str(i)], {"x": np.zeros((1, 1 << 20), np.uint8)}, epoch=0)
                progress.append(i)
            sender.end_epoch(0, final=True)

    with Receiver(f"zpull+{url}", hwm=1, timeout=5) as receiver:
        thread = in_thread(send)
        taken = 0
        ahead = []
        for _batch in receiver:
            taken += 1
            time.sleep(0.05)  # the scenario: a slow receiver
            ahead.append(len(progress) - taken)
    thread.join()
    assert taken == 30
    # queued: the sender's queue (1) + its socket thread (1) + SNDHWM (1) + RCVHWM (1) + kernel buffers
    assert max(ahead) <= 8, ahead


def test_two_senders_of_a_group_end_the_stream_only_when_both_have(tmp_path):
    url = ipc(tmp_path)

    def send(rank, delay):
        time.sleep(delay)  # the scenario: the second sender comes later
        with Sender(f"zpush+{url}", heartbeat=0.1, rank=rank, senders=2, group="g") as sender:
            sender.send([f"r{rank}"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
            sender.end_epoch(0, final=True)

    with Receiver(f"zpull+{url}", timeout=5) as receiver:
        threads = [in_thread(send, 0, 0), in_thread(send, 1, 1.0)]
        keys = [k for batch in receiver for k in batch["__key__"]]
    for t in threads:
        t.join()
    assert sorted(keys) == ["r0", "r1"]


def test_a_silent_sender_is_an_error_not_a_hang(tmp_path):
    """A sender that sent a batch and then nothing (killed: no eof, no heartbeats)."""
    url = ipc(tmp_path)
    context = zmq.Context()
    dead = context.socket(zmq.DEALER)
    dead.connect(url)
    with Receiver(f"zpull+{url}", timeout=1.0) as receiver:
        dead.send_multipart(control("hello", sender="h:1:0", group="g", rank=0, senders=1))
        dead.send_multipart(encode_batch(["a"], {"x": np.zeros((1, 1), np.uint8)}, sender="h:1:0", group="g",
                                         rank=0, senders=1, epoch=0, seq=0))
        events = receiver.events()
        assert next(events)["__key__"] == ["a"]
        with pytest.raises(TransportError, match=r"sender h:1:0 silent for \d+ s"):  # a hang: pytest's timeout
            next(events)
    dead.close(0)
    context.term()


def test_heartbeats_keep_a_slow_sender_alive(tmp_path):
    url = ipc(tmp_path)

    def send():
        with Sender(f"zpush+{url}", heartbeat=0.1) as sender:
            time.sleep(3.0)  # the scenario: reading or decoding takes longer than the receiver's timeout
            sender.send(["a"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
            sender.end_epoch(0, final=True)

    # 20 heartbeats to a timeout: a busy machine may hold a few of them up
    with Receiver(f"zpull+{url}", timeout=2.0) as receiver:
        thread = in_thread(send)
        assert [b["__key__"] for b in receiver] == [["a"]]
    thread.join()


def test_an_interrupted_sender_is_reported(tmp_path):
    url = ipc(tmp_path)

    def send():
        with pytest.raises(RuntimeError), Sender(f"zpush+{url}", heartbeat=0.1) as sender:
            sender.send(["a"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
            time.sleep(0.3)  # the scenario: a sender that fails a moment into its stream
            raise RuntimeError("stop")

    with Receiver(f"zpull+{url}", timeout=5) as receiver:
        thread = in_thread(send)
        with pytest.raises(TransportError, match="stopped before the end of its stream"):
            list(receiver)
    thread.join()


def test_closing_a_sender_ends_the_stream(tmp_path):
    """No final end_epoch: leaving the with-block ends the epoch of the last batch, finally."""
    url = ipc(tmp_path)

    def send():
        with Sender(f"zpush+{url}", heartbeat=0.1) as sender:
            for i in range(3):
                sender.send([f"k{i}"], {"x": np.zeros((1, 1), np.uint8)}, epoch=4)

    with Receiver(f"zpull+{url}") as receiver:  # timeout 30 s: it used to end with "silent for 30 s"
        thread = in_thread(send)
        events = list(receiver.events())
    thread.join()
    assert [e["__key__"] for e in events[:3]] == [["k0"], ["k1"], ["k2"]] and events[3:] == [EpochEnd(4, 3, 3)]


@pytest.mark.parametrize("then", ["end_epoch", "nothing sent"])
def test_closing_a_sender_after_an_end_of_epoch_ends_the_stream(tmp_path, then):
    url = ipc(tmp_path)

    def send():
        with Sender(f"zpush+{url}", heartbeat=0.1) as sender:
            if then == "end_epoch":
                sender.send(["a"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
                sender.end_epoch(0)  # not final

    with Receiver(f"zpull+{url}") as receiver:  # timeout 30 s: a stream not ended is "silent for 30 s"
        thread = in_thread(send)
        events = list(receiver.events())
    thread.join()
    # the end of epoch 0 is said again, final: the receiver counts it once
    expected = [EpochEnd(0, 1, 1)] if then == "end_epoch" else [EpochEnd(0, 0, 0)]
    assert [e for e in events if isinstance(e, EpochEnd)] == expected


@pytest.mark.parametrize("error, reason", [(RuntimeError, "failed"), (KeyboardInterrupt, "interrupted")])
def test_an_exception_in_the_with_block_is_not_an_end(tmp_path, error, reason):
    """The receiver must not take a partial stream for a whole one: it raises, saying why."""
    url = ipc(tmp_path)

    def send():
        with pytest.raises(error), Sender(f"zpush+{url}", heartbeat=0.1) as sender:
            sender.send(["a"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
            raise error("stop")

    with Receiver(f"zpull+{url}", timeout=5) as receiver:
        thread = in_thread(send)
        with pytest.raises(TransportError, match=rf"sender \S+ stopped before the end of its stream \({reason}\)"):
            list(receiver)
    thread.join()


def test_rates_count_what_came_after_the_first_batch():
    from tarproc.transport import ReceiveStats

    stats = ReceiveStats(batches=1, samples=4, bytes=100, first=10.0, last=10.0, first_samples=4, first_bytes=100)
    assert not stats.rated and stats.seconds == 0.0
    stats = ReceiveStats(batches=2, samples=8, bytes=200, first=10.0, last=10.05, first_samples=4, first_bytes=100)
    assert not stats.rated  # 50 ms
    stats = ReceiveStats(batches=5, samples=20, bytes=2_000_100, first=10.0, last=12.0, first_samples=4,
                         first_bytes=100)
    assert stats.rated and stats.rates() == {"batches/s": 2.0, "samples/s": 8.0, "MB/s": 1.0}


def test_garbage_is_rejected_and_the_receiver_keeps_running(tmp_path):
    url = ipc(tmp_path)
    warnings = []
    context = zmq.Context()
    stray = context.socket(zmq.DEALER)  # a wire v2 peer's socket type
    with Receiver(f"zpull+{url}", timeout=5, warn=warnings.append) as receiver:
        stray.connect(url)
        stray.send_multipart([b"\x00\xffnot msgpack", b"x"])
        stray.send(msgpack.packb({"v": 9, "kind": "batch", "sender": "x"}))
        time.sleep(0.3)  # the garbage arrives first, while the receiver waits for a sender
        thread = in_thread(send_epochs, f"zpush+{url}")
        keys = [k for batch in receiver for k in batch["__key__"]]
    thread.join()
    stray.close(0)
    context.term()
    assert len(keys) == 10 and receiver.stats.rejected == 2
    assert any("not msgpack" in w for w in warnings) and any("unknown wire format version 9" in w for w in warnings)


def test_raw_tcp_garbage_on_the_port_is_ignored():
    port = free_port()
    with Receiver(f"zpull://127.0.0.1:{port}", timeout=5) as receiver:
        with socket.create_connection(("127.0.0.1", port)) as raw:
            raw.sendall(b"GET / HTTP/1.0\r\n\r\n" + bytes(range(256)) * 10)
        thread = in_thread(send_epochs, f"zpush://127.0.0.1:{port}")
        keys = [k for batch in receiver for k in batch["__key__"]]
    thread.join()
    assert len(keys) == 10


def test_pub_sub_drops_are_counted_as_lost(tmp_path):
    url = ipc(tmp_path)
    warnings = []
    with Receiver(f"zsub+{url}", hwm=1, timeout=5, warn=warnings.append) as receiver:

        def send():
            with Sender(f"zpub+{url}", hwm=1, heartbeat=0.1) as sender:
                time.sleep(0.5)  # the subscription must arrive first
                for i in range(200):
                    sender.send([str(i)], {"x": np.zeros((1, 1 << 16), np.uint8)}, epoch=0)
                sender.end_epoch(0, final=True)

        thread = in_thread(send)
        seqs = []
        for batch in receiver:
            seqs.append(batch.seq)
            time.sleep(0.01)
    thread.join()
    # a gap before the first batch seen is not counted: a receiver can't tell it from joining late
    assert len(seqs) < 200 - seqs[0] and receiver.stats.lost == 200 - seqs[0] - len(seqs)
    assert any("lost" in w for w in warnings)


def test_a_sender_with_no_receiver_times_out(tmp_path):
    sender = Sender(f"zpush+{ipc(tmp_path)}", send_timeout=0.5, heartbeat=0.1)
    sender.send(["a"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
    with pytest.raises(TransportError, match=r"no receiver took a batch for 0.5 s"):
        for _ in range(20):
            sender.send(["a"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
            time.sleep(0.1)  # the scenario: a sender that goes on trying
    sender.close(abort=True)


def test_no_sender_at_all_is_an_error_with_wait(tmp_path):
    with Receiver(f"zpull+{ipc(tmp_path)}", wait=0.5) as receiver:
        with pytest.raises(TransportError, match="no sender for 0.5 s"):
            list(receiver)


def test_binding_a_taken_port_is_a_transport_error():
    port = free_port()
    with Receiver(f"zpull://127.0.0.1:{port}"):
        with pytest.raises(TransportError, match=f"cannot bind tcp://127.0.0.1:{port}"):
            Receiver(f"zpull://127.0.0.1:{port}")


def test_batches_fan_out_to_several_receivers_and_each_sees_the_end(tmp_path):
    urls = [ipc(tmp_path, "a"), ipc(tmp_path, "b")]
    got: dict[str, list[str]] = {}

    def receive(url):
        with Receiver(f"zpull+{url}", timeout=5) as receiver:
            got[url] = [k for batch in receiver for k in batch["__key__"]]

    threads = [in_thread(receive, url) for url in urls]
    wait_for(lambda: all(os.path.exists(u[len("ipc://"):]) for u in urls), what="both receivers binding")
    send_epochs([f"zpush+{u}" for u in urls], batches=20)
    for t in threads:
        t.join(10)
    keys = got[urls[0]] + got[urls[1]]
    assert len(keys) == 40 == len(set(keys)) and got[urls[0]] and got[urls[1]]


def test_a_receiver_on_several_sockets_ends_only_after_all_of_them(tmp_path):
    """The final eof on one socket must not overtake batches still waiting on another."""
    urls = [ipc(tmp_path, "a"), ipc(tmp_path, "b")]
    with Receiver([f"zpull+{u}" for u in urls], hwm=1, timeout=10) as receiver:
        thread = in_thread(send_epochs, [f"zpush+{u}" for u in urls], epochs=2, batches=20, hwm=1)
        keys, ends = [], []
        for event in receiver.events():
            if isinstance(event, EpochEnd):
                ends.append((event.epoch, len(keys)))
            else:
                keys += event["__key__"]
                time.sleep(0.005)  # a slow consumer: both sockets fill up
    thread.join()
    assert len(keys) == 80 == len(set(keys)) and receiver.stats.lost == 0
    assert ends == [(0, 40), (1, 80)]  # each epoch's end comes after all of its batches


def test_a_sender_that_finishes_early_waits_for_the_others(tmp_path):
    """A receiver ends only when every sender has; the first one done waits, past its send timeout."""
    url = ipc(tmp_path)

    def send(rank, batches):
        with Sender(f"zpush+{url}", heartbeat=0.1, rank=rank, senders=2, group="g", send_timeout=0.5) as sender:
            for i in range(batches):
                sender.send([f"r{rank}-{i}"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
                time.sleep(0.1)  # the scenario: rank 1 sends for longer than rank 0's send timeout
            sender.end_epoch(0, final=True)

    with Receiver(f"zpull+{url}", timeout=5) as receiver:
        threads = [in_thread(send, 0, 1), in_thread(send, 1, 15)]
        keys = [k for batch in receiver for k in batch["__key__"]]
    for t in threads:
        t.join()
    assert len(keys) == 16


def test_two_receivers_on_one_bound_push_endpoint_share_the_batches(tmp_path):
    """A bound sender (zrpush) knows each receiver that connects, and tells each the end."""
    url = ipc(tmp_path)
    keys: list[list[str]] = [[], []]
    receivers: list[Receiver] = []

    def receive(i):
        with Receiver(f"zrpull+{url}", timeout=5) as receiver:
            receivers.append(receiver)
            for batch in receiver:
                keys[i].extend(batch["__key__"])
                time.sleep(0.01)  # the scenario: a slow consumer, so that one can't take every batch

    threads = [in_thread(receive, i) for i in range(2)]
    with Sender(f"zrpush+{url}", heartbeat=0.1) as sender:
        # both connected before the first batch: each has heard from the sender
        wait_for(lambda: len(receivers) == 2 and all(r.stats.senders for r in receivers),
                 what="both receivers hearing from the sender")
        for b in range(20):
            sender.send([f"e0-b{b}-0"], {"x": np.full((1, 3), b, np.int32)}, epoch=0)
        sender.end_epoch(0, final=True)
    for t in threads:
        t.join()
    assert sorted(keys[0] + keys[1]) == sorted(f"e0-b{b}-0" for b in range(20)), keys
    assert keys[0] and keys[1]


# -- CURVE --------------------------------------------------------------------------------------


needs_curve = pytest.mark.skipif(not zmq.has("curve") or zmq.zmq_version_info() < (4, 3),
                                 reason="libzmq without CURVE or handshake events")


@needs_curve
def test_curve_keys_let_the_right_client_in(tmp_path):
    generate_keys(tmp_path / "keys")
    port = free_port()
    with Receiver(f"zpull://127.0.0.1:{port}", curve=tmp_path / "keys", timeout=5) as client:
        thread = in_thread(send_epochs, f"zpush://127.0.0.1:{port}", curve=tmp_path / "keys")
        assert sum(len(b["__key__"]) for b in client) == 10
    thread.join()


def curve_dirs(tmp_path):
    """keys: the sender's; other: another tarkeys run; stranger: the right server key, but a client
    key the sender has not authorized; None: no CURVE."""
    import shutil

    generate_keys(tmp_path / "keys")
    generate_keys(tmp_path / "other")
    (tmp_path / "stranger").mkdir()
    shutil.copy(tmp_path / "keys" / "server.key", tmp_path / "stranger")
    shutil.copy(tmp_path / "other" / "client.key_secret", tmp_path / "stranger")
    return tmp_path / "keys", tmp_path / "other", tmp_path / "stranger"


@needs_curve
@pytest.mark.parametrize("receiver_binds", [True, False])
@pytest.mark.parametrize(
    "sender_keys, receiver_keys, receiver_says, sender_says",
    [
        ("keys", "other", "hung up during the CURVE handshake: it has other keys",
         "CURVE handshake with .* failed: it has other keys"),
        ("keys", "stranger", "refused this receiver's CURVE key", "is not authorized"),
        ("keys", None, "uses CURVE and this receiver does not", "does not use CURVE"),
        (None, "keys", "does not use CURVE", "uses CURVE and this sender does not"),
    ],
)
def test_mismatched_curve_keys_are_said_within_seconds(tmp_path, receiver_binds, sender_keys, receiver_keys,
                                                       receiver_says, sender_says):
    """Both sides stop with the reason, not a silent wait (for ever, with the receiver's defaults)."""
    dirs = dict(zip(("keys", "other", "stranger"), curve_dirs(tmp_path), strict=True))
    port = free_port()
    pull, push = ("zpull", "zpush") if receiver_binds else ("zrpull", "zrpush")
    failures = {}

    def send():
        with pytest.raises(TransportError) as e:
            # a connecting sender knows its peer: it says what is wrong at once (its send timeout is
            # 120 s); a listening one can't tell a receiver that hung up from a port scan: it says
            # so when its send timeout comes
            send_epochs(f"{push}://127.0.0.1:{port}", curve=dirs.get(sender_keys),
                        **({"send_timeout": 3} if not receiver_binds else {}))
        failures["sender"] = str(e.value)

    warnings = []
    with Receiver(f"{pull}://127.0.0.1:{port}", curve=dirs.get(receiver_keys), warn=warnings.append,
                  wait=4) as receiver:
        thread = in_thread(send)
        with pytest.raises(TransportError) as e:
            list(receiver)
    if "no sender for 4 s" in str(e.value):
        # a plain receiver that listens can't tell a sender that found out first and hung up from
        # a port scan: it says so, and waits on
        assert receiver_keys is None and receiver_binds and len(warnings) == 1
        assert re.search(f"a sender connected to {pull}://127.0.0.1:{port} hung up during the handshake: "
                         "a sender using CURVE", warnings[0]), warnings
    else:
        # the receiver says what is wrong, or that the sender, having found out first, hung up
        assert re.search(f"{receiver_says}|hung up during the (CURVE )?handshake", str(e.value)), str(e.value)
        assert f"127.0.0.1:{port}" in str(e.value)
    thread.join(20)  # a connecting sender's send timeout is 120 s: one that waited for it has said nothing yet
    assert "sender" in failures, "the sender did not find out within 20 s"
    message = failures["sender"]
    # the sender says why, or, when the receiver found out first and hung up, that it did
    assert re.search(f"{sender_says}|hung up during the (CURVE )?handshake", message), message


def test_a_receiver_gone_during_the_first_handshake_is_judged_when_it_does_not_come_back() -> None:
    """A receiver killed (or restarted) in the middle of a sender's first handshake hangs up as one
    with other keys does: the sender stops for it only if it hangs up again when ZMQ reconnects, or
    can't be reached again for HANGUP_GRACE seconds; a handshake that gets through forgets it."""
    from tarproc.transport import curve

    hang_up, ok = curve._NO_DETAIL, curve._SUCCEEDED
    said = "the receiver at zpush://h:1 hung up during the handshake: it uses CURVE (give --curve-keys)"

    def sender() -> curve.Handshakes:
        return curve.Handshakes("sender", curve=False, url="zpush://h:1", bound=False)

    gone = sender()
    assert gone.verdict(hang_up, 0, now=100.0) is None and gone.doubt and said in gone.doubt
    assert gone.overdue(100.0 + curve.HANGUP_GRACE - 0.1) is None
    assert said in (gone.overdue(100.0 + curve.HANGUP_GRACE) or "")
    again = sender()
    assert again.verdict(hang_up, 0, now=100.0) is None
    assert said in (again.verdict(hang_up, 0, now=100.2) or "")  # reached again, and refused again
    back = sender()
    assert back.verdict(hang_up, 0, now=100.0) is None and back.verdict(ok, 0, now=101.0) is None
    assert back.overdue(200.0) is None and back.verdict(hang_up, 0, now=201.0) is None  # a stray later: no stop


@needs_curve
def test_a_failed_handshake_after_a_good_one_does_not_stop_the_stream(tmp_path):
    """A stray client with other keys can't stop a receiver that has a sender: it is warned about."""
    keys, other, _ = curve_dirs(tmp_path)
    port = free_port()
    warnings = []
    with Receiver(f"zpull://127.0.0.1:{port}", curve=keys, timeout=5, warn=warnings.append) as receiver:

        def send():
            with Sender(f"zpush://127.0.0.1:{port}", curve=keys, heartbeat=0.1) as sender:
                wait_for(lambda: receiver.stats.senders == 1, what="the receiver hearing from its sender")
                with pytest.raises(TransportError, match="other keys"):
                    send_epochs(f"zpush://127.0.0.1:{port}", curve=other)
                sender.send(["a"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)

        thread = in_thread(send)
        assert [b["__key__"] for b in receiver] == [["a"]]
    thread.join()
    assert any("hung up during the CURVE handshake" in w for w in warnings), warnings


def test_keys_are_not_overwritten_without_force(tmp_path):
    from tarproc.errors import SinkError

    generate_keys(tmp_path)
    with pytest.raises(SinkError, match="exists; use --overwrite"):
        generate_keys(tmp_path)
    generate_keys(tmp_path, force=True)
    assert (tmp_path / "server.key_secret").stat().st_mode & 0o777 == 0o600


def test_missing_key_files_are_usage_errors(tmp_path):
    with pytest.raises(OptionError, match="no such key file"):
        Receiver(f"zpull+{ipc(tmp_path)}", curve=tmp_path)


def test_torch_tensors_share_the_received_memory(tmp_path):
    torch = pytest.importorskip("torch")
    with Receiver(f"zpull+{ipc(tmp_path)}", timeout=5) as receiver:
        thread = in_thread(send_epochs, f"zpush+{ipc(tmp_path)}")
        batches = list(receiver.torch())
    thread.join()
    assert all(isinstance(b["x"], torch.Tensor) for b in batches) and batches[1]["x"].tolist() == [[1] * 3] * 2
    assert isinstance(receiver.dataset(), torch.utils.data.IterableDataset)


# -- Receiver.dataset() and DataLoader workers --------------------------------------------------


def first_batch_error(loader):
    """The error the loader raises for its first batch, and the seconds it took.

    The loader's workers are shut down here and now: left to the garbage collector (the error's
    traceback holds the iterator in a reference cycle), torch's shutdown runs in whichever thread
    the collector interrupts, a sender's say, and waits 5 s per worker for queues it has closed.
    """
    iterator = iter(loader)
    started = time.monotonic()
    try:
        next(iterator)
    except Exception as e:  # noqa: BLE001 -- the test asserts on what it is
        error = e
    else:
        pytest.fail("the loader gave a batch")
    seconds = time.monotonic() - started
    error.__traceback__ = None
    del iterator
    return error, seconds


@pytest.mark.timeout(60)
def test_the_receiver_dataset_in_dataloader_workers_is_an_error_not_a_hang(tmp_path):
    """Its sockets live in the main process: workers would wait for batches for ever. The error
    reaches the main process at once, one line saying what to do; the same receiver then works
    with num_workers=0."""
    torch = pytest.importorskip("torch")
    from tarproc.errors import DatasetError

    url = ipc(tmp_path)
    results = {}
    with Receiver(f"zpull+{url}", timeout=10) as receiver:
        thread = in_thread(lambda: results.setdefault("stats", send_epochs(f"zpush+{url}", send_timeout=30)))
        loader = torch.utils.data.DataLoader(receiver.dataset(), batch_size=None, num_workers=2)
        error, _ = first_batch_error(loader)  # workers that waited for ever: pytest's timeout
        assert isinstance(error, DatasetError)
        message = str(error)
        assert "\n" not in message and "Traceback" not in message
        assert "num_workers=0" in message and "DataLoader worker processes" in message
        assert error.worker in (0, 1)
        # what the message says works, with the same receiver
        loader = torch.utils.data.DataLoader(receiver.dataset(), batch_size=None, num_workers=0)
        keys = [k for batch in loader for k in batch["__key__"]]
    thread.join(timeout=10)
    assert not thread.is_alive() and results["stats"].samples == 10
    assert sorted(keys) == sorted(f"e0-b{i}-{j}" for i in range(5) for j in range(2))


@pytest.mark.timeout(90)
def test_tarserve_into_dataloader_workers_fails_fast_and_the_sender_gives_up(tmp_path):
    """The real thing: tarserve in its own process. The trainer's error comes within seconds; once
    the receiver is closed, tarserve gives up after its --send-timeout, saying why."""
    torch = pytest.importorskip("torch")
    import subprocess
    import sys

    from tarhelpers import write_tar

    from tarproc.errors import DatasetError

    shard = write_tar(tmp_path / "train-0.tar", [{"__key__": f"k{i:03d}", "cls": b"%d" % (i % 3)} for i in range(40)])
    url = ipc(tmp_path)
    command = [sys.executable, "-m", "tarproc.cli.tarserve", str(shard), "--to", f"zpush+{url}", "--raw",
               "--label", "cls", "-b", "4", "--send-timeout", "3", "--heartbeat", "0.2", "-q"]
    with Receiver(f"zpull+{url}", timeout=30) as receiver:
        sender = subprocess.Popen(command, stderr=subprocess.PIPE)
        try:
            loader = torch.utils.data.DataLoader(receiver.dataset(), batch_size=None, num_workers=2)
            error, _ = first_batch_error(loader)  # workers that waited for ever: pytest's timeout
            assert isinstance(error, DatasetError) and "num_workers=0" in str(error)
        except BaseException:
            sender.kill()
            raise
    try:
        _, err = sender.communicate(timeout=45)  # not for ever: it times out
    finally:
        sender.kill()
    assert sender.returncode != 0
    assert "no receiver took" in err.decode(), err.decode()


def test_the_receiver_dataset_refuses_to_be_pickled_for_spawned_workers(tmp_path):
    torch = pytest.importorskip("torch")
    import pickle

    from tarproc.errors import DatasetError

    with Receiver(f"zpull+{ipc(tmp_path)}", timeout=5) as receiver:
        with pytest.raises(DatasetError, match=r"num_workers=0"):
            pickle.dumps(receiver.dataset())
        loader = torch.utils.data.DataLoader(receiver.dataset(), batch_size=None, num_workers=1,
                                             multiprocessing_context="spawn")
        with pytest.raises(DatasetError, match=r"can't be read in DataLoader worker processes"):
            next(iter(loader))


def test_a_receiver_refuses_to_receive_in_a_forked_child_and_the_parent_goes_on(tmp_path):
    import multiprocessing

    url = ipc(tmp_path)

    def child(receiver, queue):
        try:
            next(iter(receiver))
            queue.put("received")
        except TransportError as e:
            queue.put(str(e))
        finally:
            receiver.close()  # the parent's sockets: left alone

    with Receiver(f"zpull+{url}", timeout=5) as receiver:
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        process = context.Process(target=child, args=(receiver, queue))
        process.start()
        said = queue.get(timeout=10)
        process.join(timeout=10)
        assert process.exitcode == 0
        assert "forked from it" in said and "ZMQ sockets don't survive a fork" in said
        thread = in_thread(send_epochs, f"zpush+{url}")
        keys = [k for batch in receiver for k in batch["__key__"]]
    thread.join()
    assert len(keys) == 10


def test_the_receiver_module_needs_no_torch(tmp_path):
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "import tarproc.transport.receiver as r\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            f"with r.Receiver('zpull+{ipc(tmp_path)}', timeout=1) as receiver:\n"
            "    try:\n"
            "        receiver.dataset()\n"
            "    except ImportError:\n"
            "        print('no torch')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "no torch"


# -- acknowledged delivery ----------------------------------------------------------------------


def test_batches_a_receiver_did_not_acknowledge_go_to_the_next_one_marked(tmp_path):
    """A receiver that takes batches and never acknowledges them goes away: its replacement gets
    them, marked as sent again, then the rest; nothing is lost, and only those come twice."""
    url = ipc(tmp_path)
    progress = []
    thread = in_thread(send_epochs, f"zpush+{url}", batches=12, n=1, hwm=3, progress=progress.append)
    first = Receiver(f"zpull+{url}", ack="manual", hwm=3, timeout=5)
    events = first.events()
    held = [next(events) for _ in range(3)]  # taken, never acknowledged
    first.ack(held[0])  # ... except the first
    first._send_acks()
    wait_for(lambda: progress and progress[-1].next >= 1, what="the sender taking the acknowledgement")
    first.close()
    with Receiver(f"zpull+{url}", hwm=3, timeout=5) as second:
        again = list(second)
    thread.join()
    keys = [b["__key__"][0] for b in again]
    assert keys == [f"e0-b{i}-0" for i in range(1, 12)]
    # b1 and b2 were held; so may be b3, sent to the first receiver when it acknowledged b0
    marked = [b.redelivered for b in again]
    assert marked[:2] == [True, True] and marked == sorted(marked, reverse=True) and sum(marked) <= 3
    assert second.stats.redelivered == sum(marked) and [b.seq for b in again] == list(range(1, 12))


def test_a_batch_taken_before_is_dropped_when_it_comes_again(tmp_path):
    url = ipc(tmp_path)
    thread = in_thread(send_epochs, f"zpush+{url}", batches=4, n=1, group="g")
    with Receiver(f"zpull+{url}", timeout=5) as receiver:
        receiver.taken("g", 0, [0, 2])  # an earlier run of this consumer kept batches 0 and 2
        keys = [b["__key__"][0] for b in receiver]
    thread.join()
    assert keys == ["e0-b1-0", "e0-b3-0"] and receiver.stats.duplicates == 2


def test_positions_and_progress_follow_the_acknowledgements(tmp_path):
    url = ipc(tmp_path)
    progress = []

    def send():
        with Sender(f"zpush+{url}", heartbeat=0.1, progress=progress.append, start_seq=5,
                    skip={6: {"epoch": 0, "batch": 2, "sample": 2}}, resend_below=7) as sender:
            for i in range(4):
                sender.send([f"k{i}"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0,
                            pos={"epoch": 0, "batch": i + 1, "sample": i + 1})

    thread = in_thread(send)
    with Receiver(f"zpull+{url}", timeout=5) as receiver:
        batches = list(receiver)
    thread.join()
    assert [b.seq for b in batches] == [5, 7, 8]  # 6 was acknowledged before a restart: not sent
    assert [b.position["batch"] for b in batches] == [1, 3, 4]
    assert [b.redelivered for b in batches] == [True, False, False]  # 5 may have gone out before the restart
    assert progress[-1].next == 9 and progress[-1].above == {} and progress[-1].pos["batch"] == 4
    # every report says how far sending may have got, before it gets there
    assert all(p.resend >= p.next for p in progress) and max(p.resend for p in progress) > 8


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"credit": -1}, "bad credit -1"),
        ({"seqs": "x"}, "bad list of batch numbers"),
        ({"seqs": [1, "2"]}, "bad batch number '2'"),
        ({"receiver": ""}, "bad receiver id"),
        ({"final": 1, "eof": 0}, "'final' must be true or false"),
        ({"stop": 1}, "'stop' must be true or false"),
        ({"v": 1}, "wire format version 1, from an older tarproc"),
        ({"kind": "batch"}, "a 'batch' message where an ack was expected"),
    ],
)
def test_malformed_acks_are_wire_errors(fields, message):
    from tarproc.transport.wire import decode_ack

    ack = {"v": 2, "kind": "ack", "receiver": "r:1", "credit": 1, "seqs": [], **fields}
    with pytest.raises(WireError, match=message):
        decode_ack([msgpack.packb(ack)])


def test_a_frame_over_the_receivers_limit_is_refused_by_the_sender(tmp_path):
    url = ipc(tmp_path)

    def send():
        with Sender(f"zpush+{url}", heartbeat=0.1) as sender:
            sender.send(["a"], {"x": np.zeros((1, 2000), np.uint8)}, epoch=0)

    errors = []
    thread = in_thread(lambda: errors.append(pytest.raises(TransportError, send)))
    with Receiver(f"zpull+{url}", timeout=5, max_message_size=1000) as receiver, \
            pytest.raises(TransportError, match=r"stopped before the end of its stream \(failed\)"):
        list(receiver)
    thread.join()
    assert "has a frame of 2000 bytes, over what the receivers accept" in str(errors[0].value)


def test_without_acknowledgements_a_live_receiver_still_gets_everything(tmp_path):
    """``ack=False`` (what the benchmark compares against): bounded by the high-water mark only,
    every batch and the end still arrive, the end after a full queue has room again."""
    url = ipc(tmp_path)
    thread = in_thread(send_epochs, f"zpush+{url}", epochs=2, batches=20, n=1, hwm=1, ack=False)
    with Receiver(f"zpull+{url}", hwm=1, timeout=5) as receiver:
        events = []
        for event in receiver.events():
            events.append(event)
            time.sleep(0.002)  # the scenario: a slow consumer
    thread.join()
    assert [e.seq for e in events if not isinstance(e, EpochEnd)] == list(range(40))
    assert [e for e in events if isinstance(e, EpochEnd)] == [EpochEnd(0, 20, 20), EpochEnd(1, 20, 20)]


def test_a_peer_cannot_grow_the_senders_table_for_ever(tmp_path, monkeypatch):
    import tarproc.transport.receiver as receiver_module

    monkeypatch.setattr(receiver_module, "MAX_SENDERS", 2)
    url = ipc(tmp_path)
    warnings = []
    context = zmq.Context()
    stray = context.socket(zmq.DEALER)
    with Receiver(f"zpull+{url}", wait=1, timeout=1, warn=warnings.append) as receiver:
        stray.connect(url)
        for rank in range(3):
            stray.send_multipart(control("hello", sender=f"h:1:{rank}", group="g", rank=rank, senders=3))
        with pytest.raises(TransportError):
            list(receiver)
    stray.close(0)
    context.term()
    assert len(receiver._senders) == 2 and receiver.stats.rejected == 1
    assert any("a message from sender h:1:2, after 2 others: this receiver keeps track of no more" in w
               for w in warnings), warnings


def test_a_header_over_the_receivers_limit_is_refused_too(tmp_path):
    """ZMQ's limit is on every frame: a batch whose header alone is over it is never sent."""
    url = ipc(tmp_path)

    def send():
        with Sender(f"zpush+{url}", heartbeat=0.1, send_timeout=5) as sender:
            sender.send(["k" * 500], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)

    errors = []
    thread = in_thread(lambda: errors.append(pytest.raises(TransportError, send)))
    with Receiver(f"zpull+{url}", timeout=5, max_message_size=400) as receiver, \
            pytest.raises(TransportError, match="stopped before the end of its stream"):
        list(receiver)
    thread.join()
    assert "over what the receivers accept" in str(errors[0].value)


def test_an_ack_meant_for_another_stream_is_not_taken(tmp_path):
    """Acks queued for an earlier process on the same endpoint (same host, pid and rank: a
    restarted container) must not acknowledge another stream's batches."""
    from tarproc.transport.wire import ack

    url = ipc(tmp_path)
    progress = []
    sender = Sender(f"zrpush+{url}", heartbeat=0.1, group="mine", progress=progress.append)
    context = zmq.Context()
    peer = context.socket(zmq.DEALER)  # a receiver, by hand
    peer.connect(url)
    peer.send_multipart(ack("r:1", credit=4))
    sender.send(["a"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
    while True:
        header = msgpack.unpackb(peer.recv_multipart()[0])
        if header["kind"] == "batch":
            break
    peer.send_multipart(ack("r:1", to=(header["sender"], "theirs"), credit=1, seqs=[0]))
    time.sleep(0.5)  # something that must not happen: given a moment to happen
    assert progress[-1].next == 0  # not taken
    peer.send_multipart(ack("r:1", to=(header["sender"], "mine"), credit=1, seqs=[0]))
    wait_for(lambda: progress[-1].next != 0, what="the acknowledgement taken")
    assert progress[-1].next == 1
    sender.close(abort=True)
    peer.close(0)
    context.term()


@pytest.mark.parametrize("url, message", [
    ("zpull://:{", "unbalanced braces"), ("zpull://h:{1..99999999999}", "expands to more than"),
    ("zpull://h\ud800:7880", "lone surrogate"),
])
def test_endpoint_urls_get_the_input_urls_checks(url, message):
    with pytest.raises(OptionError, match=message):
        parse_endpoints(url, sending=False)


def _checkpoint_text(change: dict) -> str:
    import json

    from tarproc.transport import checkpoint as checkpoints

    pos = {"epoch": 0, "batch": 1, "sample": 4, "sent": 4, "shard": "a.tar", "index": 3}
    data = {"format": checkpoints.FORMAT, "version": checkpoints.VERSION, "group": "g", "done": False, "stream": {},
            "ranks": {"0": {"next": 1, "above": [], "resend": 1, "pos": pos}}}
    for path, value in change.items():
        *parents, last = path.split(".")
        target = data
        for p in parents:
            target = target[p]
        target[last] = value
    return json.dumps(data)


@pytest.mark.parametrize("change", [
    {"stream": [1]}, {"ranks": "x"}, {"ranks.0.pos": {"epoch": "0"}}, {"ranks.0.pos.batch": 2**64},
    {"ranks.0.pos.shard": 5}, {"ranks.0.next": 10**30}, {"ranks.0": 5}, "deep",
])
def test_a_damaged_checkpoint_is_a_checkpoint_error_naming_the_file(tmp_path, change):
    from tarproc.transport import checkpoint as checkpoints

    path = tmp_path / "serve.ckpt"
    path.write_text(_checkpoint_text({}))
    assert checkpoints.load(str(path), {}) is not None  # the undamaged one loads
    path.write_text("[" * 100_000 + "]" * 100_000 if change == "deep" else _checkpoint_text(change))
    with pytest.raises(checkpoints.CheckpointError, match="not a usable tarserve checkpoint"):
        checkpoints.load(str(path), {})


def test_a_bound_sender_trusts_no_peer_beyond_its_hwm(tmp_path):
    """A peer's credit of 10**12 is capped at --hwm (the sender would hold every batch for it); a
    greeting that takes no frame (max_frame 0) is not a receiver of ours, nor is an ack addressed to
    another sender: neither stops the stream nor is waited for at its end."""
    from tarproc.transport.wire import ack

    url = ipc(tmp_path)
    context = zmq.Context()
    greedy, tiny, stranger = (context.socket(zmq.DEALER) for _ in range(3))
    for sock in (greedy, tiny, stranger):
        sock.connect(url)
    got: list[str] = []

    def receive() -> None:
        with contextlib.suppress(TransportError), Receiver(f"zrpull+{url}", timeout=3) as receiver:
            for batch in receiver:  # the end: the sender is closed with batches the greedy peer holds
                got.extend(batch["__key__"])

    sender = Sender(f"zrpush+{url}", heartbeat=0.1, hwm=2, send_timeout=20)
    tiny.send_multipart(ack("r:tiny", credit=8, max_frame=0))
    stranger.send_multipart(ack("r:other", to=("someone-else", "theirs"), credit=8))
    greedy.send_multipart(ack("r:greedy", credit=10**12))
    time.sleep(0.3)  # its credit heard of first (were it not, fewer batches would go to it: the test holds)
    thread = in_thread(receive)
    for i in range(12):
        sender.send([f"k{i}"], {"x": np.zeros((1, 1), np.uint8)}, epoch=0)
    sender.end_epoch(0, final=True)
    batches_to_greedy = 0
    while greedy.poll(200):
        if msgpack.unpackb(greedy.recv_multipart()[0]).get("kind") == "batch":
            batches_to_greedy += 1
    assert batches_to_greedy <= 2  # its credit was capped at the hwm; the others went to the receiver
    assert not tiny.poll(100) or msgpack.unpackb(tiny.recv_multipart()[0]).get("kind") != "batch"
    sender.close(abort=True)
    thread.join(timeout=30)
    for sock in (greedy, tiny, stranger):
        sock.close(0)
    context.term()
    assert len(got) >= 10 and len(set(got)) == len(got)


def test_a_pausing_sender_waits_until_a_receiver_that_fell_behind_has_read_the_pause(tmp_path, monkeypatch):
    """A receiver whose consumer stopped reading has a full queue (its high-water mark), so libzmq
    stops reading that connection and drops what is still in it when the sender closes it: a
    pause sent then, by a sender that did not wait for the receiver to acknowledge it, was lost,
    and the receiver took the paused sender for dead."""
    from tarproc.transport.delivery import Delivery

    told, waiting = threading.Event(), threading.Event()
    send, service = Delivery._send, Delivery._service

    def spy_send(self, index, rid, frames, copy=True):
        sent = send(self, index, rid, frames, copy)
        if sent and b"paused" in bytes(frames[0]):
            told.set()
        return sent

    def spy_service(self):
        if told.is_set():
            waiting.set()  # still here after telling the receiver: waiting for it to have read it
        service(self)

    beats = []
    beat = Delivery._beat

    def spy_beat(self, index):
        beats.append(index)
        beat(self, index)

    monkeypatch.setattr(Delivery, "_send", spy_send)
    monkeypatch.setattr(Delivery, "_service", spy_service)
    monkeypatch.setattr(Delivery, "_beat", spy_beat)

    class Paused(Exception):
        pass

    said = []

    def warn(message):
        said.append(message)
        if "paused" in message:
            raise Paused

    def stop_politely():
        with contextlib.suppress(KeyboardInterrupt), Sender(f"zpush+{ipc(tmp_path)}", heartbeat=0.05,
                                                            resumable=True) as sender:
            for i in range(6):
                sender.send([f"k{i}"], {"x": np.full((1, 3), i)}, epoch=0)
            wait_for(lambda: sender.stats.batches >= 4)  # all its credit: the receiver's queue holds 3 of them
            after = len(beats)
            wait_for(lambda: len(beats) >= after + 2)  # and heartbeats: its high-water mark (4) is reached
            raise KeyboardInterrupt  # a polite stop of a resumable stream: a pause

    with Receiver(f"zpull+{ipc(tmp_path)}", timeout=5, warn=warn) as receiver:
        thread = in_thread(stop_politely)
        events = receiver.events()
        taken = [next(events)]  # and then the consumer falls behind
        wait_for(lambda: waiting.is_set() or not thread.is_alive())  # the sender waits, or it is gone
        with pytest.raises(Paused):
            for event in events:
                taken.append(event)
    thread.join()
    assert told.is_set() and len(taken) == 4 and not any("hung up" in s for s in said), said
