"""Media headers read without decoding: image sizes and modes, and the cheap damage checks.

``jpeg_header`` and ``png_header`` give ``(width, height, mode, channels)`` from a JPEG's frame
header or a PNG's IHDR chunk; ``jpeg_ends``, ``png_damage`` and ``riff_damage`` tell a file cut
short from its markers and chunk lengths; ``field_damage`` applies the right one to a sniffed
field; ``odd_audio`` says when an audio header declares what no recording has. None of them
decodes a pixel or a sample: a handful of byte reads per file.

Apart from ``content`` (the summary's statistics) because the summary, the viewer and the DALI
decoder each use these checks on their own; ``tarproc.content`` re-exports every name here.
"""

from __future__ import annotations

import math

# audio beyond these is said as a problem: training's decode refuses more channels than
# the most channels training keeps (tarproc.decode.audio refuses more), and a rate this low turns a few KB into hours to resample
MAX_AUDIO_CHANNELS = 64
MIN_AUDIO_RATE = 1000  # Hz; telephone speech is 8000


_JPEG_COMPONENTS = {1: ("L", 1), 3: ("RGB", 3), 4: ("CMYK", 4)}
# start-of-frame markers: C0-CF but C4 (Huffman tables), C8 (reserved) and CC (arithmetic coding)
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_PNG_MODES = {0: "L", 2: "RGB", 3: "P", 4: "LA", 6: "RGBA"}
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def jpeg_header(data: bytes | bytearray | memoryview) -> tuple[int, int, str, int] | None:
    """``(width, height, mode, channels)`` from a JPEG's frame header, or None where there is none
    before the scan (or the markers run past the data).

    >>> import io; from PIL import Image; buf = io.BytesIO(); Image.new("L", (7, 5)).save(buf, "JPEG")
    >>> jpeg_header(buf.getvalue())
    (7, 5, 'L', 1)
    """
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # no length
            pos += 2
            continue
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker in _SOF:
            if length < 8 or pos + 10 > end:
                return None
            height = (data[pos + 5] << 8) | data[pos + 6]
            width = (data[pos + 7] << 8) | data[pos + 8]
            components = data[pos + 9]
            if not width or not height or components not in _JPEG_COMPONENTS:
                return None
            mode, channels = _JPEG_COMPONENTS[components]
            return width, height, mode, channels
        if marker in (0xDA, 0xD9) or length < 2:  # the scan (or the end) before any frame header
            return None
        pos += 2 + length
    return None


def jpeg_ends(data: bytes) -> bool:
    """Whether a JPEG's end-of-image marker follows its first scan (a file cut short has none). The
    markers are walked to the scan, so that an EXIF thumbnail's own end marker (inside APP1) is not
    taken for the image's; inside a scan an ``FF`` byte is followed by ``00`` or a restart marker,
    never by ``D9``. GPU decoders decode a cut stream without a word: this is checked before.

    >>> import io; from PIL import Image; buf = io.BytesIO(); Image.new("L", (7, 5)).save(buf, "JPEG")
    >>> jpeg_ends(buf.getvalue()), jpeg_ends(buf.getvalue()[:-40])
    (True, False)
    """
    pos, end = 2, len(data)
    while pos + 4 <= end:
        if data[pos] != 0xFF:
            return False
        marker = data[pos + 1]
        if marker == 0xFF:
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        if marker == 0xD9:
            return False  # an end before any scan
        length = (data[pos + 2] << 8) | data[pos + 3]
        if marker == 0xDA:  # searched from the end: where a whole file has its marker
            return data.rfind(b"\xff\xd9", pos + 2 + length) != -1
        if length < 2:
            return False
        pos += 2 + length
    return False


def png_ends(data: bytes | bytearray | memoryview) -> bool:
    """Whether a PNG ends with its IEND chunk (a file cut short has none).

    >>> import io; from PIL import Image; buf = io.BytesIO(); Image.new("L", (7, 5)).save(buf, "PNG")
    >>> png_ends(buf.getvalue()), png_ends(buf.getvalue()[:-8])
    (True, False)
    """
    return bytes(data[-12:-8]) == b"\x00\x00\x00\x00" and bytes(data[-8:-4]) == b"IEND"


