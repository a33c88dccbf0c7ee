"""The embedded demo dataset: small, deterministic, generated locally (no network).

``python -m tarproc.demo DIR [-n N]`` writes ``DIR/demo/NNNNNN.{jpg,cls,json}``: N synthetic
64x64 JPEG images (colour gradients with a class-dependent pattern), their class and a JSON record.
"""

from __future__ import annotations

import argparse
import io
import json
import os

CLASSES = ["circle", "stripes", "checker", "gradient"]


def _image(index: int, cls: int) -> bytes:
    from PIL import Image, ImageDraw

    size = 64
    r, g, b = (index * 37) % 256, (index * 91) % 256, (index * 53) % 256
    img = Image.new("RGB", (size, size), (r, g, b))
    draw = ImageDraw.Draw(img)
    fg = (255 - r, 255 - g, 255 - b)
    if cls == 0:
        draw.ellipse((8, 8, 56, 56), fill=fg)
    elif cls == 1:
        for x in range(0, size, 8):
            draw.rectangle((x, 0, x + 3, size), fill=fg)
    elif cls == 2:
        for y in range(0, size, 16):
            for x in range((y // 16 % 2) * 16, size, 32):
                draw.rectangle((x, y, x + 15, y + 15), fill=fg)
    else:
        for x in range(size):
            draw.line((x, 0, x, size), fill=(x * 4 % 256, g, b))
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=85)
    return out.getvalue()


def make_demo_files(directory: str, count: int = 200) -> int:
    """Write the demo samples as files under ``directory/demo``; returns the number written."""
    base = os.path.join(directory, "demo")
    os.makedirs(base, exist_ok=True)
    for i in range(count):
        cls = i % len(CLASSES)
        stem = os.path.join(base, f"{i:06d}")
        with open(stem + ".jpg", "wb") as f:
            f.write(_image(i, cls))
        with open(stem + ".cls", "w") as f:
            f.write(str(cls))
        with open(stem + ".json", "w") as f:
            json.dump({"index": i, "label": CLASSES[cls], "source": "tarproc demo"}, f, sort_keys=True)
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("-n", "--count", type=int, default=200)
    args = parser.parse_args()
    n = make_demo_files(args.directory, args.count)
    import sys

    sys.stderr.write(f"demo: wrote {n} samples (jpg, cls, json) under {args.directory}/demo\n")


if __name__ == "__main__":
    main()
