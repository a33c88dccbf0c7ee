"""The DALI backends: dali-cpu (runs wherever DALI is installed) against cpu, and gpu when present.

Parity tolerance (uint8, 0..255): the two backends decode JPEGs with the same libjpeg-turbo IDCT
and crop the same window, but resample with different implementations of the antialiased linear
filter (Pillow's and DALI's), which round differently: max |diff| <= 3 levels, mean <= 0.5, except
in the outer 2 pixels of an output whose window touches the image border, where the two handle the
border differently (Pillow renormalizes the filter over the pixels inside, DALI clamps): there up to
16 levels. After normalization the same bounds scaled by 1/(255*std).

The cpu backend's DCT-domain reduced-size decoding (used by default for downscales of 2x and more)
prefilters with libjpeg's scaled IDCT, a box-like filter, where DALI applies the triangle filter to
the full image: on photo-like images mean |diff| <= 2.5 levels and max <= 48 (on grain and edges).
"""

from __future__ import annotations

import numpy as np
import pytest
from tarhelpers import encode_image as encode

from tarproc.decode import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    AugmentSpec,
    CpuDecoder,
    DaliDecoder,
    DecodeError,
    DecodeStats,
    dali_available,
    decode_samples,
    gpu_count,
)

pytestmark = pytest.mark.skipif(not dali_available(), reason="NVIDIA DALI is not installed (pip install tarproc[gpu])")

MAX_DIFF = 3
MAX_BORDER_DIFF = 16
MEAN_DIFF = 0.5


def check_parity(x: np.ndarray, y: np.ndarray, layout: str = "HWC", scale: float = 1.0) -> None:
    diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
    inner = diff[2:-2, 2:-2] if layout == "HWC" else diff[:, 2:-2, 2:-2]
    assert inner.max() <= MAX_DIFF * scale + 0.01, inner.max()
    assert diff.max() <= MAX_BORDER_DIFF * scale + 0.01, diff.max()
    assert diff.mean() <= MEAN_DIFF * scale, diff.mean()


def picture(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x * y) % 200 + 20], axis=-1)
    return np.clip(base + rng.normal(0, 8, base.shape), 0, 255).astype(np.uint8)


def images() -> list[bytes]:
    """Sizes and formats that exercise portrait/landscape, gray, CMYK, progressive, PNG alpha."""
    shapes = [(160, 120), (120, 160), (200, 100), (97, 131), (150, 150)]
    out = [encode(picture(w, h, i), quality=90) for i, (w, h) in enumerate(shapes)]
    out.append(encode(picture(140, 110, 7), "JPEG", "L"))
    out.append(encode(picture(140, 110, 8), "JPEG", "CMYK"))
    out.append(encode(picture(140, 110, 9), "JPEG", progressive=True))
    out.append(encode(picture(140, 110, 10), "PNG", "RGBA"))
    return out


def samples(datas: list[bytes]) -> list[dict[str, object]]:
    return [{"__key__": f"k{i:02d}", "__url__": "mem.tar", "jpg": d, "cls": b"%d" % i} for i, d in enumerate(datas)]


SPECS = {
    "decode only": AugmentSpec(),
    "center crop": AugmentSpec(size=64, resize=73),
    "resize": AugmentSpec(resize=90),
    "crop, no resize": AugmentSpec(size=80),
    "random crop + flip + normalize CHW": AugmentSpec(size=64, random_crop=True, flip=0.5, seed=5,
                                                      mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW"),
    "float16": AugmentSpec(size=48, resize=60, dtype="float16", flip=1.0),
}


@pytest.mark.parametrize("name", SPECS)
def test_cpu_and_dali_cpu_agree(name: str) -> None:
    spec = SPECS[name]
    data = samples(images())
    cpu = list(decode_samples(data, spec, device=CpuDecoder(spec, dct_scaling=False), batch_size=4))
    dali = list(decode_samples(data, spec, device="dali-cpu", batch_size=4))
    scale = 1 / (255 * min(IMAGENET_STD)) if spec.normalized else 1
    for a, b in zip(cpu, dali, strict=True):
        x, y = a["jpg"], b["jpg"]
        assert x.shape == y.shape and x.dtype == y.dtype, (a["__key__"], x.shape, y.shape)
        check_parity(x, y, spec.layout, scale)
        assert a["cls"] == b["cls"]


def photo(w: int, h: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, 128 + 60 * np.sin(x / 9) * np.cos(y / 13)], axis=-1)
    return np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8)


