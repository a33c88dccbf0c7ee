"""tarproc benchmark: tarproc against its baselines, measured in the same run, printed as one table.

Usage (from the repository root)::

    make bench                                  # = .venv/bin/python bench/run.py
    .venv/bin/python bench/run.py --quick       # small data, 2 repetitions: a smoke test
    .venv/bin/python bench/run.py --reps 9      # more repetitions of every measure
    .venv/bin/python bench/run.py --only sort,pcat   # some sections only

Data is generated once, deterministically, under ``bench-data/`` (``bench-data/quick/`` for
``--quick``) and reused while its manifest matches. Every file is read once before timing, so all
reads come from the page cache. Each measure and its baseline are timed alternately, repetition by
repetition, and the median is reported. See bench/README.md for what each row means.

The measures live in sections, one module each (``bench/bench_<section>.py``, see common.py).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import shutil
import sys
import time
import traceback
from pathlib import Path

from common import (
    BIN,
    FULL,
    QUICK,
    ROOT,
    Context,
    Row,
    log,
    machine,
    prepare_data,
    print_table,
    warm,
)

# in the order they run; a section is bench/bench_<name>.py
SECTIONS = ["core", "index", "tables", "show", "process", "pcat", "sort", "decode", "train", "scale", "network", "remote", "streaming", "zmq", "jobs", "view"]


def run(args: argparse.Namespace) -> int:
    cfg = dict(QUICK if args.quick else FULL)
    if args.reps is not None:
        cfg["reps"] = cfg["slow_reps"] = cfg["fast_reps"] = args.reps
    directory = Path(args.data) if args.data else ROOT / "bench-data" / ("quick" if args.quick else "")
    directory = directory.resolve()
    start = time.perf_counter()

    import tarproc.tar.reader

    for tool in ("tarcat", "tarsplit"):
        if not (BIN / tool).exists():
            sys.exit(f"{BIN / tool} not found: run `make install` first")
    if tarproc.tar.reader._scan is None:
        log("warning: tarproc's C fast path is not built (or TARPROC_PURE_PYTHON is set); timing the pure-Python reader")

    data = prepare_data(directory, cfg)
    out_dir = (Path(args.out) if args.out else directory) / "tarproc-bench-out"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir()
    atexit.register(shutil.rmtree, out_dir, True)  # no ~1 GB leftovers, even after an error or Ctrl-C
    big_size = data.big.stat().st_size
    free = shutil.disk_usage(out_dir).free
    if free < big_size * 1.1 + (64 << 20):
        sys.exit(
            f"not enough disk space in {out_dir} for the pipeline's output: {free / 1e9:.2f} GB free, "
            f"need about {big_size * 1.1 / 1e9:.2f} GB"
        )
    for path in (data.small, data.jpeg, data.big):
        warm(path)
    ctx = Context(args.quick, cfg["reps"], cfg["slow_reps"], cfg["fast_reps"], data, directory, out_dir)

    rows: list[tuple[str, Row]] = []
    notes: list[str] = []
    failed: list[str] = []
    for name in args.only:
        log(f"== section {name}")
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(f"bench_{name}")
            section_rows, section_notes = module.run(ctx)
        except Exception:  # one broken section must not hide the others' figures
            traceback.print_exc()
            failed.append(name)
            continue
        finally:
            for p in out_dir.iterdir():
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
        rows += [(name, row) for row in section_rows]
        notes += [f"{name}: {note}" for note in section_notes]
        log(f"   section {name}: {time.perf_counter() - t0:.1f} s")
    shutil.rmtree(out_dir, ignore_errors=True)

    total = time.perf_counter() - start
    print()
    print(f"tarproc benchmark{' (--quick)' if args.quick else ''}: {machine()}")
    print(
        f"data: {directory}; small.tar {data.small.stat().st_size / 1e6:.0f} MB, "
        f"jpeg.tar {data.jpeg.stat().st_size / 1e6:.0f} MB, big.tar {big_size / 1e9:.2f} GB; "
        f"medians of {ctx.reps} reps ({ctx.slow_reps} for the ~10 s baselines, {ctx.fast_reps} for the "
        "fastest measures); 1 GB = 1e9 bytes"
    )
    print()
    print_table(rows)
    print()
    for note in notes:
        print(f"- {note}")
    print()
    if failed:
        print(f"FAILED sections (see stderr): {', '.join(failed)}")
    print(f"total time: {total:.1f} s")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small data and 2 repetitions: a smoke test")
    parser.add_argument("--reps", type=int, default=None, metavar="N", help="repetitions of every measure")
    parser.add_argument("--data", metavar="DIR", help="where to generate and keep the data (default bench-data/)")
    parser.add_argument(
        "--out", metavar="DIR",
        help="where measures write their output, up to ~1 GB (default: the data directory; /dev/shm takes the disk out)",
    )
    parser.add_argument(
        "--only", metavar="SECTIONS", default=",".join(SECTIONS),
        help=f"comma-separated sections to run (default: all of {', '.join(SECTIONS)})",
    )
    args = parser.parse_args()
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in args.only if s not in SECTIONS]
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
