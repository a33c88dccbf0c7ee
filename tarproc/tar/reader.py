"""Reading tar streams: ``iter_members``, ``iter_keyed_members`` and the scanning seam ``MemberScan``.

The reader is a loop over a buffer of the stream: the C scanner (``_speedups.scan``) takes runs
of plain members at once; everything else (extension headers, links, sparse files, damage) is
parsed here, one header at a time. The Python code is the reference: the tests compare the two.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from operator import length_hint
from typing import Any, Literal, overload

from ..compression import Readable
from ..errors import LinkError, OptionError, TarFormatError, TarprocError
from .headers import (
    BLOCK,
    DIRECTORY,
    GNU_SPARSE,
    LINK_TYPES,
    LONGLINK,
    LONGNAME,
    NO_DATA_TYPES,
    PAX,
    PAX_GLOBAL,
    REGULAR_TYPES,
    TYPE_NAMES,
    ZERO_BLOCK,
    block_sum,
    cstr,
    decode_name,
    header_name,
    parse_decimal,
    parse_number,
    parse_pax,
    signed_sum,
    split_key,
)
from .links import (
    DEFAULT_LINK_CACHE,
    LinkTo,
    RecentMembers,
    ScannedBuffer,
    link_name,
    link_target,
    link_warning,
    target_came,
)
from .policy import DEFAULT_MAX_MEMBER_SIZE, LINK_POLICIES, TAR_FIELDS, ReadPolicy, policy_with_keywords
from .ranges import (
    PIECE,
    SKIP_CHUNK,
    FileRange,
    Unread,
    fetch_range,
    fetched_item,
    fetcher,
    make_unread,
    range_maker,
    skip_member,
    stream_skipper,
)
from .sparse import expand_sparse, pax_sparse_map, sparse_regions
from .stats import ReadStats

_scan: Any = None
if not os.environ.get("TARPROC_PURE_PYTHON"):
    try:
        from .._speedups import scan as _scan  # type: ignore[no-redef]
    except ImportError:  # pragma: no cover - built by pip install; absent only without a compiler
        _scan = None

_CHUNK = 1 << 19  # bytes read from the stream at a time (512 KiB: faster than 256 KiB or 1-4 MiB here)
_VIEW = 1 << 16  # with views=True, the reader hands out member data at least this big as views
_DEFAULT_POLICY = ReadPolicy()
_EXTENSION_TYPES = (LONGNAME, LONGLINK, PAX, PAX_GLOBAL)  # headers that say something of the entry after them


def iter_members(
    stream: Readable,
    url: str | None = None,
    *,
    policy: ReadPolicy = _DEFAULT_POLICY,
    stats: ReadStats | None = None,
    link_cache: int = DEFAULT_LINK_CACHE,
    **old: Any,
) -> Iterator[tuple[str, bytes, int]]:
    """Yield ``(name, data, header_offset)`` for each regular file in a tar stream.

    Raises ``TarFormatError`` on any damage (see the module docstring). Reads the stream to its
    end, so the end-of-archive padding is checked too.

    Links and sparse files read as GNU tar extracts them: a hard or symbolic link to an earlier
    member of the archive yields that member's bytes under the link's name. The target comes
    from the last ``link_cache`` bytes of members read, else is read again from the start of the
    stream where it can be (a plain local file); a link whose target can't be had is a
    ``LinkError`` naming both. Sparse files (old GNU and pax formats 0.0, 0.1, 1.0) are expanded.

    Args:
        stream: a binary stream (anything with ``read(n)``).
        url: the name errors give for the stream.
        policy: how to read (``ReadPolicy``): its ``max_member_size``, ``links`` and
            ``ignore_zeros`` apply here. The same keywords given directly still work, deprecated.
        stats: counters to fill in (``ReadStats``); its ``warn`` says where warnings go.
        link_cache: bytes of recent members kept for links.

    >>> import io
    >>> from tarproc.tar import TarWriter
    >>> buf = io.BytesIO()
    >>> with TarWriter(buf) as w:
    ...     w.add("a/001.txt", b"hello")
    >>> [(name, data) for name, data, _ in iter_members(io.BytesIO(buf.getvalue()))]
    [('a/001.txt', b'hello')]
    """
    policy = policy_with_keywords(policy, old, TAR_FIELDS, "iter_members")
    return _read_members(stream, url, max_member_size=policy.max_member_size, stats=stats, keyed=False,
                         links=policy.links, link_cache=link_cache, ignore_zeros=policy.ignore_zeros)


@overload
def iter_keyed_members(
    stream: Readable, url: str | None = None, *, policy: ReadPolicy = ..., stats: ReadStats | None = ...,
    link_cache: int = ..., views: Literal[False] = ..., **old: Any,
) -> Iterator[tuple[str | None, str, bytes, int]]: ...


@overload
def iter_keyed_members(
    stream: Readable, url: str | None = None, *, policy: ReadPolicy = ..., stats: ReadStats | None = ...,
    link_cache: int = ..., views: bool, refs: bool = ..., **old: Any,
) -> Iterator[tuple[str | None, str, bytes | memoryview | FileRange, int]]: ...


def iter_keyed_members(
    stream: Readable,
    url: str | None = None,
    *,
    policy: ReadPolicy = _DEFAULT_POLICY,
    stats: ReadStats | None = None,
    link_cache: int = DEFAULT_LINK_CACHE,
    views: bool = False,
    refs: bool = False,
    **old: Any,
) -> Iterator[tuple[str | None, str, bytes | memoryview | FileRange, int]]:
    """Like ``iter_members`` but yield ``(key, field, data, offset)`` by the WebDataset key rule.

    ``key`` is None (and ``field`` the whole name) for names without a key.

    Args:
        stream, url, policy, stats, link_cache: as for ``iter_members``.
        views: for data that passes straight through, as in ``tarcat`` and ``tarsplit``: the data
            of members of 64 KiB or more may come as a read-only ``memoryview`` of the bytes read
            from the stream instead of a copy of them. A view stays valid as long as it is held
            (the bytes it shows are never reused or changed), but it keeps the whole read (about
            512 KiB) in memory with it: copy (``bytes(data)``) what you keep for long, such as
            samples in a shuffle buffer.
        refs: where the stream is a plain local file, the data of a member of 64 KiB or more
            that isn't in what was read is not read at all but comes as a ``FileRange`` (file,
            offset, size), which ``TarWriter`` has the kernel copy to its destination
            (``os.sendfile``) and a decoder reads when it needs the bytes (``FileRange.read_into``).
            A range holds the file open for as long as it is held. Every check on the tar's
            structure is made as when the data is read.
    """
    policy = policy_with_keywords(policy, old, TAR_FIELDS, "iter_keyed_members")
    return _read_members(stream, url, max_member_size=policy.max_member_size, stats=stats, keyed=True,
                         links=policy.links, link_cache=link_cache, ignore_zeros=policy.ignore_zeros, views=views,
                         refs=refs)


class MemberScan:
    """The regular members of a tar stream, for an index: where each lies, not its bytes.

    Iterating gives ``(name, data, header_offset)`` as ``iter_members`` does, with every check it
    makes; but from a plain local file (a stream with ``skipper()``, as ``sources.Source``) the
    data of big members isn't read: it comes as an ``Unread``, whose ``len`` is the size. The
    scan reads little more than the headers then. Offsets count from where the stream was when
    the scan began. One pass: iterate it once.

    ``not_in_place`` holds the header offsets of members whose bytes aren't stored after their
    header (a followed link: its target's bytes; a sparse file: expanded), each added before the
    member is given.

    Args:
        stream: a binary stream (anything with ``read(n)``).
        url: the name errors give for the stream.
        policy: as for ``iter_members`` (``max_member_size``, ``links``, ``ignore_zeros``).
        stats: counters to fill in (``ReadStats``).

    >>> import io
    >>> from tarproc.tar import TarWriter
    >>> buf = io.BytesIO()
    >>> with TarWriter(buf) as w:
    ...     w.add("a/001.txt", b"hello")
    >>> scan = MemberScan(io.BytesIO(buf.getvalue()))
    >>> [(name, len(data), offset) for name, data, offset in scan], scan.not_in_place
    ([('a/001.txt', 5, 0)], set())
    """

    def __init__(self, stream: Readable, url: str | None = None, *, policy: ReadPolicy = _DEFAULT_POLICY,
                 stats: ReadStats | None = None) -> None:
        self.not_in_place: set[int] = set()
        # the members themselves, not a wrapper: an index reads millions of them
        self._members = _read_members(stream, url, max_member_size=policy.max_member_size, stats=stats,
                                      keyed=False, links=policy.links, ignore_zeros=policy.ignore_zeros,
                                      skip_data=True, record=self._record)

    def _record(self, name: str, header: int, data_offset: int | None, data: Any) -> None:
        if data_offset is None and type(data) is not LinkTo:  # LinkTo: a link left out (links="skip")
            self.not_in_place.add(header)

    def __iter__(self) -> Iterator[tuple[str, bytes | Unread, int]]:
        return self._members  # type: ignore[no-any-return]


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
        # name -> [(header offset, (data offset, size), None: not stored in place, or the LinkTo of a
        # link)], in file order
        self.where: dict[str, list[tuple[int, Any]]] = {}
        self.members = self._scan(self._record)
        self.scanned = -1  # header offset of the last member read
        self.expanded: dict[int, bytes] = {}  # header offset -> data not stored in place, the last few

    def _scan(self, record: Callable[[str, int, int | None, Any], None] | None) -> Iterator[Any]:
        return _read_members(_PreadStream(self.fd, self.origin), None, max_member_size=self.max_member_size,
                             stats=None, keyed=False, links="skip", link_cache=0, ignore_zeros=True, record=record)

    def _record(self, name: str, header: int, data_offset: int | None, data: Any) -> None:
        place = data if type(data) is LinkTo else (data_offset, len(data)) if data_offset is not None else None
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
        if type(place) is LinkTo:
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
    """The members of a tar stream, as ``iter_members`` (``keyed=False``) or ``iter_keyed_members``
    give them. ``record`` (for ``MemberFinder`` and ``MemberScan``) is called with (name, header
    offset, stream offset of the data or None when it isn't stored in place, data) for every
    regular member before it is yielded; ``skip_data``: see ``_Reader``."""
    reader = _Reader(stream, url, max_member_size, stats if stats is not None else ReadStats(), keyed, links,
                     link_cache, ignore_zeros, record, skip_data, views, refs)
    return reader.members()


class _Reader:
    """One read of a tar stream: the buffer, the extension headers pending, the links' memory.

    ``members()`` is the loop. It hands runs of plain members to the C scanner (``_scan``) where
    one is built and no extension header is pending, and parses everything else itself, one
    header at a time (``_member``). Each member's data is read, or, from a plain local file,
    left there: with ``skip_data`` (indexing) the data of a regular member of ``_VIEW`` bytes or
    more that isn't all in the buffer is skipped (seek), not read, and given as ``Unread(size)``;
    with ``refs`` (data written out as it comes) the same, handed out as a ``FileRange`` that a
    writer copies in the kernel. A small read follows such a member, so that most of the next big
    one's data isn't read either; smaller data is read, as skipping it would cost reads of its
    own. Without either, such data is read at once with pread into a bytes object of its own
    (``fetch``): one copy, where reading it into the buffer and slicing it out is two.
    """

    def __init__(self, stream: Readable, url: str | None, max_member_size: int, stats: ReadStats, keyed: bool,
                 links: str, link_cache: int, ignore_zeros: bool,
                 record: Callable[[str, int, int | None, Any], None] | None, skip_data: bool, views: bool,
                 refs: bool) -> None:
        self.stream, self.url, self.read = stream, url, stream.read
        self.max_member_size, self.stats, self.keyed, self.links = max_member_size, stats, keyed, links
        self.ignore_zeros, self.record = ignore_zeros, record
        self.buf = b""  # bytes read but not yet parsed
        self.pos = 0  # parse position in buf
        self.base = 0  # stream offset of buf[0]
        self.last: str | None = None  # the last member read, named in header errors
        self.long_name: str | None = None
        self.long_link: str | None = None
        self.pax: dict[str, str] = {}
        self.pax_global: dict[str, str] = {}
        # the C fast path accepts no size above this (and needs it to fit a C long long)
        self.scan_limit = min(max_member_size, 1 << 62)
        self.view_size = _VIEW if views else 0  # data this big comes as views of buf (iter_keyed_members)
        self.recent = RecentMembers(link_cache if links != "skip" else 0)
        # names a symbolic link made a point of, said when a member of that name comes later: the target of
        # one left out for want of an earlier target, or of one read as the earlier member of a name that
        # comes again. name (or (key, field)) -> what to say, before and after the member's byte offset
        self.watched: dict[Any, tuple[str, str]] = {}
        self.skip_data, self.refs = skip_data, refs
        self.skip: Callable[[int], int] | None = None  # set by members(), as the rest below
        self.ref: Callable[[int, int], Any] | None = None
        self.fetch = False
        self.ref_size = 0
        self.chunk = _CHUNK  # SKIP_CHUNK for one read after a skip: the next header is all that is sure to be needed
        self.rereader: Any = False  # made on the first link that the recent members don't have
        self.zeros_seen = False  # with ignore_zeros: end-of-archive blocks were skipped
        self.ended = False  # the end-of-archive blocks came, and only zeros after them

    def members(self) -> Iterator[Any]:
        if self.links not in LINK_POLICIES:
            raise OptionError(f"bad links policy {self.links!r}; use one of {', '.join(LINK_POLICIES)}")
        # ref(stream offset, size) stands for data left unread, in the C scanner and here alike;
        # ref_size: data this big may be left unread (0: none)
        self.skip = skip = stream_skipper(self.stream)
        if skip is not None:
            self.ref = (make_unread if self.skip_data else range_maker(self.stream, self.url) if self.refs
                        else fetcher(self.stream, self.url))
        self.fetch = self.ref is not None and not self.skip_data and not self.refs
        self.ref_size = 0 if self.ref is None else _VIEW
        if self.refs and self.ref is not None:
            self.chunk = SKIP_CHUNK  # the first read small too: the first big members are left in the file as well
        stats = self.stats
        while True:
            if len(self.buf) - self.pos < BLOCK:
                if not self._fill():
                    return
                continue
            scan = _scan
            if (scan is not None and self.long_name is None and not self.pax and self.long_link is None
                    and "path" not in self.pax_global):
                batch = self._scan_run(scan)
                if batch is not None:
                    items, nb, cut = batch
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
            # a header: its checksum first (the stored value vs. the computed sum, the chksum field
            # counted as 8 spaces); anything else, a zero block included, is _odd_header's
            buf, pos = self.buf, self.pos
            offset = self.base + pos
            chk_field = buf[pos + 148 : pos + 156]
            block = buf[pos : pos + BLOCK]
            if parse_number(chk_field) == block_sum(block) - sum(chk_field) + 256:
                self.zeros_seen = False  # a header after skipped end blocks: that archive must end properly too
            elif not self._odd_header(offset, block, chk_field):  # zero blocks: skipped (ignore_zeros), or the end
                if self.ended:
                    return
                continue
            item = self._member(offset, block)
            if item is not None:
                yield item

    def _fill(self) -> bool:
        """Read more, as less than a header is buffered; False where the stream ends properly there
        (after skipped end-of-archive blocks), else a ``TarFormatError`` for where it ends."""
        more = self.read(self.chunk)
        if len(more) >= self.chunk:  # after a small read, one of _VIEW, then whole chunks: the data of a big member
            self.chunk = _VIEW if self.chunk < _VIEW else _CHUNK  # after small ones is left in the file too
        buf, pos, base, url = self.buf, self.pos, self.base, self.url
        if not more:
            if len(buf) == pos:
                if self.long_name is not None or self.pax or self.long_link is not None:
                    raise TarFormatError(url, base + pos, "stream ends after an extension header", self.long_name)
                if base + pos == 0:
                    raise TarFormatError(url, 0, "empty stream, not a tar archive")
                if self.zeros_seen:
                    return False
                raise TarFormatError(url, base + pos, "stream ends before the end-of-archive blocks", self.last)
            if base + pos == 0:
                raise TarFormatError(url, 0, f"not a tar archive (a stream of {len(buf)} bytes, shorter than one header)")
            raise TarFormatError(url, base + pos, "truncated tar header", self.last)
        self.buf = buf[pos:] + more
        self.base = base + pos
        self.pos = 0
        return True

    def _scan_run(self, scan: Any) -> tuple[list[Any], int, TarFormatError | None] | None:
        """The C scanner's run of plain members from here: ``(items, data bytes, the error that
        follows them or None)``; None where it finds none (the header is parsed here then)."""
        buf = self.buf
        args = (buf, self.pos, self.base, self.scan_limit, self.keyed, self.view_size, self.ref_size, self.ref)
        items, new_pos, nb, scanned_last = scan(*args)
        if not items:
            return None
        self.zeros_seen = False
        self.last = last = scanned_last
        cut: TarFormatError | None = None
        if new_pos > len(buf):  # the last member's data was left in the file: move past it
            at, size = items[-1][-1] + BLOCK, len(items[-1][-2])
            assert self.skip is not None  # ref is None without it
            try:
                stream_pos = skip_member(self.skip, self.base + len(buf), at, size, self.url, last)
                if self.fetch and type(items[-1][-2]) is FileRange:  # the file was short of it
                    items[-1] = fetched_item(items[-1], self.url, last)
            except TarFormatError as e:  # raised after the members before it, as where data is read
                cut, nb = e, nb - size
                del items[-1]
            else:
                self.buf, self.pos, self.base, self.chunk = b"", 0, stream_pos, SKIP_CHUNK
        else:
            self.pos = new_pos
        if self.recent.limit > 0 and cut is None:
            self.recent.add_scanned(ScannedBuffer(scan, args, self.fetch), len(items), nb)
        if self.record is not None:
            for name, data, at in items:
                self.record(name, at, at + BLOCK, data)
        if self.watched:
            for scanned in items:
                target_came(self.watched, (scanned[0], scanned[1]) if self.keyed else scanned[0], scanned[-1],
                            self.stats)
        return items, nb, cut

    def _odd_header(self, offset: int, block: bytes, chk_field: bytes) -> bool:
        """A block at ``offset`` whose checksum is not the unsigned sum: True for a header whose
        checksum is the signed sum (old tars); False for a zero block, skipped with ignore_zeros,
        else the end of the archive (``ended``), after which only zeros may follow; else the
        ``TarFormatError`` of damage."""
        if block == ZERO_BLOCK:
            if self.ignore_zeros:  # GNU tar's -i: read on past end-of-archive blocks
                self.zeros_seen = True
                self.pos += BLOCK
                return False
            # end of archive: the rest of the stream must be zero padding
            _check_end(self.read, self.buf, self.pos + BLOCK, self.base, self.url, self.last)
            self.ended = True
            return False
        stored = parse_number(chk_field)
        if stored is None or signed_sum(block) - signed_sum(chk_field) + 256 != stored:
            if offset == 0:
                raise TarFormatError(self.url, 0, "not a tar archive (no valid header)")
            raise TarFormatError(self.url, offset, "bad tar header checksum (damaged data or garbage)", self.last)
        self.zeros_seen = False  # a header after skipped end blocks: that archive must end properly too
        return True

    def _fields(self, offset: int, block: bytes) -> tuple[int, int, str, bool]:
        """``(size, typeflag, name, is regular)`` of a verified header; the name is computed only
        for entries that need it, the size checked against ``max_member_size``."""
        pax, url, last = self.pax, self.url, self.last
        size_field = parse_number(block[124:136])
        if size_field is None or size_field < 0:
            raise TarFormatError(url, offset, "bad size field in tar header", last)
        size = size_field
        typeflag = block[156]
        if pax and "size" in pax:
            size = parse_decimal(pax["size"], url, offset, "size in pax header", last)
        is_reg = typeflag in REGULAR_TYPES
        if is_reg or typeflag == LONGNAME or typeflag == LONGLINK or typeflag in TYPE_NAMES:
            if self.long_name is not None:
                name = self.long_name
            elif pax and "path" in pax:
                name = pax["path"]
            elif "path" in self.pax_global:
                name = self.pax_global["path"]
            else:
                name = header_name(self.buf, self.pos)
        else:
            name = ""
        if is_reg and name.endswith("/"):  # an old-style directory entry (a regular type, a name ending in '/')
            is_reg = False
            typeflag = DIRECTORY
        if size > self.max_member_size:
            if typeflag in (PAX, PAX_GLOBAL, LONGNAME, LONGLINK):
                raise TarFormatError(url, offset, f"extension header of {size} bytes is too large", last)
            raise TarFormatError(
                url, offset, f"member size {size} exceeds the limit of {self.max_member_size} bytes", name or last
            )
        return size, typeflag, name, is_reg

    def _member(self, offset: int, block: bytes) -> tuple[Any, ...] | None:
        """Parse the entry whose verified header is at ``offset``, and its data: the item of a
        regular member (a followed link, an expanded sparse file), else None (an extension header
        kept for the next entry, an entry skipped and counted)."""
        size, typeflag, name, is_reg = self._fields(offset, block)
        url, pax = self.url, self.pax
        start = self.pos + BLOCK
        sparse: list[tuple[int, int]] | None = None
        if typeflag == GNU_SPARSE:
            sparse, start = self._old_sparse_map(offset, start, size, name)
        elif size and typeflag in NO_DATA_TYPES and not (typeflag in LINK_TYPES and pax and "size" in pax):
            # links, devices, fifos and directories have no data, whatever their size field says
            # (old tars stored the file's size in hard links, and sizes in directories), as GNU tar
            # and tarfile read them; only a pax 'size' gives a link data of its own
            size = 0
        data_offset: int | None = self.base + start
        pax_sparse = is_reg and bool(pax) and any(k.startswith("GNU.sparse.") for k in pax)  # data is a map + regions
        padded_end = start + ((size + 511) & ~511)
        if padded_end <= len(self.buf):
            data = self.buf[start : start + size]
            self.pos = padded_end
        else:  # the member (or its padding) runs past what is buffered
            data = self._data_past_buffer(start, size, padded_end, is_reg and sparse is None and not pax_sparse, name)

        linked = reread = False
        if sparse is not None:  # old GNU sparse: the file is its regions, zeros between
            real = parse_number(block[483:495])
            if real is None or real < 0:
                raise TarFormatError(url, offset, "bad real size in GNU sparse header", name)
            data = expand_sparse(sparse, real, data, self.max_member_size, url, offset, name)
            is_reg = True
            data_offset = None
        elif pax_sparse:
            # a pax-format sparse file: its data is (a map and) the regions, not the file
            name = pax.get("GNU.sparse.name", name)
            regions, real, map_bytes = pax_sparse_map(pax, data, url, offset, name)
            data = expand_sparse(regions, real, data[map_bytes:], self.max_member_size, url, offset, name)
            data_offset = None
        if typeflag in _EXTENSION_TYPES:
            self._extension(typeflag, data, offset)
            return None
        if typeflag in LINK_TYPES:
            if self.links == "skip":
                if self.record is not None and not size:
                    # a MemberFinder's scan: a link to a link is found through it
                    resolved = link_target(typeflag, name, link_name(self.long_link, pax, block))
                    if resolved is not None:
                        self.record(name, offset, None, LinkTo(resolved))
            elif size:  # a hard link that carries its own data (pax): that is the file
                is_reg = True
            else:
                found, reread = self._link_data(typeflag, name, offset, block)
                if found is not None:
                    data, is_reg, data_offset, linked = found, True, None, True
        item: tuple[Any, ...] | None = None
        if is_reg:
            stats = self.stats
            stats.members += 1
            stats.bytes += len(data)
            if self.keyed:
                key, field = split_key(name)
                item = (key, field, data, offset)
            else:
                item = (name, data, offset)
            if self.watched:
                target_came(self.watched, (key, field) if self.keyed else name, offset, stats)
            # a link's data found in the cache is its target's bytes (charged then); read again, its own
            self.recent.add([(name, data, offset)], len(data) if reread or not linked else 0)
            if self.record is not None:
                self.record(name, offset, data_offset, data)
        else:
            self.stats.skip_entry(TYPE_NAMES.get(typeflag, f"type {chr(typeflag)!r}"))
        # an entry uses up the extension headers before it
        self.last = name or self.last
        self.long_name = None
        self.long_link = None
        self.pax = {}
        return item

    def _old_sparse_map(self, offset: int, start: int, size: int, name: str) -> tuple[list[tuple[int, int]], int]:
        """An old GNU sparse header's map, and where its data starts: 4 map entries in the header,
        more in extension blocks (21 each, while the 'extended' flag is set); the ones already
        parsed are dropped from the buffer as it goes."""
        buf, pos, url = self.buf, self.pos, self.url
        sparse = list(sparse_regions(buf[pos + 386 : pos + 482], 4, url, offset, name))
        extended = buf[pos + 482]
        while extended:
            while len(buf) - start < BLOCK:
                more = self.read(_CHUNK)
                if not more:
                    raise TarFormatError(url, self.base + len(buf), "truncated GNU sparse header", name or self.last)
                buf = buf[start:] + more  # only the unparsed rest is copied
                self.base += start
                pos -= start
                start = 0
            sparse += sparse_regions(buf[start : start + 504], 21, url, self.base + start, name)
            extended = buf[start + 504]
            start += BLOCK
            if len(sparse) > size + 1:  # every region but a last empty one holds data
                raise TarFormatError(url, self.base + start, "GNU sparse map has more regions than data", name)
        self.buf, self.pos = buf, pos
        return sparse, start

    def _data_past_buffer(self, start: int, size: int, padded_end: int, plain: bool, name: str) -> Any:
        """The ``size`` bytes of data at ``buf[start:]``, of which the buffer holds only a part (or
        not all of their padding, to ``padded_end``); the parse position moved past them. A
        ``plain`` regular member's data in a plain local file is left there (``ref``)."""
        buf, base = self.buf, self.base
        end = start + size
        if end > len(buf) and self.ref is not None and size >= self.ref_size and plain:
            assert self.skip is not None
            stream_pos = skip_member(self.skip, base + len(buf), base + start, size, self.url, name or self.last)
            data = self.ref(base + start, size)
            if self.fetch and type(data) is FileRange:
                data = fetch_range(data, base + start, self.url, name or self.last)
            self.chunk = SKIP_CHUNK
            self.buf, self.pos, self.base = b"", 0, stream_pos
            return data
        # the member (or its padding) runs past what is buffered: read on (a stream in whole chunks)
        data, self.buf, self.pos, self.base = _read_on(self.read, buf, base, start, end, padded_end, self.url,
                                                       name or self.last, 0 if self.skip is not None else _CHUNK)
        return data

    def _extension(self, typeflag: int, data: Any, offset: int) -> None:
        """Keep what a GNU long name or long link, or a pax header, says of the entries after it."""
        if typeflag == LONGNAME:
            self.long_name = decode_name(cstr(data))
        elif typeflag == LONGLINK:
            self.long_link = decode_name(cstr(data))
        elif typeflag == PAX:
            self.pax = parse_pax(data, self.url, offset)
        else:
            self.pax_global.update(parse_pax(data, self.url, offset))
            self.pax_global.pop("size", None)

    def _link_data(self, typeflag: int, name: str, offset: int, block: bytes) -> tuple[Any, bool]:
        """``(data, read again)`` of a link without data of its own: its target's bytes, from the
        recent members or read again from the file; ``(None, False)`` for a symbolic link left
        out (said, and watched for); a ``LinkError`` for a hard link (or, strict, any) without."""
        url = self.url
        target = link_name(self.long_link, self.pax, block)
        resolved = link_target(typeflag, name, target)
        found = self.recent.find(resolved) if resolved is not None else None
        reread = False
        if found is None and resolved is not None:
            if self.rereader is False:
                self.rereader = _rereader(self.stream, self.base + len(self.buf), self.max_member_size)
            if self.rereader is not None:
                found = self.rereader(resolved, offset)
                reread = found is not None  # bytes of its own: charged to the cache as a member's
        if found is None:
            kind = "hard link" if typeflag == ord("1") else "symbolic link"
            why = ("it leaves the archive" if resolved is None else
                   "no earlier member of this shard has that name" +
                   ("" if self.rereader else f" within the last {self.recent.limit >> 20} MiB read"))
            if typeflag == ord("1") or self.links == "strict":  # a hard link's data would be lost
                raise LinkError(url, offset, f"{kind} {name!r} -> {target!r}: {why} (--links skip skips links)",
                                name)
            # a symbolic link carries no data: to a directory, dangling, or to a later member (counted
            # with the links skipped)
            link_warning(self.stats, f"{url}: symbolic link {name!r} -> {target!r} at byte {offset} left out: {why}")
            if resolved is not None:
                self.watched[split_key(resolved) if self.keyed else resolved] = (
                    f"{url}: the target of symbolic link {name!r} -> {target!r} is a later member (at byte ",
                    "): the link was left out, as a stream can't look ahead (GNU tar would extract it)")
        elif typeflag == ord("2") and resolved is not None:
            self.watched[split_key(resolved) if self.keyed else resolved] = (
                f"{url}: {resolved!r} comes again (at byte ",
                f") after symbolic link {name!r} -> {target!r} was read as its earlier bytes (GNU tar's "
                "extracted link would read the later)")
        return found, reread


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
        more = read(min(max(pad_end - stream_pos, whole), PIECE))
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
