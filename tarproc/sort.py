"""Sort or shuffle samples in bounded memory: an external merge sort over temporary tar runs.

``sort_samples`` sorts by ``__key__`` (the default), by a field's value (UTF-8 text, stripped, or
a number with ``numeric=True``; ``json.label`` reaches into a JSON field), or shuffles with
``shuffle=True`` (a random 64-bit sort key per sample, so a shuffle scales like a sort). Samples
are buffered until their estimated size reaches half of ``memory``; if the whole input fits, it is
sorted and emitted without touching the disk. Otherwise each full buffer is sorted and written as
a plain tar *run* into a private temporary directory (under ``tmpdir``), and the runs are merged
with ``heapq.merge``; with more runs than the merge can read at once within the bound, groups of
runs are merged into longer runs first (a multi-pass merge). The directory is removed whatever
happens: success, an error, or the consumer closing the generator early.

The sort is stable: samples with equal sort keys keep their input order (also with ``reverse``),
in memory because ``list.sort`` is stable, across runs because runs hold consecutive stretches of
the input and ``heapq.merge`` breaks ties by argument order.

Duplicate keys are checked only when sorting by ``__key__``, where they end up next to each other:
an error by default (``DuplicateError`` naming the key), or ``unique="first"``/``"last"`` keeps the
first/last occurrence in input order. A field sort or a shuffle does not look for them (that would
take a set of every key); the writer still refuses the same key twice in a row.

Samples that went through the disk come back with bytes values (a ``str`` field comes back as its
UTF-8 bytes) and with their ``__url__``.

>>> samples = [{"__key__": k, "cls": c} for k, c in [("b", b"2"), ("a", b"10"), ("c", b"1")]]
>>> [s["__key__"] for s in sort_samples(samples)]
['a', 'b', 'c']
>>> [s["__key__"] for s in sort_samples(samples, "cls", numeric=True, reverse=True)]
['a', 'b', 'c']
>>> [s["__key__"] for s in sort_samples(samples, "cls")]
['c', 'a', 'b']
"""

from __future__ import annotations

import atexit
import contextlib
import heapq
import json
import os
import random
import shutil
import struct
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, BinaryIO

from .errors import DuplicateError, OptionError, SampleError, SinkError
from .samples import Sample, field_names, group_keyed
from .tar import ReadPolicy, TarWriter, iter_keyed_members, sample_members

_RUN_MEMBER_LIMIT = 1 << 62  # the largest size the reader accepts at all
_RUN_POLICY = ReadPolicy(max_member_size=_RUN_MEMBER_LIMIT, links="skip")  # our own run files: no links

DEFAULT_MEMORY = 512 << 20
MIN_MEMORY = 256_000  # 256K; less leaves no room for the merge buffers
UNIQUE_POLICIES = ("first", "last")
MISSING_POLICIES = ("error", "last")

# What a buffered sample costs beyond its data bytes (dict, key string, the (sort key, sample)
# pair, list slot) and what each field adds (its name, the bytes object's header, the dict slot).
# Measured with tracemalloc on samples read by read_samples, rounded up.
_SAMPLE_OVERHEAD = 300
_FIELD_OVERHEAD = 64
_RUN_FRACTION = 0.5  # of the bound, for the run buffer; the rest is for reading and merging
_SIDE = struct.Struct("<QI")  # per sample in a run's side file: random sort key, URL number
_SIDE_BLOCK = 4096  # side records read at a time
_MISSING = object()
_live_dirs: set[str] = set()


@dataclass
class SortStats:
    """What a sort did: samples, initial runs written, merge passes, bytes of run files, where."""

    samples: int = 0
    runs: int = 0
    merge_passes: int = 0
    spilled_bytes: int = 0
    tmpdir: str | None = None
    dropped: int = 0  # duplicates dropped by unique="first"/"last"

    def describe(self) -> str:
        """One line for a report.

        >>> SortStats(samples=3).describe()
        'sorted 3 samples in memory'
        """
        if not self.runs:
            text = f"sorted {self.samples} samples in memory"
        else:
            text = (
                f"sorted {self.samples} samples through {self.runs} temporary runs ({self.spilled_bytes} bytes "
                f"written under {self.tmpdir}), {self.merge_passes} merge pass(es)"
            )
        if self.dropped:
            text += f"; dropped {self.dropped} duplicate(s)"
        return text


