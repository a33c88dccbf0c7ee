"""Streaming tar reading and writing: our own parser, not ``tarfile``.

Reading: ``iter_members(stream, url)`` yields ``(name, data, offset)`` for every regular file of a
tar stream, in order. It understands ustar (with the 155-byte prefix), GNU long names and long link
names (``././@LongLink``, types ``L``/``K``), pax extended and global headers (path, linkpath, size,
mtime), base-256 numeric fields and old v7 headers without magic. Every header checksum is verified
(unsigned and signed sums). Any damage -- a stream that ends inside a header, inside member data or
before the end-of-archive blocks, a bad checksum, garbage where a header or the end padding should
be -- raises ``TarFormatError`` with the URL, the byte offset and the member.

Memory grows only with bytes actually read: member data is read in bounded pieces, so a header that
claims 8 GiB in a 1 MB stream costs 1 MB before it fails. (A sparse file is the exception: it is
expanded to its real size, at most ``max_member_size``, which briefly takes twice that.)

Writing: ``TarWriter`` writes deterministic archives (fixed mtime, owner and mode), ustar headers
where names fit and GNU long-name records where they don't, end blocks and record padding.

Both have an optional C fast path (tarproc/_speedups.c) for the common case, which hands anything
else back to the Python code here: that is the reference, and the tests check that the two give the
same members, errors and bytes (test_parity.py, test_writer_parity.py). ``TARPROC_PURE_PYTHON=1``
turns the C paths off.
"""

from __future__ import annotations

import itertools
import os
import posixpath
import stat
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from operator import length_hint
from typing import Any, Literal, NamedTuple, Protocol, overload
from zlib import adler32

from ..compression import Readable
from ..errors import LinkError, OptionError, SampleError, SourceError, TarFormatError, TarprocError, warn_stderr

# The optional C fast paths (tarproc/_speedups.c) of the reader (_scan) and the writer (_pack, and
# _members for sample_members); the Python code below is the reference. TARPROC_PURE_PYTHON=1 turns
# them off, and setting _scan or _pack to None turns off the reader's or the writer's (the tests do,
# to compare the two paths).
_scan: Any = None
_pack: Any = None
_pack_samples: Any = None
_members: Any = None
if not os.environ.get("TARPROC_PURE_PYTHON"):
    try:
        from .._speedups import members as _members  # type: ignore[no-redef]
        from .._speedups import pack as _pack  # type: ignore[no-redef]
        from .._speedups import pack_samples as _pack_samples  # type: ignore[no-redef]
        from .._speedups import scan as _scan  # type: ignore[no-redef]
    except ImportError:  # pragma: no cover - built by pip install; absent only without a compiler
        _scan = _pack = _pack_samples = _members = None

BLOCK = 512
RECORD = 10240  # 20 blocks: the record size GNU tar and Python's tarfile pad archives to
ZERO_BLOCK = bytes(BLOCK)
DEFAULT_MAX_MEMBER_SIZE = 2 << 30  # 2 GiB
LINK_POLICIES = ("follow", "skip", "strict")
DEFAULT_LINK_CACHE = 4 << 20  # bytes of recent members kept for links (more slows reading: fresh memory)
_CHUNK = 1 << 19  # bytes read from the stream at a time (512 KiB: faster than 256 KiB or 1-4 MiB here)
_PIECE = 16 << 20  # large member data is read in pieces of at most this many bytes
_GATHER = 1 << 20  # the writer gathers small pieces in a buffer of this size, written when full
_DIRECT_WRITE = 1 << 16  # member data at least this big is written as it is, not copied
_VIEW = 1 << 16  # with views=True, the reader hands out member data at least this big as views
# what _pack says about where it stopped (see pack in _speedups.c)
_PACK_DONE, _PACK_FULL, _PACK_PYTHON, _PACK_BIG, _PACK_RAISED = 0, 1, 2, 3, 4
_OCTAL_12 = 8**11  # sizes below this fit a 12-byte octal field
_NO_PREFIX = bytes(BLOCK - 345)  # an empty ustar prefix field and the header's last 12 bytes

