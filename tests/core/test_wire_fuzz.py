"""A small deterministic fuzzer of wire format v1's decoder.

It mutates valid messages (bit flips, truncation, length fields, frames added, dropped or resized,
random msgpack objects put in the header) and feeds them to ``decode``: every input must decode,
or be a ``MessageError`` with a short one-line reason. Nothing else may come out of the decoder.
"""

from __future__ import annotations

import random
import resource
import time
from typing import Any

import msgpack
import numpy as np
import pytest

from tarproc.errors import WireError
from tarproc.transport.wire import MessageError, control, decode, encode_batch, to_batch

SEED = 1414
ROUNDS = 30_000  # about 2 s; the time cap below only guards a slow machine
TIME_CAP = 8.0
IDS = {"sender": "host:1:0", "group": "g", "rank": 0, "senders": 1}


def valid_messages() -> list[list[bytes]]:
    ragged = [np.zeros((2, 3), np.float32), np.ones((1, 1), np.float32), np.zeros((0, 2), np.float32)]
    return [
        [bytes(memoryview(f)) for f in encode_batch(
            ["a", "b", "c"],
            {"image": np.arange(3 * 2 * 2, dtype=np.uint8).reshape(3, 2, 2), "cls": np.array([1, 2, 3]),
             "mask": ragged, "json": [b'{"x": 1}', None, b""], "w": np.zeros(3, np.uint16)},
            text=["cls"], bfloat16=["w"], **IDS, epoch=1, seq=5, dest=0)],
        [bytes(memoryview(f)) for f in encode_batch([], {"x": np.zeros((0, 4), np.int16)}, **IDS, epoch=0, seq=0)],
        control("eof", **IDS, epoch=1, final=True, batches=3, samples=9, seq=6, dest=0),
        control("eof", **IDS, aborted=True, final=True, reason="failed"),
        control("heartbeat", **IDS),
        control("hello", **IDS, host="h", pid=1, pattern="push", dest=0),
    ]


