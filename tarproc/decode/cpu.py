"""The ``cpu`` backend: simplejpeg for JPEGs, Pillow for everything else, an optional process pool.

JPEGs are decoded by libjpeg-turbo through simplejpeg, strictly (corrupt data is an error), at
1/2, 1/4 or 1/8 size in the DCT domain when the window still covers the output size at that scale
(only those factors: the others decode more slowly than a full decode); CMYK/YCCK JPEGs go to
Pillow, as do PNG, WebP and every other format Pillow reads. The window is resampled with Pillow's antialiased
bilinear filter, and ``finish`` flips, normalizes and lays out the array with numpy.
"""

from __future__ import annotations

import concurrent.futures
import io
import math
import multiprocessing
import sys
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from ..imaging import rgb_image
from ..sniff import sniff_type
from .spec import AugmentSpec, Plan, color_matrix

Job = tuple[bytes, str]  # (encoded image, sample key: the seed of its random parameters)
Result = Any  # np.ndarray, or ImageError for an image that could not be decoded
_JPEG_MAGIC = b"\xff\xd8\xff"
_PIL_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError, Image.DecompressionBombError)


class ImageError(Exception):
    """Why one image could not be decoded (the stage adds URL, key and field)."""


def _not_an_image(data: bytes) -> ImageError:
    kind = sniff_type(bytes(data[:512]))
    return ImageError(f"not an image (the data looks like {kind})" if kind not in ("jpeg", "png", "webp")
                      else f"damaged {kind} data")


def image_size(data: bytes) -> tuple[int, int]:
    """``(height, width)`` of an encoded image, from its header only."""
    if data[:3] == _JPEG_MAGIC:
        try:
            h, w, _, _ = simplejpeg.decode_jpeg_header(data, strict=False)
            return h, w
        except (ValueError, KeyError):  # simplejpeg raises KeyError for some damaged headers
            pass
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            w, h = im.size
    except UnidentifiedImageError:
        raise _not_an_image(data) from None
    except (*_PIL_ERRORS, Image.DecompressionBombWarning) as e:
        raise ImageError(str(e) or type(e).__name__) from None
    return h, w


def dct_factor(plan: Plan) -> int:
    """The largest of 8, 4, 2 by which the window can shrink and still cover the output, else 1."""
    x0, y0, x1, y1 = plan.window
    for f in (8, 4, 2):
        if (x1 - x0) / f >= plan.out[0] and (y1 - y0) / f >= plan.out[1]:
            return f
    return 1


def decode_rgb(data: bytes, spec: AugmentSpec, key: str, dct_scaling: bool = True) -> tuple[np.ndarray, Plan]:
    """Decode, crop and resize one image into an ``(h, w, 3)`` uint8 RGB array, and its plan."""
    if data[:3] == _JPEG_MAGIC:
        try:
            h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data, strict=False)
        except (ValueError, KeyError) as e:  # simplejpeg raises KeyError for some damaged headers
            raise ImageError(f"damaged JPEG header: {e}") from None
        if colorspace not in ("CMYK", "YCCK"):  # Pillow converts those (Adobe inverted CMYK included)
            plan = _plan(spec, key, h, w)
            f = dct_factor(plan) if dct_scaling and not plan.identity else 1
            try:
                # strict: libjpeg's "corrupt data" and "premature end" warnings are errors, which
                # Pillow would let pass, returning grey or garbled pixels
                if f > 1:
                    array = simplejpeg.decode_jpeg(data, colorspace="RGB", min_height=math.ceil(h / f),
                                                   min_width=math.ceil(w / f), min_factor=f)
                else:
                    array = simplejpeg.decode_jpeg(data, colorspace="RGB")
            except (ValueError, KeyError) as e:
                raise ImageError(str(e) or type(e).__name__) from None
            if plan.identity and plan.color is None:  # crop in place, without a round trip through Pillow
                x0, y0, x1, y1 = (int(v) for v in plan.window)
                return array[y0:y1, x0:x1], plan
            return _resample(Image.fromarray(array), plan, f), plan
    return _decode_pillow(data, spec, key)


def _plan(spec: AugmentSpec, key: str, h: int, w: int) -> Plan:
    try:
        return spec.plan(key, h, w)
    except ValueError as e:
        raise ImageError(str(e)) from None


def _decode_pillow(data: bytes, spec: AugmentSpec, key: str) -> tuple[np.ndarray, Plan]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            im = Image.open(io.BytesIO(data))
            w, h = im.size
            plan = _plan(spec, key, h, w)
            # drops alpha (as DALI does), replicates gray, converts CMYK, scales 16-bit grey
            rgb = rgb_image(im)
    except UnidentifiedImageError:
        raise _not_an_image(data) from None
    except (*_PIL_ERRORS, Image.DecompressionBombWarning) as e:
        raise ImageError(str(e) or type(e).__name__) from None
    return _resample(rgb, plan, 1), plan


