"""The ``cpu`` backend: libjpeg-turbo for JPEGs, Pillow for everything else, an optional process pool.

JPEGs are decoded by libjpeg-turbo, strictly (corrupt data is an error), at the smallest of the
scales in ``DCT_SCALES`` (eighths: 1/8, 1/4, 1/2, or full size) at which the window still covers
the output size (libjpeg scales by any M/8 in the IDCT, but the other M/8 decode more slowly than
the full size: see ``DCT_SCALES``). Where tarproc's own extension
(``tarproc._jpeg``, built against the system's libjpeg-turbo) is present, only the part of the
image the window needs is transformed (and nothing below it decoded; a stream cut short is an error
whatever the crop), the entropy (Huffman) decoding of a baseline JPEG is the extension's own (the
same coefficients as libjpeg's, faster, and two restart segments at a time where ``tarjpeg`` wrote
markers), the pixels land in memory used again from one image to the next, and the window's resize,
colour map, flip and normalization run in one C pass with Pillow's filter coefficients; elsewhere
simplejpeg decodes the whole image and Pillow and numpy do the rest, to within a level of the same
pixels. CMYK/YCCK JPEGs go to Pillow, as do PNG, WebP and every other format Pillow reads. The
window is resampled with Pillow's antialiased bilinear filter.
"""

from __future__ import annotations

import concurrent.futures
import io
import math
import warnings
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np
import simplejpeg
from PIL import Image, UnidentifiedImageError

from ..imaging import rgb_image
from ..procgroup import worker_pool
from ..sniff import sniff_type
from .spec import AugmentSpec, Plan, color_matrix, rotation_steps

_jpeg: Any
try:  # tarproc's own libjpeg-turbo fast path (optional: built when libjpeg's headers are there)
    from .. import _jpeg  # type: ignore[attr-defined, no-redef]
except ImportError:  # pragma: no cover - depends on the build
    _jpeg = None

Job = tuple[bytes, str]  # (encoded image, sample key: the seed of its random parameters)
ImageData = bytes | memoryview  # an encoded image: its bytes, or a view of a buffer read into (Dataset)
Result = Any  # np.ndarray, or ImageError for an image that could not be decoded
_JPEG_MAGIC = b"\xff\xd8\xff"
_PIL_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, TypeError, Image.DecompressionBombError)


class ImageError(Exception):
    """Why one image could not be decoded (the stage adds URL, key and field)."""


def _not_an_image(data: ImageData) -> ImageError:
    kind = sniff_type(bytes(data[:512]))
    return ImageError(f"not an image (the data looks like {kind})" if kind not in ("jpeg", "png", "webp")
                      else f"damaged {kind} data")


def image_size(data: ImageData) -> tuple[int, int]:
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


# The scales (in eighths of the stored size) JPEGs are decoded at. libjpeg-turbo's IDCT scales by
# any M/8, but only 1/8, 2/8, 4/8 and 8/8 have SIMD code (2.1 and 3.x); the others are plain C and,
# measured on 500x375 4:2:0 ImageNet-like JPEGs (AMD EPYC, one core, decode_region of the whole
# image, median ms), decode more slowly than the full size does: 1/8 0.94, 2/8 1.06, 3/8 1.22,
# 4/8 1.19, 5/8 1.52, 6/8 1.68, 7/8 2.08, 8/8 1.41; on random-resized crops to 224 (decode of the
# window + resample) 5/8 1.71 vs 8/8 1.63, 6/8 1.80 vs 1.59, 7/8 1.87 vs 1.50, and on 2048x1536
# photos 3/8 9.14 vs 4/8 9.02. So a scale is kept only where it beats the next larger one.
DCT_SCALES = (1, 2, 4, 8)
_POWER_OF_TWO_SCALES = (1, 2, 4, 8)  # simplejpeg's path (no tarproc._jpeg) takes only these


def dct_scale(plan: Plan, scales: Iterable[int] = DCT_SCALES) -> int:
    """The smallest scale M of ``scales`` (eighths) at which the window, decoded at M/8 of its size,
    still covers the output; 8 (the full size) when none does.

    >>> plan = Plan((0, 0, 800, 600), (224, 224), False)
    >>> dct_scale(plan), dct_scale(plan, range(1, 9))
    (4, 3)
    """
    x0, y0, x1, y1 = plan.window
    for m in sorted(scales):
        if (x1 - x0) * m / 8 >= plan.out[0] and (y1 - y0) * m / 8 >= plan.out[1]:
            return m
    return 8


