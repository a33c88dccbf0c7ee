"""What kind of data a member holds, from its first bytes (not from its name).

``sniff_type(data)`` returns a short lower-case name: an image, audio, video, archive or array
format found by its magic bytes, ``"json"`` or ``"text"`` for text-like data, ``"empty"``, or
``"binary"`` when nothing matches. ``is_text(data)`` says whether bytes read as UTF-8 text, and
``escape_text(text)`` makes text from the data safe to print on a terminal.

>>> sniff_type(b"\\xff\\xd8\\xff\\xe0" + bytes(20))
'jpeg'
>>> sniff_type(b'{"a": 1}')
'json'
>>> sniff_type(b"hello")
'text'
>>> sniff_type(bytes([0, 1, 2, 200]))
'binary'
"""

from __future__ import annotations

import re

# the field extensions of audio and video live with the other media extensions in fieldspec;
# imported here for the callers that look for them in sniff
from .fieldspec import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS  # noqa: F401

# (offset, magic, name), checked in order; the first match wins
_MAGIC: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "jpeg"),
    (0, b"\x89PNG\r\n\x1a\n", "png"),
    (0, b"GIF87a", "gif"),
    (0, b"GIF89a", "gif"),
    (0, b"BM", "bmp"),
    (0, b"II*\x00", "tiff"),
    (0, b"MM\x00*", "tiff"),
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", "jpeg2000"),
    (0, b"\xff\x4f\xff\x51", "jpeg2000"),
    (0, b"%PDF-", "pdf"),
    (0, b"\x1f\x8b", "gzip"),
    (0, b"\x28\xb5\x2f\xfd", "zstd"),
    (0, b"BZh", "bzip2"),
    (0, b"\xfd7zXZ\x00", "xz"),
    (0, b"PK\x03\x04", "zip"),
    (0, b"\x93NUMPY", "npy"),
    (0, b"\x80\x02", "pickle"),
    (0, b"\x80\x03", "pickle"),
    (0, b"\x80\x04", "pickle"),
    (0, b"\x80\x05", "pickle"),
    (0, b"fLaC", "flac"),
    (0, b"OggS", "ogg"),
    (0, b"ID3", "mp3"),
    (0, b"\x1a\x45\xdf\xa3", "matroska"),
    (0, b"\x89HDF\r\n\x1a\n", "hdf5"),
    (257, b"ustar", "tar"),
)
_RIFF = {b"WAVE": "wav", b"WEBP": "webp", b"AVI ": "avi"}
_FTYP_IMAGE = {b"avif": "avif", b"avis": "avif", b"heic": "heic", b"heix": "heic", b"mif1": "heif"}


def sniff_type(data: bytes | bytearray | memoryview) -> str:
    """The kind of ``data`` by its magic bytes; ``"json"``/``"text"`` for text, else ``"binary"``."""
    head = bytes(data[:512])
    if not head:
        return "empty"
    for offset, magic, name in _MAGIC:
        if head.startswith(magic, offset):
            return name
    if head.startswith(b"RIFF") and len(head) >= 12:
        return _RIFF.get(head[8:12], "riff")
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        return _FTYP_IMAGE.get(brand, "mp4")
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 0x06:
        return "mp3"  # an MPEG audio frame sync without an ID3 tag
    if is_text(head, complete=len(data) <= len(head)):
        stripped = head.lstrip()
        if stripped[:1] in (b"{", b"[") and _is_json(data):
            return "json"
        return "text"
    return "binary"


def is_text(data: bytes | bytearray | memoryview, complete: bool = True) -> bool:
    """Whether ``data`` is UTF-8 without control characters other than tab, newline, CR and FF.

    With ``complete=False`` the data may be cut in the middle of a multi-byte character.
    """
    raw = bytes(data)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        if complete or e.start < len(raw) - 3:
            return False
        text = raw[: e.start].decode("utf-8")
    return not any(ord(c) < 32 and c not in "\t\n\r\f" or c == "\x7f" for c in text)


_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(json_text: str) -> str:
    """JSON text (from ``json.dumps(..., ensure_ascii=False)``) made valid UTF-8: each lone
    surrogate -- a byte 0xNN of a name that is not UTF-8, read with surrogateescape -- written as
    the JSON escape ``\\udcNN``, which ``json.loads`` turns back into the same character.

    >>> escape_surrogates('"caf\xe9 ' + chr(0xDCE9) + '"')
    '"café \\\\udce9"'
    """
    if not _SURROGATE.search(json_text):
        return json_text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", json_text)


def escape_text(text: str) -> str:
    """Text safe to print on a terminal: control and other non-printable characters escaped.

    >>> escape_text("a\\tb\\x1b[31m\\u200b")
    'a\\\\tb\\\\x1b[31m\\\\u200b'
    """
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif c.isprintable():
            out.append(c)
        elif ord(c) < 0x100:
            out.append(f"\\x{ord(c):02x}")
        elif ord(c) < 0x10000:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(f"\\U{ord(c):08x}")
    return "".join(out)


def _is_json(data: bytes | bytearray | memoryview) -> bool:
    import json

    if len(data) > 1 << 20:  # too big to parse for a guess: looks like JSON is enough
        return True
    try:
        json.loads(bytes(data))
    except (ValueError, RecursionError):  # RecursionError: valid, but nested too deep to parse
        return False
    return True


__all__ = ["escape_text", "is_text", "sniff_type"]
