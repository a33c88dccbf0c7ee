"""Remote shards: read-ahead, the shard cache, reconnecting after a cut, and the raw rate over HTTP.

All over ``tests/faultserver.py``'s ``FaultServer`` on 127.0.0.1 (started here, in this process,
serving the data directory; HTTP/1.1 keep-alive, ranges, ETags, sendfile). Rows:

1. The train section's 2,000 ImageNet-like JPEGs rewritten as 32 small shards (~63 samples, ~6.4
   MB each: shard boundaries come every batch), served with 50 ms added to every request (an
   object store's time to first byte). The workers of a GPU recipe: they read, shuffle and batch
   the encoded JPEGs (``device="gpu"`` decodes them in the main process), batches of 64,
   ``DataLoader(num_workers=2)``, so that what they wait for is the store, the case read-ahead is
   for (with train row 1's CPU decoding the workers' decode time hides most of the latency: row 2's
   recipe). A shuffle buffer of 100 instead of 1,000: a worker's whole share is 1,000 images, so a buffer of 1,000 would read every shard
   before the first batch, where in a real epoch the buffer is a small part of what a reader reads
   and reading goes on between batches. ``lengths=None``: shards as they are usually served, with
   no ``.idx`` beside them (``lengths="auto"`` finds no counts there, says so and reads the same
   way), so each worker reads 16 whole shards. One epoch a repetition, from building the pipeline
   to the last batch, with read-ahead (the default ``prefetch``, 32 MiB: a worker's next 4 shards
   are opened and read by threads while it reads one) against ``prefetch=0``; the same over the
   local files in a note. Target ≥ 1.5×.
2. Later epochs of train row 1's recipe (RandomResizedCrop 224 + flip + normalize on the CPU in the
   workers, shuffle buffer 100, ``lengths=None``) with ``cache_dir=`` (a fresh directory; the first epoch, untimed,
   fills it) against the same recipe over the local files; one Dataset each, built once, its
   epochs alternated. Checked: the cache holds one entry per shard, byte for byte the shard, and a
   timed epoch makes no GET (nor any other request: the versions were asked once, at
   construction). Target ≥ 0.9×.
3. ``tarcat`` (a subprocess, as users run it) of the train section's 4 shards (~51 MB each) over
   HTTP with no added latency, each shard's connection cut once in its middle
   (``server.cut(path, after=size // 2)`` before every run), against the same with no fault:
   MB/s, and the cost of a reconnect in ms (what a user waits: a connection that had been giving
   bytes is reopened at once, the backoff starts at a second failure). A note gives the reconnect's own cost, a
   read of the same URLs in this process with ``Network(backoff=0)``. Every pass checks that the
   output is byte for byte ``tarcat`` of the local files, that every shard took exactly one retry,
   and that the retry GET asked ``Range: bytes=N-`` from the byte reached. Report.
4. ``tarcat URL -o /dev/null`` of ``big.tar`` (~1 GB) over loopback HTTP (no added latency)
   against ``curl -s URL -o /dev/null``. Checked: one GET, all its bytes sent, tarcat's count of
   samples (``--stats``), curl's byte count. A note gives ``tarcat --prefetch 0`` of the URL and
   ``tarcat`` of the local file, timed in the same rounds. Target ≥ 0.8×.

Rows 1 and 2 count images per second (every batch checked: 224x224 CHW, one label per image, and
the 2,000 images an epoch); rows 3 and 4 bytes of the shards per second, the commands' start-up
included. Rows 3's and 4's commands are timed alone (the output checks come after the clock stops).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_train import REPEAT, count_batches, make_shards
from common import BIN, ROOT, Context, Row, alternate_many, log, spread, warm, write_tar, yes_no

SECTION = "network"
SHARDS = 32  # row 1: the train section's JPEGs in this many shards
LATENCY = 0.05  # rows 1-2: seconds the server waits before each answer
SHUFFLE = 100  # rows 1-2: the shuffle buffer (see the docstring)
WORKERS = 2

# ------------------------------------------------------------------------------------------------
# the recipe (user code)


def remote_loader(url: str, decode: bool = True, **network: Any) -> Any:
    """Train row 1's recipe with a shuffle buffer of SHUFFLE, no counts (``lengths=None``);
    ``decode=False``: the workers of a GPU recipe, which batch the encoded JPEGs (``device="gpu"``
    decodes them in the main process); ``network``: the Dataset's ``prefetch``, ``cache_dir``..."""
    import torch

    import tarproc
    from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec

    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")
    ds = tarproc.Dataset(url, decode=spec if decode else None, shuffle=SHUFFLE, to_tuple=("jpg", "cls"), batch_size=64, lengths=None,
                         **network)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=WORKERS)


