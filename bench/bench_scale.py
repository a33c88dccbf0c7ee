"""Datasets at scale: sample counts, the collective end, mixing, counting, resume and shuffle quality.

Rows (the train section's 4 shards of ImageNet-like JPEGs, 2,000 an epoch, unless said otherwise):

1. ``tarproc.Dataset`` with the sample counts it finds itself (``lengths="auto"``, the default:
   even split, parts of 256 samples read from an index) against the same Dataset with
   ``lengths=None`` (no counts: whole shards split among the readers). The train section's row 1
   recipe, ``DataLoader(num_workers=2)``. Target ≥ 0.97×.
2. Two ranks (gloo on 127.0.0.1, ``bench/scale_job.py``), each ``ds.loader(num_workers=1)``: with
   ``lengths=None`` the ranks all-reduce "I have a batch" every step, with counts they take equal
   steps and no collective. Timed inside the job, from ``iter(loader)`` to the last batch, the
   maximum over the ranks. Target ≥ 0.97×.
3. ``tarproc.Mix`` of two Datasets (2 shards each, ``until="all"``) read by one set of 2 workers
   (``num_workers=2``: the sources mixed inside the workers) against one Dataset over the 4 shards
   on 2 workers. Target ≥ 0.97×.
4. Counting a dataset of 16 shards of 1 GB (links to ``big.tar``) with ``shard_counts``: every
   shard walked (no cache), and from a warm cache, against GNU ``tar -tf`` of each. Report.
5. Resuming a job stopped in the middle of ``big.tar``: seconds from a fresh Dataset and
   ``load_state_dict`` to the first batch, seeking with an index (the default) against reading the
   shard from its start and skipping (no index at hand). Report (lower is better).
6. Shuffle quality on a class-sorted dataset (40 classes x 250 samples in 8 shards, 5 classes
   each), 2 ranks x 2 workers, shuffle buffer 1000, batches of 64: distinct classes per batch, the
   share of a batch's most common class and the mean distance in the epoch between samples that
   were neighbours on disk, with the parts interleaved (the default, ``interleave=64``) against an
   ideal shuffle (a seeded permutation; target >= 0.8x), the parts one after another
   (``interleave=1``, the old default) and whole shards (``part_size=None``). Bytes read in an epoch
   against the dataset's bytes (target <= 1.05x), locally (the bytes of the ``.tar`` files read, one process)
   and over HTTP (``tests/faultserver.py``, an index beside each shard, read-ahead on), and the
   train row 1 recipe's img/s interleaved against ``interleave=1`` (target >= 0.95x).

Every pass is checked: the images received (rows 1-3), every key exactly once (row 2 with counts;
without counts every rank the same number of steps as well), the counts (row 4), the first batch's
keys and whether the reader sought (row 5), every label once (row 6).
"""

from __future__ import annotations

import collections
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_index import tar_lister
from bench_train import count_batches, make_shards
from common import Context, Row, alternate_many, log, spread, warm, write_tar, yes_no

SECTION = "scale"
WORKERS = 2
DATASET_SHARDS = 16  # row 4: this many links to big.tar
CLASSES, PER_CLASS, SORTED_SHARDS = 40, 250, 8  # row 6
QUALITY_EPOCHS = 3  # row 6: epochs averaged
HERE = Path(__file__).resolve().parent

# ------------------------------------------------------------------------------------------------
# the recipes (user code): each returns what the training loop iterates


def counted(url: str, lengths: Any = "auto", **kwargs: Any) -> Any:
    """The train section's row 1 recipe; ``lengths="auto"`` is the default (counts found)."""
    import torch

    import tarproc
    from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec

    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")
    ds = tarproc.Dataset(url, decode=spec, shuffle=1000, to_tuple=("jpg", "cls"), batch_size=64, lengths=lengths,
                         **kwargs)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)


def uncounted(url: str) -> Any:
    return counted(url, lengths=None)