def _resample(im: Image.Image, plan: Plan, factor: int) -> np.ndarray:
    """Rotate, take and resample the window, and map the colours, as ``plan`` says."""
    if plan.angle:
        # about the centre, keeping the size, black corners (as DALI's rotate with keep_size)
        im = im.rotate(plan.angle, Image.Resampling.BILINEAR, expand=False, fillcolor=(0, 0, 0))
    if plan.identity:
        x0, y0, x1, y1 = (int(v) for v in plan.window)
        if (x0, y0, x1, y1) != (0, 0, im.width, im.height):
            im = im.crop((x0, y0, x1, y1))
    else:
        box = tuple(v / factor for v in plan.window)
        im = im.resize(plan.out, Image.Resampling.BILINEAR, box=box)  # type: ignore[arg-type]
    if plan.color is not None:
        # one affine map, rounded and clipped to 0..255 in C (Pillow's matrix conversion)
        matrix, offset = color_matrix(plan.color)
        im = im.convert("RGB", tuple(v for row in matrix for v in (*row, offset)))  # type: ignore[arg-type]
    return np.asarray(im)


def finish(array: np.ndarray, plan: Plan, spec: AugmentSpec) -> np.ndarray:
    """Flip, normalize, cast and lay out a decoded ``(h, w, 3)`` uint8 array."""
    if plan.flip:
        array = array[:, ::-1]
    dtype = spec.output_dtype
    if spec.normalized:
        # a 256-entry table per channel, written straight into the output layout: one pass
        mean, std = spec.mean_std_255
        levels = np.arange(256, dtype=np.float32)
        chw = spec.layout == "CHW"
        out = np.empty((3, *array.shape[:2]) if chw else array.shape, dtype)
        for c in range(3):
            table = ((levels - np.float32(mean[c])) * np.float32(1 / std[c])).astype(dtype)
            np.take(table, array[:, :, c], out=out[c] if chw else out[:, :, c])
        return out
    if dtype != "uint8":
        array = array.astype(dtype)
    if spec.layout == "CHW":
        array = array.transpose(2, 0, 1)
    return np.ascontiguousarray(array)


def decode_image(data: bytes, spec: AugmentSpec, key: str, dct_scaling: bool = True) -> np.ndarray:
    """Decode and augment one image as ``spec`` says; raises ``ImageError``.

    >>> import io; from PIL import Image
    >>> buf = io.BytesIO(); Image.new("L", (40, 30), 128).save(buf, "PNG")
    >>> decode_image(buf.getvalue(), AugmentSpec(size=20, resize=24, layout="CHW"), "k").shape
    (3, 20, 20)
    """
    array, plan = decode_rgb(data, spec, key, dct_scaling)
    return finish(array, plan, spec)


def _decode_or_error(job: Job, spec: AugmentSpec, dct_scaling: bool) -> Result:
    try:
        return decode_image(job[0], spec, job[1], dct_scaling)
    except ImageError as e:
        return e


# per worker process: set once by the pool initializer, so jobs carry only bytes and keys
_worker: dict[str, Any] = {}


def _init_worker(spec: AugmentSpec, dct_scaling: bool) -> None:
    _worker.update(spec=spec, dct_scaling=dct_scaling)


def _decode_chunk(jobs: list[Job]) -> list[Result]:
    return [_decode_or_error(job, _worker["spec"], _worker["dct_scaling"]) for job in jobs]


class CpuDecoder:
    """Decode batches of jobs in this process (``processes=1``) or in a pool, in order.

    ``run`` keeps at most ``ahead`` batches in flight, so memory stays bounded however long the
    input; results are ``np.ndarray`` or ``ImageError``, one per job, in job order.
    """

    name = "cpu"

    def __init__(self, spec: AugmentSpec, processes: int = 1, dct_scaling: bool = True, ahead: int = 2) -> None:
        self.spec = spec
        self.processes = processes
        self.dct_scaling = dct_scaling
        self.ahead = ahead
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        if processes > 1:
            # fork starts workers in milliseconds and needs no importable __main__; elsewhere the default
            method = "fork" if sys.platform.startswith("linux") else None
            self._pool = concurrent.futures.ProcessPoolExecutor(
                processes, mp_context=multiprocessing.get_context(method),
                initializer=_init_worker, initargs=(spec, dct_scaling),
            )

    def describe(self) -> str:
        return f"cpu (simplejpeg/Pillow, {self.processes} process{'es' if self.processes > 1 else ''})"

    def decode_one(self, job: Job) -> Result:
        return _decode_or_error(job, self.spec, self.dct_scaling)

    def run(self, batches: Iterable[list[Job]]) -> Iterator[list[Result]]:
        if self._pool is None:
            for batch in batches:
                yield [self.decode_one(job) for job in batch]
            return
        pending: deque[list[concurrent.futures.Future[list[Result]]]] = deque()
        for batch in batches:
            chunk = max(1, math.ceil(len(batch) / self.processes))
            pending.append([self._pool.submit(_decode_chunk, batch[i:i + chunk]) for i in range(0, len(batch), chunk)])
            while len(pending) > self.ahead:
                yield [r for f in pending.popleft() for r in f.result()]
        while pending:
            yield [r for f in pending.popleft() for r in f.result()]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