def epoch(make: Callable[[], Any]) -> Callable[[], int]:
    return lambda: count_batches(make(), lambda b: b[0], lambda b: b[1])


def encoded_epoch(make: Callable[[], Any]) -> Callable[[], int]:
    """An epoch of batches of encoded JPEGs (``decode=False``); checked: JPEG bytes, one label each."""

    def run() -> int:
        n = 0
        for images, labels in make():
            if len(labels) != len(images) or not all(bytes(i[:2]) == b"\xff\xd8" for i in images):
                raise RuntimeError(f"bad batch: {len(images)} images, {len(labels)} labels")
            n += len(images)
        return n

    return run


# ------------------------------------------------------------------------------------------------
# helpers


def fault_server(root: Path, latency: float = 0.0) -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from faultserver import FaultServer
    finally:
        sys.path.remove(str(ROOT / "tests"))
    return FaultServer(root, latency=latency)


def rate(n: float, times: list[float]) -> float:
    return n / statistics.median(times)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def small_shards(ctx: Context, train_url: str) -> list[Path]:
    """The train section's samples, in order, as SHARDS shards of (nearly) equal counts under
    ctx.directory / SECTION; made once."""
    import tarproc
    from tarproc.sources import expand_urls

    directory = ctx.directory / SECTION
    stamp = directory / "source.json"
    n = ctx.data.jpeg_samples * REPEAT
    train = expand_urls([train_url])
    source = {"train": [Path(u).stat().st_size for u in train], "samples": n, "shards": SHARDS}
    paths = [directory / f"small-{i:06d}.tar" for i in range(SHARDS)]
    try:
        if json.loads(stamp.read_text()) == source and all(p.exists() for p in paths):
            return paths
    except (OSError, ValueError):
        pass
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    samples = (s for url in train for s in tarproc.read_samples(url))
    written = 0
    for i, path in enumerate(paths):
        count = (i + 1) * n // SHARDS - i * n // SHARDS
        written += write_tar(path, itertools.islice(samples, count))
    if written != n or next(samples, None) is not None:
        raise RuntimeError(f"network: wrote {written} samples in {SHARDS} shards, expected {n}")
    stamp.write_text(json.dumps(source) + "\n")
    log(f"network: wrote {n} samples in {SHARDS} shards in {directory}")
    return paths


def self_timed(run: Callable[[], tuple[float, Any]]) -> tuple[float, Any]:
    """``alternate_many``'s clock for runs that time themselves (the command alone, not the checks after it)."""
    return run()


def command(argv: list[str], **kw: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    """Run a command, timed (after a ``sync``, not timed: see common.timed_write); fails on a non-zero status."""
    os.sync()
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, **kw)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} ... exited with status {proc.returncode}: {proc.stderr[-2000:]}")
    return seconds, proc


# ------------------------------------------------------------------------------------------------


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    rows: list[Row] = []
    notes: list[str] = []
    train_url = make_shards(ctx)
    paths = small_shards(ctx, train_url)
    for p in paths:
        warm(p)
    with fault_server(ctx.directory, latency=LATENCY) as server:
        dataset_rows(ctx, server, paths, rows, notes)
    with fault_server(ctx.directory) as server:
        reconnect_rows(ctx, server, train_url, rows, notes)
        raw_rows(ctx, server, rows, notes)
    return rows, notes


