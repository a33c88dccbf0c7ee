"""The core's measures (issue 2): reading samples, the tarcat | tarsplit pipeline, members/s.

Rows: read_samples vs webdataset on small samples and on JPEGs, tarcat | tarsplit vs cat, tarcat >
/dev/null vs cat, tarcat vs GNU tar -xO, tarcat | tarsplit -n on small members, the pure-Python
reader, iter_members vs tarfile.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
from pathlib import Path

from common import BIN, GNU_TAR, Context, Row, alternate, log, sh, spread, timed, timed_write, yes_no

SECTION = "core"


def count_tarproc(path: Path) -> int:
    import tarproc

    n = 0
    for _ in tarproc.read_samples(str(path)):
        n += 1
    return n


def count_webdataset(path: Path) -> int:
    import webdataset

    n = 0
    for _ in webdataset.WebDataset(str(path), shardshuffle=False):
        n += 1
    return n


def count_tarfile(path: Path) -> int:
    """Members of a tar file with Python's tarfile, reading every member's data."""
    n = 0
    with tarfile.open(path, "r:") as tf:
        for info in tf:
            if info.isfile():
                f = tf.extractfile(info)
                assert f is not None
                f.read()
                n += 1
    return n


PURE_PYTHON_CHILD = """
import gc, json, sys, time
import tarproc, tarproc.tar.reader
assert tarproc.tar.reader._scan is None, "TARPROC_PURE_PYTHON=1 did not disable the C fast path"
path, reps, expect = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
times = []
for _ in range(reps):
    gc.collect()
    t0 = time.perf_counter()
    n = 0
    for _ in tarproc.read_samples(path):
        n += 1
    times.append(time.perf_counter() - t0)
    assert n == expect, (n, expect)
