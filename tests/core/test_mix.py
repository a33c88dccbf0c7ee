"""tarproc.dataset.mix.Mix: weighted mixing of datasets, seeded, stratified and resumable.

Most tests read the sources in this process (``_have_torch`` patched to False: what a machine
without torch does), with numpy batches; ``test_real_loaders_*`` use torch Loaders with 2 workers.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tarhelpers import write_tar

import tarproc.dataset.mix as mixmod
from tarproc.dataset import Dataset
from tarproc.dataset.mix import Mix, concat_batches, largest_remainder
from tarproc.errors import OptionError

COLUMNS = ("__key__", "cls", "txt")


@pytest.fixture
def inproc(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read the sources in this process, as without torch (numpy batches, no DataLoader)."""
    monkeypatch.setattr(mixmod, "_have_torch", lambda: False)


def shards(directory: Path, name: str, n: int, per_shard: int = 0) -> list[str]:
    """Shards of ``n`` samples keyed ``{name}{i:04d}`` (cls i, txt "{name}-{i}")."""
    per_shard = per_shard or n
    paths = []
    for s, start in enumerate(range(0, n, per_shard)):
        rows = [{"__key__": f"{name}{i:04d}", "cls": i, "txt": f"{name}-{i}"} for i in range(start, min(n, start + per_shard))]
        paths.append(str(write_tar(directory / f"{name}-{s:03d}.tar", rows)))
    return paths