def dataset_rows(ctx: Context, server: Any, paths: list[Path], rows: list[Row], notes: list[str]) -> None:
    n = ctx.data.jpeg_samples * REPEAT
    reps = ctx.reps
    span = f"{{{0:06d}..{SHARDS - 1:06d}}}"
    url = f"{server.url}/{SECTION}/small-{span}.tar"
    local_url = str(paths[0].parent / f"small-{span}.tar")
    per_shard = n / SHARDS
    mb = statistics.mean(p.stat().st_size for p in paths) / 1e6
    workers = f"{WORKERS} DataLoader workers"

    # -- 1: read-ahead vs none --
    log(f"network: Dataset over HTTP ({LATENCY * 1e3:.0f} ms a request), {n} JPEGs in {SHARDS} shards, {workers}: "
        "read-ahead (default) vs prefetch=0")
    def ahead() -> Any:
        return remote_loader(url, decode=False)

    def none() -> Any:
        return remote_loader(url, decode=False, prefetch=0)

    def on_disk() -> Any:
        return remote_loader(local_url, decode=False)

    for make in (ahead, none, on_disk):
        if encoded_epoch(make)() != n:  # warm-up, untimed: the imports, the server's first connections
            raise RuntimeError(f"warm-up: the Dataset did not deliver {n} images")
    t_ahead, t_none, t_disk = alternate_many([("prefetch (default)", reps, encoded_epoch(ahead)),
                                              ("prefetch=0", reps, encoded_epoch(none)),
                                              ("local files", reps, encoded_epoch(on_disk))], n, "read-ahead")
    ours, base = rate(n, t_ahead), rate(n, t_none)
    rows.append(Row(f"`Dataset` over HTTP ({LATENCY * 1e3:.0f} ms a request), {SHARDS} shards of ~{per_shard:.0f} "
                    f"JPEGs (~{mb:.1f} MB), `lengths=None`, shuffle {SHUFFLE}, the encoded JPEGs batched (a GPU "
                    f"recipe's workers), read-ahead (default `prefetch`), img/s, {workers}", ours, "img/s", "the same with `prefetch=0`", base,
                    "≥ 1.5×", yes_no(ours >= 1.5 * base)))
    waits = (statistics.median(t_none) - statistics.median(t_ahead)) / (SHARDS / WORKERS)
    disk = rate(n, t_disk)
    notes.append(f"read-ahead: default prefetch {spread(t_ahead)}; prefetch=0 {spread(t_none)}: "
                 f"{waits * 1e3:.0f} ms saved per shard a worker reads ({SHARDS // WORKERS} each); the same recipe "
                 f"over the local files {spread(t_disk)}: read-ahead reaches {ours / disk:.2f}x of the local files' "
                 f"rate, prefetch=0 {base / disk:.2f}x (hiding every wait would give row 1 about {disk / base:.2f}x)")

    # -- 2: later epochs from the shard cache vs local files --
    cache_dir = ctx.out_dir / "shard-cache"
    log(f"network: Dataset with cache_dir (filled by a first epoch) vs the local files, {workers}")
    before = len(server.requests)
    cached = remote_loader(url, cache_dir=str(cache_dir))
    heads = [r for r in server.requests[before:] if r.method == "HEAD"]
    local = remote_loader(local_url)
    for loader in (cached, local):
        if count_batches(loader, lambda b: b[0], lambda b: b[1]) != n:  # the first epoch: fills the cache
            raise RuntimeError(f"first epoch: the Dataset did not deliver {n} images")
    check_cache(cache_dir, server.url, paths)
    requests_in_timed: list[int] = []

    def cached_epoch() -> int:
        mark = len(server.requests)
        got = count_batches(cached, lambda b: b[0], lambda b: b[1])
        new = server.requests[mark:]
        gets = [r for r in new if r.method == "GET"]
        if gets:
            raise RuntimeError(f"cache: an epoch from the cache made {len(gets)} GETs ({gets[0].path} first)")
        requests_in_timed.append(len(new))
        return got

    t_cache, t_local = alternate_many([("cache", reps, cached_epoch),
                                       ("local files", reps, lambda: count_batches(local, lambda b: b[0],
                                                                                   lambda b: b[1]))], n, "cache")
    ours, base = rate(n, t_cache), rate(n, t_local)
    rows.append(Row(f"row 1's recipe, later epochs from the shard cache (`cache_dir=`), img/s, {workers}", ours,
                    "img/s", "the same Dataset over the local files", base, "≥ 0.9×", yes_no(ours >= 0.9 * base)))
    notes.append(f"shard cache: epochs from the cache {spread(t_cache)}; local files {spread(t_local)}; the first "
                 f"epoch wrote {SHARDS} entries, each byte for byte its shard; requests during the timed epochs: "
                 f"{sum(requests_in_timed)} (the {len(heads)} HEADs asking the versions were made once, at "
                 f"construction)")


def check_cache(cache_dir: Path, base_url: str, paths: list[Path]) -> None:
    """One published entry per shard, byte for byte the shard, and nothing else."""
    shards = cache_dir / "shards"
    metas = sorted(shards.glob("*.json"))
    by_name = {p.name: p for p in paths}
    found = set()
    for meta_path in metas:
        meta = json.loads(meta_path.read_text())
        name = meta["url"].rsplit("/", 1)[-1]
        if not meta["url"].startswith(base_url) or name not in by_name:
            raise RuntimeError(f"cache: an entry for {meta['url']}, not one of the shards")
        entry = meta_path.with_suffix("")
        local = by_name[name]
        if entry.stat().st_size != local.stat().st_size or sha256(entry) != sha256(local):
            raise RuntimeError(f"cache: the entry {entry.name} is not a copy of {local}")
        found.add(name)
    if found != set(by_name) or len(metas) != len(paths):
        raise RuntimeError(f"cache: {len(metas)} entries for {len(found)} of the {len(paths)} shards")


