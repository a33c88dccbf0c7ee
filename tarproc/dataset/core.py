"""``Dataset``: shards to training batches, over the same reader, stages and decode stage as the commands.

One consumer (a DataLoader worker of one rank, or the main process) runs this pipeline::

    its parts of the epoch's shards (split.py)   -> read_samples, every sample of its parts, in order
    -> shuffle buffer (seed, epoch, consumer)     -> skip what a resumed run already took
    -> batches of batch_size input samples        -> decode + augment the image (AugmentSpec, plan key = key + epoch)
    -> audio/video fields (AudioSpec, VideoSpec)  -> field handlers (cls -> int, json, ...)
    -> to_tuple selection                         -> collate ("stack", "pad" or a hook; numpy, then torch tensors)

The module never imports torch: ``tarproc.dataset.loader`` is the thin torch-facing layer (worker
info, tensors, ``Loader``), and ``Dataset`` becomes a ``torch.utils.data.IterableDataset`` there
when torch can be imported.
"""

from __future__ import annotations

import array
import collections
import dataclasses
import gc
import itertools
import json
import multiprocessing
import os
import random
import sys
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from ..decode.spec import AugmentSpec, plan_key, unknown_parameter
from ..decode.stage import DEFAULT_FIELDS, DecodeStats, decoded_batches, make_decoder
from ..errors import (
    CompressionError,
    DataWarning,
    DecodeError,
    IndexFileError,
    OptionError,
    SampleError,
    ShardCountError,
    SourceError,
    TarFormatError,
    TarprocError,
    warn,
)
from ..index import COMPRESSED_SUFFIXES, default_index_url
from ..samples import Sample, read_samples, read_samples_from
from ..sources import (
    Network,
    Prefetcher,
    expand_urls,
    finish_fills,
    is_fsspec_url,
    local_path,
    open_remote,
    shard_cache,
)
from ..sources.prefetch import DEPTH, Budget
from ..sources.remote import Identity, identify, mark_reached
from ..stages import ShuffleBuffer, shuffle
from ..tar import FileRange, ReadPolicy
from ..tar.ranges import held_files
from .counts import manifest_digests, shard_counts, stale_index
from .fields import (
    BatchBuffer,
    Collate,
    Handler,
    Slot,
    apply_handlers,
    as_numpy,
    collate,
    decode_media,
    make_collate,
    merge_handlers,
    parse_decoding,
    parse_selection,
    pick,
)
from .split import (
    Assignment,
    Part,
    at_positions,
    decode_work,
    encode_work,
    epoch_order,
    epoch_work,
    interleave_chunk,
    rank_plan,
    read_streams,
    remaining,
    runs,
    split_by_shard,
    split_rank,
    split_work,
    take,
    worker_batches_taken,
)

ON_ERROR = ("fail", "skip", "skip-shard")
_FROZEN: list[bool] = []  # gc.freeze() done in this (worker) process
DEVICES = ("cpu", "dali-cpu", "gpu")
STATE_VERSION = 2
MAX_READERS = 1 << 20  # ranks x workers a state may describe
COUNT_HINT = ("for equal steps with every sample once, give counts: lengths='auto' (the default) counts every shard "
              "but pipe: commands; or lengths=MANIFEST, or index files beside the shards (tarindex SHARDS)")
DEFAULT_PART_SIZE = 256  # samples: shuffled shards are read in parts this long, in one order for all readers
DEFAULT_INTERLEAVE = 64  # parts each reader reads at once, a few samples of each in turn (split.interleave)
_GAP = 64  # samples: a longer gap in what a reader wants of a shard is skipped by starting a new read past it
_PASS_STRIDE = 1_000_000  # repeat=True: pass p of nominal epoch e draws its randomness as epoch e * stride + p
HELD_FILES = 256  # descriptors held (one a shard part read) for images left in their shard; past it, read at once
_READ_BUFFER = threading.local()  # .data: a bytearray an image left in its shard is read into, used again
_READ_BUFFER_MAX = 16 << 20


class Position(NamedTuple):
    """Where a batch comes from: ``epoch``, the ``consumer`` (rank * workers + worker) of
    ``consumers``, how many of the consumer's input samples and batches its pass has taken up to
    and including this batch (what a resumed run skips), and the pass of a ``repeat=True`` stream."""

    epoch: int
    consumer: int
    consumers: int
    taken: int
    url: str | None = None  # the shard the consumer was reading when the batch was complete
    batches: int = 0  # batches of this pass
    pass_: int = 0
    made: int = 0  # batches of this iteration (a repeat stream's nominal epoch)
    reader: int = 0  # the DataLoader worker that made it

    def taken_state(self) -> Taken:
        return Taken(self.pass_, self.taken, self.batches, self.made)


class Taken(NamedTuple):
    """Where a reader stands: in ``pass_`` (of a repeat stream; 0 otherwise), the input samples and
    batches of that pass it has handed out, and the batches of the iteration (a nominal epoch)."""

    pass_: int = 0
    samples: int = 0
    batches: int = 0
    made: int = 0


class EncodedImages(NamedTuple):
    """A batch's images still encoded, for decoding in the main process (``device="gpu"``)."""

    datas: list[bytes]
    plan_keys: list[str]
    keys: list[str]
    urls: list[str | None]
    fields: list[str]


class EpochClock:
    """The epoch number, in memory shared by the main process and its DataLoader workers.

    ``set(e)`` writes it there, so persistent workers see it too. Without ``set``, each pass is the
    next epoch: every reader counts the passes it has begun in a slot of its own (worker ``w``
    writes only slot ``w``, so no lock is needed, and the memory works with fork, spawn and
    forkserver workers alike), and the epoch is the base plus that count. One more slot says
    whether a DataLoader's workers read the dataset without its ``Loader`` (whose position then
    only they know).
    """

    SLOTS = 1024  # DataLoader workers per process; more is an error

    def __init__(self, epoch: int = 0) -> None:
        self._shared = multiprocessing.RawArray("q", self.SLOTS + 2)
        self._shared[0] = epoch

    def set(self, epoch: int) -> None:
        self._shared[1 : self.SLOTS + 1] = [0] * self.SLOTS
        self._shared[0] = epoch

    def begin(self, worker: int) -> int:
        """The epoch of the pass that ``worker`` begins now."""
        if not 0 <= worker < self.SLOTS:
            raise OptionError(f"at most {self.SLOTS} DataLoader workers are supported")
        begun = self._shared[1 + worker]
        self._shared[1 + worker] = begun + 1
        return int(self._shared[0]) + begun

    @property
    def epoch(self) -> int:
        """The epoch the next pass will run: the base plus the passes the readers have begun."""
        return int(self._shared[0]) + max(self._shared[1 : self.SLOTS + 1])

    @property
    def in_plain_workers(self) -> bool:
        return bool(self._shared[self.SLOTS + 1])

    def mark_plain_workers(self, value: bool = True) -> None:
        self._shared[self.SLOTS + 1] = int(value)

    def __reduce__(self) -> tuple[object, ...]:
        from multiprocessing.context import get_spawning_popen

        if get_spawning_popen() is not None:  # a spawned worker: share the memory
            return _shared_clock, (self._shared,)
        return EpochClock, (self.epoch,)  # a copy (pickle, deepcopy): a clock of its own


def _shared_clock(shared: Any) -> EpochClock:
    clock = EpochClock.__new__(EpochClock)
    clock._shared = shared
    return clock


class Tally:
    """Counts that every process of one dataset adds to, its DataLoader workers included (memory
    shared as ``EpochClock``'s, under a lock), so that what the workers skipped or lost is seen in
    the main process: ``ds.decode_stats``, ``ds.skipped_shards``, ``ds.lost``.

    >>> t = Tally(); t.add(decoded=3, skipped=1); t.add(decoded=2); (t["decoded"], t["skipped"])
    (5, 1)
    """

    NAMES = ("decoded", "skipped", "skipped_shards", "lost")
    KINDS = ("skipped sample", "skipped shard", "refill", "epoch ended early")  # warnings said once

    def __init__(self) -> None:
        self._shared = multiprocessing.RawArray("q", len(self.NAMES) + len(self.KINDS))
        # a spawn-context lock is inherited by forked workers and pickled to spawned ones alike
        self._lock = multiprocessing.get_context("spawn").Lock()

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                self._shared[self.NAMES.index(name)] += n

    def __getitem__(self, name: str) -> int:
        return int(self._shared[self.NAMES.index(name)])

    def first(self, kind: str) -> bool:
        """Whether this is the first time a warning of ``kind`` comes (in any of the processes)."""
        with self._lock:
            slot = len(self.NAMES) + self.KINDS.index(kind)
            self._shared[slot] += 1
            return self._shared[slot] == 1

    def __reduce__(self) -> tuple[object, ...]:
        from multiprocessing.context import get_spawning_popen

        if get_spawning_popen() is not None:  # a spawned worker: share the counts
            return _shared_tally, (self._shared, self._lock)
        return Tally, ()  # a copy (pickle, deepcopy): counts of its own


def _shared_tally(shared: Any, lock: Any) -> Tally:
    tally = Tally.__new__(Tally)
    tally._shared, tally._lock = shared, lock
    return tally


class _Resume(NamedTuple):
    """Where a loaded state continues in ``epoch``: the plan of that epoch (its ``work``, None for
    every shard, and ``generation``) and, for the layout of ``consumers`` readers, where each of
    them stood in it (``skip``): the same layout replays its readers' sequences, so the batches go on
    exactly as they would have. ``replan``: for any other layout (with counts), what is left of the
    epoch as a plan of its own."""

    epoch: int
    generation: int = 0
    work: list[Part] | None = None
    skip: dict[int, Taken] = {}  # consumer -> where its reader stood
    consumers: int | None = None  # the readers the skips are for (None: any layout)
    shift: int = 0  # the reader that delivers first (the batches its rank had taken, modulo the readers)
    steps: int = 0  # the steps every rank had taken in the plan
    state: Mapping[str, Any] = {}  # the state loaded: still the position until a batch is taken
    replan: _Resume | None = None


DEFAULT_READ = ReadPolicy()
DEFAULT_NETWORK = Network()
# the flat keywords of older releases, and the object each now goes in
_OLD_KEYWORDS = {"dup": "read", "max_member_size": "read", "cache_dir": "network", "cache_size": "network",
                 "retries": "network", "timeout": "network", "prefetch": "network"}


