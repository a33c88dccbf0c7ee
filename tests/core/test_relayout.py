"""JPEGs re-laid with restart markers (tarproc.relayout, tarproc._jpeg.relayout) and the crop
decoder that reads only the segments under a window (tarproc._jpeg.decode_region): the pixels are
exactly the input's, markers and trailing bytes are kept, what can't be improved is passed through
and counted, and damage in the segments read is an error."""

from __future__ import annotations

import io
import random
import warnings

import numpy as np
import pytest
from PIL import Image, ImageCms
from tarhelpers import encode_image, photo

from tarproc.decode import AugmentSpec, decode_image, decode_samples
from tarproc.decode import cpu as cpu_backend
from tarproc.errors import DataWarning, DecodeError, OptionError
from tarproc.relayout import PASSED, RELAID, RelayoutStats, is_jpeg_field, relayout_jpeg, relayout_samples

pytestmark = pytest.mark.skipif(cpu_backend._jpeg is None, reason="tarproc._jpeg is not built")
ext = cpu_backend._jpeg


JPEGS = {
    "420": encode_image(photo(250, 187, 2), quality=85),
    "422": encode_image(photo(203, 151, 1), quality=90, subsampling=1),
    "444": encode_image(photo(203, 151, 1), quality=90, subsampling=0),
    "grey": encode_image(photo(141, 113, 4), "JPEG", "L"),
    "tiny": encode_image(photo(17, 9, 5), quality=90),
}


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def whole(data: bytes, num: int = 8) -> np.ndarray:
    """The whole image decoded by decode_region at num/8 (a file without markers: today's path)."""
    buf, cw, ch, ox, oy = ext.decode_region(data, 0, 0, 1 << 20, 1 << 20, 8, num)
    assert (ox, oy) == (0, 0)
    return np.frombuffer(buf, np.uint8).reshape(ch, cw, 4)


def region(data: bytes, window: tuple[int, int, int, int], num: int = 8) -> np.ndarray:
    x0, y0, x1, y1 = window
    buf, cw, ch, ox, oy = ext.decode_region(data, x0, y0, x1, y1, 8, num)
    assert ox <= x0 and oy <= y0 and ox + cw >= x1 and oy + ch >= y1
    return np.frombuffer(buf, np.uint8).reshape(ch, cw, 4)[y0 - oy:y1 - oy, x0 - ox:x1 - ox]


def scan(data: bytes) -> tuple[int, list[int]]:
    """Where the entropy-coded data starts, and the offsets of its restart markers."""
    at = 2
    while data[at + 1] != 0xDA:
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    start, markers = at, []
    while True:
        at = data.index(b"\xff", at)
        if data[at + 1] == 0:
            at += 2
        elif 0xD0 <= data[at + 1] <= 0xD7:
            markers.append(at)
            at += 2
        else:
            return start, markers


def app_markers(data: bytes) -> list[tuple[int, bytes]]:
    """The APP1..APP15 and COM segments before the scan, in order."""
    at, found = 2, []
    while data[at + 1] != 0xDA:
        length = int.from_bytes(data[at + 2:at + 4], "big")
        if 0xE1 <= data[at + 1] <= 0xEF or data[at + 1] == 0xFE:
            found.append((data[at + 1], data[at + 4:at + 2 + length]))
        at += 2 + length
    return found


@pytest.mark.parametrize("name", JPEGS)
@pytest.mark.parametrize("interval", [0, 1, 3, 1000])
def test_relaid_pixels_are_the_originals(name: str, interval: int) -> None:
    data = JPEGS[name]
    out, outcome = relayout_jpeg(data, interval)
    assert outcome == RELAID and out != data
    assert np.array_equal(pixels(out), pixels(data))
    if interval == 1 or (interval < 1000 and name != "tiny"):  # else one segment holds the image
        assert scan(out)[1], "no restart marker written"
    assert relayout_jpeg(out) == (out, "restart markers")  # laid out already: left as it is


def dht(data: bytes) -> list[bytes]:
    """The Huffman table segments before the scan."""
    at, found = 2, []
    while data[at + 1] != 0xDA:
        length = int.from_bytes(data[at + 2:at + 4], "big")
        if data[at + 1] == 0xC4:
            found.append(data[at + 4:at + 2 + length])
        at += 2 + length
    return found