def sort_samples(
    samples: Iterable[Sample],
    key: str = "__key__",
    *,
    numeric: bool = False,
    reverse: bool = False,
    shuffle: bool = False,
    seed: int | None = None,
    memory: int = DEFAULT_MEMORY,
    tmpdir: str | None = None,
    unique: str | None = None,
    missing: str = "error",
    stats: SortStats | None = None,
    fan_in: int | None = None,
) -> Iterator[Sample]:
    """Sort ``samples`` by ``key`` (``"__key__"`` or a field) in about ``memory`` bytes; see the module doc.

    ``numeric`` parses values as int or float (an unparsable one is a ``SampleError`` naming the
    key, field and value); ``missing="last"`` sorts samples lacking the field after all others
    (default: an error naming the sample). ``shuffle`` with ``seed`` gives a reproducible random
    order. ``unique`` (``"first"``/``"last"``) resolves duplicate keys of a key sort. ``fan_in``
    caps how many runs one merge reads at once (default: as many as fit in the bound).
    """
    if memory < MIN_MEMORY:
        raise OptionError(f"memory bound {memory} is too small; use at least {MIN_MEMORY} bytes")
    if unique is not None and unique not in UNIQUE_POLICIES:
        raise OptionError(f"bad duplicate policy {unique!r}; use one of {', '.join(UNIQUE_POLICIES)}")
    if missing not in MISSING_POLICIES:
        raise OptionError(f"bad missing-field policy {missing!r}; use one of {', '.join(MISSING_POLICIES)}")
    if shuffle and (key != "__key__" or numeric or reverse or unique is not None):
        raise OptionError("a shuffle takes no sort key, numeric, reverse or unique option")
    if unique is not None and key != "__key__":
        raise OptionError("duplicates are resolved only when sorting by __key__")
    if not key:
        raise OptionError("empty sort key field")
    if fan_in is not None and fan_in < 2:
        raise OptionError("a merge needs a fan-in of at least 2")
    if shuffle and seed is None:
        seed = random.SystemRandom().getrandbits(64)
    sorter = _Sorter(
        key_of=None if shuffle else _key_function(key, numeric, reverse, missing),
        reverse=reverse,
        seed=seed,
        memory=memory,
        tmpdir=tmpdir,
        stats=stats if stats is not None else SortStats(),
        fan_in=fan_in,
    )
    return _emit(sorter.run(samples), key == "__key__" and not shuffle, unique, sorter.stats)


# ---------------------------------------------------------------------------------------------
# sort keys


def _key_function(key: str, numeric: bool, reverse: bool, missing: str) -> Callable[[Sample], Any]:
    """The sort key of a sample; every failure names the sample."""
    if key == "__key__":
        if not numeric:
            return itemgetter("__key__")
        return lambda sample: _number(sample["__key__"], sample, key)

    def value_of(sample: Sample) -> Any:
        value = _field_value(sample, key)
        if value is _MISSING:
            if missing == "error":
                fields = ", ".join(field_names(sample))
                raise SampleError(
                    f"sample {sample.get('__key__')!r} has no field {key!r} (it has: {fields}); "
                    "sort such samples last with --missing last",
                    sample.get("__url__"),
                    sample.get("__key__"),
                )
            # a rank before the value puts samples lacking the field last, also in reverse order
            return (-1 if reverse else 1, 0 if numeric else "")
        if numeric:
            number = value if _is_number(value) else _number(_text(value, sample, key), sample, key)
            return number if missing == "error" else (0, number)
        text = value if isinstance(value, str) else _text(value, sample, key)
        return text if missing == "error" else (0, text)

    return value_of


def _field_value(sample: Sample, key: str) -> Any:
    """The field's value; for ``json.a.b``, where ``json`` is a field, the value at ``a.b`` in it."""
    if key in sample:
        return sample[key]
    parts = key.split(".")
    for i in range(len(parts) - 1, 0, -1):  # the longest field name first: 'seg.json.label'
        name = ".".join(parts[:i])
        if name not in sample:
            continue
        raw = sample[name]
        try:
            obj = json.loads(raw) if isinstance(raw, (bytes, bytearray, str)) else raw
        except (ValueError, RecursionError) as e:
            reason = "nested too deeply to parse" if isinstance(e, RecursionError) else str(e)
            raise SampleError(
                f"sample {sample.get('__key__')!r}: field {name!r} is not JSON ({reason}), so {key!r} has no value",
                sample.get("__url__"),
                sample.get("__key__"),
            ) from None
        for part in parts[i:]:
            if isinstance(obj, dict) and part in obj:
                obj = obj[part]
            elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
                obj = obj[int(part)]
            else:
                return _MISSING
        if isinstance(obj, str) or _is_number(obj):
            return obj
        return json.dumps(obj, sort_keys=True)  # a JSON object, list, bool or null sorts as its text
    return _MISSING


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any, sample: Sample, key: str) -> str:
    if isinstance(value, str):
        return value.strip()
    if _is_number(value):
        return str(value)
    try:
        return bytes(value).decode("utf-8").strip()
    except (UnicodeDecodeError, TypeError):
        raise SampleError(
            f"sample {sample.get('__key__')!r}: field {key!r} is not UTF-8 text ({_preview(value)})",
            sample.get("__url__"),
            sample.get("__key__"),
        ) from None


