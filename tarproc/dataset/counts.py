"""Sample counts per shard, from whatever records them, for the equal-steps plan (``split.split_work``).

``shard_counts(urls, lengths)`` finds how many samples each shard holds:

- ``"auto"`` (the default), for each URL in turn: the tarproc index beside it (``SHARD.idx``, of
  which only the first line, the header, is read), else a DALI index (``wds2idx``'s name,
  ``SHARD-UP-TO-THE-FIRST-DOT.idx``; either name may hold either format: the content tells), else,
  for a local file, the shard itself, counted once and remembered in a cache. A local sidecar made
  for another size of shard, or older than the shard (a shard rewritten after it was indexed: tar
  pads to 10 KiB records, so the size often stays), is stale: one warning, and the shard is
  counted instead. A remote shard (``http://``, ``s3://``, any fsspec URL) without a sidecar:
  the count remembered for its URL and version (size and ETag or last-modified time), else the
  shard read once and counted, into the shard cache when the Dataset has one (``cache_dir``: the
  same download the epochs then read from the cache), several at a time, the ranks of a node
  sharing the work (file locks). ``pipe:`` commands and stdin are left without a count.
- ``"count"``: the same as ``"auto"`` (the name older releases needed to count remote shards).
- ``None`` or ``False``: no counts (the readers then split the shards among themselves, and an
  epoch ends when the first rank runs dry: ``split.split_by_shard``).
- ``None`` or ``False``: no counts.
- a path: a tarsplit manifest (JSON lines with ``shard`` and ``samples``) or a wids descriptor
  (``"__kind__": "wids-shard-index-v1"``); an entry matches a URL exactly or by its base name.
- a list of counts in the order of ``urls``, or a dict ``url -> count``.

The cache holds one small JSON file per shard in ``CACHE_DIR/counts/``, named by the sha256 of
the shard's identity: ``(realpath, size, mtime_ns)`` of a local file, ``(url, size, etag or
modification time)`` of a remote one (none for a store that names no version: such a shard is
counted again in each run, from the shard cache when it holds a checked copy). Files are written whole and renamed into place, so
processes counting the same shard at once never read half a file; a damaged cache file is
ignored (and rewritten), and a cache directory that can't be written means no cache, not an error.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import operator
import os
import posixpath
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from .. import errors
from ..errors import (
    CompressedShardError,
    DataWarning,
    IndexFileError,
    LinkError,
    OptionError,
    SourceError,
    TarprocWarning,
)
from ..index import INDEX_FORMAT, INDEX_VERSION, build_index, default_index_url, index_kind, read_energon_index
from ..samples import read_samples
from ..sources import is_fsspec_url, local_path, open_source, settings, shard_cache
from ..sources.remote import Identity, Network, identify
from ..tar import ReadPolicy

WIDS_KIND = "wids-shard-index-v1"
DALI_VERSIONS = ("v1.1", "v1.2")
CACHE_VERSION = 1
_MAX_HEADER = 1 << 20  # a tarproc index's first line is short; more than this is not a header
_MAX_COUNT = (1 << 63) - 1
REMOTE_THREADS = 8  # remote shards looked up or counted at once


class ShardCounts(NamedTuple):
    """What ``shard_counts`` found: the counts (None unless every URL has one), where each came
    from (for messages) and the URLs left without one (non-empty exactly when ``counts`` is None)."""

    counts: dict[str, int] | None
    sources: dict[str, str]
    missing: list[str]


def default_cache_dir() -> str:
    """``$TARPROC_CACHE_DIR``, else ``$XDG_CACHE_HOME/tarproc``, else ``~/.cache/tarproc``."""
    explicit = os.environ.get("TARPROC_CACHE_DIR")
    if explicit:
        return explicit
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return os.path.join(xdg, "tarproc")
    return os.path.join(os.path.expanduser("~"), ".cache", "tarproc")


def shard_counts(
    urls: Sequence[str],
    lengths: object = "auto",
    *,
    cache_dir: str | None = None,
    warn: Callable[[str], None] | None = None,
    network: Network | None = None,
    identities: Mapping[str, Identity] | None = None,
    rank: int = 0,
    world: int = 1,
    policy: ReadPolicy = ReadPolicy(),
) -> ShardCounts:
    """The sample count of every URL from ``lengths`` (see the module docstring).

    Remote shards without an index are counted in threads (``network``: how they are read; with
    its ``cache_dir``, into the shard cache, which the epochs then read). ``identities``: their
    versions, when known already (else a HEAD request each). ``rank`` of ``world``: the ranks of
    a node start at different shards and wait for each other's downloads; rank 0 says what
    happens on stderr, with a progress bar. ``policy``: how a shard that is counted by reading it is
    read (the readers' own policy, so that a count is what an epoch will find).

    >>> shard_counts(["a.tar", "b.tar"], [3, 4])
    ShardCounts(counts={'a.tar': 3, 'b.tar': 4}, sources={'a.tar': 'given', 'b.tar': 'given'}, missing=[])
    >>> shard_counts(["pipe:cat a.tar"]).missing
    ['pipe:cat a.tar']
    """
    urls = list(urls)
    if lengths is None or lengths is False:
        return ShardCounts(None, {}, urls)
    if isinstance(lengths, str) and lengths in ("auto", "count"):
        counter = _Counter(cache_dir, warn, network, identities or {}, policy)
        found: dict[str, int] = {}
        sources: dict[str, str] = {}
        missing: list[str] = []
        remote: list[str] = []
        for url in dict.fromkeys(urls):  # a URL listed twice is looked up once
            if is_fsspec_url(url):
                remote.append(url)
                continue
            got = counter.count(url)
            if got is None:
                missing.append(url)
            else:
                found[url], sources[url] = got
        for url, (n, source) in counter.count_remote(remote, rank, world).items():
            found[url], sources[url] = n, source
        if missing:
            return ShardCounts(None, sources, missing)
        return ShardCounts({url: found[url] for url in dict.fromkeys(urls)}, sources, [])
    if isinstance(lengths, (str, os.PathLike)):
        return _from_file(os.fspath(lengths), urls)
    if isinstance(lengths, Mapping):
        counts = {}
        for url in urls:
            if url not in lengths:
                raise OptionError(f"no sample count for shard {url} in the dict of lengths")
            counts[url] = _given_count(lengths[url], f"the count of shard {url}")
        return ShardCounts(counts, dict.fromkeys(counts, "given"), [])
    if isinstance(lengths, Sequence) and not isinstance(lengths, (bytes, bytearray)):
        if len(lengths) != len(urls):
            raise OptionError(f"{len(lengths)} sample counts for {len(urls)} shards")
        counts = {}
        for i, (url, n) in enumerate(zip(urls, lengths, strict=True)):
            n = _given_count(n, f"sample count {i} (shard {url})")
            if counts.setdefault(url, n) != n:
                raise OptionError(f"shard {url} is listed twice with different sample counts ({counts[url]} and {n})")
        return ShardCounts(counts, dict.fromkeys(counts, "given"), [])
    raise OptionError(
        f"bad lengths {type(lengths).__name__}: use 'auto', 'count', None, a manifest or wids file, "
        "a list or a dict of sample counts"
    )


def _given_count(value: object, what: str) -> int:
    if isinstance(value, bool):
        raise OptionError(f"{what} is {value!r}, not a number of samples")
    try:
        n = operator.index(value)  # type: ignore[call-overload,arg-type,unused-ignore]  # int, numpy ints; not floats
    except TypeError:
        raise OptionError(f"{what} is {_show(value)}, not a whole number of samples") from None
    if n < 0:
        raise OptionError(f"{what} is {n}: a number of samples can't be negative")
    if n > _MAX_COUNT:
        raise OptionError(f"{what} is {n}: more samples than a shard can hold")
    return n


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:56] + "...'"


# ---------------------------------------------------------------------------------------------
# manifests and wids descriptors


def _from_file(path: str, urls: list[str]) -> ShardCounts:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise OptionError(
            f"lengths {path!r}: no such file (give 'auto', 'count', None, a manifest or wids file, a list or a dict)"
        ) from None
    except OSError as e:
        raise OptionError(f"cannot read the lengths file {path}: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise OptionError(f"{path}: line {line}: not UTF-8 text (neither a manifest nor a wids descriptor)") from None
    whole = _json(text) if text.lstrip().startswith("{") else None
    if isinstance(whole, dict) and "__kind__" in whole:
        if whole["__kind__"] != WIDS_KIND:
            raise OptionError(f"{path}: unknown kind {_show(whole['__kind__'])} (a wids descriptor is {WIDS_KIND!r})")
        table, label = _wids_table(whole, path), f"wids {path}"
    else:
        table, label = _manifest_table(text, path), f"manifest {path}"
    by_base: dict[str, int | None] = {}  # None: two entries of this base name with different counts
    for name, samples in table.items():
        base = posixpath.basename(name)
        by_base[base] = samples if by_base.get(base, samples) == samples else None
    counts = {}
    for url in urls:
        n: int | None = table.get(url)
        if n is None:
            base = posixpath.basename(url)
            if base in by_base and by_base[base] is None:
                raise OptionError(f"{path}: shard {url} matches several entries named {base} with different counts")
            n = by_base.get(base)
        if n is None:
            raise OptionError(f"{path}: no entry for shard {url}")
        counts[url] = n
    return ShardCounts(counts, dict.fromkeys(counts, label), [])


def manifest_digests(lengths: object, urls: Sequence[str]) -> dict[str, str]:
    """The sha256 a ``tarsplit --manifest`` gives for each of ``urls`` (matched as for the counts:
    the whole name, else the base name), when ``lengths`` is such a manifest; else none. The shard
    cache checks a copy against it before keeping it."""
    if not isinstance(lengths, (str, os.PathLike)) or os.fspath(lengths) in ("auto", "count"):
        return {}
    try:
        with open(os.fspath(lengths), encoding="utf-8") as f:
            rows = [_json(line) for line in f if line.strip()]
    except (OSError, UnicodeDecodeError):
        return {}
    table = {row["shard"]: row["sha256"] for row in rows if isinstance(row, dict)
             and isinstance(row.get("shard"), str) and isinstance(row.get("sha256"), str)}
    by_base = {posixpath.basename(name): digest for name, digest in table.items()}
    found = {url: table.get(url) or by_base.get(posixpath.basename(url)) for url in urls}
    return {url: digest for url, digest in found.items() if digest}


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _manifest_table(text: str, path: str) -> dict[str, int]:
    table: dict[str, int] = {}
    for row, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        entry = _json(line)
        if not isinstance(entry, dict) or not isinstance(entry.get("shard"), str) or "samples" not in entry:
            raise OptionError(f"{path}: row {row}: not a manifest line (expected a JSON object with shard and samples)")
        n = entry["samples"]
        if type(n) is not int or not 0 <= n <= _MAX_COUNT:
            raise OptionError(f"{path}: row {row}: samples is {_show(n)}, not a number of samples")
        if table.setdefault(entry["shard"], n) != n:
            raise OptionError(f"{path}: row {row}: shard {entry['shard']} is listed again with another count")
    return table


def _wids_table(descriptor: dict[str, Any], path: str) -> dict[str, int]:
    shardlist = descriptor.get("shardlist")
    if not isinstance(shardlist, list):
        raise OptionError(f"{path}: a wids descriptor needs a \"shardlist\" list")
    table: dict[str, int] = {}
    for i, entry in enumerate(shardlist):
        if not isinstance(entry, dict) or not isinstance(entry.get("url"), str):
            raise OptionError(f"{path}: shardlist entry {i}: needs a url and nsamples")
        n = entry.get("nsamples")
        if type(n) is not int or not 0 <= n <= _MAX_COUNT:
            raise OptionError(f"{path}: shardlist entry {i} ({entry['url']}): nsamples is {_show(n)}, "
                              "not a number of samples")
        if table.setdefault(entry["url"], n) != n:
            raise OptionError(f"{path}: shardlist entry {i}: {entry['url']} is listed again with another count")
    return table


# ---------------------------------------------------------------------------------------------
# sidecar indexes, counting and the cache


class _Sidecar(NamedTuple):
    samples: int
    source: str
    size: int | None  # the shard size a tarproc index records; None for DALI's
    end: int | None  # where the last sample a DALI index lists ends, when its last line tells


def stale_index(url: str, shard: os.stat_result, index_path: str, size: int | None, end: int | None = None) -> str | None:
    """Why a local index file doesn't describe the shard any more, or None: made for another size
    (``size`` it records, ``end`` of its last sample), or older than the shard (rewritten after it
    was indexed: tar pads to 10 KiB records, so the size often stays)."""
    if size is not None and size != shard.st_size:
        return f"made for a shard of {size} bytes, but {url} has {shard.st_size} bytes"
    if end is not None and end > shard.st_size:
        return f"lists samples up to byte {end}, but {url} has {shard.st_size} bytes"
    if os.stat(index_path).st_mtime_ns < shard.st_mtime_ns:
        return f"older than {url}, which was written after it"
    return None


class _Counter:
    def __init__(self, cache_dir: str | None, warn: Callable[[str], None] | None, network: Network | None,
                 identities: Mapping[str, Identity], policy: ReadPolicy = ReadPolicy()) -> None:
        self.policy = policy
        self.cache = _Cache(cache_dir if cache_dir is not None else default_cache_dir())
        self._warn_to = warn  # the caller's callback, else a warning of the module (tarproc.errors.warn)
        self.network = network if network is not None else settings()
        self.identities = dict(identities)
        self.warned: set[str] = set()

    def warn(self, message: str, category: type[TarprocWarning] = TarprocWarning) -> None:
        if self._warn_to is not None:
            self._warn_to(message)
        else:
            errors.warn(message, category)

    def count(self, url: str) -> tuple[int, str] | None:
        """A local shard's count (its index, the counts' cache, or counted now); None for stdin and pipe:."""
        if url == "-" or url.startswith("pipe:"):
            return None
        path = local_path(url)
        if path is None:  # pragma: no cover - remote URLs go to count_remote
            return None
        return self._local(url, path)

    def count_remote(self, urls: list[str], rank: int, world: int) -> dict[str, tuple[int, str]]:
        """The counts of remote shards: from their index files, the counts' cache (by URL and
        version), else by reading each once, into the shard cache when there is one. Several at
        a time; a shard another process of the node is counting is left for later, then waited for."""
        if not urls:
            return {}
        from concurrent.futures import ThreadPoolExecutor

        turn = rank * len(urls) // max(1, world)  # the ranks of a node start at different shards
        order = urls[turn:] + urls[:turn]
        found: dict[str, tuple[int, str]] = {}
        with ThreadPoolExecutor(min(REMOTE_THREADS, len(order))) as pool:
            for url, got in zip(order, pool.map(self._sidecar_or_known, order), strict=True):
                if got is not None:
                    found[url] = got
            todo = [url for url in order if url not in found]
            if not todo:
                return found
            bar = self._progress(todo, rank)
            try:
                later = []
                for url, got in zip(todo, pool.map(lambda u: self._read_count(u, wait=False), todo), strict=True):
                    if got is None:
                        later.append(url)  # another process reads it now
                    else:
                        found[url] = got
                        bar.update()
                for url, got in zip(later, pool.map(lambda u: self._read_count(u, wait=True), later), strict=True):
                    assert got is not None
                    found[url] = got
                    bar.update()
            finally:
                bar.close()
        return found

    def _progress(self, todo: list[str], rank: int) -> Any:
        from tqdm import tqdm

        shown = rank == 0
        if shown:
            cache = self.network.cache_dir
            how = (f"into the shard cache {cache}, which the epochs then read" if cache is not None else
                   "without cache_dir the first epoch reads them again: give cache_dir to read each once")
            self.warn(f"{len(todo):,} remote shards have no index file and no count remembered: reading each once to "
                      f"count its samples ({how}); the counts are kept in {self.cache.dir} for later runs")
        return tqdm(total=len(todo), desc="tarproc: counting", unit="shard", file=sys.stderr, disable=not shown,
                    mininterval=1.0 if sys.stderr.isatty() else 30.0, leave=False)

    def _version(self, url: str) -> Identity | None:
        identity = self.identities.get(url)
        if identity is None:
            identity = self.identities[url] = identify(url, self.network.timeout, self.network)  # type: ignore[assignment]
        return identity

    def _key(self, url: str) -> list[Any] | None:
        """The counts' cache key of a remote shard: its URL and version (None: the store names no
        version, so a count can't be trusted in a later run)."""
        identity = self._version(url)
        if identity is None or identity.stamp is None:
            return None
        return ["remote", url, identity.size, identity.stamp, *_policy_key(self.policy)]

    def _sidecar_or_known(self, url: str) -> tuple[int, str] | None:
        for index_url in _sidecar_urls(url):
            try:
                found = _read_sidecar(index_url, self.network)
            except SourceError:
                continue  # not there (404, no such key), or not readable: no sidecar
            return found.samples, found.source
        key = self._key(url)
        cached = self.cache.get(key) if key is not None else None
        return (cached, "counted (cache)") if cached is not None else None

    def _read_count(self, url: str, wait: bool) -> tuple[int, str] | None:
        """Read a remote shard once and count it (into the shard cache when there is one); None
        when another process of the node does it now and ``wait`` is False."""
        key = self._key(url)
        with self.cache.claim(key, wait) as mine:
            if not mine:
                return None
            cached = self.cache.get(key) if key is not None else None  # counted while we waited
            if cached is not None:
                return cached, "counted (cache)"
            shards = shard_cache(self.network)
            identity = self._version(url)
            path = None
            if shards is not None and shards.cacheable(identity):
                assert identity is not None
                path = shards.ensure(url, identity, self.network, wait=wait)
                if path is None and not wait and not shards.broken:
                    return None  # another process fills it now
            try:
                n = _count_file(path if path is not None else url, self.network, self.policy)
            except SourceError:
                if path is None:
                    raise
                n = _count_file(url, self.network, self.policy)  # the copy was evicted meanwhile (cache_size)
            if key is not None:
                self.cache.put(key, n)
        return n, "counted"

    def _local(self, url: str, path: str) -> tuple[int, str]:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise SourceError("no such file", url) from None
        except OSError as e:
            raise SourceError(f"cannot open: {e.strerror}", url) from None
        for index_url in _sidecar_urls(url):
            index_path = local_path(index_url)
            if index_path is None or not os.path.isfile(index_path):
                continue
            found = _read_sidecar(index_url)
            what = stale_index(url, st, index_path, found.size, found.end)
            if what is None:
                return found.samples, found.source
            if index_url not in self.warned:
                self.warned.add(index_url)
                rebuild = ("energon prepare --tar-index-only DATASET_ROOT" if found.source.startswith("energon ")
                           else f"tarindex {url}")
                self.warn(f"{index_url}: stale index ({what}); counting {url} instead (rebuild the index with: "
                          f"{rebuild})", DataWarning)
            break
        return self._count_local(url, path, st)

    def _count_local(self, url: str, path: str, st: os.stat_result) -> tuple[int, str]:
        key = ["local", os.path.realpath(path), st.st_size, st.st_mtime_ns, *_policy_key(self.policy)]
        cached = self.cache.get(key)
        if cached is not None:
            return cached, "counted (cache)"
        n = _count_file(url, policy=self.policy)
        try:
            after = os.stat(path)
        except OSError:
            after = None
        if after is not None and (after.st_size, after.st_mtime_ns) == (st.st_size, st.st_mtime_ns):
            self.cache.put(key, n)  # not a file that changed while it was read
        return n, "counted"


