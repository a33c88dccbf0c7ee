"""Wire format v2: one ZMQ multipart message per batch, a msgpack header and one raw frame per tensor.

Frame 0 is a msgpack map::

    {"v": 2, "kind": "batch", "sender": "host:pid:rank", "group": "…", "rank": 0, "senders": 2,
     "epoch": 0, "seq": 17, "n": 256, "keys": ["k0", …],
     "tensors": [{"name": "image", "dtype": "uint8", "shape": [256, 224, 224, 3]},
                 {"name": "cls", "dtype": "int64", "shape": [256], "text": true},
                 {"name": "json", "dtype": "bytes", "sizes": [81, null, …]}]}

followed by the tensors' frames in order: a stacked tensor (``shape``) is one frame of
little-endian C-order bytes; a ragged one (``shapes``, one shape per sample) is one frame per
sample; a ``bytes`` field is one frame per sample that has it (``sizes`` gives each length,
``null`` where the sample lacks the field). ``kind`` is also ``hello``, ``eof`` (an epoch's end,
with counts) or ``heartbeat``, which carry no frames; and ``ack``, the one message a receiver
sends back (credit for more batches, the batches its consumer took: see docs/wire.md). No pickle anywhere: a receiver never runs
code from the network, and checks every size before it touches a frame.

What decoding a header may cost is bounded: a header is at most ``MAX_HEADER`` bytes and holds
at most ``MAX_CONTAINERS`` lists and maps, so no message, however built, makes a receiver spend
more than about 150 MB (for a moment) or a few hundred milliseconds on its header.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from ..errors import WireError
from .shm import open_shared

VERSION = 2
KINDS = ("hello", "batch", "eof", "heartbeat")  # sender -> receiver
ACK = "ack"  # receiver -> sender
MAX_ACKS = 1 << 16  # batch numbers in one ack
DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "bfloat16",
)
BYTES = "bytes"
# A msgpack header can cost far more to decode than its size: one byte makes an empty map (64
# bytes of Python object), one byte a new int object (-6 to -32: 28 bytes). The limits below keep
# the worst case near 40 times MAX_HEADER. A real batch header needs its keys, one size per raw
# field and one shape per ragged tensor for each sample: about 30-100 bytes a sample, so 4 MiB
# holds batches of tens of thousands of samples.
MAX_HEADER = 4 << 20
MAX_CONTAINERS = 1 << 18  # lists and maps in one header: 4 ragged tensors of a 65536-sample batch
MAX_SAMPLES = 1 << 20  # per batch (and per list in a header)
MAX_MAP_KEYS = 64
MAX_STRING = 1 << 20  # one string (a key, a name) in a header
MAX_ID = 512  # characters of a sender id or group id
MAX_DIMENSION = 1 << 40
MAX_SHARED = 1 << 36  # bytes of one tensor in shared memory (the file must hold them: this bounds the header)
_INTEGERS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_ITEMSIZE = {name: (2 if name == "bfloat16" else np.dtype(name).itemsize) for name in DTYPES}


def bfloat16_dtype() -> np.dtype[Any]:
    """numpy's bfloat16 (from ml_dtypes, which jax and torch users have), else uint16 bit patterns."""
    try:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    except ImportError:
        return np.dtype(np.uint16)


@dataclass
class Message:
    """A decoded message: its kind, the header map and, for a batch, the tensors by name."""

    kind: str
    header: dict[str, Any]
    tensors: dict[str, Any] = field(default_factory=dict)
    nbytes: int = 0
    connection: tuple[int, bytes] | None = None  # the receiving socket's number, and the peer's routing id


class MessageError(WireError):
    """A received message that is not wire format v2, and where it came from.

    ``reason`` says what is wrong; ``url`` is the receiving endpoint; ``peer`` is the connection's
    origin as ZMQ knows it (the sender's IP address over TCP, its process over ipc), and ``sender``
    the sender id the header gives, when the header got that far.
    """

    def __init__(self, reason: str, url: str | None = None, peer: str | None = None,
                 sender: str | None = None) -> None:
        self.reason = reason
        self.peer = peer
        self.sender = sender
        super().__init__(f"message {self.origin}: {reason}" if self.origin else reason, url)

    @property
    def origin(self) -> str:
        """``from PEER (sender ID)``, as much of it as is known."""
        parts = [f"from {self.peer}"] if self.peer else []
        if self.sender:
            parts.append(f"(sender {self.sender})" if parts else f"from sender {self.sender}")
        return " ".join(parts)