def _scaled(size: int, scale: int) -> int:
    """A side of the image decoded at scale/8, as libjpeg rounds it (up)."""
    return -(-size * scale // 8)


class JpegPlan(NamedTuple):
    """A JPEG's stored size, its plan, and the scale (eighths) it is decoded at."""

    height: int
    width: int
    plan: Plan
    scale: int

    @property
    def factor(self) -> float:
        """What window coordinates are divided by in the decoded image (8 / scale)."""
        return 8 / self.scale


_UNSET: Any = object()


def jpeg_plan(data: ImageData, spec: AugmentSpec, key: str, dct_scaling: bool = True) -> JpegPlan | None:
    """The plan of a JPEG that libjpeg decodes here, from its header; None when the data is not a
    JPEG, or is a CMYK/YCCK one (Pillow converts those: Adobe's inverted CMYK included)."""
    if data[:3] != _JPEG_MAGIC:
        return None
    try:
        h, w, colorspace, _ = simplejpeg.decode_jpeg_header(data, strict=False)
    except (ValueError, KeyError) as e:  # simplejpeg raises KeyError for some damaged headers
        raise _header_error(data, e) from None
    if colorspace in ("CMYK", "YCCK"):
        return None
    plan = _plan(spec, key, h, w)
    scales = DCT_SCALES if _jpeg is not None else _POWER_OF_TWO_SCALES
    return JpegPlan(h, w, plan, dct_scale(plan, scales) if dct_scaling and not plan.identity else 8)


def _header_error(data: ImageData, e: Exception) -> ImageError:
    """A damaged header in words: libjpeg's reason where tarproc._jpeg can ask it (simplejpeg says
    only ``-1`` when it cannot read the frame header), and what the number means."""
    said = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    reason = "the frame header (size, colour components) is missing, cut short or corrupt"
    if _jpeg is not None:
        try:
            _jpeg.read_header(data)
        except ValueError as why:
            reason = f"libjpeg: {why}"
    return ImageError(f"damaged JPEG header (simplejpeg: {said}): not a decodable JPEG ({reason}); "
                      f"the {len(data):,} bytes start like a JPEG but are cut short or are not one")


def decode_rgb(
    data: ImageData, spec: AugmentSpec, key: str, dct_scaling: bool = True, jpeg: JpegPlan | None = _UNSET
) -> tuple[np.ndarray, Plan]:
    """Decode, crop and resize one image into an ``(h, w, 3)`` uint8 RGB array (or an ``(h, w, 4)``
    RGBX one: ``finish`` reads the first three channels), and its plan. ``jpeg`` is ``jpeg_plan``'s
    answer when the caller has it already."""
    if jpeg is _UNSET:
        jpeg = jpeg_plan(data, spec, key, dct_scaling)
    if jpeg is None:
        return _decode_pillow(data, spec, key)
    h, w, plan, scale = jpeg
    f = jpeg.factor
    copy = plan.identity and plan.color is None  # pixels as stored: no resampling at all
    if _jpeg is not None and copy:  # the window's rows and columns only, as RGB: no copy after
        x0, y0, x1, y1 = (int(v) for v in plan.window)
        array, ox, oy = _decode_region(data, plan, h, w, 8, channels=3)
        return array[y0 - oy:y1 - oy, x0 - ox:x1 - ox], plan
    if _jpeg is not None:
        return _decode_region_rgb(data, plan, h, w, scale), plan
    try:
        # strict: libjpeg's "corrupt data" and "premature end" warnings are errors, which Pillow
        # would let pass, returning grey or garbled pixels. RGBX: four bytes a pixel is Pillow's own
        # layout, so Pillow works on the decoded buffer in place instead of copying it
        colorspace = "RGB" if copy else "RGBX"
        if scale < 8:  # a power of two here (_POWER_OF_TWO_SCALES)
            array = simplejpeg.decode_jpeg(data, colorspace=colorspace, min_height=_scaled(h, scale),
                                           min_width=_scaled(w, scale), min_factor=8 // scale)
        else:
            array = simplejpeg.decode_jpeg(data, colorspace=colorspace)
    except (ValueError, KeyError) as e:
        raise ImageError(str(e) or type(e).__name__) from None
    if copy:  # crop in place, without a round trip through Pillow
        x0, y0, x1, y1 = (int(v) for v in plan.window)
        return array[y0:y1, x0:x1, :3], plan
    im = Image.frombuffer("RGBX", (array.shape[1], array.shape[0]), array, "raw", "RGBX", 0, 1)
    return _resample(im, plan, f, (w / 2 / f, h / 2 / f)), plan


def _region(plan: Plan, h: int, w: int, scale: int) -> tuple[int, int, int, int]:
    """The pixels (of the image decoded at scale/8) that resampling ``plan`` reads, with a margin."""
    sw, sh, f = _scaled(w, scale), _scaled(h, scale), 8 / scale
    if plan.angle:
        steps = rotation_steps(plan, sw, sh, f, (w / 2 / f, h / 2 / f))
        if steps is None:
            return 0, 0, 1, 1
        (bx0, by0, bx1, by1), _, _ = steps
        return bx0 - 2, by0 - 2, bx1 + 2, by1 + 2
    x0, y0, x1, y1 = (v / f for v in plan.window)
    mx = math.ceil(max(1.0, (x1 - x0) / plan.out[0])) + 2  # the filter's reach, and a margin
    my = math.ceil(max(1.0, (y1 - y0) / plan.out[1])) + 2
    return math.floor(x0) - mx, math.floor(y0) - my, math.ceil(x1) + mx, math.ceil(y1) + my


def _decode_region(data: ImageData, plan: Plan, h: int, w: int, scale: int, channels: int = 4) -> tuple[np.ndarray, int, int]:
    """The RGBX pixels ``plan`` needs, and their origin in the image decoded at scale/8; with
    ``channels=3``, the RGB pixels of an identity plan's window (stored pixels, copied as they are)."""
    if channels == 3:
        x0, y0, x1, y1 = (int(v) for v in plan.window)
    else:
        x0, y0, x1, y1 = _region(plan, h, w, scale)
    try:
        got = _jpeg.decode_region(data, x0, y0, x1, y1, 8, scale, channels)
    except ValueError as e:
        raise ImageError(str(e) or "damaged JPEG data") from None
    if got is None:  # CMYK/YCCK: the caller checked the header, so this is a damaged header
        raise ImageError("unsupported JPEG colour space")
    buf, cw, ch, ox, oy = got
    return np.frombuffer(buf, np.uint8).reshape(ch, cw, channels), ox, oy


def _shifted(plan: Plan, ox: int, oy: int, f: float) -> Plan:
    x0, y0, x1, y1 = plan.window
    return plan._replace(window=(x0 - ox * f, y0 - oy * f, x1 - ox * f, y1 - oy * f))


def _decode_region_rgb(data: ImageData, plan: Plan, h: int, w: int, scale: int) -> np.ndarray:
    array, ox, oy = _decode_region(data, plan, h, w, scale)
    f = 8 / scale
    if plan.identity and plan.color is None:
        x0, y0, x1, y1 = (int(v) for v in plan.window)
        return array[y0 - oy:y1 - oy, x0 - ox:x1 - ox, :3]
    im = Image.frombuffer("RGBX", (array.shape[1], array.shape[0]), array, "raw", "RGBX", 0, 1)
    return _resample(im, _shifted(plan, ox, oy, f), f, (w / 2 / f - ox, h / 2 / f - oy))


_MODES = {("uint8", "HWC"): 0, ("uint8", "CHW"): 1, ("float32", "HWC"): 2, ("float32", "CHW"): 3}


def c_tables(spec: AugmentSpec) -> np.ndarray:
    """Each channel's output value for each level (normalized, or the level itself) as
    ``tarproc._jpeg`` takes them: 3 x 256 float32, then each channel's ``(sub, mul)`` -- every value
    is ``(level - sub) * mul`` in float32, which lets its AVX2 pass compute a row rather than look it
    up (it checks that they are, entry by entry). Computed once per (mean, std)."""
    tables = _TABLES.get((spec.mean, spec.std))
    if tables is None:
        if spec.normalized:
            mean, std = spec.mean_std_255
            pairs = [(np.float32(m), np.float32(1 / s)) for m, s in zip(mean, std, strict=True)]
        else:
            pairs = [(np.float32(0), np.float32(1))] * 3
        levels = np.arange(256, dtype=np.float32)
        rows = [(levels - sub) * mul for sub, mul in pairs]
        tables = _TABLES.setdefault((spec.mean, spec.std), np.concatenate([*rows, np.array(pairs, np.float32).ravel()]))
    return tables


def normalization_tables(spec: AugmentSpec) -> np.ndarray:
    """``(3, 256)`` float32: each channel's output value for each level (``c_tables``' values)."""
    return c_tables(spec)[: 3 * 256].reshape(3, 256)


_TABLES: dict[Any, np.ndarray] = {}


def _fused_applies(spec: AugmentSpec, plan: Plan) -> bool:
    """Whether ``tarproc._jpeg`` does the whole job: a layout and dtype it writes, and some pass over
    the pixels to do (plain stored pixels are quicker to decode whole)."""
    if _jpeg is None or (spec.output_dtype, spec.layout) not in _MODES:
        return False
    return not (plan.identity and plan.color is None and not spec.normalized and spec.layout == "HWC")


def _decode_jpeg_fused(data: ImageData, spec: AugmentSpec, jpeg: JpegPlan, out: np.ndarray | None) -> np.ndarray:
    """A JPEG decoded, resampled (rotated), colour-mapped, flipped and normalized by ``tarproc._jpeg``."""
    h, w, plan, scale = jpeg
    f = jpeg.factor
    mode = _MODES[(spec.output_dtype, spec.layout)]
    array, ox, oy = _decode_region(data, plan, h, w, scale)
    x0, y0, x1, y1 = (v / f for v in plan.window)
    ow, oh = plan.out
    if out is None:
        out = np.empty((3, oh, ow) if spec.layout == "CHW" else (oh, ow, 3), spec.output_dtype)
    color = None
    if plan.color is not None:
        matrix, offset = color_matrix(plan.color)
        color = [v for row in matrix for v in (*row, offset)]
    tables = c_tables(spec)
    if not plan.angle:
        _jpeg.resample(array, array.shape[1], array.shape[0], (x0 - ox, y0 - oy, x1 - ox, y1 - oy), ow, oh,
                       plan.flip, color, tables, mode, out)
        return out
    # the rotated window's two steps (rotation_steps), in the region's coordinates
    steps = rotation_steps(_shifted(plan, ox, oy, f), array.shape[1], array.shape[0], f, (w / 2 / f - ox, h / 2 / f - oy))
    if steps is None:  # the window lies wholly outside the rotated image: black
        steps = ((0, 0, 1, 1), (1, 1), (0.0, 0.0, -1e6, 0.0, 0.0, -1e6))
    box, (tw, th), to_step1 = steps
    step1 = np.empty(th * tw * 3 + 1, np.uint8)  # a spare byte: warp's AVX2 path reads 4 bytes a pixel
    _jpeg.resample(array, array.shape[1], array.shape[0], box, tw, th, False, None, b"", 0, step1[:-1])
    _jpeg.warp(step1, tw, th, to_step1, ow, oh, plan.flip, color, tables, mode, out)
    return out


def _plan(spec: AugmentSpec, key: str, h: int, w: int) -> Plan:
    try:
        return spec.plan(key, h, w)
    except ValueError as e:
        raise ImageError(str(e)) from None


def _decode_pillow(data: ImageData, spec: AugmentSpec, key: str) -> tuple[np.ndarray, Plan]:
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
    return _resample(rgb, plan, 1, (w / 2, h / 2)), plan


def _resample(im: Image.Image, plan: Plan, factor: float, center: tuple[float, float] | None = None) -> np.ndarray:
    """Rotate, take and resample the window, and map the colours, as ``plan`` says.

    ``factor`` is the DCT reduction the image was decoded with (8 / scale: window coordinates are
    divided by it); ``center`` the centre of rotation in the image's coordinates (default: its middle).
    """
    if plan.angle:
        im = _rotated_window(im, plan, factor, center or (im.width / 2, im.height / 2))
    elif plan.identity:
        x0, y0, x1, y1 = (int(v) for v in plan.window)
        if (x0, y0, x1, y1) != (0, 0, im.width, im.height):
            im = im.crop((x0, y0, x1, y1))
    else:
        box = tuple(v / factor for v in plan.window)
        im = im.resize(plan.out, Image.Resampling.BILINEAR, box=box)  # type: ignore[arg-type]
    if plan.color is not None:
        # one affine map, rounded and clipped to 0..255 in C (Pillow's matrix conversion)
        matrix, offset = color_matrix(plan.color)
        if im.mode != "RGB":
            im = im.convert("RGB")
        im = im.convert("RGB", tuple(v for row in matrix for v in (*row, offset)))  # type: ignore[arg-type]
    return np.asarray(im)


def _rotated_window(im: Image.Image, plan: Plan, factor: float, center: tuple[float, float]) -> Image.Image:
    """The rotated window, in the two steps ``rotation_steps`` computes (see ``tarproc.decode.spec``)."""
    steps = rotation_steps(plan, im.width, im.height, factor, center)
    if steps is None:  # the window lies wholly outside the rotated image
        return Image.new("RGB", plan.out)
    box, size, matrix = steps
    region = im.resize(size, Image.Resampling.BILINEAR, box=box)
    fill = (0, 0, 0, 0) if region.mode in ("RGBX", "RGBA") else (0, 0, 0)
    return region.transform(plan.out, Image.Transform.AFFINE, matrix, Image.Resampling.BILINEAR, fillcolor=fill)


def finish(array: np.ndarray, plan: Plan, spec: AugmentSpec, out: np.ndarray | None = None) -> np.ndarray:
    """Flip, normalize, cast and lay out a decoded ``(h, w, 3)`` (or RGBX ``(h, w, 4)``) uint8
    array; into ``out`` when given (a slot of a batch: no copy afterwards)."""
    if plan.flip:
        array = array[:, ::-1]
    dtype = spec.output_dtype
    chw = spec.layout == "CHW"
    if spec.normalized:
        # a 256-entry table per channel, written straight into the output layout: one pass
        tables = normalization_tables(spec).astype(dtype, copy=False)
        if out is None:
            out = np.empty((3, *array.shape[:2]) if chw else (*array.shape[:2], 3), dtype)
        for c in range(3):
            np.take(tables[c], array[:, :, c], out=out[c] if chw else out[:, :, c])
        return out
    rgb = array[:, :, :3]
    if chw:
        rgb = rgb.transpose(2, 0, 1)
    if out is not None:
        np.copyto(out, rgb, casting="unsafe")
        return out
    return np.ascontiguousarray(rgb, dtype=dtype)


def decode_image(data: ImageData, spec: AugmentSpec, key: str, dct_scaling: bool = True) -> np.ndarray:
    """Decode and augment one image as ``spec`` says; raises ``ImageError``.

    >>> import io; from PIL import Image
    >>> buf = io.BytesIO(); Image.new("L", (40, 30), 128).save(buf, "PNG")
    >>> decode_image(buf.getvalue(), AugmentSpec(size=20, resize=24, layout="CHW"), "k").shape
    (3, 20, 20)
    """
    return _decode(data, spec, key, dct_scaling, None)


def decode_into(data: ImageData, spec: AugmentSpec, key: str, out: np.ndarray, dct_scaling: bool = True) -> None:
    """``decode_image`` into ``out`` (a slot of a batch array of the output's shape and dtype); the
    data may be a view of a buffer the caller uses again (nothing keeps it)."""
    _decode(data, spec, key, dct_scaling, out)


def _decode(data: ImageData, spec: AugmentSpec, key: str, dct_scaling: bool, out: np.ndarray | None) -> np.ndarray:
    jpeg = jpeg_plan(data, spec, key, dct_scaling)  # the header is read, and the plan drawn, once
    if jpeg is not None and _fused_applies(spec, jpeg.plan):
        return _decode_jpeg_fused(data, spec, jpeg, out)
    array, plan = decode_rgb(data, spec, key, dct_scaling, jpeg)
    return finish(array, plan, spec, out=out)


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
            self._pool = worker_pool(processes, _init_worker, (spec, dct_scaling))

    def describe(self) -> str:
        jpeg = "libjpeg-turbo region decode" if _jpeg is not None else "simplejpeg"
        return f"cpu ({jpeg}/Pillow, {self.processes} process{'es' if self.processes > 1 else ''})"

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