def _grouped_settings(read: ReadPolicy, network: Network, old: Mapping[str, Any],
                      remote: bool = True) -> tuple[ReadPolicy, Network]:
    """``read`` and ``network``, or the objects that the deprecated flat keywords in ``old`` make
    (said by one ``DeprecationWarning`` at the caller's line). Without ``remote`` shards a
    ``cache_size`` without ``cache_dir`` is left out, as it always was (no shard cache is made)."""
    unknown = [name for name in old if name not in _OLD_KEYWORDS]
    if unknown:  # an OptionError (and a TypeError) saying where it belongs: AugmentSpec(size=), ds.loader(num_workers=)
        raise unknown_parameter("Dataset", unknown[0])
    if not isinstance(read, ReadPolicy):
        raise OptionError(f"bad read {read!r}; give a tarproc.ReadPolicy(...)")
    if not isinstance(network, Network):
        raise OptionError(f"bad network {network!r}; give a tarproc.Network(...)")
    if not old:
        return read, network
    groups: dict[str, dict[str, Any]] = {"read": {}, "network": {}}
    for name, value in old.items():
        groups[_OLD_KEYWORDS[name]][name] = value
    given = {"read": read is not DEFAULT_READ, "network": network is not DEFAULT_NETWORK}
    for group, names in groups.items():
        if names and given[group]:
            raise OptionError(f"give {', '.join(names)} inside {group}=..., not beside it (the flat keywords are "
                              "deprecated)")
    if groups["read"]:
        read = ReadPolicy(**groups["read"])
    if groups["network"]:
        kept = dict(groups["network"])
        if not remote and kept.get("cache_dir") is None:
            kept.pop("cache_size", None)  # bounded no cache of local shards, as it always did
        network = Network(**kept)
    spelled = ", ".join(f"{group}=tarproc.{'ReadPolicy' if group == 'read' else 'Network'}("
                        + ", ".join(f"{k}={v!r}" for k, v in names.items()) + ")"
                        for group, names in groups.items() if names)
    flat = ", ".join(f"{name}=..." for name in old)
    warnings.warn(f"Dataset({flat}) is deprecated: write {spelled}", DeprecationWarning, stacklevel=_caller_level())
    return read, network