class Batch(dict):  # type: ignore[type-arg]
    """A received batch: ``{"__key__": [...], name: array or list, ...}`` plus where it came from.

    Stacked tensors are numpy arrays over the received frames (no copy); ragged tensors are lists
    of arrays; bytes fields are lists of ``bytes`` (``None`` where a sample lacks the field).
    ``dtypes`` names each tensor's wire dtype (``bfloat16`` arrives as ml_dtypes.bfloat16 when that
    is installed, else as uint16 bit patterns). ``text`` names the integer tensors that were
    text fields (``--label``).
    """

    sender: str
    group: str
    rank: int
    epoch: int
    seq: int
    nbytes: int
    dtypes: dict[str, str]
    text: set[str]
    redelivered: bool  # sent before to a receiver that died before its consumer took it
    acked: bool  # its sender waits for an acknowledgement
    connection: tuple[int, bytes] | None  # where it came from, to acknowledge it
    position: dict[str, Any] | None  # where the sender's stream is after this batch (see docs/wire.md)

    @property
    def size(self) -> int:
        """The number of samples."""
        return len(self["__key__"])


def _header(kind: str, fields: dict[str, Any]) -> bytes:
    return msgpack.packb({"v": VERSION, "kind": kind, **fields}, use_bin_type=True)


def control(kind: str, **fields: Any) -> list[bytes]:
    """A hello, eof or heartbeat message (one frame)."""
    if kind not in KINDS or kind == "batch":
        raise ValueError(f"not a control message kind: {kind!r}")
    return [_header(kind, fields)]


def wire_dtype(array: np.ndarray) -> str:
    """The wire name of an array's dtype; a dtype outside the wire format is a ``WireError``."""
    name = array.dtype.name
    if name not in DTYPES:
        raise WireError(f"dtype {array.dtype} can't be sent (wire format v{VERSION} has {', '.join(DTYPES)} and bytes)")
    return name


