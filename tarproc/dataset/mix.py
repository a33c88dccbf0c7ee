"""``Mix``: weighted mixing of several ``Dataset``s into one stream of batches, seeded and resumable.

Each step of a mix epoch either takes a whole batch from one source (``compose="batches"``), the
source drawn by ``random.Random(f"{seed}/mix/{epoch}/{step}").choices(names, weights)``, or takes
``k_i`` samples from every source and concatenates them (``compose="stratified"``). The choices are
a pure function of ``(seed, epoch, step)``: every rank draws the same sequence, and a resumed run
draws the rest of it.

**One set of workers** (torch installed, every source with sample counts, ``num_workers`` a
number): at the start of an iteration the main process plans the epoch's steps -- each step's
source and which batch of that source's pass it is (``schedule``): with counts each source's
number of batches per rank is known, so where ``until`` ends the epoch, and where a source runs
out, are known too. One DataLoader with ``num_workers`` workers reads every source: as a
source's ``Loader`` would, the batches of a source's pass are made by the workers in turn
(``Dataset.reader_batches``; the turn shifted by one worker from one source to the next), so
each worker makes its share of every source, in step order, and the main process puts the steps
back in order (it holds the batches that came early: a few per source and worker, and none it
handed out). Sources whose batches have one shape share one ring of shared-memory batch buffers
in each worker (``Dataset.share_buffers``): a new worker's ring starts empty, and one ring per
source would cost as many fresh buffers (page faults) more each epoch. The position
of each source is its batches taken, a ``Loader`` state (``Dataset.position``), so a state
resumes on any layout as a source's own does. Otherwise
(``num_workers`` a mapping, a source without counts or a ``repeat=True`` stream) each source is
read through its own ``Loader`` (its own DataLoader workers) when torch is installed, else by
iterating the ``Dataset`` in this process.

Multi-rank training: give every rank the same ``Mix`` (same sources, weights and seed). Each source
``Dataset`` splits its own shards among the ranks (``docs/training.md``), so every rank draws the
same source at each step and reads its own share of it; nothing else is needed. With sample
counts (found by each source, ``docs/training.md``) every rank's share of a source has the same
number of batches, so ``until="first"`` and ``"all"`` end at the same step on every rank too;
``until=N`` gives every rank exactly N steps in any case.

This module imports torch only lazily: for the one DataLoader of the shared workers
(``BlendedDataset``, made on first use) and to concatenate stratified batches that already hold
torch tensors.
"""

from __future__ import annotations

import inspect
import math
import numbers
import random
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard

from ..errors import DatasetError, OptionError, TarprocError

STATE_VERSION = 1
COMPOSE = ("batches", "stratified")
UNTIL = ("first", "all")
PREFETCH = 4  # batches each source's DataLoader worker makes ahead (torch's default is 2)
MIN_SHARE = 2.0**-53  # random.random() has 53 bits: a smaller share of the weights is never drawn


def _have_torch() -> bool:
    """True when the sources are read through torch ``Loader``s (torch importable)."""
    from . import loader

    return bool(loader.HAVE_TORCH)


def largest_remainder(weights: Sequence[float], total: int) -> list[int]:
    """Integers proportional to ``weights`` summing to ``total`` (largest-remainder rounding; ties
    go to the earlier entry).

    >>> largest_remainder([1, 1, 1], 10), largest_remainder([0.8, 0.2], 7)
    ([4, 3, 3], [6, 1])
    """
    whole = sum(weights)
    quotas = [w / whole * total for w in weights]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: total - sum(counts)]:
        counts[i] += 1
    return counts


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _rows(batch: Any) -> int:
    """The number of samples in a batch (a tuple/list of columns or a dict of columns)."""
    columns = list(batch.values()) if isinstance(batch, Mapping) else list(batch)
    return len(columns[0]) if columns else 0


def concat_batches(parts: Sequence[tuple[str, Any]]) -> Any:
    """One batch from ``(source name, batch)`` parts, in order: tuples/lists column by column, dicts
    key by key; torch tensors by ``torch.cat``, numpy arrays by ``np.concatenate``, lists by ``+``.
    A structure that differs between sources is an ``OptionError`` naming them and the column.

    >>> import numpy as np
    >>> b = concat_batches([("a", (["k0"], np.array([1]))), ("b", (["k1", "k2"], np.array([2, 3])))])
    >>> b[0], b[1].tolist()
    (['k0', 'k1', 'k2'], [1, 2, 3])
    """
    first_name, first = parts[0]
    names = " and ".join(repr(n) for n, _ in parts)
    if isinstance(first, Mapping):
        for name, batch in parts[1:]:
            if not isinstance(batch, Mapping) or list(batch) != list(first):
                theirs = list(batch) if isinstance(batch, Mapping) else type(batch).__name__
                raise OptionError(
                    f"sources {first_name!r} and {name!r} give batches of different structure: "
                    f"columns {list(first)} and {theirs}; a stratified mix needs the same columns"
                )
        return {key: _concat_column([(n, b[key]) for n, b in parts], f"column {key!r}", names) for key in first}
    if not isinstance(first, (tuple, list)):
        raise OptionError(f"source {first_name!r} gives a {type(first).__name__} batch; expected a tuple or a dict")
    for name, batch in parts[1:]:
        if not isinstance(batch, (tuple, list)) or len(batch) != len(first):
            theirs = f"{len(batch)} columns" if isinstance(batch, (tuple, list)) else f"a {type(batch).__name__}"
            raise OptionError(
                f"sources {first_name!r} and {name!r} give batches of different structure: "
                f"{len(first)} columns and {theirs}; a stratified mix needs the same columns"
            )
    columns = [_concat_column([(n, b[i]) for n, b in parts], f"column {i}", names) for i in range(len(first))]
    return tuple(columns) if isinstance(first, tuple) else columns