def reconnect_rows(ctx: Context, server: Any, train_url: str, rows: list[Row], notes: list[str]) -> None:
    from tarproc.sources import Network, expand_urls

    shards = [Path(u) for u in expand_urls([train_url])]
    for p in shards:
        warm(p)
    url_paths = ["/" + p.relative_to(ctx.directory).as_posix() for p in shards]
    urls = [server.url + u for u in url_paths]
    sizes = {u: p.stat().st_size for u, p in zip(url_paths, shards, strict=True)}
    total = sum(sizes.values())
    tarcat = str(BIN / "tarcat")
    reference = ctx.out_dir / "reference.tar"
    command([tarcat, *map(str, shards), "-o", str(reference)])
    want = (reference.stat().st_size, sha256(reference))
    out = ctx.out_dir / "http.tar"
    retried_at: list[int] = []
    backoffs: list[float] = []

    def over_http(cut: bool) -> Callable[[], tuple[float, Any]]:
        def run() -> tuple[float, Any]:
            out.unlink(missing_ok=True)
            mark = len(server.requests)
            server.clear()
            if cut:
                for path, size in sizes.items():
                    server.cut(path, after=size // 2)
            seconds, proc = command([tarcat, *urls, "-o", str(out)])
            new = server.requests[mark:]
            for path, size in sizes.items():
                gets = [r for r in new if r.method == "GET" and r.path == path]
                ranges = [r.range for r in gets]
                if not cut:
                    if ranges != [None]:
                        raise RuntimeError(f"no faults: {path} was asked {ranges}, expected one GET without Range")
                    continue
                m = re.fullmatch(r"bytes=(\d+)-", ranges[1] or "") if len(ranges) == 2 else None
                if ranges[:1] != [None] or m is None or not 0 < int(m[1]) <= size // 2:
                    raise RuntimeError(f"cut: {path} was asked {ranges}, expected a GET without Range, then one "
                                       f"with 'bytes=N-' for 0 < N <= {size // 2}")
                retried_at.append(int(m[1]))
            if cut:
                waits = [float(w) for w in re.findall(r"retry 1 of \d+ in ([\d.]+) s", proc.stderr)]
                if len(waits) != len(sizes):
                    raise RuntimeError(f"cut: {len(waits)} retries said on stderr, expected {len(sizes)}:\n"
                                       f"{proc.stderr[-2000:]}")
                backoffs.append(sum(waits))
            return seconds, (out.stat().st_size, sha256(out))

        return run

    log(f"network: tarcat of {len(shards)} shards over HTTP, one cut per shard vs no faults")
    t_cut, t_clean = alternate_many([("cut", ctx.reps, over_http(True)), ("no faults", ctx.reps, over_http(False))],
                                    want, "reconnect", clock=self_timed)
    cuts = len(sizes)
    per_cut = (statistics.median(t_cut) - statistics.median(t_clean)) / cuts
    rows.append(Row(f"`tarcat` of {cuts} shards over HTTP (loopback), each cut once midway: "
                    f"{per_cut * 1e3:.0f} ms per reconnect, MB/s", rate(total / 1e6, t_cut),
                    "MB/s", "the same, no faults", rate(total / 1e6, t_clean), "report", "—"))
    own = reconnect_cost(urls, sizes, server, Network(backoff=0.0), ctx.reps)
    notes.append(f"reconnect: tarcat with cuts {spread(t_cut)}; no faults {spread(t_clean)}; every output identical to "
                 f"tarcat of the local files; the retries asked bytes={min(retried_at)}- to bytes={max(retried_at)}- "
                 f"(the cut is at size // 2); backoff waits said on stderr: median {statistics.median(backoffs):.1f} s "
                 f"a run ({cuts} retries); {own}")


def reconnect_cost(urls: list[str], sizes: dict[str, int], server: Any, network: Any, reps: int) -> str:
    """The reconnect's own cost: read_samples of the URLs in this process with no backoff, cut vs not."""
    import tarproc

    def read(cut: bool) -> Callable[[], int]:
        def run() -> int:
            server.clear()
            if cut:
                for path, size in sizes.items():
                    server.cut(path, after=size // 2)
            said = io.StringIO()
            with contextlib.redirect_stderr(said):
                n = sum(1 for url in urls for _ in tarproc.read_samples(url, network=network))
            if said.getvalue().count("retry 1 of") != (len(urls) if cut else 0):
                raise RuntimeError(f"in-process read (cut={cut}): unexpected warnings:\n{said.getvalue()[-2000:]}")
            return n

        return run

    expect = read(False)()
    t_cut, t_clean = alternate_many([("cut, backoff 0", reps, read(True)), ("no faults", reps, read(False))],
                                    expect, "reconnect, in-process")
    per_cut = (statistics.median(t_cut) - statistics.median(t_clean)) / len(urls)
    return (f"in this process with Network(backoff=0): read_samples of the same URLs with cuts {spread(t_cut)}, "
            f"without {spread(t_clean)}: {per_cut * 1e3:.1f} ms per reconnect without the wait")


def raw_rows(ctx: Context, server: Any, rows: list[Row], notes: list[str]) -> None:
    big = ctx.data.big
    warm(big)
    size = big.stat().st_size
    path = "/" + big.relative_to(ctx.directory).as_posix()
    url = server.url + path
    tarcat = str(BIN / "tarcat")
    samples = ctx.data.big_samples

    def one_get(run: Callable[[], tuple[float, Any]]) -> Callable[[], tuple[float, Any]]:
        def checked() -> tuple[float, Any]:
            mark = len(server.requests)
            seconds, got = run()
            gets = [r for r in server.requests[mark:] if r.method == "GET"]
            if len(gets) != 1 or gets[0].path != path or gets[0].range is not None or gets[0].sent != size:
                raise RuntimeError(f"{url}: expected one whole GET, saw {gets}")
            return seconds, got

        return checked

    def tarcat_run(*options: str, source: str = url) -> Callable[[], tuple[float, Any]]:
        def run() -> tuple[float, Any]:
            seconds, proc = command([tarcat, source, "-o", "/dev/null", "--stats", *options])
            m = re.search(r"wrote (\d+) samples", proc.stderr)
            return seconds, size if m and int(m[1]) == samples else f"tarcat said {proc.stderr[-300:]!r}"

        return run

    def curl() -> tuple[float, Any]:
        seconds, proc = command(["curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{size_download}", url])
        return seconds, int(proc.stdout)

    # what every tarcat run pays whatever the size: the interpreter, the imports, one request
    tiny = ctx.directory / "raw-tiny.tar"
    if not tiny.exists():
        write_tar(tiny, [{"__key__": "tiny", "cls": "0"}])

    def tarcat_tiny() -> tuple[float, Any]:
        seconds, proc = command([tarcat, server.url + "/" + tiny.name, "-o", "/dev/null", "--stats"])
        return seconds, size if "wrote 1 samples" in proc.stderr else f"tarcat said {proc.stderr[-300:]!r}"

    gb = size / 1e9
    if shutil.which("curl") is None:
        notes.append("raw rate over HTTP: skipped, no curl on PATH")
        return
    log(f"network: {big.name} ({gb:.2f} GB) over loopback HTTP: tarcat vs curl (and tarcat --prefetch 0, local)")
    t_tarcat, t_curl, t_p0, t_local, t_tiny = alternate_many(
        [("tarcat", ctx.reps, one_get(tarcat_run())), ("curl", ctx.reps, one_get(curl)),
         ("tarcat --prefetch 0", ctx.reps, one_get(tarcat_run("--prefetch", "0"))),
         ("tarcat (local file)", ctx.reps, tarcat_run(source=str(big))),
         ("tarcat (one-sample shard)", ctx.reps, tarcat_tiny)], size, "raw rate", clock=self_timed)
    ours, base = rate(gb, t_tarcat), rate(gb, t_curl)
    rows.append(Row(f"`tarcat URL -o /dev/null` of `{big.name}` ({gb:.2f} GB) over loopback HTTP, GB/s", ours, "GB/s",
                    "`curl -s URL -o /dev/null`", base, "≥ 0.8×", yes_no(ours >= 0.8 * base)))
    notes.append(f"raw rate: tarcat {spread(t_tarcat)}; curl {spread(t_curl)}; tarcat --prefetch 0 {spread(t_p0)} "
                 f"({rate(gb, t_p0):.2f} GB/s); tarcat of the local file {spread(t_local)} ({rate(gb, t_local):.2f} "
                 f"GB/s); tarcat of a one-sample shard over HTTP (start-up, imports, one request: paid by every run) "
                 f"{spread(t_tiny)}; the server is a thread of this process (sendfile)")