def make(tmp: Path, sizes: dict[str, int], batch: int = 4, shuffle: int = 0, **kw: Any) -> dict[str, Dataset]:
    out = {}
    for name, n in sizes.items():
        paths = shards(tmp, name, n, per_shard=max(1, n // 2))
        out[name] = Dataset(paths, batch_size=batch, shuffle=shuffle, seed=11, to_tuple=COLUMNS, tensors="numpy", **kw)
    return out


def tags_and_keys(batches: Any) -> list[tuple[str, list[str]]]:
    return [(name, list(b[0])) for name, b in batches]


def oracle(seed: int, epoch: int, step: int, names: list[str], weights: dict[str, float]) -> str:
    """The documented draw: random.Random(f"{seed}/mix/{epoch}/{step}").choices(names, weights)."""
    return random.Random(f"{seed}/mix/{epoch}/{step}").choices(names, [weights[n] for n in names])[0]


# ---------------------------------------------------------------------------------------------
# compose="batches": the draw


def test_proportions_over_2000_batches_with_restarting_sources(tmp_path: Path, inproc: None) -> None:
    ds = make(tmp_path, {"a": 40, "b": 12}, shuffle=8)  # 10 and 3 batches per pass: both restart often
    mix = Mix(ds, [0.8, 0.2], seed=0, until=2000, tagged=True)
    assert len(mix) == 2000
    got = tags_and_keys(mix)
    assert len(got) == 2000
    count = Counter(name for name, _ in got)
    assert abs(count["a"] / 2000 - 0.8) <= 0.02 and abs(count["b"] / 2000 - 0.2) <= 0.02, count
    assert all(k.startswith(name) for name, keys in got for k in keys)  # each batch whole from its source
    assert mix.drawn == dict(count)
    # a source runs out at the draw after its last batch and restarts there: (drawn - 1) // batches per pass
    assert mix.exhausted == {"a": (count["a"] - 1) // 10, "b": (count["b"] - 1) // 3}
    # every pass of a is complete and each is a new epoch of it (a new shuffle)
    a_keys = [k for name, keys in got if name == "a" for k in keys]
    passes = [a_keys[i:i + 40] for i in range(0, len(a_keys) - 39, 40)]
    assert all(sorted(p) == [f"a{i:04d}" for i in range(40)] for p in passes)
    assert len({tuple(p) for p in passes[:5]}) == 5
    # the next mix epoch starts each source at the epoch after the last one it ran
    sources = mix.state_dict()["sources"]
    assert sources["a"]["epoch"] == mix.exhausted["a"] + 1 and sources["b"]["epoch"] == mix.exhausted["b"] + 1


def test_the_draw_is_the_documented_function_of_seed_epoch_and_step(tmp_path: Path, inproc: None) -> None:
    def run(seed: int) -> list[tuple[str, list[str]]]:
        return tags_and_keys(Mix(make(tmp_path, {"a": 40, "b": 12}, shuffle=5), [0.8, 0.2], seed=seed, until=60, tagged=True))

    first = run(5)
    assert run(5) == first  # same seed: same sources, same batches
    other = run(6)
    assert [t for t, _ in other] != [t for t, _ in first]
    weights = {"a": 0.8, "b": 0.2}
    assert [t for t, _ in first] == [oracle(5, 0, s, ["a", "b"], weights) for s in range(60)]


def test_each_iteration_is_the_next_epoch_and_set_epoch_picks_one(tmp_path: Path, inproc: None) -> None:
    mix = Mix(make(tmp_path, {"a": 40, "b": 12}), {"a": 1, "b": 3}, seed=2, until=25, tagged=True)
    weights = {"a": 0.25, "b": 0.75}
    assert mix.epoch == 0
    for epoch in (0, 1):
        assert [t for t, _ in mix] == [oracle(2, epoch, s, ["a", "b"], weights) for s in range(25)]
    assert mix.epoch == 2
    mix.set_epoch(7)
    assert [t for t, _ in mix] == [oracle(2, 7, s, ["a", "b"], weights) for s in range(25)]
    it = iter(mix)  # epoch 8, broken off after 3 steps: the next iteration is epoch 9
    for _ in range(3):
        next(it)
    assert mix.epoch == 8 and mix.step == 3
    assert [t for t, _ in mix] == [oracle(2, 9, s, ["a", "b"], weights) for s in range(25)]
    with pytest.raises(OptionError, match="superseded"):
        next(it)


def test_until_first_ends_at_the_draw_that_finds_a_source_empty(tmp_path: Path, inproc: None) -> None:
    ds = make(tmp_path, {"a": 20, "b": 400}, shuffle=6)  # a: 5 batches, b: 100
    alone = Dataset(ds["b"].urls, batch_size=4, shuffle=6, seed=11, to_tuple=COLUMNS, tensors="numpy")
    b_order = [k for keys, *_ in alone for k in keys]  # b's epoch 0 on its own
    mix = Mix(ds, [0.5, 0.5], seed=3, until="first", tagged=True)
    got = tags_and_keys(mix)
    tags = [oracle(3, 0, s, ["a", "b"], mix.weights) for s in range(400)]
    sixth_a = [i for i, t in enumerate(tags) if t == "a"][5]
    # exactly the steps before the 6th draw of a; a gave its whole pass, each key once
    assert [t for t, _ in got] == tags[:sixth_a]
    assert sorted(k for t, keys in got if t == "a" for k in keys) == [f"a{i:04d}" for i in range(20)]
    # b was cut mid-pass: its keys are the start of its epoch-0 order, none repeated
    b_keys = [k for t, keys in got if t == "b" for k in keys]
    assert b_keys == b_order[: len(b_keys)] and len(b_keys) < 400
    assert mix.exhausted == {"a": 1, "b": 0} and mix.drawn == {"a": 5, "b": sixth_a - 5}
    assert mix.epoch == 1 and mix.state_dict()["step"] == 0


def _all_rule(seed: int, weights: dict[str, float], left: dict[str, int]) -> list[str]:
    """The documented until="all" rule: draw among the sources still in; one found empty drops out
    and the same generator draws again among the rest (their weights renormalised by choices)."""
    left, active, out = dict(left), list(left), []
    while True:
        rng = random.Random(f"{seed}/mix/0/{len(out)}")
        name = rng.choices(active, [weights[n] for n in active])[0]
        while left[name] == 0:
            active.remove(name)
            if not active:
                return out
            name = rng.choices(active, [weights[n] for n in active])[0]
        left[name] -= 1
        out.append(name)


def test_until_all_drops_sources_out_and_renormalises(tmp_path: Path, inproc: None) -> None:
    every = sorted([f"a{i:04d}" for i in range(24)] + [f"b{i:04d}" for i in range(30)] + [f"c{i:04d}" for i in range(10)])
    for seed in range(8):
        ds = make(tmp_path, {"a": 24, "b": 30, "c": 10})  # batches per pass: 6, 8 (the last of 2 samples), 3
        mix = Mix(ds, {"a": 6, "b": 3, "c": 1}, seed=seed, until="all", tagged=True)
        got = tags_and_keys(mix)
        # every key of every source exactly once, in 6 + 8 + 3 steps, each source dropping out once
        assert sorted(k for _, keys in got for k in keys) == every
        assert len(got) == 17 and mix.exhausted == {"a": 1, "b": 1, "c": 1} and mix.drawn == {"a": 6, "b": 8, "c": 3}
        assert [t for t, _ in got] == _all_rule(seed, mix.weights, {"a": 6, "b": 8, "c": 3})


def test_until_n_restarts_a_small_source_for_exactly_n_steps(tmp_path: Path, inproc: None) -> None:
    ds = make(tmp_path, {"big": 400, "small": 8}, shuffle=4)  # small: 2 batches per pass
    mix = Mix(ds, [0.5, 0.5], seed=9, until=50, tagged=True)
    got = tags_and_keys(mix)
    assert len(got) == 50 and len(mix) == 50
    small = [k for t, keys in got if t == "small" for k in keys]
    passes = [small[i:i + 8] for i in range(0, len(small) - 7, 8)]
    assert len(passes) >= 5 and all(sorted(p) == [f"small{i:04d}" for i in range(8)] for p in passes)
    assert mix.exhausted["small"] == (mix.drawn["small"] - 1) // 2 and mix.exhausted["big"] == 0


# ---------------------------------------------------------------------------------------------
# compose="stratified"


def test_largest_remainder_rounding() -> None:
    assert largest_remainder([1, 1, 1], 10) == [4, 3, 3]
    assert largest_remainder([0.7, 0.3], 10) == [7, 3]
    assert largest_remainder([0.5, 0.3, 0.2], 7) == [4, 2, 1]  # quotas 3.5, 2.1, 1.4
    assert sum(largest_remainder([3, 5, 7, 11], 64)) == 64


def test_stratified_batches_hold_exact_shares_concatenated(tmp_path: Path, inproc: None) -> None:
    ds = make(tmp_path, {"a": 72, "b": 60}, shuffle=5)  # a: 10 batches of 7 and a short one of 2
    mix = Mix(ds, {"a": 0.7, "b": 0.3}, compose="stratified", batch_size=10, until="first", seed=1)
    assert mix.per_batch == {"a": 7, "b": 3}
    batches = list(mix)
    assert ds["a"].batch_size == 7 and ds["b"].batch_size == 3
    assert len(batches) == 10  # the short 11th batch of a counts as a running out
    for keys, cls, txt in batches:
        assert isinstance(keys, list) and isinstance(cls, np.ndarray) and isinstance(txt, list)
        assert [k[0] for k in keys] == ["a"] * 7 + ["b"] * 3
        assert cls.tolist() == [int(k[1:]) for k in keys] and txt == [f"{k[0]}-{int(k[1:])}" for k in keys]
    a_keys = [k for keys, *_ in batches for k in keys[:7]]
    assert len(set(a_keys)) == 70
    assert mix.exhausted == {"a": 1, "b": 0} and mix.drawn == {"a": 10, "b": 10}


def test_stratified_dict_batches_and_three_sources(tmp_path: Path, inproc: None) -> None:
    ds = {}
    for name in ("x", "y", "z"):
        ds[name] = Dataset(shards(tmp_path, name, 30), batch_size=1, tensors="numpy")  # dicts of columns
    mix = Mix(ds, [1, 1, 1], compose="stratified", batch_size=10, until=12)
    assert mix.per_batch == {"x": 4, "y": 3, "z": 3}
    batches = list(mix)
    assert len(batches) == 12
    for batch in batches:
        assert set(batch) == {"__key__", "cls", "txt"}
        assert [k[0] for k in batch["__key__"]] == list("xxxxyyyzzz")
        assert isinstance(batch["cls"], np.ndarray) and batch["cls"].shape == (10,)
        assert batch["txt"] == [f"{k[0]}-{int(k[1:])}" for k in batch["__key__"]]
    # y and z (3 per batch, 30 per pass) ran out once in 12 steps: the 11th step restarted them
    assert mix.exhausted == {"x": 1, "y": 1, "z": 1}  # x: 4 per batch, 7 full batches, then a short one


def test_stratified_refuses_sources_of_another_structure(tmp_path: Path, inproc: None) -> None:
    a = Dataset(shards(tmp_path, "a", 8), batch_size=1, to_tuple=("__key__", "cls"), tensors="numpy")
    b = Dataset(shards(tmp_path, "b", 8), batch_size=1, to_tuple=("__key__", "txt"), tensors="numpy")
    with pytest.raises(OptionError, match=r"column 1 differs between sources 'a' and 'b': array from 'a', list from 'b'"):
        next(iter(Mix({"a": a, "b": b}, [1, 1], compose="stratified", batch_size=4)))
    c = Dataset(shards(tmp_path, "c", 8), batch_size=1, tensors="numpy")  # dicts
    with pytest.raises(OptionError, match="sources 'a' and 'c' give batches of different structure"):
        next(iter(Mix({"a": a, "c": c}, [1, 1], compose="stratified", batch_size=4)))
    with pytest.raises(OptionError, match="column 0 of sources 'p' and 'q' can't be concatenated"):
        concat_batches([("p", (np.zeros((2, 3)),)), ("q", (np.zeros((2, 4)),))])


# ---------------------------------------------------------------------------------------------
# resume


def _rows(mix: Mix, batches: Any) -> list[Any]:
    if mix.compose == "stratified":
        return [list(b[0]) for b in batches]
    return tags_and_keys(batches)


@pytest.mark.parametrize("shuffle", [0, 5])
@pytest.mark.parametrize(("compose", "until", "stops"), [
    ("batches", "first", [0, 1, 6, None]),  # None: after the last batch, before the end is seen
    ("batches", "all", [3, 9, None]),
    ("batches", 37, [1, 20, 36, 37]),
    ("stratified", 23, [4, 22]),
])
def test_resume_mid_stream_equals_an_uninterrupted_run(
    tmp_path: Path, inproc: None, compose: str, until: str | int, stops: list[int | None], shuffle: int
) -> None:
    """Stop after k steps, save (JSON), resume in a new Mix, stop again up to 2 steps later, resume
    again: the whole epoch, and the next one, equal an uninterrupted run's exactly (source and
    batch keys in order), shuffled sources too."""
    def new() -> Mix:
        ds = make(tmp_path, {"a": 26, "b": 14, "c": 9}, shuffle=shuffle)
        extra: dict[str, Any] = {"batch_size": 8} if compose == "stratified" else {"tagged": True}
        return Mix(ds, {"a": 0.5, "b": 0.3, "c": 0.2}, seed=7, compose=compose, until=until, **extra)

    full = new()
    full.set_epoch(2)
    epoch2, epoch3 = _rows(full, full), _rows(full, full)
    assert len(epoch2) > 3 and (epoch2 != epoch3 or (shuffle == 0 and compose == "stratified"))
    for stop in stops:
        k = len(epoch2) if stop is None else stop
        mix = new()
        mix.set_epoch(2)
        it = iter(mix)
        head = _rows(mix, [next(it) for _ in range(k)])
        state = json.loads(json.dumps(mix.state_dict()))  # plain JSON
        assert state["epoch"] == 2 and state["step"] == k
        del it
        resumed = new()
        resumed.load_state_dict(state)
        resumed.set_epoch(2)  # the loaded epoch: keeps the position
        assert resumed.state_dict() == state  # a loaded state is the position until it moves on
        it = iter(resumed)  # stop again up to two steps later (some sources not drawn since), in the epoch
        more = _rows(resumed, [b for _, b in zip(range(min(2, len(epoch2) - k)), it, strict=False)])
        state = json.loads(json.dumps(resumed.state_dict()))
        del it
        again = new()
        again.load_state_dict(state)
        assert head + more + _rows(again, again) == epoch2, f"stopped after {k}"
        assert _rows(again, again) == epoch3, "the next epoch"


def test_state_of_a_finished_epoch_resumes_at_the_next(tmp_path: Path, inproc: None) -> None:
    mix = Mix(make(tmp_path, {"a": 12, "b": 8}), [0.5, 0.5], seed=1, until=9, tagged=True)
    list(mix)
    state = mix.state_dict()
    assert state["epoch"] == 1 and state["step"] == 0 and all(s["loader"] is None for s in state["sources"].values())
    want = _rows(mix, mix)
    other = Mix(make(tmp_path, {"a": 12, "b": 8}), [0.5, 0.5], seed=1, until=9, tagged=True)
    other.load_state_dict(state)
    assert _rows(other, other) == want


# ---------------------------------------------------------------------------------------------
# bad states and arguments


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def change(state: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = state
        for p in parents:
            target = target[p]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return change


@pytest.mark.parametrize(("change", "field"), [
    (_set("step", KeyError), "no field 'step'"),
    (_set("version", 2), "field 'version'"),
    (_set("seed", 8), "field 'seed'"),
    (_set("until", "first"), "field 'until'"),
    (_set("compose", "stratified"), "field 'compose'"),
    (_set("weights", {"a": 0.5, "b": 0.5}), "field 'weights'"),
    (_set("sources", {"a": {"epoch": 0, "loader": None}, "x": {"epoch": 0, "loader": None}}), "field 'sources'"),
    (_set("epoch", -1), "field 'epoch'"),
    (_set("step", "3"), "field 'step'"),
    (_set("step", True), "field 'step'"),
    (_set("sources.a.epoch", "0"), "field 'sources.a.epoch'"),
    (_set("sources.a.loader", 5), "field 'sources.a.loader'"),
    (_set("sources.a.loader", {"junk": 1}), "field 'sources.a.loader'"),
    (_set("sources.b.loader", {"junk": 1}), "field 'sources.b.loader'"),  # after a's was taken: undone
    (_set("sources.b", []), "field 'sources.b'"),
    (_set("dropped", ["zz"]), "field 'dropped'"),
    (_set("dropped", ["a", "b"]), "field 'dropped'"),
    (_set("drawn", {"a": 1}), "field 'drawn'"),
    (_set("exhausted", {"a": 0, "b": -1}), "field 'exhausted'"),
])
def test_bad_states_are_refused_at_load_naming_the_field(
    tmp_path: Path, inproc: None, change: Callable[[dict[str, Any]], None], field: str
) -> None:
    def new() -> Mix:
        return Mix(make(tmp_path, {"a": 40, "b": 40}), [0.6, 0.4], seed=3, until="all", tagged=True)

    full = tags_and_keys(new())
    mix = new()
    it = iter(mix)
    for _ in range(5):
        next(it)
    good = json.loads(json.dumps(mix.state_dict()))
    assert good["sources"]["a"]["loader"] is not None and good["sources"]["b"]["loader"] is not None
    state = json.loads(json.dumps(good))
    change(state)
    other = new()
    other.load_state_dict(good)
    with pytest.raises(OptionError, match=field.replace(".", r"\.")):
        other.load_state_dict(state)
    assert other.state_dict() == good  # refused whole: the position is the one loaded before
    assert tags_and_keys(other) == full[5:]
    with pytest.raises(OptionError, match="not a Mix state"):
        other.load_state_dict([state])  # type: ignore[arg-type]


def test_bad_arguments_are_option_errors(tmp_path: Path, inproc: None) -> None:
    ds = make(tmp_path, {"a": 8, "b": 8, "c": 8})
    two = {"a": ds["a"], "b": ds["b"]}
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: Mix({}, []), "at least one source"),
        (lambda: Mix("ab", [1, 1]), "sources must be a mapping"),
        (lambda: Mix({"a": [1, 2]}, [1]), "source 'a' is not a tarproc.Dataset"),
        (lambda: Mix({"a": ds["a"], "b": ds["a"]}, [1, 1]), "same Dataset object"),
        (lambda: Mix(two, [1]), "1 weights for 2 sources"),
        (lambda: Mix(two, {"a": 1, "x": 1}), "weights name"),
        (lambda: Mix(two, [1, 0]), "bad weight 0 of source 'b'"),
        (lambda: Mix(two, [1, -2]), "bad weight -2"),
        (lambda: Mix(two, [1, float("nan")]), "bad weight nan"),
        (lambda: Mix(two, [1, "1"]), "bad weight '1'"),
        (lambda: Mix(two, [1, True]), "bad weight True"),
        (lambda: Mix(two, [1, 1], seed="1"), "bad seed"),  # type: ignore[arg-type]
        (lambda: Mix(two, [1, 1], compose="mixed"), "bad compose"),
        (lambda: Mix(two, [1, 1], until="last"), "bad until"),
        (lambda: Mix(two, [1, 1], until=0), "bad until"),
        (lambda: Mix(two, [1, 1], until=True), "bad until"),
        (lambda: Mix(two, [1, 1], batch_size=8), "batch_size= is for compose='stratified'"),
        (lambda: Mix(two, [1, 1], compose="stratified"), "needs batch_size >= the number of sources"),
        (lambda: Mix(ds, [1, 1, 1], compose="stratified", batch_size=2), "needs batch_size >= the number of sources"),
        (lambda: Mix(two, [1, 1], compose="stratified", batch_size=8, until="all"), "until='all' is for compose='batches'"),
        (lambda: Mix(two, [1, 1], compose="stratified", batch_size=8, tagged=True), "tagged=True is for compose='batches'"),
        (lambda: Mix(two, [0.97, 0.03], compose="stratified", batch_size=10), "source 'b': weight 0.03 gives 0 of 10"),
        (lambda: Mix(two, [1, 1], num_workers=-1), "bad num_workers -1"),
        (lambda: Mix(two, [1, 1], num_workers={"x": 1}), "num_workers names unknown sources"),
        (lambda: Mix(two, [1, 1], num_workers=2), "needs PyTorch"),  # read in this process
        (lambda: Mix(two, [1, 1], pin_memory=True), "needs PyTorch"),
    ]
    for make_it, message in cases:
        with pytest.raises(OptionError, match=message):
            make_it()
    mix = Mix(two, [1, 1])
    with pytest.raises(OptionError, match="bad epoch -1"):
        mix.set_epoch(-1)
    with pytest.raises(TypeError, match="has no length"):
        len(mix)


# ---------------------------------------------------------------------------------------------
# torch: real Loaders with workers; and no torch at all


def _loader_sources(tmp_path: Path) -> dict[str, Dataset]:
    return {n: Dataset(shards(tmp_path, n, size, per_shard=size // 2), batch_size=4, shuffle=5, seed=2,
                       to_tuple=("__key__", "cls"))
            for n, size in (("a", 40), ("b", 16))}


def _loader_run(tmp_path: Path, stop: int) -> tuple[list[tuple[str, list[str]]], list[tuple[str, list[str]]]]:
    """An uninterrupted run over Loaders with 2 workers, and one stopped after ``stop`` steps and resumed."""
    def new() -> Mix:
        return Mix(_loader_sources(tmp_path), [0.7, 0.3], seed=5, until=30, tagged=True, num_workers=2)

    full = tags_and_keys(new())
    mix = new()
    it = iter(mix)
    head = tags_and_keys(next(it) for _ in range(stop))
    state = json.loads(json.dumps(mix.state_dict()))
    del it
    resumed = new()
    resumed.load_state_dict(state)
    return full, head + tags_and_keys(resumed)


def test_real_loaders_with_workers_resume_and_concatenate_tensors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    full, again = _loader_run(tmp_path, 11)
    assert len(full) == 30 and Counter(t for t, _ in full)["b"] >= 5  # b (4 batches a pass) restarts
    assert again == full  # the same draws, and each source goes on with the same batches

    strat = Mix(_loader_sources(tmp_path), [0.75, 0.25], compose="stratified", batch_size=8, until=6, num_workers={"a": 2})
    for keys, cls in strat:
        assert isinstance(cls, torch.Tensor) and cls.shape == (8,)
        assert [k[0] for k in keys] == list("aaaaaabb") and cls.tolist() == [int(k[1:]) for k in keys]


def test_without_torch_it_mixes_numpy_batches(tmp_path: Path) -> None:
    a, b = shards(tmp_path, "a", 12), shards(tmp_path, "b", 12)
    code = (
        "import sys; sys.modules['torch'] = None\n"  # import torch fails, as where it is not installed
        "import numpy, tarproc\n"
        "from tarproc.dataset.mix import Mix\n"
        f"ds = {{n: tarproc.Dataset(p, batch_size=1, to_tuple=('__key__', 'cls')) for n, p in (('a', {a!r}), ('b', {b!r}))}}\n"
        "mix = Mix(ds, [2, 1], compose='stratified', batch_size=6, until=5)\n"
        "batches = list(mix)\n"
        "assert len(batches) == 5 and all(isinstance(c, numpy.ndarray) and c.shape == (6,) for _, c in batches)\n"
        "assert [k[0] for k in batches[0][0]] == list('aaaabb')\n"
        "state = mix.state_dict(); assert state['epoch'] == 1, state\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.stdout.strip() == "ok", result.stderr


def test_stratified_ranks_end_at_the_same_step(tmp_path: Path) -> None:
    # with counts a rank's last batch of a source may hold one sample more or less than another rank's:
    # stratified mixing takes full batches only (each source's drop_last), so every rank ends together
    a, b = shards(tmp_path, "a", 7), shards(tmp_path, "b", 40)
    steps = []
    for rank in range(2):
        sources = {n: Dataset(p, rank=rank, world_size=2, to_tuple=("__key__",), tensors="numpy") for n, p in (("a", a), ("b", b))}
        batches = list(Mix(sources, {"a": 0.5, "b": 0.5}, compose="stratified", batch_size=4))
        assert all(len(keys) == 4 for (keys,) in batches)
        steps.append(len(batches))
    assert steps[0] == steps[1] == 1


def test_weights_whose_sum_overflows_are_refused_naming_the_fix(tmp_path: Path, inproc: None) -> None:
    # each weight finite, their sum past the largest float: before, a bare ValueError/ZeroDivisionError later
    ds = make(tmp_path, {"a": 8, "b": 8})
    with pytest.raises(OptionError, match=r"sum past the largest float .*scale them down"):
        Mix(ds, [1e308, 1e308])
    scaled = Mix(ds, [1e307, 1e307], until="all")  # large but summable: the ratios are what count
    assert scaled.weights == {"a": 0.5, "b": 0.5} and len(list(scaled)) == 4


def test_a_weight_too_small_to_ever_be_drawn_is_refused(tmp_path: Path, inproc: None) -> None:
    # before, [1e308, 1e-308] silently never drew the second source
    ds = make(tmp_path, {"a": 8, "b": 8})
    with pytest.raises(OptionError, match=r"source 'b': weight 1e-308 is 0 of the total.* never be drawn"):
        Mix(ds, [1e308, 1e-308])
    with pytest.raises(OptionError, match="source 'a'.*never be drawn"):
        Mix(ds, {"a": 1e-17, "b": 1.0})
    assert Mix(ds, [1e-300, 1e-300]).weights == {"a": 0.5, "b": 0.5}  # tiny but equal: fine


# ---------------------------------------------------------------------------------------------
# one set of workers for every source (torch, counts, num_workers a number)


def _shared_sources(tmp_path: Path, sizes: dict[str, int], **kw: Any) -> Callable[[], dict[str, Dataset]]:
    paths = {name: shards(tmp_path, name, n, per_shard=max(1, n // 2)) for name, n in sizes.items()}
    options = {"batch_size": 4, "shuffle": 5, "seed": 2, "to_tuple": ("__key__", "cls"), **kw}
    return lambda: {name: Dataset(p, **options) for name, p in paths.items()}


@pytest.mark.parametrize("until", ["first", "all", 23])
def test_one_set_of_workers_gives_what_a_loader_per_source_gives(tmp_path: Path, until: Any) -> None:
    pytest.importorskip("torch")
    sources = _shared_sources(tmp_path, {"a": 40, "b": 22, "c": 13})
    shared = Mix(sources(), [0.5, 0.3, 0.2], seed=4, until=until, tagged=True, num_workers=2)
    assert shared.shared  # no DataLoader per source
    apart = Mix(sources(), [0.5, 0.3, 0.2], seed=4, until=until, tagged=True, num_workers=dict.fromkeys("abc", 2))
    assert not apart.shared
    got, expected = tags_and_keys(shared), tags_and_keys(apart)
    assert got == expected  # batch k of a source's pass made by worker k % 2 either way
    assert shared.drawn == apart.drawn and shared.exhausted == apart.exhausted
    if until == "all":
        every = Counter(k for _, keys in got for k in keys)
        assert len(every) == 75 and set(every.values()) == {1}


def test_one_set_of_workers_mixes_stratified_batches_with_restarts(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    sources = _shared_sources(tmp_path, {"a": 40, "b": 16})
    shared = Mix(sources(), [0.75, 0.25], compose="stratified", batch_size=8, until=9, num_workers=2)
    apart = Mix(sources(), [0.75, 0.25], compose="stratified", batch_size=8, until=9, num_workers={"a": 2, "b": 2})
    got = [(list(keys), cls) for keys, cls in shared]
    assert [k for k, _ in got] == [list(keys) for keys, _ in apart]
    # a (6 batches of 6) and b (8 batches of 2) each ran out once and started their next epoch
    assert shared.shared and shared.exhausted == apart.exhausted == {"a": 1, "b": 1}
    for keys, cls in got:
        assert isinstance(cls, torch.Tensor) and [k[0] for k in keys] == list("aaaaaabb")


@pytest.mark.parametrize("stop", [1, 6, 13])
@pytest.mark.parametrize("after", [2, 1, 3, 0])
def test_one_set_of_workers_resumes_on_the_same_and_other_numbers_of_workers(tmp_path: Path, stop: int,
                                                                           after: int) -> None:
    pytest.importorskip("torch")
    sources = _shared_sources(tmp_path, {"a": 40, "b": 22, "c": 13})

    def new(workers: int) -> Mix:
        return Mix(sources(), [0.5, 0.3, 0.2], seed=4, until="all", tagged=True, num_workers=workers)

    full = tags_and_keys(new(2))
    mix = new(2)
    it = iter(mix)
    head = tags_and_keys(next(it) for _ in range(stop))
    state = json.loads(json.dumps(mix.state_dict()))
    del it
    resumed = new(after)
    resumed.load_state_dict(state)
    rest = tags_and_keys(resumed)
    if after == 2:
        assert head + rest == full  # the same layout: exactly the batches of an uninterrupted run
    else:  # another: the same draws (one rank: each source has the same batches left), every sample once
        assert [t for t, _ in head + rest] == [t for t, _ in full]
        assert Counter(k for _, keys in head + rest for k in keys) == Counter(k for _, keys in full for k in keys)
    assert resumed.epoch == 1 and resumed.step == 0


def test_one_set_of_workers_says_a_worker_error_in_one_line_naming_the_shard(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tarproc.errors import DatasetError

    a, b = shards(tmp_path, "a", 20), shards(tmp_path, "b", 20)
    lying = {"a": Dataset(a, batch_size=4, lengths=[24], to_tuple=("__key__",)),  # a holds 20
             "b": Dataset(b, batch_size=4, to_tuple=("__key__",))}
    mix = Mix(lying, [1, 1], until="all", num_workers=2)
    assert mix.shared
    with pytest.raises(DatasetError, match=r"a-000.tar: holds 20 samples, but its count \(given\) says 24"):
        list(mix)


def _image_shards(directory: Path, name: str, n: int) -> list[str]:
    from tarhelpers import encode_image

    rng = np.random.default_rng(len(name) + n)
    rows = [{"__key__": f"{name}{i:04d}", "cls": i, "jpg": encode_image(rng.integers(0, 255, (20, 28, 3), dtype=np.uint8))}
            for i in range(n)]
    return [str(write_tar(directory / f"{name}-img.tar", rows))]


def test_one_set_of_workers_keeps_one_ring_of_batch_buffers_for_sources_of_one_shape(tmp_path: Path) -> None:
    """Each new worker fills its ring of shared-memory batch buffers afresh (page faults): sources
    whose batches have one shape share one ring, so the workers allocate no more than one Dataset's
    would; a source of another batch shape keeps its own (sharing would swap shapes in and out)."""
    pytest.importorskip("torch")
    from tarproc.dataset.pool import RING
    from tarproc.decode import AugmentSpec

    spec = AugmentSpec(size=16)
    options = {"decode": spec, "shuffle": 4, "to_tuple": ("__key__", "jpg")}
    ds = {"a": Dataset(_image_shards(tmp_path, "a", 30), batch_size=4, **options),  # short last batches: 30 = 7x4 + 2
          "b": Dataset(_image_shards(tmp_path, "b", 21), batch_size=4, **options),
          "c": Dataset(_image_shards(tmp_path, "c", 9), batch_size=3, **options)}
    mix = Mix(ds, [0.4, 0.4, 0.2], until="all", num_workers=2, tagged=True)
    assert mix.shared
    pool = ds["a"]._pool
    assert ds["b"]._pool is pool and ds["c"]._pool is not pool
    for _ in range(2):
        got = [(name, list(keys), images.shape) for name, (keys, images) in mix]
        assert sorted(k for _, keys, _ in got for k in keys) == sorted(
            [f"a{i:04d}" for i in range(30)] + [f"b{i:04d}" for i in range(21)] + [f"c{i:04d}" for i in range(9)])
        assert all(shape[1:] == (16, 16, 3) and shape[0] == len(keys) for _, keys, shape in got)
        # per epoch, each of the 2 new workers allocates at most one ring for a and b together
        assert pool.allocated <= RING * 2 * (_ + 1)


def test_a_short_batch_is_made_in_a_full_size_buffer_of_the_ring(tmp_path: Path) -> None:
    """An epoch's short last batch is the first rows of a full-size buffer: the ring keeps one shape,
    so the short batch takes a buffer let go of instead of a fresh one (and the next full one too)."""
    pytest.importorskip("torch")
    from tarproc.decode import AugmentSpec

    ds = Dataset(_image_shards(tmp_path, "a", 6), batch_size=4, decode=AugmentSpec(size=16), to_tuple=("__key__", "jpg"))
    ds.worker_info = lambda: (0, 1, True)  # type: ignore[method-assign]  # as in a DataLoader worker
    full = ds.batch_buffer((4, 16, 16, 3), "uint8")
    ds._pool.settle(())  # the batch left without it: its buffer is free again
    short = ds.batch_buffer((2, 16, 16, 3), "uint8")
    assert tuple(short.handle.shape) == short.array.shape == (2, 16, 16, 3) and short.handle.is_shared()
    assert short.handle.untyped_storage().data_ptr() == full.handle.untyped_storage().data_ptr()
    assert (ds._pool.allocated, ds._pool.reused) == (1, 1)


def test_one_set_of_workers_holds_no_batch_it_handed_out(tmp_path: Path) -> None:
    """While the Mix waits for the next step, the batch it handed out is the training loop's alone:
    dropped there, its shared-memory buffer goes back to its worker at once."""
    import weakref

    pytest.importorskip("torch")
    from tarproc.decode import AugmentSpec

    options = {"decode": AugmentSpec(size=16), "batch_size": 4, "to_tuple": ("__key__", "jpg")}
    ds = {n: Dataset(_image_shards(tmp_path, n, 12), **options) for n in "ab"}
    mix = Mix(ds, [0.5, 0.5], until="all", num_workers=1)
    it = iter(mix)
    refs = []
    for _ in range(4):
        keys, images = next(it)
        refs.append(weakref.ref(images))
        del keys, images
        assert all(ref() is None for ref in refs)
    assert len(list(it)) == 2
