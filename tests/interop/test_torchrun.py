"""Multi-rank training for real: ``torchrun`` with gloo on the CPU (2 and 3 ranks x 0, 1 and 2
DataLoader workers) over shards of unequal sizes and no manifest. Each rank's model is wrapped in
DDP, so unequal step counts would hang (the job's process group times out instead): equal steps,
every key exactly once per epoch, counts that lie stop every rank with the shard named, a job
stopped on one layout resumes on another, a repeat stream resumes, and without counts the ranks
end the epoch together."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tarhelpers import write_tar

import tarproc

pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="torchrun on Linux"), pytest.mark.timeout(240)]
JOB = Path(__file__).with_name("torchrun_job.py")
SIZES = [100, 100, 100, 73]  # the new user's ImageFolder in 4 shards


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    directory = tmp_path_factory.mktemp("ddp")
    paths, n = [], 0
    for s, size in enumerate(SIZES):
        samples = [{"__key__": f"img{n + i:04d}", "cls": (n + i) % 10} for i in range(size)]
        paths.append(str(write_tar(directory / f"train-{s}.tar", samples)))
        n += size
    return paths


def every_key(paths: list[str]) -> Counter[str]:
    return Counter(s["__key__"] for s in tarproc.read_samples(paths))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(tmp_path: Path, shards: list[str], ranks: int, workers: int, *, expect_ok: bool = True,
             **job: Any) -> tuple[list[dict[str, Any]], str]:
    out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}"
    out.mkdir()
    dataset = {"batch_size": 16, "shuffle": 50, "seed": 7, "to_tuple": ["__key__"], **job.pop("dataset", {})}
    spec = {"shards": shards, "workers": workers, "out": str(out), "dataset": dataset, **job}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(JOB), json.dumps(spec)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=200)
    if expect_ok:
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(ranks)], proc.stderr
    assert proc.returncode != 0
    return [], proc.stderr


def keys(results: list[dict[str, Any]]) -> Counter[str]:
    return Counter(k for r in results for b in r["batches"] for k in b)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_equal_steps_and_every_key_once_without_a_manifest(tmp_path: Path, shards: list[str], ranks: int, workers: int) -> None:
    results, _ = torchrun(tmp_path, shards, ranks, workers)
    assert len({r["steps"] for r in results}) == 1 and results[0]["steps"] == results[0]["len"]
    assert keys(results) == every_key(shards)


def test_padding_marks_the_copies(tmp_path: Path, shards: list[str]) -> None:
    results, _ = torchrun(tmp_path, shards, 3, 1, dataset={"pad": True, "to_tuple": ["__key__", "__valid__"]})
    assert len({tuple(len(b) for b in r["batches"]) for r in results}) == 1  # the same batch sizes everywhere
    valid = Counter(k for r in results for b, v in zip(r["batches"], r["valid"], strict=True)
                    for k, ok in zip(b, v, strict=True) if ok)
    assert valid == every_key(shards) and sum(not ok for r in results for v in r["valid"] for ok in v) == 2


def test_counts_that_lie_stop_every_rank_naming_the_shard(tmp_path: Path, shards: list[str]) -> None:
    for lie in ([100, 100, 100, 100], [100, 100, 100, 60]):
        _, err = torchrun(tmp_path, shards, 2, 1, expect_ok=False, dataset={"lengths": lie}, timeout=20)
        assert f"train-3.tar: holds 73 samples, but its count (given) says {lie[3]}" in err


@pytest.mark.parametrize("before,after", [((3, 2), (2, 1)), ((2, 1), (3, 2))])
def test_stop_on_one_layout_and_resume_on_another(tmp_path: Path, shards: list[str], before: tuple[int, int],
                                                  after: tuple[int, int]) -> None:
    first, _ = torchrun(tmp_path, shards, *before, stop=3)
    states = [r["state"] for r in first]
    assert all(s == states[0] for s in states)  # any rank's state resumes every rank
    rest, _ = torchrun(tmp_path, shards, *after, state=states[1])
    assert len({r["steps"] for r in rest}) == 1 and rest[0]["steps"] == rest[0]["len"]
    assert keys(first) + keys(rest) == every_key(shards)  # before + after: every key once


def test_repeat_stream_resumes(tmp_path: Path, shards: list[str]) -> None:
    dataset = {"repeat": True, "batches_per_epoch": 20}
    whole, _ = torchrun(tmp_path, shards, 2, 2, dataset=dataset)
    first, _ = torchrun(tmp_path, shards, 2, 2, dataset=dataset, stop=7)
    for rank in range(2):
        rest, _ = torchrun(tmp_path, shards, 2, 2, dataset=dataset, state=first[rank]["state"])
        for r in range(2):
            assert first[r]["batches"] + rest[r]["batches"] == whole[r]["batches"]


def test_without_counts_the_ranks_end_the_epoch_together(tmp_path: Path, shards: list[str]) -> None:
    for workers in (0, 2):
        results, err = torchrun(tmp_path, shards, 2, workers, dataset={"lengths": None, "shuffle": 0})
        assert len({r["steps"] for r in results}) == 1  # no hang: the same steps on every rank
        assert "no sample counts for 4 shards" in err and "all-reduce" in err
        seen = keys(results)
        assert all(n == 1 for n in seen.values()) and set(seen) <= set(every_key(shards))
