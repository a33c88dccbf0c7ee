"""A shard with the damage of issue 35 planted among good samples (tests of tarshow's checks).

``planted_samples()`` gives ~40 good samples (a 64x48 JPEG and an integer ``cls`` each) with, at
fixed places, a PNG named .jpg, a JPEG cut to a third, a JPEG with 700 garbage bytes in the middle
of its scan, a sample without ``cls``, ``cls = "dog"``, HTML named .jpg and an empty .jpg.
"""

from __future__ import annotations

import io
import random
from typing import Any

import numpy as np
from PIL import Image

GOOD = 40
# key -> what was planted there
PLANTED = {
    "s/0003": "png named .jpg",
    "s/0007": "jpeg cut to a third",
    "s/0011": "jpeg with garbage inside",
    "s/0015": "no cls",
    "s/0019": "cls dog",
    "s/0023": "html named .jpg",
    "s/0027": "empty jpg",
}


def jpeg_bytes(i: int, size: tuple[int, int] = (64, 48)) -> bytes:
    rng = np.random.default_rng(i)
    pixels = (rng.random((size[1], size[0], 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def png_bytes(i: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (i, 100, 200)).save(buf, "PNG")
    return buf.getvalue()


def garbage_inside(data: bytes, n: int = 700, seed: int = 4) -> bytes:
    """``n`` random bytes put in the middle of the JPEG's scan (its end marker stays)."""
    sos = data.index(b"\xff\xda")
    mid = sos + (len(data) - sos) // 2
    return data[:mid] + random.Random(seed).randbytes(n) + data[mid:]


def planted_samples() -> list[dict[str, Any]]:
    samples: list[dict[str, Any]] = []
    for i in range(GOOD + len(PLANTED)):
        key = f"s/{i:04d}"
        sample: dict[str, Any] = {"__key__": key, "jpg": jpeg_bytes(i), "cls": str(i % 5).encode()}
        what = PLANTED.get(key)
        if what == "png named .jpg":
            sample["jpg"] = png_bytes(i)
        elif what == "jpeg cut to a third":
            sample["jpg"] = sample["jpg"][: len(sample["jpg"]) // 3]
        elif what == "jpeg with garbage inside":
            sample["jpg"] = garbage_inside(sample["jpg"])
        elif what == "no cls":
            del sample["cls"]
        elif what == "cls dog":
            sample["cls"] = b"dog"
        elif what == "html named .jpg":
            sample["jpg"] = b"<!DOCTYPE html>\n<html><body>Not found</body></html>\n"
        elif what == "empty jpg":
            sample["jpg"] = b""
        samples.append(sample)
    return samples
