"""The decode stage: samples in, samples (or batches) with the image field decoded to an array."""

from __future__ import annotations

import dataclasses
import io
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..errors import DataWarning, DecodeError, OptionError, warner
from ..fieldspec import DEFAULT_IMAGE_SPEC, field_list
from ..samples import Sample
from ..stages import chunked
from .cpu import CpuDecoder, ImageError, Job
from .dali import DaliDecoder, dali_available, gpu_count
from .spec import AugmentSpec, plan_key

DEVICES = ("auto", "cpu", "dali-cpu", "gpu")
DECODE_ON_ERROR = ("fail", "skip")
DEFAULT_FIELDS = DEFAULT_IMAGE_SPEC  # "jpg;jpeg;png;webp": the image extensions the decoders read

Decoder = CpuDecoder | DaliDecoder


@dataclass
class DecodeStats:
    """What the stage did: images decoded, skipped (with ``on_error="skip"``), the backend used."""

    decoded: int = 0
    skipped: int = 0
    backend: str = ""


class Batch(NamedTuple):
    """A batch from ``batches``: keys, the images (one array when they share a shape, else a list)
    and the samples' other fields (the image field removed)."""

    keys: list[str]
    images: Any
    samples: list[Sample]


def resolve_device(device: str) -> str:
    """The backend ``device`` names: ``auto`` is ``gpu`` with DALI and a GPU present, else ``cpu``.

    >>> resolve_device("cpu")
    'cpu'
    """
    if device not in DEVICES:
        raise OptionError(f"bad device {device!r}; use one of {', '.join(DEVICES)}")
    if device == "auto":
        return "gpu" if dali_available() and gpu_count() > 0 else "cpu"
    if device == "gpu" and dali_available() and gpu_count() == 0:
        raise OptionError("--device gpu: no CUDA GPU found (use --device dali-cpu or cpu)")
    return device


def make_decoder(
    spec: AugmentSpec, device: str = "auto", batch_size: int = 64, processes: int = 1, device_id: int = 0
) -> Decoder:
    """The decoder for ``device``; ``processes`` is the cpu pool size, or DALI's thread count."""
    if batch_size < 1:
        raise OptionError(f"bad batch size {batch_size}; must be >= 1")
    if processes < 1:
        raise OptionError(f"bad number of processes {processes}; must be >= 1")
    device = resolve_device(device)
    if device == "cpu":
        return CpuDecoder(spec, processes)
    return DaliDecoder(spec, batch_size, threads=processes, gpu=device == "gpu", device_id=device_id)


def parse_field_list(field: str) -> list[str]:
    """``"jpg;jpeg,png"`` -> ``["jpg", "jpeg", "png"]`` (the first one a sample has is decoded): a
    field spec (``tarproc.fieldspec``) of alternatives only.

    >>> parse_field_list("jpg;jpeg,PNG")
    ['jpg', 'jpeg', 'png']
    """
    return field_list(field, "the decode field")


