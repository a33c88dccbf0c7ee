"""Field handlers (bytes to values), audio/video fields, tuple selection and collation of a batch.

A handler turns a field's bytes into a value. The defaults (``DEFAULT_HANDLERS``, webdataset's
default decoders but pickle) go by the field's last extension (``seg.cls`` uses the ``cls``
handler): ``cls``/``cls2``/``index``/``inx``/``id`` -> int, ``txt``/``text``/``transcript`` -> str,
``json``/``jsn`` -> object, ``npy`` -> numpy array, ``npz`` -> dict of arrays, ``pth`` ->
``torch.load(..., weights_only=True)`` (torch imported when one comes), ``msgpack``/``mp`` ->
object, ``cbor`` -> object (``pip install cbor2``); a field ending in ``.gz`` (``json.gz``) is
decompressed and handed to the handler of its inner extension (bytes without one). Other fields
stay bytes; images, audio and video are decoded by the decode stage, not by handlers.

Your ``handlers={"field": callable}`` extend and override the defaults (by the full field name or
its last extension); ``None`` leaves a field as bytes. ``merge_handlers(handlers, defaults=False)``
(``Dataset(default_handlers=False)``) uses yours alone. No pickle handler exists on purpose: a
shard should not run code (``pth`` loads tensors only).
"""

from __future__ import annotations

import dataclasses
import io
import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..decode.audio import AudioSpec
from ..decode.media import decode_media_fields, parse_media_specs
from ..decode.spec import AugmentSpec
from ..decode.stage import DEFAULT_FIELDS, parse_field_list
from ..decode.video import VideoSpec
from ..errors import DecodeError, MissingDependencyError, OptionError, SampleError
from ..fieldspec import AUDIO_EXTENSIONS, IMAGE_EXTENSIONS, VIDEO_EXTENSIONS, Accepts, parse_spec
from ..samples import Sample
from ..tar import DEFAULT_MAX_MEMBER_SIZE

Handler = Callable[[bytes], Any]


class BatchBuffer(NamedTuple):
    """One batch's image array: ``handle`` is what the batch holds (a torch tensor in shared
    memory, or the array itself), ``array`` a numpy view of it to decode into."""

    handle: Any
    array: Any


class BatchTuple(tuple):  # type: ignore[type-arg]
    """A batch with ``to_tuple``, as the Dataset yields it: a tuple whose type tells torch's
    ``default_collate`` (which the torch layer teaches to refuse it) that it is a whole batch
    already, not one sample: ``DataLoader(ds, batch_size=16)`` would stack 16 batches into one.
    It pickles and copies as a plain tuple."""

    def __reduce__(self) -> tuple[object, ...]:
        return tuple, (tuple(self),)


class BatchDict(dict):  # type: ignore[type-arg]
    """A batch without ``to_tuple`` (a dict of columns), marked as ``BatchTuple`` is; it pickles and
    copies as a plain dict."""

    def __reduce__(self) -> tuple[object, ...]:
        return dict, (dict(self),)

    def __copy__(self) -> dict[Any, Any]:
        return dict(self)


def as_batch(value: Any) -> Any:
    """A collated batch marked as one (``BatchTuple``, ``BatchDict``); any other value as it is.

    >>> type(as_batch((1, 2))).__name__, type(as_batch({"a": 1})).__name__, as_batch([1])
    ('BatchTuple', 'BatchDict', [1])
    """
    if type(value) is tuple:
        return BatchTuple(value)
    if type(value) is dict:
        return BatchDict(value)
    return value


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


def _npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(bytes(data)), allow_pickle=False) as arrays:
        size = sum(info.file_size for info in arrays.zip.infolist())  # (a zip bomb, as gunzip refuses)
        if size > DEFAULT_MAX_MEMBER_SIZE:
            raise ValueError(f"decompresses to {size:,} bytes, more than {DEFAULT_MAX_MEMBER_SIZE:,}")
        return {name: arrays[name] for name in arrays.files}


def _pth(data: bytes) -> Any:
    try:
        import torch
    except ImportError:
        raise MissingDependencyError("pth fields need PyTorch: pip install 'tarproc[torch]' (or handlers={'pth': None})") from None
    return torch.load(io.BytesIO(bytes(data)), weights_only=True, map_location="cpu")


