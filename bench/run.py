"""tarproc benchmark: tarproc against its baselines, measured in the same run, printed as one table.

Usage (from the repository root)::

    make bench                                  # = .venv/bin/python bench/run.py
    .venv/bin/python bench/run.py --quick       # small data, 2 repetitions: a smoke test (< 60 s)
    .venv/bin/python bench/run.py --reps 9      # more repetitions of every measure

Data is generated once, deterministically, under ``bench-data/`` (``bench-data/quick/`` for
``--quick``) and reused while its manifest matches. Every file is read once before timing, so all
reads come from the page cache. Each measure and its baseline are timed alternately, repetition by
repetition, and the median is reported. See bench/README.md for what each row means.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import io
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # tarcat and tarsplit are installed next to the venv's python
GNU_TAR = shutil.which("tar", path="/usr/bin:/bin") or "tar"
DATA_VERSION = 1  # bump when the generator changes, so old data is regenerated

# reps: repetitions of most measures; slow_reps: of the ~10 s baselines (webdataset and tarfile on the
# small file); fast_reps: of the ~20 ms JPEG read, whose single timings are the noisiest
FULL = {"small": 100_000, "jpeg": 1000, "big_repeat": 10, "reps": 5, "slow_reps": 3, "fast_reps": 20}
QUICK = {"small": 10_000, "jpeg": 200, "big_repeat": 5, "reps": 2, "slow_reps": 2, "fast_reps": 3}


# ------------------------------------------------------------------------------------------------
# helpers


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def warm(path: Path) -> None:
    """Read a file once so that timed reads come from the page cache."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    gc.collect()
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def sh(cmd: str, **kw: Any) -> None:
    """Run a bash command line; any failing stage of a pipeline is an error."""
    proc = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"command failed with status {proc.returncode}: {cmd}")


def fmt_rate(value: float, unit: str) -> str:
    if unit == "GB/s":
        return f"{value:.2f} GB/s"
    return f"{value:,.0f} {unit}"


def spread(times: list[float]) -> str:
    return f"median {statistics.median(times):.3f} s, min {min(times):.3f}, max {max(times):.3f} ({len(times)} reps)"


# ------------------------------------------------------------------------------------------------
# data


def make_jpegs(n: int, seed: int = 1234) -> list[bytes]:
    """``n`` deterministic 500x375 JPEGs of ~100 KB: smooth colour fields plus grain, quality 90.

    The grain level varies per image (sizes ~60-125 KB, mean ~100 KB), like ImageNet's spread.
    """
    import numpy as np
    from PIL import Image

    out = []
    w, h = 500, 375
    for i in range(n):
        rng = np.random.default_rng([seed, i])
        coarse = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        mid = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        base = np.asarray(Image.fromarray(coarse).resize((w, h), Image.Resampling.BICUBIC), dtype=np.float32)
        detail = np.asarray(Image.fromarray(mid).resize((w, h), Image.Resampling.BILINEAR), dtype=np.float32)
        noise = rng.uniform(8.0, 30.0)
        pixels = 0.6 * base + 0.4 * detail + rng.normal(0.0, noise, (h, w, 3))
        buf = io.BytesIO()
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def write_tar(path: Path, samples: Any) -> int:
    """Write samples with tarproc's TarWriter to ``path`` (atomically); returns the sample count."""
    import tarproc

    tmp = path.with_name(path.name + ".tmp")
    n = 0
    with open(tmp, "wb", buffering=1 << 20) as f:
        writer = tarproc.TarWriter(f)
        for sample in samples:
            writer.write_sample(sample)
            n += 1
        writer.close()
    os.replace(tmp, path)
    return n


@dataclass
class Data:
    small: Path  # N small samples: .cls + .txt (1000 random bytes)
    small_samples: int
    jpeg: Path  # M JPEG samples: .cls + .jpg (~100 KB)
    jpeg_samples: int
    big: Path  # the JPEG samples repeated with distinct keys: ~1 GB
    big_samples: int

    def members(self, which: str) -> int:
        return 2 * getattr(self, which + "_samples")  # every sample has two fields


def data_config(cfg: dict[str, int]) -> dict[str, Any]:
    import PIL

    return {
        "version": DATA_VERSION,
        "small": cfg["small"],
        "jpeg": cfg["jpeg"],
        "big_repeat": cfg["big_repeat"],
        "pillow": PIL.__version__,
    }


def need_bytes(cfg: dict[str, int]) -> int:
    """Disk the data and the pipeline's output need at most (a generous estimate)."""
    small = cfg["small"] * 2560
    jpeg = cfg["jpeg"] * 130_000
    big = jpeg * cfg["big_repeat"]
    return small + jpeg + 2 * big + (64 << 20)