def decoded_batches(
    samples: Iterable[Sample],
    spec: AugmentSpec,
    *,
    field: str = DEFAULT_FIELDS,
    output_field: str | None = None,
    device: str | Decoder = "auto",
    batch_size: int = 64,
    processes: int = 1,
    on_error: str = "fail",
    stats: DecodeStats | None = None,
    warn: Callable[[str], None] | None = None,
    epoch: int = 0,
) -> Iterator[list[Sample]]:
    """Lists of up to ``batch_size`` samples whose image field holds the decoded array.

    The image is the first of ``field``'s names the sample has; it is replaced by the array, under
    ``output_field`` when given. A sample with no such field or an image that can't be decoded is
    a ``DecodeError`` naming URL, key and field, or, with ``on_error="skip"``, dropped, counted in
    ``stats.skipped`` and reported through ``warn`` (a callback; default a ``DataWarning``); the
    rest of its batch is kept.

    Random crops, flips, rotations and colours come from (seed, key); a nonzero ``epoch`` joins
    it to the key, so each epoch of a training feed gets fresh augmentations, still reproducible.
    A spec without a seed gets a fresh one on every call: each pass over the data is augmented
    anew (as torchvision does), not reproducibly.
    """
    if on_error not in DECODE_ON_ERROR:
        raise OptionError(f"bad on_error {on_error!r}; use one of {', '.join(DECODE_ON_ERROR)}")
    names = parse_field_list(field)
    if spec.seed is None and spec.random:
        spec = dataclasses.replace(spec, seed=secrets.randbits(63))
    stats = stats if stats is not None else DecodeStats()
    owned = isinstance(device, str)
    decoder = make_decoder(spec, device, batch_size, processes) if isinstance(device, str) else device
    stats.backend = decoder.name
    in_flight: deque[tuple[list[Sample], list[str | None]]] = deque()

    def jobs() -> Iterator[list[Job]]:
        for chunk in chunked(samples, batch_size):
            found = [next((n for n in names if n in s), None) for s in chunk]
            in_flight.append((chunk, found))
            yield [(bytes(s[f]), plan_key(str(s.get("__key__")), epoch)) for s, f in zip(chunk, found, strict=True) if f is not None]

    def failed(sample: Sample, fieldname: str | None, reason: str) -> None:
        error = DecodeError(reason, sample.get("__url__"), sample.get("__key__"), fieldname)
        if on_error == "fail":
            raise error
        stats.skipped += 1
        warner(warn, DataWarning)(f"skipped: {error}")

    try:
        for results in decoder.run(jobs()):
            chunk, found = in_flight.popleft()
            out: list[Sample] = []
            it = iter(results)
            for sample, fieldname in zip(chunk, found, strict=True):
                if fieldname is None:
                    failed(sample, None, f"no image field ({';'.join(names)})")
                    continue
                result = next(it)
                if isinstance(result, ImageError):
                    failed(sample, fieldname, str(result))
                    continue
                decoded = dict(sample)
                if output_field is not None:
                    if output_field != fieldname and output_field in decoded:
                        # never lose data silently: the sample already has a field of that name
                        raise DecodeError(
                            f"the sample already has a field {output_field!r}; choose another output field",
                            sample.get("__url__"), sample.get("__key__"), fieldname,
                        )
                    del decoded[fieldname]
                decoded[output_field or fieldname] = result
                out.append(decoded)
            stats.decoded += len(out)
            if out:
                yield out
    finally:
        if owned:
            decoder.close()


def decode_samples(samples: Iterable[Sample], spec: AugmentSpec, **kwargs: Any) -> Iterator[Sample]:
    """Samples with their image field replaced by the decoded, augmented array (a stage).

    Keyword arguments as for ``decoded_batches`` (``field``, ``output_field``, ``device``,
    ``batch_size``, ``processes``, ``on_error``, ``stats``, ``warn``).

    >>> import io; from PIL import Image
    >>> buf = io.BytesIO(); Image.new("RGB", (64, 48), (255, 0, 0)).save(buf, "PNG")
    >>> [s] = decode_samples([{"__key__": "a", "png": buf.getvalue(), "cls": b"3"}], AugmentSpec(size=32), device="cpu")
    >>> s["png"].shape, s["png"][0, 0].tolist(), s["cls"]
    ((32, 32, 3), [255, 0, 0], b'3')
    """
    for batch in decoded_batches(samples, spec, **kwargs):
        yield from batch


def batches(samples: Iterable[Sample], spec: AugmentSpec, **kwargs: Any) -> Iterator[Batch]:
    """``Batch(keys, images, samples)`` of up to ``batch_size`` samples (for training loops, tarserve).

    ``images`` is one ``(N, ...)`` array when the images share a shape (always with ``size``),
    else a list of arrays. A batch can be shorter than ``batch_size`` (the last one, or one that
    lost skipped images).
    """
    field = kwargs.pop("output_field", None) or "__image__"
    for batch in decoded_batches(samples, spec, output_field=field, **kwargs):
        images = [s.pop(field) for s in batch]
        same = all(a.shape == images[0].shape for a in images)
        stacked: Any = np.stack(images) if same else images
        yield Batch([str(s.get("__key__")) for s in batch], stacked, batch)


def npy_bytes(array: np.ndarray) -> bytes:
    """The ``.npy`` file (``numpy.save`` format) of an array.

    >>> np.load(io.BytesIO(npy_bytes(np.arange(3, dtype=np.uint8)))).tolist()
    [0, 1, 2]
    """
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array), allow_pickle=False)
    return buf.getvalue()