def _msgpack(data: bytes) -> Any:
    import msgpack

    return msgpack.unpackb(bytes(data), raw=False, strict_map_key=False)


def _cbor(data: bytes) -> Any:
    try:
        import cbor2
    except ImportError:
        raise MissingDependencyError("cbor fields need cbor2: pip install cbor2 (or handlers={'cbor': None})") from None
    return cbor2.loads(bytes(data))


DEFAULT_HANDLERS: dict[str, Handler] = {
    "cls": _int, "cls2": _int, "index": _int, "inx": _int, "id": _int,
    "txt": _text, "text": _text, "transcript": _text,
    "json": _json, "jsn": _json,
    "npy": _npy, "npz": _npz, "pth": _pth,
    "msgpack": _msgpack, "mp": _msgpack, "cbor": _cbor,
}


def merge_handlers(handlers: Mapping[str, Handler | None] | None, defaults: bool = True) -> dict[str, Handler | None]:
    """The handlers a dataset uses: ``handlers`` over the defaults (``defaults=False``: yours alone).

    >>> merged = merge_handlers({"cls": float, "json": None})
    >>> merged["cls"], merged["json"], merged["txt"] is DEFAULT_HANDLERS["txt"]
    (<class 'float'>, None, True)
    >>> sorted(merge_handlers({"cls": float}, defaults=False))
    ['cls']
    """
    if handlers is not None and not isinstance(handlers, Mapping):
        raise OptionError(f"bad handlers {handlers!r}; give a dict of field name -> callable (or None: keep bytes)")
    for name, handler in (handlers or {}).items():
        if not isinstance(name, str) or not name:
            raise OptionError(f"bad handler field name {name!r}; give a field name or extension like 'cls'")
        if handler is not None and not callable(handler):
            raise OptionError(f"bad handler for {name!r}: {handler!r} is not callable (None keeps bytes)")
    merged: dict[str, Handler | None] = dict(DEFAULT_HANDLERS) if defaults else {}
    merged.update(handlers or {})
    return merged


def gunzip(data: bytes, limit: int = DEFAULT_MAX_MEMBER_SIZE) -> bytes:
    """``data`` gzip-decompressed, refusing more than ``limit`` bytes (a gzip bomb).

    >>> import gzip; gunzip(gzip.compress(b"abc"))
    b'abc'
    """
    rest, parts, size = bytes(data), [], 0
    while True:  # every member (pigz, bgzip, cat a.gz b.gz write several)
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out = inflater.decompress(rest, limit + 1 - size)
        size += len(out)
        parts.append(out)
        if size > limit:
            raise ValueError(f"decompresses to more than {limit:,} bytes")
        if not inflater.eof:
            raise ValueError("gzip data cut short")
        rest = inflater.unused_data
        if not rest.strip(b"\0"):  # (zeros after the last member are padding, as gzip -d takes them)
            return b"".join(parts)


def _inner_gz(inner: Handler | None) -> Handler:
    def gz(data: bytes) -> Any:
        raw = gunzip(data)
        return raw if inner is None else inner(raw)

    gz.__name__ = f"gz+{getattr(inner, '__name__', 'bytes')}"
    return gz


def handler_for(field: str, handlers: Mapping[str, Handler | None]) -> Handler | None:
    """The handler of ``field``: by its full name, else by its last extension; a field ending in
    ``.gz`` without a handler of its own is decompressed and handled by its inner extension.

    >>> handler_for("seg.cls", DEFAULT_HANDLERS)(b"7")
    7
    >>> handler_for("jpg", DEFAULT_HANDLERS) is None
    True
    >>> import gzip; handler_for("json.gz", DEFAULT_HANDLERS)(gzip.compress(b'[1]'))
    [1]
    """
    if field in handlers:
        return handlers[field]
    base, _, ext = field.rpartition(".")
    if ext in handlers:
        return handlers[ext]
    if ext == "gz" and base:
        return _inner_gz(handler_for(base, handlers))
    return None


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
        except MissingDependencyError:
            raise  # not the sample's fault: every sample would be skipped
        except Exception as e:  # a user's handler may raise anything: report it with its context
            reason = f"handler {getattr(handler, '__name__', handler)!r} failed: {type(e).__name__}: {e}"
            raise DecodeError(reason, sample.get("__url__"), sample.get("__key__"), field) from e
    return sample