def _caller_level() -> int:
    """The ``stacklevel`` (for a ``warnings.warn`` in the function that calls this) of the first
    frame outside ``tarproc.dataset``: the user's line that made the Dataset, whatever the subclass."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame: Any = sys._getframe(1)
    level = 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
        frame, level = frame.f_back, level + 1
    return level


def _shard_urls(urls: str | Iterable[str]) -> list[str]:
    found = expand_urls([urls] if isinstance(urls, str) else list(urls))
    if not found:
        raise OptionError("no shards given")
    if "-" in found:
        raise OptionError("a training dataset reads its shards once per epoch: give paths or URLs, not stdin (-)")
    return found


def _check_batches(batch_size: int, shuffle: int, threads: int, tensors: str, pad: bool, drop_last: bool,
                   repeat: bool, batches_per_epoch: int | None) -> None:
    if batch_size is None:
        raise OptionError("bad batch_size None: the Dataset makes the batches, give it their size (samples, >= 1; "
                          "default 64); batch_size=None goes to the DataLoader over it: DataLoader(ds, batch_size=None), "
                          "or ds.loader()")
    for name, value in (("batch_size", batch_size), ("shuffle", shuffle), ("threads", threads),
                        ("batches_per_epoch", 1 if batches_per_epoch is None else batches_per_epoch)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise OptionError(f"bad {name} {value!r}; must be a whole number")
    if batch_size < 1:
        raise OptionError(f"bad batch size {batch_size}; must be >= 1")
    if shuffle < 0:
        raise OptionError(f"bad shuffle buffer {shuffle}; must be >= 0 (0: no sample shuffle)")
    if tensors not in ("auto", "torch", "numpy"):
        raise OptionError(f"bad tensors {tensors!r}; use auto, torch or numpy")
    if batches_per_epoch is not None and (batches_per_epoch < 1 or not repeat):
        raise OptionError("batches_per_epoch needs repeat=True and must be >= 1")
    if threads < 1:
        raise OptionError(f"bad threads {threads}; must be >= 1")
    if pad and drop_last:
        raise OptionError("pad=True and drop_last=True contradict each other: pad fills the last batches, drop_last drops them")


def _check_decoding(device: str, decode_in: str) -> None:
    if device not in DEVICES:
        raise OptionError(f"bad device {device!r}; use one of {', '.join(DEVICES)}")
    if decode_in not in ("auto", "worker", "main"):
        raise OptionError(f"bad decode_in {decode_in!r}; use auto, worker or main")
    if decode_in == "main" and device == "cpu":
        raise OptionError("decode_in='main' is for the DALI backends (dali-cpu, gpu)")
    if decode_in == "worker" and device == "gpu":
        raise OptionError("device='gpu' decodes in the main process: CUDA can't run in forked DataLoader workers")


def _check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR:
        raise OptionError(f"bad on_error {on_error!r}; use one of {', '.join(ON_ERROR)}")


def _check_rank(rank: int | None, world_size: int | None) -> None:
    if (rank is None) != (world_size is None):
        raise OptionError("give both rank and world_size, or neither (then RANK/WORLD_SIZE or torch.distributed)")
    if rank is not None and world_size is not None and not 0 <= rank < world_size:
        raise OptionError(f"bad rank {rank} of world size {world_size}")


def _check_part_size(part_size: object) -> None:
    if part_size in ("auto", None):
        return
    if isinstance(part_size, bool) or not isinstance(part_size, int) or part_size < 0:
        raise OptionError(f"bad part_size {part_size!r}; use 'auto', a number of samples, or None (whole shards)")


def _check_interleave(interleave: object) -> None:
    if interleave in ("auto", None):
        return
    if isinstance(interleave, bool) or not isinstance(interleave, int) or interleave < 0:
        raise OptionError(f"bad interleave {interleave!r}; use 'auto', a number of parts read at once, or None (one "
                          "after another)")


def _check_pad_marked(pad: bool, selection: list[list[str]] | None) -> None:
    if pad and selection is not None and not any("__valid__" in alts for alts in selection):
        raise OptionError("pad=True marks the padding in __valid__: add '__valid__' to to_tuple")


class Dataset:
    """Batches for training from sharded tar files, for a PyTorch ``DataLoader`` or a plain loop.

    Each epoch reads the shards' samples once, shuffles them, batches them inside the readers (the
    DataLoader's workers: give the DataLoader ``batch_size=None``), decodes and augments the images
    (and audio, video), and hands out torch tensors (numpy arrays without torch). With sample counts,
    which it finds by itself, every sample is in exactly one batch of an epoch and every rank takes
    the same number of steps. Recipes and measurements: ``docs/training.md``.

    Args:
        urls: the shards: a string (brace lists ``train-{0000..0147}.tar``, ``::`` joins) or a list
            of strings; paths, ``http(s)://``, ``s3://``, ``gs://`` and other fsspec URLs,
            ``pipe:CMD``. Not stdin (``-``): each epoch reads the shards again.

    Args (batches):
        batch_size: input samples per batch (default 64, >= 1). With counts, a rank's last batch of
            an epoch holds what it has left: 1 to ``batch_size + 1`` samples.
        drop_last: only full batches (default False); what is left out is counted in
            ``ds.dropped``. Not with ``pad``.
        pad: give every rank the same number of samples by padding with copies of the epoch's
            first samples, marked ``__valid__ = False`` (default False). Needs sample counts, and
            ``"__valid__"`` in ``to_tuple`` when that is given. Not with ``drop_last``.
        to_tuple: the columns of a batch, e.g. ``("jpg;png", "cls")``: field names, ``;`` between
            alternatives (the first the sample has); ``__key__``, ``__url__``, ``__valid__`` and
            ``FIELD.lengths`` (with ``collate="pad"``) too. Default None: a batch is a dict.
        collate: how a batch's rows become columns. ``"stack"`` (default, also None): numbers
            become int64/float64 arrays, arrays of one shape are stacked, anything else a list;
            ``"pad"``: 1-D and 2-D arrays padded with zeros at the end to the batch's longest, their
            lengths in ``FIELD.lengths``; a function: takes the batch's rows (dicts, or tuples with
            ``to_tuple``) and returns the batch (module-level, for spawned workers).
        map: a function of each sample dict (raw fields, after the shuffle, before decoding) that
            returns the sample to use, or None to drop it (the batch is one shorter, the number of
            batches unchanged). Default None.
        tensors: ``"auto"`` (default: torch tensors when torch is installed, else numpy),
            ``"torch"`` or ``"numpy"``.

    Args (shuffling and epochs):
        shuffle: samples in the shuffle buffer of each reader, filled before the first comes out
            (default 0: no sample shuffle).
        shuffle_shards: shuffle the shard order (and parts) each epoch; default None: when
            ``shuffle`` is set.
        part_size: with shuffled shards and counts, read the shards in parts of this many samples,
            all parts in one seeded order, for a better mix. ``"auto"`` (default): 256 where a reader
            can start mid-shard (local plain shards, shards with an index; not with a shard cache),
            else whole shards; a number >= 0; None or 0: whole shards.
        interleave: with parts, each reader reads this many of them at once, 16 samples of each
            in turn (a contiguous stretch of the epoch holds about that many parts, so each shuffle
            buffer mixes far more of the dataset; each sample is still read once, in shard order).
            ``"auto"`` (default): 64 where parts are read and every shard can be read from any
            sample on (local plain shards, shards with an index), else 1;
            a number >= 0; None, 0 or 1: the parts one after another. ``docs/training.md``.
        seed: seeds the shard order, the shuffle and the augmentations, mixed with the epoch
            (default 0): the same seed and epoch give the same batches.
        repeat: an endless stream of passes, each a new epoch's order (default False).
        batches_per_epoch: with ``repeat=True``, end each iteration after this many batches per
            rank (>= 1), a nominal epoch; default None.

    Args (decoding):
        decode: an ``AugmentSpec`` (decode, crop, flip, jitter, normalize the image field named by
            ``image``), or a dict of field names to specs (one ``AugmentSpec`` at most, plus
            ``AudioSpec`` and ``VideoSpec``), e.g. ``{"jpg": AugmentSpec(size=224), "flac":
            AudioSpec()}``. Default None: images stay bytes (or go through ``handlers``). A spec
            without a seed gets ``seed``.
        device: the image decoder: ``"cpu"`` (default: libjpeg-turbo, Pillow), ``"dali-cpu"`` or
            ``"gpu"`` (NVIDIA DALI; ``pip install 'tarproc[gpu]'``).
        decode_in: where images are decoded: ``"auto"`` (default: the workers, the main process
            for ``"gpu"``), ``"worker"`` (not with ``"gpu"``) or ``"main"`` (the DALI devices only).
            Decoding in the main process needs ``ds.loader()`` with workers.
        image: the image field's names, ``;`` between alternatives (default
            ``"jpg;jpeg;png;webp"``); not with a dict ``decode``, whose key names them.
        threads: decoding threads per reader (default 1, >= 1).
        handlers: decoders of other fields by full name (``"seg.png"``) or last extension
            (``"cls"``), e.g. ``{"cls": int, "txt": None}`` (None keeps bytes); they extend and
            override the defaults (``cls`` -> int, ``txt`` -> str, ``json``, ``npy``, ``npz``,
            ``pth``, ``msgpack``, ``cbor``, ``FIELD.gz``, ...). Default None.
        default_handlers: use the default handlers under ``handlers`` (default True).

    Args (distribution):
        lengths: the sample count of each shard, which the equal-steps plan needs. One of:
            ``"auto"`` (default): found for each shard, from an index file beside it (``tarindex``,
            or a DALI index), else for a local shard a walk over its headers (remembered in the
            cache), else for a remote shard a count remembered for its version or the shard read
            once (into the shard cache with ``network.cache_dir``); ``pipe:`` shards have none.
            ``"count"``: the same (an older name). A path: a ``tarsplit --manifest`` file (JSON
            lines; its ``sha256`` are checked by the shard cache) or a wids descriptor. A list of
            counts in the order of the shards. A dict of URL to count. ``None`` (or False): no
            counts: the readers split the shards, and the ranks end each epoch together when the
            first runs dry (with ``ds.loader()`` and ``torch.distributed``; ``ds.lost`` counts what
            was left out). A count that turns out wrong is a ``ShardCountError`` while reading.
        rank: this process's rank, with ``world_size``: give both or neither. Default None:
            ``RANK``/``WORLD_SIZE`` (torchrun), else ``torch.distributed``, else 0 of 1.
        world_size: the number of ranks (see ``rank``); ``0 <= rank < world_size``.

    Args (errors, reading and the network):
        on_error: a sample that can't be used (an image or media field that won't decode, a
            failing handler or ``map``): ``"fail"`` (default: a ``DecodeError``/``SampleError``
            naming the shard, the key and the field), ``"skip"`` (dropped, said once as a
            ``DataWarning``, counted in ``ds.decode_stats.skipped``), or ``"skip-shard"``: that, and
            a shard that can't be read leaves the epoch, as ``read=ReadPolicy(on_error="skip-shard")``.
        read: how the shards are read, a ``tarproc.ReadPolicy``: ``dup`` (a field twice in a
            sample), ``max_member_size``, ``links``, ``ignore_zeros``, and ``on_error``: with
            ``"skip-shard"`` a shard that can't be read (damage, its retries used up) is left for
            the rest of the epoch, said as a ``DataWarning`` and counted in ``ds.skipped_shards``
            and ``ds.lost``; with counts, the batches it was planned for are filled with copies
            marked ``__valid__ = False``. Default ``ReadPolicy()``: every problem is an error.
        network: how remote shards are read, a ``tarproc.Network``: ``retries``, ``timeout``,
            ``prefetch`` (bytes read ahead), ``min_speed``/``speed_time``, and ``cache_dir``:
            where the counts are kept (``DIR/counts``; default ``$TARPROC_CACHE_DIR``, else
            ``~/.cache/tarproc``) and, for remote shards, verified copies (``DIR/shards``), at most
            ``cache_size`` bytes of them. Default ``Network()``.

    Deprecated keywords (one release; each gives a ``DeprecationWarning``): ``dup`` and
    ``max_member_size`` (use ``read=ReadPolicy(...)``); ``cache_dir``, ``cache_size``,
    ``retries``, ``timeout`` and ``prefetch`` (use ``network=Network(...)``). Giving one of them
    beside its object is an ``OptionError``.

    Raises:
        OptionError: a parameter out of range, of the wrong kind, or contradicting another (the
            message names it); a keyword the Dataset doesn't take is a ``ParameterError`` (an
            ``OptionError`` and a ``TypeError``) saying where it belongs (``size=``: ``AugmentSpec``).
        ShardCountError: a shard said to be empty holds samples.
        SourceError: a shard that can't be opened while counting.

    Iterate it (or ``ds.loader(num_workers=N)``, a DataLoader that can resume: ``state_dict()``,
    ``load_state_dict()``); ``ds.set_epoch(e)`` sets the next epoch; ``len(ds)`` is the batches per
    rank of an epoch (with counts). Errors in workers reach the main process as one-line
    ``DatasetError``; warnings are ``tarproc.TarprocWarning`` (``warnings`` module).

    Example:

    >>> import os, tempfile, tarproc
    >>> path = os.path.join(tempfile.mkdtemp(), "s.tar")
    >>> with open(path, "wb") as f, tarproc.TarWriter(f) as w:
    ...     for i in range(5):
    ...         w.write_sample({"__key__": f"k{i}", "cls": i, "txt": f"t{i}"})
    >>> ds = Dataset(path, to_tuple=("cls", "txt"), batch_size=2, tensors="numpy")
    >>> [(b[0].tolist(), b[1]) for b in ds], len(ds)
    ([([0, 1], ['t0', 't1']), ([2, 3], ['t2', 't3']), ([4], ['t4'])], 3)

    A training loop: ``Dataset("train-{0000..0147}.tar", decode=AugmentSpec(size=224,
    random_crop=True, flip=0.5), shuffle=1000, to_tuple=("jpg", "cls"), read=ReadPolicy(dup="warn"),
    network=Network(cache_dir="/nvme/cache"))``, then ``for images, labels in ds.loader(8): ...``.
    """

    def __init__(
        self,
        urls: str | Iterable[str],
        *,
        batch_size: int = 64,
        shuffle: int = 0,
        drop_last: bool = False,
        pad: bool = False,
        to_tuple: Sequence[str] | None = None,
        collate: str | Collate | None = None,
        map: Callable[[Sample], Sample | None] | None = None,  # noqa: A002 - the user-facing name
        tensors: str = "auto",
        shuffle_shards: bool | None = None,
        part_size: int | str | None = "auto",
        interleave: int | str | None = "auto",
        seed: int = 0,
        repeat: bool = False,
        batches_per_epoch: int | None = None,
        decode: AugmentSpec | Mapping[str, Any] | None = None,
        device: str = "cpu",
        decode_in: str = "auto",
        image: str = DEFAULT_FIELDS,
        threads: int = 1,
        handlers: Mapping[str, Handler | None] | None = None,
        default_handlers: bool = True,
        lengths: Any = "auto",
        rank: int | None = None,
        world_size: int | None = None,
        on_error: str = "fail",
        read: ReadPolicy = DEFAULT_READ,
        network: Network = DEFAULT_NETWORK,
        **deprecated: Any,
    ) -> None:
        # validate
        self.urls = _shard_urls(urls)
        read, network = _grouped_settings(read, network, deprecated, any(is_fsspec_url(u) for u in self.urls))
        _check_batches(batch_size, shuffle, threads, tensors, pad, drop_last, repeat, batches_per_epoch)
        _check_decoding(device, decode_in)
        _check_rank(rank, world_size)
        _check_on_error(on_error)
        _check_part_size(part_size)
        _check_interleave(interleave)
        # store
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.shuffle_shards = bool(shuffle) if shuffle_shards is None else shuffle_shards
        self.seed = seed
        # the dataset's seed makes the augmentations (crops, clips) reproducible; the epoch makes them new
        decoding = parse_decoding(decode, image, seed)
        self.spec = decoding.image
        self.media = decoding.media  # audio and video fields: ([names], AudioSpec | VideoSpec)
        self.device = device
        self.decode_in = "main" if decode_in == "main" or device == "gpu" else "worker"
        self.image_fields = decoding.image_fields
        self.threads = threads
        self.handlers = merge_handlers(handlers, default_handlers)
        self.collate = make_collate(collate)
        self.selection = parse_selection(to_tuple) if to_tuple is not None else None
        _check_pad_marked(pad, self.selection)
        self.map = map
        self.drop_last = drop_last
        self.pad = pad
        self.repeat = repeat
        self.batches_per_epoch = batches_per_epoch
        self.rank, self.world_size = rank, world_size
        self.on_error = on_error
        self._on_bad_sample = "fail" if on_error == "fail" else "skip"  # skip-shard skips bad samples too
        self._skips_shards = on_error == "skip-shard" or read.on_error == "skip-shard"
        self.read = read
        # the readers raise what a shard does wrong: the dataset skips the shard (and counts the loss) itself
        self._reading_policy = dataclasses.replace(read, on_error="fail")
        self.tensors = tensors
        remote = [u for u in self.urls if is_fsspec_url(u)]
        # the shard cache is for remote shards, the counts' cache for all (default_cache_dir() without cache_dir)
        self.network = network if remote else dataclasses.replace(network, cache_dir=None, cache_size=None)
        self._tally = Tally()
        self._backend = ""  # the decode backend this process used
        self._clock = EpochClock()
        self._resume: _Resume | None = None
        self._taken: dict[int, Taken] = {}  # in-process iteration: consumer -> where it stands
        self._steps = 0  # in-process iteration: batches yielded this epoch
        self._epoch_seen: int | None = None
        self._tagged = False  # set by Loader: yield (Position, batch) pairs
        self._main_decoder: Any = None
        self._reading: str | None = None  # the shard this process is reading now
        self._warned_uncounted = False
        self._offsets: dict[str, _Offsets] = {}  # shard -> where its samples begin (see _offset)
        self._planned: tuple[tuple[Any, ...], list[Part]] | None = None  # the last epoch's work, and its key
        self.seeks = 0  # parts read from their first sample on, not from the shard's start (this process)
        # plan: the counts, then how the shards are cut
        self._find_counts(lengths, remote, network.cache_dir)
        self.part_size = self._choose_part_size(part_size)
        self.interleave = self._choose_interleave(interleave)
        # the samples of a part read at each turn, fixed here: the plan of every process the same
        self.interleave_chunk = interleave_chunk(sum((self.lengths or {}).values())) if self.interleave else None
        if pad and self.lengths is None:
            raise OptionError(f"pad=True needs sample counts, and {_few(self.uncounted)} have none: {COUNT_HINT}")

    def _find_counts(self, lengths: Any, remote: list[str], cache_dir: str | None) -> None:
        """The shards' sample counts (``lengths``), with their versions learned by the shard cache."""
        cached = self.network.cache_dir is not None
        self._identities = _identities(remote, self.network) if cached else {}
        self._digests = manifest_digests(lengths, remote) if cached else {}
        found = shard_counts(self.urls, lengths, cache_dir=cache_dir, network=self.network,
                             identities=self._identities, rank=self.rank_world()[0], world=self.rank_world()[1],
                             policy=self._reading_policy)
        self.lengths: dict[str, int] | None = found.counts
        self.count_sources = found.sources
        cache = shard_cache(self.network)
        if cache is not None:  # the indexes counted were copied into the cache: readers seek with those copies
            indexes = [default_index_url(u) for u in remote if self.count_sources.get(u, "").startswith("index ")]
            self._identities.update(_identities(indexes, self.network))
            cache.learn(self._identities, self._digests)
            finish_fills(self.network)  # published before DataLoader workers fork
        self.uncounted = found.missing
        for url, n in (self.lengths or {}).items():
            if not n and not self.count_sources.get(url, "").startswith("counted"):
                # no reader's plan takes a shard said to be empty: check now that it is
                samples = read_samples(url, policy=self._reading_policy)
                if next(samples, None) is not None:
                    raise ShardCountError(url, 1 + sum(1 for _ in samples), 0, self.count_sources.get(url, "given"))

    def _choose_part_size(self, part_size: int | str | None) -> int | None:
        if part_size == "auto":
            # parts only where a reader can start anywhere in a shard, else it would read what it skips;
            # whole shards where remote ones are cached: a shard read whole is what becomes an entry
            seekable = self.lengths is not None and all(self._seekable(u) for u in self.urls)
            return DEFAULT_PART_SIZE if seekable and self.network.cache_dir is None else None
        return (int(part_size) or None) if part_size is not None else None

    def _choose_interleave(self, interleave: int | str | None) -> int | None:
        """K parts read at once (None: one after another): only where parts are read, and by default
        only where every shard can be read from any sample on (else each stream reads its start)."""
        if self.part_size is None or interleave is None:
            return None
        if interleave == "auto":
            seekable = self.lengths is not None and all(self._seekable(u) for u in self.urls)
            return DEFAULT_INTERLEAVE if seekable else None
        return int(interleave) if int(interleave) > 1 else None

    def _say(self, message: str, kind: str, counted_in: str = "") -> None:
        """A warning that can come every epoch (a skipped sample, a skipped shard): said the first
        time, by whichever process of this dataset meets it, then only counted (``counted_in``)."""
        if self._tally.first(kind):
            warn(message + (f" (later ones are not said, only counted: {counted_in})" if counted_in else " (said once)"),
                 DataWarning)

    def _warn_skipped(self, message: str) -> None:
        self._say(message, "skipped sample", "ds.decode_stats.skipped")

    @property
    def decode_stats(self) -> DecodeStats:
        """Samples that came out with a decoded image (``decoded``) and samples left out with
        ``on_error="skip"`` (``skipped``: a bad image, field or ``map``), over every process of this
        dataset (its DataLoader workers too) since it was made; with ``decode``, the two add up to
        the samples read."""
        return DecodeStats(self._tally["decoded"], self._tally["skipped"], self._backend)

    @property
    def skipped_shards(self) -> int:
        """Reads given up with ``on_error="skip-shard"`` (every process of this dataset)."""
        return self._tally["skipped_shards"]

    @property
    def lost(self) -> int:
        """Samples of the plan that skipped shards left out (every process of this dataset)."""
        return self._tally["lost"]

    # -- who am I ---------------------------------------------------------------------------------

    @property
    def decodes_in_main(self) -> bool:
        """True when images are decoded in the main process (always for ``device="gpu"``: CUDA can't
        run in forked workers; ``decode_in="main"`` for dali-cpu): the workers then read, shuffle
        and batch the encoded bytes, and the Loader decodes each batch with DALI."""
        return self.spec is not None and self.decode_in == "main"

    def rank_world(self) -> tuple[int, int]:
        """``(rank, world_size)``: as given, else ``RANK``/``WORLD_SIZE`` (torchrun), else
        torch.distributed when it is initialized, else ``(0, 1)``."""
        if self.rank is not None and self.world_size is not None:
            return self.rank, self.world_size
        env_rank, env_world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
        if env_rank is not None and env_world is not None:
            try:
                rank, world = int(env_rank), int(env_world)
            except ValueError:
                raise OptionError(f"bad RANK={env_rank!r} / WORLD_SIZE={env_world!r} in the environment") from None
            if not 0 <= rank < world:
                raise OptionError(f"bad RANK={rank} for WORLD_SIZE={world}")
            return rank, world
        dist = sys.modules.get("torch.distributed")
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
        return 0, 1

    def worker_info(self) -> tuple[int, int, bool]:
        """``(worker, workers, in_worker)``: overridden by the torch layer for DataLoader workers."""
        return 0, 1, False

    def to_tensors(self, batch: Any) -> Any:
        """Numpy arrays to framework tensors: overridden by the torch layer. Here: numpy."""
        return as_numpy(batch)

    @property
    def agrees_on_the_end(self) -> bool:
        """True when ranks must agree on the end of each epoch collectively: several ranks and no
        sample counts (a reader of a repeat stream may find its share empty, and stop)."""
        return self.lengths is None and self.rank_world()[1] > 1

    # -- epochs and resume -------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Run ``epoch`` next (as ``DistributedSampler.set_epoch``): its shard order, shuffle and
        augmentations. Without it, each pass over the dataset is the next epoch."""
        if epoch < 0:
            raise OptionError(f"bad epoch {epoch}; must be >= 0")
        self._clock.set(epoch)

    @property
    def epoch(self) -> int:
        return self._clock.epoch

    @property
    def dropped(self) -> int:
        """Samples each epoch leaves out (only ``drop_last=True``: what is left after the full batches)."""
        if self.lengths is None or not self.drop_last:
            return 0
        total = sum(self.lengths.values())
        _, world = self.rank_world()
        return rank_plan(total, 0, world, self.batch_size, drop_last=True).dropped

    def __len__(self) -> int:
        """Batches per rank in an epoch (the next one, after a resume: what is left of it); known
        with sample counts, or ``batches_per_epoch`` for a repeat stream."""
        if self.repeat:
            if self.batches_per_epoch is None:
                raise TypeError("a repeat=True stream has no length: give batches_per_epoch")
            return self.batches_per_epoch
        if self.lengths is None:
            raise TypeError(f"no length: {_few(self.uncounted)} have no sample count ({COUNT_HINT})")
        rank, world = self.rank_world()
        epoch = self.epoch
        work = self._work(epoch, self._resume_for(epoch, None))
        return int(split_work(work, rank, world, 0, 1, self.batch_size, self.drop_last, self.pad).steps or 0)

    def _resume_for(self, epoch: int, consumers: int | None) -> _Resume | None:
        """What a loaded state says for ``epoch`` read by ``consumers`` readers (None: any)."""
        resume = self._resume
        if resume is None or resume.epoch != epoch:
            return None
        if resume.consumers is not None and resume.consumers != consumers:
            if resume.replan is not None:
                return resume.replan
            if consumers is not None:
                raise OptionError(
                    f"the saved state is for {resume.consumers} readers (ranks x workers), this run has {consumers}: "
                    "without sample counts (or for a repeat=True stream) resume with the same world size and "
                    "num_workers"
                )
        return resume

    def _work(self, epoch: int, resume: _Resume | None) -> list[Part]:
        """The work of ``epoch`` (with counts): the plan a loaded state gives, or every shard."""
        assert self.lengths is not None
        if resume is not None and resume.work is not None:
            return resume.work
        key = (epoch, self.seed, self.shuffle_shards, self.part_size, self._interleaved)
        if self._planned is None or self._planned[0] != key:
            # kept: len(), load_offsets() and each reader ask for it, and forked workers inherit it
            self._planned = (key, epoch_work(self.urls, self.lengths, self.seed, epoch, self.shuffle_shards,
                                             self.part_size, self._interleaved))
        return self._planned[1]

    @property
    def _interleaved(self) -> tuple[int, int] | None:
        """``(k, chunk)`` of ``split.interleave``, None: the parts one after another."""
        return None if self.interleave is None or self.interleave_chunk is None else (self.interleave,
                                                                                      self.interleave_chunk)

    def _seekable(self, url: str) -> bool:
        """Whether a reader can start in the middle of this shard: a plain local file, or a shard
        with an index file beside it."""
        if self.count_sources.get(url, "").startswith("index "):
            return True
        return local_path(url) is not None and not url.endswith(COMPRESSED_SUFFIXES)

    def assignment(
        self, epoch: int, rank: int, world_size: int, worker: int, workers: int, resume: _Resume | None = None
    ) -> Assignment:
        """What consumer ``(rank, worker)`` reads in ``epoch`` (see ``tarproc.dataset.split``)."""
        if self.lengths is not None:
            return split_work(self._work(epoch, resume), rank, world_size, worker, workers, self.batch_size,
                              self.drop_last, self.pad)
        return split_by_shard(epoch_order(self.urls, self.seed, epoch, self.shuffle_shards), rank * workers + worker,
                              world_size * workers)

    def _sample_seed(self, epoch: int, generation: int, consumer: int) -> int:
        return random.Random(f"{self.seed}/samples/{epoch}/{generation}/{consumer}").getrandbits(63)

    def state_dict(self) -> dict[str, Any]:
        """Where in-process iteration (no DataLoader workers) stands; ``Loader.state_dict`` for workers."""
        if self._clock.in_plain_workers:
            raise OptionError(
                "the position is in the DataLoader's workers, which a plain DataLoader doesn't report: iterate "
                "ds.loader(num_workers=N) instead and take loader.state_dict()"
            )
        return self._state(self._epoch_seen, 1, self._steps, self._taken)

    # -- one reader's batches, for a caller that runs the readers itself (Mix's shared workers) -----

    def steps_left(self, epoch: int, workers: int) -> int:
        """The batches this rank has left in ``epoch`` read by ``workers`` readers (with counts): all
        of them, or what a state loaded for that epoch leaves."""
        if self.lengths is None or self.repeat:
            raise OptionError("steps_left needs sample counts and an epoch (not a repeat=True stream)")
        rank, world = self.rank_world()
        resume = self._resume_for(epoch, world * workers)
        work = self._work(epoch, resume)
        planned = split_work(work, rank, world, 0, 1, self.batch_size, self.drop_last, self.pad).steps or 0
        return planned - (resume.steps if resume is not None else 0)

    def reader_batches(self, epoch: int, worker: int, workers: int) -> Iterator[Any]:
        """The batches reader ``worker`` of this rank's ``workers`` makes in ``epoch`` (with counts),
        from where a state loaded for that epoch left it: batch ``k`` of what the rank has left is
        made by reader ``k % workers``, as a ``Loader``'s workers make them. What a ``Mix`` draws
        from inside its own workers (errors as ``DatasetError`` there, as ``__iter__`` gives them)."""
        rank, world = self.rank_world()
        resume = self._resume_for(epoch, world * workers)
        role = (worker + resume.shift) % workers if resume is not None else worker
        skip = resume.skip.get(rank * workers + role, Taken()) if resume is not None else Taken()
        _, _, in_worker = self.worker_info()
        if in_worker and not _FROZEN:
            gc.freeze()  # as __iter__ does: the objects a forked worker inherits are not walked again and again
            _FROZEN.append(True)
        try:
            for _, batch in self._batches(epoch, rank, world, role, workers, resume, skip):
                yield batch
        except TarprocError as e:
            if not in_worker:
                raise
            from ..errors import DatasetError

            raise DatasetError(str(e), worker=worker, cause=type(e).__name__) from e

    def position(self, epoch: int, workers: int, steps: int) -> dict[str, Any]:
        """The state (as ``state_dict``'s, with counts) once this rank took ``steps`` batches of
        ``epoch`` read by ``workers`` readers per rank, since a state loaded for that epoch if any."""
        return self._state(epoch, workers, steps, {})

    def _state(self, epoch: int | None, workers: int, steps: int, taken: Mapping[int, Taken]) -> dict[str, Any]:
        """The state of an epoch (``epoch`` None: nothing taken yet) whose ranks took ``steps``
        batches each, read by ``workers`` per rank; ``taken``: where each consumer stands."""
        rank, world = self.rank_world()
        at = self.epoch if epoch is None else epoch
        resume = self._resume_for(at, world * workers)
        if resume is not None and resume.state and not steps:
            return dict(resume.state)  # nothing taken since it was loaded: the position it gave
        state: dict[str, Any] = {
            "version": STATE_VERSION, "seed": self.seed, "fingerprint": self._fingerprint(),
            "epoch": self.epoch if epoch is None else epoch, "world_size": world, "workers": workers,
        }
        if epoch is None:
            return {**state, "mode": "start"}
        if self.lengths is not None and not self.repeat:
            work = resume.work if resume is not None else None
            return {
                **state, "mode": "steps", "steps": steps + (resume.steps if resume is not None else 0),
                "generation": resume.generation if resume is not None else 0,
                "plan": {"batch_size": self.batch_size, "drop_last": self.drop_last, "pad": self.pad,
                         "shuffle": self.shuffle, "shuffle_shards": self.shuffle_shards, "part_size": self.part_size,
                         "interleave": None if self._interleaved is None else list(self._interleaved)},
                "work": None if work is None else encode_work(work, self.urls),
            }
        return {**state, "mode": "readers", "rank": rank, "counted": self.lengths is not None, "repeat": self.repeat,
                "taken": {str(c): list(t) for c, t in taken.items()}}

    def _fingerprint(self) -> str:
        import hashlib

        text = json.dumps([self.urls, self.lengths and [self.lengths[u] for u in self.urls]])
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def load_state_dict(self, state: Mapping[str, Any], workers: int | None = None) -> None:
        """Continue where ``state`` (from ``state_dict``) stood. With sample counts (not a repeat
        stream), any rank's state resumes every rank on any world size and number of workers; else
        each rank loads its own state and runs with the same world size and ``workers``."""
        resume = parse_state(self, state, workers)
        self._resume = resume
        self._clock.set(resume.epoch)

    # -- the pipeline ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        worker, _, in_worker = self.worker_info()
        if in_worker and not _FROZEN:
            # a forked worker inherits the parent's objects (torch, numpy, ...): keep the garbage
            # collector from walking them again and again while batches are made
            gc.freeze()
            _FROZEN.append(True)
        try:
            yield from self._iterate()
        except TarprocError as e:
            if not in_worker:
                raise
            from ..errors import DatasetError

            # one line for the main process (torch re-raises a worker's error with its traceback)
            raise DatasetError(str(e), worker=worker, cause=type(e).__name__) from e
        finally:
            if self._main_decoder is not None and not self._tagged:
                self._main_decoder.close()
                self._main_decoder = None

    def _iterate(self) -> Iterator[Any]:
        rank, world = self.rank_world()
        worker, workers, in_worker = self.worker_info()
        if in_worker and not self._tagged:
            if self.agrees_on_the_end:
                raise OptionError(
                    f"{world} ranks and no sample counts for {_few(self.uncounted)}: the ranks would take unequal "
                    f"numbers of steps and hang. Iterate ds.loader(num_workers=N), which ends the epoch on every rank "
                    f"together, or give counts ({COUNT_HINT})"
                )
            self._clock.mark_plain_workers()
        elif not in_worker:
            self._clock.mark_plain_workers(False)
        epoch = self._clock.begin(worker)
        consumers = world * workers
        resume = self._resume_for(epoch, consumers)
        # the reader this worker plays: itself, but a DataLoader takes batches from its workers round
        # robin from worker 0, so in a resumed epoch worker w plays the reader that was to deliver next
        # (the readers' batch counts differ by one at most, so their turns go on in the same order)
        role = (worker + resume.shift) % workers if resume is not None else worker
        consumer = rank * workers + role
        if self.decodes_in_main and in_worker and not self._tagged:
            raise OptionError(
                f"device={self.device!r} with decoding in the main process (CUDA can't run in forked DataLoader "
                "workers): iterate ds.loader(num_workers=N) instead of DataLoader(ds, ...)"
            )
        skip = resume.skip.get(consumer, Taken()) if resume is not None else Taken()
        if not in_worker:
            self._epoch_seen, self._steps = epoch, 0
            self._taken = {consumer: skip}
        batches = self._batches(epoch, rank, world, role, workers, resume, skip)
        if self.batches_per_epoch is not None:
            readers = self._readers_with_batches(rank, world, workers)
            base, extra = divmod(self.batches_per_epoch, readers)
            quota = base + (1 if role < extra else 0) if role < readers else 0
            batches = itertools.islice(batches, max(0, quota - skip.made))
        for made, (position, batch) in enumerate(batches, skip.made + 1):
            position = position._replace(consumer=consumer, consumers=consumers, made=made, reader=worker)
            if self._tagged:  # the Loader keeps the position (and decodes, when decoding in main)
                yield position, batch
                continue
            if not in_worker:
                self._taken[consumer] = position.taken_state()
                self._steps += 1
                if self.decodes_in_main:
                    batch = self.finish(batch)
            yield batch

    def _readers_with_batches(self, rank: int, world: int, workers: int) -> int:
        """The readers of a rank that make batches in a pass of a repeat stream: with counts, those
        the plan gives batches (fewer than ``workers`` when a pass has fewer batches per rank); the
        nominal epoch's batches are shared among them only."""
        if self.lengths is None:
            return workers
        batches = self.assignment(0, rank, world, 0, 1).steps or 0  # the same in every pass
        return max(1, min(workers, batches))

    def _batches(
        self, epoch: int, rank: int, world: int, role: int, workers: int, resume: _Resume | None, skip: Taken,
    ) -> Iterator[tuple[Position, Any]]:
        """``(position, batch)`` for one reader: one epoch, or passes without end."""
        consumer = rank * workers + role
        generation = resume.generation if resume is not None else 0
        if not self.repeat:
            assignment = self.assignment(epoch, rank, world, role, workers, resume)
            yield from self._epoch_batches(assignment, epoch, epoch, generation, consumer, skip.samples, skip.batches, 0)
            return
        for p in itertools.count(skip.pass_):
            run_epoch = epoch * _PASS_STRIDE + p
            assignment = self.assignment(run_epoch, rank, world, role, workers)
            first = p == skip.pass_
            skip_samples, skip_batches = (skip.samples, skip.batches) if first else (0, 0)
            if assignment.batches is not None:
                if not assignment.batches:
                    return  # with counts, a reader the plan gives no batch: an empty stream, not a spin
                skip_samples = sum(assignment.batches[:skip_batches])  # by batches: the same on every rank
            made = False
            for item in self._epoch_batches(assignment, epoch, run_epoch, 0, consumer, skip_samples, skip_batches, p):
                made = True
                yield item
            if not made and not skip_samples:
                return  # a pass without a single sample for this reader: an empty stream, not a spin

    def _epoch_batches(
        self, assignment: Assignment, epoch: int, run_epoch: int, generation: int, consumer: int, skip: int,
        skip_batches: int, pass_: int,
    ) -> Iterator[tuple[Position, Any]]:
        seed = self._sample_seed(run_epoch, generation, consumer)
        samples: Iterable[Sample]
        if assignment.batches is not None:  # counts: start where the skip ends, reading only what is needed
            real = assignment.samples
            samples = self._from(assignment.parts, real, min(skip, real), seed)
            if self.pad:
                padding = itertools.islice(self._read(assignment.pad_parts), max(0, skip - real), assignment.pad)
                samples = itertools.chain(_valid(samples, True), _valid(padding, False))
        else:  # no counts: replay the reader's sequence, skipping what it had handed out
            samples = self._read(assignment.parts)
            if self.shuffle:
                samples = shuffle(samples, self.shuffle, seed=seed)
            samples = itertools.islice(samples, skip, None)
        taken, made = skip, skip_batches
        sizes: Iterable[int] = itertools.repeat(self.batch_size)
        refill = None
        if assignment.batches is not None:
            sizes = assignment.batches[skip_batches:]
            if self._skips_shards:  # what a skipped shard lost is filled in: the ranks stay in step
                refill = _Refill(self.batch_size, self._say)
                samples = refill.watch(samples)
        decoder = None
        if self.spec is not None and not self.decodes_in_main:
            decoder = make_decoder(self.spec, self.device, self.batch_size + 1, self.threads)
        try:
            for chunk in _chunks(samples, sizes, refill):
                taken += len(chunk)
                made += 1
                if self.drop_last and assignment.batches is None and len(chunk) < self.batch_size:
                    break
                rows = self._rows(chunk, decoder, run_epoch)
                position = Position(epoch, consumer, 0, taken, self._reading, made, pass_)
                if not rows:
                    if assignment.batches is not None and self.rank_world()[1] > 1:
                        from ..errors import DatasetError

                        raise DatasetError(
                            f"every sample of a batch of {len(chunk)} was dropped (by map, or skipped with "
                            "on_error='skip'), and an empty step would leave the ranks with unequal numbers of "
                            "steps: drop fewer samples, or filter the shards before training", self._reading)
                    continue
                if self.decodes_in_main:
                    yield position, _bundle_encoded(rows, self.collate)  # decoded (and made tensors) by finish()
                else:
                    yield position, self.to_tensors(self.collate(rows))
        finally:
            if decoder is not None:
                decoder.close()

    def _from(self, parts: list[Part], n: int, skip: int, seed: int) -> Iterator[Sample]:
        """The ``n`` samples of ``parts`` through the shuffle buffer, less its first ``skip`` outputs,
        without reading what those needed: the buffer's choices depend on positions only, so a run
        over positions says which samples it held then (read just those) and where the input stood
        (read on from there; with an index at hand both start at their first sample)."""
        if not self.shuffle:
            return self._read(take(parts, skip, n))
        buffer = ShuffleBuffer(self.shuffle, seed)
        if not skip:
            return buffer.run(self._read(parts))
        for _ in itertools.islice(buffer.run(range(n)), skip):
            pass
        held = sorted(buffer.buffer if buffer.tail is None else buffer.tail)
        fetched = dict(zip(held, self._read(at_positions(parts, held)), strict=True))
        tail = None if buffer.tail is None else [fetched[p] for p in buffer.tail]
        resumed = ShuffleBuffer.resume(self.shuffle, buffer.state(), [fetched[p] for p in buffer.buffer], tail)
        return resumed.run(self._read(take(parts, buffer.pulled, n)))

    def _read(self, parts: list[Part]) -> Iterator[Sample]:
        if self._identities:  # no request for those; copies checked against a manifest's sha256
            shard_cache(self.network).learn(self._identities, self._digests)  # type: ignore[union-attr]
        network = self.network
        for url in {p.url for p in parts if is_fsspec_url(p.url)}:
            # a reader's opens are all during a run: a refusal is a store restarting, retried (a wrong
            # address failed when the Dataset was made, asking the versions or the counts)
            mark_reached(url)
        def open_raw(url: str, offset: int, budget: Budget, end: int | None) -> Any:
            return open_remote(url, offset, network, budget, end)

        # what a resume left of a part: each stretch read from its first sample, not across the gaps
        pieces = [piece for part in parts
                  for piece in (runs(part, _GAP) if part.parts == 1 and len(part.ranges) > 1
                                and self._offsets_of(part.url).offsets else [part])]
        # interleaved parts: a piece that goes on where an earlier one of its shard stopped is read by
        # the same open stream, so each sample is read once, in shard order, whatever the interleave
        reads, read_of = read_streams(pieces)
        last = {r: i for i, r in enumerate(read_of)}  # the piece that finishes each read
        streams: dict[int, Iterator[Sample]] = {}
        with Prefetcher(open_raw, network.prefetch) as ahead:
            try:
                for i, (piece, r) in enumerate(zip(pieces, read_of, strict=True)):
                    stream = streams.get(r)
                    if stream is None:
                        following = reads[r + 1 : r + 1 + DEPTH] if network.prefetch else []
                        stream = streams[r] = self._read_part(reads[r], ahead, following)
                    self._reading = piece.url
                    if last[r] == i:  # to the read's end: the reader checks the shard's count there
                        yield from stream
                        del streams[r]
                    else:
                        yield from itertools.islice(stream, piece.size)
            finally:
                for stream in streams.values():
                    stream.close()  # type: ignore[attr-defined]  # generators: their sources are closed
        finish_fills(network)  # what this reader started filling is published before its process may end

    def _read_part(self, part: Part, ahead: Prefetcher, following: Sequence[Part] = ()) -> Iterator[Sample]:
        """The samples of a part; with on_error="skip-shard", those before a read that failed (said,
        counted in ``skipped_shards`` and ``lost``). ``following``: the next parts, opened ahead."""
        yielded = 0
        try:
            for sample in self._part_samples(part, ahead, following):
                yielded += 1
                yield sample
        except (SourceError, TarFormatError, CompressionError) as e:
            if not self._skips_shards:
                raise
            try:
                lost: int | None = part.size - yielded
            except ValueError:  # a part to the shard's end, of a shard without a count
                lost = None
            self._tally.add(skipped_shards=1, lost=lost or 0)
            self._say(f"{e}; skipping the rest of this shard (on_error='skip-shard'): "
                  + (f"{lost} samples of this epoch lost" if lost is not None else "its samples not read are lost"),
                  "skipped shard", "ds.skipped_shards, ds.lost")

    def _part_samples(self, part: Part, ahead: Prefetcher, following: Sequence[Part]) -> Iterator[Sample]:
        self._reading = part.url
        offset = self._offset(part.url, part.first) if part.first else None
        end = self._end_byte(part)
        refs = self._leaves_images and held_files() < HELD_FILES
        samples: Iterator[Sample]
        if offset is not None or end is not None:  # an index is at hand: from the part's first sample to its last
            samples = read_samples_from(part.url, offset or 0, policy=self._reading_policy,
                                        network=self.network, prefetcher=ahead, end=end, refs=refs)
        else:
            samples = read_samples(part.url, policy=self._reading_policy,
                                   network=self.network, prefetcher=ahead, refs=refs)
        start = part.first if offset is not None else 0
        for next_part in following:
            if is_fsspec_url(next_part.url):  # opened while this part is read
                ahead.schedule(next_part.url, self._start_byte(next_part), self._end_byte(next_part))
        index = start - 1
        try:
            for index, sample in enumerate(samples, start):
                if index == start and offset is not None:
                    self._check_seek(part.url, index, sample)
                if part.stop is not None and index >= part.stop:
                    if part.holds is not None and part.stop == part.holds:  # the shard's end: check its count
                        self._count_error(part, index + 1 + sum(1 for _ in samples))
                    break
                if part.wants(index):
                    if refs:
                        _read_ranges(sample, self.image_fields)
                    yield sample
            else:
                if part.holds is not None and index + 1 != part.holds:
                    self._count_error(part, index + 1)
        finally:
            samples.close()  # type: ignore[attr-defined]  # a generator: stop reading, close the source

    def _offset(self, url: str, index: int) -> int | None:
        """The byte where the shard's ``index``-th sample begins, where an index is at hand: a
        plain local shard (its ``.idx``, else indexed now: a walk over its headers) or a remote one
        with a ``.idx`` beside it. None where there is none (the part is then read from the start)."""
        offsets = self._offsets_of(url).offsets
        if not 0 < index < len(offsets):
            return None
        self.seeks += 1
        return offsets[index]

    def _offsets_of(self, url: str) -> _Offsets:
        found = self._offsets.get(url)
        if found is None:  # 16 bytes a sample, kept for the reader's life: a shard is indexed once
            found = self._offsets[url] = _sample_offsets(url, self.count_sources.get(url, ""), self.network)
        return found

    def load_offsets(self, workers: int) -> None:
        """Read now, in this process, the indexes of the remote shards this rank's ``workers``
        readers start or stop in the middle of in the next epoch, so that DataLoader workers forked
        after it inherit them: else each worker of each epoch asks the store for them again."""
        if self.lengths is None or self.repeat:
            return
        rank, world = self.rank_world()
        epoch = self.epoch
        try:
            resume = self._resume_for(epoch, world * workers)
            assignments = [self.assignment(epoch, rank, world, worker, workers, resume) for worker in range(workers)]
        except TarprocError:
            return  # a state that doesn't fit: the workers say so
        wanted = {part.url for assignment in assignments for part in assignment.parts
                  if is_fsspec_url(part.url) and self.count_sources.get(part.url, "").startswith("index ")
                  and part.url not in self._offsets and (part.first or (part.stop is not None and part.stop != part.holds))}
        if wanted:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(min(16, len(wanted))) as pool:  # many shards: not one request after another
                list(pool.map(self._offsets_of, sorted(wanted)))

    def _start_byte(self, part: Part) -> int:
        """Where reading ``part`` begins: its first sample's byte where an index gives it, else 0."""
        if not part.first:
            return 0
        offsets = self._offsets_of(part.url).offsets
        return offsets[part.first] if part.first < len(offsets) else 0

    def _end_byte(self, part: Part) -> int | None:
        """Where reading a part of a shard may stop, where an index gives it: the end of the sample
        after its last (the reader reads one past the part to see it end); None: the shard's end.
        A remote store is asked for no more, and a local file is read no further (a part's reader
        reads on if it needs to): an interleaved reader holds many parts open, each read only as far
        as its samples go. A local shard's headers are not walked for this alone: its bound comes from
        a ``.idx`` beside it or from offsets this reader has already (a part starting mid-shard)."""
        if part.stop is None or (part.holds is not None and part.stop >= part.holds):
            return None
        path = local_path(part.url)
        if path is not None and part.url not in self._offsets and not os.path.exists(default_index_url(path)):
            return None
        offsets = self._offsets_of(part.url).offsets
        return offsets[part.stop + 2] if part.stop + 2 < len(offsets) else None

    def _check_seek(self, url: str, index: int, sample: Sample) -> None:
        """The sample found where the index put sample ``index`` must be that sample (a shard
        rewritten after its index was made could hold another there)."""
        if hash(sample["__key__"]) != self._offsets_of(url).keys[index]:
            raise IndexFileError(
                f"the index doesn't match the shard: sample {index} is not {sample['__key__']!r}'s place; the shard "
                f"changed after it was indexed: rebuild the index (tarindex {url})", url,
            )

    def _count_error(self, part: Part, holds: int) -> None:
        assert part.holds is not None
        raise ShardCountError(part.url, holds, part.holds, self.count_sources.get(part.url, "given"))

    def _mapped(self, sample: Sample, stats: DecodeStats) -> Sample | None:
        """``map`` of a sample; one that raises fails naming the shard and key, or with
        ``on_error="skip"`` is dropped (counted in ``decode_stats.skipped``) as a bad image is."""
        assert self.map is not None
        try:
            return self.map(sample)
        except Exception as e:
            key, url = sample.get("__key__"), sample.get("__url__")
            reject(SampleError(f"map failed on sample {key!r}: {type(e).__name__}: {e}", url, key),
                   self._on_bad_sample, stats, self._warn_skipped)
            return None

    @property
    def _decodes_into_batch(self) -> bool:
        """Whether the readers decode images on the CPU straight into the batch (``_decode_into_batch``)."""
        return (self.spec is not None and self.spec.size is not None and self.device == "cpu"
                and not self.decodes_in_main)

    @property
    def _leaves_images(self) -> bool:
        """Whether images in local shards are left there until their batch is made (``FileRange``
        in the shuffle buffer, not bytes): where they are decoded into the batch and no ``map``
        needs to see them."""
        return self._decodes_into_batch and self.map is None

    def _rows(self, chunk: list[Sample], decoder: Any, epoch: int) -> list[Any]:
        """Map, decode, handle and select one batch's samples; bad ones fail or are skipped (counted)."""
        stats = DecodeStats()
        if self.map is not None:
            chunk = [m for m in (self._mapped(s, stats) for s in chunk) if m is not None]
        skip_fields: frozenset[str] = frozenset()
        if decoder is not None and self._decodes_into_batch:
            chunk = self._decode_into_batch(chunk, epoch, stats)
            skip_fields = frozenset(self.image_fields)
        elif self.spec is not None and decoder is not None:
            chunk = next(iter(decoded_batches(
                chunk, self.spec, field=";".join(self.image_fields), device=decoder, batch_size=len(chunk),
                on_error=self._on_bad_sample, stats=stats, warn=self._warn_skipped, epoch=epoch,
            )), [])
            skip_fields = frozenset(self.image_fields)
        elif self.spec is not None:
            chunk = [e for e in (self._encoded(s, epoch, stats) for s in chunk) if e is not None]
            skip_fields = frozenset(self.image_fields)
        rows = []
        for sample in chunk:
            try:
                if self.media:
                    sample = decode_media(sample, self.media, epoch)
                sample = apply_handlers(sample, self.handlers, skip_fields)
                rows.append(pick(sample, self.selection) if self.selection is not None else sample)
            except DecodeError as e:
                reject(e, self._on_bad_sample, stats, self._warn_skipped)
        # decoded: samples that came out with an image decoded here (a sample whose image decoded but
        # whose other field failed is skipped, not both); images left encoded are counted by finish()
        media_only = bool(self.media) and self.spec is None  # else the images count
        self._tally.add(decoded=len(rows) if decoder is not None or media_only else 0, skipped=stats.skipped)
        if decoder is not None:
            self._backend = decoder.name
        return rows

    def _decode_into_batch(self, chunk: list[Sample], epoch: int, stats: DecodeStats) -> list[Sample]:
        """The cpu decode when every image has the same shape: each one is decoded straight into
        its slot of one batch array (shared memory under torch), so the batch is never copied."""
        from ..decode.cpu import ImageError, decode_into

        spec = self.spec
        assert spec is not None and spec.size is not None
        shape = (3, spec.size, spec.size) if spec.layout == "CHW" else (spec.size, spec.size, 3)
        buffer = self.batch_buffer((len(chunk), *shape), spec.output_dtype)
        out: list[Sample] = []
        for sample in chunk:
            name = next((n for n in self.image_fields if n in sample), None)
            try:
                if name is None:
                    raise ImageError(f"no image field ({';'.join(self.image_fields)})")
                data = sample[name]
                data = _read_range(data) if type(data) is FileRange else bytes(data)
                decode_into(data, spec, plan_key(str(sample["__key__"]), epoch), buffer.array[len(out)])
            except ImageError as e:
                reject(DecodeError(str(e), sample.get("__url__"), sample.get("__key__"), name), self._on_bad_sample,
                       stats, self._warn_skipped)
                continue
            except SourceError as e:  # its shard changed since the image was put in the shuffle buffer
                if self._on_bad_sample == "fail":
                    raise
                reject(SampleError(f"{e.message} (field {name!r} of sample {sample.get('__key__')!r})", e.url,
                                   sample.get("__key__")), self._on_bad_sample, stats, self._warn_skipped)
                continue
            sample[name] = Slot(buffer, len(out))
            out.append(sample)
        return out

    def batch_buffer(self, shape: tuple[int, ...], dtype: str) -> BatchBuffer:
        """An array for one batch of images (memory used again once the loop has let go of an
        earlier batch: ``arrays.py``); overridden by the torch layer (shared memory, in workers)."""
        from .arrays import ARRAYS

        array = ARRAYS.take(shape, dtype)
        return BatchBuffer(array, array)

    def _encoded(self, sample: Sample, epoch: int, stats: DecodeStats) -> Sample | None:
        """For decoding in the main process: the image field's bytes, as ``(bytes, plan key)``."""
        for name in self.image_fields:
            if name in sample:
                sample[name] = _Encoded(bytes(sample[name]), plan_key(str(sample["__key__"]), epoch), name)
                return sample
        error = DecodeError(f"no image field ({';'.join(self.image_fields)})", sample.get("__url__"), sample.get("__key__"))
        reject(error, self._on_bad_sample, stats, self._warn_skipped)
        return None

    # -- main-process decoding (device="gpu") ------------------------------------------------------

    def finish(self, batch: Any) -> Any:
        """Decode a batch whose images are still encoded (``EncodedImages``), here, in this process."""
        if self._main_decoder is None:
            from ..decode.dali import DaliDecoder

            assert self.spec is not None
            self._main_decoder = DaliDecoder(self.spec, self.batch_size, threads=self.threads, gpu=self.device == "gpu")
        stats = DecodeStats()
        try:
            return finish_encoded(batch, self._main_decoder, self._on_bad_sample, stats, self.to_tensors,
                                  self._warn_skipped)
        finally:
            self._tally.add(decoded=stats.decoded, skipped=stats.skipped)
            self._backend = self._main_decoder.name


def _read_ranges(sample: Sample, image_fields: Sequence[str]) -> None:
    """Read the data a sample left in its shard (``FileRange``) as it is read, all but the image its
    batch decodes (``_read_range``, then): only that waits in the shuffle buffer as a range."""
    image = next((name for name in image_fields if name in sample), None)
    for name, value in list(sample.items()):
        if type(value) is FileRange and name != image:
            sample[name] = value.read()


def _read_range(data: FileRange) -> memoryview:
    """An image left in its shard, read into this thread's buffer (valid until the next read; it
    grows by doubling, to 16 MiB: a bigger image gets a buffer of its own)."""
    if data.size > _READ_BUFFER_MAX:
        return data.read_into(bytearray(data.size))
    buffer = getattr(_READ_BUFFER, "data", None)
    if buffer is None or len(buffer) < data.size:
        size = max(data.size, 2 * len(buffer) if buffer is not None else 1 << 18)
        buffer = _READ_BUFFER.data = bytearray(min(size, _READ_BUFFER_MAX))
    return data.read_into(buffer)


class _Encoded(NamedTuple):
    data: bytes
    plan_key: str
    field: str


def _bundle_encoded(rows: list[Any], collate: Collate = collate) -> Any:
    """Collate rows whose image is ``_Encoded`` into one batch with an ``EncodedImages`` column."""
    def images(values: list[_Encoded], keys: list[str], urls: list[str | None]) -> EncodedImages:
        return EncodedImages([v.data for v in values], [v.plan_key for v in values], keys, urls, [v.field for v in values])

    first = rows[0]
    if isinstance(first, tuple):
        # tuples hold no key: take it from the plan key (key + epoch suffix)
        cols = []
        for i, value in enumerate(first):
            column = [r[i] for r in rows]
            if isinstance(value, _Encoded):
                keys = [v.plan_key.split("\x00", 1)[0] for v in column]
                cols.append(images(column, keys, [None] * len(column)))
            else:
                cols.append(collate([(v,) for v in column])[0])
        return tuple(cols)
    out = collate([{k: v for k, v in r.items() if not isinstance(v, _Encoded)} for r in rows])
    for name, value in first.items():
        if isinstance(value, _Encoded):
            out[name] = images([r[name] for r in rows], [r["__key__"] for r in rows], [r.get("__url__") for r in rows])
    return out


def finish_encoded(batch: Any, decoder: Any, on_error: str, stats: DecodeStats, to_tensors: Callable[[Any], Any],
                   warn: Callable[[str], None]) -> Any:
    """Decode the ``EncodedImages`` of a batch with ``decoder`` (a ``DaliDecoder``); rows whose
    image fails are an error or, with ``on_error="skip"``, removed from every column."""
    import numpy as np

    def decode(images: EncodedImages) -> tuple[Any, list[int]]:
        results = decoder.decode_batch(list(zip(images.datas, images.plan_keys, strict=True)))
        keep = []
        for i, result in enumerate(results):
            if isinstance(result, Exception):
                reject(DecodeError(str(result), images.urls[i], images.keys[i], images.fields[i]), on_error, stats, warn)
            else:
                keep.append(i)
        arrays = [results[i] for i in keep]
        stats.decoded += len(arrays)
        same = arrays and all(a.shape == arrays[0].shape for a in arrays)
        return (np.stack(arrays) if same else arrays), keep

    def select(column: Any, keep: list[int], n: int) -> Any:
        if len(keep) == n:
            return column
        if isinstance(column, np.ndarray) or hasattr(column, "index_select"):
            return column[keep]
        return [column[i] for i in keep]

    sequence = isinstance(batch, (tuple, list))  # a DataLoader turns tuples into lists
    columns = dict(enumerate(batch)) if sequence else dict(batch)
    keep, n, image = None, 0, None
    for name, value in columns.items():
        if isinstance(value, EncodedImages):
            n, image = len(value.datas), name
            columns[name], keep = decode(value)
    if keep is not None and len(keep) != n:
        columns = {k: (v if k == image else select(v, keep, n)) for k, v in columns.items()}
    return to_tensors(tuple(columns.values()) if sequence else columns)


def reject(error: SampleError, on_error: str, stats: DecodeStats, warn: Callable[[str], None]) -> None:
    """A sample that can't be used: raise ``error`` (``on_error="fail"``), or count and report it."""
    if on_error == "fail":
        raise error
    stats.skipped += 1
    warn(f"skipped: {error}")


def _identities(urls: list[str], network: Network) -> dict[str, Identity]:
    """The versions (size, ETag) of remote shards, asked once here (a HEAD each, 16 at a time), so
    that the readers find their cached copies without a request."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(16) as pool:
        found = pool.map(lambda u: identify(u, network.timeout, network), urls)
        return {url: identity for url, identity in zip(urls, found, strict=True) if identity is not None}


class _Offsets(NamedTuple):
    """Where each sample of a shard begins, and a hash of its key (to check a seek), from an index."""

    offsets: Sequence[int]
    keys: Sequence[int]


def _sample_offsets(url: str, count_source: str, network: Network) -> _Offsets:
    """The samples' offsets of a shard, from an index (a remote one read as ``network`` says: from
    the shard cache, when there is one); empty when there is none to be had."""
    from ..index import ForeignIndexError, build_index, load_index

    path = local_path(url)
    index = None
    try:
        if path is not None:
            sidecar = default_index_url(path)
            if os.path.exists(sidecar):
                try:
                    index = load_index(sidecar)
                except ForeignIndexError:  # another tool's file (energon's): index the shard here instead
                    index = None
                if index is not None and stale_index(url, os.stat(path), sidecar, index.size) is not None:
                    index = None  # counts.py has said so, and counted the shard
            if index is None:
                index = build_index(url)
        elif count_source.startswith("index "):
            index = load_index(default_index_url(url), network)
    except TarprocError:  # compressed, links, damage: the part is read from the start, which says what is wrong
        index = None
    if index is None:
        return _Offsets(array.array("q"), array.array("q"))
    return _Offsets(array.array("q", (e.offset for e in index.entries)),
                    array.array("q", (hash(e.key) for e in index.entries)))


def _chunks(samples: Iterable[Sample], sizes: Iterable[int], refill: _Refill | None = None) -> Iterator[list[Sample]]:
    """Batches of the given sizes (the last one shorter when the samples run out, unless ``refill``
    fills it). After the last one, the samples are read to their end, where the reader checks the
    shards' counts."""
    it = iter(samples)
    for size in sizes:
        chunk = list(itertools.islice(it, size))
        if len(chunk) < size and refill is not None:
            chunk += refill.copies(size - len(chunk))
        if not chunk:
            return
        yield chunk
    for _ in it:  # nothing is left to read by the plan: this only makes the reader look at the end
        break


