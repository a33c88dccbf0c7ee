"""Field handlers (bytes to values), tuple selection and collation of a batch.

A handler turns a field's bytes into a value. The defaults go by the field's last extension
(``seg.cls`` uses the ``cls`` handler): ``cls``/``cls2``/``index``/``id`` -> int, ``txt``/``text``
-> str, ``json``/``jsn`` -> object, ``npy`` -> numpy array. Other fields stay bytes; images are
decoded by the decode stage, not by handlers. Give your own as ``{"field": callable}``; ``None``
leaves a field as bytes. No pickle handler exists on purpose: a shard should not run code.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..errors import DecodeError, OptionError
from ..samples import Sample

Handler = Callable[[bytes], Any]


class BatchBuffer(NamedTuple):
    """One batch's image array: ``handle`` is what the batch holds (a torch tensor in shared
    memory, or the array itself), ``array`` a numpy view of it to decode into."""

    handle: Any
    array: Any


def as_numpy(value: Any) -> Any:
    """A collated batch with its batch buffers as numpy arrays."""
    if isinstance(value, BatchBuffer):
        return value.array
    if isinstance(value, tuple):
        return tuple(as_numpy(v) for v in value)
    if isinstance(value, dict):
        return {k: as_numpy(v) for k, v in value.items()}
    return value


class Slot(NamedTuple):
    """A decoded image that lives at ``row`` of ``buffer`` (collate takes the buffer whole)."""

    buffer: BatchBuffer
    row: int


def _int(data: bytes) -> int:
    return int(bytes(data).strip())


def _text(data: bytes) -> str:
    return bytes(data).decode("utf-8")


def _json(data: bytes) -> Any:
    return json.loads(bytes(data))


def _npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(bytes(data)), allow_pickle=False)


DEFAULT_HANDLERS: dict[str, Handler] = {
    "cls": _int, "cls2": _int, "index": _int, "id": _int,
    "txt": _text, "text": _text,
    "json": _json, "jsn": _json,
    "npy": _npy,
}


def handler_for(field: str, handlers: Mapping[str, Handler | None]) -> Handler | None:
    """The handler of ``field``: by its full name, else by its last extension.

    >>> handler_for("seg.cls", DEFAULT_HANDLERS)(b"7")
    7
    >>> handler_for("jpg", DEFAULT_HANDLERS) is None
    True
    """
    if field in handlers:
        return handlers[field]
    return handlers.get(field.rsplit(".", 1)[-1])


def apply_handlers(sample: Sample, handlers: Mapping[str, Handler | None], skip: frozenset[str] = frozenset()) -> Sample:
    """The sample with each field's handler applied (fields in ``skip`` left alone); a failing
    handler is a ``DecodeError`` naming URL, key and field.

    >>> apply_handlers({"__key__": "a", "cls": b"3", "json": b'{"x": 1}', "bin": b"?"}, DEFAULT_HANDLERS)
    {'__key__': 'a', 'cls': 3, 'json': {'x': 1}, 'bin': b'?'}
    """
    for field, value in sample.items():
        if field.startswith("__") or field in skip or not isinstance(value, (bytes, bytearray, memoryview)):
            continue
        handler = handler_for(field, handlers)
        if handler is None:
            continue
        try:
            sample[field] = handler(bytes(value) if not isinstance(value, bytes) else value)
        except Exception as e:  # a user's handler may raise anything: report it with its context
            reason = f"handler {getattr(handler, '__name__', handler)!r} failed: {type(e).__name__}: {e}"
            raise DecodeError(reason, sample.get("__url__"), sample.get("__key__"), field) from e
    return sample


def parse_selection(columns: Sequence[str]) -> list[list[str]]:
    """``("jpg;png", "cls")`` -> ``[["jpg", "png"], ["cls"]]``: each column takes the first field the
    sample has (``__key__`` and ``__url__`` allowed).

    >>> parse_selection(["jpg;png", "cls"])
    [['jpg', 'png'], ['cls']]
    """
    out = []
    for column in columns:
        names = [n.strip().lower() if not n.strip().startswith("__") else n.strip() for n in column.replace(",", ";").split(";")]
        names = [n for n in names if n]
        if not names:
            raise OptionError(f"bad column {column!r}; expected field names like jpg;png")
        out.append(names)
    if not out:
        raise OptionError("to_tuple needs at least one column")
    return out


def pick(sample: Sample, selection: list[list[str]]) -> tuple[Any, ...]:
    """The sample's values for ``selection``; a missing column is a ``DecodeError``."""
    values = []
    for names in selection:
        for name in names:
            if name in sample:
                values.append(sample[name])
                break
        else:
            have = ", ".join(k for k in sample if not k.startswith("__"))
            raise DecodeError(f"no field {'/'.join(names)} (it has: {have})", sample.get("__url__"), sample.get("__key__"))
    return tuple(values)


def collate_column(values: list[Any]) -> Any:
    """One column of a batch: arrays of one shape stacked, numbers as an array, anything else a list.

    >>> collate_column([1, 2]).tolist(), collate_column(["a", "b"]), collate_column([np.zeros(2), np.ones(2)]).shape
    ([1, 2], ['a', 'b'], (2, 2))
    """
    first = values[0]
    if isinstance(first, Slot):  # images decoded into one batch array: take it whole
        buffer = first.buffer
        indices = [v.row for v in values]
        rows = slice(0, len(values)) if indices == list(range(len(values))) else indices
        return BatchBuffer(buffer.handle[rows], buffer.array[rows])
    if _is_cpu_tensor(first) and all(_is_cpu_tensor(v) for v in values):  # a map= that returns torch tensors
        values = [v.numpy() for v in values]
        first = values[0]
    if isinstance(first, np.ndarray) and first.dtype != object:
        if all(isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype for v in values):
            return np.stack(values)
        return values
    if isinstance(first, (bool, np.bool_)) and all(isinstance(v, (bool, np.bool_)) for v in values):
        return np.array(values, dtype=bool)
    if isinstance(first, (int, np.integer)) and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        return np.array(values, dtype=np.int64)
    if isinstance(first, (float, np.floating)) and all(isinstance(v, (int, float, np.number)) for v in values):
        return np.array(values, dtype=np.float64)
    return list(values)


def _is_cpu_tensor(value: Any) -> bool:
    """A torch tensor on the CPU (seen without importing torch), which stacks as its numpy view."""
    return type(value).__module__.startswith("torch") and getattr(getattr(value, "device", None), "type", "") == "cpu" \
        and hasattr(value, "numpy")


def collate(rows: list[Any]) -> Any:
    """A batch from rows: tuples column by column (a tuple), dicts field by field (a dict).

    >>> collate([{"cls": 1, "__key__": "a"}, {"cls": 2, "__key__": "b"}])["cls"].tolist()
    [1, 2]
    """
    first = rows[0]
    if isinstance(first, tuple):
        return tuple(collate_column([r[i] for r in rows]) for i in range(len(first)))
    keys = [k for k in first if k != "__url__"]
    return {k: collate_column([r.get(k) for r in rows]) if k != "__key__" else [r[k] for r in rows] for k in keys}