MediaSpec = AudioSpec | VideoSpec
LENGTHS = ".lengths"  # FIELD.lengths: a padded field's lengths (collate="pad"; a to_tuple column)


class Decoding(NamedTuple):
    """What ``Dataset(decode=...)`` asks for: the image spec and its fields, and the media fields
    (``(names, spec)``: the first of ``names`` a sample has is decoded by ``spec``)."""

    image: AugmentSpec | None
    image_fields: list[str]
    media: list[tuple[list[str], MediaSpec]]


def parse_decoding(decode: Any, image: str = DEFAULT_FIELDS, seed: int = 0) -> Decoding:
    """Split ``decode`` -- an ``AugmentSpec``, or a dict of field names to ``AugmentSpec`` (one at
    most), ``AudioSpec`` and ``VideoSpec`` -- into image and media decoding; specs without a seed
    get ``seed`` (the dataset's: reproducible, and new each epoch through the plan key).

    >>> d = parse_decoding({"flac;wav": AudioSpec(seconds=1.0)}, seed=5)
    >>> d.image, d.media[0][0], d.media[0][1].seed
    (None, ['flac', 'wav'], 5)
    """
    def seeded(spec: Any) -> Any:
        return dataclasses.replace(spec, seed=seed) if spec.seed is None else spec

    if decode is None:
        return Decoding(None, parse_field_list(image), [])
    if isinstance(decode, AugmentSpec):
        return Decoding(seeded(decode), parse_field_list(image), [])
    if isinstance(decode, (AudioSpec, VideoSpec)):
        kind = "audio" if isinstance(decode, AudioSpec) else "video"
        raise OptionError(f"decode={type(decode).__name__}(...) needs the {kind} field it is for: "
                          f"decode={{'{'flac' if kind == 'audio' else 'mp4'}': {type(decode).__name__}(...)}}")
    if not isinstance(decode, Mapping):
        raise OptionError(f"bad decode {decode!r}; give an AugmentSpec, or a dict of field names to "
                          "AugmentSpec/AudioSpec/VideoSpec")
    images = [(names, spec) for names, spec in decode.items() if isinstance(spec, AugmentSpec)]
    others = {names: spec for names, spec in decode.items() if not isinstance(spec, AugmentSpec)}
    if len(images) > 1:
        raise OptionError("decode takes one AugmentSpec (the image field): give its fields as one key, like 'jpg;png'")
    if images and image != DEFAULT_FIELDS:
        raise OptionError("give the image fields once: as the AugmentSpec's key in decode, or as image=")
    spec_image, fields = (seeded(images[0][1]), parse_field_list(images[0][0])) if images else (None, parse_field_list(image))
    media = [(names, seeded(spec)) for names, spec in parse_media_specs(others)] if others else []
    for name in fields if images else ():
        if any(name in names for names, _ in media):
            raise OptionError(f"field {name!r} is in two decode specs")
    return Decoding(spec_image, fields, media)


decode_media = decode_media_fields  # the dataset's name for it


# what a to_tuple column takes of the field-spec grammar (tarproc/fieldspec.py): alternatives,
# and any __name__ the pipeline adds (__key__, __url__, __valid__, ...); a column is one spec, a
# space inside a name part of it ('a b' is the field 'a b'), as before the one grammar
TUPLE_SPECS = Accepts("a to_tuple column", meta=None, unique=False, spaced_names=True)


def parse_selection(columns: Sequence[str]) -> list[list[str]]:
    """``("jpg;png", "cls")`` -> ``[["jpg", "png"], ["cls"]]``: each column is a field spec
    (``tarproc.fieldspec``) of alternatives and takes the first field the sample has (``__key__``,
    ``__url__`` and the other ``__names__`` allowed).

    >>> parse_selection(["jpg;png", "cls"])
    [['jpg', 'png'], ['cls']]
    """
    if isinstance(columns, str):
        raise OptionError(f"bad to_tuple {columns!r}; give a sequence of columns, like ('jpg;png', 'cls')")
    out = []
    for column in columns:
        if not isinstance(column, str):
            raise OptionError(f"bad to_tuple column {column!r}; give field names like 'jpg;png'")
        out.append(list(parse_spec(column, TUPLE_SPECS).fields))
    if not out:
        raise OptionError("to_tuple needs at least one column")
    return out


