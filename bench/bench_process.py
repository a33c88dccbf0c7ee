"""tarproc's measures: per-sample shell jobs against an ``xargs -P 2`` shell loop, and ``--map``.

1. ``tarproc -p 2 -c true`` on the first 3,000 small samples (txt + cls) vs ``BASELINE_SCRIPT``: the
   same job done with GNU tar, bash and ``xargs -P 2``: one ``tar -x`` splits the shard into a
   directory per sample (``KEY/sample.EXT``); then, two at a time, each sample runs ``bash -c true``
   in its directory and is re-tarred as ``KEY.EXT`` members (``tar -b 1``, its end blocks cut off
   with ``head -c -1024``); the pieces are concatenated in key order and one end-of-archive is
   added. Both outputs are read back and must hold all the samples. A leaner variant of the
   baseline (``LEAN_SCRIPT``: one ``tar -x``, ``bash -c true`` per sample, one ``tar -c`` collecting
   all directories, no per-sample tar) is reported in a note.
2. ``tarproc -p 2 --map trivial.py:identity`` over all small samples vs ``tarcat`` pass-through (both
   commands, start-up included): what shipping samples to worker processes and back costs.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from common import GNU_TAR, Context, Row, alternate, log, sh, spread, yes_no

SECTION = "process"
JOB_SAMPLES = 3000  # 1000 with --quick

BASELINE_SCRIPT = r"""#!/bin/bash
# What 'tarproc -p 2 -c true IN > OUT' does, with GNU tar, bash and xargs -P 2.
# usage: xargs-baseline.sh IN.tar OUT.tar WORKDIR
set -euo pipefail
in=$1 out=$2 work=$3
mkdir -p "$work/split" "$work/done"
# split: every member KEY.EXT becomes split/KEY/sample.EXT (keys here have no '/')
"$TAR" -xf "$in" -C "$work/split" --transform 's,^\([^/.]*\)\.,\1/sample.,'
# per sample, two at a time: run the command in its directory, re-tar what is left as KEY.EXT
ls "$work/split" | xargs -P 2 -n 50 bash -c '
  set -euo pipefail
  for key; do
    cd "$0/split/$key"
    bash -c true
    "$TAR" -cf - -b 1 --transform "s,^sample\.,$key.," sample.* | head -c -1024 > "$0/done/$key.tar"
  done' "$work"