def png_damage(data: bytes | bytearray | memoryview) -> str | None:
    """Why a PNG's chunks do not hold (one declares more bytes than follow it, or no IEND chunk
    ends them), or None. Only the chunk headers are read: a handful of reads per file.

    >>> import io; from PIL import Image; buf = io.BytesIO(); Image.new("L", (7, 5)).save(buf, "PNG")
    >>> png_damage(buf.getvalue()) is None, png_damage(buf.getvalue()[:-20])
    (True, "cut short: its 'IDAT' chunk at byte 33 declares 12 bytes, 8 are there")
    """
    pos, end = 8, len(data)
    while pos + 8 <= end:
        length = int.from_bytes(data[pos:pos + 4], "big")
        kind = bytes(data[pos + 4:pos + 8])
        if pos + 12 + length > end:
            there = max(end - pos - 8, 0)
            return (f"cut short: its {kind.decode('latin-1')!r} chunk at byte {pos} declares {length} bytes, "
                    f"{there} are there")
        if kind == b"IEND":
            return None
        pos += 12 + length
    return "cut short: no IEND chunk at the end"


def riff_damage(data: bytes | bytearray | memoryview) -> str | None:
    """Why a RIFF file (WebP) is cut short: its header declares more bytes than there are; or None.

    >>> riff_damage(b"RIFF" + (100).to_bytes(4, "little") + b"WEBP" + bytes(20))
    'cut short: its RIFF header declares 108 bytes, 32 are there'
    """
    declared = int.from_bytes(data[4:8], "little") + 8
    if declared > len(data):
        return f"cut short: its RIFF header declares {declared} bytes, {len(data)} are there"
    return None


def odd_audio(rate: int | None, channels: int | None, duration: float | None) -> str | None:
    """Why audio with this header is damage or a decode bomb, or None: more channels than a
    training decode keeps, or a sample rate under ``MIN_AUDIO_RATE`` (a 3.6 KB WAV at 1 Hz says
    it is an hour long).

    >>> odd_audio(1, 1, 3600.0), odd_audio(16000, 65535, 0.0), odd_audio(16000, 2, 3.0)
    ('sample rate 1 Hz (3600 s declared)', '65,535 channels (training keeps at most 64)', None)
    """
    if channels is not None and channels > MAX_AUDIO_CHANNELS:
        return f"{channels:,} channels (training keeps at most {MAX_AUDIO_CHANNELS})"
    if rate is not None and 0 < rate < MIN_AUDIO_RATE:
        declared = f" ({duration:g} s declared)" if duration is not None and math.isfinite(duration) else ""
        return f"sample rate {rate} Hz{declared}"
    return None


def not_an_image(sniffed: str) -> str:
    """Why an image field whose data sniffs as ``sniffed`` (no image type) shows no picture: the
    one wording of the summary, the report and the viewer.

    >>> not_an_image("text"), not_an_image("empty")
    ('not an image (the data looks like text)', 'no data (an empty field)')
    """
    return "no data (an empty field)" if sniffed == "empty" else f"not an image (the data looks like {sniffed})"


def field_damage(sniffed: str, data: bytes | bytearray | memoryview) -> str | None:
    """Why an image of the sniffed type ``sniffed`` is damaged, by checks that decode no pixel (its
    end marker, its chunk lengths), or None when these checks find nothing. The viewer and the
    summary share it.

    >>> field_damage("jpeg", bytes.fromhex("ffd8ffe0")), field_damage("gif", b"GIF89a")
    ('cut short: no end-of-image marker after the scan', None)
    """
    if sniffed == "jpeg" and not jpeg_ends(data if type(data) is bytes else bytes(data)):
        return "cut short: no end-of-image marker after the scan"
    if sniffed == "png":
        return png_damage(data)
    if sniffed == "webp":
        return riff_damage(data)
    return None


def png_header(data: bytes | bytearray | memoryview) -> tuple[int, int, str, int] | None:
    """``(width, height, mode, channels)`` from a PNG's IHDR chunk, or None without one."""
    if len(data) < 29 or bytes(data[12:16]) != b"IHDR":
        return None
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    depth, colour = data[24], data[25]
    if not width or not height or colour not in _PNG_MODES:
        return None
    mode = "I;16" if colour == 0 and depth == 16 else "1" if colour == 0 and depth == 1 else _PNG_MODES[colour]
    return width, height, mode, _PNG_CHANNELS[colour]


__all__ = ["MAX_AUDIO_CHANNELS", "MIN_AUDIO_RATE", "field_damage", "jpeg_ends", "jpeg_header", "not_an_image",
           "odd_audio", "png_damage", "png_ends", "png_header", "riff_damage"]
