"""tarproc._jpeg's own Huffman decoder (decode_region's entropy decoding, in place of libjpeg's):
the same coefficients, so the same pixels, as libjpeg on every kind of baseline JPEG, with and
without restart markers, whole or cropped, at every scale; scans it does not handle are left to
libjpeg; and damage libjpeg reports is reported too (and some that libjpeg-turbo lets pass)."""

from __future__ import annotations

import random

import pytest
from tarhelpers import encode_image, photo

from tarproc.decode import cpu as cpu_backend

pytestmark = pytest.mark.skipif(cpu_backend._jpeg is None, reason="tarproc._jpeg is not built")
ext = cpu_backend._jpeg


def decode(data: bytes, window: tuple[int, int, int, int], own: bool, num: int = 8,
           two_at_once: bool = True) -> tuple[object, ...] | str:
    """decode_region's answer with the one decoder or the other (ours decoding restart segments
    two at a time, or one), or its error's words."""
    ext.use_own_entropy(own, two_at_once)
    try:
        buf, *rest = ext.decode_region(data, *window, 8, num, 4)
        return (bytes(buf), *rest)
    except ValueError as e:
        return f"error: {e}"
    finally:
        ext.use_own_entropy(True)


def kinds() -> list[tuple[str, bytes, int, int]]:
    """Baseline JPEGs of every layout the decoder meets: subsamplings, grey, qualities, optimized
    tables, odd sizes, and the same re-laid with restart markers (one MCU, several, a row)."""
    made = []
    for i, (w, h, sub, quality, optimize) in enumerate([(250, 187, 2, 85, False), (203, 151, 1, 95, False),
                                                        (203, 151, 0, 60, True), (17, 9, 2, 100, False),
                                                        (331, 97, 2, 30, True), (64, 48, 0, 100, True)]):
        made.append((f"{w}x{h} sub{sub} q{quality}", encode_image(photo(w, h, i), quality=quality,
                                                                  subsampling=sub, optimize=optimize), w, h))
    made.append(("grey", encode_image(photo(141, 113, 4), "JPEG", "L", quality=90), 141, 113))
    for name, data, w, h in list(made):
        for interval in (1, 3, 0):
            relaid = ext.relayout(data, interval, False)
            if isinstance(relaid, bytes):
                made.append((f"{name} restart {interval or 'auto'}", relaid, w, h))
    return made


KINDS = kinds()


@pytest.mark.parametrize("name,data,w,h", KINDS, ids=[k[0] for k in KINDS])
def test_the_same_pixels_as_libjpeg_whole_cropped_and_scaled(name: str, data: bytes, w: int, h: int) -> None:
    rnd = random.Random(name)
    windows = [(0, 0, w, h)]
    for _ in range(6):
        x0, y0 = rnd.randrange(w), rnd.randrange(h)
        windows.append((x0, y0, rnd.randrange(x0 + 1, w + 1), rnd.randrange(y0 + 1, h + 1)))
    for num in (8, 4, 3, 1):
        for x0, y0, x1, y1 in windows:
            scaled = (x0 * num // 8, y0 * num // 8, max(x1 * num // 8, x0 * num // 8 + 1), max(y1 * num // 8, y0 * num // 8 + 1))
            ours, theirs = decode(data, scaled, True, num), decode(data, scaled, False, num)
            assert not isinstance(ours, str), ours
            assert ours == theirs, (num, scaled)
            assert decode(data, scaled, True, num, two_at_once=False) == theirs, (num, scaled)


def test_a_progressive_jpeg_is_left_to_libjpeg() -> None:
    data = encode_image(photo(120, 90, 3), quality=90, progressive=True)
    assert decode(data, (0, 0, 120, 90), True) == decode(data, (0, 0, 120, 90), False)
    assert decode(data, (30, 20, 90, 70), True) == decode(data, (30, 20, 90, 70), False)


def entropy_start(data: bytes) -> int:
    at = 2
    while data[at + 1] != 0xDA:
        at += 2 + int.from_bytes(data[at + 2:at + 4], "big")
    return at + 2 + int.from_bytes(data[at + 2:at + 4], "big")


def test_damage_libjpeg_reports_is_reported_and_what_both_pass_is_the_same() -> None:
    """Random damage (a bit flipped, a byte inserted or deleted, the end cut off) after the headers:
    where libjpeg says the data is corrupt, so does this decoder; where both pass it, the pixels are
    the same. This one may say more: bytes left before a restart marker and bad Huffman codes
    (libjpeg-turbo's fast path decodes a bad code as 0 without a word) are errors here."""
    rnd = random.Random(7)
    bases = [k for k in KINDS if k[2] >= 64]
    stricter = 0
    for _ in range(400):
        name, data, w, h = rnd.choice(bases)
        damaged = bytearray(data)
        at = rnd.randrange(entropy_start(data), len(data) - 2)
        how = rnd.choice(["flip", "insert", "delete", "cut"])
        if how == "flip":
            damaged[at] ^= 1 << rnd.randrange(8)
        elif how == "insert":
            damaged[at:at] = bytes([rnd.randrange(256)])
        elif how == "delete":
            del damaged[at]
        else:
            del damaged[at:]
        window = (0, 0, w, h) if rnd.random() < 0.5 else (rnd.randrange(w // 2), rnd.randrange(h // 2), w, h)
        ours, theirs = decode(bytes(damaged), window, True), decode(bytes(damaged), window, False)
        one_at_a_time = decode(bytes(damaged), window, True, two_at_once=False)
        assert isinstance(ours, str) == isinstance(one_at_a_time, str), (name, how, at, ours, one_at_a_time)
        if not isinstance(ours, str):
            assert ours == one_at_a_time
        if isinstance(theirs, str):
            assert isinstance(ours, str), (name, how, at, theirs)
        elif isinstance(ours, str):
            stricter += 1
            assert "extraneous bytes" in ours or "bad Huffman code" in ours, (name, how, at, ours)
        else:
            assert ours == theirs, (name, how, at)
    assert stricter < 40  # a few: most damage both see alike


def test_a_bad_huffman_code_is_an_error() -> None:
    """A run of one bits longer than any code (stuffed 0xFF bytes) in the middle of the scan."""
    name, data, w, h = KINDS[0]
    start = entropy_start(data)
    middle = (start + len(data)) // 2
    damaged = data[:middle] + b"\xff\x00" * 4 + data[middle + 8:]
    got = decode(damaged, (0, 0, w, h), True)
    assert isinstance(got, str) and "bad Huffman code" in got, got


@pytest.mark.parametrize("two_at_once", [True, False])
@pytest.mark.parametrize("damage", ["extra bytes", "misnumbered", "cut"])
def test_damage_at_a_restart_marker_is_an_error_in_libjpegs_words(damage: str, two_at_once: bool) -> None:
    name, data, w, h = next(k for k in KINDS if k[0].endswith("restart 1"))
    markers = [i for i in range(entropy_start(data), len(data) - 1)
               if data[i] == 0xFF and 0xD0 <= data[i + 1] <= 0xD7]
    at = markers[len(markers) // 2]
    if damage == "extra bytes":
        damaged, words = data[:at] + b"\x12\x34\x56" + data[at:], "extraneous bytes before marker"
    elif damage == "misnumbered":
        damaged, words = data[:at + 1] + bytes([0xD0 + (data[at + 1] - 0xD0 + 3) % 8]) + data[at + 2:], "instead of RST"
    else:
        damaged, words = data[:at], "Premature end of JPEG file"
    got = decode(damaged, (0, 0, w, h), True, two_at_once=two_at_once)
    assert isinstance(got, str) and words in got, got