def _frame(array: np.ndarray) -> Any:
    """The array's bytes as a buffer ZMQ can send without a copy (little-endian, C order)."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    array = np.ascontiguousarray(array)
    return array.reshape(-1).view(np.uint8) if array.size else b""


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch"):  # a torch tensor, without importing torch
        tensor = value.detach().cpu().contiguous()
        if str(tensor.dtype) == "torch.bfloat16":
            return tensor.view(_torch_int16()).numpy().view(bfloat16_dtype() if _has_ml_dtypes() else np.uint16)
        return tensor.numpy()  # type: ignore[no-any-return]
    return np.asarray(value)


def _torch_int16() -> Any:
    import torch

    return torch.int16


def _has_ml_dtypes() -> bool:
    return bfloat16_dtype() != np.dtype(np.uint16)


def encode_batch(
    keys: Sequence[str],
    tensors: dict[str, Any],
    *,
    text: Iterable[str] = (),
    bfloat16: Iterable[str] = (),
    shared: dict[str, str] | None = None,
    **fields: Any,
) -> list[Any]:
    """The frames of a batch message: header first, then each tensor's frames (no copies).

    ``tensors`` maps names to an array (or torch tensor) whose first dimension is the batch, a
    list of arrays (ragged), or a list of ``bytes``/``None`` (a raw field). ``text`` names integer
    tensors made from text fields (each must be a 1-D integer array of the batch's length: a
    label per sample); ``bfloat16`` names uint16 arrays that hold bfloat16 bits. A batch whose
    header would be over ``MAX_HEADER`` (far too many samples, very long keys) is a ``WireError``.
    ``shared`` maps stacked tensors to the shared-memory file that holds their bytes (``shm``, for
    a receiver on this host): they get no frame.

    >>> ids = {"sender": "host:1:0", "group": "g", "rank": 0, "senders": 1}
    >>> frames = encode_batch(["a", "b"], {"x": np.arange(6, dtype=np.int32).reshape(2, 3)}, **ids, epoch=0, seq=0)
    >>> message = decode(frames)
    >>> message.tensors["x"].tolist(), message.header["keys"]
    ([[0, 1, 2], [3, 4, 5]], ['a', 'b'])
    """
    n = len(keys)
    entries: list[dict[str, Any]] = []
    frames: list[Any] = []
    text, bfloat16 = set(text), set(bfloat16)
    unknown = sorted((text | bfloat16) - set(tensors))
    if unknown:
        option = "text" if unknown[0] in text else "bfloat16"
        raise WireError(f"{option} names {unknown[0]!r}, which is not a tensor of the batch")
    for name, value in tensors.items():
        if name in text and (isinstance(value, list) or name in bfloat16):
            raise WireError(f"tensor {name!r} can't be text: only a 1-D integer tensor can (a label per sample)")
        if isinstance(value, list) and all(v is None or isinstance(v, (bytes, bytearray, memoryview)) for v in value):
            if len(value) != n:
                raise WireError(f"field {name!r} has {len(value)} values for {n} samples")
            if name in bfloat16:
                raise WireError(f"field {name!r} of bytes can't be sent as bfloat16 (needs uint16 bits)")
            entries.append({"name": name, "dtype": BYTES, "sizes": [None if v is None else len(v) for v in value]})
            frames.extend(v for v in value if v is not None)
            continue
        if isinstance(value, list):
            arrays = [_as_array(v) for v in value]
            if len(arrays) != n:
                raise WireError(f"tensor {name!r} has {len(arrays)} arrays for {n} samples")
            dtypes = {wire_dtype(a) for a in arrays}
            if len(dtypes) > 1:
                raise WireError(f"tensor {name!r} mixes dtypes {sorted(dtypes)}")
            dtype = "bfloat16" if name in bfloat16 else (dtypes.pop() if dtypes else "uint8")
            if name in bfloat16 and dtypes - {"uint16", "bfloat16"}:
                raise WireError(f"tensor {name!r} of {dtypes.pop()} can't be sent as bfloat16 (needs uint16 bits)")
            entries.append({"name": name, "dtype": dtype, "shapes": [list(a.shape) for a in arrays]})
            frames.extend(_frame(a) for a in arrays)
            continue
        array = _as_array(value)
        if array.ndim == 0 or array.shape[0] != n:
            raise WireError(f"tensor {name!r} of shape {array.shape} is not a batch of {n}")
        dtype = wire_dtype(array)
        if name in bfloat16 and dtype not in ("uint16", "bfloat16"):
            raise WireError(f"tensor {name!r} of {dtype} can't be sent as bfloat16 (needs uint16 bits)")
        entry: dict[str, Any] = {"name": name, "dtype": "bfloat16" if name in bfloat16 else dtype,
                                 "shape": list(array.shape)}
        if name in text:
            if dtype not in _INTEGERS or array.ndim != 1:
                raise WireError(f"tensor {name!r} ({dtype}, shape {list(array.shape)}) can't be text: "
                                "only a 1-D integer tensor can (a label per sample)")
            entry["text"] = True
        entries.append(entry)
        if shared and name in shared:
            entry["shm"] = shared[name]
        else:
            frames.append(_frame(array))
    header = _header("batch", {**fields, "n": n, "keys": list(keys), "tensors": entries})
    if len(header) > MAX_HEADER:
        raise WireError(f"the header of a batch of {n} samples would be {len(header)} bytes, over the "
                        f"wire format's limit of {MAX_HEADER}: send smaller batches")
    return [header, *frames]


def _buffer(frame: Any) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def _show(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: error messages quote what a peer sent, which
    may be a megabyte-long string or a list of a million items."""
    if isinstance(value, (list, dict)) and len(value) > limit:
        return f"<{type(value).__name__} of {len(value)} items>"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def peer_address(frame: Any) -> str | None:
    """Where a received ``zmq.Frame`` came from, as ZMQ knows it: the sender's IP address over TCP,
    ``process PID (uid UID)`` over ipc; None when unknown (bytes, an inproc socket)."""
    try:
        address = frame.get("Peer-Address")
    except Exception:  # noqa: BLE001 - not a zmq.Frame, an old libzmq, a transport without one
        return None
    if not isinstance(address, str) or not address:
        return None
    parts = address.split(":")
    if len(parts) == 4 and parts[0] == "localhost" and all(p.isdigit() for p in parts[1:]):
        return f"process {parts[3]} (uid {parts[1]})"  # ipc: the peer's credentials
    return address


