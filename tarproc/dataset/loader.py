"""The torch-facing layer: ``Dataset`` as a ``torch.utils.data.IterableDataset``, and ``Loader``.

Without torch, ``Dataset`` is the plain iterable of ``tarproc.dataset.core`` (numpy batches).
With torch, it is also an ``IterableDataset`` whose batches hold tensors, and it knows its
DataLoader worker. ``Loader`` is a DataLoader over it that records what the training loop took
(``state_dict`` for exact resume) and decodes in the main process for ``device="gpu"``.

Its batches are ``BatchTuple``/``BatchDict``, which torch's ``default_collate`` is taught here
(``default_collate_fn_map``, its extension point) to refuse: a DataLoader given a ``batch_size``
(1 by default) would otherwise stack batches of batches without a word.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import DataWarning, warn
from .core import COUNT_HINT, Position, Taken
from .core import Dataset as _Core
from .fields import BatchBuffer, BatchDict, BatchTuple, as_batch, as_numpy

BATCHED = ("tarproc.Dataset yields whole batches (its own batch_size): give the DataLoader batch_size=None, "
           "as in DataLoader(ds, batch_size=None, num_workers=8), or iterate ds.loader(num_workers=8)")

try:  # torch stays optional at runtime
    # imported here, once, and not by each forked DataLoader worker (torch seeds numpy.random in
    # them): an import in a child forked while another thread of this process was importing fails
    # there with a KeyError from the import lock
    import numpy.random  # noqa: F401
    import torch
    from torch.utils.data import IterableDataset

    from .pool import BufferPool

    HAVE_TORCH = True
except ImportError:  # pragma: no cover - the test suite runs with torch
    torch = None  # type: ignore[assignment]
    IterableDataset = object  # type: ignore[assignment, misc]
    HAVE_TORCH = False


def refuse_batches(batch: Any, *, collate_fn_map: Any = None) -> Any:
    """torch's ``default_collate`` of items that are batches already: a DataLoader with a
    ``batch_size`` over the Dataset. An ``OptionError`` saying what to give instead."""
    from ..errors import OptionError

    raise OptionError(f"a DataLoader with a batch_size (1 unless given) would stack the Dataset's batches ({len(batch)} "
                      f"of them) into one: {BATCHED}")


if HAVE_TORCH:
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:  # pragma: no cover - torch before 1.13 has no map: batches of batches go unnoticed
        default_collate_fn_map = {}
    default_collate_fn_map.setdefault(BatchTuple, refuse_batches)
    default_collate_fn_map.setdefault(BatchDict, refuse_batches)


def _as_torch(value: Any) -> Any:
    import numpy as np

    if isinstance(value, BatchBuffer):
        return value.handle if isinstance(value.handle, torch.Tensor) else torch.from_numpy(value.array)
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.from_numpy(value)
    if isinstance(value, tuple):
        return tuple(_as_torch(v) for v in value)
    if isinstance(value, dict):
        return {k: _as_torch(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, np.ndarray) for v in value):
        return [torch.from_numpy(v) for v in value]
    return value


class Dataset(_Core, IterableDataset):  # type: ignore[misc, valid-type]
    __doc__ = _Core.__doc__

    def worker_info(self) -> tuple[int, int, bool]:
        if HAVE_TORCH:
            info = torch.utils.data.get_worker_info()
            if info is not None:
                return info.id, info.num_workers, True
        return 0, 1, False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # before any DataLoader forks its workers: they share its cells
        self._pool = BufferPool() if HAVE_TORCH else None

    __init__.__signature__ = inspect.signature(_Core.__init__)  # type: ignore[attr-defined]  # help(), IDEs

    def share_buffers(self, other: Any) -> bool:
        """Make this dataset's image batches in ``other``'s shared-memory buffers from now on, when
        both decode to batches of one shape (same ``batch_size``, size, layout and dtype); True
        when they share. A ``Mix`` read in one set of workers calls it so that each worker keeps one
        ring of buffers for all its sources, not one per source: a ring starts empty in each new
        worker, and each fresh buffer costs page faults (about 40 ms for 64 images of 224x224 floats)."""
        if not isinstance(other, Dataset) or self._pool is None or other._pool is None:
            return False

        def shape(ds: Dataset) -> tuple[Any, ...] | None:
            spec = ds.spec
            if spec is None or spec.size is None:
                return None
            return ds.batch_size, spec.size, spec.layout, spec.output_dtype, ds.tensors

        if shape(self) is None or shape(self) != shape(other):
            return False
        self._pool = other._pool
        return True

    def batch_buffer(self, shape: tuple[int, ...], dtype: str) -> BatchBuffer:
        worker, _, in_worker = self.worker_info()
        if self._pool is None or self.tensors == "numpy" or not in_worker:
            return super().batch_buffer(shape, dtype)
        # in a DataLoader worker: the batch in shared memory, where torch would otherwise copy it
        # to send it to the main process; a buffer the main process has let go of, when there is one.
        # A short batch (an epoch's last) is the first rows of a full-size one: the ring keeps one shape
        rows = max(shape[0], self.batch_size)
        tensor = self._pool.take(worker, (rows, *shape[1:]), getattr(torch, dtype))[: shape[0]]
        return BatchBuffer(tensor, tensor.numpy())

    def to_tensors(self, batch: Any) -> Any:
        if self.tensors == "numpy" or (self.tensors == "auto" and not HAVE_TORCH):
            return as_batch(as_numpy(batch))
        if not HAVE_TORCH:
            from ..errors import OptionError

            raise OptionError("tensors='torch' needs PyTorch: pip install 'tarproc[torch]'")
        batch = as_batch(_as_torch(batch))  # a batch that default_collate refuses (see BATCHED)
        if self._pool is not None and isinstance(batch, (tuple, dict)) and self.worker_info()[2]:
            batch = self._pool.settle(batch)
        return batch

    def __iter__(self) -> Iterator[Any]:
        if self._tagged or self.worker_info()[2] or not self.agrees_on_the_end:
            return super().__iter__()
        # iterated in this process (no DataLoader workers) by several ranks without counts
        return _together(super().__iter__(), self)

    def loader(self, num_workers: int = 0, **kwargs: Any) -> Loader:
        """A ``Loader`` over this dataset: a DataLoader with ``num_workers`` workers (and the other
        DataLoader ``kwargs``) that keeps the position for ``state_dict``; see ``Loader``."""
        return Loader(self, num_workers=num_workers, **kwargs)


class Loader:
    """``DataLoader(dataset, batch_size=None, num_workers=N, ...)`` that also keeps the position.

    Made by ``ds.loader(num_workers=N)``. Iterate it as a DataLoader. ``state_dict()`` says where
    the training loop stands in the epoch; ``load_state_dict()`` makes the next iteration continue
    from there, nothing repeated or skipped (on any number of ranks and workers, with counts).
    With ``device="gpu"`` the workers batch encoded images and the Loader decodes them here with
    DALI, on the GPU. Without counts, on several ranks, the ranks end each epoch together (an
    all-reduce per step).

    Args:
        dataset: the ``tarproc.Dataset`` to read.
        num_workers: DataLoader worker processes (default 0: read in this process); each is one
            reader of the epoch's plan.
        kwargs: the other ``torch.utils.data.DataLoader`` arguments (``persistent_workers``,
            ``pin_memory``, ``prefetch_factor``, ``multiprocessing_context``...); not
            ``batch_size``: the dataset batches in its workers.

    Raises:
        OptionError: torch is not installed, or a ``batch_size`` is given.
        DatasetError: (while iterating) a worker's error, as one line naming the shard, key and
            field and the worker; a worker that died, naming the shards it was reading.

    Example: ``for images, labels in ds.loader(num_workers=8): ...``; then
    ``torch.save({"data": loader.state_dict()}, path)`` and, after a restart,
    ``loader.load_state_dict(torch.load(path)["data"])``.
    """

    def __init__(self, dataset: Dataset, num_workers: int = 0, **kwargs: Any) -> None:
        if not HAVE_TORCH:
            from ..errors import OptionError

            raise OptionError("Loader needs PyTorch: pip install 'tarproc[torch]' (or iterate the Dataset itself)")
        if kwargs.get("batch_size") is not None:
            from ..errors import OptionError

            raise OptionError("the dataset batches inside its workers: don't give the Loader a batch_size")
        kwargs["batch_size"] = None
        self.dataset = dataset
        self.num_workers = num_workers
        self.kwargs = kwargs
        self._epoch: int | None = None
        self._steps = 0
        self._taken: dict[int, Taken] = {}

    @property
    def workers(self) -> int:
        """Readers per rank (``num_workers=0`` reads in this process: one)."""
        return max(1, self.num_workers)

    def __iter__(self) -> Iterator[Any]:
        ds = self.dataset
        ds._tagged = True  # before the workers start: they inherit it
        if self.num_workers:
            ds.load_offsets(self.workers)  # read once here, inherited by the workers
        loader = torch.utils.data.DataLoader(ds, num_workers=self.num_workers, **self.kwargs)
        first = True
        reading: dict[int, str | None] = {}  # worker -> the shard it was reading at its last batch
        batches: Iterator[Any] = _reraise_clean(loader, reading)
        if ds.agrees_on_the_end:
            batches = _together(batches, ds, tagged=True)
        try:
            for position, batch in batches:
                position = Position(*position)
                reading[position.reader] = position.url
                if first or position.epoch != self._epoch:
                    first = False
                    self._epoch, self._steps = position.epoch, 0
                    # readers resumed mid-epoch start from where the state left them
                    resume = ds._resume_for(position.epoch, position.consumers)
                    self._taken = dict(resume.skip) if resume is not None else {}
                self._taken[position.consumer] = position.taken_state()
                self._steps += 1
                if ds.decodes_in_main:
                    batch = ds.finish(batch)
                yield batch
        finally:
            ds._tagged = False
            if ds._main_decoder is not None:
                ds._main_decoder.close()
                ds._main_decoder = None

    def state_dict(self) -> dict[str, Any]:
        """The position, as plain JSON-able data: the epoch, its plan and the steps taken. With
        sample counts it is the same on every rank (save rank 0's) and resumes any layout; without
        counts, and for ``repeat=True`` streams, it is per rank (save each rank's)."""
        return self.dataset._state(self._epoch, self.workers, self._steps, self._taken)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (a ``state_dict()``) on the next iteration: every remaining
        sample of its epoch once, the batches exactly as an uninterrupted run's on the same layout.

        Raises:
            OptionError: a state that can't be used here (another seed, shard list or counts,
                another layout where one is needed, a damaged field), naming the field.
        """
        self.dataset.load_state_dict(state, workers=self.workers)
        self._epoch, self._steps, self._taken = None, 0, {}

    def __len__(self) -> int:
        """Batches per rank in an epoch (see ``Dataset.__len__``)."""
        return len(self.dataset)


def _together(batches: Iterator[Any], ds: _Core, tagged: bool = False) -> Iterator[Any]:
    """End the epoch on every rank at once, without sample counts (``lengths=None``): before each
    step the ranks all-reduce "I have a batch"; the first rank that runs dry ends the epoch for
    all. The batches the others still had are read to the end and counted (``ds.lost``); the job
    says so once, from rank 0. ``tagged``: the items are a Loader's ``(position, batch)``."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if not ds._warned_uncounted:
            ds._warned_uncounted = True
            warn(f"{ds.rank_world()[1]} ranks without sample counts and torch.distributed not initialized: the ranks "
                 f"may take unequal numbers of steps ({COUNT_HINT})")
        yield from batches
        return
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.zeros(1, dtype=torch.int32, device=device)
    while True:
        item = next(batches, None)
        flag.fill_(0 if item is None else 1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item():
            yield item
            continue
        left, failed = 0, None
        try:
            left = 0 if item is None else sum(_samples(b[1] if tagged else b) for b in itertools.chain([item], batches))
        except Exception as e:  # noqa: BLE001 - raised after the collective: the other ranks wait in it
            failed = e
        lost = torch.tensor([left], dtype=torch.int64, device=device)
        dist.all_reduce(lost)
        if failed is not None:
            raise failed
        ds._tally.add(lost=int(lost.item()) if dist.get_rank() == 0 else 0)  # the job's loss, counted once
        if lost.item() and not ds._warned_uncounted and dist.get_rank() == 0:
            ds._warned_uncounted = True
            warn(f"lengths=None: the epoch ended when the first rank ran out, leaving out {int(lost.item()):,} samples "
                 "the other ranks held (said once; ds.lost counts every epoch's)", DataWarning)
        return


def _samples(batch: Any) -> int:
    """The samples in a batch: the length of its first column."""
    if isinstance(batch, Mapping):
        batch = next(iter(batch.values()), ())
    elif isinstance(batch, (tuple, list)) and batch and not isinstance(batch[0], (str, bytes)):
        batch = batch[0]
    try:
        return len(batch)
    except TypeError:
        return 1


def _reraise_clean(loader: Any, reading: Mapping[int, str | None]) -> Iterator[Any]:
    """The loader's items; a dead worker becomes a DatasetError naming the shard it was reading
    (torch's own message names only its process id)."""
    import re

    from ..errors import DatasetError

    it = iter(loader)
    # worker index by process id, taken now: torch forgets its workers when it shuts them down
    by_pid = {w.pid: i for i, w in enumerate(getattr(it, "_workers", []))}
    try:
        yield from it
    except RuntimeError as e:
        text = str(e)
        if "DataLoader worker" not in text or not ("exited unexpectedly" in text or "killed by signal" in text):
            raise
        match = re.search(r"pid(?:\(s\))? ([\d, ]+)", text)  # "(pid 123)" or "(pid(s) 123, 456)"
        pids = {int(p) for p in re.findall(r"\d+", match.group(1))} if match else set()
        workers = sorted(by_pid[p] for p in pids if p in by_pid)
        shards = sorted({str(reading.get(i)) for i in workers if reading.get(i)})
        where = f" while reading {', '.join(shards)}" if shards else " before its first batch"
        which = f"DataLoader worker {', '.join(map(str, workers))}" if workers else "a DataLoader worker"
        raise DatasetError(f"{which} died{where}: {text.splitlines()[0]}") from e