def mixed(urls_a: list[str], urls_b: list[str]) -> Any:
    """Two Datasets, half of the shards each, mixed 50/50 until both run out, in one set of workers."""
    import tarproc
    from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec

    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")

    def dataset(urls: list[str]) -> Any:
        return tarproc.Dataset(urls, decode=spec, shuffle=1000, to_tuple=("jpg", "cls"), batch_size=64)

    return tarproc.Mix({"a": dataset(urls_a), "b": dataset(urls_b)}, [0.5, 0.5], until="all", num_workers=WORKERS)


def epoch(make: Callable[[], Any]) -> Callable[[], int]:
    return lambda: count_batches(make(), lambda b: b[0], lambda b: b[1])


# ------------------------------------------------------------------------------------------------
# helpers


def rate(n: int, times: list[float]) -> float:
    return n / statistics.median(times)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sorted_shards(ctx: Context) -> str:
    """Row 6's data: CLASSES x PER_CLASS tiny samples (``cls`` only) in class order, in
    SORTED_SHARDS shards (so each holds CLASSES / SORTED_SHARDS classes), an index beside each (for
    the reads over HTTP); made once."""
    directory = ctx.directory / SECTION
    stamp = directory / "sorted.json"
    source = {"classes": CLASSES, "per_class": PER_CLASS, "shards": SORTED_SHARDS, "index": True}
    url = str(directory / f"sorted-{{000000..{SORTED_SHARDS - 1:06d}}}.tar")
    try:
        if json.loads(stamp.read_text()) == source:
            return url
    except (OSError, ValueError):
        pass
    from tarproc.index import build_index

    directory.mkdir(parents=True, exist_ok=True)
    per_shard = CLASSES * PER_CLASS // SORTED_SHARDS
    labels = [c for c in range(CLASSES) for _ in range(PER_CLASS)]
    for s in range(SORTED_SHARDS):
        chunk = range(s * per_shard, (s + 1) * per_shard)
        path = directory / f"sorted-{s:06d}.tar"
        write_tar(path, ({"__key__": f"s{i:06d}", "cls": labels[i]} for i in chunk))
        Path(f"{path}.idx").write_bytes(build_index(str(path)).jsonl_bytes())
    stamp.write_text(json.dumps(source) + "\n")
    log(f"scale: wrote {CLASSES} classes x {PER_CLASS} samples, class-sorted, in {SORTED_SHARDS} shards")
    return url


# ------------------------------------------------------------------------------------------------
# row 2: two ranks


def two_ranks(url: str, n: int, reps: int, out_dir: Path) -> dict[str, list[float]]:
    """Run scale_job.py as ranks 0 and 1; per side, the seconds of each epoch (max over the ranks),
    every epoch checked."""
    port = free_port()
    procs, outs, logs = [], [], []
    for rank in range(2):
        out = out_dir / f"rank{rank}.json"
        out.unlink(missing_ok=True)
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        logs.append(out_dir / f"rank{rank}.log")  # the no-counts warnings, every epoch: shown on failure only
        with open(logs[-1], "wb") as err:
            procs.append(subprocess.Popen([sys.executable, str(HERE / "scale_job.py"), url, str(reps), str(out)],
                                          env=env, stderr=err, start_new_session=True))
        outs.append(out)
    try:
        for p in procs:
            rc = p.wait(timeout=120 + 60 * reps)
            if rc != 0:
                for path in logs:
                    log(f"--- {path.name} (last lines)\n" + "\n".join(path.read_text(errors="replace").splitlines()[-20:]))
                raise RuntimeError(f"scale_job.py exited with status {rc}")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    ranks = [json.loads(o.read_text()) for o in outs]
    result: dict[str, list[float]] = {}
    for side in ("none", "counts"):
        times = []
        for r in range(reps):
            epochs = [rank[side][r] for rank in ranks]
            keys = [k for e in epochs for k in e["keys"]]
            steps = [e["steps"] for e in epochs]
            if len(keys) != n or len(set(keys)) != n:
                raise RuntimeError(f"two ranks, {side}, rep {r + 1}: {len(keys)} images, {len(set(keys))} distinct keys, "
                                   f"expected {n} once each")
            if steps[0] != steps[1]:
                raise RuntimeError(f"two ranks, {side}, rep {r + 1}: unequal steps {steps}")
            times.append(max(e["seconds"] for e in epochs))
        log(f"  {side}: " + " ".join(f"{t:.3f}" for t in times) + f" s (steps per rank {steps[0]})")
        result[side] = times
    return result


