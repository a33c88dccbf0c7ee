"""Equal steps, exactly once and resume on another layout, with sample counts found by the dataset
itself (no manifest): ranks are simulated in one process (``rank=``, ``world_size=``) over real
DataLoader workers; ``tests/interop/test_torchrun.py`` runs the same under torchrun."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import pytest
from tarhelpers import rank_batches, write_tar

import tarproc
from tarproc.dataset import Dataset
from tarproc.errors import DatasetError, OptionError, ShardCountError

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")
SIZES = [10, 10, 10, 7]  # the new user's 100/100/100/73, smaller


def make_shards(directory: Path, sizes: list[int] = SIZES) -> list[str]:
    paths, n = [], 0
    for s, size in enumerate(sizes):
        samples = [{"__key__": f"k{n + i:04d}", "cls": (n + i) % 5} for i in range(size)]
        paths.append(str(write_tar(directory / f"train-{s}.tar", samples)))
        n += size
    return paths


def every_key(paths: list[str]) -> Counter[str]:
    return Counter(s["__key__"] for s in tarproc.read_samples(paths))


def run_ranks(paths: list[str], world: int, workers: int, *, state: dict | None = None, stop: int | None = None,
              **kwargs: object) -> tuple[list[list[list[str]]], dict | None]:
    """Every rank's batches of keys (one epoch, or ``stop`` steps), and rank 0's state at the stop."""
    return rank_batches(paths, world, workers, state=state, stop=stop,
                        **{"batch_size": 4, "shuffle": 6, "seed": 1, "to_tuple": ("__key__",), **kwargs})


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_equal_steps_and_every_key_once_with_no_manifest(tmp_path: Path, world: int, workers: int) -> None:
    paths = make_shards(tmp_path)
    ranks, _ = run_ranks(paths, world, workers)
    assert len({len(batches) for batches in ranks}) == 1  # DDP: the same number of steps on every rank
    assert Counter(k for batches in ranks for b in batches for k in b) == every_key(paths)
    ds = Dataset(paths, batch_size=4, rank=0, world_size=world)
    assert len(ds) == len(ds.loader(num_workers=workers)) == len(ranks[0])
    last = [batches[-1] for batches in ranks]
    assert max(map(len, last)) - min(map(len, last)) <= 1  # only the last batches differ, by one at most


def test_counts_come_from_index_files_and_a_lie_is_an_error_naming_the_shard(tmp_path: Path) -> None:
    paths = make_shards(tmp_path)
    for p in paths:
        Path(p + ".idx").write_bytes(tarproc.build_index(p).jsonl_bytes())
    ds = Dataset(paths, batch_size=4)
    assert ds.lengths == dict(zip(paths, SIZES, strict=True)) and "index" in ds.count_sources[paths[3]]
    # a shard rewritten with fewer samples at the same size of index claims: the reader says so
    for given, holds in (([10, 10, 10, 10], 7), ([10, 10, 10, 6], 7)):
        for workers in (0, 2):
            loader = Dataset(paths, batch_size=4, lengths=given, rank=1, world_size=2).loader(num_workers=workers)
            error = DatasetError if workers else ShardCountError
            with pytest.raises(error, match=rf"train-3.tar: holds {holds} samples, but its count \(given\) says {given[3]}"):
                list(loader)


def test_padding_marks_the_copies_and_keeps_every_key_once(tmp_path: Path) -> None:
    paths = make_shards(tmp_path)
    seen: Counter[str] = Counter()
    shapes = set()
    for rank in range(3):
        ds = Dataset(paths, batch_size=4, pad=True, rank=rank, world_size=3, to_tuple=("__key__", "__valid__"))
        batches = list(ds.loader(num_workers=2))
        shapes.add(tuple(len(k) for k, _ in batches))
        for keys, valid in batches:
            assert valid.dtype == torch.bool
            seen.update(k for k, v in zip(keys, valid.tolist(), strict=True) if v)
    assert len(shapes) == 1  # the same batch sizes on every rank
    assert seen == every_key(paths)
    with pytest.raises(OptionError, match="__valid__"):
        Dataset(paths, pad=True, to_tuple=("__key__",))


@pytest.mark.parametrize("before,after", [((3, 2), (2, 1)), ((2, 1), (3, 2)), ((2, 0), (1, 3))])
def test_resume_on_another_world_size_and_worker_count(tmp_path: Path, before: tuple[int, int], after: tuple[int, int]) -> None:
    paths = make_shards(tmp_path)
    first, state = run_ranks(paths, *before, stop=2)
    assert state is not None and state["mode"] == "steps"
    rest, _ = run_ranks(paths, *after, state=state)
    assert len({len(b) for b in rest}) == 1
    keys = Counter(k for ranks in (first, rest) for batches in ranks for b in batches for k in b)
    assert keys == every_key(paths)  # before + after: every key once


def test_resume_twice_then_the_next_epoch_is_whole(tmp_path: Path) -> None:
    paths = make_shards(tmp_path)
    a, state = run_ranks(paths, 3, 2, stop=1)
    b, state = run_ranks(paths, 2, 1, state=state, stop=2)
    c, _ = run_ranks(paths, 1, 2, state=state)
    keys = Counter(k for ranks in (a, b, c) for batches in ranks for bt in batches for k in bt)
    assert keys == every_key(paths)
    # a state saved at the end of an epoch resumes at the next one
    done, end = run_ranks(paths, 2, 1, stop=len(run_ranks(paths, 2, 1)[0][0]))
    ds = Dataset(paths, batch_size=4, shuffle=6, seed=1, rank=0, world_size=2, to_tuple=("__key__",))
    ds.load_state_dict(end)
    assert ds.epoch == 1


def test_a_state_loaded_and_saved_again_before_any_batch_is_the_same(tmp_path: Path) -> None:
    paths = make_shards(tmp_path)
    _, state = run_ranks(paths, 2, 1, stop=2)
    loader = Dataset(paths, batch_size=4, shuffle=6, seed=1, rank=0, world_size=2).loader(num_workers=2)
    loader.load_state_dict(state)
    assert loader.state_dict() == state


@pytest.mark.parametrize("workers", [0, 2])
def test_repeat_stream_resumes_to_the_same_sequence(tmp_path: Path, workers: int) -> None:
    paths = make_shards(tmp_path)

    def loader() -> tarproc.Loader:
        ds = Dataset(paths, batch_size=4, shuffle=6, seed=2, repeat=True, batches_per_epoch=15, to_tuple=("__key__",))
        return ds.loader(num_workers=workers)

    whole = [list(k) for (k,) in loader()]
    assert len(whole) == 15  # 15 batches of 4 from 37 samples: more than one pass
    first = loader()
    part = []
    for (keys,) in first:
        part.append(list(keys))
        if len(part) == 6:
            break
    state = json.loads(json.dumps(first.state_dict()))
    again = loader()
    again.load_state_dict(state)
    assert part + [list(k) for (k,) in again] == whole


def test_map_that_drops_samples_keeps_the_number_of_steps(tmp_path: Path) -> None:
    paths = make_shards(tmp_path)
    steps = set()
    for rank in range(2):
        ds = Dataset(paths, batch_size=4, rank=rank, world_size=2, to_tuple=("__key__",),
                     map=lambda s: None if s["cls"] == 0 else s)
        steps.add(len(list(ds.loader(num_workers=2))))
    assert len(steps) == 1


def test_state_of_a_plain_dataloader_with_workers_is_an_error(tmp_path: Path) -> None:
    paths = make_shards(tmp_path)
    ds = Dataset(paths, batch_size=4)
    next(iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)))
    with pytest.raises(OptionError, match=r"ds.loader\(num_workers=N\)"):
        ds.state_dict()


def test_several_ranks_without_counts_in_a_plain_dataloader_is_an_error_not_a_hang(tmp_path: Path) -> None:
    paths = make_shards(tmp_path)
    ds = Dataset(paths, batch_size=4, lengths=None, rank=0, world_size=2)
    with pytest.raises(DatasetError, match=r"ds.loader\(num_workers=N\)"):
        list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
    with pytest.raises(TypeError, match="no sample count"):
        len(ds)


BAD_STATES = [
    ({"version": 1}, "version 1"),
    ({"seed": "x"}, "'seed'"),
    ({"epoch": -1}, "'epoch'"),
    ({"fingerprint": 5}, "'fingerprint'"),
    ({"mode": "other"}, "'mode'"),
    ({"steps": "3"}, "'steps'"),
    ({"plan": {"batch_size": 0}}, "'plan'"),
    ({"work": [[99, [[0, 1]]]]}, "'work'"),
    ({"work": [[0, [[5, 2]]]]}, "bad range"),
    ({"work": "x"}, "'work'"),
    ({"world_size": 0}, "'world_size'"),
]


@pytest.mark.parametrize("change,message", BAD_STATES, ids=[m for _, m in BAD_STATES])
def test_a_state_that_cannot_be_used_is_refused_at_load(tmp_path: Path, change: dict, message: str) -> None:
    paths = make_shards(tmp_path)
    _, state = run_ranks(paths, 2, 1, stop=1)
    assert state is not None
    with pytest.raises(OptionError, match=message):
        Dataset(paths, batch_size=4, shuffle=6, seed=1).load_state_dict({**state, **change})
    for bad in ([], None, "state"):
        with pytest.raises(OptionError, match="not a tarproc dataset state"):
            Dataset(paths).load_state_dict(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_resume_on_the_same_layout_continues_the_same_sequence(tmp_path: Path, workers: int) -> None:
    paths = make_shards(tmp_path)
    whole, _ = run_ranks(paths, 2, workers)
    for stop in (1, 3, 4):
        first, state = run_ranks(paths, 2, workers, stop=stop)
        rest, again = run_ranks(paths, 2, workers, state=state, stop=1)
        assert again is not None and again["steps"] == stop + 1  # saved again: the steps of the whole epoch
        rest, _ = run_ranks(paths, 2, workers, state=state)
        for rank in range(2):
            assert first[rank] + rest[rank] == whole[rank]


def test_a_resumed_part_starts_at_its_first_sample_where_an_index_is_at_hand(tmp_path: Path) -> None:
    paths = make_shards(tmp_path)
    ds = Dataset(paths, batch_size=4, rank=1, world_size=2, to_tuple=("__key__",))
    keys = [k for (b,) in ds for k in b]
    assert ds.seeks == 1 and keys[0] == "k0019"  # rank 1 begins in the middle of train-1.tar
    # damage after the seek: the error names the byte in the shard, not in what was read
    index = tarproc.build_index(paths[1])
    Path(paths[1] + ".idx").write_bytes(index.jsonl_bytes())
    last = index.entries[-1].offset
    with open(paths[1], "r+b") as f:
        f.seek(last + 148)  # the header's checksum
        f.write(b"garbage!")
    with pytest.raises(tarproc.TarFormatError, match=rf"train-1.tar: .* at byte {last}\b"):
        list(Dataset(paths, batch_size=4, rank=1, world_size=2, lengths=SIZES))


def test_parts_mix_a_class_sorted_dataset_better_than_whole_shards(tmp_path: Path) -> None:
    # 8 shards written in class order (5 classes each): each reader's buffer sees one shard at a time
    # when shards are the units, pieces of many shards when parts are
    n, classes = 2000, 40
    paths = [str(write_tar(tmp_path / f"sorted-{s}.tar", [{"__key__": f"k{i:05d}", "cls": i * classes // n}
                                                          for i in range(s * 250, (s + 1) * 250)])) for s in range(8)]

    def distinct(**kwargs: object) -> float:
        counts = []
        for rank in range(2):
            ds = Dataset(paths, batch_size=32, shuffle=200, seed=3, rank=rank, world_size=2, to_tuple=("cls",),
                         tensors="numpy", **kwargs)
            counts += [len(set(b[0].tolist())) for b in ds]
        return sum(counts) / len(counts)

    whole, parts = distinct(part_size=None), distinct(part_size=25)
    assert parts > 1.25 * whole, (parts, whole)  # 13.3 against 9.6 classes a batch (an ideal shuffle: 22)


@pytest.mark.parametrize("shuffle", [0, 6])
def test_a_replayed_reader_reads_only_what_its_buffer_held_and_what_is_left(tmp_path: Path, shuffle: int) -> None:
    paths = make_shards(tmp_path)

    def dataset() -> Dataset:
        return Dataset(paths, batch_size=4, shuffle=shuffle, seed=1, to_tuple=("__key__",), part_size=None)

    whole = [list(b[0]) for b in dataset()]
    first = dataset()
    head = []
    for b in first:
        head.append(list(b[0]))
        if len(head) == 4:  # 16 samples: in the middle of the second shard
            break
    resumed = dataset()
    resumed.load_state_dict(first.state_dict())
    assert head + [list(b[0]) for b in resumed] == whole  # the same sequence
    assert resumed.seeks >= 1  # and it started reading mid-shard instead of reading what it had handed out


# ---------------------------------------------------------------------------------------------
# what a review found: each failed before its fix


def test_padding_in_a_repeat_stream_keeps_the_steps_equal(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [3])
    for workers in (0, 2):
        steps = [len(list(Dataset(paths, rank=r, world_size=2, batch_size=1, pad=True, repeat=True, batches_per_epoch=4,
                                  to_tuple=("__key__", "__valid__")).loader(num_workers=workers))) for r in range(2)]
        assert steps == [4, 4]


def test_a_nominal_epoch_is_whole_with_more_workers_than_batches_in_a_pass(tmp_path: Path) -> None:
    loader = Dataset(make_shards(tmp_path, [2]), batch_size=1, repeat=True, batches_per_epoch=4,
                     to_tuple=("__key__",)).loader(num_workers=4)
    assert len(loader) == len(list(loader)) == 4


@pytest.mark.timeout(60)
def test_a_repeat_stream_whose_share_is_empty_ends_instead_of_spinning(tmp_path: Path) -> None:
    ds = Dataset(make_shards(tmp_path, [1]), rank=1, world_size=2, batch_size=1, lengths=None, repeat=True,
                 batches_per_epoch=3, to_tuple=("__key__",))
    assert list(ds) == []  # rank 1's part of the one-sample shard holds nothing (a warning says why ranks may differ)


def test_an_index_older_than_its_shard_is_not_trusted(tmp_path: Path) -> None:
    shard = tmp_path / "s.tar"
    write_tar(shard, [{"__key__": "k0", "bin": b"x" * 1500}] + [{"__key__": f"k{i}", "bin": b"y"} for i in range(1, 5)])
    index = tarproc.build_index(str(shard)).jsonl_bytes()
    size = shard.stat().st_size
    write_tar(shard, [{"__key__": f"k{i}", "bin": b"z"} for i in range(6)])  # rewritten: the same size
    assert shard.stat().st_size == size
    idx = Path(str(shard) + ".idx")
    idx.write_bytes(index)
    os.utime(idx, ns=(shard.stat().st_mtime_ns - 10**9,) * 2)  # made before the shard was rewritten
    got = []
    for r in range(5):
        ds = Dataset([str(shard)], rank=r, world_size=5, batch_size=1, shuffle_shards=True, part_size=1,
                     to_tuple=("__key__",))
        got += [k for (b,) in ds for k in b]
    assert ds.lengths == {str(shard): 6} and sorted(got) == [f"k{i}" for i in range(6)]
    # an index newer than the shard but not of it: the reader that starts mid-shard finds another sample there
    os.utime(idx, ns=(shard.stat().st_mtime_ns + 10**9,) * 2)
    with pytest.raises((tarproc.IndexFileError, ShardCountError)):
        for r in range(5):
            list(Dataset([str(shard)], rank=r, world_size=5, batch_size=1, shuffle_shards=True, part_size=1,
                         lengths=[6]))


def test_a_shard_said_to_be_empty_is_checked(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [4, 3])
    with pytest.raises(ShardCountError, match="train-1.tar: holds 3 samples, but its count \\(given\\) says 0"):
        Dataset(paths, lengths=[4, 0])


def test_a_state_leaving_fewer_samples_than_ranks_is_refused_at_load(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [5])
    loader = Dataset(paths, batch_size=4, to_tuple=("__key__",)).loader()
    next(iter(loader))
    with pytest.raises(OptionError, match="leaves 1 samples of epoch 0, fewer than this run's 3 ranks"):
        Dataset(paths, batch_size=4, rank=0, world_size=3).loader().load_state_dict(loader.state_dict())


DAMAGED = [
    ({"work": [[0, [[0, 1e400]]]]}, "'work'"),
    ({"work": [[0, [[0, 2.5]]]]}, "'work'"),
    ({"work": [[0, [["0", 3]]]]}, "'work'"),
    ({"work": [[True, [[0, 3]]]]}, "'work'"),
    ({"work": [[0, [[0, 3]]], [0, [[2, 5]]]]}, "overlap"),
    ({"epoch": 2**64}, "'epoch'"),
    ({"workers": 3000}, "'workers'"),
    ({"world_size": 10**7}, "'world_size'"),
    ({"steps": 10**9}, "'steps': 1000000000 is past the"),  # was: an epoch from nowhere
]


@pytest.mark.parametrize("change,message", DAMAGED, ids=[str(c)[:30] for c, _ in DAMAGED])
@pytest.mark.timeout(30)
def test_a_damaged_state_is_refused_naming_the_field(tmp_path: Path, change: dict, message: str) -> None:
    paths = make_shards(tmp_path)
    _, state = run_ranks(paths, 2, 1, stop=1)
    assert state is not None
    with pytest.raises(OptionError, match=message):
        Dataset(paths, batch_size=4, shuffle=6, seed=1, rank=0, world_size=2).load_state_dict({**state, **change})


def test_a_map_that_empties_a_batch_skips_it_on_one_rank(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [6])
    drop = {"k0002", "k0003"}
    ds = Dataset(paths, batch_size=2, map=lambda s: None if s["__key__"] in drop else s, to_tuple=("__key__",))
    assert [list(b) for (b,) in ds] == [["k0000", "k0001"], ["k0004", "k0005"]]
    with pytest.raises(DatasetError, match="every sample of a batch of . was dropped"):
        list(Dataset(paths, batch_size=2, map=lambda s: None if s["__key__"] in drop else s, rank=0, world_size=2))


def test_counts_past_what_a_shard_can_hold_are_refused(tmp_path: Path) -> None:
    paths = make_shards(tmp_path)
    with pytest.raises(OptionError, match="more samples than a shard can hold"):
        Dataset(paths, lengths=[10**30] * len(paths))
