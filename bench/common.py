"""Shared pieces of the benchmark: data, timing, the table row and the context a section gets.

Each section is a module ``bench/bench_<name>.py`` with ``SECTION = "<name>"`` and
``run(ctx: Context) -> tuple[list[Row], list[str]]`` (table rows and note lines); ``bench/run.py``
prepares the data once, runs the sections and prints one table.
"""

from __future__ import annotations

import gc
import io
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
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


def timed_write(fn: Callable[[], Any]) -> tuple[float, Any]:
    """``timed`` for a command that writes files: the dirty pages of the runs before it are written
    back first (``sync``, not timed), so that no run pays for its predecessor's writeback -- with a
    gigabyte written per run, that made the same command's times swing 2-3x from run to run."""
    os.sync()
    return timed(fn)


def sh(cmd: str, **kw: Any) -> None:
    """Run a bash command line; any failing stage of a pipeline is an error."""
    proc = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], **kw)
    if proc.returncode != 0:
        raise RuntimeError(f"command failed with status {proc.returncode}: {cmd}")


def fmt_rate(value: float, unit: str) -> str:
    if unit in ("GB/s", "MB/s") or value < 100:
        return f"{value:,.2f} {unit}"
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


@dataclass
class Context:
    """What every section gets: the data, where to write, and how many repetitions to run."""

    quick: bool
    reps: int  # repetitions of most measures
    slow_reps: int  # of measures whose baseline takes ~10 s a pass
    fast_reps: int  # of measures taking a few ms a pass, whose single timings are the noisiest
    data: Data
    directory: Path  # the data directory; a section may cache data of its own under directory / SECTION
    out_dir: Path  # scratch space, emptied after each section


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


def print_table(rows: list[tuple[str, Row]]) -> None:
    """One markdown table of ``(section, row)`` pairs."""
    header = ["section", "measure", "tarproc", "baseline", "baseline figure", "ratio", "target", "met?"]
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] * len(header)) + "|")
    for section, row in rows:
        print("| " + " | ".join([section, *row.cells()]) + " |")


def yes_no(ok: bool) -> str:
    return "yes" if ok else "**no**"


def alternate(
    reps_a: int, reps_b: int, a: Callable[[], Any], b: Callable[[], Any], expect: int, what: str
) -> tuple[list[float], list[float]]:
    """Time ``a`` (tarproc) and ``b`` (baseline) alternately, ``reps_a`` and ``reps_b`` times.

    Both must return ``expect`` (a count of what they read). Returns both lists of times.
    """
    ta, tb = alternate_many([("tarproc", reps_a, a), ("baseline", reps_b, b)], expect, what)
    return ta, tb


def alternate_many(series: list[tuple[str, int, Callable[[], Any]]], expect: Any, what: str,
                   clock: Callable[[Callable[[], Any]], tuple[float, Any]] | None = None) -> list[list[float]]:
    """``alternate`` for any number of ``(name, reps, run)`` series, repetition by repetition: each
    run must return ``expect``; returns the times of each series. ``clock``: how a run is timed
    (default ``timed``, the whole call; runs that time themselves return ``(seconds, result)``)."""
    clock = clock or timed
    times: list[list[float]] = [[] for _ in series]
    for r in range(max(reps for _, reps, _ in series)):
        line = f"  rep {r + 1}:"
        for (name, reps, run), ts in zip(series, times, strict=True):
            if r < reps:
                t, got = clock(run)
                if got != expect:
                    raise RuntimeError(f"{what}: {name} gave {got!r}, expected {expect!r}")
                ts.append(t)
                line += f" {name} {t:.3f} s"
        log(line)
    return times


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
    import tarproc.tar.reader

    fast = "C fast path" if tarproc.tar.reader._scan is not None else "pure Python"
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
