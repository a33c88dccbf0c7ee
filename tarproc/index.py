"""Shard indexes and random access: sample key -> byte offset, size and fields.

This module is the public face of indexes. Random access (``IndexedShard``) and the checks of an
index file against its shard (``check_index_file``, any format) live here; building an index and
its formats (``tarproc``, ``dali``, ``wids``: see the docstring of ``shard_index``) are
``shard_index``'s, other tools' index files ``foreign_index``'s. Every public name of those two is
importable from here, as before they were split out.

``IndexedShard(url)`` gives random access to one shard by position or key, reading only the byte
ranges of the fields asked for (``os.pread`` on a local file, range requests through fsspec for
URLs), and checks every header it reads against the index. An index made for another size of shard
is stale: an ``IndexFileError`` naming both files and the ``tarindex`` command that rebuilds it,
unless ``stale="rebuild"`` asks for a scan in memory (with one warning). A shard rewritten at the
same size, or a damaged index, is an ``IndexFileError`` naming the byte where they disagree, on
the first read there: never wrong bytes under a key.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .compression import detect
from .errors import (
    CompressedShardError,
    DataWarning,
    IndexFileError,
    OptionError,
    SourceError,
    TarFormatError,
    warner,
)
from .foreign_index import (
    FOREIGN_KINDS,
    EnergonIndex,
    ForeignIndexError,
    foreign_index_error,
    index_kind,
    index_kind_at,
    load_energon_index,
    parse_energon_index,
    read_energon_index,
    refuse_foreign_index,
)
from .samples import Sample
from .shard_index import (
    COMPRESSED_SUFFIXES,
    DALI_VERSION,
    FORMATS,
    INDEX_FORMAT,
    INDEX_VERSION,
    STALE_POLICIES,
    IndexEntry,
    ShardIndex,
    base_name,
    build_index,
    check_random_access,
    compressed_error,
    default_index_url,
    index_bytes,
    index_stream,
    json_line,
    load_index,
    member_names_problem,
    not_in_place_error,
    padded_size,
    parse_index,
    short_error,
    show_value,
    wids_descriptor,
)
from .sources import is_fsspec_url, local_path, open_source, read_to_end
from .sources.remote import url_to_fs
from .tar import BLOCK, ReadPolicy, ReadStats, iter_members, split_key
from .tar.policy import policy_with_keywords

# ---------------------------------------------------------------------------------------------
# checking an index file against its shard


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
            raise IndexFileError(f"line {i + 2}: sample {i} ({show_value(got.key)}) doesn't match {shard_url}, which has "
                                 f"{show_value(want.key)} at byte {want.offset}; rebuild the index with: {fix}", index_url)
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
                    f"line {lineno}: sample {show_value(entry.key)}: {shard_url} has member {show_value(name)} at byte "
                    f"{offset} ({size} bytes), which this line doesn't say; rebuild it with: {fix}", index_url)
    return len(index)


def _check_wids(text: str, index: ShardIndex, index_url: str, shard_url: str) -> int:
    """The samples a wids descriptor gives for the shard (its entry by URL, else by base name),
    checked against the shard's count and size."""
    descriptor = json_line(text)
    shardlist = descriptor.get("shardlist") if isinstance(descriptor, dict) else None
    if not isinstance(shardlist, list):
        raise IndexFileError("a wids descriptor needs a \"shardlist\" list", index_url)
    base = base_name(shard_url)
    entries = [e for e in shardlist if isinstance(e, dict) and isinstance(e.get("url"), str)]
    found = [e for e in entries if e["url"] == shard_url] or [e for e in entries if base_name(e["url"]) == base]
    if not found:
        raise IndexFileError(f"no entry for {shard_url} in its shardlist", index_url)
    entry = found[0]
    n, size = entry.get("nsamples"), entry.get("filesize")
    if n != len(index) or (size is not None and size != index.size):
        raise IndexFileError(
            f"its entry for {show_value(entry['url'])} says {show_value(n)} samples and {show_value(size)} bytes, but {shard_url} has "
            f"{len(index)} samples and {index.size} bytes; rebuild it with: tarindex --format wids -o {index_url} ...",
            index_url)
    return len(index)




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
            raise fail(f"byte {8 * i}: sample {i} ({show_value(entry.key)}) begins at byte {first} of the shard, "
                       f"not at byte {offset}")
    n = energon.samples
    if n > len(entries):
        raise fail(f"byte {8 * len(entries)}: it lists {n} samples, the shard has {len(entries)} (the index has "
                   f"sample {len(entries)} at byte {energon.offsets[len(entries)]})")
    if n < len(entries):
        raise fail(f"byte {8 * n}: it lists {n} samples, the shard has {len(entries)} (sample {n}, "
                   f"{show_value(entries[n].key)}, at byte {entries[n].offset})")
    last_end = entries[-1].offset + entries[-1].size if entries else 0
    if not last_end <= energon.end <= index.size:
        raise fail(f"byte {8 * n}: the last sample ends at byte {last_end} of the shard ({index.size} bytes), "
                   f"not at byte {energon.end}")



# ---------------------------------------------------------------------------------------------
# random access

_NO_LINKS = ReadPolicy(links="skip")  # an index lists no link: refused when built, or left out
_NO_LINKS_ZEROS = ReadPolicy(links="skip", ignore_zeros=True)


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
                raise SourceError(f"cannot get its size: {short_error(e)}", url) from None
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
                problem = member_names_problem(entry.key, entry.fields, entry.names, plain_fields)
                if problem:
                    raise IndexFileError(f"the index given is wrong: sample {i} ({show_value(entry.key)}): {problem}",
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
            f"made for a shard of {loaded.size} bytes ({show_value(loaded.shard)})"
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
                raise SourceError(f"range read of bytes {start}-{end} failed: {short_error(e)}", self.url) from None
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
        starts = [entry.offset] + [off + padded_size(size) for _, (off, size) in members[:-1]]
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
            end = members[k][1][0] + padded_size(members[k][1][1])
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
                    start + e.offset, f"{e.reason} where the index puts sample {show_value(entry.key)}"
                ) from None
        for name, value, offset in parsed:
            header = start + offset
            if header in expected:
                found[header] = (name, value)
                continue
            key, field = split_key(name)
            if key == entry.key and field not in entry.fields and not field.startswith("__"):
                raise self._mismatch(header, f"member {show_value(name)} of sample {show_value(entry.key)} is not in the index")
        for header, (field, size) in expected.items():
            name = entry.member_name(field)
            got = found.get(header)
            if got is None or got[0] != name or len(got[1]) != size:
                what = "no member there" if got is None else f"member {show_value(got[0])} of {len(got[1])} bytes"
                if got is None and any(kind in stats.skipped_entries for kind in ("hard link", "symlink")):
                    # a link last in the shard, within the end's zero blocks, passes build_index's check
                    raise not_in_place_error(self.url, header, name)
                raise self._mismatch(
                    header, f"expected member {show_value(name)} of {size} bytes (field {show_value(field)} of sample "
                    f"{show_value(entry.key)}), found {what}"
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


__all__ = [
    "COMPRESSED_SUFFIXES",
    "DALI_VERSION",
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
    "check_random_access",
    "compressed_error",
    "default_index_url",
    "foreign_index_error",
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