class _Refill:
    """With counts and ``on_error="skip-shard"``: the samples a skipped shard lost leave a reader's
    last batches short, which would leave its rank fewer steps than the others (a hang in DDP).
    They are filled with copies of samples the reader read before, marked ``__valid__ = False``
    (as ``pad=True``'s padding), said once; the real samples are marked True."""

    def __init__(self, batch_size: int, say: Callable[[str, str, str], None]) -> None:
        self.say = say
        self.recent: collections.deque[Sample] = collections.deque(maxlen=batch_size)
        self.filled = 0

    def watch(self, samples: Iterable[Sample]) -> Iterator[Sample]:
        for sample in samples:
            sample.setdefault("__valid__", True)  # pad=True's padding is marked False already
            self.recent.append(dict(sample))  # as read: map, handlers and the decoder change the batch's in place
            yield sample

    def copies(self, n: int) -> list[Sample]:
        if not self.recent:
            from ..errors import DatasetError

            raise DatasetError("every sample this reader was to read was lost to shards skipped with "
                               "on_error='skip-shard': there is nothing to fill its batches with")
        if not self.filled:
            self.say("samples were lost to skipped shards: this reader's last batches are filled with copies of samples "
                  "it read before, marked __valid__ = False (add '__valid__' to to_tuple to mask them), so that "
                  "every rank takes the same steps", "refill", "ds.lost")
        self.filled += n
        recent = list(self.recent)
        return [dict(recent[i % len(recent)], __valid__=False) for i in range(n)]


