"""``tarproc.Mix`` for real: ``torchrun`` with gloo on the CPU, 2 ranks x 2 DataLoader workers per
source, a mix of three sources with weights and ``until="all"`` (tests/interop/torchrun_mix_job.py).
Every rank draws the same source at every step (the documented draw of ``(seed, epoch, step)``,
sources dropping out as they run out), takes the same number of steps (a DDP model would hang
otherwise), every sample of every source comes once, and a job stopped on 2 x 2 resumes on 1 x 1
with the rest of the same draws and every remaining sample once."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tarhelpers import free_port, write_tar

import tarproc

pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="torchrun on Linux"), pytest.mark.timeout(300)]
SIZES = {"a": (40, 30), "b": (25, 20), "c": (23,)}  # samples per shard of each source
WEIGHTS = {"a": 0.5, "b": 0.3, "c": 0.2}
DATASET = {"batch_size": 4, "shuffle": 10, "seed": 5, "to_tuple": ["__key__"]}
MIX = {"seed": 3, "until": "all"}
JOB = Path(__file__).parent / "torchrun_mix_job.py"


def draws(seed: int, epoch: int, start: int, left: dict[str, int], dropped: list[str]) -> list[str]:
    """The documented rule: step s draws from Random(f"{seed}/mix/{epoch}/{s}") with the weights; a
    source that has run out drops out and the same generator draws again among the rest."""
    left, active, out = dict(left), [n for n in WEIGHTS if n not in dropped], []
    step = start
    while active:
        rng = random.Random(f"{seed}/mix/{epoch}/{step}")
        name = rng.choices(active, [WEIGHTS[n] for n in active])[0]
        while not left[name]:
            active.remove(name)
            if not active:
                return out
            name = rng.choices(active, [WEIGHTS[n] for n in active])[0]
        left[name] -= 1
        out.append(name)
        step += 1
    return out


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("mix")
    sources: dict[str, list[str]] = {}
    for name, sizes in SIZES.items():
        n = 0
        for s, size in enumerate(sizes):
            rows = [{"__key__": f"{name}{n + i:03d}", "cls": i} for i in range(size)]
            sources.setdefault(name, []).append(str(write_tar(directory / f"{name}-{s}.tar", rows)))
            n += size
    out = directory / "out"
    out.mkdir()
    spec = {"sources": sources, "weights": WEIGHTS, "dataset": DATASET, "mix": MIX, "out": str(out), "timeout": 60,
            "runs": [{"name": "whole", "workers": 2}, {"name": "stop", "workers": 2, "stop": 7}]}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(JOB), json.dumps(spec)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank-{r}.json").read_text()) for r in range(2)]
    every = {name: Counter(s["__key__"] for s in tarproc.read_samples(paths)) for name, paths in sources.items()}
    return {"sources": sources, "ranks": ranks, "every": every}


def test_every_rank_draws_the_same_sources_and_every_sample_comes_once(job: dict[str, Any]) -> None:
    whole = [r["whole"] for r in job["ranks"]]
    tags = [[name for name, _ in w["steps"]] for w in whole]
    assert tags[0] == tags[1]  # the same source at every step, the same number of steps
    lengths = whole[0]["lengths"]
    assert whole[1]["lengths"] == lengths  # with counts every rank has the same batches of each source
    assert tags[0] == draws(MIX["seed"], 0, 0, lengths, [])
    for w in whole:
        assert w["drawn"] == lengths  # the planned shares: every batch of every source, once
    for name in SIZES:
        got = Counter(k for w in whole for source, keys in w["steps"] if source == name for k in keys)
        assert got == job["every"][name], name
        assert all(k.startswith(name) for w in whole for source, keys in w["steps"] if source == name for k in keys)


def test_a_job_stopped_on_2_x_2_resumes_on_1_x_1(job: dict[str, Any]) -> None:
    stopped = [r["stop"] for r in job["ranks"]]
    assert [len(s["steps"]) for s in stopped] == [7, 7]
    assert [n for n, _ in stopped[0]["steps"]] == [n for n, _ in stopped[1]["steps"]]
    state = stopped[0]["state"]
    assert state["step"] == 7
    sources = {name: tarproc.Dataset(paths, rank=0, world_size=1, **DATASET) for name, paths in job["sources"].items()}
    mix = tarproc.Mix(sources, WEIGHTS, tagged=True, num_workers=1, **MIX)
    mix.load_state_dict(state)
    left = {name: len(ds) for name, ds in sources.items()}  # what each source has left, on one rank
    rest = [(name, list(keys)) for name, (keys,) in mix]
    assert [n for n, _ in rest] == draws(MIX["seed"], 0, 7, left, state["dropped"])  # the rest of the same draws
    for name in SIZES:
        before = Counter(k for s in stopped for source, keys in s["steps"] if source == name for k in keys)
        after = Counter(k for source, keys in rest if source == name for k in keys)
        assert before + after == job["every"][name], name  # every sample of every source once
