"""A DDP training job for tests/interop/test_torchrun.py, run by ``torchrun`` with gloo on the CPU.

Reads one JSON argument (the Dataset's keyword arguments, the shards, the loader's workers, where
to write, when to stop, a state to resume from) and writes, per rank, ``rank-R.json``: the keys of
every batch, the padding mask, the number of steps, and the loader's state at the stop. The model
is a DDP-wrapped linear layer, so ranks that took unequal numbers of steps would hang in backward
(the process group's timeout is short, to fail fast instead).
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

import tarproc


def main() -> None:
    job = json.loads(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=job.get("timeout", 60)))
    rank = dist.get_rank()
    ds = tarproc.Dataset(job["shards"], **job["dataset"])
    loader = ds.loader(num_workers=job["workers"])
    if job.get("state") is not None:
        loader.load_state_dict(job["state"])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batches, valid, state = [], [], None
    length = len(loader) if ds.lengths is not None else None
    for batch in loader:
        keys = list(batch[0])
        batches.append(keys)
        if len(batch) > 1:
            valid.append([bool(v) for v in batch[1]])
        x = torch.ones(len(keys), 1)
        loss = model(x).sum()
        optimizer.zero_grad()
        loss.backward()  # a collective: unequal steps would hang here
        optimizer.step()
        if job.get("stop") is not None and len(batches) == job["stop"]:
            state = loader.state_dict()
            break
    dist.barrier()
    out = {"batches": batches, "valid": valid, "steps": len(batches), "state": state, "len": length}
    with open(os.path.join(job["out"], f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
