"""Tar header fields: numbers, checksums, names (ustar prefix, GNU long names), pax records and the key rule.

The parsing half of the format; the writer packs headers itself (``writer.py``), for speed.
"""

from __future__ import annotations

from zlib import adler32

from ..errors import TarFormatError

BLOCK = 512
RECORD = 10240  # 20 blocks: the record size GNU tar and Python's tarfile pad archives to
ZERO_BLOCK = bytes(BLOCK)


# type flags (as byte values)
REGULAR_TYPES = (0, ord("0"), ord("7"))
LONGNAME = ord("L")
LONGLINK = ord("K")
PAX = ord("x")
PAX_GLOBAL = ord("g")
GNU_SPARSE = ord("S")
TYPE_NAMES = {
    ord("1"): "hard link",
    ord("2"): "symlink",
    ord("3"): "character device",
    ord("4"): "block device",
    ord("5"): "directory",
    ord("6"): "fifo",
    ord("S"): "GNU sparse file",
    ord("V"): "volume label",
    ord("M"): "multi-volume continuation",
    ord("D"): "GNU dump directory",
}


def block_sum(block: bytes | memoryview) -> int:
    """Unsigned byte sum of a 512-byte block, computed in C.

    adler32's low 16 bits are 1 + (sum of bytes) mod 65521; a 256-byte half sums to at most
    65280 < 65521, so two halves give the exact sum without a Python-level loop.
    """
    return (adler32(block[:256]) & 0xFFFF) + (adler32(block[256:512]) & 0xFFFF) - 2


def short_sum(data: bytes) -> int:
    """Exact byte sum of at most 257 bytes (below adler32's modulus 65521; see ``block_sum``)."""
    return (adler32(data) & 0xFFFF) - 1


def signed_sum(block: bytes) -> int:
    """Byte sum of ``block`` with bytes read as signed: some old tars checksum that way."""
    return sum(b - 256 if b > 127 else b for b in block)


def parse_number(field: bytes) -> int | None:
    """A numeric header field: NUL/space-terminated octal, or base-256 (first byte 0x80/0xff)."""
    if field and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:  # negative base-256
            value -= 1 << (8 * (len(field) - 1))
        elif field[0] != 0x80:
            return None
        return value
    text = field.split(b"\x00", 1)[0].strip(b" ")
    if not text:
        return 0
    if text.translate(None, b"01234567"):  # int() would also take signs, '_' and inner spaces
        return None
    return int(text, 8)


def cstr(field: bytes) -> bytes:
    """A NUL-terminated header field's bytes, up to the NUL (all of them without one)."""
    i = field.find(0)
    return field if i < 0 else field[:i]


def header_name(buf: bytes, pos: int) -> str:
    """The name stored in the header at ``buf[pos:]``, with the ustar prefix if it has one."""
    raw = cstr(buf[pos : pos + 100])
    if buf[pos + 257 : pos + 263] == b"ustar\x00" and buf[pos + 345] != 0:
        raw = cstr(buf[pos + 345 : pos + 500]) + b"/" + raw
    return decode_name(raw)


def decode_name(raw: bytes) -> str:
    """A member name as text: UTF-8, bytes that aren't kept as surrogates (written back the same)."""
    return raw.decode("utf-8", "surrogateescape")


_REPEATED_PAX = ("GNU.sparse.offset", "GNU.sparse.numbytes")


def parse_pax(data: bytes, url: str | None, offset: int) -> dict[str, str]:
    """Records of the form ``"%d %s=%s\\n"`` (length includes itself)."""
    out: dict[str, str] = {}
    repeated: dict[str, list[str]] = {}  # GNU sparse 0.0's lists, joined once at the end
    pos = 0
    n = len(data)
    while pos < n:
        if data[pos] == 0:  # NUL padding after the last record
            break
        sp = data.find(b" ", pos)
        try:
            length = int(data[pos:sp]) if sp > pos else 0
        except ValueError:
            length = 0
        end = pos + length
        if length <= 0 or end > n or data[end - 1] != 0x0A:
            raise TarFormatError(url, offset, "malformed pax extended header")
        keyvalue = data[sp + 1 : end - 1]
        eq = keyvalue.find(b"=")
        if eq <= 0:
            raise TarFormatError(url, offset, "malformed pax extended header")
        key = keyvalue[:eq].decode("utf-8", "surrogateescape")
        value = keyvalue[eq + 1 :].decode("utf-8", "surrogateescape")
        if key in _REPEATED_PAX:  # GNU sparse 0.0: a list, in order
            repeated.setdefault(key, []).append(value)
        else:
            out[key] = value
        pos = end
    for key, values in repeated.items():
        out[key] = ",".join(values)
    return out


def split_key(name: str) -> tuple[str | None, str]:
    """``(key, field)`` by the key rule, or ``(None, name)`` when the name has no key.

    The key is the name up to the first dot of its last path component, without the leading
    ``./`` that ``tar -C dir .`` writes; the field is the rest, in lower case.

    >>> split_key("./train/n0144_1.JPEG"), split_key("a/b.seg.png"), split_key("README")
    (('train/n0144_1', 'jpeg'), ('a/b', 'seg.png'), (None, 'README'))
    """
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot <= slash + 1:
        return None, name
    start = 0
    while name.startswith("./", start):
        start += 2
    return name[start:dot], name[dot + 1 :].lower()


LINK_TYPES = (ord("1"), ord("2"))
NO_DATA_TYPES = (ord("1"), ord("2"), ord("3"), ord("4"), ord("5"), ord("6"))
DIRECTORY = ord("5")
MAX_DIGITS = 20  # no size or offset in a tar needs more decimal digits (2**64 has 20)


def parse_decimal(text: str, url: str | None, offset: int, what: str, member: str | None) -> int:
    """A decimal number from a pax record or sparse map; bounded, so a 5,000-digit 'size' is a
    format error, not Python's int-digit limit."""
    if not (0 < len(text) <= MAX_DIGITS and text.isascii() and text.isdigit()):
        raise TarFormatError(url, offset, f"bad {what}", member)
    return int(text)
