"""tarproc._jpeg, the cpu backend's libjpeg-turbo fast path: region decoding gives exactly the
pixels of a full decode, the fused resample gives Pillow's resize (to a level: the same filter and
coefficients, rounded in another order), a stream cut short anywhere is an error, and the rows below a
crop are not decoded."""

from __future__ import annotations

import os
import random

import numpy as np
import pytest
import simplejpeg
from PIL import Image
from tarhelpers import encode_image, photo

from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec, decode_image
from tarproc.decode import cpu as cpu_backend

HEADERS = os.path.exists("/usr/include/jpeglib.h")


def test_the_extension_is_built_where_libjpeg_headers_are() -> None:
    if not HEADERS:
        pytest.skip("no /usr/include/jpeglib.h: tarproc uses simplejpeg and Pillow for every JPEG")
    assert cpu_backend._jpeg is not None, "tarproc._jpeg failed to build: see the pip install output"


needs_ext = pytest.mark.skipif(cpu_backend._jpeg is None, reason="tarproc._jpeg is not built")


JPEGS = {
    "444": encode_image(photo(203, 151, 1), quality=90, subsampling=0),
    "420": encode_image(photo(250, 187, 2), quality=85),
    "progressive": encode_image(photo(160, 120, 3), progressive=True),
    "grey": encode_image(photo(140, 110, 4), "JPEG", "L"),
}


