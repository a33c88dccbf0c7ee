"""Shard indexes and random access: sample key -> byte offset, size and fields.

``build_index(url)`` streams a plain (uncompressed) tar shard once through the core reader and
groups its members by the same rules as ``read_samples`` (key rule, ``__name__`` metadata skipped,
duplicate fields and reappearing keys are errors unless ``dup`` says otherwise). A member whose
bytes don't lie after its header (a followed link, a sparse file) can't be read at random: a
``LinkError`` naming it, unless ``links="skip"`` leaves links out. The result, a ``ShardIndex``,
is written in one of three formats:

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

Other tools' index files are told apart by content (``index_kind``): DALI's, wids', and
megatron-energon's binary ``SHARD.tar.idx`` (``EnergonIndex``: the name ours takes). Read as a
tarproc index, one is a ``ForeignIndexError``; found beside a shard, ``IndexedShard`` indexes the
shard in memory instead; ``check_index_file`` checks any of them against its shard.

``IndexedShard(url)`` gives random access to one shard by position or key, reading only the byte
ranges of the fields asked for (``os.pread`` on a local file, range requests through fsspec for
URLs), and checks every header it reads against the index. An index made for another size of shard
is stale: an ``IndexFileError`` naming both files and the ``tarindex`` command that rebuilds it,
unless ``stale="rebuild"`` asks for a scan in memory (with one warning). A shard rewritten at the
same size, or a damaged index, is an ``IndexFileError`` naming the byte where they disagree, on
the first read there: never wrong bytes under a key.
"""

from __future__ import annotations

import array
import json
import os
import posixpath
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, NamedTuple, TypeGuard

from .compression import detect
from .errors import (
    CompressedShardError,
    DataWarning,
    IndexFileError,
    LinkError,
    OptionError,
    SourceError,
    TarFormatError,
    TarprocError,
    warner,
)
from .samples import Sample, group_keyed
from .sources import Network, is_fsspec_url, local_path, open_source, read_to_end
from .sources.remote import url_to_fs
from .tar import (
    BLOCK,
    MemberScan,
    ReadPolicy,
    ReadStats,
    file_origin,
    iter_members,
    split_key,
    stream_skipper,
)
from .tar.policy import SAMPLE_FIELDS, policy_with_keywords

# The C fast paths (tarproc/_speedups.c): the builder for plain local shards (_index_file), which
# hands every other shard to index_stream's Python code, and the tarproc format's lines
# (_jsonl_lines); the Python code is the reference. TARPROC_PURE_PYTHON=1 turns them off, and the
# tests set them to None to compare.
_index_file: Any = None
_jsonl_lines: Any = None
if not os.environ.get("TARPROC_PURE_PYTHON"):
    try:
        from ._speedups import index_file as _index_file  # type: ignore[no-redef]
        from ._speedups import jsonl_lines as _jsonl_lines  # type: ignore[no-redef]
    except ImportError:  # pragma: no cover - built by pip install; absent only without a compiler
        _index_file = _jsonl_lines = None

INDEX_FORMAT = "tarproc-index"
INDEX_VERSION = 1
FORMATS = ("tarproc", "dali", "wids")
STALE_POLICIES = ("error", "rebuild")  # IndexedShard(stale=...): what a stale index file gives
DALI_VERSION = "v1.2"
COMPRESSED_SUFFIXES = (".tgz", ".gz", ".zst", ".zstd", ".bz2", ".xz")


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
    >>> from tarproc.tar import TarWriter
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
        return self.jsonl_bytes().decode("ascii")

    def jsonl_bytes(self) -> bytes:
        """The ``tarproc`` format, as the bytes of a file (JSON escapes all but ASCII)."""
        header = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "shard": self.shard, "size": self.size,
                  "samples": len(self.entries)}
        lines = _jsonl_lines(self.entries, encode_basestring_ascii) if _jsonl_lines is not None else None
        if lines is None:
            lines = self._jsonl_lines().encode("ascii")
        return (json.dumps(header) + "\n").encode("ascii") + lines

    def _jsonl_lines(self) -> str:
        """A line per sample (the reference of ``_speedups.jsonl_lines``)."""
        lines = []
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
                f'{{"key":{json.dumps(e.key)},"offset":{e.offset},"size":{e.size},"fields":{{{",".join(parts)}}}{names}}}\n'
            )
        return "".join(lines)

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


_NO_LINKS = ReadPolicy(links="skip")  # an index lists no link: refused when built, or left out
_NO_LINKS_ZEROS = ReadPolicy(links="skip", ignore_zeros=True)


def _padded(size: int) -> int:
    return (size + BLOCK - 1) & ~(BLOCK - 1)


