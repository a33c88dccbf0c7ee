"""The augmentation spec and its exact semantics, shared by every decode backend.

Every geometric transform is reduced, on the host, to one **plan** per image: a window
``(x0, y0, x1, y1)`` in the coordinates of the stored image (continuous pixel coordinates: pixel
``i`` covers ``[i, i+1)``), the output size ``(width, height)`` the window is resampled to, and a
horizontal flip flag. The backends only execute plans, so ``cpu`` and ``dali-cpu``/``gpu`` crop the
same window and flip the same images for the same seed:

- ``size`` and ``resize`` (center crop, the usual evaluation transform): the window is the square
  of side ``size * min(h, w) / resize`` centred on the image (fractional coordinates allowed), i.e.
  exactly "scale the shorter side to ``resize``, then crop ``size`` x ``size`` from the centre",
  done as one resampling step;
- ``size`` without ``resize``: a ``size`` x ``size`` window of stored pixels at integer offsets
  ``((w - size) // 2, (h - size) // 2)``, copied without resampling;
- ``resize`` alone: the whole image, shorter side scaled to ``resize`` (longer side rounded);
- ``random_crop``: torchvision's ``RandomResizedCrop`` window (area fraction drawn from ``scale``,
  log-uniform aspect ratio from ``ratio``, 10 attempts then a central fallback; integer window),
  resampled to ``size`` x ``size``;
- ``flip``: the image is mirrored horizontally with probability ``flip``;
- ``rotate``: the window is taken in the image rotated counter-clockwise about its centre by an
  angle drawn uniformly from ``[-rotate, rotate]`` degrees, keeping its size, corners filled with
  black (torchvision's ``RandomRotation(rotate)`` followed by the crop). Rather than rotating every
  pixel, both backends resample only the source region under the window, in two steps
  (``rotation_steps``): that region scaled down, antialiased, by the smaller of the window's two
  scale factors, then one bilinear affine warp that rotates it and scales it the rest of the way;
- colour jitter (``brightness``, ``contrast``, ``saturation``, ``hue``, torchvision's
  ``ColorJitter`` ranges: factors drawn from ``[max(0, 1 - x), 1 + x]``, the hue shift from
  ``[-hue, hue]`` of a full turn) applied to the resampled window as **one affine colour map** per
  image, then rounded and clipped to 0..255: hue rotates and saturation scales the chroma plane of
  YIQ space, contrast scales around mid-grey 128, brightness scales everything, i.e.
  ``out = b * (c * (H(s, h) @ rgb) + 128 * (1 - c))``. This is exactly DALI's ``color_twist``, so
  every backend computes the same map. It differs from torchvision in three stated ways: contrast
  pivots on 128 rather than on the image's mean grey, hue is a YIQ rotation rather than an HSV
  shift, and the order is fixed (one map) rather than random.

Resampling is bilinear with antialiasing (a triangle filter widened by the downscale factor:
Pillow's ``BILINEAR``, DALI's ``INTERP_LINEAR`` with ``antialias=True``). Per-image randomness comes
from ``random.Random(f"{seed}/{key}")``: the same seed gives the same crops and flips whatever the
backend, the batch size, the number of processes or the order of the samples. Training feeds add
the epoch to the key (``plan_key``), so each epoch gets new augmentations, still reproducible. With
``seed=None`` (the default) the stages draw a fresh seed each time they run: new augmentations on
every pass, as torchvision gives, but not reproducible.

Pixel values: RGB (grayscale replicated, CMYK converted, alpha dropped), EXIF orientation ignored
(pixels as stored). Without ``mean``/``std`` the values are 0..255 (as uint8 or float); with them,
``(pixel / 255 - mean) / std`` per channel, computed in float32 and then cast to ``dtype``. The
dtype, unless given: **uint8 without** ``mean``/``std``, **float32 with** them (``output_dtype``);
``dtype="float32"`` without them gives floats 0..255, not 0..1.

A keyword that belongs to another object (``AugmentSpec(image="jpg")``: ``image`` is the
Dataset's) is a ``ParameterError`` (an ``OptionError`` and a ``TypeError``) that says where it goes.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from ..errors import OptionError, ParameterError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
LAYOUTS = ("HWC", "CHW")
DTYPES = ("uint8", "float16", "float32")


class Plan(NamedTuple):
    """What to do with one image: rotate by ``angle`` degrees (counter-clockwise), resample ``window``
    (x0, y0, x1, y1) to ``out`` (w, h), flip, then apply ``color`` (brightness, contrast,
    saturation, hue in degrees) when it is not None."""

    window: tuple[float, float, float, float]
    out: tuple[int, int]
    flip: bool
    angle: float = 0.0
    color: tuple[float, float, float, float] | None = None

    @property
    def identity(self) -> bool:
        """True when the plan copies stored pixels (no resampling needed)."""
        x0, y0, x1, y1 = self.window
        return (
            self.angle == 0
            and self.out == (round(x1 - x0), round(y1 - y0))
            and all(float(v).is_integer() for v in self.window)
        )


def rotation_steps(
    plan: Plan, width: int, height: int, factor: float = 1, center: tuple[float, float] | None = None
) -> tuple[tuple[int, int, int, int], tuple[int, int], tuple[float, ...]] | None:
    """The two steps of a rotated window: ``(box, size, matrix)``, or None when the window lies
    wholly outside the rotated image.

    Step 1 resamples ``box`` (x0, y0, x1, y1: the source pixels under the rotated window, plus a
    pixel of margin, within the image) to ``size`` (w, h), scaled down by the smaller of the
    window's scale factors (never up). Step 2 is an affine warp to ``plan.out`` whose ``matrix``
    (a, b, c, d, e, f) maps output coordinates to step-1 coordinates, ``(a X + b Y + c, d X + e Y
    + f)``, in continuous pixel coordinates. ``factor`` divides the window (a DCT-reduced decode);
    ``center`` is the centre of rotation (default: the image's middle).

    >>> box, size, m = rotation_steps(Plan((0, 0, 40, 40), (20, 20), False, 0.0), 40, 40)
    >>> box, size, [round(v, 6) + 0.0 for v in m]
    ((0, 0, 40, 40), (20, 20), [1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
    """
    x0, y0, x1, y1 = (v / factor for v in plan.window)
    ow, oh = plan.out
    cx, cy = center if center is not None else (width / 2, height / 2)
    sx, sy = (x1 - x0) / ow, (y1 - y0) / oh
    a = -math.radians(plan.angle)  # output-to-input rotation (Pillow's rotate builds the same)
    m00, m01, m10, m11 = math.cos(a), math.sin(a), -math.sin(a), math.cos(a)
    corners = [(m00 * (x - cx) + m01 * (y - cy) + cx, m10 * (x - cx) + m11 * (y - cy) + cy) for x in (x0, x1) for y in (y0, y1)]
    bx0 = max(0, math.floor(min(c[0] for c in corners)) - 1)
    by0 = max(0, math.floor(min(c[1] for c in corners)) - 1)
    bx1 = min(width, math.ceil(max(c[0] for c in corners)) + 1)
    by1 = min(height, math.ceil(max(c[1] for c in corners)) + 1)
    if bx1 <= bx0 or by1 <= by0:
        return None
    shrink = max(1.0, min(sx, sy))
    tw, th = max(1, round((bx1 - bx0) / shrink)), max(1, round((by1 - by0) / shrink))
    kx, ky = tw / (bx1 - bx0), th / (by1 - by0)
    # output (X, Y) -> window (x0 + X sx, y0 + Y sy) -> source (rotation) -> step 1 (offset, scale)
    matrix = (
        kx * m00 * sx, kx * m01 * sy, kx * (m00 * (x0 - cx) + m01 * (y0 - cy) + cx - bx0),
        ky * m10 * sx, ky * m11 * sy, ky * (m10 * (x0 - cx) + m11 * (y0 - cy) + cy - by0),
    )
    return (bx0, by0, bx1, by1), (tw, th), matrix


def plan_key(key: str, epoch: int = 0) -> str:
    """The string a sample's random parameters are drawn from: its key, joined to the epoch after 0.

    >>> plan_key("a"), plan_key("a", 2)
    ('a', 'a\\x00epoch 2')
    """
    return key if epoch == 0 else f"{key}\x00epoch {epoch}"


_YIQ = ((0.299, 0.587, 0.114), (0.596, -0.274, -0.322), (0.211, -0.523, 0.312))


def _inverse3(m: tuple[tuple[float, ...], ...]) -> list[list[float]]:
    (a, b, c), (d, e, f), (g, h, i) = m
    det = a * (e * i - f * h) - b * (d * i - f * g) + c * (d * h - e * g)
    adj = [[e * i - f * h, c * h - b * i, b * f - c * e], [f * g - d * i, a * i - c * g, c * d - a * f],
           [d * h - e * g, b * g - a * h, a * e - b * d]]
    return [[v / det for v in row] for row in adj]


_YIQ_INV = _inverse3(_YIQ)


def color_matrix(color: tuple[float, float, float, float]) -> tuple[list[list[float]], float]:
    """The affine colour map of ``(brightness, contrast, saturation, hue_degrees)``: ``(M, offset)``
    with ``out = M @ rgb + offset`` (the same map DALI's ``color_twist`` applies).

    >>> m, off = color_matrix((1.0, 1.0, 1.0, 0.0))
    >>> [[round(v, 6) + 0.0 for v in row] for row in m], off
    ([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], 0.0)
    """
    brightness, contrast, saturation, hue = color
    h = math.radians(hue)
    cos, sin = math.cos(h) * saturation, math.sin(h) * saturation
    # chroma plane (I, Q) scaled by saturation and rotated by the hue angle, luma kept
    chroma = ((1.0, 0.0, 0.0), (0.0, cos, sin), (0.0, -sin, cos))
    inner = [[sum(chroma[i][k] * _YIQ[k][j] for k in range(3)) for j in range(3)] for i in range(3)]
    hs = [[sum(_YIQ_INV[i][k] * inner[k][j] for k in range(3)) for j in range(3)] for i in range(3)]
    scale = brightness * contrast
    return [[scale * v for v in row] for row in hs], brightness * 128.0 * (1.0 - contrast)


# the generator of unseeded plans (seed=None): one per process, seeded from the OS and seeded again
# in each forked child (as the random module's own), so that workers draw apart; a new Random per
# image would read 2.5 KB from the OS each time (16 us, 1% of a training crop's time)
_UNSEEDED = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_UNSEEDED.seed)


def plan_rng(seed: int | None, key: str) -> random.Random:
    """The generator of one sample's random choices: ``Random(f"{seed}/{key}")``, or with no seed
    the process's own (``_UNSEEDED``). AugmentSpec, AudioSpec and VideoSpec all draw from it."""
    return random.Random(f"{seed}/{key}") if seed is not None else _UNSEEDED


DEFAULT_MAX_PIXELS = 8192 * 8192  # the largest image a decode may allocate: 64 Mi pixels (~200 MB as RGB)


# the keywords of tarproc.Dataset and of the torch DataLoader that ds.loader() makes, named here
# (this layer is under the dataset's) so that a spec given one says where it goes;
# tests/core/test_first_steps.py checks them against the real signatures
DATASET_PARAMETERS = (
    "urls", "batch_size", "shuffle", "drop_last", "pad", "to_tuple", "collate", "map", "tensors", "shuffle_shards",
    "part_size", "interleave", "seed", "repeat", "batches_per_epoch", "decode", "device", "decode_in", "image", "threads",
    "handlers", "default_handlers", "lengths", "rank", "world_size", "on_error", "read", "network",
)
LOADER_PARAMETERS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "multiprocessing_context",
                     "worker_init_fn", "pin_memory_device", "in_order")


def parameter_homes() -> list[tuple[str, tuple[str, ...], str]]:
    """``(object, its keywords, how to write one there)`` for every object a training script
    configures; ``{name}`` and ``{owner}`` in the last are the keyword and the object it was given to."""
    from ..sources.remote import Network
    from ..tar.policy import ReadPolicy
    from .audio import AudioSpec
    from .video import VideoSpec

    def names(cls: Any) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    return [
        ("Dataset", DATASET_PARAMETERS, "tarproc.Dataset(urls, {name}=..., decode={owner}(...))"),
        ("AugmentSpec", names(AugmentSpec), "tarproc.Dataset(urls, decode=AugmentSpec({name}=...))"),
        ("AudioSpec", names(AudioSpec), "tarproc.Dataset(urls, decode={{'flac': AudioSpec({name}=...)}})"),
        ("VideoSpec", names(VideoSpec), "tarproc.Dataset(urls, decode={{'mp4': VideoSpec({name}=...)}})"),
        ("ReadPolicy", names(ReadPolicy), "tarproc.Dataset(urls, read=tarproc.ReadPolicy({name}=...))"),
        ("Network", names(Network), "tarproc.Dataset(urls, network=tarproc.Network({name}=...))"),
        ("DataLoader", LOADER_PARAMETERS, "ds.loader({name}=...)"),
    ]


def unknown_parameter(owner: str, name: str) -> ParameterError:
    """The error for keyword ``name`` given to ``owner``: where it belongs, or the names it may be
    a misspelling of.

    >>> print(unknown_parameter("AugmentSpec", "image"))
    AugmentSpec has no parameter image: image= is a Dataset parameter: tarproc.Dataset(urls, image=..., decode=AugmentSpec(...))
    >>> print(unknown_parameter("AugmentSpec", "sise"))
    AugmentSpec has no parameter sise (did you mean size or resize?)
    """
    homes = [(home, example) for home, names, example in parameter_homes() if name in names and home != owner]
    if homes:
        home, example = homes[0]
        also = "".join(f" (also {other}'s)" for other, _ in homes[1:2])
        article = "an" if home[0] in "AEIOU" else "a"
        where = example.format(name=name, owner=owner if owner.endswith("Spec") else "AugmentSpec")
        return ParameterError(f"{owner} has no parameter {name}: {name}= is {article} {home} parameter{also}: {where}")
    mine = next((names for home, names, _ in parameter_homes() if home == owner), ())
    known = {n for _, names, _ in parameter_homes() for n in names}
    close = difflib.get_close_matches(name, sorted(set(mine) or known), n=2) or difflib.get_close_matches(name, known, n=2)
    hint = f" (did you mean {' or '.join(close)}?)" if close else f" (see help(tarproc.{owner}))"
    return ParameterError(f"{owner} has no parameter {name}{hint}")


T = TypeVar("T")


def named_parameters(cls: type[T]) -> type[T]:
    """Make a keyword ``cls`` (a dataclass) doesn't take a ``ParameterError`` saying where it
    belongs, not Python's bare ``TypeError``. ``help()`` still shows the fields."""
    init: Callable[..., None] = cls.__init__  # type: ignore[misc]
    fields = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in fields:
                raise unknown_parameter(cls.__name__, name)
        init(self, *args, **kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def _whole(name: str, value: object, low: int) -> None:
    """``value`` must be an int >= ``low`` (not a bool, not a float)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise OptionError(f"bad {name} {value!r}; must be a whole number >= {low}")


@named_parameters
@dataclass(frozen=True)
class AugmentSpec:
    """How images are decoded and augmented (the module docstring gives the exact semantics).

    Given to ``tarproc.Dataset(urls, decode=AugmentSpec(...), image="jpg;png")``, to
    ``decode_samples`` and to ``tardecode``/``tarserve`` (as flags); which field holds the image is
    the Dataset's ``image=`` (or the key of a ``decode`` dict), not a parameter here.

    Args:
        size: the output side in pixels, a square crop (default None: no crop). With ``resize``:
            a centre crop of the image scaled to ``resize``; alone: the centre ``size`` x ``size``
            stored pixels; with ``random_crop``: the crop's output size. One number: the output is
            square (rectangular output is not supported).
        resize: scale the shorter side to this many pixels (default None).
        random_crop: torchvision's RandomResizedCrop to ``size`` (default False).
        scale: the crop's area fraction range (default (0.08, 1.0)).
        ratio: the crop's aspect ratio range (default (3/4, 4/3)).
        flip: the probability of a horizontal flip (default 0).
        mean: per-channel mean (R, G, B) in 0..1, e.g. ``IMAGENET_MEAN``: normalize (default None).
        std: per-channel std (R, G, B), e.g. ``IMAGENET_STD`` (default None).
        layout: ``"HWC"`` (default) or ``"CHW"`` (as torchvision models take).
        dtype: ``"uint8"``, ``"float16"`` or ``"float32"``. Default None: **uint8 (0..255) without
            mean/std, float32 with them**; ``"float32"`` without them gives floats 0..255.
        seed: seeds the random crops, flips and jitter with each image's key (default None: a new
            seed each run; a Dataset gives its own seed to a spec without one).
        rotate: the largest rotation in degrees, 0..180 (default 0).
        brightness: colour jitter factors drawn from [1 - x, 1 + x] (default 0).
        contrast: as brightness (default 0).
        saturation: as brightness (default 0).
        hue: the hue shift drawn from [-x, x] of a turn, 0..0.5 (default 0).
        max_pixels: refuse a stored image larger than this (default 8192 x 8192).

    Raises:
        OptionError: a value out of range or of the wrong kind, naming it.
        ParameterError: a keyword it doesn't take, saying where it belongs (``image=`` is the
            Dataset's).

    >>> spec = AugmentSpec(size=224, resize=256)
    >>> spec.plan("k", 375, 500).out, spec.output_dtype
    ((224, 224), 'uint8')
    >>> AugmentSpec(size=224, mean=IMAGENET_MEAN, std=IMAGENET_STD).output_dtype
    'float32'
    """

    size: int | None = None
    resize: int | None = None
    random_crop: bool = False
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.0
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    layout: str = "HWC"
    dtype: str | None = None
    seed: int | None = None
    rotate: float = 0.0
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    hue: float = 0.0
    max_pixels: int = DEFAULT_MAX_PIXELS

    def __post_init__(self) -> None:
        import math

        if isinstance(self.size, (tuple, list)):
            raise OptionError(f"bad size {tuple(self.size)!r}; give one number: images are cropped to SIZE x SIZE squares "
                              "(rectangular output is not supported; a VideoSpec's size is (height, width))")
        for name, side in (("size", self.size), ("resize", self.resize)):
            if side is not None:
                _whole(name, side, 1)
        _whole("max_pixels", self.max_pixels, 1)
        if not isinstance(self.random_crop, bool):
            raise OptionError(f"bad random_crop {self.random_crop!r}; must be True or False")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise OptionError(f"bad seed {self.seed!r}; must be an integer or None")
        for name, pair, count in (("scale", self.scale, 2), ("ratio", self.ratio, 2), ("mean", self.mean, 3),
                                  ("std", self.std, 3)):
            if pair is None:
                continue
            if not isinstance(pair, (tuple, list)) or len(pair) != count:
                raise OptionError(f"bad {name} {pair!r}; give {count} numbers" + (" (R, G, B)" if count == 3 else " (LO, HI)"))
            object.__setattr__(self, name, tuple(pair))  # a list given: kept as a tuple (the spec is hashable)
        for name, numbers in (("scale", self.scale), ("ratio", self.ratio), ("flip", (self.flip,)),
                             ("rotate", (self.rotate,)), ("brightness", (self.brightness,)),
                             ("contrast", (self.contrast,)), ("saturation", (self.saturation,)), ("hue", (self.hue,)),
                             ("mean", self.mean or ()), ("std", self.std or ())):
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers):
                raise OptionError(f"bad {name} {','.join(map(str, numbers))}; must be finite numbers (not nan or inf)")
        if self.random_crop and self.size is None:
            raise OptionError("a random resized crop needs the output size (--size)")
        if self.random_crop and self.resize is not None:
            raise OptionError("--resize has no effect with --random-crop (the crop is resampled to --size)")
        if self.size is not None and self.resize is not None and self.size > self.resize:
            raise OptionError(f"crop size {self.size} is larger than the resized shorter side {self.resize}")
        lo, hi = self.scale
        if not 0 < lo <= hi <= 1:
            raise OptionError(f"bad scale {lo},{hi}; need 0 < LO <= HI <= 1")
        lo, hi = self.ratio
        if not 0 < lo <= hi:
            raise OptionError(f"bad ratio {lo},{hi}; need 0 < LO <= HI")
        if not 0 <= self.flip <= 1:
            raise OptionError(f"bad flip probability {self.flip}; must be in 0..1")
        if not 0 <= self.rotate <= 180:
            raise OptionError(f"bad rotation {self.rotate}; give the largest angle in degrees, 0..180")
        for name, value in (("brightness", self.brightness), ("contrast", self.contrast), ("saturation", self.saturation)):
            if value < 0:
                raise OptionError(f"bad {name} {value}; must be >= 0 (the factor is drawn from [1-x, 1+x])")
        if not 0 <= self.hue <= 0.5:
            raise OptionError(f"bad hue {self.hue}; must be in 0..0.5 (a fraction of the colour circle)")
        for name, values in (("mean", self.mean), ("std", self.std)):
            if values is not None and len(values) != 3:
                raise OptionError(f"bad {name} {values}; give three values (R,G,B)")
        if self.std is not None and any(v <= 0 for v in self.std):
            raise OptionError(f"bad std {self.std}; values must be > 0")
        if self.layout not in LAYOUTS:
            raise OptionError(f"bad layout {self.layout!r}; use one of {', '.join(LAYOUTS)}")
        if self.dtype is not None and self.dtype not in DTYPES:
            raise OptionError(f"bad dtype {self.dtype!r}; use one of {', '.join(DTYPES)}")
        for name, side in (("size", self.size), ("resize", self.resize)):
            if side is not None and side * side > self.max_pixels:
                raise OptionError(f"{name} {side} makes images of at least {side}x{side} pixels, over the "
                                  f"{self.max_pixels:,} of max_pixels (--max-pixels)")
        if self.dtype == "uint8" and self.normalized:
            raise OptionError("normalized values (--mean/--std) need a float dtype (float16 or float32)")

    @property
    def normalized(self) -> bool:
        return self.mean is not None or self.std is not None

    @property
    def output_dtype(self) -> str:
        """The dtype of the arrays: as given, else float32 when normalizing, else uint8."""
        return self.dtype or ("float32" if self.normalized else "uint8")

    @property
    def mean_std_255(self) -> tuple[list[float], list[float]]:
        """Mean and std in pixel units (0..255), as DALI's crop_mirror_normalize takes them."""
        mean = self.mean or (0.0, 0.0, 0.0)
        std = self.std or (1 / 255, 1 / 255, 1 / 255)
        return [m * 255 for m in mean], [s * 255 for s in std]

    @property
    def geometric(self) -> bool:
        """True when images are cropped or resized (else they keep their stored size)."""
        return self.size is not None or self.resize is not None

    @property
    def jitter(self) -> bool:
        """True when colours are jittered (brightness, contrast, saturation or hue)."""
        return bool(self.brightness or self.contrast or self.saturation or self.hue)

    @property
    def random(self) -> bool:
        """True when the spec draws anything at random (then its seed matters)."""
        return self.random_crop or self.flip > 0 or self.rotate > 0 or self.jitter

    def plan(self, key: str, height: int, width: int) -> Plan:
        """The plan for the image of sample ``key`` stored as ``height`` x ``width``.

        >>> AugmentSpec(size=100).plan("k", 300, 400)
        Plan(window=(150, 100, 250, 200), out=(100, 100), flip=False, angle=0.0, color=None)
        >>> AugmentSpec(resize=150).plan("k", 300, 400).out
        (200, 150)
        """
        if height * width > self.max_pixels:  # checked from the header, before any pixel is allocated
            raise ValueError(f"image of {width}x{height} pixels is over the limit of {self.max_pixels:,} "
                             "(max_pixels, --max-pixels)")
        rng = plan_rng(self.seed, key)
        h, w = height, width
        window: tuple[float, float, float, float]
        if self.random_crop:
            assert self.size is not None
            x, y, cw, ch = random_resized_window(rng, w, h, self.scale, self.ratio)
            window, out = (x, y, x + cw, y + ch), (self.size, self.size)
        elif self.size is not None and self.resize is not None:
            side = self.size * min(h, w) / self.resize
            x0, y0 = (w - side) / 2, (h - side) / 2
            window, out = (x0, y0, x0 + side, y0 + side), (self.size, self.size)
        elif self.size is not None:
            if self.size > min(h, w):
                raise ValueError(f"image is {w}x{h}, smaller than the crop size {self.size} (use --resize)")
            x, y = (w - self.size) // 2, (h - self.size) // 2
            window, out = (x, y, x + self.size, y + self.size), (self.size, self.size)
        elif self.resize is not None:
            s = self.resize / min(h, w)
            out = (self.resize, max(1, round(h * s))) if w <= h else (max(1, round(w * s)), self.resize)
            window = (0, 0, w, h)
        else:
            window, out = (0, 0, w, h), (w, h)
        flip = self.flip > 0 and rng.random() < self.flip
        # drawn after the crop and flip, so specs without them keep the plans they always had
        angle = rng.uniform(-self.rotate, self.rotate) if self.rotate else 0.0
        color = None
        if self.jitter:

            def factor(x: float) -> float:
                return rng.uniform(max(0.0, 1 - x), 1 + x) if x else 1.0

            brightness, contrast, saturation = factor(self.brightness), factor(self.contrast), factor(self.saturation)
            hue = rng.uniform(-self.hue, self.hue) * 360 if self.hue else 0.0
            color = (brightness, contrast, saturation, hue)
        return Plan(window, out, flip, angle, color)


def random_resized_window(
    rng: random.Random, width: int, height: int, scale: tuple[float, float], ratio: tuple[float, float]
) -> tuple[int, int, int, int]:
    """``(x, y, w, h)`` of a random window as torchvision's ``RandomResizedCrop.get_params`` draws it.

    >>> random_resized_window(random.Random(0), 500, 375, (1.0, 1.0), (4 / 3, 4 / 3))
    (0, 0, 500, 375)
    """
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, width - w), rng.randint(0, height - h), w, h
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def parse_triple(text: str, name: str) -> tuple[float, float, float]:
    """Parse ``R,G,B`` floats (or ``imagenet``) for --mean/--std.

    >>> parse_triple("imagenet", "mean")
    (0.485, 0.456, 0.406)
    >>> parse_triple("0.5,0.5,0.5", "std")
    (0.5, 0.5, 0.5)
    """
    if text.strip().lower() == "imagenet":
        return IMAGENET_MEAN if name == "mean" else IMAGENET_STD
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise OptionError(f"bad --{name} {text!r}; expected R,G,B numbers (0..1) or 'imagenet'") from None
    if len(values) == 1:
        values = values * 3
    if len(values) != 3:
        raise OptionError(f"bad --{name} {text!r}; expected three numbers R,G,B")
    return values  # type: ignore[return-value]


def parse_jitter(text: str) -> tuple[float, float, float, float]:
    """Parse ``B,C,S,H`` (brightness, contrast, saturation, hue; missing ones 0) for --jitter.

    >>> parse_jitter("0.4,0.4,0.4,0.1"), parse_jitter("0.2")
    ((0.4, 0.4, 0.4, 0.1), (0.2, 0.0, 0.0, 0.0))
    """
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise OptionError(f"bad --jitter {text!r}; expected B,C,S,H numbers like 0.4,0.4,0.4,0.1") from None
    if not 1 <= len(values) <= 4:
        raise OptionError(f"bad --jitter {text!r}; expected up to four numbers B,C,S,H")
    b, c, s, h = (values + [0.0] * 4)[:4]
    return b, c, s, h


def parse_pair(text: str, name: str) -> tuple[float, float]:
    """Parse ``LO,HI`` (``3/4,4/3`` fractions allowed) for --scale/--ratio.

    >>> parse_pair("3/4,4/3", "ratio")
    (0.75, 1.3333333333333333)
    """

    def number(part: str) -> float:
        num, _, den = part.partition("/")
        return float(num) / float(den) if den else float(num)

    try:
        lo, hi = (number(p) for p in text.split(","))
    except (ValueError, ZeroDivisionError):
        raise OptionError(f"bad --{name} {text!r}; expected LO,HI like 0.08,1 or 3/4,4/3") from None
    return lo, hi