def _count_file(url: str, network: Network | None = None, policy: ReadPolicy = ReadPolicy()) -> int:
    """The samples of a shard, read once as ``policy`` says: a local file's headers only (its index),
    else the stream. What the policy lets pass with a warning is said by the epoch that reads it,
    not here too."""
    if local_path(url) is not None:
        try:
            return len(build_index(url, policy=policy, warn=_unsaid))
        except (CompressedShardError, LinkError):
            pass  # compressed, or links: not indexable for random access, but read as a stream all the same
    return sum(1 for _ in read_samples(url, network=network, policy=policy, warn=_unsaid))


def _unsaid(message: str) -> None:
    """A counting read's warnings: the epoch's read of the same shard says them."""


def _policy_key(policy: ReadPolicy) -> list[Any]:
    """What of a read policy changes a count, for the counts' cache key: nothing under the default
    policy (the keys counts had before policies), else the fields that change which samples are read."""
    fields = [policy.links, policy.ignore_zeros, policy.max_member_size, policy.dup == "error"]
    default = ReadPolicy()
    if fields == [default.links, default.ignore_zeros, default.max_member_size, True]:
        return []
    return ["policy", *fields]


def _sidecar_urls(url: str) -> list[str]:
    ours, dali = default_index_url(url), default_index_url(url, "dali")
    return [ours] if dali == ours else [ours, dali]


