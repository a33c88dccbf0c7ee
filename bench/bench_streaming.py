"""tarproc.Dataset against MosaicML Streaming, both reading the same JPEGs from a local S3 (moto).

The train section's 2,000 ImageNet-like JPEGs (500x375, ~100 KB; 400 with ``--quick``) are
written twice, in 8 shards of 250 samples each way: as tar shards with a ``.idx`` beside each
(``tarindex``'s, as docs/training.md asks for remote shards), and as MDS shards written by
``streaming.MDSWriter`` (columns ``jpg: bytes``, the JPEG's bytes as they are, and ``cls: int``;
no compression, no hashes). Both go into one bucket of a moto server (``moto_server``, a child
process on 127.0.0.1). tarproc reads ``s3://bucket/tar/train-{000000..000007}.tar`` through s3fs
(``FSSPEC_S3_ENDPOINT_URL``), Streaming reads ``s3://bucket/mds`` through boto3
(``S3_ENDPOINT_URL``). Each side keeps a local copy of what it read: ``Dataset(cache_dir=...)``
and ``StreamingDataset(local=...)``, a fresh directory each repetition.

A repetition builds each contender's loader (``DataLoader(num_workers=2)``, batches of 64,
shuffled: a buffer of 1,000 for tarproc, ``shuffle=True`` for Streaming) and runs two epochs:
the first (cold: the shards come from S3; the time includes building the dataset, which asks
the store for the shards' versions and index) and the second (from the local copies). The
contenders alternate within every repetition. A third contender is the same ``Dataset`` over the
same tar shards as local files (its second epoch is the figure; its first is in a note).

Two recipes:

(a) raw bytes: no decode, the batches hold the encoded JPEGs (a GPU recipe's workers);
(b) the training recipe: decode + RandomResizedCrop 224 + flip 0.5 + ImageNet normalize, CHW
    float32. tarproc: ``decode=AugmentSpec(...)`` (its ``cpu`` path, ``tarproc._jpeg`` on
    libjpeg-turbo, a batch decoded straight into the DataLoader's shared memory). Streaming: the
    same ``AugmentSpec`` applied per sample by ``tarproc.decode.decode_image`` in the dataset's
    ``get_item`` (the same C routine: the decoder is not what is compared), the batch stacked
    by the DataLoader's default collate.

And (a) once more with 30 ms added to every request: a TCP proxy (``Latency``) in a child
process between the readers and moto holds each request 30 ms before passing it on. It logs the
requests: a note says how many each contender made in an epoch from its local copies.

Rows: the cached epoch against the local files (target >= 0.95x) and against Streaming's cached
epoch (target >= 1x); the cold epoch against Streaming's cold epoch (report). Every batch is
checked (JPEG bytes or 224x224 CHW, one label per image) and every epoch's count of images.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import select
import shutil
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench_train import make_shards
from common import BIN, Context, Row, log, warm, write_tar, yes_no

SECTION = "streaming"
SHARDS = 8
BATCH = 64
SHUFFLE = 1000  # tarproc's shuffle buffer (train row 1's)
WORKERS = 2
LATENCY = 0.03  # seconds the proxy holds each request in the latency variant
BUCKET = "bench"

# ------------------------------------------------------------------------------------------------
# the recipes (user code)


def augment_spec() -> Any:
    from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec

    return AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")


def tarproc_loader(url: str, decode: bool, cache_dir: str | None = None) -> Any:
    """tarproc.Dataset over ``url`` (s3:// with ``cache_dir``, or local paths)."""
    import torch

    import tarproc

    ds = tarproc.Dataset(url, decode=augment_spec() if decode else None, shuffle=SHUFFLE, to_tuple=("jpg", "cls"),
                         batch_size=BATCH, cache_dir=cache_dir)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=WORKERS)