def _number(text: Any, sample: Sample, key: str) -> int | float:
    """An int, else a float (not NaN, which has no place in an order)."""
    if _is_number(text):
        return text  # type: ignore[no-any-return]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if number != number:
        raise SampleError(
            f"sample {sample.get('__key__')!r}: {key} value {_preview(text)} is not a number",
            sample.get("__url__"),
            sample.get("__key__"),
        )
    return number


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _emit(
    pairs: Generator[tuple[Any, Sample], None, None], check: bool, unique: str | None, stats: SortStats
) -> Iterator[Sample]:
    """The samples of sorted ``(sort key, sample)`` pairs; closing this closes the sort (and its files)."""
    with contextlib.closing(pairs):
        if check:
            yield from _check_unique(pairs, unique, stats)
        else:
            for _, sample in pairs:
                yield sample


def _check_unique(pairs: Iterable[tuple[Any, Sample]], unique: str | None, stats: SortStats) -> Iterator[Sample]:
    """Resolve duplicate keys, which a key sort has put in one stretch of equal sort keys.

    Numerically equal keys ('1', '01') share a stretch, hence a dict per stretch, not a neighbour.
    """
    current: Any = _MISSING
    seen: dict[str, Any] = {}  # key -> its sample (unique="last") or its URL
    for sort_key, sample in pairs:
        if sort_key != current:
            if unique == "last":
                yield from seen.values()
            seen = {}
            current = sort_key
        name = sample["__key__"]
        if name in seen:
            if unique is None:
                first, url = seen[name], sample.get("__url__")
                where = f"twice in {url}" if first == url else f"in {first} and {url}"
                raise DuplicateError(
                    f"duplicate key {name!r} ({where}); keep one with --unique first or --unique last", key=name
                )
            stats.dropped += 1
            if unique == "last":
                del seen[name]  # the last occurrence takes the place of the earlier one
                seen[name] = sample
            continue
        if unique == "last":
            seen[name] = sample
        else:
            seen[name] = sample.get("__url__")
            yield sample
    if unique == "last":
        yield from seen.values()


# ---------------------------------------------------------------------------------------------
# the external sort


def _estimate(sample: Sample) -> int:
    size = _SAMPLE_OVERHEAD
    for value in sample.values():
        size += _FIELD_OVERHEAD + (len(value) if isinstance(value, (bytes, bytearray, str)) else 64)
    return size


@dataclass
class _Run:
    path: str  # a tar of the run's samples, keys prefixed with their position: '1f/KEY'
    side: str  # per sample: the random sort key and the number of its __url__


class _CappedReader:
    """A file whose reads return at most ``cap`` bytes, so a run being merged buffers little."""

    def __init__(self, f: BinaryIO, cap: int) -> None:
        self._f = f
        self._cap = cap

    def read(self, n: int = -1) -> bytes:
        return self._f.read(self._cap if n < 0 or n > self._cap else n)