def test_dct_scaled_cpu_and_dali_cpu_agree_on_photos() -> None:
    spec = AugmentSpec(size=64, resize=72, flip=0.5, seed=1)
    data = samples([encode(photo(500, 375, i), quality=90) for i in range(4)])
    cpu = list(decode_samples(data, spec, device="cpu"))  # 375 -> 72: decoded at 1/4 size
    dali = list(decode_samples(data, spec, device="dali-cpu"))
    for a, b in zip(cpu, dali, strict=True):
        diff = np.abs(a["jpg"].astype(int) - b["jpg"])
        assert diff.mean() <= 2.5 and diff.max() <= 48, (a["__key__"], diff.mean(), diff.max())


def test_flip_flags_are_the_same_images() -> None:
    """Same seed, same flips: a flipped-vs-unflipped mismatch would differ by far more than 3 levels."""
    spec = AugmentSpec(size=64, resize=64, flip=0.5, seed=11)
    data = samples([encode(picture(96, 64, i), "PNG") for i in range(12)])
    flips = [spec.plan(f"k{i:02d}", 64, 96).flip for i in range(12)]
    assert 0 < sum(flips) < 12
    cpu = list(decode_samples(data, spec, device="cpu"))
    dali = list(decode_samples(data, spec, device="dali-cpu", batch_size=5))
    for a, b in zip(cpu, dali, strict=True):
        check_parity(a["jpg"], b["jpg"])