def index_stream(
    stream: Any,
    url: str | None,
    *,
    policy: ReadPolicy = ReadPolicy(),
    stats: ReadStats | None = None,
    warn: Callable[[str], None] | None = None,
    **old: Any,
) -> ShardIndex:
    """Index a plain tar stream (see ``build_index``); the size is the bytes the stream held."""
    policy = policy_with_keywords(policy, old, SAMPLE_FIELDS, "index_stream")
    if not policy.ignore_zeros:
        index = _index_local_file(stream, url, policy.max_member_size, stats)
        if index is not None:
            return index
    counter = _CountingReader(stream)
    # only sizes are needed: on a local file, data the reader hasn't buffered is skipped
    scan = MemberScan(counter, url, policy=policy, stats=stats)

    def members() -> Iterator[tuple[str | None, str, Any, int]]:  # a _Member where read_samples has data
        prev_end = 0
        for name, data, offset in scan:
            size = len(data)
            key, field = split_key(name)
            yield key, field, _Member(name, offset + BLOCK, size, prev_end), offset
            prev_end = offset + BLOCK + _padded(size)

    # the same grouping as read_samples: key rule, metadata, duplicates
    samples = group_keyed(members(), url, dup=policy.dup, stats=stats, warn=warn)
    # a followed link (its target's bytes) or a sparse file: the scan says, before the member comes
    entries = [_entry(sample, scan.not_in_place, url) for sample in samples]
    return ShardIndex(_base_name(url or "-"), counter.bytes, entries)


def _index_local_file(stream: Any, url: str | None, max_member_size: int, stats: ReadStats | None) -> ShardIndex | None:
    """The index of a plain local file by the C builder, which reads only its headers (pread, from
    where the stream stands, which it leaves there); None where it is not built, the stream is not
    such a file, or the shard has anything but regular members with keys (GNU long names and pax
    paths included), directories and a proper end (links, sparse files, pax sizes, metadata,
    duplicates, damage): the Python builder then indexes it."""
    found = file_origin(stream) if _index_file is not None else None
    if found is None:
        return None
    file, origin = found
    got = _index_file(file.fileno(), origin, min(max_member_size, 1 << 62), IndexEntry)
    if got is None:
        return None
    entries, size, members, nbytes, directories = got
    if stats is not None:
        stats.members += members
        stats.bytes += nbytes
        stats.samples += len(entries)
        if directories:
            stats.skipped_entries["directory"] = stats.skipped_entries.get("directory", 0) + directories
    return ShardIndex(_base_name(url or "-"), size, entries)


def _entry(sample: Sample, not_in_place: set[int], url: str | None) -> IndexEntry:
    key = sample["__key__"]
    fields: dict[str, tuple[int, int]] = {}
    names: dict[str, str] = {}
    first: _Member | None = None
    last: _Member | None = None
    for field, member in sample.items():
        if field.startswith("__"):
            continue
        if member.data_offset - BLOCK in not_in_place:
            raise _not_in_place(url, member.data_offset - BLOCK, member.name)
        first = first or member
        last = member
        fields[field] = (member.data_offset, member.size)
        if member.name != f"{key}.{field}":
            names[field] = member.name
    assert first is not None and last is not None
    end = last.data_offset + _padded(last.size)
    return IndexEntry(key, first.start, end - first.start, fields, names or None)


def _not_in_place(url: str | None, header: int, name: str) -> LinkError:
    """The error for a member whose bytes don't lie after its header: random access can't read it."""
    return LinkError(
        url, header,
        f"member {_show(name)} is a link or a sparse file, not bytes stored in place, which random access "
        f"needs; index a copy that stores them (tarcat {url} -o {_plain_name(url or '-')}), or leave links out "
        "(tarindex --links skip)",
        name,
    )


class _CountingReader:
    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.bytes = 0

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.stream.read(n)
        self.bytes += len(data)
        return data

    def skipper(self) -> Callable[[int], int] | None:
        """The stream's skipper (a plain local file: data is skipped, not read), counting."""
        skip = stream_skipper(self.stream)
        if skip is None:
            return None

        def counted(n: int) -> int:
            moved: int = skip(n)
            self.bytes += moved
            return moved

        return counted