def _peer_pid(frame: Any) -> int | None:
    """The process id of an ipc peer, from the socket's credentials (None when unknown)."""
    try:
        address = frame.get("Peer-Address")
    except Exception:  # noqa: BLE001 - not a zmq.Frame, an old libzmq, a transport without one
        return None
    parts = address.split(":") if isinstance(address, str) else []
    if len(parts) == 4 and parts[0] == "localhost" and parts[3].isdigit():
        return int(parts[3])
    return None


def may_map_from(frame: Any) -> bool:
    """Whether the ipc peer that sent ``frame`` can map this process's shared-memory files: it is
    known (its socket credentials), and it is this user or root (else ``/proc/PID/fd`` is closed to it)."""
    try:
        address = frame.get("Peer-Address")
    except Exception:  # noqa: BLE001 - not a zmq.Frame, an old libzmq, a transport without one
        return False
    parts = address.split(":") if isinstance(address, str) else []
    return (len(parts) == 4 and parts[0] == "localhost" and parts[1].isdigit() and parts[3].isdigit()
            and int(parts[1]) in (0, os.geteuid()))


class _TooManyContainers(Exception):
    pass


def _unpack_header(head: memoryview) -> Any:
    """msgpack's own limits bound each list, map and string; ``MAX_CONTAINERS`` bounds how many
    lists and maps there are in all (each costs 56+ bytes of Python object for a byte of header)."""
    budget = MAX_CONTAINERS

    def count(container: Any) -> Any:
        nonlocal budget
        budget -= 1
        if budget < 0:
            raise _TooManyContainers
        return container

    return msgpack.unpackb(head, raw=False, strict_map_key=True, max_array_len=MAX_SAMPLES,
                           max_map_len=MAX_MAP_KEYS, max_str_len=MAX_STRING, max_bin_len=MAX_STRING,
                           max_ext_len=0, list_hook=count, object_hook=count)


def decode(frames: Sequence[Any], url: str | None = None, shm: bool = False) -> Message:
    """Check and decode one received message (``zmq.Frame`` objects or bytes) without copying.

    Anything that is not wire format v2 is a ``MessageError`` (a ``WireError``) saying what is
    wrong and where the message came from; checking costs at most ~150 MB and a fraction of a
    second, however the message was made. ``shm``: tensors in shared memory are taken (a socket
    whose peers are on this host, which was told so).
    """
    header: Any = None
    try:
        if not frames:
            raise WireError("empty message")
        header = _read_header(frames[0])
        kind = _check_header(header)
        if kind != "batch":
            if len(frames) != 1:
                raise WireError(f"{kind} message with {len(frames) - 1} extra frames")
            if kind == "eof":
                _check_eof(header)
            return Message(kind, header)
        return _decode_batch(header, frames, shm)
    except WireError as e:
        raise _message_error(e, frames, header, "sender", url) from None


def _read_header(frame: Any) -> dict[str, Any]:
    head = _buffer(frame)
    if len(head) > MAX_HEADER:
        raise WireError(f"header of {len(head)} bytes is over the limit of {MAX_HEADER}")
    try:
        header = _unpack_header(head)
    except _TooManyContainers:
        raise WireError(f"not a wire format message (header has over {MAX_CONTAINERS} lists and maps)") from None
    except Exception as e:  # msgpack raises several unrelated types on garbage
        detail = str(e)
        if detail:
            detail = ": " + (detail[:200] if detail.isprintable() else _show(detail, 200))
        raise WireError(f"not a wire format message (header is not msgpack: {type(e).__name__}{detail})") from None
    if not isinstance(header, dict):
        raise WireError("not a wire format message (header is not a map)")
    return header  # type: ignore[no-any-return]