def streaming_loader(remote: str, local: str, decode: bool) -> Any:
    """MosaicML Streaming over the MDS shards at ``remote``, copied into ``local``."""
    import torch
    from streaming import StreamingDataset

    from tarproc.decode import decode_image

    spec = augment_spec()

    class Decoded(StreamingDataset):  # type: ignore[misc]
        def get_item(self, sample_id: int, retry: int = 7) -> Any:  # as streaming.vision's datasets do
            sample = super().get_item(sample_id, retry)
            return decode_image(sample["jpg"], spec, str(sample_id)), sample["cls"]

    ds = (Decoded if decode else StreamingDataset)(remote=remote, local=local, shuffle=True, batch_size=BATCH)
    return torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)


# ------------------------------------------------------------------------------------------------
# checked epochs: each returns the number of images it received


def raw_images(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, dict):  # Streaming: the default collate of {"jpg": bytes, "cls": int}
        return batch["jpg"], batch["cls"]
    return batch[0], batch[1]


def count_raw(loader: Any) -> int:
    n = 0
    for batch in loader:
        images, labels = raw_images(batch)
        if len(labels) != len(images) or not all(bytes(i[:2]) == b"\xff\xd8" for i in images):
            raise RuntimeError(f"bad batch: {len(images)} images, {len(labels)} labels")
        n += len(images)
    return n


def count_decoded(loader: Any) -> int:
    n = 0
    for images, labels in loader:
        if tuple(images.shape[1:]) != (3, 224, 224) or len(labels) != len(images):
            raise RuntimeError(f"bad batch: images {tuple(images.shape)}, {len(labels)} labels")
        n += len(images)
    return n


# ------------------------------------------------------------------------------------------------
# the data: 8 tar shards (+ .idx) and the same samples as 8 MDS shards, made once