def build_index(
    url: str,
    *,
    policy: ReadPolicy = ReadPolicy(),
    stats: ReadStats | None = None,
    warn: Callable[[str], None] | None = None,
    **old: Any,
) -> ShardIndex:
    """Index a shard by reading it once. Raises ``CompressedShardError`` for a compressed shard.

    Damage raises ``TarFormatError`` naming the shard and the byte offset. A member whose bytes
    aren't stored in place (a followed link, a sparse file) can't be read at random: ``LinkError``
    naming it, unless ``links="skip"`` leaves links out.

    Args:
        url: the shard: a path or a URL that can be read at random (not stdin or ``pipe:``).
        policy: how to read it (``ReadPolicy``; its ``on_error`` is the caller's to apply). The
            policy's keywords given directly (``dup=`` ...) still work, deprecated.
        stats: counters to fill in (``ReadStats``).
        warn: a callback that takes each warning instead (default: ``warnings.warn`` with a
            ``DataWarning``, see ``tarproc.errors.warn``).
    """
    policy = policy_with_keywords(policy, old, SAMPLE_FIELDS, "build_index")
    check_random_access(url)
    if stats is not None:
        stats.shards += 1
    with open_source(url) as source:
        if source.compression is not None:
            raise compressed_error(url, source.compression)
        return index_stream(source, url, policy=policy, stats=stats, warn=warn)


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
    for suffix in COMPRESSED_SUFFIXES:
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
    """Parse the ``tarproc`` format; ``IndexFileError`` names the index and the line on any problem.

    Whatever the text holds (numbers of any length, deep nesting, NaN, wrong types, offsets that
    overlap or run past the shard, member names that don't belong to their key), the outcome is a
    ``ShardIndex`` or ``IndexFileError``, never another exception.
    """
    lines = text.split("\n")  # not splitlines(): it also splits at U+2028, \x1c, ... inside a line
    if lines[-1] == "":
        lines.pop()
    if not lines:
        raise IndexFileError("line 1: empty file, not a tarproc index", url)

    def fail(lineno: int, reason: str) -> IndexFileError:
        return IndexFileError(f"line {lineno}: {reason}", url)

    header = _json_line(lines[0])
    if isinstance(header, _NotJSON):
        raise fail(1, f"not a tarproc index (the first line is not JSON: {header.reason})")
    if not isinstance(header, dict) or header.get("format") != INDEX_FORMAT:
        raise fail(1, f"not a tarproc index (no \"format\": \"{INDEX_FORMAT}\" header)")
    version = header.get("version")
    if version != INDEX_VERSION:
        raise fail(1, f"index version {_show(version)} is not supported (this tarproc reads version {INDEX_VERSION})")
    size, count, shard = header.get("size"), header.get("samples"), header.get("shard")
    if not _is_count(size) or not _is_count(count) or not isinstance(shard, str):
        raise fail(1, "bad header: needs shard (a name), size and samples (counts)")
    if len(lines) - 1 != count:
        raise fail(len(lines), f"the header announces {count} samples but the file has {len(lines) - 1}")
    entries = []
    prev_end = 0
    seen: set[str] = set()
    plain_fields: set[str] = set()
    for lineno, line in enumerate(lines[1:], start=2):
        record = _json_line(line)
        if isinstance(record, _NotJSON):
            raise fail(lineno, f"not JSON ({record.reason})")
        entry = _parse_entry(record, plain_fields)
        if isinstance(entry, str):
            raise fail(lineno, entry)
        if entry.offset < prev_end:
            raise fail(lineno, f"sample {_show(entry.key)} overlaps the one before it (offset {entry.offset})")
        prev_end = entry.offset + entry.size
        if prev_end > size:
            raise fail(lineno, f"sample {_show(entry.key)} ends at byte {prev_end}, past the shard's {size} bytes")
        if entry.key in seen:
            raise fail(lineno, f"key {_show(entry.key)} appears twice")
        seen.add(entry.key)
        entries.append(entry)
    return ShardIndex(shard, size, entries)


class _NotJSON(NamedTuple):
    reason: str


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number an index holds")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def _json_line(line: str) -> Any:
    """The JSON value of one line, or ``_NotJSON`` saying why there is none.

    ``json.loads`` raises more than ``JSONDecodeError``: ``ValueError`` for an integer over 4300
    digits and ``RecursionError`` for deep nesting; NaN and Infinity it accepts, an index never has.
    """
    try:
        return _DECODER.decode(line)
    except json.JSONDecodeError as e:
        return _NotJSON(f"{e.msg} at column {e.colno}")
    except RecursionError:
        return _NotJSON("nested too deeply")
    except ValueError as e:  # the int limit (sys.set_int_max_str_digits) or a constant
        return _NotJSON("a number with too many digits" if "digits" in str(e) else _short(e))


# Offsets and sizes past this can't be in a file (off_t); bounding them also keeps every number
# this module prints well under Python's 4300-digit limit for int -> str.
_MAX_COUNT = (1 << 63) - 1


def _is_count(x: Any) -> TypeGuard[int]:
    return type(x) is int and 0 <= x <= _MAX_COUNT


def _show(value: Any, limit: int = 80) -> str:
    """A value for a message: repr of a short string or number, else its type (never a huge repr)."""
    if isinstance(value, str) or type(value) in (int, float, bool) or value is None:
        text = repr(value) if not isinstance(value, int) or -(10**30) < value < 10**30 else "a huge number"
        return text if len(text) <= limit else text[: limit - 4] + "...'"
    return f"a JSON {'object' if isinstance(value, dict) else 'array' if isinstance(value, list) else 'value'}"