def _check_header(header: dict[str, Any]) -> str:
    """The checks every message's header passes; returns its kind."""
    _check_version(header)
    kind = header.get("kind")
    if kind not in KINDS:
        raise WireError(f"unknown message kind {_show(kind)}")
    for name in ("sender", "group"):
        value = header.get(name)
        if not isinstance(value, str) or not value:
            raise WireError(f"{kind} message without a {name} id")
        if len(value) > MAX_ID or not value.isprintable():
            raise WireError(f"{kind} message with a bad {name} id {_show(value)}")
    rank, senders = _int(header.get("rank"), "rank"), _int(header.get("senders"), "sender count")
    if not rank < senders:
        raise WireError(f"rank {rank} of {senders} senders")
    for name in ("dest", "seq"):
        if name in header:
            _int(header[name], name)
    return kind  # type: ignore[no-any-return]


def _check_version(header: dict[str, Any]) -> None:
    version = header.get("v")
    if type(version) is int and version == 1:
        raise WireError(f"wire format version 1, from an older tarproc: this one speaks version {VERSION} "
                        "(docs/wire.md); run the same tarproc version on both sides")
    if type(version) is not int or version != VERSION:
        raise WireError(f"unknown wire format version {_show(version)} (this side speaks version {VERSION})")


def _check_eof(header: dict[str, Any]) -> None:
    aborted = header.get("aborted", False)
    if type(aborted) is not bool or type(header.get("final")) is not bool:
        raise WireError("eof message: 'final' and 'aborted' must be true or false")
    if not aborted:
        for name in ("epoch", "batches", "samples"):
            _int(header.get(name), name)
    reason = header.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > 200 or not reason.isprintable()):
        raise WireError(f"eof message with a bad reason {_show(reason)}")


def _int(value: Any, what: str) -> int:
    if type(value) is not int or value < 0:
        raise WireError(f"bad {what} {_show(value)} in header")
    return value


