"""The index of a shard (``ShardIndex``): building it, its file formats, and reading it back.

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

Apart from ``index`` (random access and the checks of index files, which use this module) and
above ``foreign_index`` (other tools' index files, which ``load_index`` refuses by name);
``tarproc.index`` re-exports every public name here.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Callable, Iterable, Iterator
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, NamedTuple, TypeGuard

from .errors import CompressedShardError, IndexFileError, LinkError, OptionError, TarprocError
from .foreign_index import SNIFF_BYTES, foreign_index_error, index_kind
from .samples import Sample, group_keyed
from .sources import Network, open_source, read_to_end
from .tar import BLOCK, MemberScan, ReadPolicy, ReadStats, file_origin, split_key, stream_skipper
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




def padded_size(size: int) -> int:
    """A member's data size rounded up to whole 512-byte blocks: where the next header begins."""
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
            prev_end = offset + BLOCK + padded_size(size)

    # the same grouping as read_samples: key rule, metadata, duplicates
    samples = group_keyed(members(), url, dup=policy.dup, stats=stats, warn=warn)
    # a followed link (its target's bytes) or a sparse file: the scan says, before the member comes
    entries = [_entry(sample, scan.not_in_place, url) for sample in samples]
    return ShardIndex(base_name(url or "-"), counter.bytes, entries)


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
    return ShardIndex(base_name(url or "-"), size, entries)


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
            raise not_in_place_error(url, member.data_offset - BLOCK, member.name)
        first = first or member
        last = member
        fields[field] = (member.data_offset, member.size)
        if member.name != f"{key}.{field}":
            names[field] = member.name
    assert first is not None and last is not None
    end = last.data_offset + padded_size(last.size)
    return IndexEntry(key, first.start, end - first.start, fields, names or None)


def not_in_place_error(url: str | None, header: int, name: str) -> LinkError:
    """The error for a member whose bytes don't lie after its header: random access can't read it."""
    return LinkError(
        url, header,
        f"member {show_value(name)} is a link or a sparse file, not bytes stored in place, which random access "
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


def base_name(url: str) -> str:
    """The last part of a path or URL, as an index names its shard."""
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




def index_bytes(index: ShardIndex, fmt: str, url: str | None = None) -> bytes:
    """The index in a per-shard format (``tarproc`` or ``dali``) as bytes to write."""
    if fmt == "tarproc":
        return index.jsonl_bytes()
    if fmt == "dali":
        return index.dali_text(url).encode("utf-8", "surrogateescape")
    raise OptionError(f"bad index format {fmt!r}; per-shard formats are tarproc and dali")



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

    header = json_line(lines[0])
    if isinstance(header, _NotJSON):
        raise fail(1, f"not a tarproc index (the first line is not JSON: {header.reason})")
    if not isinstance(header, dict) or header.get("format") != INDEX_FORMAT:
        raise fail(1, f"not a tarproc index (no \"format\": \"{INDEX_FORMAT}\" header)")
    version = header.get("version")
    if version != INDEX_VERSION:
        raise fail(1, f"index version {show_value(version)} is not supported (this tarproc reads version {INDEX_VERSION})")
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
        record = json_line(line)
        if isinstance(record, _NotJSON):
            raise fail(lineno, f"not JSON ({record.reason})")
        entry = _parse_entry(record, plain_fields)
        if isinstance(entry, str):
            raise fail(lineno, entry)
        if entry.offset < prev_end:
            raise fail(lineno, f"sample {show_value(entry.key)} overlaps the one before it (offset {entry.offset})")
        prev_end = entry.offset + entry.size
        if prev_end > size:
            raise fail(lineno, f"sample {show_value(entry.key)} ends at byte {prev_end}, past the shard's {size} bytes")
        if entry.key in seen:
            raise fail(lineno, f"key {show_value(entry.key)} appears twice")
        seen.add(entry.key)
        entries.append(entry)
    return ShardIndex(shard, size, entries)


class _NotJSON(NamedTuple):
    reason: str


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number an index holds")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)


def json_line(line: str) -> Any:
    """The JSON value of one line, or a ``_NotJSON`` (not a dict, list or number) saying why there is none.

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
        return _NotJSON("a number with too many digits" if "digits" in str(e) else short_error(e))


# Offsets and sizes past this can't be in a file (off_t); bounding them also keeps every number
# this module prints well under Python's 4300-digit limit for int -> str.
_MAX_COUNT = (1 << 63) - 1


def _is_count(x: Any) -> TypeGuard[int]:
    return type(x) is int and 0 <= x <= _MAX_COUNT


def show_value(value: Any, limit: int = 80) -> str:
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
    ``plain_fields`` is for ``member_names_problem``.
    """
    if not isinstance(record, dict):
        return "a sample line must be a JSON object"
    key, offset, size, fields, names = (record.get(k) for k in ("key", "offset", "size", "fields", "names"))
    if not isinstance(key, str) or not key:
        return "bad or missing key"
    if not _is_count(offset) or not _is_count(size) or offset % BLOCK or size % BLOCK:
        return f"sample {show_value(key)}: bad offset or size"
    if not isinstance(fields, dict) or not fields:
        return f"sample {show_value(key)}: fields must be a non-empty object"
    if names is not None and not (isinstance(names, dict) and all(isinstance(v, str) and k in fields
                                                                    for k, v in names.items())):
        return f"sample {show_value(key)}: names must map its fields to member names"
    out: dict[str, tuple[int, int]] = {}
    end = offset
    for field, value in fields.items():
        if not (isinstance(value, list) and len(value) == 2 and _is_count(value[0]) and _is_count(value[1])):
            return f"sample {show_value(key)}: field {show_value(field)} must be [data_offset, size]"
        data_offset, data_size = value
        if data_offset % BLOCK or data_offset < end + BLOCK or data_offset + data_size > offset + size:
            return f"sample {show_value(key)}: field {show_value(field)} lies outside the sample or out of order"
        end = data_offset + padded_size(data_size)
        out[field] = (data_offset, data_size)
    if end != offset + size:
        return f"sample {show_value(key)}: its size ({size}) doesn't end where its last member ends ({end - offset} bytes)"
    problem = member_names_problem(key, out, names, plain_fields)
    if problem:
        return f"sample {show_value(key)}: {problem}"
    return IndexEntry(key, offset, size, out, names or None)


def member_names_problem(key: str, fields: Iterable[str], names: dict[str, str] | None, plain_fields: set[str]) -> str:
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
            return f"member {show_value(name)} is not field {show_value(field)} of this key"
    return ""


def load_index(url: str, network: Network | None = None) -> ShardIndex:
    """Read an index file (a path or any URL ``open_source`` takes) in the ``tarproc`` format;
    a remote one as ``network`` says (its retries, its shard cache)."""
    with open_source(url, network=network) as source:
        raw = read_to_end(source)
    kind = index_kind(raw[:SNIFF_BYTES])
    if kind is not None and kind != "tarproc":
        raise foreign_index_error(url, kind)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise IndexFileError(f"line {line}: not UTF-8 text, not a tarproc index", url) from None
    return parse_index(text, url)




def short_error(e: BaseException) -> str:
    """An exception for a one-line message: its first line, at most 200 characters."""
    text = str(e).splitlines()[0] if str(e) else type(e).__name__
    return text if len(text) <= 200 else text[:197] + "..."

