"""GNU sparse files: the old GNU sparse map and the pax formats 0.0, 0.1 and 1.0, expanded as GNU tar extracts them."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ..errors import TarFormatError
from .headers import MAX_DIGITS, parse_decimal, parse_number


def sparse_regions(entries: bytes, count: int, url: str | None, offset: int, name: str | None) -> Iterator[tuple[int, int]]:
    """The (offset, numbytes) pairs of an old GNU sparse map: ``count`` 24-byte octal entries, the
    first one whose offset is empty ending the list."""
    for i in range(count):
        entry = entries[i * 24 : i * 24 + 24]
        if not entry[0]:
            return
        at, n = parse_number(entry[:12]), parse_number(entry[12:])
        if at is None or n is None or at < 0 or n < 0:
            raise TarFormatError(url, offset, "bad GNU sparse map entry", name)
        yield at, n


def pax_sparse_map(pax: dict[str, str], data: bytes, url: str | None, offset: int, name: str) -> tuple[list[tuple[int, int]], int, int]:
    """``(regions, real size, bytes of the map at the start of data)`` of a pax-format sparse file
    (GNU formats 0.0, 0.1 and 1.0)."""
    numbers: list[int]
    if pax.get("GNU.sparse.major") == "1":
        if pax.get("GNU.sparse.minor", "0") != "0":
            raise TarFormatError(url, offset, f"unsupported GNU sparse format 1.{pax.get('GNU.sparse.minor')}", name)
        real = parse_decimal(pax.get("GNU.sparse.realsize", ""), url, offset, "GNU.sparse.realsize", name)
        # the map is in the data: decimal numbers, one a line (count, then offset and size pairs),
        # padded to a whole block
        lines: list[str] = []
        pos = 0
        while True:
            nl = data.find(b"\n", pos, pos + MAX_DIGITS + 1)
            if nl < 0:
                raise TarFormatError(url, offset, "bad GNU sparse 1.0 map", name)
            lines.append(data[pos:nl].decode("ascii", "replace"))
            pos = nl + 1
            count = parse_decimal(lines[0], url, offset, "GNU sparse 1.0 map", name)
            if count > len(data) // 4:
                raise TarFormatError(url, offset, "bad GNU sparse 1.0 map", name)
            if len(lines) == 1 + 2 * count:
                break
        numbers = [parse_decimal(v, url, offset, "GNU sparse 1.0 map", name) for v in lines[1:]]
        skip = (pos + 511) & ~511
    else:
        real = parse_decimal(pax.get("GNU.sparse.size", pax.get("GNU.sparse.realsize", "")), url, offset, "GNU.sparse.size", name)
        if "GNU.sparse.map" in pax:  # format 0.1: "offset,size,offset,size,..."
            text = pax["GNU.sparse.map"]
            numbers = [parse_decimal(v, url, offset, "GNU.sparse.map", name) for v in text.split(",")] if text else []
        else:  # format 0.0: repeated offset and numbytes records (kept in order by parse_pax)
            offsets = pax.get("GNU.sparse.offset", "")
            sizes = pax.get("GNU.sparse.numbytes", "")
            offs = [parse_decimal(v, url, offset, "GNU.sparse.offset", name) for v in offsets.split(",")] if offsets else []
            lens = [parse_decimal(v, url, offset, "GNU.sparse.numbytes", name) for v in sizes.split(",")] if sizes else []
            if len(offs) != len(lens):
                raise TarFormatError(url, offset, "bad GNU sparse 0.0 map (offsets and sizes differ in number)", name)
            numbers = [v for pair in zip(offs, lens, strict=True) for v in pair]
        if len(numbers) % 2:
            raise TarFormatError(url, offset, "bad GNU sparse map (an odd count of numbers)", name)
        skip = 0
    return list(zip(numbers[::2], numbers[1::2], strict=True)), real, skip


def expand_sparse(regions: Iterable[tuple[int, int]], real: int, data: bytes, max_member_size: int,
                   url: str | None, offset: int, name: str) -> bytes:
    """A sparse file's bytes as GNU tar extracts them: each region's data at its offset, zeros between."""
    if real > max_member_size:
        raise TarFormatError(url, offset, f"member size {real} exceeds the limit of {max_member_size} bytes", name)
    out = bytearray(real)
    taken = 0
    end = 0
    for at, n in regions:
        if at < end or at + n > real:
            raise TarFormatError(url, offset, "bad GNU sparse map (regions overlap or pass the file's size)", name)
        if taken + n > len(data):
            raise TarFormatError(url, offset, f"GNU sparse map needs more data than the member's {len(data)} bytes", name)
        out[at : at + n] = data[taken : taken + n]
        taken += n
        end = at + n
    if taken != len(data):
        raise TarFormatError(url, offset, f"GNU sparse map covers {taken} of the member's {len(data)} bytes", name)
    return bytes(out)
