"""One rank of the scale section's collective-end row (bench_scale.py starts two of these).

Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (as torchrun sets them). Arguments:
``URL REPS OUT``. After the imports and ``init_process_group("gloo")`` the rank runs, repetition
by repetition, one epoch of each side -- ``lengths=None`` (the ranks all-reduce "I have a batch"
every step in ``ds.loader()``) and the default counts (equal steps, no collective) -- each epoch
started by a barrier, timed from ``iter(loader)`` to the last batch. It writes, to OUT (JSON), per
side the seconds of every epoch, its steps and the keys it received; the parent checks them and
takes the maximum over the ranks.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch.distributed as dist

import tarproc
from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec

SIDES = {"none": None, "counts": "auto"}


def make_loader(url: str, lengths: Any) -> Any:
    """Row 1's recipe of the train section, with the keys (to check every image arrived) and one
    worker per rank, through ``ds.loader()`` (which ends an epoch without counts collectively)."""
    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")
    ds = tarproc.Dataset(url, decode=spec, shuffle=1000, to_tuple=("jpg", "cls", "__key__"), batch_size=64,
                         lengths=lengths)
    return ds.loader(num_workers=1)


def epoch(url: str, lengths: Any, limit: int | None = None) -> tuple[float, int, list[str]]:
    """(seconds from iter() to the last batch, steps, keys) of one epoch (``limit`` steps at most)."""
    loader = make_loader(url, lengths)
    dist.barrier()  # the ranks start together
    t0 = time.perf_counter()
    it = iter(loader)
    steps, keys = 0, []
    for images, labels, batch_keys in it:
        if tuple(images.shape[1:]) != (3, 224, 224) or len(labels) != len(images) or len(batch_keys) != len(images):
            raise RuntimeError(f"bad batch: images {tuple(images.shape)}, {len(labels)} labels, {len(batch_keys)} keys")
        steps += 1
        keys += list(batch_keys)
        if limit is not None and steps == limit:
            break
    elapsed = time.perf_counter() - t0
    it.close()
    return elapsed, steps, keys


def main() -> int:
    url, reps, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo")
    # warm-up, untimed: two steps of each side (the first collective, the counts' cache)
    for lengths in SIDES.values():
        epoch(url, lengths, limit=2)
    result: dict[str, Any] = {side: [] for side in SIDES}
    for _ in range(reps):
        for side, lengths in SIDES.items():
            seconds, steps, keys = epoch(url, lengths)
            result[side].append({"seconds": seconds, "steps": steps, "keys": keys})
    dist.barrier()
    dist.destroy_process_group()
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
