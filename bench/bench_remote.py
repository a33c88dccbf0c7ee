"""Training from object storage the way a new user starts (issue 33): ``torchrun`` with 3 ranks x
2 DataLoader workers (gloo on 127.0.0.1, ``bench/remote_job.py``) over the network section's
shards of ImageNet-like JPEGs served over HTTP with 50 ms added to each request
(``tests/faultserver.py``), bare shards (no index: the Dataset counts them, downloading each into
``cache_dir``), raw bytes (no decode: the I/O path decides). Against the same job over the same
shards as local files, in the same run.

Rows:

1. Bytes the server sent in the first epoch, counting included (the request log, split by the
   job's marker requests), against the shards' bytes. Target ≤ 1.2× (one download per shard per
   node; nothing in the second epoch, in the notes).
2. The second epoch (from the cache) against the second epoch over local files, images/s. Target
   ≥ 0.95×.
3. The first epoch, counting included (the Dataset's construction plus the epoch), against the
   local files' first epoch (construction included). Report.

Every epoch is checked: every key exactly once, the same steps on every rank.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_network import LATENCY, fault_server, small_shards
from bench_train import make_shards
from common import Context, Row, log, spread, yes_no

SECTION = "remote"
RANKS = 3
HERE = Path(__file__).resolve().parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job(url: str, cache: str, out: Path, mark: str) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(RANKS),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(HERE / "remote_job.py"),
               url, cache, str(out), mark, "2"]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        log(proc.stderr[-3000:])
        raise RuntimeError(f"remote_job.py exited with status {proc.returncode}")
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def check(result: dict[str, Any], n: int, what: str) -> None:
    for e, epoch in enumerate(result["epochs"]):
        keys = epoch["keys"]
        if len(keys) != n or len(set(keys)) != n or len(set(epoch["steps"])) != 1:
            raise RuntimeError(f"{what}, epoch {e}: {len(keys)} images, {len(set(keys))} distinct, steps "
                               f"{epoch['steps']}; expected {n} once each and equal steps")


def stage_bytes(requests: list[Any], stage: str) -> tuple[int, int]:
    """(body bytes of shard GETs, requests of any kind) between the marker of ``stage`` and the next."""
    sent = count = 0
    inside = False
    for r in requests:
        if r.path.startswith("/__mark__/"):
            inside = r.path == f"/__mark__/{stage}"
            continue
        if inside:
            count += 1
            if r.method == "GET" and r.path.endswith(".tar"):
                sent += r.sent
    return sent, count


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return [], ["remote: skipped, torch is not installed"]
    paths = small_shards(ctx, make_shards(ctx))
    n = sum(1 for _ in __import__("tarproc").read_samples([str(p) for p in paths]))
    total = sum(p.stat().st_size for p in paths)
    work = ctx.directory / SECTION
    work.mkdir(parents=True, exist_ok=True)
    reps = max(1, ctx.slow_reps)
    pattern = f"small-{{{0:06d}..{len(paths) - 1:06d}}}.tar"  # small_shards' names
    local_url = str(paths[0].parent / pattern)
    first_local, second_local, first_remote, second_remote, fetched, later = [], [], [], [], [], []
    with fault_server(paths[0].parent, latency=LATENCY) as server:
        remote_url = f"{server.url}/{pattern}"
        for rep in range(reps):
            local = job(local_url, "-", work / "local.json", "-")
            check(local, n, "local files")
            first_local.append(local["start"] + local["epochs"][0]["seconds"])
            second_local.append(local["epochs"][1]["seconds"])
            cache = work / "cache"
            shutil.rmtree(cache, ignore_errors=True)
            del server.requests[:]
            remote = job(remote_url, str(cache), work / "remote.json", f"{server.url}/__mark__")
            check(remote, n, "HTTP with cache_dir")
            first_remote.append(remote["start"] + remote["epochs"][0]["seconds"])
            second_remote.append(remote["epochs"][1]["seconds"])
            sent = stage_bytes(server.requests, "start")[0] + stage_bytes(server.requests, "epoch-0")[0]
            fetched.append(sent)
            later.append(stage_bytes(server.requests, "epoch-1")[1])
            log(f"remote: rep {rep + 1}: first epoch {first_remote[-1]:.2f} s (local {first_local[-1]:.2f}), second "
                f"{second_remote[-1]:.2f} s (local {second_local[-1]:.2f}); fetched {sent / total:.3f}x, "
                f"requests in epoch 2: {later[-1]}")
    rate = lambda times: n / statistics.median(times)  # noqa: E731
    bytes_ratio = max(fetched) / total
    rows = [
        Row("torchrun 3×2 over HTTP (50 ms), bare shards, cache_dir: bytes fetched in epoch 1 (counting included)",
            max(fetched) / 1e6, "MB", "the shards' bytes", total / 1e6, "≤ 1.2×", yes_no(bytes_ratio <= 1.2)),
        Row("same, epoch 2 (from the cache)", rate(second_remote), "img/s", "epoch 2 over local files",
            rate(second_local), "≥ 0.95×", yes_no(rate(second_remote) >= 0.95 * rate(second_local))),
        Row("same, epoch 1 (counting + download + epoch)", rate(first_remote), "img/s",
            "epoch 1 over local files (counts included)", rate(first_local), "report", "—"),
    ]
    notes = [f"requests in epoch 2 (from the cache): {max(later)} (target 0); {n} images in {len(paths)} shards, "
             f"{total / 1e6:.1f} MB; epoch 2: remote {spread(second_remote)}, local {spread(second_local)}"]
    return rows, notes
