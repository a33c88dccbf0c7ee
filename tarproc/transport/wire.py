"""Wire format v1: one ZMQ multipart message per batch, a msgpack header and one raw frame per tensor.

Frame 0 is a msgpack map::

    {"v": 1, "kind": "batch", "sender": "host:pid:rank", "group": "…", "rank": 0, "senders": 2,
     "epoch": 0, "seq": 17, "n": 256, "keys": ["k0", …],
     "tensors": [{"name": "image", "dtype": "uint8", "shape": [256, 224, 224, 3]},
                 {"name": "cls", "dtype": "int64", "shape": [256], "text": true},
                 {"name": "json", "dtype": "bytes", "sizes": [81, null, …]}]}

followed by the tensors' frames in order: a stacked tensor (``shape``) is one frame of
little-endian C-order bytes; a ragged one (``shapes``, one shape per sample) is one frame per
sample; a ``bytes`` field is one frame per sample that has it (``sizes`` gives each length,
``null`` where the sample lacks the field). ``kind`` is also ``hello``, ``eof`` (an epoch's end,
with counts) or ``heartbeat``, which carry no frames. No pickle anywhere: a receiver never runs
code from the network, and checks every size before it touches a frame.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

from ..errors import WireError

VERSION = 1
KINDS = ("hello", "batch", "eof", "heartbeat")
DTYPES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "bfloat16",
)
BYTES = "bytes"
MAX_HEADER = 64 << 20  # keys and sizes of a very large batch fit easily; garbage does not get parsed
MAX_SAMPLES = 1 << 20  # per batch (and per list in a header)
MAX_DIMENSION = 1 << 40
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


class Batch(dict):  # type: ignore[type-arg]
    """A received batch: ``{"__key__": [...], name: array or list, ...}`` plus where it came from.

    Stacked tensors are numpy arrays over the received frames (no copy); ragged tensors are lists
    of arrays; bytes fields are lists of ``bytes`` (``None`` where a sample lacks the field).
    ``dtypes`` names each tensor's wire dtype (``bfloat16`` arrives as ml_dtypes.bfloat16 when that
    is installed, else as uint16 bit patterns). ``text`` names the integer tensors that were
    text fields (``--label``).
    """

    sender: str
    epoch: int
    seq: int
    nbytes: int
    dtypes: dict[str, str]
    text: set[str]

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
    """The wire name of an array's dtype; a dtype outside v1 is a ``WireError``."""
    name = array.dtype.name
    if name not in DTYPES:
        raise WireError(f"dtype {array.dtype} can't be sent (wire format v1 has {', '.join(DTYPES)} and bytes)")
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
    **fields: Any,
) -> list[Any]:
    """The frames of a batch message: header first, then each tensor's frames (no copies).

    ``tensors`` maps names to an array (or torch tensor) whose first dimension is the batch, a
    list of arrays (ragged), or a list of ``bytes``/``None`` (a raw field). ``text`` names integer
    tensors made from text fields; ``bfloat16`` names uint16 arrays that hold bfloat16 bits.

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
    for name, value in tensors.items():
        if isinstance(value, list) and all(v is None or isinstance(v, (bytes, bytearray, memoryview)) for v in value):
            if len(value) != n:
                raise WireError(f"field {name!r} has {len(value)} values for {n} samples")
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
            entries.append({"name": name, "dtype": dtype, "shapes": [list(a.shape) for a in arrays]})
            frames.extend(_frame(a) for a in arrays)
            continue
        array = _as_array(value)
        if array.ndim == 0 or array.shape[0] != n:
            raise WireError(f"tensor {name!r} of shape {array.shape} is not a batch of {n}")
        entry: dict[str, Any] = {"name": name, "dtype": "bfloat16" if name in bfloat16 else wire_dtype(array),
                                 "shape": list(array.shape)}
        if name in text:
            entry["text"] = True
        entries.append(entry)
        frames.append(_frame(array))
    header = _header("batch", {**fields, "n": n, "keys": list(keys), "tensors": entries})
    return [header, *frames]


def _buffer(frame: Any) -> memoryview:
    return frame.buffer if hasattr(frame, "buffer") else memoryview(frame)


def decode(frames: Sequence[Any], url: str | None = None) -> Message:
    """Check and decode one received message (``zmq.Frame`` objects or bytes) without copying.

    Anything that is not wire format v1 is a ``WireError`` saying what is wrong.
    """
    if not frames:
        raise WireError("empty message", url)
    head = _buffer(frames[0])
    if len(head) > MAX_HEADER:
        raise WireError(f"header of {len(head)} bytes is larger than {MAX_HEADER}", url)
    try:
        # limits keep garbage from costing more than its own size (a few bytes can't claim a
        # billion-element array)
        header = msgpack.unpackb(head, raw=False, strict_map_key=True, max_array_len=MAX_SAMPLES,
                                 max_map_len=64, max_str_len=1 << 20, max_bin_len=1 << 20, max_ext_len=0)
    except Exception as e:  # msgpack raises several unrelated types on garbage
        raise WireError(f"not a wire format message (header is not msgpack: {type(e).__name__}: {e})",
                        url) from None
    if not isinstance(header, dict):
        raise WireError("not a wire format message (header is not a map)", url)
    version = header.get("v")
    if type(version) is not int or version != VERSION:
        raise WireError(f"unknown wire format version {version!r} (this receiver reads version {VERSION})", url)
    kind = header.get("kind")
    if kind not in KINDS:
        raise WireError(f"unknown message kind {kind!r}", url)
    if not isinstance(header.get("sender"), str) or not isinstance(header.get("group"), str):
        raise WireError(f"{kind} message without a sender id and group", url)
    rank, senders = _int(header.get("rank"), "rank", url), _int(header.get("senders"), "sender count", url)
    if not rank < senders:
        raise WireError(f"rank {rank} of {senders} senders", url)
    for name in ("dest", "seq"):
        if name in header:
            _int(header[name], name, url)
    if kind != "batch":
        if len(frames) != 1:
            raise WireError(f"{kind} message with {len(frames) - 1} extra frames", url)
        if kind == "eof":
            _check_eof(header, url)
        return Message(kind, header)
    return _decode_batch(header, frames, url)


def _check_eof(header: dict[str, Any], url: str | None) -> None:
    aborted = header.get("aborted", False)
    if type(aborted) is not bool or type(header.get("final")) is not bool:
        raise WireError("eof message: 'final' and 'aborted' must be true or false", url)
    if not aborted:
        for name in ("epoch", "batches", "samples"):
            _int(header.get(name), name, url)


def _int(value: Any, what: str, url: str | None) -> int:
    if type(value) is not int or value < 0:
        raise WireError(f"bad {what} {value!r} in header", url)
    return value


def _shape(value: Any, url: str | None) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 32:
        raise WireError(f"bad shape {str(value)[:80]} in batch header", url)
    shape = tuple(_int(d, "dimension", url) for d in value)
    if any(d > MAX_DIMENSION for d in shape):  # even an empty array can't have such a dimension
        raise WireError(f"shape {list(shape)} has a dimension over {MAX_DIMENSION}", url)
    return shape


def _decode_batch(header: dict[str, Any], frames: Sequence[Any], url: str | None) -> Message:
    n = _int(header.get("n"), "sample count", url)
    for name in ("epoch", "seq"):
        _int(header.get(name), name, url)
    keys = header.get("keys")
    if not isinstance(keys, list) or len(keys) != n or not all(isinstance(k, str) for k in keys):
        raise WireError(f"batch header needs {n} string keys", url)
    entries = header.get("tensors")
    if not isinstance(entries, list):
        raise WireError("batch header without a tensor list", url)
    tensors: dict[str, Any] = {}
    next_frame = 1
    nbytes = 0

    def take(size: int, what: str) -> memoryview:
        nonlocal next_frame, nbytes
        if next_frame >= len(frames):
            raise WireError(f"{what}: message has only {len(frames) - 1} data frames", url)
        buffer = _buffer(frames[next_frame])
        if len(buffer) != size:
            raise WireError(f"{what}: frame of {len(buffer)} bytes, header says {size}", url)
        next_frame += 1
        nbytes += size
        return buffer

    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            raise WireError(f"bad tensor entry {entry!r}", url)
        name, dtype = entry["name"], entry.get("dtype")
        if name in tensors or name == "__key__":
            raise WireError(f"tensor {name!r} twice in one batch", url)
        if dtype == BYTES:
            sizes = entry.get("sizes")
            if not isinstance(sizes, list) or len(sizes) != n:
                raise WireError(f"field {name!r}: needs {n} sizes", url)
            tensors[name] = [None if s is None else bytes(take(_int(s, "size", url), f"field {name!r}"))
                             for s in sizes]
            continue
        if dtype not in DTYPES:
            raise WireError(f"tensor {name!r}: unknown dtype {dtype!r}", url)
        np_dtype = bfloat16_dtype() if dtype == "bfloat16" else np.dtype(dtype)
        if "shapes" in entry:
            shapes = entry["shapes"]
            if not isinstance(shapes, list) or len(shapes) != n:
                raise WireError(f"tensor {name!r}: needs {n} shapes", url)
            tensors[name] = [_array(take(math.prod(s) * _ITEMSIZE[dtype], f"tensor {name!r}"), np_dtype, s)
                             for s in (_shape(s, url) for s in shapes)]
            continue
        shape = _shape(entry.get("shape"), url)
        if not shape or shape[0] != n:
            raise WireError(f"tensor {name!r}: shape {list(shape)} is not a batch of {n}", url)
        tensors[name] = _array(take(math.prod(shape) * _ITEMSIZE[dtype], f"tensor {name!r}"), np_dtype, shape)
    if next_frame != len(frames):
        raise WireError(f"{len(frames) - next_frame} data frames more than the header describes", url)
    return Message("batch", header, tensors, nbytes)


def _array(buffer: memoryview, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    if len(buffer):
        return np.frombuffer(buffer, dtype=dtype).reshape(shape)
    try:
        return np.empty(shape, dtype)
    except ValueError:  # numpy's own limits on the dimensions of an empty array
        raise WireError(f"empty tensor of shape {list(shape)} is too big for numpy") from None


def to_batch(message: Message) -> Batch:
    """The user-facing ``Batch`` of a decoded batch message."""
    header = message.header
    batch = Batch(__key__=header["keys"], **message.tensors)
    batch.sender = header["sender"]
    batch.epoch = header["epoch"]
    batch.seq = header["seq"]
    batch.nbytes = message.nbytes
    batch.dtypes = {e["name"]: e["dtype"] for e in header["tensors"]}
    batch.text = {e["name"] for e in header["tensors"] if e.get("text")}
    return batch