def _valid(samples: Iterable[Sample], valid: bool) -> Iterator[Sample]:
    """Samples marked ``__valid__`` (padding: copies marked False)."""
    for sample in samples:
        sample = dict(sample) if not valid else sample
        sample["__valid__"] = valid
        yield sample


def _few(urls: Sequence[str], show: int = 2) -> str:
    """``'3 shards (a.tar, b.tar, ...)'``"""
    names = ", ".join(urls[:show]) + (", ..." if len(urls) > show else "")
    return f"{len(urls)} shard{'s' if len(urls) != 1 else ''} ({names})"


def parse_state(ds: Dataset, state: Any, workers: int | None) -> _Resume:
    """Check a saved state against ``ds`` (and ``workers`` per rank, when known) field by field,
    and say where it continues. Anything unusable is an ``OptionError`` naming the field."""
    if not isinstance(state, Mapping):
        raise OptionError("not a tarproc dataset state (expected the dict state_dict() returned)")

    def field(name: str, kind: type | tuple[type, ...], low: int | None = 0, high: int = 1 << 62) -> Any:
        if name not in state:
            raise OptionError(f"dataset state: no field {name!r} (expected the dict state_dict() returned)")
        value = state[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)) or \
                (isinstance(value, int) and ((low is not None and value < low) or abs(value) > high)):
            raise OptionError(f"dataset state: bad {name!r}: {str(value)[:40]!r}")
        return value

    version = state.get("version")
    if version != STATE_VERSION:
        raise OptionError(f"dataset state version {str(version)[:20]} is not supported (this is version {STATE_VERSION})")
    seed, epoch = field("seed", int, None), field("epoch", int)
    if seed != ds.seed:
        raise OptionError(f"the state is for seed {seed}, this dataset has seed {ds.seed}: resume with the same seed")
    if field("fingerprint", str) != ds._fingerprint():
        raise OptionError("the state is for another dataset: its shard list or their sample counts differ from this one's")
    world, saved_workers = field("world_size", int, 1, MAX_READERS), field("workers", int, 1, EpochClock.SLOTS)
    if world * saved_workers > MAX_READERS:
        raise OptionError(f"dataset state: bad 'world_size' x 'workers': {world} x {saved_workers} readers, more than "
                          f"{MAX_READERS}")
    mode = field("mode", str)
    if mode == "start":
        return _Resume(epoch, state=dict(state))
    my_rank, my_world = ds.rank_world()
    if mode == "steps":
        if ds.lengths is None or ds.repeat:
            raise OptionError("the state is of an epoch planned with sample counts, this dataset is "
                              + ("a repeat=True stream" if ds.repeat else "without counts"))
        steps, generation = field("steps", int), field("generation", int)
        plan = field("plan", Mapping)
        try:
            batch_size, bufsize, part_size = plan["batch_size"], plan["shuffle"], plan["part_size"]
            interleaved = plan.get("interleave")  # states of older releases: the parts one after another
            if interleaved is not None:
                k, chunk = interleaved
                if not (type(k) is int and type(chunk) is int and 2 <= k <= MAX_READERS and chunk >= 1):
                    raise TypeError
                interleaved = (k, chunk)
            flags = [plan[k] for k in ("drop_last", "pad", "shuffle_shards")]
            if not (type(batch_size) is int and batch_size >= 1 and type(bufsize) is int and bufsize >= 0
                    and (part_size is None or (type(part_size) is int and part_size >= 1))
                    and all(type(f) is bool for f in flags)):
                raise TypeError
        except (KeyError, TypeError, ValueError):
            raise OptionError("dataset state: bad 'plan' (batch_size, shuffle, drop_last, pad, shuffle_shards, "
                              "part_size, interleave)") from None
        drop_last, pad, shuffle_shards = flags
        if drop_last and pad:
            raise OptionError("dataset state: bad 'plan': drop_last and pad both set")
        work = None if state.get("work") is None else decode_work(state["work"], ds.urls, ds.lengths,
                                                                   "dataset state: 'work'")
        plan_work = work if work is not None else epoch_work(ds.urls, ds.lengths, ds.seed, epoch, shuffle_shards,
                                                             part_size, interleaved)
        planned = split_work(plan_work, 0, world, 0, 1, batch_size, drop_last, pad).steps or 0
        if steps > planned:
            raise OptionError(f"dataset state: bad 'steps': {steps} is past the {planned} steps of epoch {epoch} "
                              "(a damaged state, or one of another dataset)")
        left = remaining(plan_work, steps, world, saved_workers, batch_size, drop_last, pad, bufsize,
                         lambda c: ds._sample_seed(epoch, generation, c))
        if not left:
            return _Resume(epoch + 1)  # that epoch was over
        total = sum(p.size for p in left)
        if total < my_world and not ds.pad:
            raise OptionError(f"the state leaves {total} samples of epoch {epoch}, fewer than this run's {my_world} "
                              f"ranks: resume on at most {total} ranks, or with pad=True")
        replan = _Resume(epoch, generation + 1, left, state=dict(state))
        if world != my_world or (batch_size, drop_last, pad, bufsize, shuffle_shards, part_size, interleaved) != (
                ds.batch_size, ds.drop_last, ds.pad, ds.shuffle, ds.shuffle_shards, ds.part_size, ds._interleaved):
            return replan
        # the same plan: on the same layout, each reader replays its sequence to where it stood
        mine = split_rank(plan_work, my_rank, world, saved_workers, batch_size, drop_last, pad)
        taken = worker_batches_taken([len(a.batches or ()) for a in mine], steps)
        replay: dict[int, Taken] = {my_rank * saved_workers + w: Taken(0, sum((a.batches or [])[:t]), t, t)
                                    for w, (a, t) in enumerate(zip(mine, taken, strict=True))}
        return _Resume(epoch, generation, work, replay, world * saved_workers, steps % saved_workers, steps,
                       dict(state), replan)
    if mode != "readers":
        raise OptionError(f"dataset state: bad 'mode': {mode[:20]!r}")
    rank, counted, repeat = field("rank", int), field("counted", bool, None), field("repeat", bool, None)
    if repeat != ds.repeat:
        raise OptionError(f"the state is of a {'repeat=True stream' if repeat else 'dataset of epochs'}, this one is "
                          f"{'repeat=True' if ds.repeat else 'not'}: resume with the same repeat setting")
    if world != my_world:
        raise OptionError(f"the state was saved with {world} ranks, this run has {my_world}: resume with the same world "
                          "size (only an epoch with sample counts resumes on another)")
    if workers is not None and saved_workers != workers:
        raise OptionError(f"the state was saved with {saved_workers} readers per rank, this loader has {workers}: resume "
                          "with the same num_workers (only an epoch with sample counts resumes with others)")
    same_everywhere = counted and ds.lengths is not None  # equal plans: every rank's readers are where rank 0's are
    if rank != my_rank and not same_everywhere:
        raise OptionError(f"the state is rank {rank}'s and this is rank {my_rank}: without sample counts each rank "
                          "resumes from its own state")
    taken = field("taken", Mapping)
    consumers = world * saved_workers
    skip: dict[int, Taken] = {}
    for key, value in taken.items():
        try:
            consumer = int(key) if isinstance(key, str) and key.isdigit() else key
            if type(consumer) is not int:
                raise ValueError
            p, n, b, m = value
            if not (0 <= consumer < consumers and all(type(x) is int and 0 <= x < 1 << 62 for x in (p, n, b, m))):
                raise ValueError
        except (TypeError, ValueError, OverflowError):
            raise OptionError(f"dataset state: bad 'taken' entry {str(key)[:20]!r}") from None
        skip[my_rank * saved_workers + consumer % saved_workers] = Taken(p, n, b, m)
    shift = sum(t.made for t in skip.values()) % saved_workers
    return _Resume(epoch, skip=skip, consumers=consumers, shift=shift, state=dict(state))
