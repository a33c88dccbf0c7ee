"""Samples: group tar members into dicts by key (the WebDataset convention).

The key rule: key = directory part + basename up to the *first* dot of the basename; the field is
everything after that dot, lower-cased (``dir.v2/img.seg.png`` -> key ``dir.v2/img``, field
``seg.png``). A basename with no dot, or starting with a dot, has no key: such names are counted
(``ReadStats.no_key_count``) and dropped. Members whose first path component looks like
``__name__``, and fields named ``__name__``, are metadata and are skipped.

In memory a sample carries ``__key__`` and ``__url__``; writers never write them as members.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .errors import DataWarning, DuplicateError, OptionError, TarprocError, warner
from .tar import (
    DUP_POLICIES,
    ON_ERROR_POLICIES,
    FileRange,
    ReadPolicy,
    ReadStats,
    iter_keyed_members,
    split_key,
)
from .tar.policy import SAMPLE_FIELDS, policy_with_keywords

if TYPE_CHECKING:  # the sources are imported where used: the commands that read none start without them
    from .sources import Network, Prefetcher

# the C grouper (tarproc/_speedups.c); _group_python is the reference. TARPROC_PURE_PYTHON=1 turns it
# off, and so does setting _Grouper to None (the tests do, to compare the two).
_Grouper: Any = None
if not os.environ.get("TARPROC_PURE_PYTHON"):
    try:
        from ._speedups import Grouper as _Grouper  # type: ignore[no-redef]
    except ImportError:  # pragma: no cover - built by pip install; absent only without a compiler
        _Grouper = None

Sample = dict[str, Any]
_NO_KEY_EXAMPLES = 10
_NO_SAMPLE = object()


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, field)`` of a member name, or None when the name has no key.

    >>> split_name("dir.v2/img.seg.PNG")
    ('dir.v2/img', 'seg.png')
    >>> split_name("README") is None, split_name("a/.hidden.txt") is None
    (True, True)
    """
    key, field = split_key(name)
    return None if key is None else (key, field)


def _check_dup_policy(dup: str) -> None:
    if dup not in DUP_POLICIES:
        raise OptionError(f"bad duplicate policy {dup!r}; use one of {', '.join(DUP_POLICIES)}")


def check_read_policies(on_error: str, dup: str) -> None:
    """Raise OptionError unless ``dup`` is one of DUP_POLICIES and ``on_error`` one of ON_ERROR_POLICIES."""
    _check_dup_policy(dup)
    if on_error not in ON_ERROR_POLICIES:
        raise OptionError(f"bad error policy {on_error!r}; use one of {', '.join(ON_ERROR_POLICIES)}")


def field_names(sample: Sample) -> list[str]:
    """The data fields of a sample, sorted (``__key__``, ``__url__`` and other ``__x__`` left out).

    >>> field_names({"__key__": "a", "txt": b"x", "cls": b"1"})
    ['cls', 'txt']
    """
    return sorted(k for k in sample if not k.startswith("__"))


def is_metadata_name(name: str) -> bool:
    """True for ``__name__/...`` members and ``KEY.__field__`` names, which readers skip."""
    first = name.split("/", 1)[0]
    if len(first) > 4 and first.startswith("__") and first.split(".", 1)[0].endswith("__"):
        return True
    split = split_name(name)
    return split is not None and split[1].startswith("__")


def group_samples(
    members: Iterable[tuple[str, bytes, int]],
    url: str | None = None,
    *,
    dup: str = "error",
    stats: ReadStats | None = None,
    warn: Callable[[str], None] | None = None,
) -> Iterator[Sample]:
    """Group ``(name, data, offset)`` members (as ``iter_members`` yields them) into sample dicts.

    ``dup`` decides what happens with a field that occurs twice in a sample, or a key that
    reappears after other keys (a tar not made with ``--sort=name``): ``"error"`` raises
    ``DuplicateError`` naming both offsets; ``"warn"`` reports it through ``warn`` (default: a
    ``DataWarning``) and drops the duplicate; ``"skip"`` drops it silently (both count ``stats.duplicates``).
    """
    keyed = ((*split_key(name), data, offset) for name, data, offset in members)
    return group_keyed(keyed, url, dup=dup, stats=stats, warn=warn)


def group_keyed(
    members: Iterable[tuple[str | None, str, bytes, int]],
    url: str | None = None,
    *,
    dup: str = "error",
    stats: ReadStats | None = None,
    warn: Callable[[str], None] | None = None,
) -> Iterator[Sample]:
    """``group_samples`` for ``(key, field, data, offset)`` members (``iter_keyed_members``): tuples
    of a str key (None for a name without one), a str field, the data and an int offset."""
    _check_dup_policy(dup)
    if stats is None:
        stats = ReadStats()
    return _group(members, url, dup, stats, warner(warn, DataWarning))