def make_data(ctx: Context, train_url: str) -> tuple[list[Path], Path, int]:
    """The train section's samples, in order, as SHARDS tar shards with their ``.idx`` and as
    SHARDS MDS shards (``directory/mds``), under ctx.directory / SECTION; made once. Returns the
    tar shards, the MDS directory and the number of samples."""
    import itertools

    import tarproc
    from tarproc.sources import expand_urls

    directory = ctx.directory / SECTION
    stamp = directory / "source.json"
    train = expand_urls([train_url])
    n = sum(1 for u in train for _ in tarproc.read_samples(u))
    import streaming

    source = {"train": [Path(u).stat().st_size for u in train], "samples": n, "shards": SHARDS,
              "streaming": streaming.__version__}
    paths = [directory / f"train-{i:06d}.tar" for i in range(SHARDS)]
    mds = directory / "mds"
    try:
        if (json.loads(stamp.read_text()) == source and all(p.exists() for p in paths)
                and (mds / "index.json").exists()):
            return paths, mds, n
    except (OSError, ValueError):
        pass
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    from streaming import MDSWriter
    from streaming.base.util import merge_index

    samples = (s for url in train for s in tarproc.read_samples(url))
    written = 0
    for i, path in enumerate(paths):
        count = (i + 1) * n // SHARDS - i * n // SHARDS
        chunk = list(itertools.islice(samples, count))
        written += write_tar(path, iter(chunk))
        Path(str(path) + ".idx").write_bytes(tarproc.build_index(str(path)).jsonl_bytes())
        # one MDS shard of exactly these samples (a partition of its own, no size limit), the
        # partitions' indexes merged below into one dataset, as Streaming's docs do for parallel writers
        with MDSWriter(out=str(mds / f"{i:06d}"), columns={"jpg": "bytes", "cls": "int"}, size_limit=None) as writer:
            for sample in chunk:
                writer.write({"jpg": bytes(sample["jpg"]), "cls": int(sample["cls"])})
    merge_index([str(mds / f"{i:06d}" / "index.json") for i in range(SHARDS)], str(mds), keep_local=True)
    if written != n or next(samples, None) is not None:
        raise RuntimeError(f"streaming: wrote {written} samples in {SHARDS} shards, expected {n}")
    index = json.loads((mds / "index.json").read_text())
    if [s["samples"] for s in index["shards"]] != [(i + 1) * n // SHARDS - i * n // SHARDS for i in range(SHARDS)]:
        raise RuntimeError(f"streaming: the MDS shards hold {[s['samples'] for s in index['shards']]} samples")
    stamp.write_text(json.dumps(source) + "\n")
    log(f"streaming: wrote {n} samples as {SHARDS} tar shards (+ .idx) and {SHARDS} MDS shards in {directory}")
    return paths, mds, n


# ------------------------------------------------------------------------------------------------
# the store: moto in a child process, and a proxy adding latency


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_server(log_path: Path) -> Iterator[str]:
    """``moto_server`` on 127.0.0.1 (a child process, off this process's GIL); yields its endpoint."""
    exe = BIN / "moto_server"
    if not exe.exists():
        raise RuntimeError(f"{exe} not found: moto[server] is a dev dependency (make install-dev)")
    port = free_port()
    with open(log_path, "wb") as out:
        proc = subprocess.Popen([str(exe), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto_server did not start: {log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never look for credentials elsewhere
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


@contextlib.contextmanager
def s3_endpoint(endpoint: str, scratch: Path) -> Iterator[None]:
    """Point both readers at ``endpoint``: s3fs through fsspec's configuration (already read from
    the environment when fsspec was imported, so set here too; forked workers inherit it), boto3
    through ``S3_ENDPOINT_URL`` (Streaming's) and ``AWS_ENDPOINT_URL``. Restored on exit."""
    import fsspec.config

    env = dict(AWS_ENV, S3_ENDPOINT_URL=endpoint, AWS_ENDPOINT_URL=endpoint, FSSPEC_S3_ENDPOINT_URL=endpoint,
               AWS_CONFIG_FILE=str(scratch / "aws-config"),
               AWS_SHARED_CREDENTIALS_FILE=str(scratch / "aws-credentials"))
    saved_env = {k: os.environ.get(k) for k in env}
    saved_conf = json.dumps(fsspec.config.conf.get("s3"))
    os.environ.update(env)
    fsspec.config.conf.setdefault("s3", {})["endpoint_url"] = endpoint
    try:
        yield
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        conf = json.loads(saved_conf)
        if conf is None:
            fsspec.config.conf.pop("s3", None)
        else:
            fsspec.config.conf["s3"] = conf


def upload(endpoint: str, paths: list[Path], mds: Path) -> int:
    """Create the bucket and put the tar shards, their .idx and the MDS directory (tar/, mds/)."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    client.create_bucket(Bucket=BUCKET)
    total = 0
    files = [(p, f"tar/{p.name}") for p in paths] + [(Path(str(p) + ".idx"), f"tar/{p.name}.idx") for p in paths]
    files += [(p, f"mds/{p.relative_to(mds).as_posix()}") for p in sorted(mds.rglob("*")) if p.is_file()]
    for path, key in files:
        with open(path, "rb") as f:
            client.put_object(Bucket=BUCKET, Key=key, Body=f)
        total += path.stat().st_size
    return total


class Latency:
    """A TCP proxy on 127.0.0.1 in front of ``target`` that holds each HTTP request ``latency``
    seconds before passing it on (an object store's time to first byte), and logs each request's
    first line to ``log_path`` (``requests()`` reads them back).

    A request is the client's first bytes after an answer (or on a new connection): HTTP/1.1
    without pipelining, as boto3 and s3fs speak it. It runs in a child process (forked: a thread
    per connection relays both ways), so that relaying ~200 MB an epoch takes nothing from this
    process, where the DataLoader receives its batches."""

    def __init__(self, target: str, latency: float, log_path: Path) -> None:
        host, _, port = target.split("://")[-1].rstrip("/").rpartition(":")
        self.target = (host, int(port))
        self.latency = latency
        self.log_path = log_path
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._process: Any = None

    def __enter__(self) -> Latency:
        import multiprocessing

        self.log_path.write_bytes(b"")
        self._process = multiprocessing.get_context("fork").Process(target=self._serve, name="latency-proxy",
                                                                    daemon=True)
        self._process.start()
        self._listener.close()  # the child's now
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.terminate()
        self._process.join(10)

    def requests(self) -> list[str]:
        """The first line of every request so far."""
        return self.log_path.read_text("latin-1").splitlines()

    def _serve(self) -> None:
        log_file = open(self.log_path, "ab", buffering=0)
        lock = threading.Lock()
        while True:
            client, _ = self._listener.accept()
            threading.Thread(target=self._relay, args=(client, log_file, lock), daemon=True).start()

    def _relay(self, client: socket.socket, log_file: Any, lock: threading.Lock) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        peer = {client: upstream, upstream: client}
        reading = {client, upstream}
        answered = True  # the client's next bytes start a request
        try:
            while reading:
                for src in select.select(list(reading), [], [])[0]:
                    data = src.recv(1 << 18)
                    if not data:  # half-close: pass the EOF on
                        reading.discard(src)
                        with contextlib.suppress(OSError):
                            peer[src].shutdown(socket.SHUT_WR)
                        continue
                    if src is client and answered:
                        answered = False
                        with lock:
                            log_file.write(data.split(b"\r\n", 1)[0] + b"\n")
                        time.sleep(self.latency)
                    elif src is upstream:
                        answered = True
                    peer[src].sendall(data)
        except OSError:
            pass
        finally:
            client.close()
            upstream.close()


# ------------------------------------------------------------------------------------------------
# the measure


def median_rate(n: int, times: list[float]) -> float:
    return n / statistics.median(times)


def spread_rate(n: int, times: list[float]) -> str:
    """Median img/s and the range, from epoch times."""
    rates = sorted(n / t for t in times)
    return f"{median_rate(n, times):,.0f} img/s (min {rates[0]:,.0f}, max {rates[-1]:,.0f}, {len(times)} reps)"


class Contender:
    """One loader, rebuilt every repetition (``make(rep)``); two epochs a repetition, each timed
    and counted: ``cold`` (building it and its first epoch) and ``warm`` (its second)."""

    def __init__(self, name: str, make: Callable[[int], Any], count: Callable[[Any], int],
                 after_cold: Callable[[int], None] | None = None, around_warm: Callable[[], Any] | None = None) -> None:
        self.name, self.make, self.count = name, make, count
        self.after_cold, self.around_warm = after_cold, around_warm
        self.cold: list[float] = []
        self.warm: list[float] = []
        self.images: list[int] = []

    def run(self, rep: int) -> str:
        gc.collect()
        t0 = time.perf_counter()
        loader = self.make(rep)
        first = self.count(loader)
        t1 = time.perf_counter()
        if self.after_cold is not None:
            self.after_cold(rep)
        gc.collect()
        guard = self.around_warm() if self.around_warm is not None else contextlib.nullcontext()
        with guard:
            t2 = time.perf_counter()
            second = self.count(loader)
            t3 = time.perf_counter()
        self.cold.append(t1 - t0)
        self.warm.append(t3 - t2)
        self.images += [first, second]
        del loader
        gc.collect()
        return f"{self.name} {t1 - t0:.3f} s + {t3 - t2:.3f} s"


def alternate(contenders: list[Contender], reps: int, expect: int, what: str) -> None:
    for r in range(reps):
        line = f"  rep {r + 1}:"
        for c in contenders:
            line += " " + c.run(r) + ";"
        log(line)
    for c in contenders:
        if set(c.images) != {expect}:
            raise RuntimeError(f"{what}: {c.name} delivered {sorted(set(c.images))} images an epoch, expected {expect}")


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    try:
        import streaming
    except ImportError as e:
        return [], [f"skipped: MosaicML Streaming is not installed ({e}); `make install-bench` installs it "
                    "(`make bench` does)"]
    rows: list[Row] = []
    notes: list[str] = []
    train_url = make_shards(ctx)
    paths, mds, n = make_data(ctx, train_url)
    for p in paths:
        warm(p)
    for p in mds.rglob("*"):
        if p.is_file():
            warm(p)
    scratch = ctx.out_dir / SECTION
    scratch.mkdir(parents=True, exist_ok=True)
    mb = statistics.mean(p.stat().st_size for p in paths) / 1e6
    mds_shards = json.loads((mds / "index.json").read_text())["shards"]
    mds_mb = statistics.mean(s["raw_data"]["bytes"] for s in mds_shards) / 1e6
    notes.append(f"data: {n} JPEGs in {SHARDS} tar shards of ~{mb:.1f} MB (+ .idx) and {SHARDS} MDS shards of "
                 f"~{mds_mb:.1f} MB (mosaicml-streaming {streaming.__version__}, columns jpg: bytes, cls: int), in "
                 "one bucket of a moto server (a child process on 127.0.0.1); DataLoader with "
                 f"{WORKERS} workers, batches of {BATCH}")
    try:
        with moto_server(scratch / "moto.log") as endpoint:
            stored = upload(endpoint, paths, mds)
            log(f"streaming: {stored / 1e6:.0f} MB put into s3://{BUCKET} on {endpoint}")
            with s3_endpoint(endpoint, scratch):
                for decode in (False, True):
                    compare(ctx, scratch, paths, n, decode, None, rows, notes)
            with Latency(endpoint, LATENCY, scratch / "requests.log") as proxy, s3_endpoint(proxy.endpoint, scratch):
                compare(ctx, scratch, paths, n, False, proxy, rows, notes)
    finally:
        from streaming.base.util import clean_stale_shared_memory

        with contextlib.suppress(Exception):
            clean_stale_shared_memory()
    return rows, notes


def compare(ctx: Context, scratch: Path, paths: list[Path], n: int, decode: bool, proxy: Latency | None,
            rows: list[Row], notes: list[str]) -> None:
    url = f"s3://{BUCKET}/tar/train-{{000000..{SHARDS - 1:06d}}}.tar"
    local_url = str(paths[0].parent / f"train-{{000000..{SHARDS - 1:06d}}}.tar")
    recipe = "decode + RandomResizedCrop 224 + flip" if decode else "raw bytes (no decode)"
    variant = f", {LATENCY * 1e3:.0f} ms a request" if proxy is not None else ""
    count = count_decoded if decode else count_raw
    tag = ("decode" if decode else "raw") + ("-latency" if proxy is not None else "")

    def fresh(name: str, rep: int) -> Path:
        where = scratch / f"{tag}-{name}-{rep}"
        shutil.rmtree(where, ignore_errors=True)
        return where

    def check_tarproc_cache(rep: int) -> None:
        entries = [p for p in (scratch / f"{tag}-tarproc-{rep}" / "shards").iterdir()
                   if p.is_file() and p.name.endswith(".tar")]  # the shards (their .idx files are cached too)
        if sorted(p.stat().st_size for p in entries) != sorted(p.stat().st_size for p in paths):
            raise RuntimeError(f"tarproc's cache holds {len(entries)} entries, not a copy of each of the "
                               f"{SHARDS} shards")

    def check_streaming_local(rep: int) -> None:
        local = scratch / f"{tag}-streaming-{rep}"
        shards = list(local.rglob("*.mds"))
        if len(shards) != SHARDS:
            raise RuntimeError(f"Streaming's local directory holds {len(shards)} shards after an epoch, not {SHARDS}")
        for old in ("tarproc", "streaming"):  # the copies of the repetition before: not needed any more
            shutil.rmtree(scratch / f"{tag}-{old}-{rep - 1}", ignore_errors=True)

    made: dict[str, list[list[str]]] = {"tarproc": [], "streaming": []}  # requests of each epoch from the copies

    def count_requests(who: str) -> Callable[[], Any]:
        @contextlib.contextmanager
        def guard() -> Iterator[None]:
            if proxy is None:
                yield
                return
            mark = len(proxy.requests())
            yield
            made[who].append(proxy.requests()[mark:])

        return guard

    ours = Contender("tarproc (s3)", lambda r: tarproc_loader(url, decode, str(fresh("tarproc", r))), count,
                     check_tarproc_cache, count_requests("tarproc"))
    theirs = Contender("Streaming (s3)", lambda r: streaming_loader(f"s3://{BUCKET}/mds", str(fresh("streaming", r)),
                                                                     decode), count, check_streaming_local,
                      count_requests("streaming"))
    contenders = [ours, theirs]
    on_disk = None
    if proxy is None:
        on_disk = Contender("tarproc (local files)", lambda r: tarproc_loader(local_url, decode), count)
        contenders.append(on_disk)
    log(f"streaming: {recipe}{variant}: {', '.join(c.name for c in contenders)}, cold epoch + cached epoch")
    warm_up = [c.run(-1) for c in (ours, theirs)]  # untimed: imports, the store's first connections
    log(f"  warm-up: {'; '.join(warm_up)}")
    for c in (ours, theirs):
        c.cold.clear()
        c.warm.clear()
        c.images.clear()
    for lists in made.values():
        lists.clear()
    alternate(contenders, ctx.reps, n, f"streaming ({tag})")
    workers = f"{WORKERS} workers"
    what = f"{recipe}{variant}, {n} JPEGs in {SHARDS} shards on S3 (moto), img/s, {workers}"
    cached, cold = median_rate(n, ours.warm), median_rate(n, ours.cold)
    their_cached, their_cold = median_rate(n, theirs.warm), median_rate(n, theirs.cold)
    if on_disk is not None:
        local = median_rate(n, on_disk.warm)
        rows.append(Row(f"{what}: `Dataset(s3://…, cache_dir=)`, the epoch from the cache", cached, "img/s",
                        "the same Dataset over the shards as local files (2nd epoch)", local, "≥ 0.95×",
                        yes_no(cached >= 0.95 * local)))
    rows.append(Row(f"{what}: the epoch from the cache", cached, "img/s",
                    "MosaicML Streaming, the epoch from its `local=` copies", their_cached,
                    "≥ 1×" if proxy is None else "report",
                    yes_no(cached >= their_cached) if proxy is None else "—"))
    rows.append(Row(f"{what}: the first epoch (cold cache, building the dataset included)", cold, "img/s",
                    "MosaicML Streaming, the first epoch (empty `local=`)", their_cold, "report", "—"))
    line = (f"{tag}: tarproc s3 cold {spread_rate(n, ours.cold)}, cached {spread_rate(n, ours.warm)}; "
            f"Streaming cold {spread_rate(n, theirs.cold)}, cached {spread_rate(n, theirs.warm)}")
    if on_disk is not None:
        line += (f"; tarproc local files 1st epoch {spread_rate(n, on_disk.cold)}, "
                 f"2nd {spread_rate(n, on_disk.warm)}")
    if proxy is not None:
        for who, epochs in made.items():
            per_epoch = sorted({len(e) for e in epochs})
            kinds = sorted({f"{r.split(' ')[0]} {r.split(' ')[1].rsplit('/', 1)[-1]}" for e in epochs for r in e
                            if r.count(" ") >= 1})
            line += (f"; requests {who} made in an epoch from its copies: {'/'.join(map(str, per_epoch))}"
                     + (f" ({', '.join(kinds[:4])}{'...' if len(kinds) > 4 else ''})" if kinds else ""))
    notes.append(line)