def pick(sample: Sample, selection: list[list[str]]) -> tuple[Any, ...]:
    """The sample's values for ``selection``; a missing column is a ``DecodeError``. A column
    ``FIELD.lengths`` (no such field in the sample) is the length of the array ``FIELD`` along its
    last axis: the lengths of a padded column (``collate="pad"``).

    >>> pick({"wav": np.zeros((1, 5)), "txt": "hi"}, [["wav"], ["wav.lengths"], ["txt"]])[1:]
    (5, 'hi')
    """
    values = []
    for names in selection:
        for name in names:
            if name in sample:
                values.append(sample[name])
                break
            base = name[: -len(LENGTHS)] if name.endswith(LENGTHS) else None
            if base and base in sample and getattr(sample[base], "ndim", 0) >= 1:
                values.append(int(sample[base].shape[-1]))
                break
        else:
            have = [k for k in sample if not k.startswith("__")]
            raise DecodeError(f"no field {'/'.join(names)} (it has: {', '.join(have)}){_alternatives(names, have)}",
                              sample.get("__url__"), sample.get("__key__"))
    return tuple(values)


_KINDS = (frozenset(IMAGE_EXTENSIONS), AUDIO_EXTENSIONS, VIDEO_EXTENSIONS)


def _alternatives(names: list[str], have: list[str]) -> str:
    """A hint for a column the sample lacks when it holds a field of the same kind under another
    extension (``jpg`` asked, ``jpeg`` there: ImageNet's ``.JPEG`` files).

    >>> _alternatives(["jpg"], ["cls", "jpeg"])
    "; give the column as 'jpg;jpeg' to take whichever of them a sample has"
    >>> _alternatives(["cls"], ["jpeg"])
    ''
    """
    kinds = [kind for kind in _KINDS if any(n.rsplit(".", 1)[-1].lower() in kind for n in names)]
    others = [f for f in have if f not in names and any(f.rsplit(".", 1)[-1].lower() in kind for kind in kinds)]
    if not others:
        return ""
    return f"; give the column as {';'.join(names + others)!r} to take whichever of them a sample has"


def collate_column(values: list[Any]) -> Any:
    """One column of a batch: arrays of one shape stacked, numbers as an array, anything else a list.

    >>> collate_column([1, 2]).tolist(), collate_column(["a", "b"]), collate_column([np.zeros(2), np.ones(2)]).shape
    ([1, 2], ['a', 'b'], (2, 2))
    """
    first = values[0]
    if any(isinstance(v, Slot) for v in values):  # images decoded into one batch array
        if not all(isinstance(v, Slot) for v in values):  # a field some rows lack (jpg here, png there): a list
            return [v.buffer.handle[v.row] if isinstance(v, Slot) else v for v in values]
        buffer = first.buffer  # take it whole
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
    """A batch from rows: tuples column by column (a tuple), dicts field by field (a dict: every
    field any row has, None for the rows without it).

    >>> collate([{"cls": 1, "__key__": "a"}, {"cls": 2, "__key__": "b"}])["cls"].tolist()
    [1, 2]
    >>> collate([{"__key__": "a"}, {"__key__": "b", "txt": "x"}])["txt"]
    [None, 'x']
    """
    first = rows[0]
    if isinstance(first, tuple):
        return tuple(collate_column([r[i] for r in rows]) for i in range(len(first)))
    return {k: collate_column([r.get(k) for r in rows]) if k != "__key__" else [r[k] for r in rows]
            for k in _fields(rows)}


def _fields(rows: list[dict[str, Any]]) -> list[str]:
    """The fields of dict rows, each once, as they first come (``__url__`` left out)."""
    return [k for k in dict.fromkeys(k for r in rows for k in r) if k != "__url__"]


# ---------------------------------------------------------------------------------------------------
# collate="pad" and collate= hooks

Collate = Callable[[list[Any]], Any]
COLLATES = ("stack", "pad")