# ------------------------------------------------------------------------------------------------
# row 5: resume


def stop_midway(shard: str, n: int) -> tuple[dict[str, Any], list[str], int]:
    """Take about half of the batches of a pass over ``shard`` (no shuffle, no decode), save the
    state; returns it, the keys of the batch an uninterrupted run gives next, and the batches taken."""
    import tarproc

    ds = tarproc.Dataset(shard, to_tuple=("__key__", "cls"), batch_size=64)
    loader = ds.loader(num_workers=0)
    half = -(-n // 64) // 2
    it: Any = iter(loader)
    for _ in range(half):
        next(it)
    state = loader.state_dict()
    expected = list(next(it)[0])
    it.close()
    return state, expected, half


def resume_first_batch(shard: str, state: dict[str, Any], expected: list[str], seek: bool | None,
                       world: int, seeks: list[int] | None = None) -> Callable[[], int]:
    """A fresh Dataset (as rank 0 of ``world``) resumed from ``state``, up to its first batch; checks
    that batch's keys and whether the reader sought: ``seek`` True (an index at hand), False (none:
    ``ds._offsets`` emptied, the shard read from its start and the samples taken skipped), None
    (not checked: each pass's ``ds.seeks`` is appended to ``seeks``)."""
    import tarproc

    def run() -> int:
        ds = tarproc.Dataset(shard, to_tuple=("__key__", "cls"), batch_size=64, rank=0, world_size=world)
        if seek is False:
            from tarproc.dataset.core import _Offsets

            ds._offsets[ds.urls[0]] = _Offsets([], [])  # no index at hand: read from the start, skip what was taken
        loader = ds.loader(num_workers=0)
        loader.load_state_dict(state)
        it: Any = iter(loader)
        keys = list(next(it)[0])
        it.close()
        if keys != expected:
            raise RuntimeError(f"resume (seek={seek}, world {world}): first batch {keys[:2]}..., "
                               f"expected {expected[:2]}...")
        if seek is not None and (ds.seeks >= 1) != seek:
            raise RuntimeError(f"resume (seek={seek}, world {world}): {ds.seeks} seeks")
        if seeks is not None:
            seeks.append(ds.seeks)
        return len(keys)

    return run


# ------------------------------------------------------------------------------------------------
# row 6: shuffle quality


def quality(labels_by_batch: list[list[int]], size: int) -> tuple[float, float, int]:
    """Mean distinct classes per full batch, mean share of its most common class, full batches."""
    full = [b for b in labels_by_batch if len(b) == size]
    distinct = statistics.mean(len(set(b)) for b in full)
    top = statistics.mean(max(collections.Counter(b).values()) / size for b in full)
    return distinct, top, len(full)


def tarproc_batches(url: Any, epoch: int, workers: int = WORKERS, **kwargs: Any) -> list[list[int]]:
    """The batches of 2 ranks x ``workers`` workers (simulated in this process, rank by rank), as the
    samples' numbers on disk, in epoch order: step by step, rank 0's batch before rank 1's."""
    import tarproc

    by_rank: list[list[list[int]]] = []
    for rank in range(2):
        ds = tarproc.Dataset(url, shuffle=1000, batch_size=64, to_tuple=("__key__",), rank=rank, world_size=2, **kwargs)
        ds.set_epoch(epoch)
        by_rank.append([[int(k[1:]) for k in batch[0]] for batch in (ds.loader(num_workers=workers) if workers else ds)])
    batches = [b for step in zip(*by_rank, strict=True) for b in step]
    if sorted(x for b in batches for x in b) != list(range(CLASSES * PER_CLASS)):
        raise RuntimeError(f"shuffle quality ({kwargs}, epoch {epoch}): not every sample once")
    return batches


def ideal_batches(epoch: int) -> list[list[int]]:
    order = list(range(CLASSES * PER_CLASS))
    random.Random(f"ideal/{epoch}").shuffle(order)
    return [order[i : i + 64] for i in range(0, len(order), 64)]


def neighbour_distance(batches: list[list[int]]) -> float:
    """Mean distance in the epoch's order between samples that follow each other in a shard
    (an ideal shuffle: about a third of the epoch)."""
    per_shard = CLASSES * PER_CLASS // SORTED_SHARDS
    at = {x: i for i, x in enumerate(x for b in batches for x in b)}
    pairs = [(x, x + 1) for x in range(CLASSES * PER_CLASS - 1) if (x + 1) % per_shard]
    return statistics.mean(abs(at[a] - at[b]) for a, b in pairs)


def labelled(batches: list[list[int]]) -> list[list[int]]:
    return [[x // PER_CLASS for x in b] for b in batches]


def bytes_read_locally(url: str, **kwargs: Any) -> int:
    """Bytes of the shards read by one epoch of the 2 x 1 readers, in this process: what their
    streams hand the tar reader (the ``.tar`` files only, as over HTTP, where the indexes beside the
    shards are not counted either; bytes skipped by seeking are not read)."""
    import tarproc
    import tarproc.sources as sources

    tarproc.Dataset(url, shuffle=1000, **kwargs)  # the indexes and counts found before, not counted
    real = sources.Source._raw_read
    read = [0]

    def counting(self: Any, n: int) -> bytes:
        data = real(self, n)
        if self.url.endswith(".tar"):
            read[0] += len(data)
        return data

    sources.Source._raw_read = counting  # type: ignore[method-assign]
    try:
        tarproc_batches(url, 0, workers=0, **kwargs)
    finally:
        sources.Source._raw_read = real  # type: ignore[method-assign]
    return read[0]


def bytes_read_over_http(directory: Path, names: list[str], **kwargs: Any) -> int:
    """Bytes of the shards sent by an HTTP server (an index beside each) for one epoch of 2 x 2 readers."""
    from bench_network import fault_server

    with fault_server(directory) as server:
        url = [f"{server.url}/{name}" for name in names]
        tarproc_batches(url, 0, **kwargs)  # type: ignore[arg-type]
        return sum(r.sent for r in server.requests if r.method == "GET" and r.path.endswith(".tar"))


# ------------------------------------------------------------------------------------------------


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    saved_cache = os.environ.get("TARPROC_CACHE_DIR")
    # the counts the datasets find are cached in the scratch directory: each run starts cold
    os.environ["TARPROC_CACHE_DIR"] = str(ctx.out_dir / "count-cache")
    try:
        scale_rows(ctx, rows, notes)
    finally:
        if saved_cache is None:
            os.environ.pop("TARPROC_CACHE_DIR", None)
        else:
            os.environ["TARPROC_CACHE_DIR"] = saved_cache
    return rows, notes


def scale_rows(ctx: Context, rows: list[Row], notes: list[str]) -> None:
    from tarproc.sources import expand_urls

    url = make_shards(ctx)
    shards = expand_urls([url])
    for shard in shards:
        warm(Path(shard))
    n = ctx.data.jpeg_samples * 2  # bench_train.REPEAT
    reps = ctx.reps
    workers = f"{WORKERS} DataLoader workers"

    # -- 1: counts found by the dataset vs none --
    log(f"scale: Dataset with counts (default) vs lengths=None, {n} JPEGs in {len(shards)} shards, {workers}")
    if epoch(lambda: counted(url))() != n:  # warm-up, untimed: the imports, the counts' cache
        raise RuntimeError(f"warm-up: the Dataset did not deliver {n} images")
    t_ours, t_base = alternate_many([("counts", reps, epoch(lambda: counted(url))),
                                     ("lengths=None", reps, epoch(lambda: uncounted(url)))], n, "counts")
    ours, base = rate(n, t_ours), rate(n, t_base)
    rows.append(Row(f"`Dataset` with the counts it finds (default), train row 1's recipe, img/s, {workers}", ours,
                    "img/s", "the same with `lengths=None` (no counts)", base, "≥ 0.97×", yes_no(ours >= 0.97 * base)))
    notes.append(f"counts: Dataset (default) {spread(t_ours)}; lengths=None {spread(t_base)}")

    # -- 2: two ranks, the collective end vs counts --
    log("scale: 2 ranks (gloo), ds.loader(num_workers=1) each: lengths=None (all-reduce per step) vs counts")
    two = two_ranks(url, n, reps, ctx.out_dir)
    ours, base = rate(n, two["counts"]), rate(n, two["none"])
    rows.append(Row("2 ranks (gloo), `ds.loader(num_workers=1)` each, with counts (no collective), img/s", ours,
                    "img/s", "`lengths=None`: an all-reduce every step", base, "≥ 0.97×", yes_no(ours >= 0.97 * base)))
    notes.append(f"2 ranks, timed in the job from iter() to the last batch, max over the ranks: counts "
                 f"{spread(two['counts'])}; lengths=None {spread(two['none'])}; every key once on both sides, "
                 "equal steps per rank")

    # -- 3: Mix of two datasets vs one --
    half = len(shards) // 2
    log(f"scale: Mix(a: {half} shards, b: {len(shards) - half} shards) in {workers} vs one Dataset, {workers}")
    t_ours, t_base = alternate_many([("Mix", reps, epoch(lambda: mixed(shards[:half], shards[half:]))),
                                     ("Dataset", reps, epoch(lambda: counted(url)))], n, "mix")
    ours, base = rate(n, t_ours), rate(n, t_base)
    rows.append(Row(f"`Mix` of 2 Datasets (2 shards each, `until=\"all\"`) in one set of {WORKERS} workers, img/s", ours, "img/s",
                    f"one `Dataset` over the 4 shards, {workers}", base, "≥ 0.97×", yes_no(ours >= 0.97 * base)))
    notes.append(f"mix: Mix {spread(t_ours)}; one Dataset {spread(t_base)}")

    # -- 4: counting a dataset of 16 x 1 GB --
    count_rows(ctx, rows, notes)

    # -- 5: resume in the middle of a 1 GB shard --
    big, big_n = str(ctx.data.big), ctx.data.big_samples
    warm(ctx.data.big)
    state, expected, taken = stop_midway(big, big_n)
    sidecar = os.path.exists(big + ".idx")
    log(f"scale: resume after {taken} of {-(-big_n // 64)} batches of {ctx.data.big.name}: index vs re-read")
    t_ours, t_base = alternate_many(
        [("index", reps, resume_first_batch(big, state, expected, True, 1)),
         ("re-read", reps, resume_first_batch(big, state, expected, False, 1))], 64, "resume")
    size = ctx.data.big.stat().st_size / 1e9
    rows.append(Row(f"resume in the middle of a {size:.2f} GB shard ({taken} of {-(-big_n // 64)} batches taken): "
                    "time to the first batch, seeking with an index (default; lower is better)",
                    1e3 * statistics.median(t_ours), "ms", "reading the shard from its start and skipping",
                    1e3 * statistics.median(t_base), "report", "—"))
    notes.append(f"resume: index {spread(t_ours)} ("
                 + (f"from {big}.idx" if sidecar else "no .idx beside the shard: its headers walked, in the timing")
                 + f"); re-read {spread(t_base)}; both include the Dataset's construction and load_state_dict, the "
                 "first batch's keys checked against an uninterrupted run's, and the seek checked (ds.seeks)")
    # -- 6: shuffle quality --
    quality_rows(ctx, rows, notes, url)


def count_rows(ctx: Context, rows: list[Row], notes: list[str]) -> None:
    from tarproc.dataset.counts import shard_counts

    shard, n = ctx.data.big, ctx.data.big_samples
    directory = ctx.out_dir / "counted"
    directory.mkdir()
    links = []
    for i in range(DATASET_SHARDS):
        links.append(directory / f"train-{i:04d}.tar")
        links[-1].symlink_to(shard)
    urls = [str(p) for p in links]
    blocker = ctx.out_dir / "not-a-directory"
    blocker.write_text("")
    no_cache = str(blocker / "cache")  # can't be made: no cache, every shard walked
    warm_cache = str(ctx.out_dir / "warm-cache")
    warm(shard)

    def counter(cache_dir: str, source: str) -> Callable[[], int]:
        def run() -> int:
            found = shard_counts(urls, "auto", cache_dir=cache_dir)
            if found.counts is None or set(found.counts.values()) != {n} or set(found.sources.values()) != {source}:
                raise RuntimeError(f"shard_counts: counts {found.counts and set(found.counts.values())}, "
                                   f"sources {set(found.sources.values())}, expected {n} each, {source!r}")
            return sum(found.counts.values())

        return run

    shard_counts(urls, "auto", cache_dir=warm_cache)  # fills the cache, untimed (its key is the realpath: one walk)
    gb = shard.stat().st_size / 1e9
    log(f"scale: shard_counts of {DATASET_SHARDS} x {gb:.2f} GB shards (no cache; warm cache) vs tar -tf of each")
    t_walk, t_warm, t_tar = alternate_many(
        [("walk", ctx.reps, counter(no_cache, "counted")), ("cache", ctx.fast_reps, counter(warm_cache, "counted (cache)")),
         ("tar -tf", ctx.reps, tar_lister(links))], DATASET_SHARDS * n, "counting")
    tar_rate = DATASET_SHARDS / statistics.median(t_tar)
    for label, times in (("no cache (every shard walked)", t_walk), ("warm cache", t_warm)):
        rows.append(Row(f"`shard_counts` of {DATASET_SHARDS} shards of {gb:.2f} GB, {label}, shards/s",
                        DATASET_SHARDS / statistics.median(times), "shards/s", "GNU tar -tf of each", tar_rate,
                        "report", "—"))
    notes.append(f"counting {DATASET_SHARDS} shards: no cache {spread(t_walk)}; warm cache {spread(t_warm)}; "
                 f"tar -tf of each {spread(t_tar)}")


def quality_rows(ctx: Context, rows: list[Row], notes: list[str], train_url: str) -> None:
    url = sorted_shards(ctx)
    log(f"scale: shuffle quality, {CLASSES} classes x {PER_CLASS} class-sorted in {SORTED_SHARDS} shards, "
        f"2 ranks x {WORKERS} workers, {QUALITY_EPOCHS} epochs")
    t0 = time.perf_counter()
    modes: dict[str, dict[str, Any]] = {"interleaved": {}, "parts": {"interleave": 1}, "shards": {"part_size": None}}
    results, distance = {}, {}
    for label, batches in (
        *((label, lambda e, kw=kw: tarproc_batches(url, e, **kw)) for label, kw in modes.items()),
        ("ideal", ideal_batches),
    ):
        epochs = [batches(e) for e in range(QUALITY_EPOCHS)]
        results[label] = quality([x for e in epochs for x in labelled(e)], 64)
        distance[label] = statistics.mean(neighbour_distance(e) for e in epochs)
    new, parts, shards, ideal = results["interleaved"], results["parts"], results["shards"], results["ideal"]
    rows.append(Row("shuffle quality, class-sorted shards, 2 ranks x 2 workers, buffer 1000: distinct classes per "
                    "batch of 64, parts of 256 interleaved 64 at a time (default)", new[0], "classes",
                    "an ideal shuffle (a seeded permutation)", ideal[0], "≥ 0.80×", yes_no(new[0] >= 0.8 * ideal[0])))
    rows.append(Row("the same against the parts one after another (`interleave=1`, the old default)", new[0], "classes",
                    "parts one after another", parts[0], "report", "—"))
    rows.append(Row("the same: share of a batch in its most common class (lower is better)", 100 * new[1], "%",
                    "parts one after another", 100 * parts[1], "report", "—"))
    rows.append(Row("the same: mean distance in the epoch between neighbours on disk, in samples", distance["interleaved"],
                    "samples", "an ideal shuffle", distance["ideal"], "report", "—"))
    notes.append(
        f"shuffle quality ({QUALITY_EPOCHS} epochs, full batches only): interleaved (default) {new[0]:.2f} classes per "
        f"batch, top class {100 * new[1]:.1f} %, neighbours on disk {distance['interleaved']:.0f} samples apart; parts "
        f"one after another {parts[0]:.2f}, {100 * parts[1]:.1f} %, {distance['parts']:.0f}; whole shards "
        f"{shards[0]:.2f}, {100 * shards[1]:.1f} %, {distance['shards']:.0f}; ideal shuffle {ideal[0]:.2f}, "
        f"{100 * ideal[1]:.1f} %, {distance['ideal']:.0f} ({ideal[2]} batches an epoch); every sample received once "
        f"per epoch ({time.perf_counter() - t0:.1f} s)"
    )
    # bytes read in an epoch, against the dataset's
    from tarproc.sources import expand_urls

    shards_of = expand_urls([url])
    size = sum(os.path.getsize(s) for s in shards_of)
    local = {label: bytes_read_locally(url, **kw) for label, kw in modes.items() if label != "shards"}
    directory = Path(shards_of[0]).parent
    http = {label: bytes_read_over_http(directory, [Path(s).name for s in shards_of], **kw)
            for label, kw in modes.items() if label != "shards"}
    rows.append(Row("the same, bytes of the shards read in an epoch, local (2 x 1 readers; lower is better)",
                    local["interleaved"] / 1e6, "MB", "the dataset's bytes", size / 1e6, "≤ 1.05×",
                    yes_no(local["interleaved"] <= 1.05 * size)))
    rows.append(Row("the same over HTTP (an index beside each shard, read-ahead on, 2 x 2 readers; lower is better)",
                    http["interleaved"] / 1e6, "MB", "the dataset's bytes", size / 1e6, "≤ 1.05×",
                    yes_no(http["interleaved"] <= 1.05 * size)))
    notes.append(f"bytes read in an epoch of the class-sorted set ({size / 1e6:.2f} MB): local interleaved "
                 f"{local['interleaved'] / size:.2f}x, parts one after another {local['parts'] / size:.2f}x (a part's reads "
                 f"stop at its end, the one sample after it included, where the index beside the shard says); over HTTP "
                 f"interleaved {http['interleaved'] / size:.2f}x, parts one after another {http['parts'] / size:.2f}x")
    # throughput: train row 1's recipe, interleaved (default) against the parts one after another
    n = epoch(lambda: counted(train_url))()  # untimed: the images of an epoch, which every pass must deliver
    t_ours, t_base = alternate_many([("interleaved", ctx.reps, epoch(lambda: counted(train_url))),
                                     ("interleave=1", ctx.reps, epoch(lambda: counted(train_url, interleave=1)))],
                                    n, "interleave")
    ours, base = rate(n, t_ours), rate(n, t_base)
    rows.append(Row(f"train row 1's recipe, parts interleaved (default), img/s, {WORKERS} DataLoader workers", ours,
                    "img/s", "the parts one after another (`interleave=1`)", base, "≥ 0.95×", yes_no(ours >= 0.95 * base)))
    notes.append(f"interleave: interleaved {spread(t_ours)}; interleave=1 {spread(t_base)}")