print(json.dumps(times))
"""


def pure_python_times(path: Path, reps: int, expect: int) -> list[float]:
    """read_samples with the C fast path disabled, timed inside a child process (startup excluded)."""
    env = dict(os.environ, TARPROC_PURE_PYTHON="1")
    out = subprocess.run(
        [sys.executable, "-c", PURE_PYTHON_CHILD, str(path), str(reps), str(expect)],
        env=env,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    return [float(t) for t in json.loads(out.strip().splitlines()[-1])]



def check_samples(shards: list[Path], expect: int) -> None:
    """That the shards tarsplit wrote hold the samples they should (checked once per measure)."""
    import tarproc

    got = sum(1 for p in shards for _ in tarproc.read_samples(str(p)))
    if got != expect:
        raise RuntimeError(f"tarsplit's shards hold {got} samples, expected {expect}")


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    import webdataset

    import tarproc

    data, out_dir = ctx.data, ctx.out_dir
    reps, slow_reps, fast_reps = ctx.reps, ctx.slow_reps, ctx.fast_reps
    tarcat, tarsplit = BIN / "tarcat", BIN / "tarsplit"
    big_size = data.big.stat().st_size
    rows: list[Row] = []
    notes: list[str] = []
    wds_name = f"webdataset {getattr(webdataset, '__version__', '?')}"

    # 1. read_samples, small samples, vs webdataset -------------------------------------------
    n = data.small_samples
    log(f"[1/6] read_samples vs webdataset on {n:,} small samples ({reps} and {slow_reps} reps)")
    ta, tb = alternate(
        reps, slow_reps, lambda: count_tarproc(data.small), lambda: count_webdataset(data.small), n, "small read"
    )
    tp_small, wds_small = n / statistics.median(ta), n / statistics.median(tb)
    rows.append(
        Row(
            f"`read_samples`, {n:,} small samples (1 KB .txt + .cls)",
            tp_small, "samples/s", wds_name, wds_small, "≥ 20×", yes_no(tp_small >= 20 * wds_small),
        )
    )
    notes.append(f"small read: tarproc {spread(ta)}; webdataset {spread(tb)}")

    # 2. read_samples, JPEG samples, GB/s ---------------------------------------------------------
    n = data.jpeg_samples
    size = data.jpeg.stat().st_size
    log(f"[2/6] read_samples vs webdataset on {n:,} JPEG samples, {size / 1e6:.0f} MB ({fast_reps} reps)")
    ta, tb = alternate(
        fast_reps, fast_reps, lambda: count_tarproc(data.jpeg), lambda: count_webdataset(data.jpeg), n, "jpeg read"
    )
    gbs, wds_gbs = size / 1e9 / statistics.median(ta), size / 1e9 / statistics.median(tb)
    rows.append(
        Row(
            f"`read_samples`, {n:,} JPEG samples (~100 KB), {size / 1e6:.0f} MB tar",
            gbs, "GB/s", wds_name, wds_gbs, "≥ 5 GB/s", yes_no(gbs >= 5.0),
        )
    )
    notes.append(f"jpeg read: tarproc {spread(ta)}; webdataset {spread(tb)}")

    # 3. tarcat | tarsplit pass-through vs cat ---------------------------------------------------
    n = data.big_samples
    log(f"[3/6] tarcat | tarsplit vs cat on {big_size / 1e9:.2f} GB, {n:,} samples ({reps} reps)")
    q_big, q_out = shlex.quote(str(data.big)), shlex.quote(str(out_dir))
    pipeline = f"{shlex.quote(str(tarcat))} {q_big} | {shlex.quote(str(tarsplit))} -s 1e9 -o {q_out}/y-%06d.tar"
    copy = f"cat {q_big} > {q_out}/y.tar"
    piped_copy = f"cat {q_big} | cat > {q_out}/y.tar"  # information: what a pipe into a file costs here

    def clear_out() -> None:
        for p in out_dir.iterdir():
            p.unlink()

    def check_copy() -> None:
        if (out_dir / "y.tar").stat().st_size != big_size:
            raise RuntimeError("cat wrote the wrong size")
        clear_out()

    ta, tb, tc = [], [], []
    for r in range(reps):
        t, _ = timed_write(lambda: sh(pipeline))
        ta.append(t)
        shards = sorted(out_dir.glob("y-*.tar"))
        written = sum(p.stat().st_size for p in shards)
        # the output holds the same members; only end blocks and record padding may differ per shard
        if not shards or abs(written - big_size) > 20480 * len(shards):
            raise RuntimeError(f"tarsplit wrote {len(shards)} shards, {written} bytes, from {big_size} bytes")
        if r == 0:
            check_samples(shards, n)
        clear_out()
        t, _ = timed_write(lambda: sh(copy))
        tb.append(t)
        check_copy()
        t, _ = timed_write(lambda: sh(piped_copy))
        tc.append(t)
        check_copy()
        log(
            f"  rep {r + 1}/{reps}: pipeline {ta[-1]:.3f} s ({len(shards)} shards), cat {tb[-1]:.3f} s, "
            f"cat | cat {tc[-1]:.3f} s"
        )
    gbs, cat_gbs = big_size / 1e9 / statistics.median(ta), big_size / 1e9 / statistics.median(tb)
    rows.append(
        Row(
            f"`tarcat x.tar \\| tarsplit -s 1e9`, {big_size / 1e9:.2f} GB, {n:,} samples",
            gbs, "GB/s", "`cat x.tar > y`", cat_gbs, "≥ 1 GB/s", yes_no(gbs >= 1.0),
        )
    )
    rows.append(
        Row(
            "the same pipeline against a pipe that does no tar work",
            gbs, "GB/s", "`cat x.tar \\| cat > y`", big_size / 1e9 / statistics.median(tc),
            "≥ 0.8× (issue 13)", yes_no(statistics.median(ta) <= statistics.median(tc) / 0.8),
        )
    )
    notes.append(f"pipeline (writing to {out_dir.parent}): tarcat|tarsplit {spread(ta)}; cat {spread(tb)}; cat | cat {spread(tc)}")

    # 3a. tarsplit --manifest (sha256 of every shard) vs without ---------------------------------
    log(f"[3a] tarsplit -s 1e9 --manifest vs without, reading {big_size / 1e9:.2f} GB ({reps} reps)")
    plain = f"{shlex.quote(str(tarsplit))} -s 1e9 -o {q_out}/y-%06d.tar < {q_big}"
    with_manifest = f"{plain} --manifest {q_out}/m.json"
    ta, tb = [], []
    for r in range(reps):
        t, _ = timed_write(lambda: sh(with_manifest))
        ta.append(t)
        lines = (out_dir / "m.json").read_text().splitlines()
        if not lines or not all(json.loads(line).get("sha256") for line in lines):
            raise RuntimeError("tarsplit --manifest wrote no sha256")
        clear_out()
        t, _ = timed_write(lambda: sh(plain))
        tb.append(t)
        clear_out()
        log(f"  rep {r + 1}/{reps}: --manifest {ta[-1]:.3f} s, without {tb[-1]:.3f} s")
    rows.append(
        Row(
            f"`tarsplit -s 1e9 --manifest m.json < x.tar`, {big_size / 1e9:.2f} GB (sha256 of every shard)",
            big_size / 1e9 / statistics.median(ta), "GB/s", "the same without `--manifest`",
            big_size / 1e9 / statistics.median(tb), "≥ 0.90× (within 10 %)",
            yes_no(statistics.median(ta) <= 1.1 * statistics.median(tb)),
        )
    )
    notes.append(f"tarsplit --manifest: {spread(ta)}; without: {spread(tb)}")

    # 3b. tarcat > /dev/null on the big tar vs cat ---------------------------------------------------
    log(f"[3b] tarcat > /dev/null vs cat > /dev/null on {big_size / 1e9:.2f} GB ({reps} reps)")
    ta, tb = [], []
    for r in range(reps):
        t, _ = timed(lambda: subprocess.run([str(tarcat), str(data.big)], stdout=subprocess.DEVNULL, check=True))
        ta.append(t)
        t, _ = timed(lambda: subprocess.run(["cat", str(data.big)], stdout=subprocess.DEVNULL, check=True))
        tb.append(t)
        log(f"  rep {r + 1}/{reps}: tarcat {ta[-1]:.3f} s, cat {tb[-1]:.3f} s")
    gbs, cat_gbs = big_size / 1e9 / statistics.median(ta), big_size / 1e9 / statistics.median(tb)
    rows.append(
        Row(
            f"`tarcat x.tar > /dev/null`, {big_size / 1e9:.2f} GB",
            gbs, "GB/s", "`cat x.tar > /dev/null`", cat_gbs, "≥ 0.6× cat", yes_no(gbs >= 0.6 * cat_gbs),
        )
    )
    notes.append(f"tarcat big > /dev/null: tarcat {spread(ta)}; cat {spread(tb)}")

    # 4. tarcat members/s on small samples vs GNU tar -xO -------------------------------------
    m = data.members("small")
    log(f"[4/6] tarcat vs GNU tar -xO on {m:,} small members ({reps} reps)")
    ta, tb = [], []
    for r in range(reps):
        t, _ = timed(lambda: subprocess.run([str(tarcat), str(data.small)], stdout=subprocess.DEVNULL, check=True))
        ta.append(t)
        t, _ = timed(lambda: subprocess.run([GNU_TAR, "-xOf", str(data.small)], stdout=subprocess.DEVNULL, check=True))
        tb.append(t)
        log(f"  rep {r + 1}/{reps}: tarcat {ta[-1]:.3f} s, tar -xO {tb[-1]:.3f} s")
    tarcat_ms, gnu_ms = m / statistics.median(ta), m / statistics.median(tb)
    rows.append(
        Row(
            f"`tarcat small.tar > /dev/null`, {m:,} members",
            tarcat_ms, "members/s", "GNU `tar -xOf small.tar > /dev/null`", gnu_ms, "≥ 0.5×",
            yes_no(tarcat_ms >= 0.5 * gnu_ms),
        )
    )
    notes.append(f"tarcat small: tarcat {spread(ta)}; GNU tar -xO {spread(tb)}")

    # 4b. tarcat small | tarsplit -n 10000 (the writer on small members) ---------------------------
    # baselines: GNU tar writing the same members from a directory (the target), and a
    # pipe that does no tar work at all (information)
    log(f"[4b] tarcat small.tar | tarsplit -n 10000 vs tar -cf - -C dir . | split, and cat | split, on {m:,} "
        f"small members ({reps} reps)")
    q_small = shlex.quote(str(data.small))
    tree = out_dir / "small-tree"
    tree.mkdir()
    subprocess.run([GNU_TAR, "-xf", str(data.small), "-C", str(tree)], check=True)  # in the page cache from now on
    split_pipe = f"{shlex.quote(str(tarcat))} {q_small} | {shlex.quote(str(tarsplit))} -n 10000 -o {q_out}/z-%06d.tar"
    split_tar = f"{GNU_TAR} -cf - -C {shlex.quote(str(tree))} . | split -b 10M - {q_out}/t-"
    split_copy = f"cat {q_small} | split -b 10M - {q_out}/c-"

    def clear_splits() -> None:
        for path in out_dir.glob("[ztc]-*"):
            path.unlink()

    ta, tt, tb = [], [], []
    for r in range(reps):
        t, _ = timed_write(lambda: sh(split_pipe))
        ta.append(t)
        if r == 0:
            check_samples(sorted(out_dir.glob("z-*.tar")), data.small_samples)
        clear_splits()
        t, _ = timed_write(lambda: sh(split_tar))
        tt.append(t)
        clear_splits()
        t, _ = timed_write(lambda: sh(split_copy))
        tb.append(t)
        clear_splits()
        log(f"  rep {r + 1}/{reps}: tarcat | tarsplit -n {ta[-1]:.3f} s, tar -cf | split {tt[-1]:.3f} s, "
            f"cat | split {tb[-1]:.3f} s")
    shutil.rmtree(tree)
    clear_out()
    a, t_, b = (m / statistics.median(x) for x in (ta, tt, tb))
    rows.append(
        Row(
            f"`tarcat small.tar \\| tarsplit -n 10000`, {m:,} members",
            a, "members/s", "GNU `tar -cf - -C dir . \\| split -b 10M` (the same members as files)", t_,
            "≥ 1.2×", yes_no(a >= 1.2 * t_),
        )
    )
    rows.append(
        Row(
            "the same pipeline against a pipe that does no tar work", a, "members/s",
            "`cat small.tar \\| split -b 10M`", b, "information", "—",
        )
    )
    notes.append(f"tarcat small | tarsplit -n: {spread(ta)}; tar -cf - -C dir . | split {spread(tt)}; "
                 f"cat | split {spread(tb)}")

    # 5. pure-Python reader (information) --------------------------------------------------------
    n = data.small_samples
    log(f"[5/6] read_samples with TARPROC_PURE_PYTHON=1 on {n:,} small samples ({reps} reps, child process)")
    tp = pure_python_times(data.small, reps, n)
    pure = n / statistics.median(tp)
    rows.append(
        Row(
            f"`read_samples`, pure Python (`TARPROC_PURE_PYTHON=1`), {n:,} small samples",
            pure, "samples/s", f"{wds_name} (row 1)", wds_small, "information", "—",
        )
    )
    notes.append(f"pure Python: {spread(tp)}")

    # 6. tarfile members/s (information) -------------------------------------------------------------
    m = data.members("small")
    log(f"[6/6] tarproc iter_members vs Python tarfile on {m:,} small members ({reps} and {slow_reps} reps)")

    def count_members() -> int:
        k = 0
        with open(data.small, "rb", buffering=0) as f:
            for _ in tarproc.iter_members(f, str(data.small)):
                k += 1
        return k

    ta, tb = alternate(reps, slow_reps, count_members, lambda: count_tarfile(data.small), m, "members")
    rows.append(
        Row(
            f"`iter_members`, {m:,} small members",
            m / statistics.median(ta), "members/s", "Python `tarfile` (iterate + read data)",
            m / statistics.median(tb), "information", "—",
        )
    )
    notes.append(f"members: tarproc iter_members {spread(ta)}; tarfile {spread(tb)}")

    return rows, notes
