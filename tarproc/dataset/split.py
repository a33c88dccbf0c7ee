"""Who reads what: the split of an epoch's samples among ranks and DataLoader workers.

Every reader of an epoch is a **consumer**: ``consumer = rank * workers + worker`` of
``consumers = world_size * workers``. The epoch's shard order is the shard list, shuffled with
``(seed, epoch)`` when shards are shuffled; every rank computes the same order. Two rules:

**By shard** (the default; needs no sample counts). The units of work are the shards; when there
are fewer shards than consumers, each shard is cut into ``parts = ceil(consumers / shards)`` parts
(part ``k`` holds the samples whose index in the shard is ``k`` modulo ``parts``), so no consumer
idles. Consumer ``c`` reads units ``c, c + consumers, c + 2 * consumers, ...``. Every sample is read
by exactly one consumer per epoch. With shards of unequal sizes the consumers get unequal numbers of
samples, and so ranks may get unequal numbers of batches.

**Even** (``lengths`` known: a tarsplit manifest, a list or a dict of sample counts). The epoch is
the concatenation of the shards in epoch order, ``total`` samples. Each rank takes a contiguous
block of ``total // world_size`` samples, and within a rank each worker a contiguous block whose size
differs from its siblings' by at most one, the same sizes on every rank: so every rank yields the
same number of batches (what DDP needs at the end of an epoch). The last ``total % world_size``
samples of the epoch order (fewer than ``world_size``; different samples each epoch when shards are
shuffled) are left out of that epoch and counted as ``dropped``.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from ..errors import OptionError


class Part(NamedTuple):
    """A piece of one shard for one consumer: every ``parts``-th sample from ``part``, and of those
    the ones whose index in the shard is in ``[start, stop)`` (``stop`` None: to the end)."""

    url: str
    part: int = 0
    parts: int = 1
    start: int = 0
    stop: int | None = None

    def wants(self, index: int) -> bool:
        """True when the shard's ``index``-th sample belongs to this part.

        >>> [i for i in range(7) if Part("s.tar", 1, 3).wants(i)], [i for i in range(7) if Part("s.tar", start=2, stop=4).wants(i)]
        ([1, 4], [2, 3])
        """
        return index % self.parts == self.part and index >= self.start and (self.stop is None or index < self.stop)


class Assignment(NamedTuple):
    """What one consumer reads in one epoch, and the epoch's totals."""

    parts: list[Part]
    dropped: int = 0  # samples of the epoch left out by the even split (fewer than world_size)


def epoch_order(urls: Sequence[str], seed: int, epoch: int, shuffle: bool) -> list[str]:
    """The shards in the order of ``epoch``: as given, or shuffled from ``(seed, epoch)``.

    >>> epoch_order(["a", "b", "c"], 0, 0, False)
    ['a', 'b', 'c']
    >>> epoch_order(["a", "b", "c"], 1, 0, True) == epoch_order(["a", "b", "c"], 1, 0, True)
    True
    """
    order = list(urls)
    if shuffle:
        random.Random(f"{seed}/shards/{epoch}").shuffle(order)
    return order


def split_by_shard(order: Sequence[str], consumer: int, consumers: int) -> Assignment:
    """The by-shard rule (see the module docstring).

    >>> split_by_shard(["a", "b", "c"], 1, 2).parts
    [Part(url='b', part=0, parts=1, start=0, stop=None)]
    >>> [p[:3] for p in split_by_shard(["a"], 2, 3).parts]
    [('a', 2, 3)]
    """
    _check_consumer(consumer, consumers)
    if not order:
        return Assignment([])
    parts = max(1, math.ceil(consumers / len(order)))
    units = [Part(url, k, parts) for url in order for k in range(parts)]
    return Assignment(units[consumer::consumers])


def split_even(
    order: Sequence[str], lengths: Mapping[str, int], rank: int, world_size: int, worker: int, workers: int
) -> Assignment:
    """The even rule (see the module docstring).

    >>> a = split_even(["a", "b"], {"a": 5, "b": 4}, 1, 2, 0, 1)
    >>> a.parts, a.dropped
    ([Part(url='a', part=0, parts=1, start=4, stop=5), Part(url='b', part=0, parts=1, start=0, stop=3)], 1)
    """
    _check_consumer(rank, world_size)
    _check_consumer(worker, workers)
    total = sum(lengths[url] for url in order)
    per_rank = total // world_size
    base, extra = divmod(per_rank, workers)
    lo = rank * per_rank + worker * base + min(worker, extra)
    hi = lo + base + (1 if worker < extra else 0)
    parts: list[Part] = []
    first = 0  # index of the shard's first sample in the epoch
    for url in order:
        n = lengths[url]
        start, stop = max(lo, first), min(hi, first + n)
        if start < stop:
            parts.append(Part(url, start=start - first, stop=stop - first))
        first += n
    return Assignment(parts, total - per_rank * world_size)


def _check_consumer(index: int, count: int) -> None:
    if count < 1 or not 0 <= index < count:
        raise OptionError(f"bad rank or worker {index} of {count}")


def load_lengths(lengths: str | os.PathLike[str] | Mapping[str, int] | Sequence[int], urls: Sequence[str]) -> dict[str, int]:
    """Sample counts per URL from a tarsplit manifest (JSON lines with ``shard`` and ``samples``), a
    dict or a list in the order of ``urls``. A manifest entry matches a URL exactly or by file name."""
    if isinstance(lengths, (str, os.PathLike)):
        path = os.fspath(lengths)
        by_name: dict[str, int] = {}
        try:
            with open(path, encoding="utf-8") as f:
                for row, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        entry = json.loads(line)
                        by_name[str(entry["shard"])] = int(entry["samples"])
                    except (ValueError, KeyError, TypeError):
                        raise OptionError(f"{path}: row {row}: not a manifest line (expected JSON with shard and samples)") from None
        except OSError as e:
            raise OptionError(f"cannot read the manifest {path}: {e.strerror or e}") from None
        base = {os.path.basename(k): v for k, v in by_name.items()}
        out = {}
        for url in urls:
            n = by_name.get(url, base.get(os.path.basename(url)))
            if n is None:
                raise OptionError(f"{path}: no entry for shard {url}")
            out[url] = n
        return out
    if isinstance(lengths, Mapping):
        missing = [u for u in urls if u not in lengths]
        if missing:
            raise OptionError(f"no sample count for shard {missing[0]}")
        return {u: int(lengths[u]) for u in urls}
    if len(lengths) != len(urls):
        raise OptionError(f"{len(lengths)} sample counts for {len(urls)} shards")
    return {u: int(n) for u, n in zip(urls, lengths, strict=True)}
