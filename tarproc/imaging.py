"""Images for people: a contact sheet (a grid of captioned thumbnails) and terminal image encoders.

Terminal protocols (``encode_for_terminal``):

- ``kitty``: the kitty graphics protocol, a PNG sent as base64 in chunks of at most 4096 bytes
  (``ESC _G a=T,f=100,q=2,m=1;DATA ESC \\`` ...); kitty, WezTerm, Ghostty, Konsole;
- ``iterm``: iTerm2's inline images (``ESC ]1337;File=inline=1;size=N:BASE64 BEL``); iTerm2, WezTerm;
- ``sixel``: DEC sixel graphics, a palette of at most 256 colours with run-length encoding;
  foot, mlterm, xterm started with ``-ti vt340``, and others;
- ``blocks``: Unicode upper half blocks ``▀`` with 24-bit foreground/background colours, two pixel
  rows per text row: any terminal with true colour.

``detect_protocol(environ)`` picks one from the environment; it never asks the terminal.
Decoding errors become ``ImageDecodeError``; Pillow is imported only when an image is handled.
"""

from __future__ import annotations

import base64
import io
import math
import re
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import ImageDecodeError

PROTOCOLS = ("kitty", "iterm", "sixel", "blocks")
KITTY_CHUNK = 4096
ESC = "\x1b"
ST = ESC + "\\"  # string terminator
_SIXEL_TERMS = ("foot", "mlterm", "yaft", "contour", "sixel")
_KITTY_PROGRAMS = ("ghostty",)
_ITERM_PROGRAMS = ("iTerm.app", "WezTerm")
ELLIPSIS = "…"
# the modules Pillow warns from (warnings.filterwarnings(module=...)): a block around a Pillow call
# ignores these, never every warning -- the filters are the process's, shared by all its threads
PILLOW_MODULES = r"PIL(\..*)?\Z"


def detect_protocol(environ: Mapping[str, str]) -> str:
    """The terminal image protocol suggested by the environment; ``blocks`` when nothing is known.

    >>> detect_protocol({"TERM": "xterm-kitty"}), detect_protocol({"TERM_PROGRAM": "iTerm.app"})
    ('kitty', 'iterm')
    >>> detect_protocol({"TERM": "foot"}), detect_protocol({"TERM": "xterm-256color"})
    ('sixel', 'blocks')
    """
    term = environ.get("TERM", "")
    program = environ.get("TERM_PROGRAM", "")
    if term == "xterm-kitty" or environ.get("KITTY_WINDOW_ID") or program.lower() in _KITTY_PROGRAMS:
        return "kitty"
    if program in _ITERM_PROGRAMS or environ.get("LC_TERMINAL") == "iTerm2":
        return "iterm"
    if any(t in term for t in _SIXEL_TERMS):
        return "sixel"
    return "blocks"


# ---------------------------------------------------------------------------------------------
# decoding and thumbnails


def rgb_image(img: Any) -> Any:
    """``img`` as 8-bit RGB: alpha dropped, grey replicated, CMYK converted, and 16/32-bit grey
    scaled to 8 bits (``convert`` alone would clip 16-bit values to white)."""
    if img.mode in ("I;16", "I;16L", "I;16B", "I;16N", "I"):
        img = img.convert("I").point(lambda v: v * (1 / 256)).convert("L")
    return img.convert("RGB")


def decode_image(data: bytes | bytearray | memoryview, max_size: int | None = None, url: str | None = None) -> Any:
    """A Pillow RGB image from encoded bytes, reduced to fit ``max_size`` pixels when given.

    JPEGs are decoded at a reduced size directly (``draft``) when that is enough for ``max_size``.
    Raises ``ImageDecodeError`` for data Pillow can't decode, a decompression bomb, or an image
    over the decode stage's pixel limit (``DEFAULT_MAX_PIXELS``, after any draft reduction).
    """
    from PIL import Image, UnidentifiedImageError

    from .sniff import sniff_type

    try:
        with warnings.catch_warnings():
            # Pillow's other warnings (truncated data, odd metadata) would be lines on stderr naming
            # no sample: what matters is whether the image decodes. Only Pillow's: the filters are
            # the process's, and another thread's warnings (a retried read) must still show
            warnings.filterwarnings("ignore", module=PILLOW_MODULES)
            # a "decompression bomb" is an error here, not a warning: a thumbnail isn't worth it
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return _decoded(Image, data, max_size, url)
    except UnidentifiedImageError:  # its message names an io.BytesIO object
        raise ImageDecodeError(f"cannot decode image: not a format Pillow reads ({sniff_type(bytes(data[:64]))} "
                               f"data, {len(data):,} bytes)", url) from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        raise ImageDecodeError(f"cannot decode image: {e}", url) from None