class _Rules:
    """What grouping does with the members that don't simply go into a sample -- a repeated field,
    a key that reappears, a name without a key, metadata -- and the count of samples: shared by the
    Python grouper (``_group``, the reference) and the C one (``_speedups.Grouper``), so that both
    count, warn and raise alike."""

    __slots__ = ("dup", "stats", "url", "warn")

    def __init__(self, url: str | None, dup: str, stats: ReadStats, warn: Callable[[str], None]) -> None:
        self.url, self.dup, self.stats, self.warn = url, dup, stats, warn

    def sample(self) -> None:
        """A sample is handed out."""
        self.stats.samples += 1

    def metadata(self) -> None:
        """A ``__field__`` member is skipped."""
        self.stats.metadata += 1

    def metadata_name(self, key: str, field: str) -> bool:
        """Whether a member that starts a key is metadata (``__name__/...``, ``KEY.__field__``):
        then it is counted, and skipped."""
        if is_metadata_name(f"{key}.{field}"):
            self.stats.metadata += 1
            return True
        return False

    def no_key(self, field: str) -> None:
        """A member whose name has no key (``field`` is the whole name) is counted, and skipped."""
        self.stats.no_key_count += 1
        if len(self.stats.no_key) < _NO_KEY_EXAMPLES:
            self.stats.no_key.append(field)

    def duplicate_field(self, key: str, field: str, first: int, offset: int) -> None:
        """A field a sample has already: an error, or counted (and warned of) and skipped."""
        self._duplicate(f"duplicate field {field!r} in sample {key!r} (members at bytes {first} and {offset})",
                        key, "keeping the first")

    def reappearing_key(self, key: str, first: int, offset: int) -> None:
        """A key that comes back after other keys: an error, or counted (and warned of); its
        members are then dropped."""
        self._duplicate(f"key {key!r} reappears at byte {offset} after other keys (first seen at byte {first}); "
                        "was the tar made without --sort=name?", key, "dropping the later members")

    def _duplicate(self, message: str, key: str, then: str) -> None:
        if self.dup == "error":
            raise DuplicateError(message, self.url, key)
        self.stats.duplicates += 1
        if self.dup == "warn":
            self.warn(f"{self.url}: {message}; {then}")


def _group(
    members: Iterable[tuple[str | None, str, bytes | memoryview | FileRange, int]],
    url: str | None,
    dup: str,
    stats: ReadStats,
    warn: Callable[[str], None],
) -> Iterator[Sample]:
    """Group keyed members into samples: the C grouper where it is built, else ``_group_python``."""
    rules = _Rules(url, dup, stats, warn)
    if _Grouper is not None:
        return _Grouper(iter(members), url, rules)  # type: ignore[no-any-return]
    return _group_python(members, url, rules)


def _group_python(
    members: Iterable[tuple[str | None, str, bytes | memoryview | FileRange, int]],
    url: str | None,
    rules: _Rules,
) -> Iterator[Sample]:
    """The grouper, the reference of the C one: consecutive members with the same key make a sample."""
    sample: Sample | None = None
    offsets: dict[str, int] = {}  # field -> offset, for the current sample
    key_offset: dict[str, int] = {}  # key -> offset of its first member, for this shard
    cur_key: object = _NO_SAMPLE  # never equal to a key, nor to None (a name without a key)
    dropping = False  # dropping the members of a reappearing key

    for key, field, data, offset in members:
        if key == cur_key:
            if dropping:
                continue
            assert sample is not None and key is not None
            if field.startswith("__"):
                rules.metadata()
            elif field in sample:
                rules.duplicate_field(key, field, offsets[field], offset)
            else:
                sample[field] = data
                offsets[field] = offset
            continue
        if key is None:
            rules.no_key(field)
            continue
        if (key[:1] == "_" or field.startswith("__")) and rules.metadata_name(key, field):
            continue
        # a new key
        if sample is not None:
            rules.sample()
            yield sample
            sample = None
        cur_key = key
        dropping = key in key_offset
        if dropping:
            rules.reappearing_key(key, key_offset[key], offset)
            continue
        key_offset[key] = offset
        sample = {"__key__": key, "__url__": url, field: data}
        offsets = {field: offset}
    if sample is not None:
        rules.sample()
        yield sample


