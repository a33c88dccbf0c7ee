"""Writing tar archives: ``TarWriter`` (deterministic headers, GNU long names, end blocks and record
padding), the sample-to-members rules (``sample_members``, ``check_key``, ``encode_value``) and
``ends_at_member``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol
from zlib import adler32

from ..errors import SampleError
from .headers import BLOCK, NO_DATA_TYPES, RECORD, ZERO_BLOCK, block_sum, parse_number, short_sum, signed_sum
from .ranges import FileRange, MemberData

# the C fast path of the writer (_pack; _pack_samples and _members for sample_members); the Python
# code here is the reference. TARPROC_PURE_PYTHON=1 turns it off, and so does setting _pack to None
# (the tests do, to compare the two).
_pack: Any = None
_pack_samples: Any = None
_members: Any = None
if not os.environ.get("TARPROC_PURE_PYTHON"):
    try:
        from .._speedups import members as _members  # type: ignore[no-redef]
        from .._speedups import pack as _pack  # type: ignore[no-redef]
        from .._speedups import pack_samples as _pack_samples  # type: ignore[no-redef]
    except ImportError:  # pragma: no cover - built by pip install; absent only without a compiler
        _pack = _pack_samples = _members = None

_GATHER = 1 << 20  # the writer gathers small pieces in a buffer of this size, written when full
_DIRECT_WRITE = 1 << 16  # member data at least this big is written as it is, not copied

# what _pack says about where it stopped (see pack in _speedups.c)
_PACK_DONE, _PACK_FULL, _PACK_PYTHON, _PACK_BIG, _PACK_RAISED = 0, 1, 2, 3, 4
_OCTAL_12 = 8**11  # sizes below this fit a 12-byte octal field
_NO_PREFIX = bytes(BLOCK - 345)  # an empty ustar prefix field and the header's last 12 bytes

if _pack is not None:
    from .._speedups import set_range_type

    set_range_type(FileRange)  # the C writer passes FileRange data on as it does big data


class Writable(Protocol):
    """What ``TarWriter`` writes to: anything with a binary ``write``."""

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
            chksum += short_sum(prefix)
        return b"".join(
            (
                name.ljust(100, b"\x00"),
                self._mode_ids,
                size_field,
                self._mtime_field,
                b"%06o\x00 " % chksum,  # adler32's low 16 bits: 1 + byte sum (see short_sum)
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
        stored = parse_number(chk)
        if stored is None or stored not in (block_sum(block) - sum(chk) + 256,
                                            signed_sum(block) - signed_sum(chk) + 256):
            return False
        size = parse_number(block[124:136])
        if size is None or size < 0:
            return False
        pos += BLOCK + (0 if block[156] in NO_DATA_TYPES else (size + 511) & ~511)
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
