"""tarindex throughput and IndexedShard random-access latency (issue: tarindex + IndexedShard).

Rows: tarindex MB/s on the ~1 GB JPEG shard and on the small-sample shard, against GNU ``tar -tf``
listing the same file (which seeks past member data instead of reading it); tarindex of a dataset
of 16 such shards in one command (start-up paid once) against ``tar -tf`` of each; random access to one
sample by position with IndexedShard (median and p99 latency), against finding the same sample by
scanning with read_samples. Latencies are per sample, file in the page cache; lower is better.
"""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from common import GNU_TAR, Context, Row, alternate, log, spread, warm, yes_no

SECTION = "index"
DATASET_SHARDS = 16  # the dataset row: this many 1 GB shards in one tarindex command


def run_tarindex(shard: Path, out: Path) -> int:
    """tarindex as a user runs it; returns the sample count the index announces."""
    subprocess.run([sys.executable, "-m", "tarproc.cli.tarindex", "-q", "-o", str(out), str(shard)], check=True)
    with open(out, encoding="utf-8") as f:
        return int(json.loads(f.readline())["samples"])


def run_tarindex_all(shards: list[Path]) -> int:
    """One tarindex command for many shards (each index next to its shard); the samples indexed."""
    subprocess.run([sys.executable, "-m", "tarproc.cli.tarindex", "-q", *map(str, shards)], check=True)
    total = 0
    for shard in shards:
        with open(f"{shard}.idx", encoding="utf-8") as f:
            total += int(json.loads(f.readline())["samples"])
    return total


def tar_lister(shards: list[Path], members_per_sample: int = 2) -> Callable[[], int]:
    """GNU ``tar -tf`` of each shard as a user runs it, the listing going to /dev/null (not to a
    pipe this process reads, which would time Python's reading too); returns the samples listed,
    counted once beforehand from a listing read here."""
    lines = sum(subprocess.run([GNU_TAR, "-tf", str(shard)], check=True, stdout=subprocess.PIPE).stdout.count(b"\n")
                for shard in shards)

    def run() -> int:
        for shard in shards:
            subprocess.run([GNU_TAR, "-tf", str(shard)], check=True, stdout=subprocess.DEVNULL)
        return lines // members_per_sample

    return run


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def access_times(shard: Path, positions: list[int]) -> list[float]:
    """Seconds per ``IndexedShard[i]`` (the index is loaded from SHARD.idx before timing)."""
    from tarproc.index import IndexedShard

    times = []
    with IndexedShard(shard) as ds:
        for i in positions:
            t0 = time.perf_counter()
            sample = ds[i]
            times.append(time.perf_counter() - t0)
            assert sample["__key__"]
    return times


def scan_times(shard: Path, keys: list[str]) -> list[float]:
    """Seconds to find each key by reading the shard from the start with read_samples."""
    import tarproc

    times = []
    for key in keys:
        t0 = time.perf_counter()
        for sample in tarproc.read_samples(str(shard)):
            if sample["__key__"] == key:
                break
        else:
            raise RuntimeError(f"{key} not found")
        times.append(time.perf_counter() - t0)
    return times


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    out_dir = ctx.out_dir

    # -- tarindex throughput --
    for which in ("big", "small"):
        shard: Path = getattr(ctx.data, which)
        n = getattr(ctx.data, which + "_samples")
        mb = shard.stat().st_size / 1e6
        label = f"{mb:,.0f} MB JPEG shard" if which == "big" else f"{n:,} small samples ({mb:,.0f} MB)"
        warm(shard)
        log(f"tarindex vs tar -tf on {shard.name} ({mb:,.0f} MB)")
        ta, tb = alternate(
            ctx.reps, ctx.reps, lambda s=shard: run_tarindex(s, out_dir / "x.idx"), tar_lister([shard]),
            n, f"tarindex {which}",
        )
        ours, base = mb / statistics.median(ta), mb / statistics.median(tb)
        target, met = ("≥ 0.7× (issue 13)", yes_no(ours >= 0.7 * base)) if which == "big" else ("report", "—")
        rows.append(Row(f"tarindex, {label}", ours, "MB/s", "GNU tar -tf (seeks past data)", base, target, met))
        notes.append(f"tarindex {which}: {spread(ta)}; tar -tf: {spread(tb)}")

    # -- a dataset: many shards in one command, so start-up is paid once (links to the same shard) --
    shard, n = ctx.data.big, ctx.data.big_samples
    dataset = out_dir / "dataset"
    dataset.mkdir()
    links = []
    for i in range(DATASET_SHARDS):
        links.append(dataset / f"train-{i:04d}.tar")
        links[-1].symlink_to(shard)
    warm(shard)
    gb = DATASET_SHARDS * shard.stat().st_size / 1e9
    log(f"tarindex of {DATASET_SHARDS} shards vs tar -tf of each ({gb:,.0f} GB)")
    ta, tb = alternate(
        ctx.reps, ctx.reps, lambda: run_tarindex_all(links), tar_lister(links),
        DATASET_SHARDS * n, "tarindex dataset",
    )
    rows.append(Row(f"tarindex of {DATASET_SHARDS} shards of {shard.stat().st_size / 1e9:,.2f} GB (one command), "
                    "shards/s", DATASET_SHARDS / statistics.median(ta), "shards/s", "GNU tar -tf of each",
                    DATASET_SHARDS / statistics.median(tb), "report", "—"))
    notes.append(f"tarindex {DATASET_SHARDS} shards: {spread(ta)}; tar -tf of each: {spread(tb)}")

    # -- random access --
    for which, label in (("jpeg", f"{ctx.data.jpeg_samples:,} JPEG samples"),
                         ("small", f"{ctx.data.small_samples:,} small samples")):
        shard = getattr(ctx.data, which)
        n = getattr(ctx.data, which + "_samples")
        idx = out_dir / f"{which}.tar"
        idx.symlink_to(shard)  # IndexedShard finds out_dir/NAME.idx next to the link
        run_tarindex(idx, out_dir / f"{which}.tar.idx")
        warm(shard)
        rng = random.Random(7)
        positions = [rng.randrange(n) for _ in range(2000 if not ctx.quick else 500)]
        access_times(idx, positions[:50])  # warm-up: imports, first reads
        ours = access_times(idx, positions)
        scan_keys = [f"{'j' if which == 'jpeg' else 's'}{p:07d}" for p in positions[: 10 if ctx.quick else 30]]
        base = scan_times(shard, scan_keys)
        for name, p in (("median", 50.0), ("p99", 99.0)):
            rows.append(Row(f"IndexedShard random access, {label}, {name}", percentile(ours, p) * 1e6, "µs",
                            "scan with read_samples", percentile(base, p) * 1e6, "report", "—"))
        notes.append(
            f"random access {which}: {len(ours)} reads, median {statistics.median(ours) * 1e6:,.0f} µs, "
            f"p99 {percentile(ours, 99) * 1e6:,.0f} µs, max {max(ours) * 1e6:,.0f} µs; scan baseline "
            f"{len(base)} keys, median {statistics.median(base) * 1e3:,.1f} ms (lower is better for both)"
        )
    return rows, notes