def _parse_entry(record: Any, plain_fields: set[str]) -> IndexEntry | str:
    """An entry, or what is wrong with the record.

    Beyond the types, the numbers must fit the layout ``build_index`` records (block-aligned, in
    order, the sample ending where its last member's padding ends) and every member name must
    belong to the key and field it is listed under by the key rule, as ``read_samples`` groups it.
    ``plain_fields`` is for ``_names_problem``.
    """
    if not isinstance(record, dict):
        return "a sample line must be a JSON object"
    key, offset, size, fields, names = (record.get(k) for k in ("key", "offset", "size", "fields", "names"))
    if not isinstance(key, str) or not key:
        return "bad or missing key"
    if not _is_count(offset) or not _is_count(size) or offset % BLOCK or size % BLOCK:
        return f"sample {_show(key)}: bad offset or size"
    if not isinstance(fields, dict) or not fields:
        return f"sample {_show(key)}: fields must be a non-empty object"
    if names is not None and not (isinstance(names, dict) and all(isinstance(v, str) and k in fields
                                                                    for k, v in names.items())):
        return f"sample {_show(key)}: names must map its fields to member names"
    out: dict[str, tuple[int, int]] = {}
    end = offset
    for field, value in fields.items():
        if not (isinstance(value, list) and len(value) == 2 and _is_count(value[0]) and _is_count(value[1])):
            return f"sample {_show(key)}: field {_show(field)} must be [data_offset, size]"
        data_offset, data_size = value
        if data_offset % BLOCK or data_offset < end + BLOCK or data_offset + data_size > offset + size:
            return f"sample {_show(key)}: field {_show(field)} lies outside the sample or out of order"
        end = data_offset + _padded(data_size)
        out[field] = (data_offset, data_size)
    if end != offset + size:
        return f"sample {_show(key)}: its size ({size}) doesn't end where its last member ends ({end - offset} bytes)"
    problem = _names_problem(key, out, names, plain_fields)
    if problem:
        return f"sample {_show(key)}: {problem}"
    return IndexEntry(key, offset, size, out, names or None)


def _names_problem(key: str, fields: Iterable[str], names: dict[str, str] | None, plain_fields: set[str]) -> str:
    """What keeps a member name from splitting into ``(key, field)`` by the key rule, or ``""``.

    KEY.FIELD splits back when the key's last part is a name without a dot and the field is lower
    case without a slash; a name from ``names`` is split as it is. ``plain_fields`` remembers the
    fields found fit for KEY.FIELD: they repeat on every sample, each is split once.
    """
    base = key[key.rfind("/") + 1 :]
    plain_key = bool(base) and "." not in base and not key.startswith("./")  # split_key drops a leading ./
    for field in fields:
        if names and field in names:
            name = names[field]
            fits = split_key(name) == (key, field)
        else:
            name = f"{key}.{field}"
            fits = plain_key and (field in plain_fields or split_key(name) == (key, field))
            if fits:
                plain_fields.add(field)
        if not fits:
            return f"member {_show(name)} is not field {_show(field)} of this key"
    return ""


def load_index(url: str, network: Network | None = None) -> ShardIndex:
    """Read an index file (a path or any URL ``open_source`` takes) in the ``tarproc`` format;
    a remote one as ``network`` says (its retries, its shard cache)."""
    with open_source(url, network=network) as source:
        raw = read_to_end(source)
    kind = index_kind(raw[:_SNIFF_BYTES])
    if kind is not None and kind != "tarproc":
        raise foreign_index_error(url, kind)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise IndexFileError(f"line {line}: not UTF-8 text, not a tarproc index", url) from None
    return parse_index(text, url)


# ---------------------------------------------------------------------------------------------
# other tools' index files

FOREIGN_KINDS = {
    "dali": "a DALI index (wds2idx)",
    "wids": "a wids descriptor",
    "energon": "an energon index (megatron-energon's energon prepare)",
}
"""The index formats of other tools that tarproc recognises, and how messages name them."""

_SNIFF_BYTES = 1 << 16  # what index_kind looks at
_DALI_HEADER = re.compile(rb"v[0-9]+(\.[0-9]+)* [0-9]+")


class ForeignIndexError(IndexFileError):
    """Another tool's index file where a tarproc index was asked for, or where ``tarindex`` would
    write one. ``kind`` is its format, a key of ``FOREIGN_KINDS``."""

    def __init__(self, message: str, url: str | None, kind: str) -> None:
        super().__init__(message, url)
        self.kind = kind


