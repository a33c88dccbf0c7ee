"""tarsort (issue: external merge sort): sort a shuffled ~1 GB stream under --buffer-size 200M.

Rows: tarsort throughput against a pass-through tarcat of the same input (what reading and writing
alone cost), and tarsort's peak RSS against 1.5x the bound. The input is a copy of big.tar shuffled
once (tarsort --random --seed 1) and cached under <data>/sort/: sorting sorted input is too easy.
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

from common import Context, Row, alternate, log, spread, warm, yes_no

SECTION = "sort"
BOUND = 200 << 20  # 200 MiB: the 1 GB stream is 5x the bound
QUICK_BOUND = 32 << 20  # --quick: big.tar is ~100 MB (3x; a smaller bound would be mostly the interpreter)


def tool(module: str, *args: object) -> list[str]:
    return [sys.executable, "-m", f"tarproc.cli.{module}", "-q", "--stats", *map(str, args)]


# The measured command is started by this small launcher, not by the benchmark itself: Linux
# carries the RSS high-water mark of the process that forks over exec (the benchmark holds
# hundreds of MB), so wait4 from here would report the benchmark's own size.
LAUNCHER = """
import os, sys
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)
_, status, usage = os.wait4(pid, 0)
sys.stderr.write(f"\\nmaxrss_kib={usage.ru_maxrss}\\n")
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(argv: list[str]) -> tuple[int, int, str]:
    """Run a command; return (samples written, peak RSS in bytes of that very command, stderr)."""
    proc = subprocess.run([sys.executable, "-c", LAUNCHER, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = proc.stderr.decode()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed with status {proc.returncode}: {err.strip()}")
    m = re.search(r"wrote (\d+) samples", err)
    rss = re.search(r"maxrss_kib=(\d+)", err)
    if m is None or rss is None:
        raise RuntimeError(f"no sample count or peak RSS in the report of {' '.join(argv)}: {err!r}")
    return int(m.group(1)), int(rss.group(1)) * 1024, err


def scratch(ctx: Context) -> Path:
    """Where tarsort puts its runs: a directory of this section's own (out_dir holds the output)."""
    path = ctx.directory / SECTION / "tmp"
    path.mkdir(parents=True, exist_ok=True)
    return path


def shuffled_input(ctx: Context) -> Path:
    """big.tar in a random order, made once (tarsort --random, bounded memory) and cached."""
    directory = ctx.directory / SECTION
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "big-shuffled.tar"
    big_size = ctx.data.big.stat().st_size
    if path.exists() and path.stat().st_size == big_size:  # same members, same names: same size
        log(f"reusing {path}")
        return path
    log(f"making {path} (big.tar shuffled) ...")
    n, _, _ = run_measured(tool("tarsort", ctx.data.big, "--random", "--seed", "1", "--buffer-size", "256MiB",
                                "--tmpdir", scratch(ctx), "-o", path))
    if n != ctx.data.big_samples or path.stat().st_size != big_size:
        raise RuntimeError(f"shuffled copy of big.tar has {n} samples, {path.stat().st_size} bytes")
    return path


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    bound = QUICK_BOUND if ctx.quick else BOUND
    source = shuffled_input(ctx)
    warm(source)
    size = source.stat().st_size
    expect = ctx.data.big_samples
    tmp = scratch(ctx)
    rss: list[int] = []
    reports: list[str] = []

    def sort() -> int:
        n, peak, err = run_measured(tool("tarsort", source, "--buffer-size", bound, "--tmpdir", tmp, "-o", os.devnull))
        rss.append(peak)
        reports.append(err)
        leftover = [p.name for p in tmp.iterdir()]
        if leftover:
            raise RuntimeError(f"tarsort left temporaries behind: {leftover}")
        return n

    def passthrough() -> int:
        return run_measured(tool("tarcat", source, "-o", os.devnull))[0]

    log(f"tarsort --buffer-size {bound >> 20}MiB of {size / 1e9:.2f} GB ({expect} samples) vs tarcat pass-through")
    t_sort, t_cat = alternate(ctx.reps, ctx.reps, sort, passthrough, expect, "tarsort")
    mb = size / 1e6
    sort_rate = mb / statistics.median(t_sort)
    cat_rate = mb / statistics.median(t_cat)
    peak = max(rss)
    limit = 1.5 * bound
    label = f"{size / 1e9:.1f} GB" if size >= 5e8 else f"{size / 1e6:.0f} MB"
    runs = re.search(r"through (\d+) temporary runs.*?(\d+) merge pass", reports[-1])
    rows = [
        Row(f"tarsort --buffer-size {bound >> 20}MiB of a shuffled {label} stream", sort_rate, "MB/s",
            "tarcat pass-through (no sort)", cat_rate, "—", "—"),
        Row(f"tarsort peak RSS, {label} stream, --buffer-size {bound >> 20}MiB", peak / 1e6, "MB",
            "1.5 × the bound", limit / 1e6, "≤ 1.5× bound", yes_no(peak <= limit)),
    ]
    notes = [
        f"tarsort {spread(t_sort)}; tarcat pass-through {spread(t_cat)}",
        f"tarsort peak RSS per rep (MB): {', '.join(f'{r / 1e6:.0f}' for r in rss)}; "
        + (f"{runs.group(1)} runs, {runs.group(2)} merge pass(es), temporaries on {tmp}" if runs else
           "sorted in memory"),
    ]
    return rows, notes
