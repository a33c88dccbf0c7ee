"""DDP training runs for tests/interop/test_torchrun.py, started by ``torchrun`` with gloo on the CPU.

Takes one JSON argument: the shards, where to write, and a list of runs, each a name, the
Dataset's keyword arguments, the loader's workers, an optional step to stop at and an optional
state to resume from. The runs go one after the other in one process group (a torchrun start
costs seconds); each rank writes ``rank-R.json``: per run, the keys of every batch, the padding
mask, the steps, ``len(loader)``, the loader's state at the stop, or the error that ended it. The
model is a DDP-wrapped linear layer, so ranks that took unequal numbers of steps would hang in
backward (the process group's timeout is short, to fail fast instead).
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist

import tarproc


def run(shards: list[str], spec: dict[str, Any]) -> dict[str, Any]:
    mark(spec, "start")
    ds = tarproc.Dataset(shards, **spec["dataset"])
    loader = ds.loader(num_workers=spec["workers"])
    if spec.get("state") is not None:
        loader.load_state_dict(spec["state"])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    epochs = []
    for epoch in range(spec.get("epochs", 1)):
        mark(spec, f"epoch-{epoch}")
        if epoch:
            ds.set_epoch(epoch)
        epochs.append(one_epoch(ds, loader, model, optimizer, spec))
    mark(spec, "end")
    return {**epochs[0], "epochs": epochs, "lost": ds.lost}


def one_epoch(ds: Any, loader: Any, model: Any, optimizer: Any, spec: dict[str, Any]) -> dict[str, Any]:
    batches, valid, state = [], [], None
    length = len(loader) if ds.lengths is not None else None
    for batch in loader:
        keys = list(batch[0])
        batches.append(keys)
        if len(batch) > 1:
            valid.append([bool(v) for v in batch[1]])
        loss = model(torch.ones(len(keys), 1)).sum()
        optimizer.zero_grad()
        loss.backward()  # a collective: unequal steps would hang here
        optimizer.step()
        if spec.get("stop") is not None and len(batches) == spec["stop"]:
            state = loader.state_dict()
            break
    return {"batches": batches, "valid": valid, "steps": len(batches), "state": state, "len": length}


def mark(spec: dict[str, Any], what: str) -> None:
    """With ``"mark": URL``: every rank waits here, and rank 0 asks for ``URL/RUN/WHAT`` (a line in the
    test server's request log between the requests of one stage and those of the next)."""
    if not spec.get("mark"):
        return
    import urllib.error
    import urllib.request

    dist.barrier()
    if dist.get_rank() == 0:
        try:
            urllib.request.urlopen(f"{spec['mark']}/{spec['name']}/{what}", timeout=30).close()
        except urllib.error.HTTPError:
            pass  # a 404: it is the request that counts
    dist.barrier()


def main() -> None:
    job = json.loads(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=job.get("timeout", 60)))
    rank = dist.get_rank()
    out = {}
    for spec in job["runs"]:
        out[spec["name"]] = run(spec.get("shards", job["shards"]), spec)
        dist.barrier()
    with open(os.path.join(job["out"], f"rank-{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