def _read_sidecar(index_url: str, network: Network | None = None) -> _Sidecar:
    """The count a sidecar index records (either format); SourceError when it can't be opened,
    IndexFileError naming it and the line when it is not a good index. A remote one is read as
    ``network`` says: with a shard cache, it is copied there whole (the readers that seek with it
    read it from there)."""
    with open_source(index_url, network=network) as source:
        head = b""
        while b"\n" not in head and len(head) <= _MAX_HEADER:
            chunk = source.read(1 << 16)
            if not chunk:
                break
            head += chunk
        if index_kind(head) == "energon":  # megatron-energon's SHARD.tar.idx: binary offsets, a count
            energon = read_energon_index(source, index_url, head)
            return _Sidecar(energon.samples, f"energon index {index_url}", None, energon.end)
        first, newline, rest = head.partition(b"\n")
        if not first.strip():
            what = "empty file" if not head else "empty first line"
            raise IndexFileError(f"line 1: {what}, neither a tarproc nor a DALI index", index_url)
        if len(first) > _MAX_HEADER:
            raise IndexFileError("line 1: a first line of over 1 MiB: neither a tarproc nor a DALI index", index_url)
        try:
            line = first.decode("utf-8")
        except UnicodeDecodeError:
            raise IndexFileError("line 1: not UTF-8 text, neither a tarproc nor a DALI index", index_url) from None
        if line.lstrip().startswith("{"):
            return _tarproc_header(line, index_url)
        if line.lstrip().startswith("v"):
            return _dali_index(line, rest, source, index_url)
    raise IndexFileError("line 1: neither a tarproc index (a JSON header) nor a DALI index ('v1.2 N')", index_url)


