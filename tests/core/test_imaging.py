"""tarproc.imaging: terminal image encoders (exact escape sequences), decoding, contact sheets."""

from __future__ import annotations

import base64
import io
import re

import pytest
from PIL import Image

from tarproc.errors import TarprocError
from tarproc.imaging import (
    ImageDecodeError,
    blocks_text,
    contact_sheet,
    decode_image,
    detect_protocol,
    encode_for_terminal,
    format_for_name,
    iterm_escape,
    kitty_escape,
    sixel_escape,
)

ESC = "\x1b"


def png_bytes(img: Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# kitty and iTerm2


def test_kitty_single_chunk_exact():
    assert kitty_escape(b"\x89PNG") == f"{ESC}_Ga=T,f=100,q=2;iVBORw=={ESC}\\"


def test_kitty_chunks_of_at_most_4096_base64_bytes():
    data = bytes(range(256)) * 40  # 10240 bytes -> 13656 base64 characters -> 4 chunks
    out = kitty_escape(data)
    pieces = re.findall(r"\x1b_G([^;]*);([^\x1b]*)\x1b\\", out)
    assert "".join(f"{ESC}_G{c};{p}{ESC}\\" for c, p in pieces) == out  # nothing else in between
    assert [c for c, _ in pieces] == ["a=T,f=100,q=2,m=1", "m=1", "m=1", "m=0"]
    assert [len(p) for _, p in pieces] == [4096, 4096, 4096, 13656 - 3 * 4096]
    assert base64.b64decode("".join(p for _, p in pieces)) == data


def test_kitty_exactly_one_full_chunk_has_no_continuation():
    data = bytes(3072)  # exactly 4096 base64 characters
    out = kitty_escape(data)
    assert out == f"{ESC}_Ga=T,f=100,q=2;{'A' * 4096}{ESC}\\"


def test_iterm_exact():
    assert iterm_escape(b"hello") == f"{ESC}]1337;File=inline=1;size=5:aGVsbG8=\x07"


# ---------------------------------------------------------------------------------------------
# sixel


def decode_sixel(text: str) -> tuple[int, int, dict[int, tuple[int, int, int]], dict[tuple[int, int], int]]:
    """A minimal sixel reader for the tests: (width, height, palette, {(x, y): colour index})."""
    assert text.startswith(f"{ESC}P0;1;0q") and text.endswith(f"{ESC}\\")
    body = text[len(f"{ESC}P0;1;0q") : -2]
    m = re.match(r'"1;1;(\d+);(\d+)', body)
    assert m
    width, height = int(m.group(1)), int(m.group(2))
    body = body[m.end() :]
    palette: dict[int, tuple[int, int, int]] = {}
    pixels: dict[tuple[int, int], int] = {}
    x = y = 0
    colour = 0
    i = 0
    while i < len(body):
        c = body[i]
        if c == "#":
            m = re.match(r"#(\d+)(;2;(\d+);(\d+);(\d+))?", body[i:])
            assert m
            colour = int(m.group(1))
            if m.group(2):
                palette[colour] = (int(m.group(3)), int(m.group(4)), int(m.group(5)))
            i += m.end()
            continue
        if c == "$":
            x = 0
        elif c == "-":
            x, y = 0, y + 6
        elif c == "!":
            m = re.match(r"!(\d+)(.)", body[i:])
            assert m
            for _ in range(int(m.group(1))):
                _put(pixels, x, y, ord(m.group(2)) - 63, colour)
                x += 1
            i += m.end()
            continue
        else:
            _put(pixels, x, y, ord(c) - 63, colour)
            x += 1
        i += 1
    return width, height, palette, pixels


def _put(pixels: dict[tuple[int, int], int], x: int, y: int, bits: int, colour: int) -> None:
    assert 0 <= bits < 64
    for k in range(6):
        if bits >> k & 1:
            assert (x, y + k) not in pixels, "two colours painted on one pixel"
            pixels[(x, y + k)] = colour


def test_sixel_exact_small_image_with_runs():
    img = Image.new("RGB", (6, 2), (255, 0, 0))
    img.putpixel((5, 0), (0, 0, 255))
    img.putpixel((5, 1), (0, 0, 255))
    out = sixel_escape(img)
    # two colours; the red row is a run of 5 (RLE), the blue one starts at column 5 after 5 empty sixels
    pal = re.findall(r"#(\d+);2;(\d+);(\d+);(\d+)", out)
    red = next(i for i, *rgb in pal if rgb == ["100", "0", "0"])
    blue = next(i for i, *rgb in pal if rgb == ["0", "0", "100"])
    first, second = sorted([(int(red), "!5B"), (int(blue), "!5?B")])
    assert out == (
        f'{ESC}P0;1;0q"1;1;6;2'
        + "".join(f"#{i};2;{r};{g};{b}" for i, r, g, b in pal)
        + f"#{first[0]}{first[1]}$#{second[0]}{second[1]}-{ESC}\\"
    )


def test_sixel_round_trips_every_pixel():
    img = Image.new("RGB", (13, 14))
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255), (0, 0, 0)]
    for x in range(13):
        for y in range(14):
            img.putpixel((x, y), colours[(x * 3 + y * 7 + x * y) % 5])
    width, height, palette, pixels = decode_sixel(sixel_escape(img))
    assert (width, height) == (13, 14)
    assert len(pixels) == 13 * 14  # every pixel painted exactly once
    for (x, y), idx in pixels.items():
        expect = img.getpixel((x, y))
        assert palette[idx] == tuple(round(v * 100 / 255) for v in expect), (x, y)


