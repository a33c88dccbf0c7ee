"""One torchrun job of the remote section (bench_remote.py starts it with 3 ranks).

Arguments: ``URL CACHE OUT MARK EPOCHS``; CACHE and MARK ``-`` for none. Every rank makes the
Dataset (timed: with bare remote shards that is where they are counted, downloaded into the cache),
then runs EPOCHS epochs through ``ds.loader(num_workers=2)``, each started by a barrier and timed
from ``iter(loader)`` to the last batch. Before each stage rank 0 asks for ``MARK/STAGE`` (a line
in the server's request log between stages). Rank 0 writes OUT (JSON): the seconds of the start
and of each epoch (the maximum over the ranks), the steps of every rank, and the keys received.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

import torch
import torch.distributed as dist

import tarproc


def mark(base: str, stage: str) -> None:
    dist.barrier()
    if base != "-" and dist.get_rank() == 0:
        try:
            urllib.request.urlopen(f"{base}/{stage}", timeout=60).close()
        except urllib.error.HTTPError:
            pass
    dist.barrier()


def gather(value: Any) -> list[Any]:
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def main() -> None:
    url, cache, out, base, epochs = sys.argv[1:6]
    dist.init_process_group("gloo")
    mark(base, "start")
    t0 = time.perf_counter()
    ds = tarproc.Dataset(url, batch_size=64, shuffle=1000, to_tuple=("__key__", "jpg"), tensors="numpy",
                         cache_dir=None if cache == "-" else cache)
    loader = ds.loader(num_workers=2)
    start = max(gather(time.perf_counter() - t0))
    result: dict[str, Any] = {"start": start, "epochs": []}
    for epoch in range(int(epochs)):
        mark(base, f"epoch-{epoch}")
        ds.set_epoch(epoch)
        keys: list[str] = []
        t0 = time.perf_counter()
        steps = 0
        for batch in loader:
            keys.extend(batch[0])
            steps += 1
        seconds = time.perf_counter() - t0
        every = gather((seconds, steps, keys))
        result["epochs"].append({"seconds": max(s for s, _, _ in every), "steps": [n for _, n, _ in every],
                                 "keys": [k for _, _, ks in every for k in ks]})
    mark(base, "end")
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