# concatenate in key order, then one end-of-archive (two zero blocks)
cat "$work"/done/*.tar > "$out"
head -c 1024 /dev/zero >> "$out"
rm -rf "$work"
"""

LEAN_SCRIPT = r"""#!/bin/bash
# The least a shell can do: bulk split, 'bash -c true' per sample (xargs -P 2), bulk collect.
set -euo pipefail
in=$1 out=$2 work=$3
mkdir -p "$work/split"
"$TAR" -xf "$in" -C "$work/split" --transform 's,^\([^/.]*\)\.,\1/sample.,'
ls "$work/split" | xargs -P 2 -n 50 bash -c 'for key; do cd "$0/split/$key"; bash -c true; done' "$work"
"$TAR" -cf "$out" --sort=name -C "$work/split" --transform 's,^\./\([^/]*\)/sample\.,\1.,' .
rm -rf "$work"
"""

TRIVIAL = '''def identity(sample):
    return sample
'''


def count(path: Path) -> int:
    """Samples in a tar, read back by tarproc (strict: a damaged output is an error)."""
    import tarproc

    n = 0
    for sample in tarproc.read_samples(str(path)):
        if set(sample) != {"__key__", "__url__", "txt", "cls"}:
            raise RuntimeError(f"{path}: unexpected fields in {sample['__key__']}: {sorted(sample)}")
        n += 1
    return n


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    mine = ctx.directory / SECTION
    mine.mkdir(parents=True, exist_ok=True)
    n = min(1000 if ctx.quick else JOB_SAMPLES, ctx.data.small_samples)
    src = mine / f"small-{n}.tar"
    if not src.exists():
        sh(f"{sys.executable} -m tarproc.cli.tarcat -q -c {n} {ctx.data.small} -o {src}")
    scripts = {}
    for name, text in (("xargs-baseline.sh", BASELINE_SCRIPT), ("xargs-lean.sh", LEAN_SCRIPT)):
        scripts[name] = mine / name
        scripts[name].write_text(text)
    (mine / "trivial.py").write_text(TRIVIAL)
    # scratch space of our own (ctx.out_dir is shared by every section)
    scratch = mine / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir()
    try:
        return _measure(ctx, mine, scratch, src, n, scripts)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _measure(ctx: Context, mine: Path, scratch: Path, src: Path, n: int,
             scripts: dict[str, Path]) -> tuple[list[Row], list[str]]:
    out = scratch / "out.tar"
    jobs_tmp = scratch / "jobs"
    env = {"TAR": GNU_TAR}

    def tarproc_true() -> int:
        jobs_tmp.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "tarproc.cli.tarproc", "-q", "-p", "2", "-c", "true",
                        "--tmpdir", str(jobs_tmp), str(src), "-o", str(out)], check=True)
        return count(out)

    def shell(script: Path):  # type: ignore[no-untyped-def]
        def go() -> int:
            import os

            subprocess.run(["bash", str(script), str(src), str(out), str(scratch / "work")], check=True,
                           env={**os.environ, **env})
            return count(out)

        return go

    log(f"[process] tarproc -p 2 -c true vs an xargs -P 2 loop, {n:,} small samples "
        f"({ctx.reps} and {ctx.slow_reps} reps)")
    ta, tb = alternate(ctx.reps, ctx.slow_reps, tarproc_true, shell(scripts["xargs-baseline.sh"]), n, "-c true")
    ours, base = n / statistics.median(ta), n / statistics.median(tb)
    rows = [Row(f"`tarproc -p 2 -c true`, {n:,} small samples", ours, "samples/s",
                "xargs -P 2: tar -x, bash -c true + tar -c per sample, cat", base, "≥ 1.5×",
                yes_no(ours >= 1.5 * base))]
    notes = [f"-c true: tarproc {spread(ta)}; xargs loop {spread(tb)}; ratio {ours / base:.2f}×"]

    log("[process] the lean xargs variant (bulk tar -x, bash -c true per sample, bulk tar -c)")
    _, tl = alternate(0, ctx.slow_reps, tarproc_true, shell(scripts["xargs-lean.sh"]), n, "lean")
    lean = n / statistics.median(tl)
    notes.append(f"-c true vs the lean xargs variant (no per-sample tar): {lean:,.0f} samples/s, "
                 f"tarproc {ours / lean:.2f}× ({spread(tl)})")

    m = ctx.data.small_samples
    big_src = ctx.data.small
    # the outputs of both are byte-identical to the input (same writer, same samples): checking the
    # size keeps reading 100,000 samples back out of the timings; the content is checked once below
    size = big_src.stat().st_size

    def checked() -> int:
        return m if out.stat().st_size == size else -1

    def tarproc_map() -> int:
        subprocess.run([sys.executable, "-m", "tarproc.cli.tarproc", "-q", "-p", "2", "--map",
                        f"{mine / 'trivial.py'}:identity", str(big_src), "-o", str(out)], check=True)
        return checked()

    def tarcat() -> int:
        subprocess.run([sys.executable, "-m", "tarproc.cli.tarcat", "-q", str(big_src), "-o", str(out)], check=True)
        return checked()

    log(f"[process] tarproc -p 2 --map identity vs tarcat, {m:,} small samples ({ctx.reps} reps)")
    tm, tc = alternate(ctx.reps, ctx.reps, tarproc_map, tarcat, m, "--map")
    tarproc_map()
    if out.read_bytes() != big_src.read_bytes():
        raise RuntimeError("tarproc --map identity did not reproduce its input")
    mapped, cat = m / statistics.median(tm), m / statistics.median(tc)
    rows.append(Row(f"`tarproc -p 2 --map` (identity function), {m:,} small samples", mapped, "samples/s",
                    "tarcat pass-through", cat, "report", "—"))
    notes.append(f"--map: tarproc {spread(tm)}; tarcat {spread(tc)}")
    return rows, notes
