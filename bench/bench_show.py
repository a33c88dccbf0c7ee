"""tarshow's measure: ``tarshow --summary`` over the small samples vs webdataset counting fields in Python.

The baseline reads the same file with webdataset and counts, per field, the samples having it and
their total size: the least a summary needs. tarshow runs as a command (its time includes process
start-up, ~0.15 s); the baseline runs in-process.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

from common import Context, Row, alternate, log, spread, yes_no

SECTION = "show"


def summary_tarshow(path: Path) -> int:
    """Samples counted by ``tarshow --summary --json``, checked against the field counts."""
    out = subprocess.run(
        [sys.executable, "-m", "tarproc.cli.tarshow", "--summary", "--json", "-q", str(path)],
        check=True, capture_output=True,
    ).stdout
    doc = json.loads(out)
    if set(doc["fields"]) != {"cls", "txt"} or doc["fields"]["txt"]["samples"] != doc["samples"]:
        raise RuntimeError(f"tarshow --summary: unexpected fields {doc['fields']}")
    return int(doc["samples"])


def summary_webdataset(path: Path) -> int:
    import webdataset

    samples = 0
    present: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for sample in webdataset.WebDataset(str(path), shardshuffle=False):
        samples += 1
        for name, value in sample.items():
            if not name.startswith("__"):
                present[name] += 1
                sizes[name] += len(value)
    if set(present) != {"cls", "txt"}:
        raise RuntimeError(f"webdataset: unexpected fields {dict(present)}")
    return samples


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    import webdataset

    n = ctx.data.small_samples
    path = ctx.data.small
    log(f"[show] tarshow --summary vs webdataset + field counts on {n:,} small samples "
        f"({ctx.reps} and {ctx.slow_reps} reps)")
    ta, tb = alternate(
        ctx.reps, ctx.slow_reps, lambda: summary_tarshow(path), lambda: summary_webdataset(path), n, "summary"
    )
    ours, base = n / statistics.median(ta), n / statistics.median(tb)
    wds_name = f"webdataset {getattr(webdataset, '__version__', '?')} + Counter"
    row = Row(
        f"`tarshow --summary`, {n:,} small samples (command, start-up included)",
        ours, "samples/s", wds_name, base, "≥ 10×", yes_no(ours >= 10 * base),
    )
    notes = [f"summary: tarshow {spread(ta)}; webdataset {spread(tb)}; ratio {ours / base:.1f}×"]
    return [row], notes