def _kind(value: Any) -> str:
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return "tensor"
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return "array"
    if isinstance(value, list):
        return "list"
    return type(value).__name__


def _concat_column(values: list[tuple[str, Any]], column: str, names: str) -> Any:
    kinds = [(name, _kind(v)) for name, v in values]
    if len({k for _, k in kinds}) > 1:
        found = ", ".join(f"{k} from {n!r}" for n, k in kinds)
        raise OptionError(f"{column} differs between sources {names}: {found}")
    kind = kinds[0][1]
    try:
        if kind == "tensor":
            import torch

            return torch.cat([v for _, v in values])
        if kind == "array":
            import numpy as np

            return np.concatenate([v for _, v in values])
    except (ValueError, TypeError, RuntimeError) as e:
        raise OptionError(f"{column} of sources {names} can't be concatenated: {str(e).splitlines()[0]}") from None
    if kind == "list":
        return [x for _, v in values for x in v]
    raise OptionError(f"{column} of sources {names} is a {kind}: only tensors, numpy arrays and lists concatenate")


class Step(NamedTuple):
    """One planned step: what happened to the sources before its draw (``events``: ``("exhausted",
    name)``, ``("dropped", name)``, ``("restart", name)``, ``("empty", name)``: a restart with
    nothing to draw) and its ``parts``: ``(source, pass, batch)``, the ``batch``-th batch of pass
    ``pass`` of the schedule (one part, or every source's for ``compose="stratified"``)."""

    step: int
    parts: tuple[tuple[str, int, int], ...]
    events: tuple[tuple[str, str], ...] = ()


class Schedule(NamedTuple):
    """An iteration's plan: the source passes it reads (``(source, source epoch)``, the first of
    each source from where its position stands), the steps, the events after the last step, and
    the passes read to their end (whose readers check the shards' counts there)."""

    passes: tuple[tuple[str, int], ...]
    steps: tuple[Step, ...]
    end: tuple[tuple[str, str], ...]
    complete: frozenset[int]


class BlendedReaders:
    """What each shared DataLoader worker runs: worker ``w`` of ``W`` plays reader ``(w + i) % W``
    of the ``i``-th source (``Dataset.reader_batches``), so it makes batch ``k`` of a pass of that
    source when ``k % W`` is that reader, in step order, and yields ``(step, source, batch)``. The
    turn moved by one per source spreads the sources' short last batches over the workers."""

    def __init__(self, datasets: Mapping[str, Any], schedule: Schedule) -> None:
        self.datasets = dict(datasets)
        self.schedule = schedule

    def worker(self) -> tuple[int, int]:
        info = sys.modules["torch.utils.data"].get_worker_info() if "torch.utils.data" in sys.modules else None
        return (0, 1) if info is None else (int(info.id), int(info.num_workers))

    def __iter__(self) -> Iterator[tuple[int, str, Any]]:
        worker, workers = self.worker()
        role = {name: (worker + i) % workers for i, name in enumerate(self.datasets)}
        readers: dict[int, Iterator[Any]] = {}
        try:
            for step in self.schedule.steps:
                for name, run, k in step.parts:
                    if k % workers != role[name]:
                        continue
                    reader = readers.get(run)
                    if reader is None:
                        epoch = self.schedule.passes[run][1]
                        reader = readers[run] = self.datasets[name].reader_batches(epoch, role[name], workers)
                    batch = next(reader, None)
                    if batch is None:
                        raise DatasetError(f"mix source {name!r}: worker {worker} ran out before batch {k} of its "
                                           "epoch's plan (its shards hold fewer samples than their counts)")
                    yield step.step, name, batch
            for run in sorted(self.schedule.complete & set(readers)):
                if next(readers[run], None) is not None:  # to the end, where the reader checks the counts
                    name = self.schedule.passes[run][0]
                    raise DatasetError(f"mix source {name!r}: worker {worker} has a batch past its epoch's plan")
        finally:
            for reader in readers.values():
                close = getattr(reader, "close", None)
                if close is not None:
                    close()


def _receive(items: Iterator[Any], early: dict[tuple[int, str], Any]) -> bool:
    """The next ``(step, source, batch)`` from the shared workers into ``early``; False at their end.
    A function of its own, so that no frame variable of the caller keeps a batch alive."""
    item = next(items, None)
    if item is None:
        return False
    step, name, batch = item
    early[(int(step), str(name))] = batch
    return True


_BLENDED: list[type] = []