def prepare_data(directory: Path, cfg: dict[str, int]) -> Data:
    directory.mkdir(parents=True, exist_ok=True)
    manifest_path = directory / "manifest.json"
    want = data_config(cfg)
    paths = {"small": directory / "small.tar", "jpeg": directory / "jpeg.tar", "big": directory / "big.tar"}
    counts = {
        "small": cfg["small"],
        "jpeg": cfg["jpeg"],
        "big": cfg["jpeg"] * cfg["big_repeat"],
    }
    data = Data(paths["small"], counts["small"], paths["jpeg"], counts["jpeg"], paths["big"], counts["big"])
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = None
    if (
        manifest is not None
        and manifest.get("config") == want
        and all(p.exists() and p.stat().st_size == manifest["sizes"][k] for k, p in paths.items())
    ):
        log(f"reusing data in {directory}")
        return data

    usage = shutil.disk_usage(directory)
    if usage.free < need_bytes(cfg):
        sys.exit(
            f"not enough disk space in {directory}: {usage.free / 1e9:.1f} GB free, "
            f"the benchmark needs about {need_bytes(cfg) / 1e9:.1f} GB"
        )
    manifest_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    log(f"generating data in {directory} ...")

    import numpy as np

    rng = np.random.default_rng(42)
    n = cfg["small"]
    blob = rng.bytes(1000 * n)
    write_tar(
        paths["small"],
        ({"__key__": f"s{i:07d}", "txt": blob[1000 * i : 1000 * (i + 1)], "cls": str(i % 1000)} for i in range(n)),
    )
    log(f"  {paths['small'].name}: {n} samples ({time.perf_counter() - t0:.1f} s)")

    jpegs = make_jpegs(cfg["jpeg"])
    labels = [int(x) for x in rng.integers(0, 1000, len(jpegs))]
    write_tar(paths["jpeg"], ({"__key__": f"j{i:07d}", "jpg": b, "cls": labels[i]} for i, b in enumerate(jpegs)))
    mean_kb = sum(map(len, jpegs)) / len(jpegs) / 1e3
    log(f"  {paths['jpeg'].name}: {len(jpegs)} JPEGs, mean {mean_kb:.1f} KB ({time.perf_counter() - t0:.1f} s)")

    def big_samples() -> Any:
        k = 0
        for _ in range(cfg["big_repeat"]):
            for i, b in enumerate(jpegs):
                yield {"__key__": f"b{k:08d}", "jpg": b, "cls": labels[i]}
                k += 1

    write_tar(paths["big"], big_samples())
    log(f"  {paths['big'].name}: {counts['big']} samples ({time.perf_counter() - t0:.1f} s)")

    sizes = {k: p.stat().st_size for k, p in paths.items()}
    manifest_path.write_text(json.dumps({"config": want, "sizes": sizes}, indent=1) + "\n")
    return data


# ------------------------------------------------------------------------------------------------
# the readers being timed


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
import tarproc, tarproc.tario
assert tarproc.tario._scan is None, "TARPROC_PURE_PYTHON=1 did not disable the C fast path"
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


# ------------------------------------------------------------------------------------------------
# the table


@dataclass
class Row:
    measure: str
    value: float  # tarproc's throughput
    unit: str
    baseline: str
    base_value: float
    target: str
    met: str  # "yes", "no" or "—"

    def cells(self) -> list[str]:
        ratio = self.value / self.base_value if self.base_value else float("nan")
        return [
            self.measure,
            fmt_rate(self.value, self.unit),
            self.baseline,
            fmt_rate(self.base_value, self.unit),
            f"{ratio:.2f}×",
            self.target,
            self.met,
        ]


def print_table(rows: list[Row]) -> None:
    header = ["measure", "tarproc", "baseline", "baseline figure", "ratio", "target", "met?"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] * len(header)) + "|")
    for row in rows:
        print("| " + " | ".join(row.cells()) + " |")


def yes_no(ok: bool) -> str:
    return "yes" if ok else "**no**"


# ------------------------------------------------------------------------------------------------
# measures


def alternate(
    reps_a: int, reps_b: int, a: Callable[[], Any], b: Callable[[], Any], expect: int, what: str
) -> tuple[list[float], list[float]]:
    """Time ``a`` (tarproc) and ``b`` (baseline) alternately, ``reps_a`` and ``reps_b`` times.

    Both must return ``expect`` (a count of what they read). Returns both lists of times.
    """
    ta: list[float] = []
    tb: list[float] = []
    for r in range(max(reps_a, reps_b)):
        line = f"  rep {r + 1}:"
        if r < reps_a:
            t, n = timed(a)
            if n != expect:
                raise RuntimeError(f"{what}: tarproc counted {n}, expected {expect}")
            ta.append(t)
            line += f" tarproc {t:.3f} s"
        if r < reps_b:
            t, n = timed(b)
            if n != expect:
                raise RuntimeError(f"{what}: baseline counted {n}, expected {expect}")
            tb.append(t)
            line += f" baseline {t:.3f} s"
        log(line)
    return ta, tb