@needs_ext
@pytest.mark.parametrize("name", JPEGS)
@pytest.mark.parametrize("denom", [1, 2])
def test_region_decode_equals_a_full_decode(name: str, denom: int) -> None:
    data = JPEGS[name]
    h, w = simplejpeg.decode_jpeg_header(data)[:2]
    if denom == 1:
        full = simplejpeg.decode_jpeg(data, colorspace="RGBX")
    else:
        full = simplejpeg.decode_jpeg(data, colorspace="RGBX", min_factor=2, min_height=-(-h // 2), min_width=-(-w // 2))
    H, W = full.shape[:2]
    rng = random.Random(name)
    for _ in range(25):
        x0, y0 = rng.randrange(W), rng.randrange(H)
        x1, y1 = rng.randrange(x0 + 1, W + 1), rng.randrange(y0 + 1, H + 1)
        buf, cw, ch, ox, oy = cpu_backend._jpeg.decode_region(data, x0, y0, x1, y1, denom)
        region = np.frombuffer(buf, np.uint8).reshape(ch, cw, 4)
        assert ox <= x0 and oy <= y0 and ox + cw >= x1 and oy + ch >= y1
        assert np.array_equal(region[y0 - oy:y1 - oy, x0 - ox:x1 - ox, :3], full[y0:y1, x0:x1, :3]), (x0, y0, x1, y1)


@needs_ext
@pytest.mark.parametrize("name", ["420", "444", "grey"])
@pytest.mark.parametrize("scale", [3, 5, 6, 7])
def test_region_decode_at_any_eighth_equals_a_whole_decode_at_that_scale(name: str, scale: int) -> None:
    """libjpeg's M/8 scales (the odd ones have no SIMD: DCT_SCALES leaves them out, but the C path
    takes any): a cropped, row-skipped decode gives the whole scaled decode's pixels."""
    data = JPEGS[name]
    h, w = simplejpeg.decode_jpeg_header(data)[:2]
    W, H = -(-w * scale // 8), -(-h * scale // 8)
    buf, cw, ch, ox, oy = cpu_backend._jpeg.decode_region(data, 0, 0, W, H, 8, scale)
    assert (cw, ch, ox, oy) == (W, H, 0, 0)
    full = np.frombuffer(buf, np.uint8).reshape(H, W, 4)
    rng = random.Random(scale)
    for _ in range(15):
        x0, y0 = rng.randrange(W), rng.randrange(H)
        x1, y1 = rng.randrange(x0 + 1, W + 1), rng.randrange(y0 + 1, H + 1)
        buf, cw, ch, ox, oy = cpu_backend._jpeg.decode_region(data, x0, y0, x1, y1, 8, scale)
        region = np.frombuffer(buf, np.uint8).reshape(ch, cw, 4)
        assert ox <= x0 and oy <= y0 and ox + cw >= x1 and oy + ch >= y1
        assert np.array_equal(region[y0 - oy:y1 - oy, x0 - ox:x1 - ox, :3], full[y0:y1, x0:x1, :3]), (x0, y0, x1, y1)
    with pytest.raises(ValueError, match="bad scale"):
        cpu_backend._jpeg.decode_region(data, 0, 0, 1, 1, 8, 0)


@needs_ext
@pytest.mark.parametrize("name", JPEGS)
def test_stored_pixels_are_decoded_as_rgb_straight_into_the_array(name: str) -> None:
    """Plans that copy stored pixels (decode only; a crop without resize) take libjpeg's RGB rows
    of the window: simplejpeg's full decode, exactly."""
    data = JPEGS[name]
    full = simplejpeg.decode_jpeg(data, colorspace="RGB")
    h, w = full.shape[:2]
    assert np.array_equal(decode_image(data, AugmentSpec(), "k"), full)
    got = decode_image(data, AugmentSpec(size=64), "k")
    x, y = (w - 64) // 2, (h - 64) // 2
    assert np.array_equal(got, full[y:y + 64, x:x + 64]) and got.flags.c_contiguous


@needs_ext
def test_decoded_memory_is_used_again_only_once_nothing_holds_it() -> None:
    """decode_region's pixels come in blocks that are kept when let go of and given to the next
    image of about their size (no fresh pages to fault in); never while a view still reads them."""
    data = JPEGS["420"]
    ext = cpu_backend._jpeg

    def decode() -> np.ndarray:
        return np.frombuffer(ext.decode_region(data, 0, 0, 250, 187, 8, 8, 3)[0], np.uint8)

    first = decode()
    kept, address = first.copy(), first.ctypes.data
    view = first[10:20]  # a view keeps the block
    del first
    second = decode()
    assert second.ctypes.data != address
    second[:] = 0  # writing to another image leaves the view's pixels alone
    assert np.array_equal(view, kept[10:20])
    del view
    third = decode()  # the block is free again: used for the next image of its size
    assert third.ctypes.data == address and np.array_equal(third, kept)
    assert isinstance(ext.decode_region(data, 0, 0, 8, 8, 8)[0], ext.Pixels)


@needs_ext
def test_fused_resample_is_pillows_resize() -> None:
    array = np.ascontiguousarray(np.dstack([photo(230, 170, 5), np.zeros((170, 230), np.uint8)]))
    im = Image.frombuffer("RGBX", (230, 170), array, "raw", "RGBX", 0, 1)
    rng = random.Random(0)
    for _ in range(30):
        x0, y0 = rng.uniform(0, 150), rng.uniform(0, 100)
        box = (x0, y0, rng.uniform(x0 + 5, 230), rng.uniform(y0 + 5, 170))
        size = rng.choice([(64, 64), (31, 47), (120, 90), (300, 200)])
        want = np.asarray(im.resize(size, Image.Resampling.BILINEAR, box=box))[..., :3].astype(int)
        got = np.empty((size[1], size[0], 3), np.uint8)
        cpu_backend._jpeg.resample(array, 230, 170, box, *size, False, None, b"", 0, got)
        assert np.abs(got.astype(int) - want).max() <= 1, box


@needs_ext
def test_simd_passes_give_the_portable_passes_bytes() -> None:
    """resample's AVX2 passes (chosen at run time) against its portable C, byte for byte, over
    random windows, sizes (odd row counts and widths included), layouts and flips."""
    ext = cpu_backend._jpeg
    if not ext.use_simd(True):
        pytest.skip("this CPU has no AVX2: resample runs its portable passes only")
    rng = np.random.default_rng(0)
    tables = np.stack([np.arange(256, dtype=np.float32) / 7] * 3)
    try:
        for _ in range(400):
            w, h = (int(v) for v in rng.integers(1, 200, 2))
            src = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
            x0, y0 = rng.uniform(0, w - 0.5), rng.uniform(0, h - 0.5)
            box = (x0, y0, rng.uniform(x0 + 0.1, w), rng.uniform(y0 + 0.1, h))
            ow, oh = (int(v) for v in rng.integers(1, 120, 2))
            mode, flip = int(rng.integers(0, 4)), bool(rng.integers(0, 2))
            shape = (oh, ow, 3) if mode in (0, 2) else (3, oh, ow)
            outs = []
            for simd in (True, False):
                ext.use_simd(simd)
                out = np.empty(shape, np.uint8 if mode < 2 else np.float32)
                ext.resample(src, w, h, box, ow, oh, flip, None, tables, mode, out)
                outs.append(out)
            assert np.array_equal(*outs), (w, h, box, ow, oh, mode)
    finally:
        ext.use_simd(True)


@needs_ext
@pytest.mark.parametrize("kind", ["affine", "not affine"])
def test_computed_float_planes_are_the_tables_floats(kind: str) -> None:
    """Float32 CHW rows from tables given with their (sub, mul) pairs (``cpu.c_tables``): the AVX2
    pass computes (level - sub) * mul where every entry is that, and looks up otherwise (pairs that
    don't fit one entry): the bytes of the portable lookup either way, flipped or not, any width."""
    ext = cpu_backend._jpeg
    if not ext.use_simd(True):
        pytest.skip("this CPU has no AVX2: resample runs its portable passes only")
    rng = np.random.default_rng(1)
    levels = np.arange(256, dtype=np.float32)
    try:
        for _ in range(100):
            pairs = np.array([v for _ in range(3) for v in (rng.uniform(-50, 300), rng.uniform(-2, 2))], np.float32)
            tables = np.stack([(levels - pairs[2 * c]) * pairs[2 * c + 1] for c in range(3)])
            if kind == "not affine":
                tables[int(rng.integers(0, 3)), int(rng.integers(0, 256))] += 1e-3
            given = np.concatenate([tables.ravel(), pairs])
            w, h = (int(v) for v in rng.integers(1, 120, 2))
            src = rng.integers(0, 256, (h, w, 4), dtype=np.uint8)
            ow, oh, flip = int(rng.integers(1, 70)), int(rng.integers(1, 20)), bool(rng.integers(0, 2))
            outs = []
            for simd, t in ((True, given), (False, tables)):
                ext.use_simd(simd)
                out = np.empty((3, oh, ow), np.float32)
                ext.resample(src, w, h, (0.0, 0.0, float(w), float(h)), ow, oh, flip, None, t, 3, out)
                outs.append(out)
            assert outs[0].tobytes() == outs[1].tobytes(), (w, h, ow, oh, flip)
    finally:
        ext.use_simd(True)
    spec = AugmentSpec(size=8, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225))
    c = cpu_backend.c_tables(spec)  # the Dataset's tables come with pairs that fit them
    assert np.array_equal(c[:768].reshape(3, 256), cpu_backend.normalization_tables(spec))
    assert all(np.array_equal((levels - c[768 + 2 * i]) * c[769 + 2 * i], c[256 * i : 256 * (i + 1)]) for i in range(3))


@needs_ext
def test_warp_is_pillows_affine_transform_and_its_simd_pass_the_portable_bytes() -> None:
    """warp (the rotation's second step) samples as Pillow's transform(AFFINE, BILINEAR) does, in
    single precision: within a level; its AVX2 pass (8 pixels a time, taps gathered) gives the
    portable pass's bytes, colour map, flip and layouts included."""
    ext = cpu_backend._jpeg
    rng = np.random.default_rng(1)
    tables = np.stack([np.arange(256, dtype=np.float32) / 3] * 3)
    simd = ext.use_simd(True)
    try:
        for i in range(120):
            w, h = (int(v) for v in rng.integers(1, 90, 2))
            src = np.empty(w * h * 3 + 1, np.uint8)  # the spare byte the AVX2 pass needs
            src[:-1] = photo(w, h, i).reshape(-1) if i % 2 else rng.integers(0, 256, w * h * 3)
            a = rng.uniform(-0.6, 0.6)
            s = rng.uniform(0.5, 1.6)
            m = (s * np.cos(a), s * np.sin(a), rng.uniform(-10, 20), -s * np.sin(a), s * np.cos(a), rng.uniform(-10, 20))
            ow, oh = (int(v) for v in rng.integers(1, 70, 2))
            color = list(rng.uniform(-0.3, 1.3, 12)) if i % 3 == 0 else None
            mode, flip = int(rng.integers(0, 4)), bool(rng.integers(0, 2))
            shape = (oh, ow, 3) if mode in (0, 2) else (3, oh, ow)
            outs = []
            for on in (True, False):
                ext.use_simd(on)
                out = np.empty(shape, np.uint8 if mode < 2 else np.float32)
                ext.warp(src, w, h, m, ow, oh, flip, color, tables, mode, out)
                outs.append(out)
            assert np.array_equal(*outs), (w, h, m, ow, oh, mode, color)
            if color is None and not flip and mode == 0:
                im = Image.frombuffer("RGB", (w, h), bytes(src[:-1]), "raw", "RGB", 0, 1)
                want = np.asarray(im.transform((ow, oh), Image.Transform.AFFINE, m, Image.Resampling.BILINEAR,
                                               fillcolor=(0, 0, 0))).astype(int)
                diff = np.abs(outs[0].astype(int) - want)
                # a pixel whose centre lies within float rounding of the image's edge may be black
                # in one and sampled in the other
                assert np.mean(diff > 1) <= 0.002, (w, h, m, np.mean(diff > 1))
    finally:
        ext.use_simd(simd)


@needs_ext
@pytest.mark.parametrize("spec", [
    AugmentSpec(size=48, random_crop=True, flip=0.5, seed=3, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW"),
    AugmentSpec(size=40, resize=46, seed=3),
    AugmentSpec(size=48, random_crop=True, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, seed=3, layout="CHW", dtype="float32"),
    AugmentSpec(size=48, random_crop=True, rotate=10, flip=0.5, seed=3, mean=IMAGENET_MEAN, std=IMAGENET_STD),
], ids=["crop-normalize", "centre", "jitter", "rotate"])
def test_fast_path_agrees_with_the_simplejpeg_pillow_path(spec: AugmentSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = [decode_image(d, spec, f"k{i}") for i, d in enumerate(JPEGS.values())]
    monkeypatch.setattr(cpu_backend, "_jpeg", None)
    slow = [decode_image(d, spec, f"k{i}") for i, d in enumerate(JPEGS.values())]
    scale = 1 / (255 * min(IMAGENET_STD)) if spec.normalized else 1
    for a, b in zip(fast, slow, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert np.abs(a.astype(np.float64) - b).max() <= 1 * scale + 1e-4


@needs_ext
@pytest.mark.parametrize("name", ["420", "progressive"])
@pytest.mark.parametrize("where", ["inside the crop", "below the crop"])
def test_a_stream_cut_short_anywhere_is_an_error(name: str, where: str) -> None:
    """The rows below a crop are not decoded, but a stream cut short there (no end-of-image marker)
    is an error all the same: the damage a download or a copy leaves is never let through."""
    data = bytearray(JPEGS[name])
    cut = len(data) * (3 if where == "below the crop" else 1) // 4
    damaged = bytes(data[:cut])
    spec = AugmentSpec(size=32, seed=0)  # a centre crop: the bottom quarter is not in the window
    with pytest.raises(cpu_backend.ImageError, match="Premature end|cut short"):
        decode_image(damaged, spec, "k")
    with pytest.raises(ValueError, match="Premature end|cut short"):  # a window in the top rows only
        cpu_backend._jpeg.decode_region(damaged, 0, 0, 16, 16, 1)


@needs_ext
@pytest.mark.parametrize("name", JPEGS)
def test_bytes_after_the_end_of_image_marker_are_no_damage(name: str) -> None:
    """Cameras and editors pad files after the EOI marker: a crop of the top rows decodes them."""
    data = JPEGS[name]
    for tail in (b"\0" * 100, b"\xff\xd8 trailing metadata", b"\xff"):
        buf, cw, ch, _, _ = cpu_backend._jpeg.decode_region(data + tail, 0, 0, 24, 16, 1)
        full = simplejpeg.decode_jpeg(data, colorspace="RGBX")
        assert np.array_equal(np.frombuffer(buf, np.uint8).reshape(ch, cw, 4)[:16, :24], full[:16, :24])


@needs_ext
def test_damage_below_the_window_is_not_decoded() -> None:
    """The entropy-coded data below the window is not decoded (that is the saving): garbage there
    leaves the window's pixels as a full decode of the intact image gives them. Damage inside the
    rows decoded is libjpeg's error, as before."""
    data = JPEGS["420"]
    sos = data.index(b"\xff\xda")
    start = sos + 2 + int.from_bytes(data[sos + 2:sos + 4], "big")
    end = len(data) - 2
    cut = start + (end - start) * 9 // 10  # the bottom tenth of the scan (rows 168..187 of 187, about)
    garbled = data[:cut] + bytes(range(0, 255, 3)) * 4 + data[end:]  # garbage: bad codes
    full = simplejpeg.decode_jpeg(data, colorspace="RGBX")
    buf, cw, ch, _, _ = cpu_backend._jpeg.decode_region(garbled, 0, 0, 64, 48, 1)
    assert np.array_equal(np.frombuffer(buf, np.uint8).reshape(ch, cw, 4)[:48, :64], full[:48, :64])
    with pytest.raises(ValueError):  # the whole image: the damage is decoded, and said
        cpu_backend._jpeg.decode_region(garbled, 0, 0, 1 << 30, 1 << 30, 1)


@pytest.mark.parametrize("where", ["cut in its header", "no frame header"])
@pytest.mark.parametrize("extension", [True, False])
def test_a_damaged_header_is_said_in_words(where: str, extension: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """simplejpeg says only "-1" when it cannot read a frame header: the error says what that means
    (libjpeg's own reason where tarproc._jpeg is built)."""
    data = JPEGS["420"]
    sof = data.index(b"\xff\xc0")
    damaged = data[:40] if where == "cut in its header" else data[:sof] + data[sof + 19:]  # SOF0 removed
    if not extension:
        monkeypatch.setattr(cpu_backend, "_jpeg", None)
    elif cpu_backend._jpeg is None:
        pytest.skip("tarproc._jpeg is not built")
    with pytest.raises(cpu_backend.ImageError) as e:
        decode_image(damaged, AugmentSpec(size=32, resize=40), "k")
    message = str(e.value)
    said = "-1" if where == "cut in its header" else "tjDecompressHeader3(): Could not determine subsampling level"
    assert message.startswith(f"damaged JPEG header (simplejpeg: {said}"), message
    assert "): not a decodable JPEG (" in message and "\n" not in message, message
    assert f"the {len(damaged):,} bytes start like a JPEG but are cut short or are not one" in message
    if extension:
        reason = "JPEG datastream contains no image" if where == "cut in its header" else "Invalid JPEG file structure: SOS before SOF"
        assert f"(libjpeg: {reason})" in message, message
    else:
        assert "frame header (size, colour components) is missing, cut short or corrupt" in message
