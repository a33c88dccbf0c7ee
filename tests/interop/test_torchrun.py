"""Multi-rank training for real: ``torchrun`` with gloo on the CPU (2 and 3 ranks x 0, 1 and 2
DataLoader workers) over shards of unequal sizes (100/100/100/73) and no manifest. Each rank's
model is wrapped in DDP, so unequal step counts would hang (the job's process group times out
instead): equal steps, every key exactly once per epoch, padding, counts that lie stop every rank
with the shard named, a job stopped on 3 x 2 resumes on 2 x 1 and the reverse, a repeat stream
resumes, and without counts the ranks end the epoch together.

A torchrun start costs seconds (torch's import in every rank), so the runs are grouped: one start
runs several of them in one process group (tests/interop/torchrun_job.py), in three starts that
depend on each other's states, plus one that fails on purpose."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import tarhelpers
from tarhelpers import write_tar

import tarproc

pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif(sys.platform != "linux", reason="torchrun on Linux"), pytest.mark.timeout(300)]
SIZES = [100, 100, 100, 73]  # the new user's ImageFolder in 4 shards
BASE = {"batch_size": 16, "shuffle": 50, "seed": 7, "to_tuple": ["__key__"]}
REPEAT = {**BASE, "repeat": True, "batches_per_epoch": 20}
UNCOUNTED = {**BASE, "lengths": None, "shuffle": 0}
PADDED = {**BASE, "pad": True, "to_tuple": ["__key__", "__valid__"]}


def torchrun(directory: Path, shards: list[str], ranks: int, runs: list[dict[str, Any]],
             timeout: int = 60) -> tuple[int, list[dict[str, Any]], str]:
    return tarhelpers.torchrun(directory, shards, ranks, runs, BASE, timeout)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three starts: 2 ranks, 3 ranks (resuming the first's state), 2 ranks again (resuming the second's)."""
    directory = tmp_path_factory.mktemp("ddp")
    shards, n = [], 0
    for s, size in enumerate(SIZES):
        samples = [{"__key__": f"img{n + i:04d}", "cls": (n + i) % 10} for i in range(size)]
        shards.append(str(write_tar(directory / f"train-{s}.tar", samples)))
        n += size
    every = Counter(s["__key__"] for s in tarproc.read_samples(shards))
    got: dict[str, Any] = {"shards": shards, "every": every, "errors": {}}

    def start(ranks: int, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rc, results, err = torchrun(directory, shards, ranks, runs)
        assert rc == 0, err[-3000:]
        got.setdefault("stderr", []).append(err)
        return results

    two = start(2, [*({"name": f"workers{w}", "workers": w} for w in (0, 1, 2)),
                    {"name": "stop", "workers": 1, "stop": 3},
                    {"name": "repeat", "workers": 2, "dataset": REPEAT},
                    {"name": "repeat-stop", "workers": 2, "dataset": REPEAT, "stop": 7},
                    *({"name": f"uncounted{w}", "workers": w, "dataset": UNCOUNTED} for w in (0, 2))])
    three = start(3, [*({"name": f"workers{w}", "workers": w} for w in (0, 1, 2)),
                      {"name": "padded", "workers": 1, "dataset": PADDED},
                      {"name": "stop", "workers": 2, "stop": 3},
                      {"name": "resumed", "workers": 2, "state": two[1]["stop"]["state"]}])
    again = start(2, [{"name": "resumed", "workers": 1, "state": three[2]["stop"]["state"]},
                      *({"name": f"repeat-resumed{r}", "workers": 2, "dataset": REPEAT,
                         "state": two[r]["repeat-stop"]["state"]} for r in range(2))])
    got.update({2: two, 3: three, "again": again})
    return got


def keys(results: list[dict[str, Any]], run: str) -> Counter[str]:
    return Counter(k for r in results for b in r[run]["batches"] for k in b)


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_equal_steps_and_every_key_once_without_a_manifest(ddp: dict[str, Any], ranks: int, workers: int) -> None:
    results = ddp[ranks]
    run = f"workers{workers}"
    assert len({r[run]["steps"] for r in results}) == 1 and results[0][run]["steps"] == results[0][run]["len"]
    assert keys(results, run) == ddp["every"]


def test_padding_marks_the_copies(ddp: dict[str, Any]) -> None:
    results = [r["padded"] for r in ddp[3]]
    assert len({tuple(len(b) for b in r["batches"]) for r in results}) == 1  # the same batch sizes everywhere
    valid = Counter(k for r in results for b, v in zip(r["batches"], r["valid"], strict=True)
                    for k, ok in zip(b, v, strict=True) if ok)
    assert valid == ddp["every"] and sum(not ok for r in results for v in r["valid"] for ok in v) == 2


@pytest.mark.parametrize("before,after", [((3, "stop"), ("again", "resumed")), ((2, "stop"), (3, "resumed"))],
                         ids=["3x2-then-2x1", "2x1-then-3x2"])
def test_stop_on_one_layout_and_resume_on_another(ddp: dict[str, Any], before: tuple[Any, str], after: tuple[Any, str]) -> None:
    first, rest = ddp[before[0]], ddp[after[0]]
    states = [r[before[1]]["state"] for r in first]
    assert all(s == states[0] for s in states)  # any rank's state resumes every rank
    run = after[1]
    assert len({r[run]["steps"] for r in rest}) == 1 and rest[0][run]["steps"] == rest[0][run]["len"]
    assert keys(first, before[1]) + keys(rest, run) == ddp["every"]  # before + after: every key once


def test_repeat_stream_resumes_from_any_ranks_state(ddp: dict[str, Any]) -> None:
    whole, first, again = ddp[2], ddp[2], ddp["again"]
    for state_of in range(2):
        for r in range(2):
            resumed = first[r]["repeat-stop"]["batches"] + again[r][f"repeat-resumed{state_of}"]["batches"]
            assert resumed == whole[r]["repeat"]["batches"]


@pytest.mark.parametrize("workers", [0, 2])
def test_without_counts_the_ranks_end_the_epoch_together(ddp: dict[str, Any], workers: int) -> None:
    results = ddp[2]
    run = f"uncounted{workers}"
    assert len({r[run]["steps"] for r in results}) == 1  # no hang: the same steps on every rank
    first = ddp["stderr"][0]  # the 2-rank start's
    assert first.count("lengths=None: the epoch ended when the first rank ran out") <= 2  # once a job (2 runs)
    seen = keys(results, run)
    assert all(n == 1 for n in seen.values()) and set(seen) <= set(ddp["every"])
    # what the epoch left out is counted (rank 0 holds the job's count): nothing lost without a word
    assert sum(seen.values()) + results[0][run]["lost"] == sum(ddp["every"].values())
    assert not results[0][run]["lost"] or f"leaving out {results[0][run]['lost']} samples" in first


def test_counts_that_lie_stop_every_rank_naming_the_shard(ddp: dict[str, Any], tmp_path: Path) -> None:
    runs = [{"name": "lie", "dataset": {**BASE, "lengths": [100, 100, 100, 60]}}]
    rc, _, err = torchrun(tmp_path, ddp["shards"], 2, runs, timeout=20)
    assert rc != 0 and "train-3.tar: holds 73 samples, but its count (given) says 60" in err
