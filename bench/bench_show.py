"""tarshow's measures.

- ``tarshow --summary`` over the small samples vs webdataset counting fields in Python. The
  baseline reads the same file with webdataset and counts, per field, the samples having it and
  their total size: the least a summary needs. tarshow runs as a command (its time includes
  process start-up, ~0.15 s); the baseline runs in-process.
- ``tarshow --summary`` with its content statistics (image sizes from the JPEG headers, the class
  histogram) vs ``tarshow --summary --bytes-only`` on the JPEG shard: both commands, start-up
  included; target: within 2x of the byte-only summary.
- ``tarshow --report`` of the ~1 GB shard (48 cards), in seconds, next to ``--summary
  --bytes-only`` of the same shard (one pass over the bytes, the least any report costs).
- ``tarshow --summary --decode -p P`` (every JPEG decoded to find damage, the summary besides) vs
  ``tardecode -p P -o /dev/null`` on the same JPEG shard with the same processes: both commands,
  start-up included; target: at most 1.5x tardecode's time.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

from common import Context, Row, alternate, alternate_many, log, spread, yes_no

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


def tarshow(*args: str) -> bytes:
    return subprocess.run([sys.executable, "-m", "tarproc.cli.tarshow", *args], check=True, capture_output=True).stdout


def summary_samples(path: Path, *flags: str) -> int:
    """Samples counted by ``tarshow --summary --json`` (with ``flags``), checked against what it says."""
    doc = json.loads(tarshow("--summary", "--json", "-q", *flags, str(path)))
    if "--bytes-only" in flags:
        if doc["content"] is not None:
            raise RuntimeError("tarshow --summary --bytes-only: content statistics")
    else:
        image = doc["content"]["fields"]["jpg"]["image"]
        if image["width"]["min"] != 500 or image["width"]["count"] != doc["samples"] or doc["problems"]:
            raise RuntimeError(f"tarshow --summary: unexpected content {image}")
    return int(doc["samples"])


def report_samples(path: Path, out: Path) -> int:
    """Writes the report of ``path`` to ``out``; returns its sample count (from the page)."""
    out.unlink(missing_ok=True)
    tarshow("--report", str(out), "-q", str(path))
    text = out.read_text(encoding="utf-8")
    cards = text.count('class="card"')
    if cards != 48:
        raise RuntimeError(f"tarshow --report: {cards} cards, expected 48")
    return int(text.split(" samples in ", 1)[0].rsplit(">", 1)[-1].replace(",", ""))


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    rows, notes = summary_rows(ctx)
    more_rows, more_notes = content_rows(ctx)
    decode_row, decode_notes = decode_rows(ctx)
    return rows + more_rows + decode_row, notes + more_notes + decode_notes


DECODE_PROCESSES = min(4, os.cpu_count() or 1)


def decode_check_samples(path: Path, processes: int) -> int:
    """Samples of ``tarshow --summary --decode -p N``, every image checked and none failing."""
    doc = json.loads(tarshow("--summary", "--json", "-q", "--decode", "-p", str(processes), str(path)))
    decode = doc["content"]["decode"]
    if decode["failed"] or decode["checked"]["image"] != doc["samples"]:
        raise RuntimeError(f"tarshow --summary --decode: unexpected {decode}")
    return int(doc["samples"])


def tardecode_samples(path: Path, processes: int, expect: int) -> int:
    """``tardecode -p N -o /dev/null`` of the shard (its --stats line checked for the count)."""
    err = subprocess.run([sys.executable, "-m", "tarproc.cli.tardecode", "-q", "--stats", "-p", str(processes),
                          "--device", "cpu", "-o", "/dev/null", str(path)], check=True, capture_output=True).stderr
    if f"decoded {expect} images".encode() not in err:
        raise RuntimeError(f"tardecode: unexpected stats {err.decode(errors='replace')[-300:]}")
    return expect


def decode_rows(ctx: Context) -> tuple[list[Row], list[str]]:
    n, path, p = ctx.data.jpeg_samples, ctx.data.jpeg, DECODE_PROCESSES
    reps = ctx.reps
    log(f"[show] tarshow --summary --decode -p {p} vs tardecode -p {p} -o /dev/null on {n:,} JPEGs ({reps} reps)")
    tc, td = alternate(reps, reps, lambda: decode_check_samples(path, p), lambda: tardecode_samples(path, p, n), n,
                       "decode check")
    ratio = statistics.median(tc) / statistics.median(td)
    rows = [Row(
        f"`tarshow --summary --decode -p {p}`, {n:,} JPEGs (command, start-up included)",
        n / statistics.median(tc), "samples/s", f"`tardecode -p {p} -o /dev/null`, same shard",
        n / statistics.median(td), "≤ 1.5× the time", yes_no(ratio <= 1.5),
    )]
    notes = [f"decode check: tarshow --summary --decode {spread(tc)}; tardecode {spread(td)}; time ratio {ratio:.2f}×"]
    return rows, notes


def content_rows(ctx: Context) -> tuple[list[Row], list[str]]:
    n, path = ctx.data.jpeg_samples, ctx.data.jpeg
    reps = max(ctx.reps, ctx.fast_reps // 2)
    log(f"[show] tarshow --summary with content statistics vs --bytes-only on {n:,} JPEG samples ({reps} reps)")
    tc, tb = alternate(reps, reps, lambda: summary_samples(path), lambda: summary_samples(path, "--bytes-only"), n,
                       "content summary")
    content, byte_only = n / statistics.median(tc), n / statistics.median(tb)
    rows = [Row(
        f"`tarshow --summary` with content statistics, {n:,} JPEGs (command, start-up included)",
        content, "samples/s", "`tarshow --summary --bytes-only`", byte_only, "≥ 0.5× (within 2×)",
        yes_no(content >= 0.5 * byte_only),
    )]
    notes = [f"content summary: with content statistics {spread(tc)}; --bytes-only {spread(tb)}; "
             f"time ratio {statistics.median(tc) / statistics.median(tb):.2f}×"]

    big, m = ctx.data.big, ctx.data.big_samples
    size = big.stat().st_size
    out = ctx.out_dir / "report.html"
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    log(f"[show] tarshow --report of {big.name} ({size / 1e9:.2f} GB, {m:,} samples) vs --summary --bytes-only "
        f"({ctx.reps} reps)")
    tr, ts = alternate_many([("report", ctx.reps, lambda: report_samples(big, out)),
                             ("bytes-only summary", ctx.reps, lambda: summary_samples(big, "--bytes-only"))], m, "report")
    report_s = statistics.median(tr)
    rows.append(Row(
        f"`tarshow --report` of {big.name} ({size / 1e9:.2f} GB, {m:,} samples, 48 cards): {report_s:.2f} s",
        size / 1e6 / report_s, "MB/s", "`tarshow --summary --bytes-only`, same shard", size / 1e6 / statistics.median(ts),
        "—", "—",
    ))
    notes.append(f"report: {spread(tr)}; --summary --bytes-only {spread(ts)}; report file "
                 f"{out.stat().st_size / 1e6:.2f} MB")
    return rows, notes


def summary_rows(ctx: Context) -> tuple[list[Row], list[str]]:
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