def test_the_inputs_huffman_tables_are_kept_where_they_can_code_the_new_data() -> None:
    """Standard tables code every DC category: kept, and the size grows by the markers alone;
    --optimize writes tables of the image's own (smaller). Tables optimized for the input lack
    some DC categories that a segment's first block may need: the output's are optimized."""
    data = JPEGS["420"]
    kept, _ = relayout_jpeg(data)
    assert b"".join(dht(kept)) == b"".join(dht(data)) and len(data) < len(kept) < 1.03 * len(data)
    smaller, _ = relayout_jpeg(data, optimize=True)
    assert dht(smaller) != dht(data) and len(smaller) < len(data)
    assert np.array_equal(pixels(smaller), pixels(data))
    tuned = encode_image(photo(250, 187, 2), quality=85, optimize=True)
    out, outcome = relayout_jpeg(tuned)
    assert outcome == RELAID and np.array_equal(pixels(out), pixels(tuned))


def test_a_small_file_gets_few_markers() -> None:
    """Markers cost ~4 bytes each: a 3 KB image gets fewer segments than a row cut in 8 would give."""
    data = JPEGS["grey"]  # 141 x 113, 18 x 15 MCUs, ~3 KB
    out, _ = relayout_jpeg(data)
    assert len(out) < 1.03 * len(data)
    assert 0 < len(scan(out)[1]) <= 15


def test_the_default_interval_cuts_a_row_into_about_sixteen_segments() -> None:
    data = encode_image(photo(512, 64, 1), quality=90)  # 4:2:0, 32 MCUs a row, 4 rows
    out, _ = relayout_jpeg(data)
    assert len(scan(out)[1]) == 16 * 4 - 1  # an interval of 2 MCUs
    prime = encode_image(photo(31 * 16, 32, 1), quality=90)  # 31 MCUs a row: no divisor near 16
    assert len(scan(relayout_jpeg(prime)[0])[1]) == 2 - 1  # a segment a row


def test_the_default_interval_keeps_the_markers_within_two_percent() -> None:
    """Where 16 segments a row would cost more than ~2% of the file, fewer: 8 here (a smooth,
    small file), then one a row, then segments of several rows."""
    smooth = encode_image(photo(512, 384, 1), quality=60)  # 32 MCUs a row, 24 rows
    out, _ = relayout_jpeg(smooth)
    across = (len(scan(out)[1]) + 1) // 24
    assert across < 16 and len(out) <= len(smooth) * 1.025, (across, len(smooth), len(out))
    assert len(scan(out)[1]) + 1 <= len(smooth) // 200


@pytest.mark.parametrize("name", ["420", "422", "444", "grey"])
@pytest.mark.parametrize("interval", [0, 1, 2])
@pytest.mark.parametrize("num", [8, 4, 3, 1])
def test_a_crop_of_a_relaid_jpeg_is_the_whole_decodes(name: str, interval: int, num: int) -> None:
    """Windows anywhere (edges and corners included), at DCT scales: the segments read give the
    pixels of the original's whole decode."""
    data = JPEGS[name]
    out, _ = relayout_jpeg(data, interval)
    full = whole(data, num)
    H, W = full.shape[:2]
    rng = random.Random(f"{name}{interval}{num}")
    windows = [(0, 0, W, H), (0, 0, 1, 1), (W - 1, H - 1, W, H), (0, H - 1, W, H), (W - 1, 0, W, 1)]
    for _ in range(30):
        x0, y0 = rng.randrange(W), rng.randrange(H)
        windows.append((x0, y0, rng.randrange(x0 + 1, W + 1), rng.randrange(y0 + 1, H + 1)))
    for window in windows:
        x0, y0, x1, y1 = window
        assert np.array_equal(region(out, window, num)[..., :3], full[y0:y1, x0:x1, :3]), window


@pytest.mark.parametrize("size", [(19, 40), (20, 40), (40, 19), (40, 20)])
def test_windows_in_a_last_mcu_of_three_or_four_pixels(size: tuple[int, int]) -> None:
    """Segments cut to the last MCU alone would make an image 3 or 4 pixels across, whose 4:2:0
    chroma libjpeg-turbo upsamples otherwise than the same columns of a wider image: the decoder
    keeps two MCUs at least."""
    data = encode_image(photo(*size, 6), quality=90)
    out, _ = relayout_jpeg(data, 1)
    full = whole(data)
    H, W = full.shape[:2]
    for x0 in range(W - 4, W):
        for y0 in range(H - 4, H):
            for window in ((x0, 0, W, H), (0, y0, W, H), (x0, y0, W, H), (x0, y0, x0 + 1, y0 + 1)):
                a, b, c, d = window
                assert np.array_equal(region(out, window)[..., :3], full[b:d, a:c, :3]), window


