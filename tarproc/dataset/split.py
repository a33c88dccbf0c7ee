"""Who reads what: the split of an epoch's samples among ranks and DataLoader workers, and the
position of an epoch's work, as pure functions over sample counts (no torch, no I/O).

Every reader of an epoch is a **consumer**: ``consumer = rank * workers + worker`` of
``consumers = world_size * workers``. The epoch's shard order is the shard list, shuffled with
``(seed, epoch)`` when shards are shuffled; every rank computes the same order.

**With counts** (the default: ``tarproc.dataset.counts``). The epoch's **work** is a list of
``Part``s -- samples of one shard, as ranges of their index in it -- in epoch order: at the start
of an epoch, every shard whole; after a resume, what is left. Its ``total`` samples are cut into
contiguous blocks: rank ``r`` takes ``total // world + (1 if r < total % world else 0)`` samples,
and every rank makes the same number of batches, ``ceil((total // world) / batch_size)``: full
batches, then one last batch of whatever the rank has left (``batch_size + 1`` at most). So every
sample is in exactly one batch of the epoch and every rank takes the same number of steps. Batch
``j`` of a rank is made by its worker ``j % workers`` (the order in which a DataLoader takes
them): each worker reads the contiguous block of its own batches. ``drop_last`` makes only full
batches (the rest of each rank is left out of the epoch and counted); ``pad`` gives every rank
``ceil(total / world)`` samples, the shortfall as copies of the epoch's first samples marked not
valid.

**Without counts** (``by_shard``): the units of work are the shards; when there are fewer shards
than consumers, each shard is cut into ``ceil(consumers / shards)`` parts (part ``k`` holds the
samples whose index is ``k`` modulo the parts). Consumer ``c`` reads units ``c, c + consumers,
...``. Every sample is read by exactly one consumer; ranks may get unequal numbers of batches, and
the torch layer ends the epoch collectively.

**The position** of an epoch with counts is the number of steps every rank has taken: from it,
the plan and each consumer's seeded shuffle say exactly which samples were handed out
(``remaining``), whatever the layout that resumes.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple

from ..errors import OptionError

Range = tuple[int, int | None]


class Part(NamedTuple):
    """Samples of one shard: those whose index is in one of ``ranges`` (``[start, stop)``; stop
    None: to the end) and, of those, every ``parts``-th from ``part``. ``holds``: the samples the
    shard holds, when known (the reader checks it)."""

    url: str
    part: int = 0
    parts: int = 1
    ranges: tuple[Range, ...] = ((0, None),)
    holds: int | None = None

    def wants(self, index: int) -> bool:
        """True when the shard's ``index``-th sample belongs to this part.

        >>> [i for i in range(7) if Part("s.tar", 1, 3).wants(i)], [i for i in range(9) if Part("s.tar", ranges=((2, 4), (6, 7))).wants(i)]
        ([1, 4], [2, 3, 6])
        """
        if index % self.parts != self.part:
            return False
        return any(a <= index and (b is None or index < b) for a, b in self.ranges)

    @property
    def first(self) -> int:
        return self.ranges[0][0]

    @property
    def stop(self) -> int | None:
        """The index after the last sample wanted (None: the shard's end)."""
        return self.ranges[-1][1]

    @property
    def size(self) -> int:
        """The number of samples wanted (ranges with known ends, ``parts == 1``)."""
        return sum(_known(b) - a for a, b in self.ranges)

    def indices(self) -> Iterator[int]:
        for a, b in self.ranges:
            yield from range(a, _known(b))


def _known(stop: int | None) -> int:
    if stop is None:
        raise ValueError("a range of unknown length")  # the planner only counts parts with counts
    return stop


class Assignment(NamedTuple):
    """What one consumer reads in one epoch.

    ``batches``: the size of each of its batches, in input samples (None: batches of
    ``batch_size`` until its parts run dry). ``pad``: copies of ``pad_parts``' samples, marked not
    valid, that fill its last batch. ``dropped``: samples of the epoch left out (``drop_last``),
    all ranks together. ``steps``: batches per rank.
    """

    parts: list[Part]
    batches: list[int] | None = None
    pad: int = 0
    pad_parts: list[Part] = []
    dropped: int = 0
    steps: int | None = None

    @property
    def samples(self) -> int:
        """The real samples this consumer reads (with counts)."""
        return sum(p.size for p in self.parts)


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


def whole_shards(order: Sequence[str], counts: Mapping[str, int]) -> list[Part]:
    """An epoch's work at its start: every shard whole, in epoch order."""
    return [Part(url, ranges=((0, counts[url]),), holds=counts[url]) for url in order if counts[url] > 0]


def epoch_work(
    urls: Sequence[str], counts: Mapping[str, int], seed: int, epoch: int, shuffle: bool, part_size: int | None = None,
    interleaved: tuple[int, int] | None = None,
) -> list[Part]:
    """An epoch's work at its start. Shuffled, with ``part_size``: the shards cut into parts of
    that many samples, all parts in one order drawn from ``(seed, epoch)``, so that each reader's
    share -- and its shuffle buffer -- holds pieces of many shards, whatever the layout. With
    ``interleaved``, ``(k, chunk)``, too: those parts read ``k`` at a time, ``chunk`` samples of
    each in turn (``interleave``). Else the shards whole, in ``epoch_order``.

    >>> [(p.url, p.ranges) for p in epoch_work(["a", "b"], {"a": 5, "b": 2}, 0, 0, True, 2)]
    [('a', ((2, 4),)), ('b', ((0, 2),)), ('a', ((0, 2),)), ('a', ((4, 5),))]
    """
    if not (shuffle and part_size):
        return whole_shards(epoch_order(urls, seed, epoch, shuffle), counts)
    parts = [Part(url, ranges=((a, min(a + part_size, counts[url])),), holds=counts[url])
             for url in urls for a in range(0, counts[url], part_size)]
    random.Random(f"{seed}/parts/{epoch}").shuffle(parts)
    if interleaved is not None:
        return interleave(parts, *interleaved)
    return parts


INTERLEAVE_CHUNK = 16  # samples taken from a part at each turn
INTERLEAVE_PIECES = 1 << 18  # pieces of an epoch's plan at most: a larger dataset takes longer turns


def interleave_chunk(total: int) -> int:
    """The samples taken from each open part at its turn, for an epoch of ``total`` samples:
    ``INTERLEAVE_CHUNK``, longer where that would make a plan of more than ``INTERLEAVE_PIECES``
    pieces (each piece is an entry of the plan, in every reader's memory).

    >>> interleave_chunk(10_000), interleave_chunk(100_000_000)
    (16, 382)
    """
    return max(INTERLEAVE_CHUNK, math.ceil(total / INTERLEAVE_PIECES))


def interleave(parts: Sequence[Part], k: int, chunk: int) -> list[Part]:
    """``parts`` read ``k`` at a time: ``chunk`` samples of each open part in turn, and a part that
    ends gives its place to the next one. The result is the same samples as pieces, in the order
    read. A contiguous stretch of it (a reader's share) holds samples of about ``k`` parts, each a
    contiguous range of its part: a reader keeps one stream open per part and reads each sample
    once, in shard order. MosaicML Streaming's py1e and energon's many shards per worker do the
    same for their readers.

    >>> [(p.url, p.ranges) for p in interleave([Part("a", ranges=((0, 5),)), Part("b", ranges=((0, 2),)),
    ...                                        Part("c", ranges=((3, 5),))], 2, 2)]
    [('a', ((0, 2),)), ('b', ((0, 2),)), ('a', ((2, 4),)), ('c', ((3, 5),)), ('a', ((4, 5),))]
    """
    if k < 1 or chunk < 1:
        raise OptionError(f"bad interleave {k} x {chunk}; both must be >= 1")
    out: list[Part] = []
    waiting = iter(parts)
    live: list[tuple[Part, int]] = []  # the open parts, and the samples of each taken
    while True:
        while len(live) < k:
            part = next(waiting, None)
            if part is None:
                break
            if part.size:
                live.append((part, 0))
        if not live:
            return out
        turn = []
        for part, done in live:
            size = part.size
            stop = min(done + chunk, size)
            if len(part.ranges) == 1:  # an epoch's parts: one range each (the fast way, 80,000 pieces for ImageNet)
                first = part.ranges[0][0]
                out.append(Part(part.url, part.part, part.parts, ((first + done, first + stop),), part.holds))
            else:
                out.append(part._replace(ranges=_slice_ranges(part.ranges, done, stop)))
            if stop < size:
                turn.append((part, stop))
        live = turn


def read_streams(pieces: Sequence[Part]) -> tuple[list[Part], list[int]]:
    """The reads that cover ``pieces``: a piece that starts where an earlier piece of the same
    shard stopped continues that one's read. Returns the reads (each a ``Part`` of all its
    pieces, in the order they begin) and the read of each piece.

    >>> reads, of = read_streams([Part("a", ranges=((0, 2),)), Part("b", ranges=((0, 2),)), Part("a", ranges=((2, 4),))])
    >>> [(p.url, p.ranges) for p in reads], of
    ([('a', ((0, 4),)), ('b', ((0, 2),))], [0, 1, 0])
    """
    reads: list[Part] = []
    read_of: list[int] = []
    ends: dict[tuple[str, int], int] = {}  # (shard, the index a read stopped at) -> the read
    for piece in pieces:
        r = ends.pop((piece.url, piece.first), None) if piece.parts == 1 else None
        if r is None:
            r = len(reads)
            reads.append(piece)
        else:
            before = reads[r].ranges
            if before[-1][1] == piece.first:
                joined = (*before[:-1], (before[-1][0], piece.ranges[0][1]), *piece.ranges[1:])
            else:
                joined = (*before, *piece.ranges)
            reads[r] = reads[r]._replace(ranges=joined)
        read_of.append(r)
        stop = piece.stop
        if piece.parts == 1 and stop is not None:
            ends[(piece.url, stop)] = r
    return reads, read_of


def split_by_shard(order: Sequence[str], consumer: int, consumers: int) -> Assignment:
    """The rule without counts (see the module docstring).

    >>> split_by_shard(["a", "b", "c"], 1, 2).parts
    [Part(url='b', part=0, parts=1, ranges=((0, None),), holds=None)]
    >>> [p[:3] for p in split_by_shard(["a"], 2, 3).parts]
    [('a', 2, 3)]
    """
    _check_consumer(consumer, consumers)
    if not order:
        return Assignment([])
    parts = max(1, math.ceil(consumers / len(order)))
    units = [Part(url, k, parts) for url in order for k in range(parts)]
    return Assignment(units[consumer::consumers])


class RankPlan(NamedTuple):
    lo: int  # the rank's first sample (position in the work)
    real: int  # its samples
    sizes: list[int]  # its batch sizes (padding included)
    pad: int
    dropped: int  # left out of the epoch by drop_last, all ranks


def rank_plan(total: int, rank: int, world: int, batch_size: int, drop_last: bool = False, pad: bool = False) -> RankPlan:
    """The samples and batch sizes of ``rank`` for an epoch of ``total`` samples.

    >>> rank_plan(373, 0, 2, 64).sizes, rank_plan(373, 1, 2, 64).sizes
    ([64, 64, 59], [64, 64, 58])
    >>> rank_plan(129, 0, 2, 64).sizes, rank_plan(129, 1, 2, 64).sizes  # the last batch may hold one more
    ([65], [64])
    >>> rank_plan(5, 1, 2, 4, pad=True)
    RankPlan(lo=3, real=2, sizes=[3], pad=1, dropped=0)
    """
    _check_consumer(rank, world)
    base, extra = divmod(total, world)
    real = base + (1 if rank < extra else 0)
    lo = rank * base + min(rank, extra)
    if pad:
        each = math.ceil(total / world)
        steps = math.ceil(each / batch_size)
        return RankPlan(lo, real, _sizes(each, steps, batch_size), each - real, 0)
    if total and not base:
        raise OptionError(
            f"the epoch has {total} samples for {world} ranks, fewer than one each: use pad=True (padding marked "
            "in __valid__) or fewer ranks"
        )
    if drop_last:
        steps = base // batch_size
        dropped = total - steps * batch_size * world
        return RankPlan(lo, steps * batch_size, [batch_size] * steps, 0, dropped)
    steps = math.ceil(base / batch_size)
    return RankPlan(lo, real, _sizes(real, steps, batch_size), 0, 0)


def _sizes(n: int, steps: int, batch_size: int) -> list[int]:
    """``steps`` batches of ``n`` samples: full ones, then the rest in the last."""
    if not steps:
        return []
    return [batch_size] * (steps - 1) + [n - (steps - 1) * batch_size]


def split_work(
    work: Sequence[Part], rank: int, world: int, worker: int, workers: int, batch_size: int,
    drop_last: bool = False, pad: bool = False,
) -> Assignment:
    """What consumer ``(rank, worker)`` reads of ``work`` (see the module docstring).

    >>> work = [Part("a", ranges=((0, 5),), holds=5), Part("b", ranges=((0, 4),), holds=4)]
    >>> a = split_work(work, 1, 2, 0, 1, 2)
    >>> [(p.url, p.ranges) for p in a.parts], a.batches
    ([('b', ((0, 4),))], [2, 2])
    """
    _check_consumer(worker, workers)
    return split_rank(work, rank, world, workers, batch_size, drop_last, pad)[worker]


def split_rank(
    work: Sequence[Part], rank: int, world: int, workers: int, batch_size: int, drop_last: bool = False,
    pad: bool = False, starts: Sequence[int] | None = None,
) -> list[Assignment]:
    """``split_work`` for every worker of ``rank``; ``starts``: ``work_starts(work)``, when at hand."""
    _check_consumer(0, workers)
    starts = work_starts(work) if starts is None else starts
    plan = rank_plan(starts[-1], rank, world, batch_size, drop_last, pad)
    last = (len(plan.sizes) - 1) % workers  # the worker of the rank's last batch, where padding goes
    out = []
    lo = plan.lo
    for worker in range(workers):
        sizes = plan.sizes[worker::workers]
        pad_here = plan.pad if worker == last else 0
        hi = lo + sum(sizes) - pad_here
        pad_parts = take(work, 0, pad_here, starts) if pad_here else []
        out.append(Assignment(merged(take(work, lo, hi, starts)), sizes, pad_here, pad_parts, plan.dropped,
                              len(plan.sizes)))
        lo = hi
    return out


def work_starts(work: Sequence[Part]) -> list[int]:
    """The position of each part's first sample in the work, and the work's total last."""
    return [0, *itertools.accumulate(p.size for p in work)]


def take(work: Sequence[Part], lo: int, hi: int, starts: Sequence[int] | None = None) -> list[Part]:
    """The parts covering the samples ``[lo, hi)`` of ``work`` (positions in its concatenation).

    >>> take([Part("a", ranges=((0, 3), (5, 7)), holds=9)], 2, 4)
    [Part(url='a', part=0, parts=1, ranges=((2, 3), (5, 6)), holds=9)]
    """
    out: list[Part] = []
    i = max(0, bisect.bisect_right(starts, lo) - 1) if starts is not None else 0
    first = starts[i] if starts is not None else 0
    for part in work[i:]:
        n = part.size
        start, stop = max(lo, first), min(hi, first + n)
        if start < stop:
            out.append(part._replace(ranges=_slice_ranges(part.ranges, start - first, stop - first)))
        first += n
        if first >= hi:
            break
    return out


def merged(parts: Sequence[Part]) -> list[Part]:
    """Parts of one shard that follow each other without a gap merged into one (one stream).

    >>> merged([Part("a", ranges=((0, 2),)), Part("a", ranges=((2, 4),)), Part("a", ranges=((6, 7),))])
    [Part(url='a', part=0, parts=1, ranges=((0, 4),), holds=None), Part(url='a', part=0, parts=1, ranges=((6, 7),), holds=None)]
    """
    out: list[Part] = []
    for part in parts:
        last = out[-1] if out else None
        if last is not None and last.url == part.url and last.parts == part.parts == 1 and last.stop == part.first:
            joined = (*last.ranges[:-1], (last.ranges[-1][0], part.ranges[0][1]), *part.ranges[1:])
            out[-1] = last._replace(ranges=joined)
        else:
            out.append(part)
    return out


def runs(part: Part, gap: int) -> list[Part]:
    """``part`` cut where it skips more than ``gap`` samples: pieces each worth one stream, for a
    reader that can start anywhere in the shard (an index at hand).

    >>> [p.ranges for p in runs(Part("a", ranges=((0, 2), (3, 4), (90, 91))), 8)]
    [((0, 2), (3, 4)), ((90, 91),)]
    """
    pieces: list[list[Range]] = []
    for a, b in part.ranges:
        if pieces and a - _known(pieces[-1][-1][1]) <= gap:
            pieces[-1].append((a, b))
        else:
            pieces.append([(a, b)])
    return [part._replace(ranges=tuple(p)) for p in pieces]


def at_positions(parts: Sequence[Part], positions: Sequence[int]) -> list[Part]:
    """The samples at sorted ``positions`` (in the concatenation of ``parts``), as parts.

    >>> at_positions([Part("a", ranges=((0, 3),)), Part("b", ranges=((5, 9),))], [1, 2, 4])
    [Part(url='a', part=0, parts=1, ranges=((1, 3),), holds=None), Part(url='b', part=0, parts=1, ranges=((6, 7),), holds=None)]
    """
    return [part._replace(ranges=_ranges_at(part, chosen)) for part, chosen in _per_part(parts, positions) if chosen]


def _per_part(parts: Sequence[Part], positions: Sequence[int]) -> Iterator[tuple[Part, list[int]]]:
    """Each part with the sorted ``positions`` that fall in it, as positions within it."""
    first = 0
    i = 0
    for part in parts:
        n = part.size
        mine = []
        while i < len(positions) and positions[i] < first + n:
            mine.append(positions[i] - first)
            i += 1
        yield part, mine
        first += n


def _ranges_at(part: Part, positions: Iterable[int]) -> tuple[Range, ...]:
    """The shard indices of the part's samples at ``positions`` (within it), as ranges."""
    indices = list(part.indices())
    return _as_ranges(indices[k] for k in positions)


def _slice_ranges(ranges: Sequence[Range], lo: int, hi: int) -> tuple[Range, ...]:
    """The ``lo``-th to ``hi``-th wanted indices of ``ranges``, as ranges."""
    out: list[Range] = []
    seen = 0
    for a, b in ranges:
        n = _known(b) - a
        start, stop = max(lo, seen), min(hi, seen + n)
        if start < stop:
            out.append((a + start - seen, a + stop - seen))
        seen += n
    return tuple(out)


def _check_consumer(index: int, count: int) -> None:
    if count < 1 or not 0 <= index < count:
        raise OptionError(f"bad rank or worker {index} of {count}")


# -- the position ----------------------------------------------------------------------------------


def worker_batches_taken(batches: Sequence[int], steps: int) -> list[int]:
    """How many batches each worker has delivered after ``steps`` batches of its rank, when worker
    ``w`` makes ``batches[w]`` of them: a DataLoader takes them round robin, skipping the workers
    that are done.

    >>> worker_batches_taken([3, 2], 4), worker_batches_taken([3, 1], 4)
    ([2, 2], [3, 1])
    """
    taken = [0] * len(batches)
    left = steps
    while left > 0:
        moved = False
        for w, n in enumerate(batches):
            if left and taken[w] < n:
                taken[w] += 1
                left -= 1
                moved = True
        if not moved:
            break
    return taken


def emitted(n: int, taken: int, bufsize: int, seed: int) -> set[int]:
    """The input positions of a consumer's first ``taken`` samples out of its shuffle buffer
    (the same stage and seed as the reader's: it depends on positions only, never on data)."""
    from ..stages import shuffle

    if not bufsize:
        return set(range(min(n, taken)))
    return set(itertools.islice(shuffle(range(n), bufsize, seed=seed), taken))  # type: ignore[arg-type]


def subtract(parts: Sequence[Part], done: Iterable[int]) -> list[Part]:
    """``parts`` less the samples at the positions ``done`` (positions in their concatenation)."""
    out: list[Part] = []
    for part, gone in _per_part(parts, sorted(done)):
        if not gone:
            out.append(part)
        elif len(gone) < part.size:
            out.append(part._replace(ranges=_ranges_at(part, sorted(set(range(part.size)) - set(gone)))))
    return out


def _as_ranges(indices: Iterable[int]) -> tuple[Range, ...]:
    """``[0, 1, 2, 5]`` -> ``((0, 3), (5, 6))``."""
    out: list[list[int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1][1] = i + 1
        else:
            out.append([i, i + 1])
    return tuple((a, b) for a, b in out)


def encode_work(work: Sequence[Part], urls: Sequence[str]) -> list[list[object]]:
    """Work as JSON-able data: ``[shard number, [[start, stop], ...]]`` per part."""
    number = {u: i for i, u in enumerate(urls)}
    return [[number[p.url], [[a, b] for a, b in p.ranges]] for p in work]


def decode_work(data: object, urls: Sequence[str], counts: Mapping[str, int], where: str) -> list[Part]:
    """The inverse of ``encode_work``; ``OptionError`` naming ``where`` on anything else."""
    if not isinstance(data, list):
        raise OptionError(f"{where}: not a list of parts")
    out = []
    taken: dict[str, list[tuple[int, int]]] = {}  # the ranges of each shard, to refuse overlaps
    for row, item in enumerate(data):
        try:
            number, ranges = item
            if type(number) is not int or not 0 <= number < len(urls) or not isinstance(ranges, list):
                raise ValueError
            pairs = tuple((a, b) for a, b in ranges)
            if not all(type(a) is int and type(b) is int for a, b in pairs):
                raise ValueError
        except (TypeError, ValueError):
            raise OptionError(f"{where}[{row}]: not [shard number, [[start, stop], ...]] of this shard list") from None
        url = urls[number]
        n = counts[url]
        last = 0
        for a, b in pairs:
            if not (last <= a < b <= n):
                raise OptionError(f"{where}[{row}]: bad range [{a}, {b}] for {url}, which holds {n} samples")
            last = b
        if not pairs:
            raise OptionError(f"{where}[{row}]: no ranges")
        taken.setdefault(url, []).extend(pairs)
        out.append(Part(url, ranges=pairs, holds=n))
    for url, spans in taken.items():
        spans.sort()
        if any(b > c for (_, b), (c, _) in itertools.pairwise(spans)):
            raise OptionError(f"{where}: two parts of {url} overlap: their samples would be read twice")
    return out


def remaining(
    work: Sequence[Part], steps: int, world: int, workers: int, batch_size: int, drop_last: bool, pad: bool,
    bufsize: int, seed_of: Callable[[int], int],
) -> list[Part]:
    """What is left of ``work`` once every rank of a ``world x workers`` layout took ``steps``
    batches: each consumer's batches taken, the samples its seeded shuffle handed out in them, and
    its parts less those, in work order. ``seed_of(consumer)`` is the consumer's shuffle seed.

    >>> work = whole_shards(["a", "b"], {"a": 5, "b": 4})
    >>> [(p.url, p.ranges) for p in remaining(work, 1, 2, 1, 2, False, False, 0, lambda c: 0)]
    [('a', ((2, 5),)), ('b', ((2, 4),))]
    """
    out: list[Part] = []
    starts = work_starts(work)
    for rank in range(world):
        mine = split_rank(work, rank, world, workers, batch_size, drop_last, pad, starts)
        taken = worker_batches_taken([len(a.batches or ()) for a in mine], steps)
        for worker, a in enumerate(mine):
            n = a.samples
            done = emitted(n, min(sum((a.batches or [])[: taken[worker]]), n), bufsize, seed_of(rank * workers + worker))
            out += subtract(a.parts, done)
    return out