def _decoded(Image: Any, data: bytes | bytearray | memoryview, max_size: int | None, url: str | None) -> Any:
    from .decode.spec import DEFAULT_MAX_PIXELS

    img: Any = Image.open(io.BytesIO(bytes(data)))
    if max_size is not None and img.format == "JPEG":
        img.draft("RGB", (max_size, max_size))
    width, height = img.size  # from the header: refuse before the pixels are allocated
    if width * height > DEFAULT_MAX_PIXELS:
        raise ImageDecodeError(f"cannot decode image: {width}x{height} pixels is over the limit of "
                               f"{DEFAULT_MAX_PIXELS:,}", url)
    img.load()
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        # flatten transparency onto a neutral grey rather than black
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (128, 128, 128, 255))
        img = Image.alpha_composite(background, rgba)
    img = rgb_image(img)
    if max_size is not None:
        img.thumbnail((max_size, max_size))
    return img


def contact_sheet(
    items: Sequence[tuple[Any, Sequence[str]]],
    *,
    thumb: int = 160,
    columns: int | None = None,
    background: tuple[int, int, int] = (24, 24, 24),
    foreground: tuple[int, int, int] = (235, 235, 235),
) -> Any:
    """A grid of ``(image, caption_lines)`` cells: each image fitted into ``thumb`` x ``thumb``
    pixels and centred, its caption lines below, cut to the cell width.

    >>> from PIL import Image
    >>> sheet = contact_sheet([(Image.new("RGB", (40, 20), "red"), ["a/001", "cat"])] * 3, thumb=32)
    >>> sheet.size, sheet.getpixel((16, 16))
    ((68, 132), (255, 0, 0))
    """
    from PIL import Image, ImageDraw, ImageFont

    if not items:
        raise ValueError("a contact sheet needs at least one image")
    n = len(items)
    cols = columns or math.ceil(math.sqrt(n))
    cols = max(1, min(cols, n))
    rows = math.ceil(n / cols)
    font = ImageFont.load_default()
    line_h = _line_height(font)
    caption_lines = max(len(c) for _, c in items)
    pad = 4
    cell_w = thumb
    cell_h = thumb + caption_lines * line_h + (pad if caption_lines else 0)
    sheet = Image.new("RGB", (cols * cell_w + (cols - 1) * pad, rows * cell_h + (rows - 1) * pad), background)
    draw = ImageDraw.Draw(sheet)
    for i, (img, caption) in enumerate(items):
        x0 = (i % cols) * (cell_w + pad)
        y0 = (i // cols) * (cell_h + pad)
        small = img if img.width <= thumb and img.height <= thumb else _fitted(img, thumb)
        sheet.paste(small, (x0 + (thumb - small.width) // 2, y0 + (thumb - small.height) // 2))
        for j, text in enumerate(caption):
            draw.text((x0, y0 + thumb + pad + j * line_h), _fit_text(draw, text, font, cell_w), fill=foreground, font=font)
    return sheet


def _fitted(img: Any, size: int) -> Any:
    small = img.copy()
    small.thumbnail((size, size))
    return small


def _line_height(font: Any) -> int:
    left, top, right, bottom = font.getbbox("Ag|")
    return int(bottom) + 2


def _fit_text(draw: Any, text: str, font: Any, width: int) -> str:
    """``text`` if it fits in ``width`` pixels, else its start and its end around an ellipsis.

    The end gets two thirds of what is kept: keys differ at their end (``train/n01/n01_9123``), so
    captions of one class cut at the end would all look alike.
    """
    if draw.textlength(text, font=font) <= width:
        return text
    return elide_middle(text, lambda s: draw.textlength(s, font=font) <= width)


def elide_middle(text: str, fits: Callable[[str], bool]) -> str:
    """The longest ``START…END`` of ``text`` that ``fits``, END twice as long as START (or ``…``).

    >>> elide_middle("train/n01447764/n01447764_9123", lambda s: len(s) <= 16)
    'train…47764_9123'
    >>> elide_middle("abcdef", lambda s: len(s) <= 3)
    '…ef'
    """
    def shown(kept: int) -> str:
        head = kept // 3
        return text[:head] + ELLIPSIS + text[len(text) - (kept - head):]

    lo, hi = 0, len(text) - 1
    while lo < hi:  # the most characters kept that still fit
        mid = (lo + hi + 1) // 2
        if fits(shown(mid)):
            lo = mid
        else:
            hi = mid - 1
    return shown(lo)


def save_image(img: Any, fmt: str) -> bytes:
    """``img`` encoded in a Pillow format (``"PNG"``, ``"JPEG"``...)."""
    buf = io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def format_for_name(name: str) -> str | None:
    """The Pillow format that writes a file name's suffix, or None.

    >>> format_for_name("grid.png"), format_for_name("a/b.JPG"), format_for_name("x.tar")
    ('PNG', 'JPEG', None)
    """
    from PIL import Image

    suffix = "." + name.rsplit(".", 1)[-1].lower() if "." in name.rsplit("/", 1)[-1] else ""
    fmt = Image.registered_extensions().get(suffix)
    if fmt is None or fmt not in Image.SAVE:
        return None
    return fmt


# ---------------------------------------------------------------------------------------------
# terminal encoders


def kitty_escape(png: bytes) -> str:
    """The kitty graphics protocol: transmit and display a PNG (``a=T,f=100``), quietly (``q=2``),
    in base64 chunks of at most 4096 bytes.

    >>> kitty_escape(b"PNG")
    '\\x1b_Ga=T,f=100,q=2;UE5H\\x1b\\\\'
    """
    data = base64.standard_b64encode(png).decode("ascii")
    chunks = [data[i : i + KITTY_CHUNK] for i in range(0, len(data), KITTY_CHUNK)] or [""]
    out = []
    for i, chunk in enumerate(chunks):
        more = 1 if i < len(chunks) - 1 else 0
        if i == 0:
            control = "a=T,f=100,q=2" + (",m=1" if more else "")
        else:
            control = f"m={more}"
        out.append(f"{ESC}_G{control};{chunk}{ST}")
    return "".join(out)


def iterm_escape(data: bytes) -> str:
    """iTerm2's inline image: any format the terminal decodes itself.

    >>> iterm_escape(b"PNG")
    '\\x1b]1337;File=inline=1;size=3:UE5H\\x07'
    """
    return f"{ESC}]1337;File=inline=1;size={len(data)}:{base64.standard_b64encode(data).decode('ascii')}\x07"


_SIXEL_CHARS = bytes(range(63, 127)) + bytes(192)  # sixel value 0..63 -> '?'..'~'
_RUNS = re.compile(rb"(.)\1{3,}")


def _rle(line: bytes) -> bytes:
    return _RUNS.sub(lambda m: b"!%d%s" % (len(m.group(0)), m.group(1)), line)


def sixel_escape(img: Any, colors: int = 256) -> str:
    """DEC sixel graphics for a Pillow image: palette of at most ``colors`` (Pillow's quantizer), one
    band of six pixel rows at a time, each colour's row run-length encoded (``!N`` + character).

    >>> from PIL import Image
    >>> sixel_escape(Image.new("RGB", (5, 6), (255, 0, 0)))
    '\\x1bP0;1;0q"1;1;5;6#0;2;100;0;0#0!5~-\\x1b\\\\'
    """
    rgb = img.convert("RGB")
    width, height = rgb.size
    if rgb.getcolors(colors) is not None:
        # few colours already: an exact palette, no dithering
        from PIL import Image

        quant = rgb.quantize(colors=colors, method=Image.Quantize.MAXCOVERAGE, dither=Image.Dither.NONE)
    else:
        quant = rgb.quantize(colors=colors)
    palette = quant.getpalette() or []
    pixels = quant.tobytes()  # one palette index per pixel
    used = sorted(set(pixels))
    out = [f'{ESC}P0;1;0q"1;1;{width};{height}']
    for i in used:
        r, g, b = palette[3 * i : 3 * i + 3]
        out.append(f"#{i};2;{round(r * 100 / 255)};{round(g * 100 / 255)};{round(b * 100 / 255)}")
    for y in range(0, height, 6):
        bands: dict[int, bytearray] = {}
        for dy in range(min(6, height - y)):
            bit = 1 << dy
            row = pixels[(y + dy) * width : (y + dy + 1) * width]
            for x, c in enumerate(row):
                band = bands.get(c)
                if band is None:
                    band = bands[c] = bytearray(width)
                band[x] |= bit
        parts = []
        for c in sorted(bands):
            line = bytes(bands[c]).translate(_SIXEL_CHARS).rstrip(b"?")
            parts.append(f"#{c}" + _rle(line).decode("ascii"))
        out.append("$".join(parts) + "-")
    out.append(ST)
    return "".join(out)


def blocks_text(img: Any, columns: int) -> str:
    """The image as rows of ``▀`` (upper half block): foreground = upper pixel, background = lower,
    24-bit colour; ``columns`` characters wide (the image is scaled to that many pixels).

    >>> from PIL import Image
    >>> im = Image.new("RGB", (1, 2)); im.putpixel((0, 0), (255, 0, 0)); im.putpixel((0, 1), (0, 0, 255))
    >>> blocks_text(im, 1)
    '\\x1b[38;2;255;0;0m\\x1b[48;2;0;0;255m▀\\x1b[0m\\n'
    """
    rgb = img.convert("RGB")
    columns = max(1, columns)
    if rgb.width != columns:
        height = max(1, round(rgb.height * columns / rgb.width))
        rgb = rgb.resize((columns, height))
    w, h = rgb.size
    data = rgb.tobytes()
    lines = []
    for y in range(0, h, 2):
        parts = []
        fg_prev: tuple[int, ...] | None = None
        bg_prev: tuple[int, ...] | None = None
        for x in range(w):
            i = 3 * (y * w + x)
            fg = tuple(data[i : i + 3])
            if y + 1 < h:
                j = i + 3 * w
                bg: tuple[int, ...] | None = tuple(data[j : j + 3])
            else:
                bg = None
            if fg != fg_prev:
                parts.append(f"\x1b[38;2;{fg[0]};{fg[1]};{fg[2]}m")
                fg_prev = fg
            if bg != bg_prev:
                parts.append(f"\x1b[48;2;{bg[0]};{bg[1]};{bg[2]}m" if bg is not None else "\x1b[49m")
                bg_prev = bg
            parts.append("▀")
        parts.append("\x1b[0m\n")
        lines.append("".join(parts))
    return "".join(lines)


def encode_for_terminal(
    data: bytes | bytearray | memoryview, protocol: str, *, columns: int = 80, rows: int = 24, max_pixels: int = 512
) -> str:
    """An encoded image (any format Pillow reads) as terminal output in ``protocol``.

    Pixel protocols get the image fitted into ``max_pixels`` (a PNG for kitty and iTerm2);
    ``blocks`` fits it into ``columns`` x ``rows`` text cells. Raises ``ImageDecodeError``.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown terminal image protocol {protocol!r}")
    if protocol == "blocks":
        img = decode_image(data, max_size=max(columns, 2 * rows) * 2)
        # a cell is one pixel wide and two high; keep the picture within the window
        cols = min(columns, img.width, max(1, math.floor(img.width * 2 * max(rows, 1) / img.height)))
        return blocks_text(img, cols)
    img = decode_image(data, max_size=max_pixels)
    if protocol == "sixel":
        return sixel_escape(img) + "\n"
    png = save_image(img, "PNG")
    if protocol == "kitty":
        return kitty_escape(png) + "\n"
    return iterm_escape(png) + "\n"


__all__ = [
    "PILLOW_MODULES",
    "PROTOCOLS",
    "ImageDecodeError",
    "blocks_text",
    "contact_sheet",
    "decode_image",
    "detect_protocol",
    "elide_middle",
    "encode_for_terminal",
    "format_for_name",
    "iterm_escape",
    "kitty_escape",
    "save_image",
    "sixel_escape",
]