def _blended_type() -> type:
    """``BlendedDataset``: ``BlendedReaders`` as a torch ``IterableDataset`` (made on first use, so
    that this module imports without torch; a spawned worker finds it by name through the module's
    ``__getattr__``)."""
    if not _BLENDED:
        from torch.utils.data import IterableDataset

        class BlendedDataset(BlendedReaders, IterableDataset):  # type: ignore[misc]
            pass

        BlendedDataset.__module__ = __name__
        BlendedDataset.__qualname__ = "BlendedDataset"
        _BLENDED.append(BlendedDataset)
    return _BLENDED[0]


def __getattr__(name: str) -> Any:
    if name == "BlendedDataset":
        return _blended_type()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _shares_workers(ds: Any) -> bool:
    """Whether a source can be read inside the Mix's own workers: a torch Dataset with counts."""
    return (callable(getattr(ds, "reader_batches", None)) and callable(getattr(ds, "loader", None))
            and getattr(ds, "lengths", None) is not None and not getattr(ds, "repeat", False)
            and not getattr(ds, "decodes_in_main", False))


class _Source:
    """One source's reader and its place in the current mix epoch."""

    def __init__(self, name: str, dataset: Any, weight: float, workers: int, loader: Any) -> None:
        self.name = name
        self.dataset = dataset
        self.weight = weight
        self.workers = workers
        self.loader = loader  # a Loader, or None: iterate the dataset in this process
        self.epoch: int | None = None  # the source epoch of its current (or planned) pass
        self.status = "planned"  # planned (not begun), live, done (ran out)
        self.live: Iterator[Any] | None = None
        self.started = False  # the current pass has given a batch: its reader's state is the position
        self.saved: dict[str, Any] | None = None  # a loaded reader state, until the pass gives a batch
        self.taken = 0  # shared workers: batches of the current pass taken (since a loaded state)
        self.shared_workers: int | None = None  # read in the Mix's shared workers, this many (at least 1)

    def plan(self, epoch: int) -> None:
        """A fresh pass at ``epoch``, begun when first drawn from."""
        self.close()
        self.epoch, self.status, self.started, self.saved, self.taken = epoch, "planned", False, None, 0

    def take(self, batch_size: int | None) -> Any | None:
        """The pass's next batch, or None when it has run out."""
        if self.status == "planned":
            assert self.epoch is not None
            self.dataset.set_epoch(self.epoch)  # a resumed reader keeps its place in that epoch
            if batch_size is not None:
                self.dataset.batch_size = batch_size  # read when the iteration starts
            self.live = iter(self.loader if self.loader is not None else self.dataset)
            self.status = "live"
        if self.status == "done":
            return None
        assert self.live is not None
        try:
            batch = next(self.live)
        except StopIteration:
            self.close()
            self.status = "done"
            return None
        self.started, self.saved = True, None
        return batch

    def finish(self) -> None:
        """End the pass early (a short stratified batch counts as running out)."""
        self.close()
        self.status = "done"

    def close(self) -> None:
        live, self.live = self.live, None
        close = getattr(live, "close", None)
        if close is not None:
            close()  # a Loader's generator: shuts its DataLoader workers down

    def reader_state(self) -> dict[str, Any] | None:
        if self.saved is not None:
            return self.saved
        if not self.started:
            return None
        if self.shared_workers is not None:
            assert self.epoch is not None
            return dict(self.dataset.position(self.epoch, self.shared_workers, self.taken))
        reader = self.loader if self.loader is not None else self.dataset
        return dict(reader.state_dict())

    def resume(self, epoch: int, state: Mapping[str, Any] | None) -> None:
        """Continue the pass of ``epoch`` from the reader ``state`` (None: a fresh pass); a reader
        whose state says that pass is over (it moved to its next epoch) counts as run out."""
        self.plan(epoch)
        if state is None:
            return
        reader = self.loader if self.loader is not None else self.dataset
        reader.load_state_dict(state)
        self.saved = dict(state)
        if self.dataset.epoch != epoch:
            self.status = "done"


