"""Member data left in a plain local file: ``FileRange`` (handed out with ``refs``), ``Unread`` (sizes
only, for indexing), and the stream probes the reader uses to skip data rather than read it.

A stream is a plain local file when it has ``file_origin()`` (the file and the offset of its next
byte) and ``skipper()`` (a function moving it on without reading); ``sources.Source`` has both.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import Any

from ..errors import SourceError, TarFormatError
from .headers import BLOCK

PIECE = 16 << 20  # large member data is read in pieces of at most this many bytes
_preadv = getattr(os, "preadv", None)  # reads into a buffer (not on macOS)

SKIP_CHUNK = 4 << 10  # read size when data is skipped: a header, and the small members after it


class FileRange:
    """Member data left where it is in a plain local file, not read (the reader's ``refs``): ``size``
    bytes at ``offset`` of ``file`` (an open ``io.FileIO``, or the reader's ``HeldFile``). ``len`` is
    the size. A writer copies it file to file in the kernel (``Sink.write_range``: ``os.sendfile``);
    what must see the bytes (compression, sha256, a decoder) reads them (``read``, ``read_into``).

    The reader's ranges hold their file open (``HeldFile``): a range is valid for as long as it is
    held, after its stream is closed too (in a shuffle buffer), and reads the file it came from even
    if another file has taken its name since. A range on a file that gets closed raises
    ``ValueError`` -- never another file's bytes."""

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

    def read_into(self, buffer: bytearray) -> memoryview:
        """The bytes read into ``buffer`` (at least ``size`` long; used again by the caller): a view
        of its first ``size`` bytes -- for a range kept a while (a shuffle buffer): a file modified
        since its reader made the range (its mtime), or that no longer holds the bytes, is a
        ``SourceError``, not other bytes."""
        if type(self.file) is HeldFile and self.file.changed():
            raise SourceError(f"the file was modified after its member headers were read (member data of {self.size} "
                              f"bytes at byte {self.offset} not read yet); shards must not change while read: write "
                              "a new file and rename it over the old one", self.url)
        view = memoryview(buffer)[: self.size]
        fd, got = self.fileno(), 0
        while got < self.size:
            part = view[got : got + PIECE]
            if _preadv is not None:
                n = _preadv(fd, [part], self.offset + got)
            else:  # no preadv (macOS): a read, then a copy
                data = os.pread(fd, len(part), self.offset + got)
                n = len(data)
                part[:n] = data
            if not n:
                raise self.shrank(self.offset + got)
            got += n
        return view

    def read_available(self) -> bytes:
        """The bytes, fewer where the file now ends before their end."""
        fd, parts, at, end = self.fileno(), [], self.offset, self.offset + self.size
        while at < end:
            piece = os.pread(fd, min(end - at, PIECE), at)
            if not piece:
                break
            parts.append(piece)
            at += len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def shrank(self, at: int) -> SourceError:
        """The error for a file whose reads stopped at ``at``, before the end of this data: it was cut
        since (the error says where it ends now, which may be before the data's start)."""
        try:
            at = min(at, os.fstat(self.fileno()).st_size)
        except (OSError, ValueError):
            pass
        return SourceError(f"the file ends at byte {at}, short of member data that was there when it was read "
                           f"({self.size} bytes at byte {self.offset}); was it changed while being read?", self.url)


class HeldFile:
    """The reader's own handle on a local file, shared by the ranges (``FileRange``) of one stream: a
    duplicate of the stream's descriptor, closed when the last range on it is gone (not with the
    stream). ``held_files()`` says how many are open in this process: each is a descriptor, so a
    reader that keeps many ranges (a shuffle buffer) reads the data instead past a limit."""

    __slots__ = ("fd", "mtime", "__weakref__")

    def __init__(self, fd: int) -> None:
        self.fd = os.dup(fd)
        self.mtime = os.fstat(self.fd).st_mtime_ns
        _HELD.add(self)

    def fileno(self) -> int:
        return self.fd

    def changed(self) -> bool:
        """Whether the file was modified since this handle was made (its mtime moved)."""
        return os.fstat(self.fd).st_mtime_ns != self.mtime

    def __del__(self) -> None:
        fd = getattr(self, "fd", None)  # None: os.dup failed
        if fd is not None:
            os.close(fd)


_HELD: weakref.WeakSet[HeldFile] = weakref.WeakSet()  # the open ones: a set, not a count, so threads can't skew it


def held_files() -> int:
    """How many ``HeldFile`` handles are open in this process."""
    return len(_HELD)


MemberData = bytes | bytearray | memoryview | FileRange  # what the writer writes as a member's data


def file_origin(stream: Any) -> tuple[Any, int] | None:
    """For a stream that is a plain local file (``Source.file_origin``): the file, and the file
    offset of the stream's next byte; else None."""
    where = getattr(stream, "file_origin", None)
    return where() if where is not None else None  # type: ignore[no-any-return]


def range_maker(stream: Any, url: str | None) -> Callable[[int, int], FileRange | bytes] | None:
    """For ``refs``: a function making the ``FileRange`` of (stream offset, size) where the stream
    is a plain local file that can be skipped in (``file_origin``), else None. The ranges share a
    ``HeldFile``, made now: they stay valid as long as they are held. Where no descriptor is to be
    had for it, the data is read instead (``fetcher``)."""
    found = file_origin(stream)
    if found is None:
        return None
    file, origin = found
    try:
        held = HeldFile(file.fileno())
    except OSError:  # no descriptor to spare (EMFILE): the data is read, as without refs
        fetch = fetcher(stream, url)
        assert fetch is not None  # the stream is a local file: file_origin said so

        def read(offset: int, size: int) -> bytes:
            data = fetch(offset, size)  # where the file is short of it, the reader's skip says so
            return data.read_available() if isinstance(data, FileRange) else data

        return read
    return lambda offset, size: FileRange(held, origin + offset, size, url)


def fetcher(stream: Any, url: str | None) -> Callable[[int, int], bytes | FileRange] | None:
    """For fetch: a function reading the data at (stream offset, size) at once, with one pread
    into a bytes object of its own, where the stream is a plain local file (``range_maker``), else
    None. Where the file ends before the data's end (a damaged size field must not make it
    allocate what the header claims), or that read gives fewer bytes, or the data is over
    ``PIECE`` (one read can't give 2 GiB), it gives their ``FileRange`` instead: the reader then
    moves past the data, and reads it in pieces (``fetch_range``) or calls it truncated."""
    found = file_origin(stream)
    if found is None:
        return None
    file, origin = found
    fd, pread = file.fileno(), os.pread
    file_size = os.fstat(fd).st_size

    def fetch(offset: int, size: int) -> bytes | FileRange:
        nonlocal file_size
        at = origin + offset
        if size > PIECE:
            return FileRange(file, at, size, url)
        if at + size > file_size:
            file_size = os.fstat(fd).st_size  # a file written as it is read may have grown
            if at + size > file_size:
                return FileRange(file, at, size, url)
        data = pread(fd, size, at)
        return data if len(data) == size else FileRange(file, at, size, url)

    return fetch


class Unread:
    """In place of the data of a member that was skipped, not read (``skip_data``): its ``len`` is
    the member's size; it has no bytes."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def make_unread(offset: int, size: int) -> Unread:
    """The ``ref`` of a reader that only needs sizes (``MemberScan``): an ``Unread``."""
    return Unread(size)


def stream_skipper(stream: Any) -> Callable[[int], int] | None:
    """The stream's ``skipper()`` (``n`` bytes forward, unread; returns how many it moved): a
    plain local file has one (``sources.Source.skipper``); None for anything else."""
    make = getattr(stream, "skipper", None)
    return make() if make is not None else None  # type: ignore[no-any-return]


def with_data(item: tuple[Any, ...], data: Any) -> tuple[Any, ...]:
    """A scanner's item, ``(name, data, offset)`` or ``(key, field, data, offset)``, with other data."""
    return (*item[:-2], data, item[-1])


def fetch_range(data: FileRange, start: int, url: str | None, name: str | None) -> bytes:
    """The bytes of member data left in the file (``fetch``), read at once; ``start``: the stream
    offset of the data. The seek past it found the file long enough; a shorter read means that the
    file was cut since: the ``TarFormatError`` that reading the same bytes as a stream gives."""
    got = data.read_available()
    if len(got) < data.size:
        raise TarFormatError(url, start + len(got), f"truncated member data (expected {data.size} bytes, got "
                             f"{len(got)})", name)
    return got


def fetched_item(item: tuple[Any, ...], url: str | None, name: str | None) -> tuple[Any, ...]:
    """A scanner's item with its ``FileRange`` read (``fetch_range``): the same item with the bytes."""
    return with_data(item, fetch_range(item[-2], item[-1] + BLOCK, url, name))


def skip_member(skip: Callable[[int], int], stream_pos: int, start: int, size: int, url: str | None,
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