def _shape(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 32:
        raise WireError(f"bad shape {_show(value)} in batch header")
    shape = tuple(_int(d, "dimension") for d in value)
    if any(d > MAX_DIMENSION for d in shape):  # even an empty array can't have such a dimension
        raise WireError(f"shape {_show(list(shape))} has a dimension over {MAX_DIMENSION}")
    return shape


def _decode_batch(header: dict[str, Any], frames: Sequence[Any], shm: bool = False) -> Message:
    n = _int(header.get("n"), "sample count")
    for name in ("epoch", "seq"):
        _int(header.get(name), name)
    for name in ("acked", "redelivered"):
        if type(header.get(name, False)) is not bool:
            raise WireError(f"batch header: {name!r} must be true or false, not {_show(header.get(name))}")
    if "pos" in header:
        _check_position(header["pos"])
    keys = header.get("keys")
    if not isinstance(keys, list) or len(keys) != n or not all(isinstance(k, str) for k in keys):
        raise WireError(f"batch header needs {n} string keys")
    entries = header.get("tensors")
    if not isinstance(entries, list):
        raise WireError("batch header without a tensor list")
    tensors: dict[str, Any] = {}
    next_frame = 1
    nbytes = 0

    def take(size: int, what: str) -> memoryview:
        nonlocal next_frame, nbytes
        if next_frame >= len(frames):
            raise WireError(f"{what}: message has only {len(frames) - 1} data frames")
        buffer = _buffer(frames[next_frame])
        if len(buffer) != size:
            raise WireError(f"{what}: frame of {len(buffer)} bytes, header says {size}")
        next_frame += 1
        nbytes += size
        return buffer

    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise WireError(f"bad tensor entry {_show(entry)}")
        name, dtype = entry["name"], entry.get("dtype")
        what = f"{'field' if dtype == BYTES else 'tensor'} {_show(name)}"
        if name in tensors:
            raise WireError(f"{what} twice in one batch")
        if name == "__key__":
            raise WireError(f"{what}: __key__ is the keys' name")
        text = entry.get("text", False)
        if type(text) is not bool:
            raise WireError(f"{what}: 'text' must be true or false, not {_show(text)}")
        if text and not (dtype in _INTEGERS and "shapes" not in entry and isinstance(entry.get("shape"), list)
                         and len(entry["shape"]) == 1):
            raise WireError(f"{what} ({_layout(entry)}) is marked text: only a 1-D integer tensor can be "
                            "(a label per sample)")
        if dtype == BYTES:
            sizes = entry.get("sizes")
            if not isinstance(sizes, list) or len(sizes) != n:
                raise WireError(f"{what}: needs {n} sizes")
            tensors[name] = [None if s is None else bytes(take(_int(s, "size"), what)) for s in sizes]
            continue
        if dtype not in DTYPES:
            raise WireError(f"{what}: unknown dtype {_show(dtype)}")
        np_dtype = bfloat16_dtype() if dtype == "bfloat16" else np.dtype(dtype)
        if "shapes" in entry:
            shapes = entry["shapes"]
            if not isinstance(shapes, list) or len(shapes) != n:
                raise WireError(f"{what}: needs {n} shapes")
            tensors[name] = [_array(take(math.prod(s) * _ITEMSIZE[dtype], what), np_dtype, s)
                             for s in (_shape(s) for s in shapes)]
            continue
        shape = _shape(entry.get("shape"))
        if not shape or shape[0] != n:
            raise WireError(f"{what}: shape {_show(list(shape))} is not a batch of {n}")
        size = math.prod(shape) * _ITEMSIZE[dtype]
        if "shm" in entry:
            if not shm:
                raise WireError(f"{what} in shared memory, on a socket that takes none (only ipc:// peers may)")
            if size > MAX_SHARED:
                raise WireError(f"{what}: {size} bytes in shared memory, over the limit of {MAX_SHARED}")
            buffer = open_shared(entry["shm"], size, _peer_pid(frames[0]))
            nbytes += size
            tensors[name] = _array(buffer, np_dtype, shape)
            continue
        tensors[name] = _array(take(size, what), np_dtype, shape)
    if next_frame != len(frames):
        raise WireError(f"{len(frames) - next_frame} data frames more than the header describes")
    return Message("batch", header, tensors, nbytes)


POSITION_INTS = ("epoch", "batch", "sample", "sent", "index")


def _check_position(pos: Any) -> None:
    """A batch's ``pos``: ints ``epoch``, ``batch``, ``sample`` (and ``sent``, ``index``), a ``shard`` string."""
    if not isinstance(pos, dict) or not all(k in pos for k in POSITION_INTS[:3]):
        raise WireError(f"batch header: bad position {_show(pos)}")
    for name, value in pos.items():
        if name == "shard":
            if not isinstance(value, str):
                raise WireError(f"batch header: bad shard {_show(value)} in its position")
        elif name in POSITION_INTS:
            _int(value, f"position {name}")
        else:
            raise WireError(f"batch header: unknown position field {_show(name)}")


def ack(receiver: str, *, to: tuple[str, str] | None = None, credit: int = 0, seqs: Sequence[int] = (),
        eof: int | None = None, final: bool = False, max_frame: int | None = None, shm: bool = False,
        stop: bool = False) -> list[bytes]:
    """A receiver's one message to a sender (one frame): ``credit`` more batches it may send,
    the batch numbers (``seq``) the receiver's consumer took, the end of epoch ``eof`` it got
    (``final``: the end of the stream), and ``max_frame``, the largest frame it accepts. ``to``
    is the sender id and group it answers (a greeting, sent before the sender is known, has
    none): a sender takes no ack meant for another stream, or another process."""
    fields: dict[str, Any] = {"receiver": receiver, "credit": credit, "seqs": list(seqs)}
    if to is not None:
        fields["to"], fields["to_group"] = to
    if eof is not None:
        fields.update(eof=eof, final=final)
    if max_frame is not None:
        fields["max_frame"] = max_frame
    if shm:
        fields["shm"] = True  # it maps batches in shared memory (a greeting on an ipc:// socket)
    if stop:
        fields["stop"] = True  # it read the sender's stop (an aborted eof): the sender may close its connection
    return [msgpack.packb({"v": VERSION, "kind": ACK, **fields}, use_bin_type=True)]


def decode_ack(frames: Sequence[Any], url: str | None = None) -> dict[str, Any]:
    """Check an ack a receiver sent (see ``ack``); anything else is a ``MessageError``."""
    header: Any = None
    try:
        if len(frames) != 1:
            raise WireError(f"a message of {len(frames)} frames where an ack (one frame) was expected")
        if len(_buffer(frames[0])) > MAX_HEADER:
            raise WireError("an ack over the header size limit")
        header = _read_header(frames[0])
        _check_version(header)
        if header.get("kind") != ACK:
            raise WireError(f"a {_show(header.get('kind'))} message where an ack was expected")
        receiver = header.get("receiver")
        if not isinstance(receiver, str) or not receiver or len(receiver) > MAX_ID or not receiver.isprintable():
            raise WireError(f"ack with a bad receiver id {_show(receiver)}")
        _int(header.get("credit"), "credit")
        for name in ("to", "to_group"):
            if name in header and not (isinstance(header[name], str) and len(header[name]) <= MAX_ID):
                raise WireError(f"ack with a bad {name} {_show(header[name])}")
        seqs = header.get("seqs")
        if not isinstance(seqs, list) or len(seqs) > MAX_ACKS:
            raise WireError(f"ack with a bad list of batch numbers {_show(seqs)}")
        for seq in seqs:
            _int(seq, "batch number")
        if "eof" in header:
            _int(header["eof"], "epoch")
            if type(header.get("final")) is not bool:
                raise WireError("ack: 'final' must be true or false")
        if "max_frame" in header:
            _int(header["max_frame"], "frame size limit")
        if type(header.get("shm", False)) is not bool:
            raise WireError("ack: 'shm' must be true or false")
        if type(header.get("stop", False)) is not bool:
            raise WireError("ack: 'stop' must be true or false")
        return header  # type: ignore[no-any-return]
    except WireError as e:
        raise _message_error(e, frames, header, "receiver", url) from None


def _message_error(error: WireError, frames: Sequence[Any], header: Any, id_field: str, url: str | None) -> MessageError:
    """``error`` as a ``MessageError`` saying where the message came from: the connection's peer,
    and the sender (or receiver) id in ``header[id_field]`` when the header got that far."""
    peer = peer_address(frames[0]) if frames else None
    who = header.get(id_field) if isinstance(header, dict) else None
    return MessageError(error.message, url, peer,
                        who if isinstance(who, str) and who.isprintable() and len(who) <= MAX_ID else None)


def _layout(entry: dict[str, Any]) -> str:
    """What an entry says it is, for a message: ``float32 of shape [2, 3]``, ``ragged int64``, ``bytes``."""
    dtype = entry.get("dtype")
    if dtype == BYTES:
        return "bytes"
    name = dtype if dtype in DTYPES else _show(dtype)
    return f"ragged {name}" if "shapes" in entry else f"{name} of shape {_show(entry.get('shape'), 30)}"


def _array(buffer: memoryview, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    if len(buffer):
        return np.frombuffer(buffer, dtype=dtype).reshape(shape)
    try:
        return np.empty(shape, dtype)
    except ValueError:  # numpy's own limits on the dimensions of an empty array
        raise WireError(f"empty tensor of shape {_show(list(shape))} is too big for numpy") from None


def to_batch(message: Message) -> Batch:
    """The user-facing ``Batch`` of a decoded batch message."""
    header = message.header
    batch = Batch(__key__=header["keys"], **message.tensors)
    batch.sender = header["sender"]
    batch.epoch = header["epoch"]
    batch.seq = header["seq"]
    batch.nbytes = message.nbytes
    batch.dtypes = {e["name"]: e["dtype"] for e in header["tensors"]}
    batch.text = {e["name"] for e in header["tensors"] if e.get("text") is True}
    batch.group, batch.rank = header["group"], header["rank"]
    batch.redelivered = header.get("redelivered", False)
    batch.acked = header.get("acked", False)
    batch.position = header.get("pos")
    batch.connection = message.connection
    return batch