GOOD = encode(picture(120, 90, 1), quality=90)
BAD = {
    "corrupt": GOOD[:300] + bytes(400) + GOOD[700:],
    "truncated": GOOD[: len(GOOD) // 2],
    "not an image": b"this is a text file, not a JPEG\n" * 10,
}


@pytest.mark.parametrize("kind", BAD)
def test_dali_bad_image_fails_naming_url_and_key(kind: str) -> None:
    data = samples([GOOD, GOOD, BAD[kind], GOOD])
    with pytest.raises(DecodeError) as e:
        list(decode_samples(data, AugmentSpec(size=32, resize=40), device="dali-cpu", batch_size=4))
    assert str(e.value).startswith("mem.tar: cannot decode field 'jpg' of sample 'k02': ")


def test_dali_bad_images_skipped_rest_of_batch_kept() -> None:
    datas = [encode(picture(120, 90, i), quality=90) for i in range(8)]
    datas[1], datas[2], datas[6] = BAD["corrupt"], BAD["truncated"], BAD["not an image"]
    spec = AugmentSpec(size=32, resize=40)
    stats = DecodeStats()
    decoder = DaliDecoder(spec, batch_size=4, threads=1)
    out = list(decode_samples(samples(datas), spec, device=decoder, batch_size=4, on_error="skip", stats=stats))
    assert [s["__key__"] for s in out] == ["k00", "k03", "k04", "k05", "k07"]
    assert stats.skipped == 3 and stats.backend == "dali-cpu"
    assert decoder.retries == 1  # the first batch failed in DALI; the text was caught on the host
    cpu = list(decode_samples(samples(datas), spec, device=CpuDecoder(spec, dct_scaling=False), on_error="skip"))
    for a, b in zip(cpu, out, strict=True):
        check_parity(a["jpg"], b["jpg"])
    # the rebuilt pipeline goes on working
    again = list(decode_samples(samples(datas[3:6]), spec, device=decoder, batch_size=4))
    assert len(again) == 3
    decoder.close()


def test_dali_refuses_images_over_max_pixels_from_their_headers() -> None:
    datas = [encode(picture(120, 90, i), quality=90) for i in range(3)]
    spec = AugmentSpec(size=32, resize=40, max_pixels=100 * 90)
    datas[1] = encode(picture(120, 120, 1), quality=90)  # 14,400 pixels
    stats = DecodeStats()
    decoder = DaliDecoder(spec, batch_size=4, threads=1)
    out = list(decode_samples(samples(datas), spec, device=decoder, batch_size=4, on_error="skip", stats=stats))
    decoder.close()
    assert [s["__key__"] for s in out] == [] and stats.skipped == 3  # 120x90 = 10,800 is over 9,000 too
    spec = AugmentSpec(size=32, resize=40, max_pixels=120 * 90)
    decoder = DaliDecoder(spec, batch_size=4, threads=1)
    with pytest.raises(DecodeError, match="image of 120x120 pixels is over the limit of 10,800"):
        list(decode_samples(samples(datas), spec, device=decoder, batch_size=4))
    decoder.close()


# ---------------------------------------------------------------------------------------------
# the GPU (mixed decoder): only where a CUDA device is present

needs_gpu = pytest.mark.skipif(gpu_count() == 0, reason="no CUDA GPU visible to DALI (GetCUDADeviceCount() == 0)")


@needs_gpu
def test_gpu_agrees_with_cpu() -> None:
    spec = AugmentSpec(size=64, resize=73, flip=0.5, seed=2, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")
    data = samples(images())
    cpu = list(decode_samples(data, spec, device="cpu"))
    gpu = list(decode_samples(data, spec, device="gpu", batch_size=4))
    scale = 1 / (255 * min(IMAGENET_STD))
    for a, b in zip(cpu, gpu, strict=True):
        diff = np.abs(a["jpg"] - b["jpg"])
        # the GPU's IDCT and chroma upsampling (hardware or CUDA) differ from libjpeg-turbo's: a looser
        # bound (measured on an H200, DALI 2.4: mean up to 2.4 levels, max 37)
        assert diff.mean() <= 3 * scale and diff.max() <= 40 * scale, (a["__key__"], diff.mean(), diff.max())


@needs_gpu
def test_gpu_bad_image_skipped() -> None:
    datas = [encode(picture(120, 90, i), quality=90) for i in range(4)]
    datas[2] = BAD["truncated"]
    stats = DecodeStats()
    out = list(decode_samples(samples(datas), AugmentSpec(size=32), device="gpu", on_error="skip", stats=stats))
    assert [s["__key__"] for s in out] == ["k00", "k01", "k03"] and stats.skipped == 1


# rotation and colour jitter: the same plan (angle, factors) and the same two rotation steps
# (rotation_steps) on both backends. The warp's bilinear sampling rounds differently in the two
# libraries and the black corners' edges can move by a pixel, so the bound is looser than for
# crops: mean |diff| <= 1.5 levels, 99th percentile <= 8 (measured: mean <= 1.0, p99 <= 3); jitter
# alone is one affine map on both, rounded once: the crop bounds above hold.
JITTER = dict(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)


@pytest.mark.parametrize("rotate", [0, 10])
def test_rotation_and_colour_jitter_agree(rotate: float) -> None:
    spec = AugmentSpec(size=64, random_crop=True, flip=0.5, rotate=rotate, seed=8, **JITTER)
    data = samples(images())
    cpu = list(decode_samples(data, spec, device=CpuDecoder(spec, dct_scaling=False), batch_size=4))
    dali = list(decode_samples(data, spec, device="dali-cpu", batch_size=4))
    assert any(spec.plan(str(s["__key__"]), 100, 100).color for s in data)
    for a, b in zip(cpu, dali, strict=True):
        if rotate:
            diff = np.abs(a["jpg"].astype(int) - b["jpg"])
            assert diff.mean() <= 1.5 and np.percentile(diff, 99) <= 8, (a["__key__"], diff.mean(), np.percentile(diff, 99))
        else:
            check_parity(a["jpg"], b["jpg"])
