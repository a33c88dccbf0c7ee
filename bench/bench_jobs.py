"""tarjob's measures: what running a shard costs on the local pool and on Dask, and the speed-up of
a second worker on a real tarproc job.

1. Per-shard overhead: N shards of ``true`` through tarjob's loop (``run_shards``: an attempt in its
   own process group, output captured, one journal line per attempt) on the local pool with one
   worker and on a local Dask cluster of 2 worker processes (started once, outside the timing;
   tasks go client -> scheduler -> worker -> keeper process -> subprocess and back), against a plain sequential
   ``subprocess.run(["true"])`` loop: the least a Python driver can do per shard.
2. ``tarjob -j 2`` against ``tarjob -j 1`` (the whole command, start-up included): 8 shards of 300
   small samples, each run through ``tarproc -p 1 -c 'wc -c < sample.txt > sample.n'``, outputs
   checked. On a 2-core machine the ideal is 2×.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from common import Context, Row, alternate, log, sh, spread, yes_no

SECTION = "jobs"
TRIVIAL_SHARDS = 300  # 100 with --quick
JOB_SHARDS = 8  # 4 with --quick
JOB_SAMPLES = 300  # per shard; 150 with --quick


class _Kept:
    """An engine whose close() leaves it running (a Dask cluster is started once, not per rep)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.name = engine.name
        self.capacity = engine.capacity

    def submit(self, task: Any) -> None:
        self.engine.submit(task)

    def wait(self, timeout: float | None) -> Any:
        return self.engine.wait(timeout)

    def close(self, cancel: bool) -> None:
        if cancel:
            self.engine.close(cancel)


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    mine = ctx.directory / SECTION
    mine.mkdir(parents=True, exist_ok=True)
    scratch = mine / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        rows, notes = _overhead(ctx, scratch)
        more_rows, more_notes = _speedup(ctx, mine, scratch)
        return rows + more_rows, notes + more_notes
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _overhead(ctx: Context, scratch: Path) -> tuple[list[Row], list[str]]:
    from tarproc.jobs import JobOptions, Journal, LocalPool, run_shards
    from tarproc.jobs.dask_engine import DaskEngine

    n = 100 if ctx.quick else TRIVIAL_SHARDS
    todo = [(i, str(i)) for i in range(n)]
    options = JobOptions(["true", "{}"], retries=0)
    journal_path = scratch / "journal.jsonl"

    def through(engine: Any) -> int:
        journal_path.unlink(missing_ok=True)
        journal = Journal(str(journal_path))
        try:
            return sum(r.ok for r in run_shards(todo, options, engine, journal))
        finally:
            journal.close()

    def local() -> int:
        return through(LocalPool(options, 1))

    def loop() -> int:
        return sum(subprocess.run(["true", str(i)]).returncode == 0 for i in range(n))

    reps = ctx.fast_reps if not ctx.quick else ctx.reps
    log(f"[jobs] per-shard overhead: {n} shards of 'true', tarjob's local pool (-j 1) vs a subprocess.run loop "
        f"({reps} reps)")
    tl, tb = alternate(reps, reps, local, loop, n, "local pool")
    log("[jobs] the same on a local Dask cluster (2 worker processes, started once)")
    dask = DaskEngine(options, "local", 2)
    kept = _Kept(dask)
    try:
        through(kept)  # warm: workers import tarproc once
        td, tb2 = alternate(ctx.reps, ctx.reps, lambda: through(kept), loop, n, "dask")
    finally:
        dask.close(cancel=False)
    ms_local, ms_base = 1e3 * statistics.median(tl) / n, 1e3 * statistics.median(tb) / n
    ms_dask, ms_base2 = 1e3 * statistics.median(td) / n, 1e3 * statistics.median(tb2) / n
    rows = [
        Row(f"tarjob per-shard cost, local pool -j 1, {n} × `true` (lower is better)", ms_local, "ms/shard",
            "sequential subprocess.run loop", ms_base, "report", "—"),
        Row(f"tarjob per-shard cost, Dask LocalCluster 2 workers, {n} × `true` (lower is better)", ms_dask,
            "ms/shard", "sequential subprocess.run loop", ms_base2, "report", "—"),
    ]
    notes = [
        f"local pool: {ms_local:.2f} ms/shard ({ms_local - ms_base:+.2f} ms over the loop's {ms_base:.2f}); "
        f"tarjob {spread(tl)}; loop {spread(tb)}",
        f"Dask (2 workers, so 2 at a time): {ms_dask:.2f} ms/shard; tarjob {spread(td)}; loop {spread(tb2)}",
    ]
    return rows, notes


def _speedup(ctx: Context, mine: Path, scratch: Path) -> tuple[list[Row], list[str]]:
    shards = 4 if ctx.quick else JOB_SHARDS
    per = 150 if ctx.quick else JOB_SAMPLES
    src = mine / f"in-{shards}x{per}"
    if not (src / f"in-{shards - 1:06d}.tar").exists():
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir()
        sh(f"{sys.executable} -m tarproc.cli.tarcat -q -c {shards * per} {ctx.data.small} | "
           f"{sys.executable} -m tarproc.cli.tarsplit -q -n {per} -o {src}/in-%06d.tar")
    out = scratch / "out"
    spec = f"{{{0:06d}..{shards - 1:06d}}}"

    def tarjob(workers: int):  # type: ignore[no-untyped-def]
        def go() -> int:
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            subprocess.run(
                [sys.executable, "-m", "tarproc.cli.run", "tarjob", "-q", "-s", spec, "-j", str(workers),
                 "--journal", str(out / "journal.jsonl"), "--retries", "0", "--",
                 sys.executable, "-m", "tarproc.cli.tarproc", "-q", "-p", "1", "-c", "wc -c < sample.txt > sample.n",
                 "-f", "n", f"{src}/in-{{}}.tar", "-o", f"{out}/out-{{}}.tar"],
                check=True,
            )
            return _count(out, shards, per)

        return go

    log(f"[jobs] tarjob -j 2 vs -j 1: {shards} shards × {per} samples through tarproc -c ({ctx.reps} reps)")
    t2, t1 = alternate(ctx.reps, ctx.reps, tarjob(2), tarjob(1), shards, "speed-up")
    two, one = shards / statistics.median(t2), shards / statistics.median(t1)
    rows = [Row(f"`tarjob -j 2` vs `-j 1`, {shards} shards × {per} samples of `tarproc -c`", two, "shards/s",
                "tarjob -j 1", one, "≥ 1.6× (2 cores)", yes_no(two >= 1.6 * one))]
    notes = [f"speed-up 1 -> 2 workers: {two / one:.2f}×; -j 2 {spread(t2)}; -j 1 {spread(t1)}"]
    return rows, notes


def _count(out: Path, shards: int, per: int) -> int:
    """Shards written whole: ``per`` samples each, every one with its ``n`` field."""
    import tarproc

    good = 0
    for path in sorted(out.glob("out-*.tar")):
        samples = list(tarproc.read_samples(str(path)))
        if len(samples) == per and all(set(s) == {"__key__", "__url__", "n"} for s in samples):
            good += 1
    return good