def run(args: argparse.Namespace) -> int:
    cfg = dict(QUICK if args.quick else FULL)
    if args.reps is not None:
        cfg["reps"] = cfg["slow_reps"] = cfg["fast_reps"] = args.reps
    reps, slow_reps, fast_reps = cfg["reps"], cfg["slow_reps"], cfg["fast_reps"]
    directory = Path(args.data) if args.data else ROOT / "bench-data" / ("quick" if args.quick else "")
    directory = directory.resolve()
    start = time.perf_counter()

    import webdataset

    import tarproc
    import tarproc.tario

    tarcat, tarsplit = BIN / "tarcat", BIN / "tarsplit"
    for tool in (tarcat, tarsplit):
        if not tool.exists():
            sys.exit(f"{tool} not found: run `make install` first")
    if tarproc.tario._scan is None:
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
            gbs, "GB/s", wds_name, wds_gbs, "≥ 2 GB/s", yes_no(gbs >= 2.0),
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
        t, _ = timed(lambda: sh(pipeline))
        ta.append(t)
        shards = sorted(out_dir.glob("y-*.tar"))
        written = sum(p.stat().st_size for p in shards)
        # the output holds the same members; only end blocks and record padding may differ per shard
        if not shards or abs(written - big_size) > 20480 * len(shards):
            raise RuntimeError(f"tarsplit wrote {len(shards)} shards, {written} bytes, from {big_size} bytes")
        if r == 0:
            got = sum(1 for p in shards for _ in tarproc.read_samples(str(p)))
            if got != n:
                raise RuntimeError(f"tarsplit's shards hold {got} samples, expected {n}")
        clear_out()
        t, _ = timed(lambda: sh(copy))
        tb.append(t)
        check_copy()
        t, _ = timed(lambda: sh(piped_copy))
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
            "information: any two-process pipe's ceiling here", "—",
        )
    )
    notes.append(f"pipeline (writing to {out_dir.parent}): tarcat|tarsplit {spread(ta)}; cat {spread(tb)}; cat | cat {spread(tc)}")

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
            tarcat_ms, "members/s", "GNU `tar -xOf small.tar > /dev/null`", gnu_ms, "report ratio (tar = ceiling)", "—",
        )
    )
    notes.append(f"tarcat small: tarcat {spread(ta)}; GNU tar -xO {spread(tb)}")

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

    shutil.rmtree(out_dir, ignore_errors=True)

    # report ---------------------------------------------------------------------------------------
    total = time.perf_counter() - start
    print()
    print(f"tarproc benchmark{' (--quick)' if args.quick else ''}: {machine()}")
    print(
        f"data: {directory}; small.tar {data.small.stat().st_size / 1e6:.0f} MB, "
        f"jpeg.tar {data.jpeg.stat().st_size / 1e6:.0f} MB, big.tar {big_size / 1e9:.2f} GB; "
        f"medians of {reps} reps ({slow_reps} for the ~10 s baselines, {fast_reps} for the JPEG read); "
        "1 GB = 1e9 bytes"
    )
    print()
    print_table(rows)
    print()
    for note in notes:
        print(f"- {note}")
    print()
    print(f"total time: {total:.1f} s")
    return 0


def machine() -> str:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 0
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import tarproc.tario

    fast = "C fast path" if tarproc.tario._scan is not None else "pure Python"
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    if commit:
        fast += f", commit {commit}"
    tar_version = subprocess.run([GNU_TAR, "--version"], capture_output=True, text=True).stdout.split("\n", 1)[0]
    return (
        f"nproc {cpus}{f' ({model})' if model else ''}, Python {platform.python_version()} "
        f"({platform.python_implementation()}), {platform.system()} {platform.release()}, "
        f"tarproc {tarproc.__version__} ({fast}), {tar_version}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small data and 2 repetitions: a smoke test (< 60 s)")
    parser.add_argument("--reps", type=int, default=None, metavar="N", help="repetitions of every measure")
    parser.add_argument("--data", metavar="DIR", help="where to generate and keep the data (default bench-data/)")
    parser.add_argument(
        "--out", metavar="DIR",
        help="where the pipeline measure writes its ~1 GB (default: the data directory; /dev/shm takes the disk out)",
    )
    args = parser.parse_args()
    if args.reps is not None and args.reps < 1:
        parser.error("--reps must be at least 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