def test_the_decode_stage_gives_the_same_arrays_from_both_layouts() -> None:
    data = JPEGS["420"]
    out, _ = relayout_jpeg(data)
    for spec in (AugmentSpec(), AugmentSpec(size=64), AugmentSpec(size=56, random_crop=True, flip=0.5, seed=3)):
        for key in ("a", "b", "c"):
            assert np.array_equal(decode_image(out, spec, key), decode_image(data, spec, key)), (spec, key)


def test_exif_icc_comments_and_trailing_bytes_are_kept() -> None:
    exif = Image.Exif()
    exif[0x010F] = "tarproc camera"  # Make
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    im = Image.fromarray(photo(120, 90, 7))
    buf = io.BytesIO()
    im.save(buf, "JPEG", exif=exif.tobytes(), icc_profile=icc, comment=b"a comment")
    data = buf.getvalue() + b"trailing bytes"
    out, outcome = relayout_jpeg(data)
    assert outcome == RELAID
    assert app_markers(out) == app_markers(data) and len(app_markers(data)) == 3
    assert out.endswith(b"\xff\xd9trailing bytes")
    relaid = Image.open(io.BytesIO(out))
    assert relaid.info["icc_profile"] == icc and relaid.getexif()[0x010F] == "tarproc camera"
    assert np.array_equal(pixels(out), pixels(data))


def test_what_cannot_be_improved_is_passed_through_with_its_reason() -> None:
    cmyk = encode_image(np.dstack([photo(40, 30, 1), photo(40, 30, 2)[..., :1]]), mode="CMYK")
    cases = {
        "progressive": encode_image(photo(80, 60, 3), progressive=True),
        "CMYK": cmyk,
        "not a JPEG": encode_image(photo(20, 20, 1), "PNG"),
        "restart markers": relayout_jpeg(JPEGS["420"])[0],
    }
    for reason, data in cases.items():
        assert relayout_jpeg(data) == (data, reason)
    with pytest.raises(ValueError, match="Premature end"):
        relayout_jpeg(JPEGS["420"][:2000])
    with pytest.raises(OptionError, match="interval"):
        relayout_jpeg(JPEGS["420"], 70000)


def test_the_stage_counts_what_it_did_and_keeps_every_other_byte() -> None:
    samples = [
        {"__key__": "a", "__url__": "s.tar", "jpg": JPEGS["420"], "cls": b"1", "left.jpeg": JPEGS["grey"]},
        {"__key__": "b", "__url__": "s.tar", "jpg": encode_image(photo(80, 60, 3), progressive=True)},
        {"__key__": "c", "__url__": "s.tar", "jpg": JPEGS["444"][:1500], "txt": b"x"},
        {"__key__": "d", "__url__": "s.tar", "png": encode_image(photo(20, 20, 1), "PNG")},
    ]
    stats = RelayoutStats()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = list(relayout_samples(samples, threads=2, stats=stats))
    assert [s["__key__"] for s in out] == ["a", "b", "c", "d"]
    assert out[0]["cls"] == b"1" and out[0]["__url__"] == "s.tar"
    assert np.array_equal(pixels(out[0]["left.jpeg"]), pixels(JPEGS["grey"]))
    assert out[1] == samples[1] and out[2] == samples[2] and out[3] == samples[3]
    assert (stats.samples, stats.relaid, dict(stats.passed)) == (4, 2, {"progressive": 1, "damaged": 1})
    assert stats.bytes_before == len(JPEGS["420"]) + len(JPEGS["grey"])
    assert stats.bytes_after == len(out[0]["jpg"]) + len(out[0]["left.jpeg"])
    [warning] = [w for w in caught if issubclass(w.category, DataWarning)]
    assert "s.tar: field 'jpg' of sample 'c' passed through unchanged: Premature end" in str(warning.message)
    assert "2 JPEGs re-laid" in stats.summary() and "1 progressive, 1 damaged" in stats.summary()
    assert set(PASSED) >= set(stats.passed)
    with pytest.raises(DecodeError, match="sample 'c'"):
        list(relayout_samples(samples, strict=True))


def test_only_jpeg_fields_are_relaid() -> None:
    assert is_jpeg_field("jpg") and is_jpeg_field("left.JPEG") and not is_jpeg_field("jpg.json")
    assert not is_jpeg_field("png") and not is_jpeg_field("__key__")


# ---------------------------------------------------------------------------------------------
# damage: in the segments read it is an error; elsewhere it is not seen