def make_collate(how: str | Collate | None) -> Collate:
    """The collate function of ``Dataset(collate=...)``: ``"stack"`` (None, the default: arrays of
    one shape stacked, other values a list), ``"pad"`` (``pad_collate``) or your callable, given the
    batch's rows (dicts, or tuples with ``to_tuple``) and returning the batch."""
    if how is None or how == "stack":
        return collate
    if how == "pad":
        return pad_collate
    if callable(how) and not isinstance(how, str):
        return _UserCollate(how)
    raise OptionError(f"bad collate {how!r}; use 'stack', 'pad' or a function of the batch's rows")


class _UserCollate:
    """A user's collate function, its exceptions made a one-line ``SampleError`` (a class, not a
    closure: a dataset is pickled to spawned DataLoader workers)."""

    def __init__(self, function: Collate) -> None:
        self.function = function

    def __call__(self, rows: list[Any]) -> Any:
        try:
            return self.function(rows)
        except Exception as e:
            first = rows[0] if rows else {}
            url = first.get("__url__") if isinstance(first, dict) else None
            name = getattr(self.function, "__name__", self.function)
            raise SampleError(f"collate {name!r} failed: {type(e).__name__}: {e}", url) from e


def pad_collate(rows: list[Any]) -> Any:
    """``collate``, but 1-D and 2-D arrays (sequences; audio as ``(channels, samples)``) are padded
    with zeros at the end of their last axis to the batch's longest, and stacked; in a dict batch
    each padded field ``F`` comes with ``F.lengths``, an int64 vector of the lengths before padding
    (with ``to_tuple``, ask for the column ``"F.lengths"``). Arrays that differ in another axis or
    in dtype are a ``SampleError``.

    >>> batch = pad_collate([{"wav": np.ones((1, 2))}, {"wav": np.ones((1, 3))}])
    >>> batch["wav"].shape, batch["wav.lengths"].tolist(), batch["wav"][0].tolist()
    ((2, 1, 3), [2, 3], [[1.0, 1.0, 0.0]])
    """
    first = rows[0]
    if isinstance(first, tuple):
        return tuple(_pad_column([r[i] for r in rows], str(i))[0] for i in range(len(first)))
    out: dict[str, Any] = {}
    for k in _fields(rows):
        if k == "__key__":
            out[k] = [r[k] for r in rows]
            continue
        column, lengths = _pad_column([r.get(k) for r in rows], k, rows)
        out[k] = column
        if lengths is not None:
            out[k + LENGTHS] = lengths
    return out


def _pad_column(values: list[Any], name: str, rows: list[Any] | None = None) -> tuple[Any, np.ndarray | None]:
    values = [v.numpy() if _is_cpu_tensor(v) else v for v in values]
    first = values[0]
    if not (isinstance(first, np.ndarray) and first.dtype != object and first.ndim in (1, 2)):
        return collate_column(values), None
    url = rows[0].get("__url__") if rows and isinstance(rows[0], dict) else None
    missing = sum(v is None for v in values)
    if missing:
        raise SampleError(f"cannot pad field {name!r}: {missing} of the batch's {len(values)} samples have no such "
                          "field (for alternatives such as 'flac;wav', select them with to_tuple)", url)
    if not all(isinstance(v, np.ndarray) and v.ndim == first.ndim and v.shape[:-1] == first.shape[:-1]
               and v.dtype == first.dtype for v in values):
        other = next(v for v in values if not (isinstance(v, np.ndarray) and v.ndim == first.ndim
                                                and v.shape[:-1] == first.shape[:-1] and v.dtype == first.dtype))
        shape = getattr(other, "shape", type(other).__name__)
        raise SampleError(f"cannot pad column {name!r}: its values differ in more than their last axis "
                          f"({first.dtype} {first.shape} and {getattr(other, 'dtype', '')} {shape}); pad pads the "
                          "last axis only", url)
    lengths = np.array([v.shape[-1] for v in values], dtype=np.int64)
    batch = np.zeros((len(values), *first.shape[:-1], int(lengths.max())), dtype=first.dtype)
    for row, v in zip(batch, values, strict=True):
        row[..., : v.shape[-1]] = v
    return batch, lengths