class _Sorter:
    def __init__(
        self,
        key_of: Callable[[Sample], Any] | None,
        reverse: bool,
        seed: int | None,
        memory: int,
        tmpdir: str | None,
        stats: SortStats,
        fan_in: int | None,
    ) -> None:
        self.key_of = key_of
        self.reverse = reverse
        self.rng = random.Random(seed)
        self.memory = memory
        self.tmpdir = tmpdir
        self.stats = stats
        self.fan_in = fan_in
        self.dir: str | None = None
        self.urls: list[Any] = []
        self.url_ids: dict[Any, int] = {}
        self.largest = 0  # the largest sample seen (estimated), for the merge's buffers
        self.chunk = min(1 << 20, max(16 << 10, memory // 128))  # bytes read from a run at a time
        self.nruns = 0

    # -- phases --

    def run(self, samples: Iterable[Sample]) -> Generator[tuple[Any, Sample], None, None]:
        try:
            yield from self._sort(samples)
        finally:
            self._cleanup()

    def _sort(self, samples: Iterable[Sample]) -> Iterator[tuple[Any, Sample]]:
        limit = int(self.memory * _RUN_FRACTION)
        key_of = self.key_of
        rng = self.rng
        buf: list[tuple[Any, Sample]] = []
        size = 0
        runs: list[_Run] = []
        for sample in samples:
            buf.append((key_of(sample) if key_of is not None else rng.getrandbits(64), sample))
            cost = _estimate(sample)
            if cost > self.largest:
                self.largest = cost
            size += cost
            self.stats.samples += 1
            if size >= limit:
                buf.sort(key=itemgetter(0), reverse=self.reverse)
                runs.append(self._write_run(buf))
                buf = []  # a new list: clear() would keep the old one's slot array
                size = 0
        buf.sort(key=itemgetter(0), reverse=self.reverse)
        if not runs:
            yield from buf
            return
        if buf:
            runs.append(self._write_run(buf))
            del buf
        self.stats.runs = len(runs)
        fan_in = self._fan_in()
        while len(runs) > fan_in:
            # merge consecutive groups (keeps ties in input order), and free their disk at once
            merged = []
            for i in range(0, len(runs), fan_in):
                group = runs[i : i + fan_in]
                if len(group) == 1:
                    merged.append(group[0])
                    continue
                with contextlib.closing(self._merge(group)) as pairs:
                    merged.append(self._write_run(pairs))
                for run in group:
                    self._remove(run)
            runs = merged
            self.stats.merge_passes += 1
        self.stats.merge_passes += 1
        yield from self._merge(runs)

    def _fan_in(self) -> int:
        """Runs one merge may read at once: each costs its read buffers and a sample or two."""
        per_run = 3 * self.chunk + 2 * self.largest + 4096
        fan_in = max(2, int(self.memory * (1 - _RUN_FRACTION)) // per_run)
        return min(fan_in, self.fan_in) if self.fan_in is not None else fan_in

    # -- runs --

    def _make_dir(self) -> str:
        if self.dir is None:
            try:
                self.dir = tempfile.mkdtemp(prefix="tarsort-", dir=self.tmpdir)
            except OSError as e:
                raise SinkError(
                    f"cannot create a temporary directory: {e.strerror or e}", self.tmpdir or tempfile.gettempdir()
                ) from None
            _live_dirs.add(self.dir)
            self.stats.tmpdir = self.dir
        return self.dir

    def _write_run(self, pairs: Iterable[tuple[Any, Sample]]) -> _Run:
        directory = self._make_dir()
        self.nruns += 1
        run = _Run(os.path.join(directory, f"run-{self.nruns:06d}.tar"), os.path.join(directory, f"run-{self.nruns:06d}.idx"))
        try:
            with open(run.path, "wb") as f, open(run.side, "wb") as side:
                writer = TarWriter(f)
                records = bytearray()
                ids = self.url_ids
                for position, (sort_key, sample) in enumerate(pairs):
                    key, members = sample_members(sample)
                    # a position prefix makes every name unique: duplicate keys of a field sort or
                    # a shuffle would otherwise merge with a neighbour or 'reappear' on reading
                    prefix = f"{position:x}/"
                    writer.write_members(prefix + key, [(prefix + name, data) for name, data in members])
                    url = sample.get("__url__")
                    url_id = ids.get(url)
                    if url_id is None:
                        url_id = ids[url] = len(self.urls)
                        self.urls.append(url)
                    records += _SIDE.pack(sort_key if self.key_of is None else 0, url_id)
                    if len(records) >= 1 << 16:
                        side.write(records)
                        records.clear()
                writer.close()
                side.write(records)
                self.stats.spilled_bytes += writer.offset
        except OSError as e:
            raise SinkError(f"cannot write a temporary run: {e.strerror or e}", directory) from None
        return run

    def _read_run(self, run: _Run) -> Generator[tuple[Any, Sample], None, None]:
        key_of = self.key_of
        urls = self.urls
        with open(run.path, "rb", buffering=0) as f, open(run.side, "rb", buffering=0) as side:
            # our own file of samples the input limit already let through: no size limit here
            # our own run files: no links to follow, nothing to keep for them
            members = iter_keyed_members(_CappedReader(f, self.chunk), run.path, policy=_RUN_POLICY, link_cache=0)
            records: Iterator[tuple[int, int]] = iter(())
            for sample in group_keyed(members, run.path):
                record = next(records, None)
                if record is None:
                    records = _SIDE.iter_unpack(side.read(_SIDE.size * _SIDE_BLOCK))
                    record = next(records)
                sample["__key__"] = sample["__key__"].split("/", 1)[1]
                sample["__url__"] = urls[record[1]]
                yield (key_of(sample) if key_of is not None else record[0]), sample

    def _merge(self, runs: list[_Run]) -> Generator[tuple[Any, Sample], None, None]:
        with contextlib.ExitStack() as stack:
            readers = [stack.enter_context(contextlib.closing(self._read_run(run))) for run in runs]
            yield from heapq.merge(*readers, key=itemgetter(0), reverse=self.reverse)

    def _remove(self, run: _Run) -> None:
        for path in (run.path, run.side):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    def _cleanup(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            _live_dirs.discard(self.dir)
            self.dir = None


@atexit.register
def _remove_live_dirs() -> None:
    """A sort abandoned without closing its generator still leaves nothing behind."""
    for directory in list(_live_dirs):
        shutil.rmtree(directory, ignore_errors=True)
    _live_dirs.clear()


__all__ = ["DEFAULT_MEMORY", "MISSING_POLICIES", "UNIQUE_POLICIES", "SortStats", "sort_samples"]
