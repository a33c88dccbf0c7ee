"""Shard indexes and random access: sample key -> byte offset, size and fields.

``build_index(url)`` streams a plain (uncompressed) tar shard once through the core reader and
groups its members by the same rules as ``read_samples`` (key rule, ``__name__`` metadata skipped,
duplicate fields and reappearing keys are errors unless ``dup`` says otherwise). The result, a
``ShardIndex``, is written in one of three formats:

``tarproc`` (default name ``SHARD.idx``, e.g. ``train-0000.tar.idx``): JSON Lines, version 1. The
first line is a header ``{"format": "tarproc-index", "version": 1, "shard": NAME, "size": BYTES,
"samples": N}`` (NAME is the shard's base name, BYTES its size, which tells a stale index); then one
line per sample, in shard order::

    {"key": "a/001", "offset": 0, "size": 2048, "fields": {"cls": [512, 1], "jpg": [1536, 300]}}

``offset`` is where the sample's bytes begin (just after the previous regular member: its first
member's GNU long-name or pax headers, and any directory entries before it, are included) and
``size`` runs to the end of its last member's padding, so ``[offset, offset + size)`` is a
self-contained piece of tar. ``fields`` maps each field to ``[data_offset, data_size]`` (the data
starts one 512-byte header after the member's own header). A sample whose member names differ from
``KEY.FIELD`` (upper-case extensions) adds ``"names": {field: member_name}``.

``dali``: the ``v1.2`` index of DALI's ``wds2idx`` (``fn.readers.webdataset(index_paths=...)``),
one line per sample of ``EXT DATA_OFFSET SIZE NAME`` groups; byte-identical to what ``wds2idx``
writes for a shard of plain ustar members. Unlike ``wds2idx`` it gives the right offsets for
members with long (GNU or pax) names and leaves out metadata and key-less members.

``wids``: webdataset's ``wids-shard-index-v1`` JSON for a list of shards (url, nsamples, filesize).

``IndexedShard(url)`` gives random access to one shard by position or key, reading only the byte
ranges of the fields asked for (``os.pread`` on a local file, range requests through fsspec for
URLs), and checks every header it reads, so a stale index raises ``TarFormatError`` instead of
returning wrong bytes.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, TypeGuard

from .compression import detect
from .errors import CompressedShardError, IndexFileError, OptionError, SourceError, TarFormatError, TarprocError
from .samples import Sample, group_keyed
from .sources import is_fsspec_url, local_path, open_source
from .tario import BLOCK, DEFAULT_MAX_MEMBER_SIZE, ReadStats, iter_members, split_key

INDEX_FORMAT = "tarproc-index"
INDEX_VERSION = 1
FORMATS = ("tarproc", "dali", "wids")
DALI_VERSION = "v1.2"
_COMPRESSED_SUFFIXES = (".tgz", ".gz", ".zst", ".zstd", ".bz2", ".xz")


class IndexEntry(NamedTuple):
    """One sample of a shard index (see the module docstring for the meaning of the numbers)."""

    key: str
    offset: int
    size: int
    fields: dict[str, tuple[int, int]]  # field -> (data_offset, data_size), in shard order
    names: dict[str, str] | None = None  # field -> member name, where it isn't KEY.FIELD

    def member_name(self, field: str) -> str:
        if self.names and field in self.names:
            return self.names[field]
        return f"{self.key}.{field}"


class ShardIndex:
    """The index of one shard: its base name, its size in bytes and its samples in order.

    >>> import io
    >>> from tarproc.tario import TarWriter
    >>> buf = io.BytesIO()
    >>> with TarWriter(buf) as w:
    ...     w.write_sample({"__key__": "a", "txt": b"hello", "cls": b"1"})
    >>> index = index_stream(io.BytesIO(buf.getvalue()), "s.tar")
    >>> index.entries[0]
    IndexEntry(key='a', offset=0, size=2048, fields={'cls': (512, 1), 'txt': (1536, 5)}, names=None)
    >>> print(index.dali_text(), end="")
    v1.2 1
    cls 512 1 a.cls txt 1536 5 a.txt
    """

    def __init__(self, shard: str, size: int, entries: list[IndexEntry]) -> None:
        self.shard = shard
        self.size = size
        self.entries = entries
        self._positions: dict[str, int] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def position(self, key: str) -> int:
        """The position of the sample with this key; ``KeyError`` when there is none."""
        if self._positions is None:
            self._positions = {e.key: i for i, e in enumerate(self.entries)}
        return self._positions[key]

    # -- formats --

    def jsonl_text(self) -> str:
        """The ``tarproc`` format (JSON Lines)."""
        header = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "shard": self.shard, "size": self.size,
                  "samples": len(self.entries)}
        lines = [json.dumps(header)]
        quoted: dict[str, str] = {}  # field names repeat on every line: encode each once
        for e in self.entries:
            parts = []
            for field, (offset, size) in e.fields.items():
                q = quoted.get(field)
                if q is None:
                    q = quoted[field] = json.dumps(field)
                parts.append(f"{q}:[{offset},{size}]")
            names = f',"names":{json.dumps(e.names, separators=(",", ":"))}' if e.names else ""
            lines.append(
                f'{{"key":{json.dumps(e.key)},"offset":{e.offset},"size":{e.size},"fields":{{{",".join(parts)}}}{names}}}'
            )
        return "\n".join(lines) + "\n"

    def dali_text(self, url: str | None = None) -> str:
        """DALI's ``v1.2`` index (``wds2idx``): ``EXT OFFSET SIZE NAME`` groups, a line per sample.

        DALI splits lines at white space, so a member name with white space can't be written.
        """
        if not self.entries:
            raise TarprocError("no samples: DALI's index format can't describe an empty shard", url)
        lines = [f"{DALI_VERSION} {len(self.entries)}"]
        for e in self.entries:
            parts = []
            for field, (offset, size) in e.fields.items():
                name = e.member_name(field)
                if name.split() != [name]:
                    raise TarprocError(
                        f"member {name!r} has white space in its name, which DALI's index format can't hold", url
                    )
                slash = name.rfind("/")
                ext = name[name.find(".", slash + 1) + 1 :]  # as written, not lower-cased (as wds2idx)
                parts.append(f"{ext} {offset} {size} {name}")
            lines.append(" ".join(parts))
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# building


class _Member(NamedTuple):
    """What the grouper carries for a member instead of its data."""

    name: str
    data_offset: int
    size: int
    start: int  # end of the previous regular member: where this member's extension headers begin


def _padded(size: int) -> int:
    return (size + BLOCK - 1) & ~(BLOCK - 1)


def index_stream(
    stream: Any,
    url: str | None,
    *,
    dup: str = "error",
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    stats: ReadStats | None = None,
    warn: Callable[[str], None] | None = None,
) -> ShardIndex:
    """Index a plain tar stream (see ``build_index``); the size is the bytes the stream held."""
    counter = _CountingReader(stream)

    def members() -> Iterator[tuple[str | None, str, Any, int]]:  # a _Member where read_samples has data
        prev_end = 0
        for name, data, offset in iter_members(counter, url, max_member_size=max_member_size, stats=stats):
            size = len(data)
            key, field = split_key(name)
            yield key, field, _Member(name, offset + BLOCK, size, prev_end), offset
            prev_end = offset + BLOCK + ((size + 511) & ~511)

    # the same grouping as read_samples: key rule, metadata, duplicates
    entries = [_entry(sample) for sample in group_keyed(members(), url, dup=dup, stats=stats, warn=warn)]
    return ShardIndex(_base_name(url or "-"), counter.bytes, entries)


def _entry(sample: Sample) -> IndexEntry:
    key = sample["__key__"]
    fields: dict[str, tuple[int, int]] = {}
    names: dict[str, str] = {}
    first: _Member | None = None
    last: _Member | None = None
    for field, member in sample.items():
        if field.startswith("__"):
            continue
        first = first or member
        last = member
        fields[field] = (member.data_offset, member.size)
        if member.name != f"{key}.{field}":
            names[field] = member.name
    assert first is not None and last is not None
    end = last.data_offset + _padded(last.size)
    return IndexEntry(key, first.start, end - first.start, fields, names or None)


class _CountingReader:
    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.bytes = 0

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.stream.read(n)
        self.bytes += len(data)
        return data


def build_index(
    url: str,
    *,
    dup: str = "error",
    max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    stats: ReadStats | None = None,
    warn: Callable[[str], None] | None = None,
) -> ShardIndex:
    """Index a shard by reading it once. Raises ``CompressedShardError`` for a compressed shard.

    ``dup``, ``stats`` and ``warn`` are as for ``read_samples``; damage raises ``TarFormatError``
    naming the shard and the byte offset.
    """
    check_random_access(url)
    if stats is not None:
        stats.shards += 1
    with open_source(url) as source:
        if source.compression is not None:
            raise compressed_error(url, source.compression)
        return index_stream(source, url, dup=dup, max_member_size=max_member_size, stats=stats, warn=warn)


def check_random_access(url: str) -> None:
    """Refuse stdin and ``pipe:``: an index is only useful for something that can be read again."""
    if url == "-" or url.startswith("pipe:"):
        raise OptionError(f"{url}: random access needs a file or a URL, not stdin or a pipe: command")


def compressed_error(url: str, kind: str) -> CompressedShardError:
    """The one-line error for a compressed shard, with the command that makes a plain copy."""
    return CompressedShardError(
        f"compressed ({kind}) shard: random access needs a plain tar; decompress it first "
        f"(tarcat {url} -o {_plain_name(url)})",
        url,
    )


def _plain_name(url: str) -> str:
    for suffix in _COMPRESSED_SUFFIXES:
        if url.endswith(suffix):
            stem = url[: -len(suffix)]
            return stem + ".tar" if suffix == ".tgz" or not stem.endswith(".tar") else stem
    return (url[:-4] if url.endswith(".tar") else url) + "-plain.tar"


def _base_name(url: str) -> str:
    return posixpath.basename(url.rstrip("/")) or url


def default_index_url(shard_url: str, fmt: str = "tarproc") -> str:
    """Where an index goes by default: ``SHARD.idx`` for ours; for ``dali`` the name ``wds2idx``
    picks (the shard's name up to the first dot of its base name, plus ``.idx``).

    >>> default_index_url("data/train-0001.tar"), default_index_url("data/train-0001.tar", "dali")
    ('data/train-0001.tar.idx', 'data/train-0001.idx')
    """
    if fmt == "dali":
        slash = shard_url.rfind("/")
        dot = shard_url.find(".", slash + 2)
        return (shard_url if dot < 0 else shard_url[:dot]) + ".idx"
    if fmt != "tarproc":
        raise OptionError(f"no per-shard index file for format {fmt!r}")
    return shard_url + ".idx"


def wids_descriptor(shards: Iterable[tuple[str, ShardIndex]], name: str | None = None) -> dict[str, Any]:
    """A ``wids-shard-index-v1`` descriptor for ``(url, index)`` pairs, as ``wids.ShardListDataset``
    reads it (relative URLs are resolved against the descriptor's own location)."""
    out: dict[str, Any] = {"__kind__": "wids-shard-index-v1", "wids_version": 1}
    if name:
        out["name"] = name
    out["shardlist"] = [{"url": url, "nsamples": len(index), "filesize": index.size} for url, index in shards]
    return out


# ---------------------------------------------------------------------------------------------
# loading


def parse_index(text: str, url: str | None = None) -> ShardIndex:
    """Parse the ``tarproc`` format; ``IndexFileError`` names the index and the line on any problem."""
    lines = text.splitlines()
    if not lines:
        raise IndexFileError("line 1: empty file, not a tarproc index", url)

    def fail(lineno: int, reason: str) -> IndexFileError:
        return IndexFileError(f"line {lineno}: {reason}", url)

    try:
        header = json.loads(lines[0])
    except ValueError:
        raise fail(1, "not a tarproc index (the first line is not JSON)") from None
    if not isinstance(header, dict) or header.get("format") != INDEX_FORMAT:
        raise fail(1, f"not a tarproc index (no \"format\": \"{INDEX_FORMAT}\" header)")
    version = header.get("version")
    if version != INDEX_VERSION:
        raise fail(1, f"index version {version!r} is not supported (this tarproc reads version {INDEX_VERSION})")
    size, count, shard = header.get("size"), header.get("samples"), header.get("shard")
    if not _is_count(size) or not _is_count(count) or not isinstance(shard, str):
        raise fail(1, "bad header: needs shard (a name), size and samples (counts)")
    if len(lines) - 1 != count:
        raise fail(len(lines), f"the header announces {count} samples but the file has {len(lines) - 1}")
    entries = []
    prev_end = 0
    seen: set[str] = set()
    for lineno, line in enumerate(lines[1:], start=2):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise fail(lineno, f"not JSON ({e.msg} at column {e.colno})") from None
        entry = _parse_entry(record)
        if isinstance(entry, str):
            raise fail(lineno, entry)
        if entry.offset < prev_end:
            raise fail(lineno, f"sample {entry.key!r} overlaps the one before it (offset {entry.offset})")
        prev_end = entry.offset + entry.size
        if prev_end > size:
            raise fail(lineno, f"sample {entry.key!r} ends at byte {prev_end}, past the shard's {size} bytes")
        if entry.key in seen:
            raise fail(lineno, f"key {entry.key!r} appears twice")
        seen.add(entry.key)
        entries.append(entry)
    return ShardIndex(shard, size, entries)


def _is_count(x: Any) -> TypeGuard[int]:
    return type(x) is int and x >= 0


def _parse_entry(record: Any) -> IndexEntry | str:
    """An entry, or what is wrong with the record."""
    if not isinstance(record, dict):
        return "a sample line must be a JSON object"
    key, offset, size, fields, names = (record.get(k) for k in ("key", "offset", "size", "fields", "names"))
    if not isinstance(key, str) or not key:
        return "bad or missing key"
    if not _is_count(offset) or not _is_count(size):
        return f"sample {key!r}: bad offset or size"
    if not isinstance(fields, dict) or not fields:
        return f"sample {key!r}: fields must be a non-empty object"
    if names is not None and not (isinstance(names, dict) and all(isinstance(v, str) for v in names.values())):
        return f"sample {key!r}: names must map fields to member names"
    out: dict[str, tuple[int, int]] = {}
    end = offset
    for field, value in fields.items():
        if not (isinstance(value, list) and len(value) == 2 and _is_count(value[0]) and _is_count(value[1])):
            return f"sample {key!r}: field {field!r} must be [data_offset, size]"
        data_offset, data_size = value
        if data_offset % BLOCK or data_offset < end + BLOCK or data_offset + data_size > offset + size:
            return f"sample {key!r}: field {field!r} lies outside the sample or out of order"
        end = data_offset + _padded(data_size)
        out[field] = (data_offset, data_size)
    return IndexEntry(key, offset, size, out, names or None)


def load_index(url: str) -> ShardIndex:
    """Read an index file (a path or any URL ``open_source`` takes) in the ``tarproc`` format."""
    with open_source(url) as source:
        chunks = []
        while chunk := source.read(1 << 20):
            chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise IndexFileError(f"line {line}: not UTF-8 text, not a tarproc index", url) from None
    return parse_index(text, url)


# ---------------------------------------------------------------------------------------------
# random access


class _Fragment:
    """A piece of a tar followed by two zero blocks, so that the core reader can check it."""

    def __init__(self, data: bytes) -> None:
        self.parts = [data, bytes(2 * BLOCK)]
        self.pos = 0

    def read(self, n: int = -1) -> bytes:
        if not self.parts:
            return b""
        head = self.parts[0]
        if n < 0 or n >= len(head) - self.pos:
            self.parts.pop(0)
            out = head[self.pos :] if self.pos else head
            self.pos = 0
            return out
        out = head[self.pos : self.pos + n]
        self.pos += n
        return out


class IndexedShard:
    """Random access to the samples of one plain tar shard, by position or by key.

    ``index`` is an index file (path or URL, ``tarproc`` format) or a ``ShardIndex``; by default
    ``SHARD.idx`` is used when it exists and matches the shard's size, and otherwise the shard is
    scanned once to build an index in memory. ``fields`` limits what is read to those fields (a
    sample lacking one is returned without it). Local files are read with ``os.pread`` on one
    descriptor (safe to share between threads); other URLs with fsspec range reads
    (``cat_file(path, start, end)``), never the whole file. Each read is checked with the core
    reader: a header that isn't there or names another member raises ``TarFormatError``.

    >>> import os, tempfile
    >>> from tarproc import TarWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "s.tar")
    >>> with open(path, "wb") as f, TarWriter(f) as w:
    ...     for i in range(3):
    ...         w.write_sample({"__key__": f"k{i}", "txt": f"text {i}", "cls": i})
    >>> with IndexedShard(path) as shard:
    ...     len(shard), shard[-1]["txt"], shard["k1"]["cls"], shard.get("k0", fields=["cls"])["cls"]
    (3, b'text 2', b'1', b'0')
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        index: str | os.PathLike[str] | ShardIndex | None = None,
        *,
        fields: Iterable[str] | None = None,
        dup: str = "error",
        max_member_size: int = DEFAULT_MAX_MEMBER_SIZE,
    ) -> None:
        self.url = url = os.fspath(url)
        check_random_access(url)
        self.fields = None if fields is None else list(fields)
        self.reads = 0  # read calls made on the shard, and bytes they returned
        self.bytes_read = 0
        self._fd: int | None = None
        self._fs: Any = None
        self._closed = False
        self._path = local_path(url)
        if self._path is not None:
            try:
                self._fd = os.open(self._path, os.O_RDONLY)
            except FileNotFoundError:
                raise SourceError("no such file", url) from None
            except OSError as e:
                raise SourceError(f"cannot open: {e.strerror}", url) from None
            size = os.fstat(self._fd).st_size
        else:
            self._fs, self._path = _url_to_fs(url)
            try:
                size = int(self._fs.size(self._path))
            except FileNotFoundError:
                raise SourceError("not found", url) from None
            except Exception as e:
                raise SourceError(f"cannot get its size: {_short(e)}", url) from None
        self.size = size
        try:
            kind = detect(self._read(0, min(8, size))) if size else None
            if kind is not None:
                raise compressed_error(url, kind)
            self.index = self._load(index, dup, max_member_size)
        except BaseException:
            self.close()
            raise

    def _load(self, index: str | os.PathLike[str] | ShardIndex | None, dup: str, max_member_size: int) -> ShardIndex:
        if isinstance(index, ShardIndex):
            if index.size != self.size:
                raise IndexFileError(_stale(index, self.size, self.url), None)
            return index
        if index is not None:
            index_url = os.fspath(index)
            loaded = load_index(index_url)
            if loaded.size != self.size:
                raise IndexFileError(_stale(loaded, self.size, self.url), index_url)
            return loaded
        sibling = default_index_url(self.url)
        if self._exists(sibling):
            loaded = load_index(sibling)
            if loaded.size == self.size:
                return loaded
        return build_index(self.url, dup=dup, max_member_size=max_member_size)

    def _exists(self, url: str) -> bool:
        if self._fs is None:
            return os.path.exists(local_path(url) or url)
        try:
            return bool(self._fs.exists(_url_to_fs(url)[1]))
        except Exception:
            return False

    # -- reading --

    def _read(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the shard, in one read where the system allows."""
        want = end - start
        if self._closed:
            raise ValueError(f"IndexedShard({self.url!r}) is closed")
        if self._fd is not None:
            parts = []
            got = 0
            while got < want:
                piece = os.pread(self._fd, want - got, start + got)
                if not piece:
                    break
                parts.append(piece)
                got += len(piece)
            data = parts[0] if len(parts) == 1 else b"".join(parts)
        else:
            try:
                data = bytes(self._fs.cat_file(self._path, start=start, end=end))
            except Exception as e:
                raise SourceError(f"range read of bytes {start}-{end} failed: {_short(e)}", self.url) from None
        self.reads += 1
        self.bytes_read += len(data)
        if len(data) != want:
            raise TarFormatError(
                self.url, start + min(len(data), want),
                f"asked for bytes {start}-{end} and got {len(data)} bytes (the shard changed since it was "
                "indexed, or the server ignores range requests)",
            )
        return data

    def sample(self, i: int, fields: Iterable[str] | None = None) -> Sample:
        """The sample at position ``i`` (negative counts from the end), with ``fields`` only if given."""
        n = len(self.index.entries)
        if not -n <= i < n:
            raise IndexError(f"sample {i} is out of range: {self.url} has {n} samples")
        entry = self.index.entries[i]
        wanted = self.fields if fields is None else list(fields)
        members = list(entry.fields.items())
        # each member's bytes begin where the previous one's padding ends (extension headers too)
        starts = [entry.offset] + [off + _padded(size) for _, (off, size) in members[:-1]]
        take = [wanted is None or field in wanted for field, _ in members]
        sample: Sample = {"__key__": entry.key, "__url__": self.url}
        j = 0
        while j < len(members):
            if not take[j]:
                j += 1
                continue
            k = j
            while k + 1 < len(members) and take[k + 1]:
                k += 1
            # one read for each run of adjacent members asked for
            start = starts[j]
            end = members[k][1][0] + _padded(members[k][1][1])
            self._check(entry, members[j : k + 1], start, self._read(start, end), sample)
            j = k + 1
        return sample

    def _check(
        self, entry: IndexEntry, members: list[tuple[str, tuple[int, int]]], start: int, data: bytes, sample: Sample
    ) -> None:
        """Parse ``data`` (shard bytes from ``start``) with the core reader; each member the index
        names must be there, with its name and size, or the index doesn't describe this shard."""
        expected = {off - BLOCK: (field, size) for field, (off, size) in members}
        found: dict[int, tuple[str, bytes]] = {}
        try:
            for name, value, offset in iter_members(_Fragment(data), self.url):
                found[start + offset] = (name, value)
        except TarFormatError as e:
            raise TarFormatError(
                self.url, start + e.offset, f"{e.reason} where the index puts sample {entry.key!r}; " + _REBUILD, e.member
            ) from None
        for header, (field, size) in expected.items():
            name = entry.member_name(field)
            got = found.get(header)
            if got is None or got[0] != name or len(got[1]) != size:
                what = "no member there" if got is None else f"member {got[0]!r} of {len(got[1])} bytes"
                raise TarFormatError(
                    self.url, header, f"expected member {name!r} of {size} bytes, found {what}; " + _REBUILD
                )
            sample[field] = got[1]

    def get(self, key: str, fields: Iterable[str] | None = None) -> Sample:
        """The sample with this key; ``KeyError`` when there is none."""
        try:
            i = self.index.position(key)
        except KeyError:
            raise KeyError(f"no sample with key {key!r} in {self.url}") from None
        return self.sample(i, fields)

    def keys(self) -> list[str]:
        return [e.key for e in self.index.entries]

    def __len__(self) -> int:
        return len(self.index.entries)

    def __getitem__(self, item: int | str) -> Sample:
        if isinstance(item, str):
            return self.get(item)
        return self.sample(item)

    def __contains__(self, key: object) -> bool:
        try:
            self.index.position(key)  # type: ignore[arg-type]
        except (KeyError, TypeError):
            return False
        return True

    def __iter__(self) -> Iterator[Sample]:
        for i in range(len(self.index.entries)):
            yield self.sample(i)

    def close(self) -> None:
        self._closed = True
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> IndexedShard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"IndexedShard({self.url!r}, {len(self)} samples)"


_REBUILD = "was the shard changed after it was indexed? rebuild the index (tarindex)"


def _stale(index: ShardIndex, size: int, url: str) -> str:
    return (
        f"stale index: made for a shard of {index.size} bytes ({index.shard}), but {url} has {size} bytes; "
        "rebuild it with tarindex"
    )


def _url_to_fs(url: str) -> tuple[Any, str]:
    if not is_fsspec_url(url):
        raise OptionError(f"{url}: not a file path or URL")
    try:
        import fsspec

        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise SourceError(f"no filesystem for this URL ({_short(e)})", url) from None
    except Exception as e:
        raise SourceError(f"cannot open: {_short(e)}", url) from None
    return fs, path


def _short(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def index_bytes(index: ShardIndex, fmt: str, url: str | None = None) -> bytes:
    """The index in a per-shard format (``tarproc`` or ``dali``) as bytes to write."""
    if fmt == "tarproc":
        text = index.jsonl_text()
    elif fmt == "dali":
        text = index.dali_text(url)
    else:
        raise OptionError(f"bad index format {fmt!r}; per-shard formats are tarproc and dali")
    return text.encode("utf-8", "surrogateescape")


__all__ = [
    "FORMATS",
    "INDEX_FORMAT",
    "INDEX_VERSION",
    "CompressedShardError",
    "IndexEntry",
    "IndexFileError",
    "IndexedShard",
    "ShardIndex",
    "build_index",
    "default_index_url",
    "index_bytes",
    "index_stream",
    "load_index",
    "parse_index",
    "wids_descriptor",
]