def random_object(rng: random.Random, depth: int = 0) -> Any:
    """Any msgpack value, small: the header's own kinds, and the ones it never has."""
    choice = rng.randrange(14 if depth < 3 else 9)
    if choice == 0:
        return rng.choice([0, 1, -1, -33, 127, 128, 255, 256, 2**31, 2**32, 2**63 - 1, -(2**63), 2**64 - 1])
    if choice == 1:
        return rng.randrange(-(2**20), 2**20)
    if choice == 2:
        return rng.choice([0.0, -1.5, float("inf"), float("nan"), 1e300])
    if choice == 3:
        return rng.choice([None, True, False])
    if choice == 4:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 32), rng.randrange(0x80, 0x3000)]))
                       for _ in range(rng.randrange(0, 12)))
    if choice == 5:
        return rng.randbytes(rng.randrange(0, 12))
    if choice == 6:
        return rng.choice(["batch", "eof", "hello", "heartbeat", "bytes", "uint8", "int64", "float32",
                           "bfloat16", "bool", "__key__", "x", "", "v", "text", "shape", "shapes", "sizes"])
    if choice == 7:
        return msgpack.ExtType(rng.randrange(128), rng.randbytes(rng.randrange(0, 4)))
    if choice == 8:
        return rng.choice([[], {}, [0], [1, 2], [[1, 2]], [None], [2**40, 0]])
    if choice in (9, 10, 11):
        return [random_object(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    keys = ["v", "kind", "name", "dtype", "shape", "shapes", "sizes", "text", "n", "keys", "tensors", "x"]
    other_keys: list[Any] = [0, -1, 2**40, b"name", None, True, 1.5, "", "\x00"]
    return {rng.choice(keys) if rng.random() < 0.8 else rng.choice(other_keys): random_object(rng, depth + 1)
            for _ in range(rng.randrange(0, 5))}


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a decoded header (map keys and list indices), for replacing a subtree."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


def replace_at(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replace_at(value[path[0]], path[1:], new)
    return copy


def pack(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError):
        return msgpack.packb(None)


LENGTH_MARKERS = {0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4, 0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}


def mutate(rng: random.Random, frames: list[bytes], others: list[list[bytes]]) -> list[bytes]:
    frames = list(frames)
    head = bytearray(frames[0])
    how = rng.choices(range(12), weights=[10, 5, 5, 10, 10, 10, 10, 8, 7, 5, 5, 15])[0]
    try:  # the header as a value, if a mutation before this one left it msgpack
        header = msgpack.unpackb(bytes(head), raw=False, strict_map_key=False)
    except Exception:  # noqa: BLE001 - msgpack raises several types on garbage
        how = rng.choice([0, 1, 2, 7, 8, 9, 10] if head else [2, 7, 8, 9, 10])
    if how == 11:  # a tensor entry's field (or a new one: "text", "shapes") set to something else
        entries = header.get("tensors") if isinstance(header, dict) else None
        if isinstance(entries, list) and entries and all(isinstance(e, dict) for e in entries):
            index = rng.randrange(len(entries))
            entry = dict(entries[index])
            field = rng.choice(["name", "dtype", "shape", "shapes", "sizes", "text", "text", "text"])
            entry[field] = rng.choice([True, True, False, 1, "yes", None]) if field == "text" and rng.random() < 0.7 \
                else random_object(rng, 1)
            header = dict(header, tensors=[*entries[:index], entry, *entries[index + 1:]])
            return [pack(header), *frames[1:]]
        how = 4
    if how == 0:  # bit flips in the header
        for _ in range(rng.randrange(1, 8)):
            i = rng.randrange(len(head))
            head[i] ^= 1 << rng.randrange(8)
    elif how == 1:  # a truncated header
        del head[rng.randrange(len(head)):]
    elif how == 2:  # trailing bytes after the header's map
        head += rng.randbytes(rng.randrange(1, 6))
    elif how == 3:  # a length (of a list, map, string or bin) made to claim more, or less
        spots = [i for i, b in enumerate(head) if b in LENGTH_MARKERS or 0x80 <= b <= 0xBF]
        if spots:
            i = rng.choice(spots)
            marker = head[i]
            if marker in LENGTH_MARKERS:
                width = LENGTH_MARKERS[marker]
                head[i + 1:i + 1 + width] = rng.randrange(256 ** width).to_bytes(width, "big")
            elif rng.random() < 0.5:  # fixmap, fixarray, fixstr: another count in the same form
                head[i] = (marker & 0xE0 if marker >= 0xA0 else marker & 0xF0) | rng.randrange(16 if marker < 0xA0 else 32)
            else:  # the long form, with a count of up to 2^32 - 1
                long = 0xDF if marker < 0x90 else 0xDD if marker < 0xA0 else 0xDB
                head[i:i + 1] = bytes([long]) + rng.choice([0, 1, 2**16, 2**20 + 1, 2**32 - 1]).to_bytes(4, "big")
    elif how in (4, 5, 6):  # a random msgpack value somewhere in the header
        head = bytearray(pack(replace_at(header, rng.choice(paths(header)), random_object(rng))))
    elif how == 7:  # a data frame resized
        if len(frames) > 1:
            i = rng.randrange(1, len(frames))
            frames[i] = frames[i][: rng.randrange(len(frames[i]) + 1)] + rng.randbytes(rng.randrange(3))
    elif how == 8:  # frames dropped, duplicated or added
        if rng.random() < 0.5 and len(frames) > 1:
            del frames[rng.randrange(1, len(frames))]
        else:
            frames.insert(rng.randrange(1, len(frames) + 1), rng.randbytes(rng.randrange(6)))
    elif how == 9:  # one message's header with another's frames
        frames = [bytes(head), *rng.choice(others)[1:]]
    else:  # random bytes, or a random msgpack value, as the whole header
        head = bytearray(rng.randbytes(rng.randrange(0, 40)) if rng.random() < 0.3 else pack(random_object(rng)))
    return [bytes(head), *frames[1:]]


def test_mutated_messages_decode_or_are_message_errors() -> None:
    rng = random.Random(SEED)
    messages = valid_messages()
    for frames in messages:
        decode(frames)  # the seeds are valid
    outcomes = {"decoded": 0, "rejected": 0}
    started = time.monotonic()
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for round_ in range(ROUNDS):
        frames = messages[0] if rng.random() < 0.5 else rng.choice(messages)
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            frames = mutate(rng, frames, messages)
        try:
            message = decode(frames, "tcp://fuzz")
        except MessageError as e:
            outcomes["rejected"] += 1
            text = str(e)
            assert "\n" not in text and len(text) < 600, (round_, text)
            continue
        except Exception as e:  # noqa: BLE001 - the point of the test
            pytest.fail(f"round {round_}: {type(e).__name__}: {e} for frames {[bytes(f)[:200] for f in frames]!r}")
        outcomes["decoded"] += 1
        if message.kind == "batch":
            batch = to_batch(message)
            assert batch.size == message.header["n"] and set(batch) == {"__key__", *message.tensors}
            assert batch.text <= {n for n, v in batch.items() if isinstance(v, np.ndarray) and v.ndim == 1}
        if time.monotonic() - started > TIME_CAP:
            break
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before) / 1024
    assert grown < 200, f"peak memory grew by {grown:.0f} MB"
    # the mutations reach past the first checks: both outcomes are common
    assert outcomes["rejected"] > ROUNDS / 4 and outcomes["decoded"] > ROUNDS / 50, outcomes


def test_message_errors_are_wire_errors() -> None:
    """Code that catches WireError (the receiver, users' code) catches the decoder's errors."""
    with pytest.raises(WireError):
        decode([b"\xc1"])