def read_samples(
    urls: str | Iterable[str],
    *,
    policy: ReadPolicy = ReadPolicy(),
    stats: ReadStats | None = None,
    warn: Callable[[str], None] | None = None,
    views: bool = False,
    refs: bool = False,
    network: Network | None = None,
    prefetcher: Prefetcher | None = None,
    **old: Any,
) -> Iterator[Sample]:
    """Read samples from one or more tar shards, in order. Grouping restarts at every shard.

    Args:
        urls: a URL or a list of them, each expanded like the commands' arguments (brace lists,
            ``::`` joins; ``-`` is stdin; ``pipe:CMD``; paths; any fsspec URL). Compression is
            detected from the data.
        policy: how to read (``ReadPolicy``): duplicates (``dup``), the largest member, links,
            zero blocks, and ``on_error``: ``"skip-shard"`` reports a failing shard through
            ``warn`` and goes on with the next; the default ``"fail"`` raises. The policy's
            keywords given directly (``dup=``, ``on_error=`` ...) still work, deprecated.
        stats: counters to fill in (``ReadStats``).
        warn: a callback that takes each warning instead (default: ``warnings.warn`` with a
            ``DataWarning``, see ``tarproc.errors.warn``).
        views: for samples written out at once (``tarcat``, ``tarsplit``): values of 64 KiB or
            more may be read-only memoryviews of what was read, not bytes (see
            ``iter_keyed_members``).
        refs: from a plain local file, values of 64 KiB or more that were not in what was read
            come as ``tar.FileRange``: data left in the file, for ``TarWriter`` to have the kernel
            copy (``tarcat``, ``tarsplit``, with ``views``) or a decoder to read when it needs it
            (the ``Dataset``'s shuffle buffer). A range holds its shard open while it is held.
        network: how remote shards are read (retries, read-ahead, the shard cache; default
            ``sources.settings()``): with read-ahead, the next remote shards are opened and read
            ahead while one is read.
        prefetcher: the caller's read-ahead, which may have opened the first shard already.

    >>> import io, tempfile, os
    >>> from tarproc import TarWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "s.tar")
    >>> with open(path, "wb") as f, TarWriter(f) as w:
    ...     w.write_sample({"__key__": "a", "txt": b"x", "cls": b"1"})
    >>> [(s["__key__"], s["cls"]) for s in read_samples(path)]
    [('a', b'1')]
    """
    from .sources import Prefetcher, expand_urls, finish_fills, open_remote, settings

    policy = policy_with_keywords(policy, old, SAMPLE_FIELDS, "read_samples")
    if stats is None:
        stats = ReadStats()
    network = network if network is not None else settings()
    if stats.warn is None and warn is not None:
        stats.warn = warn  # the reader's own warnings (a symbolic link left out) go where the grouper's go
    warn = warner(warn, DataWarning)
    url_list = expand_urls([urls] if isinstance(urls, str) else urls)
    if prefetcher is not None:
        yield from _read_shards(url_list, prefetcher, network, policy, stats, warn, views, refs)
        finish_fills(network)
        return
    with Prefetcher(lambda url, offset, budget, end: open_remote(url, offset, network, budget, end),
                    network.prefetch) as ahead:
        yield from _read_shards(url_list, ahead, network, policy, stats, warn, views, refs)
    finish_fills(network)


def _read_shards(
    url_list: list[str], ahead: Prefetcher, network: Network, policy: ReadPolicy, stats: ReadStats,
    warn: Callable[[str], None], views: bool, refs: bool,
) -> Iterator[Sample]:
    from .sources import is_fsspec_url, open_source
    from .sources.prefetch import DEPTH

    for i, url in enumerate(url_list):
        stats.shards += 1
        try:
            with open_source(url, network=network, prefetcher=ahead) as stream:
                for following in url_list[i + 1 : i + 1 + DEPTH] if network.prefetch else ():
                    if is_fsspec_url(following):
                        ahead.schedule(following)  # opened while this one is read
                members = iter_keyed_members(stream, url, policy=policy, stats=stats, views=views, refs=refs)
                yield from _group(members, url, policy.dup, stats, warn)
        except TarprocError as e:
            if policy.on_error == "fail":
                raise
            stats.shards_failed += 1
            stats.errors.append(str(e))
            warn(f"{e}; skipping the rest of this shard")


def read_samples_from(
    url: str, offset: int, *, policy: ReadPolicy = ReadPolicy(), network: Network | None = None,
    prefetcher: Prefetcher | None = None, end: int | None = None, refs: bool = False, **old: Any,
) -> Iterator[Sample]:
    """The samples of one shard from the member header at byte ``offset`` on (an index gives it):
    a local file or a URL whose store takes range requests, read from there, not from the start.
    Errors name the byte in the shard, as ``read_samples``'s do. ``policy`` as for
    ``read_samples`` (its ``on_error`` is the caller's to apply; ``dup=`` and
    ``max_member_size=`` given directly still work, deprecated). ``network``, ``prefetcher`` and
    ``end`` (where the caller expects to stop) as for ``open_source``; ``refs`` as for
    ``read_samples``.
    """
    from .errors import TarFormatError
    from .sources import open_source

    policy = policy_with_keywords(policy, old, ("dup", "max_member_size"), "read_samples_from")
    stats = ReadStats()
    with open_source(url, offset=offset, network=network, prefetcher=prefetcher, end=end) as stream:
        # the reader counts from where it started: the members' offsets, and its errors', are moved by offset
        members = iter_keyed_members(stream, url, policy=policy, stats=stats, refs=refs)
        placed = ((key, field, data, at + offset) for key, field, data, at in members)
        try:
            yield from _group(placed, url, policy.dup, stats, warner(None, DataWarning))
        except TarFormatError as e:
            raise type(e)(url, e.offset + offset, e.reason, e.member) from None


__all__ = [
    "DUP_POLICIES",
    "ON_ERROR_POLICIES",
    "Sample",
    "group_keyed",
    "field_names",
    "group_samples",
    "is_metadata_name",
    "read_samples",
    "read_samples_from",
    "split_name",
]
