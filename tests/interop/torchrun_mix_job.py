"""A ``tarproc.Mix`` of three sources under ``torchrun`` (gloo, CPU), for tests/interop/test_torchrun_mix.py.

Takes one JSON argument: each source's shards, the Mix's and the Datasets' keyword arguments, the
workers of each source, an optional step to stop at, and where to write. Each rank writes
``rank-R.json``: per run, the source and keys of every step, the drawn counts, and the Mix's state
at the stop. A DDP-wrapped linear layer takes a step per batch: ranks that took unequal numbers of
steps would hang in backward (the process group's timeout is short, to fail fast instead). torch is
imported in ``main`` only: pytest imports this file for its doctests.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any


def run(job: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    import tarproc

    sources = {name: tarproc.Dataset(shards, **job["dataset"]) for name, shards in job["sources"].items()}
    mix = tarproc.Mix(sources, job["weights"], tagged=True, num_workers=spec["workers"], **job["mix"])
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps, state = [], None
    for name, (keys,) in mix:
        steps.append([name, list(keys)])
        loss = model(torch.ones(len(keys), 1)).sum()
        optimizer.zero_grad()
        loss.backward()  # a collective: unequal steps would hang here
        optimizer.step()
        if spec.get("stop") is not None and len(steps) == spec["stop"]:
            state = mix.state_dict()
            break
    return {"steps": steps, "drawn": mix.drawn, "state": state,
            "lengths": {name: len(ds) for name, ds in sources.items()}}


def main() -> None:
    import torch.distributed as dist

    job = json.loads(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=job.get("timeout", 60)))
    out = {}
    for spec in job["runs"]:
        out[spec["name"]] = run(job, spec)
        dist.barrier()
    with open(os.path.join(job["out"], f"rank-{dist.get_rank()}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