def _tarproc_header(line: str, index_url: str) -> _Sidecar:
    def fail(reason: str) -> IndexFileError:
        return IndexFileError(f"line 1: {reason}", index_url)

    header = _json(line)
    if not isinstance(header, dict):
        raise fail("not a tarproc index (the first line is not a JSON object)")
    if header.get("format") != INDEX_FORMAT:
        raise fail(f"not a tarproc index (no \"format\": \"{INDEX_FORMAT}\" header)")
    if header.get("version") != INDEX_VERSION:
        raise fail(f"index version {_show(header.get('version'))} is not supported "
                   f"(this tarproc reads version {INDEX_VERSION})")
    samples, size = header.get("samples"), header.get("size")
    if type(samples) is not int or not 0 <= samples <= _MAX_COUNT:
        raise fail(f"bad header: samples is {_show(samples)}, not a number of samples")
    if type(size) is not int or not 0 <= size <= _MAX_COUNT:
        raise fail(f"bad header: size is {_show(size)}, not a number of bytes")
    return _Sidecar(samples, f"index {index_url}", size, None)


def _dali_index(line: str, rest: bytes, source: Any, index_url: str) -> _Sidecar:
    parts = line.split()
    if len(parts) != 2 or not parts[1].isdigit() or not parts[1].isascii():
        raise IndexFileError(f"line 1: bad DALI index header {_show(line.strip())} (expected 'v1.2 N')", index_url)
    if parts[0] not in DALI_VERSIONS:
        raise IndexFileError(f"line 1: DALI index version {_show(parts[0])} is not supported "
                             f"(read here: {', '.join(DALI_VERSIONS)})", index_url)
    announced = int(parts[1])
    # count the non-empty lines that follow, a chunk at a time; remember the last one
    lines = 0
    lineno = 1  # the file's line number of the last line seen
    last_lineno = 1  # ... and of the last non-empty one
    last = b""
    pending = rest
    while True:
        chunk = source.read(1 << 20)
        data = pending + chunk
        pieces = data.split(b"\n")
        pending = pieces.pop() if chunk else b""  # keep a line cut at the end of the chunk
        for piece in pieces:
            lineno += 1
            if piece.strip():
                lines += 1
                last, last_lineno = piece, lineno
                if lines > announced:
                    raise IndexFileError(f"line {lineno}: the header announces {announced} samples, "
                                         "but the file has more lines", index_url)
        if not chunk:
            break
    if lines != announced:
        raise IndexFileError(f"line {last_lineno}: the header announces {announced} samples, but the file has {lines}",
                             index_url)
    return _Sidecar(announced, f"DALI index {index_url}", None, _dali_end(parts[0], last))