def index_kind(head: bytes) -> str | None:
    """The index format a file begins with, from its first bytes (64 KiB, or the whole file):
    ``tarproc``, ``dali``, ``wids`` or ``energon``; None for anything else (empty, damaged, not an index).

    energon's ``.tar.idx`` is binary: little-endian uint64 offsets of tar headers. Each is a
    multiple of 512, so every 8-byte word begins with a zero byte, which no text index does.

    >>> index_kind((0).to_bytes(8, "little") + (2048).to_bytes(8, "little"))
    'energon'
    >>> index_kind(b"v1.2 3\\n"), index_kind(b'{"format": "tarproc-index", "version": 1}\\n'), index_kind(b"x")
    ('dali', 'tarproc', None)
    """
    if len(head) >= 8 and head[0] == 0:
        words = head[: min(len(head), 4096) // 8 * 8]
        if all(words[i] == 0 and not words[i + 1] & 1 for i in range(0, len(words), 8)):
            return "energon"
        return None
    text = head.lstrip()
    first = text.split(b"\n", 1)[0].rstrip()
    if first.startswith(b"{"):
        if b'"tarproc-index"' in first:
            return "tarproc"
        if b'"__kind__"' in text and b'"wids-shard-index-v1"' in text:
            return "wids"
        return None
    return "dali" if _DALI_HEADER.fullmatch(first) else None


def index_kind_at(url: str, network: Network | None = None) -> str | None:
    """The format of the file at ``url`` (see ``index_kind``); None when there is no such file,
    it can't be read, or it is no index tarproc knows."""
    path = local_path(url)
    if path is not None and not os.path.isfile(path):
        return None
    try:
        with open_source(url, network=network) as source:
            head = read_to_end(source, _SNIFF_BYTES)
    except SourceError:
        return None
    return index_kind(head)


def foreign_index_error(url: str | None, kind: str) -> ForeignIndexError:
    """The error for another tool's index read as a tarproc index."""
    where = "byte 0" if kind == "energon" else "line 1"
    return ForeignIndexError(
        f"{where}: not a tarproc index but {FOREIGN_KINDS[kind]}, which has no sample keys; random access "
        "needs a tarproc index: leave the index out to index the shard in memory, or write one elsewhere "
        "(tarindex SHARD -o OTHER.idx)", url, kind,
    )


def refuse_foreign_index(target: str, fmt: str, network: Network | None = None) -> None:
    """Raise ``ForeignIndexError`` when ``target`` holds another tool's index that writing a
    ``fmt`` index there would replace: ``tarindex`` never destroys one unless told to."""
    if target == "-":
        return
    kind = index_kind_at(target, network)
    if kind is None or kind == "tarproc" or kind == fmt:
        return
    raise ForeignIndexError(
        f"{FOREIGN_KINDS[kind]} is there; tarindex doesn't replace another tool's index: write yours "
        "elsewhere with -o, or give --overwrite to replace it", target, kind,
    )


class EnergonIndex(NamedTuple):
    """megatron-energon's ``SHARD.tar.idx``, written by ``energon prepare`` beside each shard
    (``megatron/energon/flavors/webdataset/itar.py``): the byte where each sample's first regular
    member begins (its GNU or pax headers included), then the byte where the last sample ends.
    It has no keys or fields: it gives counts and starting points, not random access by key."""

    url: str | None
    offsets: Sequence[int]  # samples + 1 numbers, increasing

    @property
    def samples(self) -> int:
        return len(self.offsets) - 1

    @property
    def end(self) -> int:
        """Where the last sample ends (where the archive's end blocks begin, unless members that
        are not samples follow)."""
        return self.offsets[-1]


def parse_energon_index(data: bytes, url: str | None = None) -> EnergonIndex:
    """Read energon's binary index; ``IndexFileError`` names the file and the byte on any problem.

    >>> parse_energon_index(b"".join(n.to_bytes(8, "little") for n in (0, 2048, 4096))).samples
    2
    """
    if not data:
        raise IndexFileError("byte 0: empty file, not an energon index (one holds at least the end of its shard)", url)
    if len(data) % 8:
        whole = len(data) - len(data) % 8
        raise IndexFileError(f"byte {whole}: {len(data)} bytes, not a whole number of 8-byte offsets: "
                             "a truncated energon index", url)
    offsets = array.array("Q")
    offsets.frombytes(data)
    if sys.byteorder == "big":  # pragma: no cover - energon writes native order, little-endian where it runs
        offsets.byteswap()
    prev = -1
    for i, offset in enumerate(offsets):
        if offset % BLOCK:
            raise IndexFileError(f"byte {8 * i}: offset {offset} is not the start of a tar header "
                                 "(a multiple of 512): a damaged energon index", url)
        if offset > _MAX_COUNT:
            raise IndexFileError(f"byte {8 * i}: offset {offset} is past any file's end: a damaged energon index", url)
        if offset <= prev:
            raise IndexFileError(f"byte {8 * i}: offset {offset} is not after the one before it ({prev}): "
                                 "a damaged energon index", url)
        prev = offset
    return EnergonIndex(url, array.array("q", offsets))


def read_energon_index(source: Any, url: str | None, head: bytes = b"") -> EnergonIndex:
    """Energon's index from an open ``source``, of which ``head`` was read already."""
    return parse_energon_index(read_to_end(source, None, head), url)


def load_energon_index(url: str, network: Network | None = None) -> EnergonIndex:
    """Read energon's index file at ``url`` (a path or any URL ``open_source`` takes)."""
    with open_source(url, network=network) as source:
        return read_energon_index(source, url)


def check_energon_index(energon: EnergonIndex, index: ShardIndex, shard_url: str) -> None:
    """Check energon's index against the shard's own (``build_index``): the same samples, each
    starting where the shard has it. Else ``IndexFileError`` names the energon file and the byte.

    energon skips directories before a sample (an index of tarproc's counts them in), so its
    offset may lie anywhere from the sample's start up to its first member's own header.
    """
    entries = index.entries

    def fail(reason: str) -> IndexFileError:
        return IndexFileError(
            f"energon index doesn't match {shard_url}: {reason}; the shard changed after it was prepared, or the "
            "index is damaged: prepare it again (energon prepare --tar-index-only DATASET_DIR)", energon.url,
        )

    for i, (offset, entry) in enumerate(zip(energon.offsets[: energon.samples], entries, strict=False)):
        first = next(iter(entry.fields.values()))[0] - BLOCK
        if not entry.offset <= offset <= first:
            raise fail(f"byte {8 * i}: sample {i} ({_show(entry.key)}) begins at byte {first} of the shard, "
                       f"not at byte {offset}")
    n = energon.samples
    if n > len(entries):
        raise fail(f"byte {8 * len(entries)}: it lists {n} samples, the shard has {len(entries)} (the index has "
                   f"sample {len(entries)} at byte {energon.offsets[len(entries)]})")
    if n < len(entries):
        raise fail(f"byte {8 * n}: it lists {n} samples, the shard has {len(entries)} (sample {n}, "
                   f"{_show(entries[n].key)}, at byte {entries[n].offset})")
    last_end = entries[-1].offset + entries[-1].size if entries else 0
    if not last_end <= energon.end <= index.size:
        raise fail(f"byte {8 * n}: the last sample ends at byte {last_end} of the shard ({index.size} bytes), "
                   f"not at byte {energon.end}")


def check_index_file(shard_url: str, index_url: str, *, policy: ReadPolicy = ReadPolicy()) -> tuple[str, int]:
    """Check an index file against its shard, which is indexed now (``build_index``, as ``policy``
    says). The format is told by the content: tarproc's, DALI's, energon's, or a wids descriptor
    (its entry for the shard). Returns the format and the samples the file lists; raises
    ``IndexFileError`` naming the file, and the line or byte, where it doesn't describe the shard.
    """
    kind = index_kind_at(index_url)
    index = build_index(shard_url, policy=policy)
    if kind == "energon":
        energon = load_energon_index(index_url)
        check_energon_index(energon, index, shard_url)
        return kind, energon.samples
    if kind == "dali":
        return kind, _check_dali(_read_text(index_url), index, index_url, shard_url)
    if kind == "wids":
        return kind, _check_wids(_read_text(index_url), index, index_url, shard_url)
    loaded = load_index(index_url)  # says what is wrong with a file that is no index
    fix = _rebuild_command(shard_url, index_url)
    if loaded.size != index.size:
        raise IndexFileError(f"stale index: made for a shard of {loaded.size} bytes, but {shard_url} has "
                             f"{index.size} bytes; rebuild it with: {fix}", index_url)
    for i, (got, want) in enumerate(zip(loaded.entries, index.entries, strict=False)):
        if got != want:
            raise IndexFileError(f"line {i + 2}: sample {i} ({_show(got.key)}) doesn't match {shard_url}, which has "
                                 f"{_show(want.key)} at byte {want.offset}; rebuild the index with: {fix}", index_url)
    if len(loaded) != len(index):
        raise IndexFileError(f"it lists {len(loaded)} samples, but {shard_url} has {len(index)}; rebuild it with: {fix}",
                             index_url)
    return "tarproc", len(loaded)


def _read_text(url: str) -> str:
    with open_source(url) as source:
        raw = read_to_end(source)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise IndexFileError(f"line {line}: not UTF-8 text", url) from None


def _check_dali(text: str, index: ShardIndex, index_url: str, shard_url: str) -> int:
    """The samples a DALI index lists, checked against the shard's index: each field's member at
    the offset and of the size the shard has (groups for members tarproc leaves out may be there)."""
    lines = [(n, line) for n, line in enumerate(text.split("\n"), 1) if line.strip()]
    version, announced = lines[0][1].split()
    if int(announced) != len(lines) - 1:
        raise IndexFileError(f"line {lines[-1][0]}: the header announces {announced} samples but the file has "
                             f"{len(lines) - 1}", index_url)
    fix = f"{_rebuild_command(shard_url, None)} --format dali -o {index_url}"
    if len(lines) - 1 != len(index):
        raise IndexFileError(f"it lists {len(lines) - 1} samples, but {shard_url} has {len(index)}; rebuild it "
                             f"with: {fix}", index_url)
    if version != DALI_VERSION:
        return len(index)  # older versions don't name members: the count is what can be checked
    for (lineno, line), entry in zip(lines[1:], index.entries, strict=True):
        tokens = line.split()
        groups = {tokens[k + 3]: tokens[k + 1 : k + 3] for k in range(0, len(tokens) - 3, 4)}  # name -> offset, size
        for field, (offset, size) in entry.fields.items():
            name = entry.member_name(field)
            if groups.get(name) != [str(offset), str(size)]:
                raise IndexFileError(
                    f"line {lineno}: sample {_show(entry.key)}: {shard_url} has member {_show(name)} at byte "
                    f"{offset} ({size} bytes), which this line doesn't say; rebuild it with: {fix}", index_url)
    return len(index)


def _check_wids(text: str, index: ShardIndex, index_url: str, shard_url: str) -> int:
    """The samples a wids descriptor gives for the shard (its entry by URL, else by base name),
    checked against the shard's count and size."""
    descriptor = _json_line(text)
    shardlist = descriptor.get("shardlist") if isinstance(descriptor, dict) else None
    if not isinstance(shardlist, list):
        raise IndexFileError("a wids descriptor needs a \"shardlist\" list", index_url)
    base = _base_name(shard_url)
    entries = [e for e in shardlist if isinstance(e, dict) and isinstance(e.get("url"), str)]
    found = [e for e in entries if e["url"] == shard_url] or [e for e in entries if _base_name(e["url"]) == base]
    if not found:
        raise IndexFileError(f"no entry for {shard_url} in its shardlist", index_url)
    entry = found[0]
    n, size = entry.get("nsamples"), entry.get("filesize")
    if n != len(index) or (size is not None and size != index.size):
        raise IndexFileError(
            f"its entry for {_show(entry['url'])} says {_show(n)} samples and {_show(size)} bytes, but {shard_url} has "
            f"{len(index)} samples and {index.size} bytes; rebuild it with: tarindex --format wids -o {index_url} ...",
            index_url)
    return len(index)


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
    ``SHARD.idx`` is used when it exists, and otherwise the shard is scanned once to build an index
    in memory. A malformed index file raises ``IndexFileError`` naming the file and the line.

    An index records the size of its shard; one made for another size is *stale*, and ``stale``
    says what then: ``"error"`` (the default) raises ``IndexFileError`` naming the index, the shard
    and the ``tarindex`` command that rebuilds it; ``"rebuild"`` scans the shard to index it in
    memory, after one warning through ``warn`` (by default a ``DataWarning``, as ``read_samples``).

    ``fields`` limits what is read to those fields (a sample lacking one is returned without it).
    Local files are read with ``os.pread`` on one descriptor (safe to share between threads); other
    URLs with fsspec range reads (``cat_file(path, start, end)``), never the whole file. Each read
    is checked with the core reader: at every offset the index gives there must be a valid header
    naming that key's member for that field, of that size. Otherwise (a shard rewritten at the same
    size, a damaged index) ``IndexFileError`` names the index, the shard and the byte, and says how
    to rebuild the index: wrong bytes are never returned under a key.

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
        policy: ReadPolicy = ReadPolicy(),
        stale: str = "error",
        warn: Callable[[str], None] | None = None,
        **old: Any,
    ) -> None:
        policy = policy_with_keywords(policy, old, ("dup", "max_member_size"), "IndexedShard")
        self.url = url = os.fspath(url)
        check_random_access(url)
        if stale not in STALE_POLICIES:
            raise OptionError(f"bad stale-index policy {stale!r}; use one of {', '.join(STALE_POLICIES)}")
        self.index_url: str | None = None  # the index file in use; None for a ShardIndex or a scan
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
            self.index = self._load(index, stale, warn, policy)
        except BaseException:
            self.close()
            raise

    def _load(
        self,
        index: str | os.PathLike[str] | ShardIndex | None,
        stale: str,
        warn: Callable[[str], None] | None,
        policy: ReadPolicy,
    ) -> ShardIndex:
        index_url: str | None = None
        if isinstance(index, ShardIndex):
            # made in memory, not parsed: its member names get the parser's check (the reads
            # compare headers with these names, which then can't belong to another key)
            plain_fields: set[str] = set()
            for i, entry in enumerate(index.entries):
                problem = _names_problem(entry.key, entry.fields, entry.names, plain_fields)
                if problem:
                    raise IndexFileError(f"the index given is wrong: sample {i} ({_show(entry.key)}): {problem}",
                                         self.url)
            loaded = index
        elif index is not None:
            index_url = os.fspath(index)
            loaded = load_index(index_url)
        else:
            sibling = default_index_url(self.url)
            if not self._exists(sibling):
                return build_index(self.url, policy=policy)
            index_url = sibling
            try:
                loaded = load_index(sibling)
            except ForeignIndexError:
                # another tool's index under the name ours takes (energon's SHARD.tar.idx): no keys in it
                return build_index(self.url, policy=policy)
        if loaded.size == self.size:
            self.index_url = index_url
            return loaded
        where = (
            f"made for a shard of {loaded.size} bytes ({_show(loaded.shard)})"
            f", but {self.url} has {self.size} bytes"
        )
        fix = _rebuild_command(self.url, index_url)
        if stale == "error":
            raise IndexFileError(f"stale index: {where}; rebuild it with: {fix}", index_url or self.url)
        warner(warn, DataWarning)(
            f"{index_url or self.url}: stale index ({where}); indexing {self.url} in memory instead "
            f"(rebuild the index with: {fix})"
        )
        return build_index(self.url, policy=policy)

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
        names must be there, with its name and size (the index was checked when loaded: those names
        belong to the entry's key and field by the key rule), and the sample may hold no field the
        index leaves out. Else the index doesn't describe this shard."""
        expected = {off - BLOCK: (field, size) for field, (off, size) in members}
        found: dict[int, tuple[str, bytes]] = {}
        stats = ReadStats()
        try:
            # an index lists no link (refused when built, or left out with links="skip")
            parsed = list(iter_members(_Fragment(data), self.url, policy=_NO_LINKS, stats=stats))
        except TarFormatError as e:
            # zero blocks between concatenated archives (indexed with ignore_zeros) end a plain
            # parse; reading past them always would cost every read a little, so only on failure
            try:
                stats = ReadStats()
                parsed = list(iter_members(_Fragment(data), self.url, policy=_NO_LINKS_ZEROS, stats=stats))
            except TarFormatError:
                raise self._mismatch(
                    start + e.offset, f"{e.reason} where the index puts sample {_show(entry.key)}"
                ) from None
        for name, value, offset in parsed:
            header = start + offset
            if header in expected:
                found[header] = (name, value)
                continue
            key, field = split_key(name)
            if key == entry.key and field not in entry.fields and not field.startswith("__"):
                raise self._mismatch(header, f"member {_show(name)} of sample {_show(entry.key)} is not in the index")
        for header, (field, size) in expected.items():
            name = entry.member_name(field)
            got = found.get(header)
            if got is None or got[0] != name or len(got[1]) != size:
                what = "no member there" if got is None else f"member {_show(got[0])} of {len(got[1])} bytes"
                if got is None and any(kind in stats.skipped_entries for kind in ("hard link", "symlink")):
                    # a link last in the shard, within the end's zero blocks, passes build_index's check
                    raise _not_in_place(self.url, header, name)
                raise self._mismatch(
                    header, f"expected member {_show(name)} of {size} bytes (field {_show(field)} of sample "
                    f"{_show(entry.key)}), found {what}"
                )
            sample[field] = got[1]

    def _mismatch(self, offset: int, what: str) -> IndexFileError:
        """The error for an index that doesn't describe the shard's bytes at ``offset``."""
        fix = _rebuild_command(self.url, self.index_url)
        if self.index_url is None:
            return IndexFileError(
                f"the index doesn't match the shard at byte {offset}: {what}; the shard changed after it was "
                f"indexed: index it again ({fix})", self.url,
            )
        return IndexFileError(
            f"index doesn't match {self.url} at byte {offset}: {what}; the shard changed after it was indexed, "
            f"or the index is damaged: rebuild it with: {fix}", self.index_url,
        )

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


def _rebuild_command(shard: str, index_url: str | None) -> str:
    """The ``tarindex`` command line that writes the index ``index_url`` of ``shard`` afresh."""
    import shlex  # only for this message: tarindex starts without it

    command = f"tarindex {shlex.quote(shard)}"
    if index_url is not None and index_url != default_index_url(shard):
        command += f" -o {shlex.quote(index_url)}"
    return command


def _url_to_fs(url: str) -> tuple[Any, str]:
    if not is_fsspec_url(url):
        raise OptionError(f"{url}: not a file path or URL")
    return url_to_fs(url)


def _short(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def index_bytes(index: ShardIndex, fmt: str, url: str | None = None) -> bytes:
    """The index in a per-shard format (``tarproc`` or ``dali``) as bytes to write."""
    if fmt == "tarproc":
        return index.jsonl_bytes()
    if fmt == "dali":
        return index.dali_text(url).encode("utf-8", "surrogateescape")
    raise OptionError(f"bad index format {fmt!r}; per-shard formats are tarproc and dali")


__all__ = [
    "FOREIGN_KINDS",
    "FORMATS",
    "INDEX_FORMAT",
    "INDEX_VERSION",
    "CompressedShardError",
    "EnergonIndex",
    "ForeignIndexError",
    "IndexEntry",
    "IndexFileError",
    "IndexedShard",
    "STALE_POLICIES",
    "ShardIndex",
    "build_index",
    "check_energon_index",
    "check_index_file",
    "default_index_url",
    "index_bytes",
    "index_kind",
    "index_kind_at",
    "index_stream",
    "load_energon_index",
    "load_index",
    "parse_energon_index",
    "parse_index",
    "read_energon_index",
    "refuse_foreign_index",
    "wids_descriptor",
]