# type flags (as byte values)
_REG = (0, ord("0"), ord("7"))
_LONGNAME = ord("L")
_LONGLINK = ord("K")
_PAX = ord("x")
_PAX_GLOBAL = ord("g")
_GNU_SPARSE = ord("S")
_TYPE_NAMES = {
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


class ReadStats:
    """Counters filled in while reading; shared by the members reader and the sample grouper."""

    def __init__(self) -> None:
        self.shards = 0
        self.shards_failed = 0
        self.members = 0  # regular-file members read
        self.bytes = 0  # member data bytes read
        self.samples = 0
        self.skipped_entries: dict[str, int] = {}  # non-regular entries by type
        self.metadata = 0  # __name__ members skipped
        self.no_key: list[str] = []  # first few names without a key
        self.no_key_count = 0
        self.duplicates = 0  # duplicate fields and reappearing keys (warn/skip modes)
        self.errors: list[str] = []  # messages of shards skipped with on_error="skip-shard"
        self.warn: Callable[[str], None] | None = None  # where the reader's warnings go (None: stderr)

    def skip_entry(self, kind: str) -> None:
        self.skipped_entries[kind] = self.skipped_entries.get(kind, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "shards_failed": self.shards_failed,
            "samples": self.samples,
            "members": self.members,
            "bytes": self.bytes,
            "skipped_entries": dict(self.skipped_entries),
            "metadata_members": self.metadata,
            "names_without_key": self.no_key_count,
            "duplicates": self.duplicates,
        }


# ---------------------------------------------------------------------------------------------
# header fields


def _block_sum(block: bytes | memoryview) -> int:
    """Unsigned byte sum of a 512-byte block, computed in C.

    adler32's low 16 bits are 1 + (sum of bytes) mod 65521; a 256-byte half sums to at most
    65280 < 65521, so two halves give the exact sum without a Python-level loop.
    """
    return (adler32(block[:256]) & 0xFFFF) + (adler32(block[256:512]) & 0xFFFF) - 2


def _short_sum(data: bytes) -> int:
    """Exact byte sum of at most 257 bytes (below adler32's modulus 65521; see ``_block_sum``)."""
    return (adler32(data) & 0xFFFF) - 1


def _signed_sum(block: bytes) -> int:
    return sum(b - 256 if b > 127 else b for b in block)


def _parse_number(field: bytes) -> int | None:
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


def _cstr(field: bytes) -> bytes:
    i = field.find(0)
    return field if i < 0 else field[:i]


def _header_name(buf: bytes, pos: int) -> str:
    """The name stored in the header at ``buf[pos:]``, with the ustar prefix if it has one."""
    raw = _cstr(buf[pos : pos + 100])
    if buf[pos + 257 : pos + 263] == b"ustar\x00" and buf[pos + 345] != 0:
        raw = _cstr(buf[pos + 345 : pos + 500]) + b"/" + raw
    return _decode_name(raw)


def _decode_name(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


_REPEATED_PAX = ("GNU.sparse.offset", "GNU.sparse.numbytes")


def _parse_pax(data: bytes, url: str | None, offset: int) -> dict[str, str]:
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


# ---------------------------------------------------------------------------------------------
# reading


def iter_members(
    stream: Readable,
    url: str | None = None,
    *,
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    stats: ReadStats | None = None,
    links: str = "follow",
    link_cache: int = DEFAULT_LINK_CACHE,
    ignore_zeros: bool = False,
) -> Iterator[tuple[str, bytes, int]]:
    """Yield ``(name, data, header_offset)`` for each regular file in a tar stream.

    Raises ``TarFormatError`` on any damage (see the module docstring). Reads the stream to its
    end, so the end-of-archive padding is checked too.

    Links and sparse files read as GNU tar extracts them: a hard or symbolic link to an earlier
    member of the archive yields that member's bytes under the link's name (``links="follow"``;
    ``"skip"`` skips and counts links). The target comes from the last ``link_cache`` bytes of
    members read, else is read again from the start of the stream where it can be (a plain local
    file); a link whose target can't be had is a ``LinkError`` naming both. Sparse files (old GNU
    and pax formats 0.0, 0.1, 1.0) are expanded, up to ``max_member_size``. ``ignore_zeros`` reads
    on past end-of-archive blocks (GNU tar's ``-i``: concatenated archives), where the default is
    to require that only zeros follow them.

    >>> import io
    >>> from tarproc.tar import TarWriter
    >>> buf = io.BytesIO()
    >>> with TarWriter(buf) as w:
    ...     w.add("a/001.txt", b"hello")
    >>> [(name, data) for name, data, _ in iter_members(io.BytesIO(buf.getvalue()))]
    [('a/001.txt', b'hello')]
    """
    return _read_members(stream, url, max_member_size=max_member_size, stats=stats, keyed=False, links=links,
                         link_cache=link_cache, ignore_zeros=ignore_zeros)


@overload
def iter_keyed_members(
    stream: Readable, url: str | None = None, *, max_member_size: int = ..., stats: ReadStats | None = ...,
    links: str = ..., link_cache: int = ..., ignore_zeros: bool = ..., views: Literal[False] = ...,
) -> Iterator[tuple[str | None, str, bytes, int]]: ...


@overload
def iter_keyed_members(
    stream: Readable, url: str | None = None, *, max_member_size: int = ..., stats: ReadStats | None = ...,
    links: str = ..., link_cache: int = ..., ignore_zeros: bool = ..., views: bool, refs: bool = ...,
) -> Iterator[tuple[str | None, str, bytes | memoryview | FileRange, int]]: ...


def iter_keyed_members(
    stream: Readable,
    url: str | None = None,
    *,
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    stats: ReadStats | None = None,
    links: str = "follow",
    link_cache: int = DEFAULT_LINK_CACHE,
    ignore_zeros: bool = False,
    views: bool = False,
    refs: bool = False,
) -> Iterator[tuple[str | None, str, bytes | memoryview | FileRange, int]]:
    """Like ``iter_members`` but yield ``(key, field, data, offset)`` by the WebDataset key rule.

    ``key`` is None (and ``field`` the whole name) for names without a key.

    ``views=True`` (for data that passes straight through, as in ``tarcat`` and ``tarsplit``): the
    data of members of 64 KiB or more may come as a read-only ``memoryview`` of the bytes read from
    the stream instead of a copy of them. A view stays valid as long as it is held -- the bytes it
    shows are never reused or changed -- but it keeps the whole read (about 512 KiB) in memory with
    it: copy (``bytes(data)``) what you keep for long, such as samples in a shuffle buffer.

    ``refs=True`` as well (for data written out at once, each member before the next is asked for):
    where the stream is a plain local file, the data of a member of 64 KiB or more that isn't in
    what was read is not read at all but comes as a ``FileRange`` (file, offset, size), which
    ``TarWriter`` has the kernel copy to its destination (``os.sendfile``). A range is valid only
    while the stream is open. Every check on the tar's structure is made as when the data is read.
    """
    return _read_members(stream, url, max_member_size=max_member_size, stats=stats, keyed=True, links=links,
                         link_cache=link_cache, ignore_zeros=ignore_zeros, views=views, refs=refs)


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


_LINK_TYPES = (ord("1"), ord("2"))
_NO_DATA_TYPES = (ord("1"), ord("2"), ord("3"), ord("4"), ord("5"), ord("6"))
_DIRECTORY = ord("5")
_MAX_DIGITS = 20  # no size or offset in a tar needs more decimal digits (2**64 has 20)


def _decimal(text: str, url: str | None, offset: int, what: str, member: str | None) -> int:
    """A decimal number from a pax record or sparse map; bounded, so a 5,000-digit 'size' is a
    format error, not Python's int-digit limit."""
    if not (0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit()):
        raise TarFormatError(url, offset, f"bad {what}", member)
    return int(text)


def _sparse_regions(entries: bytes, count: int, url: str | None, offset: int, name: str | None) -> Iterator[tuple[int, int]]:
    """The (offset, numbytes) pairs of an old GNU sparse map: ``count`` 24-byte octal entries, the
    first one whose offset is empty ending the list."""
    for i in range(count):
        entry = entries[i * 24 : i * 24 + 24]
        if not entry[0]:
            return
        at, n = _parse_number(entry[:12]), _parse_number(entry[12:])
        if at is None or n is None or at < 0 or n < 0:
            raise TarFormatError(url, offset, "bad GNU sparse map entry", name)
        yield at, n


def _pax_sparse_map(pax: dict[str, str], data: bytes, url: str | None, offset: int, name: str) -> tuple[list[tuple[int, int]], int, int]:
    """``(regions, real size, bytes of the map at the start of data)`` of a pax-format sparse file
    (GNU formats 0.0, 0.1 and 1.0)."""
    numbers: list[int]
    if pax.get("GNU.sparse.major") == "1":
        if pax.get("GNU.sparse.minor", "0") != "0":
            raise TarFormatError(url, offset, f"unsupported GNU sparse format 1.{pax.get('GNU.sparse.minor')}", name)
        real = _decimal(pax.get("GNU.sparse.realsize", ""), url, offset, "GNU.sparse.realsize", name)
        # the map is in the data: decimal numbers, one a line (count, then offset and size pairs),
        # padded to a whole block
        lines: list[str] = []
        pos = 0
        while True:
            nl = data.find(b"\n", pos, pos + _MAX_DIGITS + 1)
            if nl < 0:
                raise TarFormatError(url, offset, "bad GNU sparse 1.0 map", name)
            lines.append(data[pos:nl].decode("ascii", "replace"))
            pos = nl + 1
            count = _decimal(lines[0], url, offset, "GNU sparse 1.0 map", name)
            if count > len(data) // 4:
                raise TarFormatError(url, offset, "bad GNU sparse 1.0 map", name)
            if len(lines) == 1 + 2 * count:
                break
        numbers = [_decimal(v, url, offset, "GNU sparse 1.0 map", name) for v in lines[1:]]
        skip = (pos + 511) & ~511
    else:
        real = _decimal(pax.get("GNU.sparse.size", pax.get("GNU.sparse.realsize", "")), url, offset, "GNU.sparse.size", name)
        if "GNU.sparse.map" in pax:  # format 0.1: "offset,size,offset,size,..."
            text = pax["GNU.sparse.map"]
            numbers = [_decimal(v, url, offset, "GNU.sparse.map", name) for v in text.split(",")] if text else []
        else:  # format 0.0: repeated offset and numbytes records (kept in order by _parse_pax)
            offsets = pax.get("GNU.sparse.offset", "")
            sizes = pax.get("GNU.sparse.numbytes", "")
            offs = [_decimal(v, url, offset, "GNU.sparse.offset", name) for v in offsets.split(",")] if offsets else []
            lens = [_decimal(v, url, offset, "GNU.sparse.numbytes", name) for v in sizes.split(",")] if sizes else []
            if len(offs) != len(lens):
                raise TarFormatError(url, offset, "bad GNU sparse 0.0 map (offsets and sizes differ in number)", name)
            numbers = [v for pair in zip(offs, lens, strict=True) for v in pair]
        if len(numbers) % 2:
            raise TarFormatError(url, offset, "bad GNU sparse map (an odd count of numbers)", name)
        skip = 0
    return list(zip(numbers[::2], numbers[1::2], strict=True)), real, skip


def _expand_sparse(regions: Iterable[tuple[int, int]], real: int, data: bytes, max_member_size: int,
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


_SKIP_CHUNK = 4 << 10  # read size when data is skipped: a header, and the small members after it


class FileRange:
    """Member data left where it is in a plain local file, not read (the reader's ``refs``): ``size``
    bytes at ``offset`` of ``file``, an open ``io.FileIO``. ``len`` is the size. A writer copies it
    file to file in the kernel (``Sink.write_range``: ``os.sendfile``) or, where it must see the
    bytes (compression, sha256), reads it (``read``).

    It is valid while the file is open: the samples of ``read_samples(refs=True)`` must be written
    out as they come, each before the next is asked for (``tarcat``, ``tarsplit``). Once the file is
    closed, ``fileno`` and ``read`` raise ``ValueError`` -- never another file's bytes."""

    __slots__ = ("file", "offset", "size", "url")

    def __init__(self, file: Any, offset: int, size: int, url: str | None = None) -> None:
        self.file, self.offset, self.size, self.url = file, offset, size, url

    def __len__(self) -> int:
        return self.size

    def __eq__(self, other: object) -> bool:
        return (type(other) is FileRange and self.file is other.file and self.offset == other.offset
                and self.size == other.size)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"FileRange({self.url!r}, offset={self.offset}, size={self.size})"

    def fileno(self) -> int:
        return self.file.fileno()  # type: ignore[no-any-return]

    def read(self) -> bytes:
        """The bytes (``os.pread``); a file that no longer holds them all is a ``SourceError``."""
        data = self.read_available()
        if len(data) < self.size:
            raise self.shrank(self.offset + len(data))
        return data

    def read_available(self) -> bytes:
        """The bytes, fewer where the file now ends before their end."""
        fd, parts, at, end = self.fileno(), [], self.offset, self.offset + self.size
        while at < end:
            piece = os.pread(fd, min(end - at, _PIECE), at)
            if not piece:
                break
            parts.append(piece)
            at += len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def shrank(self, at: int) -> SourceError:
        """The error for a file that ends at ``at``, before the end of this data: it was cut while read."""
        return SourceError(f"the file ends at byte {at}, inside member data that was there when it was read "
                           f"(expected {self.size} bytes at byte {self.offset}); was it changed while being read?",
                           self.url)


MemberData = bytes | bytearray | memoryview | FileRange  # what the writer writes as a member's data


def _file_origin(stream: Any) -> tuple[Any, int] | None:
    """For a stream that is a plain local file (``Source.file_origin``): the file, and the file
    offset of the stream's next byte; else None."""
    where = getattr(stream, "file_origin", None)
    return where() if where is not None else None  # type: ignore[no-any-return]


def _ranges(stream: Any, url: str | None) -> Callable[[int, int], FileRange] | None:
    """For ``refs``: a function making the ``FileRange`` of (stream offset, size) where the stream
    is a plain local file that can be skipped in (``_file_origin``), else None."""
    found = _file_origin(stream)
    if found is None:
        return None
    file, origin = found
    return lambda offset, size: FileRange(file, origin + offset, size, url)


def _fetcher(stream: Any, url: str | None) -> Callable[[int, int], bytes | FileRange] | None:
    """For fetch: a function reading the data at (stream offset, size) at once, with one pread
    into a bytes object of its own, where the stream is a plain local file (``_ranges``), else
    None. Where the file ends before the data's end (a damaged size field must not make it
    allocate what the header claims), or that read gives fewer bytes, or the data is over
    ``_PIECE`` (one read can't give 2 GiB), it gives their ``FileRange`` instead: the reader then
    moves past the data, and reads it in pieces (``_fetch``) or calls it truncated."""
    found = _file_origin(stream)
    if found is None:
        return None
    file, origin = found
    fd, pread = file.fileno(), os.pread
    file_size = os.fstat(fd).st_size

    def fetch(offset: int, size: int) -> bytes | FileRange:
        nonlocal file_size
        at = origin + offset
        if size > _PIECE:
            return FileRange(file, at, size, url)
        if at + size > file_size:
            file_size = os.fstat(fd).st_size  # a file written as it is read may have grown
            if at + size > file_size:
                return FileRange(file, at, size, url)
        data = pread(fd, size, at)
        return data if len(data) == size else FileRange(file, at, size, url)

    return fetch


if _pack is not None:
    from .._speedups import set_range_type

    set_range_type(FileRange)  # the C writer passes FileRange data on as it does big data


class Unread:
    """In place of the data of a member that was skipped, not read (``skip_data``): its ``len`` is
    the member's size; it has no bytes."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def _unread(offset: int, size: int) -> Unread:
    return Unread(size)


def _skipper(stream: Any) -> Callable[[int], int] | None:
    make = getattr(stream, "skipper", None)
    return make() if make is not None else None  # type: ignore[no-any-return]


class _RecentMembers:
    """The regular members read lately (their names and data), about ``limit`` bytes of them (each
    member counted at least 512 bytes): a hard or symbolic link names an earlier member, and a
    stream can't go back to read it again. Links find their targets by name, exactly (a link to
    ``a.TXT`` is not ``a.txt``, whatever the sample readers make of the two): a name index is
    built by the first link and brought up to date by the next, one dictionary lookup each.

    The fast path's members are remembered as the buffer they were found in (``add_scanned``), not
    as the items handed out: holding on to the items themselves (a tuple, a name and a bytes object
    per member, megabytes of them) keeps their memory from being reused and slowed reading small
    members by about 5%. A link scans those buffers again, for names.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # [sequence number, (name, data, offset) items or a _Scanned buffer, charged bytes]
        self.lists: deque[list[Any]] = deque()
        self.bytes = 0
        self.added = 0  # lists added so far
        self.indexed = 0  # lists before this sequence number are in the index
        self.index: dict[str, tuple[int, Any]] = {}  # name -> (sequence number, data)

    def add(self, items: list[tuple[str, Any, int]], nbytes: int) -> None:
        self._add(items, nbytes + BLOCK * len(items))

    def add_scanned(self, scanned: _Scanned, count: int, nbytes: int) -> None:
        """The fast path's ``count`` members (``nbytes`` of data), which ``scanned`` gives again, by
        name, when a link asks."""
        self._add(scanned, nbytes + BLOCK * count)

    def _add(self, items: Any, charged: int) -> None:
        if self.limit <= 0:
            return
        self.lists.append([self.added, items, charged])
        self.added += 1
        self.bytes += charged
        while self.bytes > self.limit and self.lists:
            old_seq, old, size = self.lists.popleft()
            self.bytes -= size
            if old_seq < self.indexed:
                for item in old:
                    if self.index.get(item[0], (None,))[0] == old_seq:
                        del self.index[item[0]]

    def find(self, name: str) -> Any:
        new = list(itertools.takewhile(lambda entry: entry[0] >= self.indexed, reversed(self.lists)))
        for entry in reversed(new):  # what came since the last link, in order: indexed now
            seq, items, _ = entry
            if isinstance(items, _Scanned):
                entry[1] = items = items.items()
            for item in items:
                self.index[item[0]] = (seq, item[-2])
        self.indexed = self.added
        found = self.index.get(name)
        return found[1] if found is not None else None


class _Scanned:
    """Members the C scanner found in a buffer, to be found again: ``items()`` scans the same bytes
    from the same place with the same arguments, but for names (``(name, data, offset)`` items,
    whatever the reader hands out), so it gives the same members (equal, not the same objects)."""

    __slots__ = ("args", "fetch", "scan")

    def __init__(self, scan: Any, args: tuple[Any, ...], fetch: bool) -> None:
        self.scan, self.fetch = scan, fetch
        self.args = (*args[:4], False, *args[5:])  # keyed=False: names

    def items(self) -> list[Any]:
        items: list[Any] = self.scan(*self.args)[0]
        if self.fetch and items and type(items[-1][-2]) is FileRange:  # read then, as it is again now
            items[-1] = _with_data(items[-1], items[-1][-2].read())
        return items


def _with_data(item: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """A scanner's item, ``(name, data, offset)`` or ``(key, field, data, offset)``, with other data."""
    return (*item[:-2], data, item[-1])


def _fetch(data: FileRange, start: int, url: str | None, name: str | None) -> bytes:
    """The bytes of member data left in the file (``fetch``), read at once; ``start``: the stream
    offset of the data. The seek past it found the file long enough; a shorter read means that the
    file was cut since: the ``TarFormatError`` that reading the same bytes as a stream gives."""
    got = data.read_available()
    if len(got) < data.size:
        raise TarFormatError(url, start + len(got), f"truncated member data (expected {data.size} bytes, got "
                             f"{len(got)})", name)
    return got


def _fetched(item: tuple[Any, ...], url: str | None, name: str | None) -> tuple[Any, ...]:
    """A scanner's item with its ``FileRange`` read (``_fetch``): the same item with the bytes."""
    return _with_data(item, _fetch(item[-2], item[-1] + BLOCK, url, name))


def _rereader(stream: Any, consumed: int, max_member_size: int) -> Callable[[str, int], bytes | None] | None:
    """A function that finds a member by name in a plain local file, before a stream offset
    (``MemberFinder``); None when the stream can't be read again. ``consumed``: the bytes read
    from the stream so far."""
    make = getattr(stream, "member_rereader", None)
    if make is not None:  # a Source: it knows whether it can
        return make(max_member_size, consumed)  # type: ignore[no-any-return]
    try:
        if not stream.seekable() or not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            return None  # a pipe, a fifo or a device can't be read again
        fd, origin = stream.fileno(), stream.tell() - consumed
    except (AttributeError, OSError, ValueError):
        return None
    return MemberFinder(fd, origin, max_member_size).find


class _PreadStream:
    """A file descriptor read from ``origin`` on, with pread: the file's own position stays where it is."""

    def __init__(self, fd: int, origin: int) -> None:
        self.fd, self.pos = fd, origin

    def read(self, n: int = -1) -> bytes:
        data = os.pread(self.fd, n if n >= 0 else 1 << 20, self.pos)
        self.pos += len(data)
        return data


_EXPANDED_KEPT = 64 << 20  # bytes of expanded (sparse) members a MemberFinder keeps for the next link


class MemberFinder:
    """Members of a plain tar file found by name, for links whose targets the reader no longer
    holds: a second reader goes through the file (with pread) only as far as needed, once,
    remembering where each member's data lies, so that many links cost one extra pass at most."""

    def __init__(self, fd: int, origin: int = 0, max_member_size: int = DEFAULT_MAX_MEMBER_SIZE) -> None:
        self.fd, self.origin, self.max_member_size = fd, origin, max_member_size
        # name -> [(header offset, (data offset, size), None: not stored in place, or the _LinkTo of a
        # link)], in file order
        self.where: dict[str, list[tuple[int, Any]]] = {}
        self.members = self._scan(self._record)
        self.scanned = -1  # header offset of the last member read
        self.expanded: dict[int, bytes] = {}  # header offset -> data not stored in place, the last few

    def _scan(self, record: Callable[[str, int, int | None, Any], None] | None) -> Iterator[Any]:
        return _read_members(_PreadStream(self.fd, self.origin), None, max_member_size=self.max_member_size,
                             stats=None, keyed=False, links="skip", link_cache=0, ignore_zeros=True, record=record)

    def _record(self, name: str, header: int, data_offset: int | None, data: Any) -> None:
        place = data if type(data) is _LinkTo else (data_offset, len(data)) if data_offset is not None else None
        self.where.setdefault(name, []).append((header, place))

    def find(self, name: str, before: int, depth: int = 0) -> bytes | None:
        """The data of the last member called ``name`` whose header starts before ``before`` (a
        link: its target's, found the same way from the link on)."""
        while self.scanned < before:
            try:
                self.scanned = next(self.members)[-1]
            except (StopIteration, TarprocError):
                break
        earlier = [(header, place) for header, place in self.where.get(name, ()) if header < before]
        if not earlier:
            return None
        header, place = earlier[-1]
        if type(place) is _LinkTo:
            return self.find(place.target, header, depth + 1) if depth < 32 else None  # a loop: no target
        if place is None:  # expanded (a sparse file): expand it again, reading up to it, unless done lately
            data = self.expanded.get(header)
            if data is None:
                data = next((data for member, data, offset in self._scan(None) if offset == header), None)
                if data is not None and len(data) <= _EXPANDED_KEPT:
                    self.expanded[header] = data
                    while sum(map(len, self.expanded.values())) > _EXPANDED_KEPT:
                        del self.expanded[next(iter(self.expanded))]
            return data
        at, size = place
        return os.pread(self.fd, size, self.origin + at) if size else b""


def _say(stats: ReadStats, message: str) -> None:
    (stats.warn or warn_stderr)(message)


def _target_came(watched: dict[Any, tuple[str, str]], name: Any, offset: int, stats: ReadStats) -> None:
    """A member of a name a symbolic link before it named: say what that means (a stream can't look ahead)."""
    message = watched.pop(name, None)
    if message is not None:
        _say(stats, f"{message[0]}{offset}{message[1]}")


def _link_name(long_link: str | None, pax: dict[str, str], block: bytes) -> str:
    """What a link entry names: its GNU long link name, else its pax linkpath, else the header's."""
    if long_link is not None:
        return long_link
    if pax and "linkpath" in pax:
        return pax["linkpath"]
    return _decode_name(_cstr(block[157:257]))


class _LinkTo(NamedTuple):
    """A link found by a MemberFinder's scan: the member it names."""

    target: str


def _link_target(typeflag: int, name: str, target: str) -> str | None:
    """The member a link refers to: a hard link names it; a symbolic link's target is relative to
    the link's directory. None when a symbolic link leaves the archive (absolute, or ``..`` past
    its root)."""
    if typeflag == ord("1"):
        return target
    if target.startswith("/"):
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if joined == ".." or joined.startswith("../"):
        return None
    # keep the './' that members of 'tar -C dir .' have
    return "./" + joined if name.startswith("./") and not joined.startswith("./") else joined


def _read_members(
    stream: Readable,
    url: str | None,
    *,
    max_member_size: int,
    stats: ReadStats | None,
    keyed: bool,
    links: str = "follow",
    link_cache: int = DEFAULT_LINK_CACHE,
    ignore_zeros: bool = False,
    record: Callable[[str, int, int | None, Any], None] | None = None,
    skip_data: bool = False,
    views: bool = False,
    refs: bool = False,
) -> Iterator[Any]:
    # record (for MemberFinder): called with (name, header offset, stream offset of the data or None
    # when it isn't stored in place, data) for every regular member before it is yielded
    if stats is None:
        stats = ReadStats()
    if links not in LINK_POLICIES:
        raise OptionError(f"bad links policy {links!r}; use one of {', '.join(LINK_POLICIES)}")
    read = stream.read
    buf = b""  # bytes read but not yet parsed
    pos = 0  # parse position in buf
    base = 0  # stream offset of buf[0]
    last: str | None = None  # the last member read, named in header errors
    long_name: str | None = None
    long_link: str | None = None
    pax: dict[str, str] = {}
    pax_global: dict[str, str] = {}
    # the C fast path accepts no size above this (and needs it to fit a C long long)
    scan_limit = min(max_member_size, 1 << 62)
    view_size = _VIEW if views else 0  # data this big comes as views of buf (iter_keyed_members)
    recent = _RecentMembers(link_cache if links != "skip" else 0)
    # names a symbolic link made a point of, said when a member of that name comes later: the target of
    # one left out for want of an earlier target, or of one read as the earlier member of a name that
    # comes again. name (or (key, field)) -> what to say, before and after the member's byte offset
    watched: dict[Any, tuple[str, str]] = {}
    # skip_data (for indexing a local file): the data of a regular member of _VIEW bytes or more that
    # isn't all in the buffer is skipped (seek), not read, and given as Unread(size); refs (for data
    # written out as it comes, from a plain local file): the same, handed out as a FileRange that a
    # writer copies in the kernel. A small read after such a member, so that most of the next big
    # one's data isn't read either; smaller data is read, as skipping it would cost reads of its
    # own. ref(stream offset, size) stands for data left unread, in the C scanner and here alike;
    # ref_size: data this big may be left unread (0: none). Without skip_data or refs, such data is
    # read at once with pread into a bytes object of its own (fetch): one copy, where reading it
    # into the buffer and slicing it out is two
    skip = _skipper(stream)
    ref: Callable[[int, int], Any] | None = None
    if skip is not None:
        ref = _unread if skip_data else _ranges(stream, url) if refs else _fetcher(stream, url)
    fetch = ref is not None and not skip_data and not refs
    ref_size = 0 if ref is None else _VIEW
    chunk = _CHUNK  # _SKIP_CHUNK for one read after a skip: the next header is all that is sure to be needed
    rereader: Any = False  # made on the first link that the recent members don't have
    zeros_seen = False  # with ignore_zeros: end-of-archive blocks were skipped

    while True:
        if len(buf) - pos < BLOCK:
            more = read(chunk)
            chunk = _CHUNK
            if not more:
                if len(buf) == pos:
                    if long_name is not None or pax or long_link is not None:
                        raise TarFormatError(url, base + pos, "stream ends after an extension header", long_name)
                    if base + pos == 0:
                        raise TarFormatError(url, 0, "empty stream, not a tar archive")
                    if zeros_seen:
                        return
                    raise TarFormatError(url, base + pos, "stream ends before the end-of-archive blocks", last)
                if base + pos == 0:
                    raise TarFormatError(url, 0, f"not a tar archive (a stream of {len(buf)} bytes, shorter than one header)")
                raise TarFormatError(url, base + pos, "truncated tar header", last)
            buf = buf[pos:] + more
            base += pos
            pos = 0
            continue

        scan = _scan
        if scan is not None and long_name is None and not pax and long_link is None and "path" not in pax_global:
            args = (buf, pos, base, scan_limit, keyed, view_size, ref_size, ref)
            items, new_pos, nb, scanned_last = scan(*args)
            if items:
                zeros_seen = False
                last = scanned_last
                cut: TarFormatError | None = None
                if new_pos > len(buf):  # the last member's data was left in the file: move past it
                    at, size = items[-1][-1] + BLOCK, len(items[-1][-2])
                    assert skip is not None  # ref is None without it
                    try:
                        stream_pos = _skip_member(skip, base + len(buf), at, size, url, last)
                        if fetch and type(items[-1][-2]) is FileRange:  # the file was short of it
                            items[-1] = _fetched(items[-1], url, last)
                    except TarFormatError as e:  # raised after the members before it, as where data is read
                        cut, nb = e, nb - size
                        del items[-1]
                    else:
                        buf, pos, base, chunk = b"", 0, stream_pos, _SKIP_CHUNK
                else:
                    pos = new_pos
                if recent.limit > 0 and cut is None:
                    recent.add_scanned(_Scanned(scan, args, fetch), len(items), nb)
                if record is not None:
                    for name, data, at in items:
                        record(name, at, at + BLOCK, data)
                if watched:
                    for scanned in items:
                        _target_came(watched, (scanned[0], scanned[1]) if keyed else scanned[0], scanned[-1], stats)
                it = iter(items)
                try:
                    yield from it
                except GeneratorExit:
                    # stopped early: count only the members handed out
                    done = len(items) - length_hint(it)
                    stats.members += done
                    stats.bytes += sum(len(item[-2]) for item in items[:done])
                    raise
                stats.members += len(items)
                stats.bytes += nb
                if cut is not None:
                    raise cut
                continue

        offset = base + pos
        # -- checksum: stored value vs. computed sums (chksum field counted as 8 spaces) --
        chk_field = buf[pos + 148 : pos + 156]
        stored = _parse_number(chk_field)
        block = buf[pos : pos + BLOCK]
        if stored != _block_sum(block) - sum(chk_field) + 256:
            if block == ZERO_BLOCK:
                if ignore_zeros:  # GNU tar's -i: read on past end-of-archive blocks
                    zeros_seen = True
                    pos += BLOCK
                    continue
                # end of archive: the rest of the stream must be zero padding
                _check_end(read, buf, pos + BLOCK, base, url, last)
                return
            if stored is None or _signed_sum(block) - _signed_sum(chk_field) + 256 != stored:
                if offset == 0:
                    raise TarFormatError(url, 0, "not a tar archive (no valid header)")
                raise TarFormatError(url, offset, "bad tar header checksum (damaged data or garbage)", last)

        zeros_seen = False  # a header after skipped end blocks: that archive must end properly too
        # -- size --
        size_field = _parse_number(buf[pos + 124 : pos + 136])
        if size_field is None or size_field < 0:
            raise TarFormatError(url, offset, "bad size field in tar header", last)
        size = size_field
        typeflag = buf[pos + 156]
        if pax and "size" in pax:
            size = _decimal(pax["size"], url, offset, "size in pax header", last)

        # -- name (only computed for members that need it) --
        is_reg = typeflag in _REG
        if is_reg or typeflag == _LONGNAME or typeflag == _LONGLINK or typeflag in _TYPE_NAMES:
            if long_name is not None:
                name = long_name
            elif pax and "path" in pax:
                name = pax["path"]
            elif "path" in pax_global:
                name = pax_global["path"]
            else:
                name = _header_name(buf, pos)
        else:
            name = ""
        if is_reg and name.endswith("/"):  # an old-style directory entry (a regular type, a name ending in '/')
            is_reg = False
            typeflag = _DIRECTORY

        if size > max_member_size:
            if typeflag in (_PAX, _PAX_GLOBAL, _LONGNAME, _LONGLINK):
                raise TarFormatError(url, offset, f"extension header of {size} bytes is too large", last)
            raise TarFormatError(
                url, offset, f"member size {size} exceeds the limit of {max_member_size} bytes", name or last
            )

        # -- data --
        start = pos + BLOCK
        sparse: list[tuple[int, int]] | None = None
        if typeflag == _GNU_SPARSE:
            # an old GNU sparse header: 4 map entries here, more in extension blocks (21 each,
            # while the 'extended' flag is set); the ones already parsed are dropped as it goes
            sparse = list(_sparse_regions(buf[pos + 386 : pos + 482], 4, url, offset, name))
            extended = buf[pos + 482]
            while extended:
                while len(buf) - start < BLOCK:
                    more = read(_CHUNK)
                    if not more:
                        raise TarFormatError(url, base + len(buf), "truncated GNU sparse header", name or last)
                    buf = buf[start:] + more  # only the unparsed rest is copied
                    base += start
                    pos -= start
                    start = 0
                sparse += _sparse_regions(buf[start : start + 504], 21, url, base + start, name)
                extended = buf[start + 504]
                start += BLOCK
                if len(sparse) > size + 1:  # every region but a last empty one holds data
                    raise TarFormatError(url, base + start, "GNU sparse map has more regions than data", name)
        elif size and typeflag in _NO_DATA_TYPES and not (typeflag in _LINK_TYPES and pax and "size" in pax):
            # links, devices, fifos and directories have no data, whatever their size field says
            # (old tars stored the file's size in hard links, and sizes in directories), as GNU tar
            # and tarfile read them; only a pax 'size' gives a link data of its own
            size = 0
        data_offset: int | None = base + start
        pax_sparse = is_reg and bool(pax) and any(k.startswith("GNU.sparse.") for k in pax)  # data is a map + regions
        end = start + size
        padded_end = start + ((size + 511) & ~511)
        if padded_end <= len(buf):
            data = buf[start:end]
            pos = padded_end
        elif end > len(buf) and ref is not None and size >= ref_size and is_reg and sparse is None and not pax_sparse:
            # the member runs past what is buffered, in a file: leave its data there
            assert skip is not None
            stream_pos = _skip_member(skip, base + len(buf), base + start, size, url, name or last)
            data = ref(base + start, size)
            if fetch and type(data) is FileRange:
                data = _fetch(data, base + start, url, name or last)
            chunk = _SKIP_CHUNK
            buf = b""
            pos = 0
            base = stream_pos
        else:
            # the member (or its padding) runs past what is buffered: read on (a stream in whole chunks)
            data, buf, pos, base = _read_on(read, buf, base, start, end, padded_end, url, name or last,
                                            0 if skip is not None else _CHUNK)

        # -- dispatch on type --
        linked = reread = False
        if sparse is not None:  # old GNU sparse: the file is its regions, zeros between
            real = _parse_number(block[483:495])
            if real is None or real < 0:
                raise TarFormatError(url, offset, "bad real size in GNU sparse header", name)
            data = _expand_sparse(sparse, real, data, max_member_size, url, offset, name)
            is_reg = True
            data_offset = None
        elif pax_sparse:
            # a pax-format sparse file: its data is (a map and) the regions, not the file
            name = pax.get("GNU.sparse.name", name)
            regions, real, map_bytes = _pax_sparse_map(pax, data, url, offset, name)
            data = _expand_sparse(regions, real, data[map_bytes:], max_member_size, url, offset, name)
            data_offset = None
        if typeflag == _LONGNAME:
            long_name = _decode_name(_cstr(data))
            continue
        if typeflag == _LONGLINK:
            long_link = _decode_name(_cstr(data))
            continue
        if typeflag == _PAX:
            pax = _parse_pax(data, url, offset)
            continue
        if typeflag == _PAX_GLOBAL:
            pax_global.update(_parse_pax(data, url, offset))
            pax_global.pop("size", None)
            continue
        if typeflag in _LINK_TYPES and links == "skip" and record is not None and not size:
            # a MemberFinder's scan: a link to a link is found through it
            resolved = _link_target(typeflag, name, _link_name(long_link, pax, block))
            if resolved is not None:
                record(name, offset, None, _LinkTo(resolved))
        if typeflag in _LINK_TYPES and links != "skip":
            target = _link_name(long_link, pax, block)
            if size:  # a hard link that carries its own data (pax): that is the file
                is_reg = True
            else:
                resolved = _link_target(typeflag, name, target)
                found = recent.find(resolved) if resolved is not None else None
                if found is None and resolved is not None:
                    if rereader is False:
                        rereader = _rereader(stream, base + len(buf), max_member_size)
                    if rereader is not None:
                        found = rereader(resolved, offset)
                        reread = found is not None  # bytes of its own: charged to the cache as a member's
                if found is None:
                    kind = "hard link" if typeflag == ord("1") else "symbolic link"
                    why = ("it leaves the archive" if resolved is None else
                           "no earlier member of this shard has that name" +
                           ("" if rereader else f" within the last {recent.limit >> 20} MiB read"))
                    if typeflag == ord("1") or links == "strict":  # a hard link's data would be lost
                        raise LinkError(url, offset, f"{kind} {name!r} -> {target!r}: {why} (--links skip skips "
                                        "links)", name)
                    # a symbolic link carries no data: to a directory, dangling, or to a later member (counted
                    # with the links skipped, below)
                    _say(stats, f"{url}: symbolic link {name!r} -> {target!r} at byte {offset} left out: {why}")
                    if resolved is not None:
                        watched[split_key(resolved) if keyed else resolved] = (
                            f"{url}: the target of symbolic link {name!r} -> {target!r} is a later member (at byte ",
                            "): the link was left out, as a stream can't look ahead (GNU tar would extract it)")
                else:
                    data = found
                    is_reg = True
                    data_offset = None
                    linked = True
                    if typeflag == ord("2") and resolved is not None:
                        watched[split_key(resolved) if keyed else resolved] = (
                            f"{url}: {resolved!r} comes again (at byte ",
                            f") after symbolic link {name!r} -> {target!r} was read as its earlier bytes (GNU tar's "
                            "extracted link would read the later)")
        if is_reg:
            stats.members += 1
            stats.bytes += len(data)
            item: tuple[Any, ...]
            if keyed:
                key, field = split_key(name)
                item = (key, field, data, offset)
            else:
                item = (name, data, offset)
            if watched:
                _target_came(watched, (key, field) if keyed else name, offset, stats)
            # a link's data found in the cache is its target's bytes (charged then); read again, its own
            recent.add([(name, data, offset)], len(data) if reread or not linked else 0)
            if record is not None:
                record(name, offset, data_offset, data)
            yield item
        else:
            stats.skip_entry(_TYPE_NAMES.get(typeflag, f"type {chr(typeflag)!r}"))
        # an entry uses up the extension headers before it
        last = name or last
        long_name = None
        long_link = None
        pax = {}


def _skip_member(skip: Callable[[int], int], stream_pos: int, start: int, size: int, url: str | None,
                 name: str | None) -> int:
    """Move a stream that is at ``stream_pos`` past the rest of member data of ``size`` bytes at
    ``start`` and its padding, without reading them; returns where the stream is then. A stream
    that ends first is a ``TarFormatError``, the same as where the data is read."""
    end, padded_end = start + size, start + ((size + 511) & ~511)
    need = padded_end - stream_pos
    if need > 0:
        moved = skip(need)
        stream_pos += moved
        if moved < need:
            if stream_pos < end:
                raise TarFormatError(url, stream_pos, f"truncated member data (expected {size} bytes, got "
                                     f"{stream_pos - start})", name)
            raise TarFormatError(url, stream_pos, "truncated member padding", name)
    return stream_pos


def _read_on(read: Any, buf: bytes, base: int, start: int, end: int, padded_end: int, url: str | None,
             name: str | None, whole: int) -> tuple[bytes, bytes, int, int]:
    """Member data at ``buf[start:end]`` and its padding (to ``padded_end``), of which ``buf``
    holds only the start; the rest is read. Returns the data (bytes of its own), the next buffer,
    the position in it and its stream offset.

    ``whole``: read at least this many bytes at a time (a stream: what follows must be read anyway).
    What comes after the padding is then the next buffer as it was read. A stream that hands out
    chunks hands them on whole, where cutting one at the member's end would copy it."""
    data_end, pad_end = base + end, base + padded_end
    stream_pos = base + len(buf)
    parts: list[bytes | memoryview] | None = None
    if end <= len(buf):
        data = buf[start:end]
    else:
        parts = [memoryview(buf)[start:]]  # joined below: a copy, not two
    more = b""
    while stream_pos < pad_end:
        more = read(min(max(pad_end - stream_pos, whole), _PIECE))
        if not more:
            if stream_pos < data_end:
                raise TarFormatError(url, stream_pos, f"truncated member data (expected {end - start} bytes, "
                                     f"got {stream_pos - base - start})", name)
            raise TarFormatError(url, stream_pos, "truncated member padding", name)
        take = data_end - stream_pos  # member data in this piece
        if parts is not None and take > 0:
            parts.append(more if take >= len(more) else memoryview(more)[:take])
        stream_pos += len(more)
    if parts is not None:
        data = b"".join(parts)
    return data, more, len(more) - (stream_pos - pad_end), stream_pos - len(more)


def _check_end(read: Any, buf: bytes, pos: int, base: int, url: str | None, last: str | None) -> None:
    """After the first zero block: everything else up to EOF must be zeros."""
    rest = buf[pos:]
    offset = base + pos
    while True:
        if rest.count(0) != len(rest):
            bad = offset + next(i for i, b in enumerate(rest) if b)
            raise TarFormatError(url, bad, "garbage after the end-of-archive blocks", last)
        offset += len(rest)
        rest = read(_CHUNK)
        if not rest:
            return


# ---------------------------------------------------------------------------------------------
# writing


class Writable(Protocol):
    def write(self, data: bytes | bytearray | memoryview, /) -> int | None: ...


def _octal(value: int, width: int) -> bytes:
    """A numeric field of ``width`` bytes: octal digits and a NUL, or base-256 when too large."""
    if 0 <= value < 8 ** (width - 1):
        return b"%0*o\x00" % (width - 1, value)
    if value < 0 or value >= 1 << (8 * (width - 1)):
        raise ValueError(f"number {value} does not fit a {width}-byte tar field")
    return b"\x80" + value.to_bytes(width - 1, "big")


def _fixed(text: str, width: int, what: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > width:
        raise ValueError(f"{what} {text!r} is longer than {width} bytes")
    return raw + bytes(width - len(raw))


def _split_ustar(raw: bytes) -> tuple[bytes, bytes] | None:
    """Split a name longer than 100 bytes into (prefix, name) at a slash, if ustar can hold it."""
    if len(raw) > 256:
        return None
    i = raw.find(b"/", max(0, len(raw) - 101))
    while 0 < i <= 155:
        if len(raw) - i - 1 <= 100 and len(raw) - i - 1 > 0:
            return raw[:i], raw[i + 1 :]
        i = raw.find(b"/", i + 1)
    return None


def default_mtime() -> int:
    """Fixed mtime for written members: ``$SOURCE_DATE_EPOCH`` if set, else 0."""
    env = os.environ.get("SOURCE_DATE_EPOCH")
    return int(env) if env and env.isdigit() else 0


class TarWriter:
    """Write regular-file members to a binary stream as a deterministic tar archive.

    Headers use fixed metadata (mtime, uid/gid, uname/gname, mode), so the same members give
    byte-identical output. Names that fit ustar (100 bytes, or 155-byte prefix + 100) use plain ustar
    headers; longer names get a GNU ``././@LongLink`` record, which GNU tar, Python's tarfile,
    webdataset and DALI all read. ``close()`` writes the two end blocks and pads to 10240 bytes.
    It does not close the underlying stream.

    Small pieces are gathered in a buffer that is reused: as io's ``write`` contract has it, the
    stream must not keep the object ``write`` is given once the call returns (file objects, sinks and
    compressors copy it). With the C extension the headers and the gathering are done in C
    (``_speedups.pack``); the Python code here is the reference, byte for byte the same.

    >>> import io
    >>> buf = io.BytesIO()
    >>> with TarWriter(buf) as w:
    ...     w.write_sample({"__key__": "s1", "txt": b"hi", "cls": b"3"})
    >>> len(buf.getvalue())
    10240
    """

    def __init__(
        self,
        stream: Writable | Any,
        *,
        mtime: int | None = None,
        uid: int = 0,
        gid: int = 0,
        uname: str = "",
        gname: str = "",
        mode: int = 0o644,
    ) -> None:
        self.stream = stream
        self.offset = 0  # bytes written so far
        self.members = 0
        self.samples = 0  # samples written with write_sample/write_members
        self.closed = False
        if mtime is None:
            mtime = default_mtime()
        self.mtime = int(mtime) if mtime >= 0 else int(time.time())
        # every header is name + _mode_ids + size + _mtime_field + checksum + tail + prefix; the
        # constant parts are built and summed once (the checksum counts its own field as 8 spaces)
        self._mode_ids = _octal(mode, 8) + _octal(uid, 8) + _octal(gid, 8)
        self._mtime_field = _octal(self.mtime, 12)
        self._fixed_sum = sum(self._mode_ids) + sum(self._mtime_field) + 8 * 32
        owner = _fixed(uname, 32, "uname") + _fixed(gname, 32, "gname") + _octal(0, 8) + _octal(0, 8)
        self._tails: dict[tuple[bytes, bool], tuple[bytes, int]] = {}
        for typeflag, gnu in ((b"0", False), (b"0", True), (b"L", True)):
            # typeflag, linkname, magic (ustar, or GNU's for headers around a long-name record)
            tail = typeflag + bytes(100) + (b"ustar  \x00" if gnu else b"ustar\x0000") + owner
            self._tails[typeflag, gnu] = (tail, sum(tail))
        # the C writer's header templates: the three kinds above, empty name, checksum field blank
        self._templates = b"".join(
            head[:148] + b" " * 8 + head[156:]
            for head in (self._header(b"", 0), self._header(b"", 0, gnu=True),
                         self._header(b"././@LongLink", 0, b"L", gnu=True))
        )
        # a sink's write_pieces writes the gathered headers and a big member's data in one call
        self._write_pieces: Callable[[list[Any]], None] | None = getattr(stream, "write_pieces", None)
        # small writes are gathered in _buf[:_used] and written when it is full (see _put)
        self._buf = bytearray(_GATHER)
        self._view = memoryview(self._buf)
        self._used = 0
        self.last_key: str | None = None  # key of the last sample written
        self._busy = False  # in write_samples' C loop, which no write may interleave with

    # -- low level --

    def _header(self, name: bytes, size: int, typeflag: bytes = b"0", prefix: bytes = b"", gnu: bool = False) -> bytes:
        tail, tail_sum = self._tails[typeflag, gnu]
        size_field = b"%011o\x00" % size if size < _OCTAL_12 else _octal(size, 12)
        chksum = self._fixed_sum + tail_sum + (adler32(name) & 0xFFFF) + (adler32(size_field) & 0xFFFF) - 2
        if prefix:
            chksum += _short_sum(prefix)
        return b"".join(
            (
                name.ljust(100, b"\x00"),
                self._mode_ids,
                size_field,
                self._mtime_field,
                b"%06o\x00 " % chksum,  # adler32's low 16 bits: 1 + byte sum (see _short_sum)
                tail,
                prefix.ljust(BLOCK - 345, b"\x00") if prefix else _NO_PREFIX,
            )
        )

    def _check_idle(self) -> None:
        if self._busy:
            raise RuntimeError("TarWriter.write_samples is running: its samples can't write to the same writer")

    def _flush(self) -> None:
        if self._busy:
            self._check_idle()
        if self._used:
            self.stream.write(self._view[: self._used])
            self._used = 0

    def _put(self, piece: bytes | bytearray | memoryview) -> None:
        """Add bytes to the gather buffer, writing it out first when they don't fit."""
        n = len(piece)
        used = self._used
        if used + n > _GATHER:
            self._flush()
            used = 0
            if n > _GATHER:
                self.stream.write(piece)
                return
        self._buf[used : used + n] = piece
        self._used = used + n

    def _put_data(self, data: MemberData, size: int) -> None:
        """A member's data and padding, after its header(s); big data is written as it is."""
        if isinstance(data, FileRange):  # data left in a file: the kernel copies it where it can
            self._flush()
            write_range = getattr(self.stream, "write_range", None)
            if write_range is not None:
                write_range(data)
            else:
                self.stream.write(data.read())
        elif size >= _DIRECT_WRITE:  # big data goes to the stream as it is, not copied
            if self._write_pieces is not None and self._used:
                self._write_pieces([self._view[: self._used], data])
                self._used = 0
            else:
                self._flush()
                self.stream.write(data)
        elif size:
            self._put(data)
        pad = -size % BLOCK
        if pad:
            self._put(ZERO_BLOCK[:pad])
        self.offset += size + pad

    @staticmethod
    def member_size(name: str, size: int) -> int:
        """Bytes one member takes in the archive: headers (long-name records too), data, padding."""
        raw = name.encode("utf-8", "surrogateescape")
        n = BLOCK + ((size + 511) & ~511)
        if len(raw) > 100 and _split_ustar(raw) is None:
            n += BLOCK + ((len(raw) + 1 + 511) & ~511)
        return n

    # -- public --

    def add(self, name: str, data: MemberData) -> None:
        """Write one regular-file member."""
        if self.closed:
            raise ValueError("TarWriter is closed")
        if self._busy:
            self._check_idle()
        if _pack is not None:
            self._add_packed(((name, data),))
        else:
            self._add(name, data)

    def _add_packed(self, members: list[Any] | tuple[Any, ...]) -> None:
        """Write ``(name, data)`` members with the C writer, handing it back what it leaves to Python."""
        i, n = 0, len(members)
        while i < n:
            before = self._used
            used, j, status = _pack(self._buf, before, members, i, self._templates, _DIRECT_WRITE)
            self._used = used
            self.offset += used - before
            self.members += j - i
            i = j
            if status == _PACK_FULL:
                self._flush()
            elif status == _PACK_PYTHON:
                name, data = members[j]
                self._add(name, data)
                i += 1
            elif status == _PACK_BIG:  # the header is in the buffer; the data is not copied
                data = _as_bytes_like(members[j][1])
                self._put_data(data, len(data))
                self.members += 1
                i += 1

    def _add(self, name: str, data: MemberData) -> None:
        """The Python writer (the reference): one member."""
        try:
            raw = name.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError as e:
            raise SampleError(f"member name {name!r} cannot be written: {_lone_surrogate(e)}") from None
        if not raw:
            raise ValueError("empty member name")
        if 0 in raw:
            raise SampleError(f"member name {name!r} cannot be written: tar names end at a NUL byte")
        if type(data) is not bytes:
            data = _as_bytes_like(data)
        size = len(data)
        if len(raw) <= 100:
            head = self._header(raw, size)
        elif (split := _split_ustar(raw)) is not None:
            head = self._header(split[1], size, prefix=split[0])
        else:
            longname = raw + b"\x00"
            head = (
                self._header(b"././@LongLink", len(longname), b"L", gnu=True)
                + longname
                + bytes(-len(longname) % BLOCK)
                + self._header(raw[:100], size, gnu=True)
            )
        self._put(head)
        self.offset += len(head)
        self._put_data(data, size)
        self.members += 1

    def write_sample(self, sample: dict[str, Any]) -> None:
        """Write a sample dict as members ``KEY.FIELD`` in sorted field order (see ``sample_members``)."""
        self.write_samples((sample,))

    def write_samples(self, samples: Iterable[dict[str, Any]]) -> None:
        """``write_sample`` for each sample in turn; with the C writer, a loop in C packs them (the
        samples' iterator must not write to this writer meanwhile: that is a ``RuntimeError``)."""
        if self._busy:
            self._check_idle()
        if _pack is None or _pack_samples is None or self.closed:
            for sample in samples:
                self.write_members(*sample_members(sample))
            return
        it = iter(samples)
        while True:
            before = self._used
            self._busy = True  # the C loop holds the buffer's state while the iterator runs
            try:
                used, members, count, last_key, status, item = _pack_samples(self._buf, before, it, self._templates,
                                                                             _DIRECT_WRITE, self.last_key)
            finally:
                self._busy = False
            self._used = used
            self.offset += used - before
            self.members += members
            self.samples += count
            self.last_key = last_key
            if status == _PACK_DONE:
                return
            if status == _PACK_RAISED:
                raise item
            if status == _PACK_FULL:
                self._flush()
            # into the buffer just written out, or not the common case: the rest of the writer
            self.write_members(*sample_members(item))

    def write_members(self, key: str, members: list[tuple[str, MemberData]]) -> None:
        """Write one sample's members, as ``sample_members`` returns them.

        The same key twice in a row would merge two samples into one on reading: an error.
        """
        if self._busy:
            self._check_idle()
        if key == self.last_key:
            raise SampleError(f"key {key!r} written twice in a row; readers would merge the two samples", key=key)
        if _pack is not None and not self.closed:
            self._add_packed(members if type(members) is list or type(members) is tuple else list(members))
        else:
            add = self.add
            for name, data in members:
                add(name, data)
        self.last_key = key
        self.samples += 1

    def flush(self) -> None:
        """Write out what the writer has gathered: every member added so far is in the stream."""
        self._flush()

    def close(self) -> None:
        """Write the end-of-archive blocks and pad to a full 10240-byte record."""
        if self.closed:
            return
        if self._busy:
            self._check_idle()
        end = tar_end_size(self.offset)
        self._put(bytes(end))
        self.offset += end
        self._flush()
        self.closed = True

    def __enter__(self) -> TarWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()


def _as_bytes_like(data: Any) -> MemberData:
    """``data`` such that ``len()`` counts bytes (a memoryview of ints or floats counts items, and
    so does an array.array or a numpy array): any other object with the buffer protocol becomes a
    flat memoryview of bytes, or a copy when it isn't contiguous; data left in a file
    (``FileRange``) stays as it is. Anything else is a TypeError."""
    if isinstance(data, (bytes, bytearray, FileRange)):
        return data
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.itemsize != 1 or view.ndim != 1 or not view.c_contiguous:
        return view.tobytes()
    return view


def _lone_surrogate(e: UnicodeEncodeError) -> str:
    return (f"it holds the lone surrogate {e.object[e.start]!r} (character {e.start}), which no UTF-8 name can "
            "carry")


def ends_at_member(f: Any, offset: int) -> bool:
    """Whether walking the headers of the tar file ``f`` from its first byte lands exactly on
    ``offset``: every header on the way has a valid checksum and each member's data is stepped
    over by its size. For a resume that cuts a file there (``tarrecv``'s state), which must not cut
    a member in two."""
    pos = 0
    while pos < offset:
        f.seek(pos)
        block = f.read(BLOCK)
        if len(block) < BLOCK:
            return False
        chk = block[148:156]
        stored = _parse_number(chk)
        if stored is None or stored not in (_block_sum(block) - sum(chk) + 256,
                                            _signed_sum(block) - _signed_sum(chk) + 256):
            return False
        size = _parse_number(block[124:136])
        if size is None or size < 0:
            return False
        pos += BLOCK + (0 if block[156] in _NO_DATA_TYPES else (size + 511) & ~511)
    return pos == offset


def check_key(key: Any) -> None:
    """Raise ``SampleError`` unless ``key`` reads back as the same key under the key rule.

    Its last path component must be non-empty and dot-free (readers split names at the first dot
    of the basename), and its first must not look like ``__name__`` (metadata, skipped).
    """
    if not isinstance(key, str) or not key:
        raise SampleError(f"sample key {key!r} is not a non-empty string", key=str(key))
    if "\x00" in key:
        raise SampleError(f"sample key {key!r} cannot be written: tar names end at a NUL byte", key=key)
    try:
        key.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise SampleError(f"sample key {key!r} cannot be written: {_lone_surrogate(e)}", key=key) from None
    if key.startswith("./"):
        raise SampleError(f"sample key {key!r} cannot be written: readers drop a leading './' from keys", key=key)
    base = key[key.rfind("/") + 1 :]
    first = key.split("/", 1)[0]
    if not base or "." in base:
        raise SampleError(
            f"sample key {key!r} cannot be written: readers split names at the first dot of the last "
            "path component, so it must be non-empty and have no dot",
            key=key,
        )
    if len(first) > 4 and first.startswith("__") and first.endswith("__"):
        raise SampleError(f"sample key {key!r} cannot be written: readers skip __name__ paths as metadata", key=key)


def sample_members(sample: dict[str, Any]) -> tuple[str, list[tuple[str, MemberData]]]:
    """``(key, [(name, data), ...])`` for a sample: members ``KEY.FIELD`` in sorted field order.

    ``__key__`` names the sample; other ``__*__`` entries (``__url__``...) are never written.
    Values may be bytes-like, str (UTF-8), int/float (decimal text) or dict/list (JSON). Raises
    ``SampleError`` for a key or field that would not read back as written, or no fields at all.

    >>> sample_members({"__key__": "a/1", "__url__": "x.tar", "txt": "hi", "cls": 3})
    ('a/1', [('a/1.cls', b'3'), ('a/1.txt', b'hi')])
    """
    if _pack is not None and (done := _members(sample)) is not None:  # the C writer's common case
        return done  # type: ignore[no-any-return]
    key = sample["__key__"]
    check_key(key)
    members = []
    seen: dict[str, str] = {}  # lower-case field -> field: readers compare fields without case
    for field in sorted(sample):
        if field.startswith("__"):
            continue
        if "/" in field or "\x00" in field:
            raise SampleError(f"sample {key!r}: field {field!r} cannot contain '/' or a NUL byte", key=key)
        if (other := seen.setdefault(field.lower(), field)) != field:
            raise SampleError(f"sample {key!r}: fields {other!r} and {field!r} differ only in case, and readers "
                              "take them as one (a duplicate field)", key=key)
        value = sample[field]
        members.append((f"{key}.{field}", value if type(value) is bytes else encode_value(value, key, field)))
    if not members:
        raise SampleError(f"sample {key!r} has no fields to write", key=key)
    return key, members


def encode_value(value: Any, key: str = "", field: str = "") -> MemberData:
    """Bytes for a sample value: bytes-like as is (and data left in a file, ``FileRange``), str as
    UTF-8, numbers as text, dict/list as JSON."""
    if isinstance(value, (bytes, bytearray, memoryview)) or type(value) is FileRange:
        return _as_bytes_like(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bool):
        raise TypeError(f"sample {key!r}: field {field!r}: cannot write a bool")
    if isinstance(value, (int, float)):
        return str(value).encode("ascii")
    if isinstance(value, (dict, list)):
        import json

        return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")
    raise TypeError(f"sample {key!r}: field {field!r}: cannot write a {type(value).__name__}")


def tar_end_size(offset: int) -> int:
    """Bytes ``TarWriter.close`` adds after ``offset`` bytes of members."""
    end = 2 * BLOCK
    return end + (-(offset + end) % RECORD)


__all__ = [
    "BLOCK",
    "DEFAULT_MAX_MEMBER_SIZE",
    "ReadStats",
    "TarWriter",
    "check_key",
    "sample_members",
    "encode_value",
    "iter_keyed_members",
    "iter_members",
    "split_key",
    "tar_end_size",
]