def _dali_end(version: str, line: bytes) -> int | None:
    """Where the sample of a v1.2 line (``EXT OFFSET SIZE NAME`` groups) ends, or None when the
    line doesn't read that way (then the index can't be checked against the shard's size)."""
    tokens = line.split()
    if version != "v1.2" or not tokens or len(tokens) % 4:
        return None
    end = 0
    for i in range(0, len(tokens), 4):
        offset, size = tokens[i + 1], tokens[i + 2]
        if not (offset.isdigit() and size.isdigit()):
            return None
        end = max(end, int(offset) + int(size))
    return end


class _Cache:
    """Counts by shard identity, one JSON file each; every failure is a miss, never an error."""

    def __init__(self, root: str) -> None:
        self.dir = os.path.join(root, "counts")

    def _path(self, key: list[Any]) -> str:
        digest = hashlib.sha256(json.dumps(key, separators=(",", ":")).encode("utf-8", "surrogatepass")).hexdigest()
        return os.path.join(self.dir, digest + ".json")

    def get(self, key: list[Any]) -> int | None:
        try:
            with open(self._path(key), "rb") as f:
                record = json.loads(f.read(1 << 16))
        except (OSError, ValueError, RecursionError):
            return None
        if not isinstance(record, dict) or record.get("version") != CACHE_VERSION or record.get("key") != key:
            return None
        n = record.get("samples")
        return n if type(n) is int and n >= 0 else None

    @contextlib.contextmanager
    def claim(self, key: list[Any] | None, wait: bool) -> Iterator[bool]:
        """Hold the right to count ``key``'s shard on this node (a file lock): True when held, False
        when another process holds it and ``wait`` is False. No key, or no lock to be had: True."""
        if key is None:
            yield True
            return
        try:
            locks = os.path.join(os.path.dirname(self.dir), "locks", "counts")
            os.makedirs(locks, exist_ok=True)
            fd = os.open(os.path.join(locks, os.path.basename(self._path(key))), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield True
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except OSError as e:
                yield e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN)  # held; else no locks here: count it
                return
            yield True
        finally:
            os.close(fd)

    def put(self, key: list[Any], n: int) -> None:
        record = json.dumps({"version": CACHE_VERSION, "key": key, "samples": n}).encode("utf-8", "surrogatepass")
        tmp = None
        try:
            os.makedirs(self.dir, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".tmp-", suffix=".json")
            with os.fdopen(fd, "wb") as f:
                f.write(record)
            os.replace(tmp, self._path(key))
            tmp = None
        except OSError:
            pass
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


__all__ = ["ShardCounts", "default_cache_dir", "manifest_digests", "shard_counts"]