def test_sixel_many_colours_are_quantized_to_a_palette():
    img = Image.effect_mandelbrot((64, 40), (-2, -1.2, 1, 1.2), 100).convert("RGB")
    img = Image.merge("RGB", (img.getchannel(0), img.getchannel(0).rotate(90, expand=False), img.getchannel(0)))
    width, height, palette, pixels = decode_sixel(sixel_escape(img, colors=16))
    assert (width, height) == (64, 40) and len(palette) <= 16 and len(pixels) == 64 * 40


# ---------------------------------------------------------------------------------------------
# half blocks


def test_blocks_exact_and_colour_codes_only_on_change():
    img = Image.new("RGB", (2, 3), (10, 20, 30))
    img.putpixel((1, 1), (1, 2, 3))
    out = blocks_text(img, 2)
    fg, bg = "\x1b[38;2;10;20;30m", "\x1b[48;2;10;20;30m"
    assert out == (
        f"{fg}{bg}▀\x1b[48;2;1;2;3m▀\x1b[0m\n"  # rows 0+1
        f"{fg}▀▀\x1b[0m\n"  # row 2 alone: the default background (reset) below
    )


def test_blocks_scales_to_the_column_count():
    out = blocks_text(Image.new("RGB", (100, 50), (1, 1, 1)), 20)
    lines = out.splitlines()
    assert len(lines) == 5 and all(line.count("▀") == 20 for line in lines)


# ---------------------------------------------------------------------------------------------
# protocol detection and whole encoding


@pytest.mark.parametrize(
    "env, expected",
    [
        ({"TERM": "xterm-kitty"}, "kitty"),
        ({"TERM": "xterm-256color", "KITTY_WINDOW_ID": "1"}, "kitty"),
        ({"TERM_PROGRAM": "ghostty"}, "kitty"),
        ({"TERM_PROGRAM": "iTerm.app"}, "iterm"),
        ({"TERM_PROGRAM": "WezTerm"}, "iterm"),
        ({"TERM": "foot"}, "sixel"),
        ({"TERM": "mlterm"}, "sixel"),
        ({"TERM": "xterm-256color"}, "blocks"),
        ({}, "blocks"),
    ],
)
def test_detect_protocol(env, expected):
    assert detect_protocol(env) == expected


def test_encode_for_terminal_kitty_sends_a_fitted_png():
    data = png_bytes(Image.new("RGB", (1000, 500), (0, 128, 255)))
    out = encode_for_terminal(data, "kitty", max_pixels=100)
    payload = "".join(re.findall(r"\x1b_G[^;]*;([^\x1b]*)\x1b\\", out))
    img = Image.open(io.BytesIO(base64.b64decode(payload)))
    assert img.format == "PNG" and img.size == (100, 50)


def test_encode_for_terminal_iterm_and_blocks_fit():
    data = png_bytes(Image.new("RGB", (400, 400), (200, 0, 0)))
    out = encode_for_terminal(data, "iterm", max_pixels=64)
    size = int(re.match(r"\x1b\]1337;File=inline=1;size=(\d+):", out).group(1))
    assert Image.open(io.BytesIO(base64.b64decode(out.split(":", 1)[1].rstrip("\x07\n")))).size == (64, 64)
    assert size > 0
    out = encode_for_terminal(data, "blocks", columns=80, rows=10)
    lines = out.splitlines()
    assert len(lines) <= 10 and lines[0].count("▀") == 20  # a square: 20 cells wide, 10 rows of 2 pixels


def test_decode_errors_are_named():
    with pytest.raises(ImageDecodeError) as e:
        decode_image(b"\xff\xd8\xff\xe0 not really a jpeg", url="x.tar")
    assert isinstance(e.value, TarprocError) and str(e.value).startswith("x.tar: cannot decode image")
    with pytest.raises(ImageDecodeError):
        encode_for_terminal(b"junk", "kitty")
    with pytest.raises(ImageDecodeError, match=r"^x\.tar: cannot decode image: not a format Pillow reads \(text data, 11 "
                       r"bytes\)$"):  # not Pillow's "cannot identify image file <_io.BytesIO object at 0x...>"
        decode_image(b"hello world", url="x.tar")