class Mix:
    """Weighted mixing of several ``Dataset``s, seeded and resumable.

    ``sources``: a mapping of names to datasets, or a sequence (named ``"0"``, ``"1"``, ...);
    ``weights``: one positive number per source (a sequence in source order, or a mapping by
    name), normalised to sum 1.

    ``compose="batches"``: each step's batch comes whole from one source, drawn with the weights by
    ``random.Random(f"{seed}/mix/{epoch}/{step}")``. ``compose="stratified"``: every batch holds
    ``k_i`` samples of each source ``i`` (in source order), ``k_i`` the largest-remainder rounding of
    ``w_i * batch_size``, each at least 1; the Mix sets each source dataset's ``batch_size`` to
    ``k_i``, so the proportions are exact to ``1 / batch_size`` in every batch (a source's short
    last batch counts as its running out). ``per_batch`` holds the ``k_i``.

    ``until`` ends a mix epoch: ``"first"`` when a source drawn from has run out (the others stop
    mid-pass); ``"all"`` when every source has: one that runs out drops out and the rest are drawn
    with their weights renormalised (``compose="batches"`` only); an int ``N``: exactly N steps, a
    source that runs out starts its next epoch and goes on (oversampling a small dataset).

    Each mix epoch ``e`` starts every source at a fresh pass of epoch ``e``, or of its next epoch
    when an ``until=N`` restart has already taken it to ``e`` or beyond, so no source epoch repeats
    in a run (``set_epoch`` backwards does not rewind the sources; ``state_dict`` keeps them).
    Without ``set_epoch``, each iteration is the next epoch, also after one broken off.

    ``drawn`` and ``exhausted`` count, per source, the batches taken and the times it ran out in
    the epoch in progress (or the last one). ``state_dict()`` is the position (plain JSON);
    ``load_state_dict()`` checks it whole and the next iteration continues at the same step, with
    the same choices, every source from its own saved reader state: the same batches in the same
    order as an uninterrupted run on the same layout; on another (ranks, ``num_workers``) the same
    draws where each source has the same batches left, and every remaining sample once. Sources
    with ``repeat=True`` can't be resumed (use ``until=N``).

    ``num_workers``: a number N (default 0: this process): with torch and every source with sample
    counts, one DataLoader of N workers reads every source (``shared`` is True; the module
    docstring says how), so no worker idles while another source is drawn; give it as many
    workers as one Dataset would have. A mapping of source names to numbers, or a source without
    counts (or ``repeat=True``): each source reads through a ``Loader`` of its own, with that many
    workers. ``loader_kwargs`` (``pin_memory``, ``prefetch_factor``, ...) go to every DataLoader.
    Iterate the Mix in the training loop; don't wrap it in a DataLoader: it makes its own.

    >>> import os, tempfile, tarproc
    >>> d = tempfile.mkdtemp()
    >>> for name in "ab":
    ...     with open(os.path.join(d, f"{name}.tar"), "wb") as f, tarproc.TarWriter(f) as w:
    ...         for i in range(4):
    ...             w.write_sample({"__key__": f"{name}{i}", "cls": i})
    >>> ds = {n: tarproc.Dataset(os.path.join(d, f"{n}.tar"), batch_size=2, to_tuple=("__key__",)) for n in "ab"}
    >>> mix = Mix(ds, {"a": 0.5, "b": 0.5}, seed=1, until="all", tagged=True)
    >>> [(name, list(batch[0])) for name, batch in mix]
    [('a', ['a0', 'a1']), ('b', ['b0', 'b1']), ('a', ['a2', 'a3']), ('b', ['b2', 'b3'])]
    """

    def __init__(
        self,
        sources: Mapping[str, Any] | Sequence[Any],
        weights: Sequence[float] | Mapping[str, float],
        *,
        seed: int = 0,
        compose: str = "batches",
        until: str | int = "first",
        batch_size: int | None = None,
        tagged: bool = False,
        num_workers: int | Mapping[str, int] = 0,
        **loader_kwargs: Any,
    ) -> None:
        if isinstance(sources, Mapping):
            named = list(sources.items())
        elif isinstance(sources, Sequence) and not isinstance(sources, (str, bytes)):
            named = [(str(i), ds) for i, ds in enumerate(sources)]
        else:
            raise OptionError(f"sources must be a mapping of names to datasets or a sequence of datasets, not {type(sources).__name__}")
        if not named:
            raise OptionError("a Mix needs at least one source")
        seen: dict[int, str] = {}
        for name, ds in named:
            if not isinstance(name, str) or not name:
                raise OptionError(f"bad source name {name!r}; names are non-empty strings")
            if not all(hasattr(ds, a) for a in ("set_epoch", "state_dict", "load_state_dict", "batch_size")):
                raise OptionError(f"source {name!r} is not a tarproc.Dataset (got {type(ds).__name__})")
            if id(ds) in seen:
                raise OptionError(f"sources {seen[id(ds)]!r} and {name!r} are the same Dataset object: give each its own")
            seen[id(ds)] = name
        self.names = [n for n, _ in named]
        self.weights = self._check_weights(weights)
        if not _is_int(seed):
            raise OptionError(f"bad seed {seed!r}; must be an int")
        if compose not in COMPOSE:
            raise OptionError(f"bad compose {compose!r}; use batches or stratified")
        if not (until in UNTIL or (_is_int(until) and until >= 1)):
            raise OptionError(f"bad until {until!r}; use 'first', 'all' or a number of steps >= 1")
        if compose == "stratified":
            if until == "all":
                raise OptionError("until='all' is for compose='batches': every stratified batch needs every source")
            if tagged:
                raise OptionError("tagged=True is for compose='batches': a stratified batch holds every source (see per_batch)")
            if not _is_int(batch_size) or batch_size < len(named):
                raise OptionError(
                    f"compose='stratified' needs batch_size >= the number of sources ({len(named)}), got {batch_size!r}"
                )
        elif batch_size is not None:
            raise OptionError("batch_size= is for compose='stratified'; with 'batches' each source's own batch_size applies")
        self.seed, self.compose, self.until, self.batch_size, self.tagged = seed, compose, until, batch_size, bool(tagged)
        self.per_batch: dict[str, int] = {}
        if compose == "stratified":
            assert batch_size is not None
            counts = largest_remainder([self.weights[n] for n in self.names], batch_size)
            for name, k in zip(self.names, counts, strict=True):
                if k < 1:
                    raise OptionError(
                        f"source {name!r}: weight {self.weights[name]:.4g} gives 0 of {batch_size} samples per batch; "
                        f"raise its weight or the batch_size"
                    )
            self.per_batch = dict(zip(self.names, counts, strict=True))
            for name, ds in named:
                if getattr(ds, "pad", False):
                    raise OptionError(f"source {name!r} pads its batches (pad=True): a stratified batch takes only full "
                                      "batches of each source")
                ds.batch_size = self.per_batch[name]  # set again before each pass
                # full batches only: a rank's last batch of a source may hold one sample more or less than
                # another rank's, which would end the source at different steps on different ranks
                ds.drop_last = True
        workers = self._check_workers(num_workers)
        torch_ok = _have_torch()
        self._sources: dict[str, _Source] = {}
        # one set of num_workers workers reads every source, where each has counts (else a Loader each)
        self.shared = torch_ok and not isinstance(num_workers, Mapping) and all(_shares_workers(ds) for _, ds in named)
        self._shared_workers = int(num_workers) if self.shared else 0  # type: ignore[arg-type]
        self._loader_kwargs = dict(loader_kwargs)
        if self.shared:
            for i, (name, ds) in enumerate(named):
                src = self._sources[name] = _Source(name, ds, self.weights[name], 0, None)
                src.shared_workers = max(1, self._shared_workers)
                # one ring of batch buffers per worker for the sources whose batches have one shape:
                # each new worker fills its rings with fresh buffers (page faults), one per source else
                for _, earlier in named[:i]:
                    if ds.share_buffers(earlier):
                        break
        for name, ds in named if not self.shared else []:
            use_loader = torch_ok and callable(getattr(ds, "loader", None))
            if not use_loader and (workers[name] or loader_kwargs):
                what = f"num_workers={workers[name]}" if workers[name] else f"loader options {sorted(loader_kwargs)}"
                raise OptionError(f"source {name!r}: {what} needs PyTorch (a Loader); without it each source is read in this process")
            options = dict(loader_kwargs)
            if workers[name]:
                # a source's workers work ahead while the others are drawn (each keeps 4 batch buffers)
                options.setdefault("prefetch_factor", PREFETCH)
            loader = ds.loader(num_workers=workers[name], **options) if use_loader else None
            self._sources[name] = _Source(name, ds, self.weights[name], workers[name], loader)
        self._epoch, self._step = 0, 0
        self._dropped: list[str] = []
        self._drawn: dict[str, int] = {}
        self._exhausted: dict[str, int] = {}
        self._partial = False  # an iteration began this position and did not finish it
        self._run_id = 0
        self._plan(0)
        self._shown = (self._drawn, self._exhausted)

    # -- arguments ---------------------------------------------------------------------------------

    def _check_weights(self, weights: Sequence[float] | Mapping[str, float]) -> dict[str, float]:
        if isinstance(weights, Mapping):
            if set(weights) != set(self.names):
                raise OptionError(f"weights name {sorted(map(str, weights))}; the sources are {self.names}")
            values = [weights[n] for n in self.names]
        elif isinstance(weights, Sequence) and not isinstance(weights, (str, bytes)):
            if len(weights) != len(self.names):
                raise OptionError(f"{len(weights)} weights for {len(self.names)} sources")
            values = list(weights)
        else:
            raise OptionError(f"weights must be a sequence or a mapping of numbers, not {type(weights).__name__}")
        for name, w in zip(self.names, values, strict=True):
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w <= 0:
                raise OptionError(f"bad weight {w!r} of source {name!r}; must be a finite number > 0")
        total = sum(float(w) for w in values)
        if not math.isfinite(total):
            raise OptionError(f"weights {values!r} sum past the largest float ({sys.float_info.max:.4g}): scale them "
                              "down (only their ratios count)")
        shares = {n: float(w) / total for n, w in zip(self.names, values, strict=True)}
        for name, w in zip(self.names, values, strict=True):
            if shares[name] < MIN_SHARE:
                raise OptionError(f"source {name!r}: weight {w!r} is {shares[name]:.3g} of the total, below the 2**-53 a "
                                  "draw can tell from 0: it would never be drawn; raise its weight or leave it out")
        return shares

    def _check_workers(self, num_workers: int | Mapping[str, int]) -> dict[str, int]:
        given = num_workers if isinstance(num_workers, Mapping) else dict.fromkeys(self.names, num_workers)
        unknown = sorted(set(given) - set(self.names))
        if unknown:
            raise OptionError(f"num_workers names unknown sources {unknown}; the sources are {self.names}")
        for name, n in given.items():
            if not _is_int(n) or n < 0:
                raise OptionError(f"bad num_workers {n!r} for source {name!r}; must be an int >= 0")
        return {n: int(given.get(n, 0)) for n in self.names}

    # -- position ----------------------------------------------------------------------------------

    def _plan(self, epoch: int) -> None:
        """Position at the start of mix epoch ``epoch``: every source a fresh pass."""
        for src in self._sources.values():
            src.plan(epoch if src.epoch is None else max(epoch, src.epoch + 1))
        self._epoch, self._step, self._dropped = epoch, 0, []
        self._drawn = dict.fromkeys(self.names, 0)
        self._exhausted = dict.fromkeys(self.names, 0)
        self._partial = False

    @property
    def epoch(self) -> int:
        """The mix epoch of the position: the one in progress, or between epochs the next one."""
        return self._epoch

    @property
    def step(self) -> int:
        """Steps taken in the epoch of the position."""
        return self._step

    @property
    def drawn(self) -> dict[str, int]:
        """Batches taken per source in the epoch in progress (or the last one)."""
        return dict(self._shown[0])

    @property
    def exhausted(self) -> dict[str, int]:
        """Times each source ran out in the epoch in progress (or the last one): with ``until="first"``
        the source that ended it, with ``"all"`` the drop-outs, with an int the restarts."""
        return dict(self._shown[1])

    def set_epoch(self, epoch: int) -> None:
        """Run mix epoch ``epoch`` next, from its first step (a position loaded for that same epoch
        is kept, as ``Dataset.set_epoch`` keeps a resume)."""
        if not _is_int(epoch) or epoch < 0:
            raise OptionError(f"bad epoch {epoch!r}; must be an int >= 0")
        if epoch == self._epoch and not self._partial:
            return
        self._run_id += 1  # an iteration in progress is over
        self._plan(epoch)

    def __len__(self) -> int:
        if not _is_int(self.until):
            raise TypeError(f"a Mix with until={self.until!r} has no length (until=N has N steps)")
        return int(self.until)

    # -- iteration ---------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        for src in self._sources.values():
            src.close()  # before any new reader starts: a Loader resets its dataset when closed
        if self._partial:  # the last iteration was broken off: each iteration is the next epoch
            self._plan(self._epoch + 1)
        self._partial = True
        self._run_id += 1
        self._shown = (self._drawn, self._exhausted)
        return self._run(self._run_id)

    def _run(self, run_id: int) -> Iterator[Any]:
        if self.shared:
            yield from self._run_shared(run_id)
            return
        try:
            while not (_is_int(self.until) and self._step >= self.until):
                if self._run_id != run_id:
                    raise OptionError("this Mix iteration was superseded (a new iteration, set_epoch or load_state_dict)")
                step = self._step_stratified() if self.compose == "stratified" else self._step_batches()
                if step is None:
                    break
                self._step += 1
                yield step if self.tagged else step[1]
            if self._run_id == run_id:
                self._plan(self._epoch + 1)
        finally:
            if self._run_id == run_id:
                for src in self._sources.values():
                    src.close()

    def _run_shared(self, run_id: int) -> Iterator[Any]:
        """An iteration in one set of workers: the schedule, read by them, put back in step order."""
        workers = self._shared_workers
        schedule = self.schedule()
        readers: Any = BlendedReaders({n: s.dataset for n, s in self._sources.items()}, schedule)
        items: Iterator[Any]
        if workers:
            import torch.utils.data

            readers = _blended_type()(readers.datasets, schedule)
            options = dict(self._loader_kwargs)
            if "in_order" in inspect.signature(torch.utils.data.DataLoader).parameters:
                # each batch as soon as it is made: the order is the steps', restored here
                options.setdefault("in_order", False)
            items = iter(torch.utils.data.DataLoader(readers, batch_size=None, num_workers=workers, **options))
        else:
            items = iter(readers)
        early: dict[tuple[int, str], Any] = {}  # batches of later steps, come before the one due
        try:
            for planned in schedule.steps:
                if self._run_id != run_id:
                    raise OptionError("this Mix iteration was superseded (a new iteration, set_epoch or load_state_dict)")
                self._events(planned.events, schedule)
                parts = []
                for name, _, _ in planned.parts:
                    while (planned.step, name) not in early:
                        if not _receive(items, early):
                            raise DatasetError(f"the Mix's workers ended before step {planned.step} of its plan")
                    parts.append((name, early.pop((planned.step, name))))
                    src = self._sources[name]
                    src.started, src.saved, src.status = True, None, "live"
                    src.taken += 1
                    self._drawn[name] += 1
                self._step += 1
                yield self._output(parts)  # which empties parts: see _output
            if self._run_id == run_id:
                self._events(schedule.end, schedule)
                self._plan(self._epoch + 1)
        finally:
            close = getattr(items, "close", None) or getattr(items, "_shutdown_workers", None)
            if close is not None:
                close()

    def _output(self, parts: list[tuple[str, Any]]) -> Any:
        """A step's batch (tagged or not) from its ``(source, batch)`` parts, emptying ``parts``: the
        iteration holds no reference to a batch it handed out while it waits for the next, so its
        shared-memory buffer goes back to its worker as soon as the training loop drops it."""
        taken = list(parts)
        parts.clear()
        if self.compose == "stratified":
            out: tuple[str, Any] = ("+".join(self.names), concat_batches(taken))
        else:
            out = taken[0]
        return out if self.tagged else out[1]

    def _events(self, events: Sequence[tuple[str, str]], schedule: Schedule) -> None:
        """What happened to the sources before a step's draw (see ``Step``), applied to the position."""
        for kind, name in events:
            src = self._sources[name]
            if kind == "exhausted":
                self._exhausted[name] += 1
                src.status = "done"
            elif kind == "dropped":
                self._dropped.append(name)
            elif kind == "restart":
                assert src.epoch is not None
                src.plan(src.epoch + 1)
            else:  # "empty": a restart with nothing to draw
                need = f"{self.per_batch[name]} samples" if name in self.per_batch else "a batch"
                raise DatasetError(f"mix source {name!r} has less than {need} in its epoch {src.epoch}: nothing to draw")

    def schedule(self, workers: int | None = None) -> Schedule:
        """The plan of the epoch from the position: each step's source(s) and which batch of which
        pass, with sample counts (see the module docstring); the same on every rank."""
        workers = max(1, self._shared_workers if workers is None else workers)
        passes: list[tuple[str, int]] = []
        current: dict[str, int] = {}
        left: dict[str, int] = {}
        taken: dict[str, int] = {}

        def begin(name: str, epoch: int, fresh: bool) -> None:
            current[name], taken[name] = len(passes), 0
            passes.append((name, epoch))
            src = self._sources[name]
            left[name] = 0 if not fresh and src.status == "done" else src.dataset.steps_left(epoch, workers)

        for name in self.names:
            epoch = self._sources[name].epoch
            assert epoch is not None
            begin(name, epoch, False)
        complete: set[int] = set()
        steps: list[Step] = []

        def draw(name: str) -> tuple[str, int, int]:
            part = (name, current[name], taken[name])
            taken[name] += 1
            left[name] -= 1
            if not left[name]:
                complete.add(current[name])
            return part

        def restart(name: str, events: list[tuple[str, str]]) -> bool:
            """``until=N``: the source's next epoch; False when it has nothing to draw."""
            begin(name, passes[current[name]][1] + 1, True)
            events.append(("restart", name))
            if not left[name]:
                events.append(("empty", name))
                return False
            return True

        active = [n for n in self.names if n not in self._dropped]
        step = self._step
        end: list[tuple[str, str]] = []
        while not (_is_int(self.until) and step >= self.until):
            events: list[tuple[str, str]] = []
            parts: list[tuple[str, int, int]] = []
            ended = False
            if self.compose == "stratified":
                for name in self.names:
                    if not left[name]:
                        events.append(("exhausted", name))
                        if self.until == "first" or not restart(name, events):
                            ended = True
                            break
                if not ended:
                    parts = [draw(name) for name in self.names]
            else:
                rng, name = self.choice(self._epoch, step, active)
                while not left[name]:
                    events.append(("exhausted", name))
                    if self.until == "first":
                        ended = True
                        break
                    if self.until == "all":
                        events.append(("dropped", name))
                        active.remove(name)
                        if not active:
                            ended = True
                            break
                        name = rng.choices(active, [self.weights[n] for n in active])[0]
                        continue
                    if not restart(name, events):
                        ended = True
                        break
                if not ended:
                    parts.append(draw(name))
            if ended:
                if events and events[-1][0] == "empty":
                    steps.append(Step(step, (), tuple(events)))  # raised when the step comes
                else:
                    end = events
                break
            steps.append(Step(step, tuple(parts), tuple(events)))
            step += 1
        return Schedule(tuple(passes), tuple(steps), tuple(end), frozenset(complete))

    def choice(self, epoch: int, step: int, active: Sequence[str] | None = None) -> tuple[random.Random, str]:
        """The source drawn at ``(epoch, step)`` among ``active`` (default: all), and its generator
        (drawn from again when that source has run out, with ``until="all"``)."""
        rng = random.Random(f"{self.seed}/mix/{epoch}/{step}")
        names = list(self.names if active is None else active)
        return rng, rng.choices(names, [self.weights[n] for n in names])[0]

    def _step_batches(self) -> tuple[str, Any] | None:
        active = [n for n in self.names if n not in self._dropped]
        rng, name = self.choice(self._epoch, self._step, active)
        while True:
            src = self._sources[name]
            batch = src.take(None)
            if batch is None:
                self._exhausted[name] += 1
                if self.until == "first":
                    return None
                if self.until == "all":
                    self._dropped.append(name)
                    active.remove(name)
                    if not active:
                        return None
                    name = rng.choices(active, [self.weights[n] for n in active])[0]
                    continue
                batch = self._restart(src)
            self._drawn[name] += 1
            return name, batch

    def _step_stratified(self) -> tuple[str, Any] | None:
        parts = []
        for name in self.names:
            src, k = self._sources[name], self.per_batch[name]
            batch = src.take(k)
            if batch is not None and _rows(batch) < k:
                src.finish()
                batch = None
            if batch is None:
                self._exhausted[name] += 1
                if self.until == "first":
                    return None
                batch = self._restart(src)
            parts.append((name, batch))
        for name in self.names:
            self._drawn[name] += 1
        return "+".join(self.names), concat_batches(parts)

    def _restart(self, src: _Source) -> Any:
        """``until=N``: the source's next epoch, and its first batch."""
        assert src.epoch is not None
        src.plan(src.epoch + 1)
        k = self.per_batch.get(src.name)
        batch = src.take(k)
        if batch is None or (k is not None and _rows(batch) < k):
            need = f"{k} samples" if k is not None else "a batch"
            raise DatasetError(f"mix source {src.name!r} has less than {need} in its epoch {src.epoch}: nothing to draw")
        return batch

    # -- state ---------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The position (plain JSON): the step the next iteration runs, and each source's reader state."""
        return {
            "version": STATE_VERSION, "seed": self.seed, "compose": self.compose, "until": self.until,
            "batch_size": self.batch_size, "weights": dict(self.weights),
            "epoch": self._epoch, "step": self._step,
            "sources": {n: {"epoch": s.epoch, "loader": s.reader_state()} for n, s in self._sources.items()},
            "dropped": list(self._dropped), "drawn": dict(self._drawn), "exhausted": dict(self._exhausted),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from ``state_dict``) on the next iteration; a state that doesn't
        fit this Mix is an ``OptionError`` naming the field, and leaves the Mix's position as it was."""
        if not isinstance(state, Mapping):
            raise OptionError(f"not a Mix state: expected the dict Mix.state_dict() returned, got {type(state).__name__}")
        fields = ("version", "seed", "compose", "until", "batch_size", "weights", "epoch", "step", "sources",
                  "dropped", "drawn", "exhausted")
        missing = [f for f in fields if f not in state]
        if missing:
            raise OptionError(f"bad Mix state: no field {missing[0]!r}")

        def bad(field: str, why: str) -> OptionError:
            return OptionError(f"bad Mix state: field {field!r}: {why}")

        if state["version"] != STATE_VERSION:
            raise bad("version", f"version {state['version']!r} is not supported (this is version {STATE_VERSION})")
        for field, mine in (("seed", self.seed), ("compose", self.compose), ("until", self.until), ("batch_size", self.batch_size)):
            theirs = state[field]
            if type(theirs) is not type(mine) or theirs != mine:
                raise bad(field, f"the state has {theirs!r}, this Mix has {mine!r}: resume with the same {field}")
        epoch, step = state["epoch"], state["step"]
        if not _is_int(epoch) or epoch < 0:
            raise bad("epoch", f"{epoch!r} is not an int >= 0")
        if not _is_int(step) or step < 0 or (_is_int(self.until) and step > self.until):
            raise bad("step", f"{step!r} is not an int in 0..{self.until if _is_int(self.until) else 'any'}")
        sources = state["sources"]
        if not isinstance(sources, Mapping) or set(sources) != set(self.names):
            raise bad("sources", f"the state has sources {_names_of(sources)}, this Mix has {self.names}")
        weights = state["weights"]
        if not isinstance(weights, Mapping) or set(weights) != set(self.names):
            raise bad("weights", f"the state names {_names_of(weights)}, this Mix has sources {self.names}")
        for name in self.names:
            w = weights[name]
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isclose(w, self.weights[name], rel_tol=1e-12):
                raise bad("weights", f"source {name!r} has weight {w!r} there, {self.weights[name]!r} here: resume with the same weights")
        for name in self.names:
            entry = sources[name]
            if not isinstance(entry, Mapping) or "epoch" not in entry or "loader" not in entry:
                raise bad(f"sources.{name}", "expected {'epoch': int, 'loader': dict or None}")
            if not _is_int(entry["epoch"]) or entry["epoch"] < 0:
                raise bad(f"sources.{name}.epoch", f"{entry['epoch']!r} is not an int >= 0")
            if entry["loader"] is not None and not isinstance(entry["loader"], Mapping):
                raise bad(f"sources.{name}.loader", f"a {type(entry['loader']).__name__}, expected a dict or None")
        dropped = state["dropped"]
        if (not isinstance(dropped, list) or not all(isinstance(n, str) and n in self.names for n in dropped)
                or len(set(dropped)) != len(dropped)):
            raise bad("dropped", f"{dropped!r} is not a list of distinct source names of {self.names}")
        if dropped and (self.until != "all" or len(dropped) == len(self.names)):
            raise bad("dropped", f"{dropped!r}: sources drop out only with until='all', and not all of them")
        counters: dict[str, dict[str, int]] = {}
        for field in ("drawn", "exhausted"):
            value = state[field]
            if (not isinstance(value, Mapping) or set(value) != set(self.names)
                    or not all(_is_int(v) and v >= 0 for v in value.values())):
                raise bad(field, f"expected a count >= 0 for each of {self.names}")
            counters[field] = {n: int(value[n]) for n in self.names}
        # the fields fit: hand each source its reader state (the readers check their own)
        previous, partial = self.state_dict(), self._partial
        try:
            self._apply(state, counters)
        except OptionError:
            self._apply(previous, {"drawn": previous["drawn"], "exhausted": previous["exhausted"]})
            self._partial = partial
            raise

    def _apply(self, state: Mapping[str, Any], counters: Mapping[str, dict[str, int]]) -> None:
        self._run_id += 1  # an iteration in progress is over
        for src in self._sources.values():
            src.close()
        for name in self.names:
            entry = state["sources"][name]
            try:
                self._sources[name].resume(int(entry["epoch"]), entry["loader"])
            except TarprocError as e:
                raise OptionError(f"bad Mix state: field 'sources.{name}.loader': {e}") from None
        self._epoch, self._step, self._dropped = int(state["epoch"]), int(state["step"]), list(state["dropped"])
        self._drawn, self._exhausted = dict(counters["drawn"]), dict(counters["exhausted"])
        self._shown = (self._drawn, self._exhausted)
        self._partial = False


def _names_of(value: Any) -> list[str] | str:
    return sorted(map(str, value)) if isinstance(value, Mapping) else f"a {type(value).__name__}"
