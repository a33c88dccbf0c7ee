"""tar2tsv vs webdataset + Python writing the same TSV, on the small samples; tarcreate as a note.

Both sides run as their own process (start-up and imports included, ~0.1-0.5 s) and write the
same table to a file; the tables must be byte-identical.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from common import Context, Row, alternate, log, spread, timed, yes_no

SECTION = "tables"
SPEC = "__key__ cls txt:size"

WEBDATASET_TSV = """
import sys
import webdataset as wds
path, out = sys.argv[1], sys.argv[2]
with open(out, "w", encoding="utf-8") as f:
    f.write("__key__\\tcls\\ttxt:size\\n")
    for s in wds.WebDataset(path, shardshuffle=False):
        f.write(f"{s['__key__']}\\t{s['cls'].decode()}\\t{len(s['txt'])}\\n")
"""


def _rows(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f) - 1


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    small, n = ctx.data.small, ctx.data.small_samples
    ours, theirs = ctx.out_dir / "tar2tsv.tsv", ctx.out_dir / "wds.tsv"

    def tar2tsv() -> int:
        subprocess.run([sys.executable, "-m", "tarproc.cli.tar2tsv", str(small), "-f", SPEC, "-q", "-o", str(ours)],
                       check=True)
        return _rows(ours)

    def webdataset() -> int:
        subprocess.run([sys.executable, "-c", WEBDATASET_TSV, str(small), str(theirs)], check=True)
        return _rows(theirs)

    log(f"tables: tar2tsv -f '{SPEC}' vs webdataset + Python, {n} samples")
    ta, tb = alternate(ctx.reps, ctx.slow_reps, tar2tsv, webdataset, n, "tar2tsv")
    if ours.read_bytes() != theirs.read_bytes():
        raise RuntimeError("tar2tsv and the webdataset baseline wrote different tables")
    med = sorted(ta)[len(ta) // 2]
    base = sorted(tb)[len(tb) // 2]
    rows = [
        Row(f"tar2tsv -f '{SPEC}' ({n} samples)", n / med, "samples/s", "webdataset 1.0.2 + Python TSV",
            n / base, "≥ 1× webdataset", yes_no(n / med >= n / base)),
    ]
    notes = [f"tables tar2tsv: {spread(ta)}", f"tables webdataset: {spread(tb)}"]

    # tarcreate: the table of the text fields back into a tar (one pass; no baseline)
    table, back = ctx.out_dir / "text.tsv", ctx.out_dir / "back.tar"
    subprocess.run([sys.executable, "-m", "tarproc.cli.tar2tsv", str(small), "-f", "__key__ cls", "-q",
                    "-o", str(table)], check=True)
    t, _ = timed(lambda: subprocess.run([sys.executable, "-m", "tarproc.cli.tarcreate", str(table), "-q",
                                         "-o", str(back)], check=True))
    notes.append(f"tables tarcreate: {n} rows (__key__, cls) -> tar in {t:.2f} s = {n / t:,.0f} samples/s (one run)")
    return rows, notes