def test_decode_flattens_transparency_and_reduces_jpeg():
    rgba = Image.new("RGBA", (4, 4), (255, 0, 0, 0))
    assert decode_image(png_bytes(rgba)).getpixel((0, 0)) == (128, 128, 128)
    buf = io.BytesIO()
    Image.new("RGB", (800, 600), (0, 200, 0)).save(buf, "JPEG")
    assert decode_image(buf.getvalue(), max_size=100).size == (100, 75)


def test_contact_sheet_layout_and_captions():
    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255)]
    items = [(Image.new("RGB", (80, 40), c), [f"key{i}", "label"]) for i, c in enumerate(colours)]
    sheet = contact_sheet(items, thumb=40, columns=3, background=(0, 0, 0))
    cell_h = (sheet.height - 4) // 2
    assert sheet.width == 3 * 40 + 2 * 4
    for i, c in enumerate(colours):
        x0, y0 = (i % 3) * 44, (i // 3) * (cell_h + 4)
        assert sheet.getpixel((x0 + 20, y0 + 20)) == c  # thumbnail (40x20) centred in its cell
        assert sheet.getpixel((x0 + 20, y0 + 2)) == (0, 0, 0)  # above the letterboxed thumbnail
        caption = sheet.crop((x0, y0 + 44, x0 + 40, y0 + cell_h))
        assert caption.getbbox() is not None  # some text was drawn
    assert sheet.getpixel((2 * 44 + 20, cell_h + 4 + 20)) == (0, 0, 0)  # the sixth cell is empty


def test_format_for_name():
    assert format_for_name("out.png") == "PNG"
    assert format_for_name("out.webp") == "WEBP"
    assert format_for_name("dir.png/out") is None
    assert format_for_name("out.tar") is None


def test_16_bit_grey_png_keeps_its_levels():
    from tarproc.imaging import decode_image

    ramp = Image.new("I;16", (256, 2))
    ramp.putdata([x * 257 for x in range(256)] * 2)
    buf = io.BytesIO()
    ramp.save(buf, "PNG")
    img = decode_image(buf.getvalue())
    assert img.mode == "RGB" and [img.getpixel((x, 0))[0] for x in (0, 1, 128, 255)] == [0, 1, 128, 255]


def test_long_captions_keep_their_end_and_elide_the_middle(monkeypatch):
    """Keys of one class differ only at their end: cutting the end made their captions look alike."""
    from PIL import ImageDraw

    drawn: list[str] = []
    real_text = ImageDraw.ImageDraw.text
    monkeypatch.setattr(ImageDraw.ImageDraw, "text", lambda self, xy, text, *a, **kw: (
        drawn.append(text), real_text(self, xy, text, *a, **kw))[1])
    keys = [f"train/n01447764/n01447764_{n}" for n in (9123, 9124, 10007)]
    items = [(Image.new("RGB", (40, 40), (200, 0, 0)), [key, "tench"]) for key in keys]
    contact_sheet(items, thumb=96)
    captions = drawn[0::2]
    assert drawn[1::2] == ["tench"] * 3  # short captions are left alone
    assert len(set(captions)) == 3
    draw = ImageDraw.Draw(Image.new("RGB", (1, 1)))
    for key, caption in zip(keys, captions, strict=True):
        start, sep, end = caption.partition("…")
        assert sep and key.startswith(start) and key.endswith(end)
        assert len(end) >= 6 and len(end) >= 2 * len(start)
        assert draw.textlength(caption) <= 96


def test_elide_middle_keeps_the_most_that_fits():
    from tarproc.imaging import elide_middle

    text = "train/n01447764/n01447764_9123"
    for width in range(1, len(text)):
        shown = elide_middle(text, lambda s, w=width: len(s) <= w)
        assert len(shown) == max(width, 1) and shown.count("…") == 1, (width, shown)
        start, _, end = shown.partition("…")
        assert text.startswith(start) and text.endswith(end) and len(end) >= len(start)


def test_an_image_claiming_too_many_pixels_is_refused_before_decoding() -> None:
    import struct
    import zlib

    from tarproc.errors import ImageDecodeError
    from tarproc.imaging import decode_image

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 15680, 4317, 8, 2, 0, 0, 0)) + chunk(b"IDAT", bytes(700))
    with pytest.raises(ImageDecodeError, match="15680x4317 pixels is over the limit of 67,108,864"):
        decode_image(png, max_size=64)