def _relaid_420() -> tuple[bytes, list[int]]:
    """A 4:2:0 image of 32 x 12 MCUs, one segment a row: marker i ends MCU row i."""
    out, _ = relayout_jpeg(encode_image(photo(512, 192, 9), quality=90), 32)
    start, markers = scan(out)
    assert len(markers) == 11
    return out, [start] + [m + 2 for m in markers]


def _shortened(data: bytes, row_starts: list[int], row: int) -> bytes:
    """The segment of MCU row `row` cut to its first 100 bytes (libjpeg notices a segment that
    ends early; a few bytes changed inside one decode to other pixels unnoticed, with or without
    markers)."""
    end = row_starts[row + 1] - 2 if row + 1 < len(row_starts) else len(data) - 2
    return data[:row_starts[row] + 100] + data[end:]


def test_a_damaged_segment_inside_the_window_is_an_error() -> None:
    out, rows = _relaid_420()
    damaged = _shortened(out, rows, 8)  # MCU row 8: pixels 128..143
    with pytest.raises(ValueError, match="Corrupt JPEG data"):
        ext.decode_region(damaged, 100, 120, 300, 150, 8, 8)
    sample = {"__key__": "k7", "__url__": "s.tar", "jpg": damaged}
    with pytest.raises(DecodeError, match="s.tar: cannot decode field 'jpg' of sample 'k7': Corrupt JPEG data"):
        list(decode_samples([sample], AugmentSpec(size=64), device="cpu"))


def test_damage_above_and_below_the_window_is_not_seen() -> None:
    out, rows = _relaid_420()
    want = region(out, (100, 80, 300, 100))
    for row in (1, 11):  # rows the window and its margin of one MCU don't reach
        assert np.array_equal(region(_shortened(out, rows, row), (100, 80, 300, 100)), want)


def test_a_misnumbered_marker_is_read_from_the_top_with_todays_rules() -> None:
    """A marker out of sequence: the segments can't be trusted, so the window is decoded as a
    file without markers would be, and libjpeg reports the marker in the rows it reads."""
    out, rows = _relaid_420()
    at = rows[3] - 2  # the marker ending MCU row 2
    bad = out[:at + 1] + bytes([0xD0 + 5]) + out[at + 2:]
    with pytest.raises(ValueError, match="Corrupt JPEG data"):
        ext.decode_region(bad, 100, 120, 300, 150, 8, 8)


def test_a_relaid_stream_cut_short_is_an_error_whatever_the_window() -> None:
    out, rows = _relaid_420()
    with pytest.raises(ValueError, match="Premature end|cut short"):
        ext.decode_region(out[:rows[11] + 50], 0, 0, 50, 20, 8, 8)


def test_relayout_checks_its_arguments() -> None:
    with pytest.raises(ValueError, match="interval must be 0"):
        ext.relayout(JPEGS["420"], -1)
    with pytest.raises(ValueError, match="interval must be 0"):
        ext.relayout(JPEGS["420"], 65536)
    with pytest.raises(TypeError):
        ext.relayout("not bytes")
    for data in (b"", b"\xff\xd8", b"\xff\xd8\xff\xe0\x00\x10JFIF"):
        with pytest.raises(ValueError):
            ext.relayout(data)


def test_a_dataset_over_relaid_shards_gives_the_batches_of_the_originals(tmp_path) -> None:
    """The crossing a user meets: `tarjpeg` once, then training with random crops in DataLoader
    workers over the re-laid shards — the same batches, pixel for pixel, as over the originals."""
    pytest.importorskip("torch")
    from tarhelpers import write_tar

    import tarproc

    samples = [{"__key__": f"k{i:03d}", "jpg": encode_image(photo(250, 187, i), quality=85), "cls": str(i % 3)}
               for i in range(12)]
    original = write_tar(tmp_path / "a.tar", samples)
    laid = list(relayout_samples(iter(samples), threads=2))
    assert all(b"\xff\xdd" in s["jpg"] for s in laid)  # each has a restart interval (DRI): crops use the segments
    relaid = write_tar(tmp_path / "b.tar", laid)
    spec = AugmentSpec(size=64, random_crop=True, flip=0.5)

    def batches(url):
        ds = tarproc.Dataset(str(url), decode=spec, to_tuple=("__key__", "jpg", "cls"), batch_size=4, seed=3)
        return [(list(keys), images.numpy(), labels.numpy()) for keys, images, labels in ds.loader(num_workers=2)]

    a, b = batches(original), batches(relaid)
    assert [k for k, _, _ in a] == [k for k, _, _ in b] and len(a) == 3
    for (_, x, y), (_, x2, y2) in zip(a, b, strict=True):
        assert np.array_equal(x, x2) and np.array_equal(y, y2)
