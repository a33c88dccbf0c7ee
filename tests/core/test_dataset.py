"""tarproc.Dataset with a real torch DataLoader: every key once per epoch across workers x ranks,
epochs, resume, handlers, errors from workers, and the main-process decode design (on dali-cpu)."""

from __future__ import annotations

import json
import os
import signal
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tarhelpers import encode_image, write_tar

import tarproc
from tarproc.dataset import Dataset, split_by_shard, split_work
from tarproc.dataset.split import whole_shards
from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec, dali_available
from tarproc.errors import DatasetError, DecodeError, OptionError

torch = pytest.importorskip("torch")
DataLoader = torch.utils.data.DataLoader
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def picture(i: int, w: int = 40, h: int = 30) -> np.ndarray:
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, np.full_like(x, (i * 37) % 256)], axis=-1)
    return np.clip(base + rng.normal(0, 10, base.shape), 0, 255).astype(np.uint8)


def make_shards(directory: Path, sizes: list[int], images: bool = False) -> list[str]:
    """Shards of the given sample counts; keys are unique across shards."""
    paths, n = [], 0
    for s, size in enumerate(sizes):
        samples = []
        for _ in range(size):
            sample: dict[str, object] = {"__key__": f"s{s}/k{n:05d}", "cls": n % 7, "txt": f"t{n}"}
            if images:
                sample["jpg"] = encode_image(picture(n), quality=90)
            samples.append(sample)
            n += 1
        paths.append(str(write_tar(directory / f"shard-{s:04d}.tar", samples)))
    return paths


def all_keys(paths: list[str]) -> list[str]:
    return [s["__key__"] for s in tarproc.read_samples(paths)]


def keys_of(batches) -> list[str]:  # type: ignore[no-untyped-def]
    return [k for b in batches for k in b[0]]


# ---------------------------------------------------------------------------------------------
# the split rules


@pytest.mark.parametrize("shards", [1, 2, 3, 7, 12])
@pytest.mark.parametrize("consumers", [1, 2, 3, 5, 6, 15])
def test_by_shard_split_covers_every_sample_once(shards: int, consumers: int) -> None:
    order = [f"u{i}" for i in range(shards)]
    size = 11
    seen = Counter()
    busy = 0
    for c in range(consumers):
        parts = split_by_shard(order, c, consumers).parts
        busy += bool(parts)
        for part in parts:
            seen.update((part.url, i) for i in range(size) if part.wants(i))
    assert seen == Counter({(u, i): 1 for u in order for i in range(size)})
    assert busy == consumers  # fewer shards than readers: shards are cut, nobody idles


@pytest.mark.parametrize("world,workers", [(1, 1), (2, 3), (3, 2), (4, 5)])
def test_split_with_counts_gives_every_rank_the_same_steps_and_every_sample_once(world: int, workers: int) -> None:
    lengths = {"a": 17, "b": 3, "c": 40, "d": 9}
    work = whole_shards(["c", "a", "d", "b"], lengths)
    steps: set[int] = set()
    seen: Counter[tuple[str, int]] = Counter()
    for r in range(world):
        batches = []
        for w in range(workers):
            a = split_work(work, r, world, w, workers, 5)
            seen.update((p.url, i) for p in a.parts for i in p.indices())
            assert sum(a.batches) == a.samples and a.dropped == 0
            batches += a.batches
        steps.add(len(batches))
        assert max(batches) <= 6 and sum(batches) in (69 // world, 69 // world + 1)
    assert len(steps) == 1  # DDP: every rank steps the same number of times
    assert seen == Counter({(u, i): 1 for u, n in lengths.items() for i in range(n)})


# ---------------------------------------------------------------------------------------------
# every key exactly once per epoch, with a real DataLoader


@pytest.mark.parametrize("sizes", [[13, 30], [5, 9, 1, 14, 7, 3, 11]], ids=["fewer-shards", "more-shards"])
@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2, 3, 5])
def test_each_key_once_per_epoch_across_workers_and_ranks(tmp_path: Path, sizes: list[int], world: int, workers: int) -> None:
    paths = make_shards(tmp_path, sizes)
    got: list[str] = []
    for rank in range(world):
        ds = Dataset(paths, batch_size=4, shuffle=5, seed=3, to_tuple=("__key__", "cls"), rank=rank, world_size=world)
        got += keys_of(DataLoader(ds, batch_size=None, num_workers=workers))
    assert Counter(got) == Counter(all_keys(paths))


def test_rank_and_world_from_torchrun_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = make_shards(tmp_path, [6, 6, 6, 6])
    got = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        ds = Dataset(paths, batch_size=4, to_tuple=("__key__",))
        mine = keys_of(DataLoader(ds, batch_size=None, num_workers=2))
        assert len(mine) == 12
        got += mine
    assert sorted(got) == sorted(all_keys(paths))


def test_equal_batches_per_rank_from_a_manifest(tmp_path: Path) -> None:
    sizes = [17, 3, 40, 9]
    paths = make_shards(tmp_path, sizes)
    manifest = tmp_path / "manifest.jsonl"
    manifest.write_text("".join(json.dumps({"shard": os.path.basename(p), "samples": n}) + "\n" for p, n in zip(paths, sizes, strict=True)))
    counts, got = [], []
    for rank in range(3):
        ds = Dataset(paths, batch_size=5, shuffle=10, lengths=str(manifest), rank=rank, world_size=3, to_tuple=("__key__",))
        batches = list(DataLoader(ds, batch_size=None, num_workers=2))
        counts.append(len(batches))
        got += keys_of(batches)
    assert len(set(counts)) == 1  # DDP: every rank steps the same number of times
    assert sorted(got) == sorted(all_keys(paths)) and ds.dropped == 0  # and no sample is left out


# ---------------------------------------------------------------------------------------------
# epochs: new shard order, shuffle and augmentations; the same for the same (seed, epoch)

SPEC = AugmentSpec(size=24, random_crop=True, flip=0.5, rotate=10, brightness=0.4, contrast=0.4, saturation=0.4,
                   hue=0.1, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")


def images_by_key(ds: Dataset, workers: int) -> dict[str, np.ndarray]:
    out = {}
    for keys, images in DataLoader(ds, batch_size=None, num_workers=workers):
        out.update(zip(keys, images.numpy(), strict=True))
    return out


@pytest.fixture(scope="module")
def image_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return make_shards(tmp_path_factory.mktemp("images"), [10, 7, 12], images=True)


def test_epochs_give_new_augmentations_reproducible_whatever_the_workers(image_shards: list[str]) -> None:
    def run(epoch: int, workers: int, seed: int = 1) -> dict[str, np.ndarray]:
        ds = Dataset(image_shards, decode=SPEC, shuffle=8, seed=seed, batch_size=4, to_tuple=("__key__", "jpg"))
        ds.set_epoch(epoch)
        return images_by_key(ds, workers)

    e0, e0_again, e0_two_workers, e1 = run(0, 0), run(0, 0), run(0, 2), run(1, 2)
    assert set(e0) == set(e1) == set(all_keys(image_shards))
    for key in e0:
        assert np.array_equal(e0[key], e0_again[key]) and np.array_equal(e0[key], e0_two_workers[key])
    assert sum(not np.allclose(e0[k], e1[k]) for k in e0) >= len(e0) - 1
    other_seed = run(0, 0, seed=2)
    assert sum(not np.allclose(e0[k], other_seed[k]) for k in e0) >= len(e0) - 1


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_batch_buffers_are_reused_only_once_the_loop_lets_go(image_shards: list[str], context: str) -> None:
    ds = Dataset(image_shards, decode=SPEC, batch_size=2, to_tuple=("__key__", "jpg"))

    def batches():  # type: ignore[no-untyped-def]
        ds.set_epoch(0)
        return DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)

    kept, copies = [], []
    for keys, images in batches():  # every batch kept, and a view of each
        assert isinstance(images, torch.Tensor) and images.is_shared()
        kept.append((keys, images, images[1:]))
        copies.append(images.clone())
    assert ds._pool.reused == 0
    for (_, images, tail), copy in zip(kept, copies, strict=True):
        assert torch.equal(images, copy) and torch.equal(tail, copy[1:])  # never written to while held
    reference = {k: image for (keys, _, _), copy in zip(kept, copies, strict=True) for k, image in zip(keys, copy, strict=True)}
    del kept, copies, images, tail
    again = {}
    for keys, images in batches():  # each batch let go at the next step: its buffer is written again
        again.update(zip(keys, images.clone(), strict=True))
    assert ds._pool.reused > 0
    assert set(again) == set(reference) and all(torch.equal(again[k], reference[k]) for k in reference)


@pytest.mark.parametrize("tensors", ["torch", "numpy"])
def test_batch_arrays_in_the_loops_process_are_reused_only_once_let_go(image_shards: list[str], tensors: str) -> None:
    """Without workers, batch arrays come from ``dataset.arrays.ARRAYS``: a batch (or a view, or
    a tensor on it) kept is never written to; one let go of is written again, batch after batch --
    through the shuffle buffer's tail too, which held every sample it handed out (and so its
    batch's array) until the end of the epoch."""
    from tarproc.dataset.arrays import ARRAYS

    ds = Dataset(image_shards, decode=SPEC, shuffle=20, batch_size=2, to_tuple=("__key__", "jpg"), tensors=tensors)
    ds.set_epoch(0)
    kept, copies = [], []
    for keys, images in ds:
        kept.append((keys, images, images[1:], torch.as_tensor(images)[0]))
        copies.append(images.copy() if tensors == "numpy" else images.clone())
    for (_, images, tail, row), copy in zip(kept, copies, strict=True):
        assert np.array_equal(images, copy) and np.array_equal(tail, copy[1:]) and np.array_equal(row, copy[0])
    reference = {k: np.asarray(image) for (keys, *_), copy in zip(kept, copies, strict=True)
                 for k, image in zip(keys, copy, strict=True)}
    del kept, copies, images, tail, row
    allocated, reused = ARRAYS.allocated, ARRAYS.reused
    ds.set_epoch(0)
    again = {}
    for keys, images in ds:  # each batch let go of at the next step
        again.update((k, np.array(image)) for k, image in zip(keys, images, strict=True))
    del images
    assert ARRAYS.allocated - allocated <= 3  # the loop's batch, the next one, and the short last one
    assert ARRAYS.reused - reused >= len(all_keys(image_shards)) // 2 - 3
    assert set(again) == set(reference) and all(np.array_equal(again[k], reference[k]) for k in reference)


def test_ring_buffers_reach_the_loop_by_descriptor_once_and_workers_that_ended_let_theirs_go(
        image_shards: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring buffer's descriptor comes once (then a number: ``pool._Handle``); the main process
    keeps it while its worker lives, and a held batch stays intact when its worker is gone and a
    new one writes into buffers of its own. Epochs of new workers, a persistent loader broken off
    mid-epoch, and torch's file_system strategy (no descriptors: torch's own reducer) alike."""
    import torch.multiprocessing

    from tarproc.dataset import pool

    monkeypatch.setattr(pool, "INLINE_BYTES", -1)  # the images by buffer, however small
    detached: list[bool] = []
    reference = images_by_key(Dataset(image_shards, decode=SPEC, seed=3, batch_size=2, to_tuple=("__key__", "jpg")), 0)
    ds = Dataset(image_shards, decode=SPEC, seed=3, batch_size=2, to_tuple=("__key__", "jpg"))
    real_mapped = pool._mapped

    def counting(p: Any, handle: Any) -> Any:
        detached.append(handle[-1] is not None)
        return real_mapped(p, handle)

    monkeypatch.setattr(pool, "_mapped", counting)
    held = None
    for _ in range(3):  # new workers every epoch
        ds.set_epoch(0)
        for keys, images in DataLoader(ds, batch_size=None, num_workers=2):
            assert all(torch.equal(image, torch.as_tensor(reference[k])) for k, image in zip(keys, images, strict=True))
            if held is None:
                held = (keys, images, images.clone())  # kept through every later epoch
        assert len(ds._pool._fds) <= 2 * pool.RING  # the workers that ended: closed at the next's first batch
    assert len(detached) > 20 and sum(detached) <= 3 * 2 * pool.RING  # a descriptor a buffer, not a batch
    assert torch.equal(held[1], held[2])

    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for i, _batch in enumerate(loader):  # broken off: the batches queued are dropped
        if i == 3:
            break
    ds.set_epoch(0)
    got = {k: image.clone() for keys, images in loader for k, image in zip(keys, images, strict=True)}
    assert got.keys() == reference.keys() and all(torch.equal(got[k], torch.as_tensor(reference[k])) for k in got)

    monkeypatch.setattr(torch.multiprocessing, "get_sharing_strategy", lambda: "file_system")
    detached.clear()
    ds.set_epoch(0)
    got = images_by_key(ds, 2)
    assert not detached and all(np.array_equal(got[k], reference[k]) for k in reference)  # torch's reducer sent them


def test_two_loaders_over_one_dataset_never_write_into_a_held_batch(image_shards: list[str]) -> None:
    """Workers of two DataLoaders iterating one dataset at once have the same worker ids: their
    leases must not mix (one loader's dropped batches must not free the other's held ones)."""
    ds = Dataset(image_shards, decode=SPEC, batch_size=2, to_tuple=("__key__", "jpg"))
    a = iter(DataLoader(ds, batch_size=None, num_workers=1))
    b = iter(DataLoader(ds, batch_size=None, num_workers=1))
    held = []
    for _keys, images in a:
        held.append((images, images.clone()))
        next(b, None)  # b's batch let go of at once
    assert len(held) > 8 and all(torch.equal(images, copy) for images, copy in held)
    assert ds._pool.reused > 0  # b's buffers were used again


def test_each_pass_is_the_next_epoch_without_set_epoch(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [9, 9, 9])
    ds = Dataset(paths, shuffle=100, seed=0, batch_size=3, to_tuple=("__key__",))
    loader = DataLoader(ds, batch_size=None, num_workers=2)
    orders = [keys_of(loader) for _ in range(3)]
    assert all(sorted(o) == sorted(all_keys(paths)) for o in orders)
    assert orders[0] != orders[1] != orders[2]
    ds.set_epoch(1)
    assert keys_of(loader) == orders[1]  # the same (seed, epoch), the same order


def test_set_epoch_reaches_persistent_workers(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [9, 9, 9])
    ds = Dataset(paths, shuffle=100, seed=0, batch_size=3, to_tuple=("__key__",))
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    ds.set_epoch(5)
    first = keys_of(loader)
    ds.set_epoch(6)
    second = keys_of(loader)
    ds.set_epoch(5)
    assert keys_of(loader) == first != second


def test_repeat_with_a_nominal_epoch_length(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [5, 5])
    ds = Dataset(paths, batch_size=4, repeat=True, batches_per_epoch=7, to_tuple=("__key__",))
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(batches) == 7 and len(keys_of(batches)) > 10  # more than one pass over 10 samples


# ---------------------------------------------------------------------------------------------
# resume: nothing repeated, nothing skipped


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_mid_epoch_continues_exactly(tmp_path: Path, workers: int) -> None:
    paths = make_shards(tmp_path, [11, 8, 13])

    def dataset() -> Dataset:
        return Dataset(paths, shuffle=6, seed=9, batch_size=3, to_tuple=("__key__",))

    loader = dataset().loader(num_workers=workers)
    ds0 = loader.dataset
    ds0.set_epoch(4)
    first: list[str] = []
    for i, (keys,) in enumerate(loader):
        first += keys
        if i == 4:
            break
    state = loader.state_dict()
    assert state["epoch"] == 4
    state = json.loads(json.dumps(state))  # it is plain JSON: save it anywhere
    resumed = dataset().loader(num_workers=workers)
    resumed.load_state_dict(state)
    rest = [k for (keys,) in resumed for k in keys]
    assert sorted(first + rest) == sorted(all_keys(paths))
    # and the whole epoch matches an uninterrupted run's set; the next epoch is epoch 5
    again = [k for (keys,) in resumed for k in keys]
    assert sorted(again) == sorted(all_keys(paths)) and resumed.state_dict()["epoch"] == 5


def test_resume_without_counts_refuses_another_layout_at_load(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [6, 6])
    loader = Dataset(paths, batch_size=2, to_tuple=("__key__",), lengths=None).loader(num_workers=2)
    next(iter(loader))
    state = loader.state_dict()
    other = Dataset(paths, batch_size=2, to_tuple=("__key__",), lengths=None).loader(num_workers=0)
    with pytest.raises(OptionError, match="same num_workers"):
        other.load_state_dict(state)
    with pytest.raises(OptionError, match="same seed"):
        Dataset(paths, seed=5, lengths=None).load_state_dict(state)
    with pytest.raises(OptionError, match="repeat=True"):
        Dataset(paths, repeat=True, lengths=None).load_state_dict(state)
    with pytest.raises(OptionError, match="another dataset"):
        Dataset(paths[:1], lengths=None).load_state_dict(state)


# ---------------------------------------------------------------------------------------------
# fields, tuples, tensors


def test_handlers_and_tensors(tmp_path: Path) -> None:
    buf = __import__("io").BytesIO()
    np.save(buf, np.arange(3, dtype=np.int16))
    path = write_tar(tmp_path / "f.tar", [
        {"__key__": f"k{i}", "cls": i, "json": json.dumps({"n": i}), "txt": f"hé{i}", "npy": buf.getvalue(), "bin": b"\x00"}
        for i in range(3)
    ])
    ds = Dataset(str(path), batch_size=3, handlers={"cls": int, "json": json.loads, "txt": bytes.decode, "npy": None})
    (batch,) = list(ds)
    assert batch["__key__"] == ["k0", "k1", "k2"] and batch["txt"] == ["hé0", "hé1", "hé2"]
    assert batch["json"] == [{"n": 0}, {"n": 1}, {"n": 2}] and batch["bin"] == [b"\x00"] * 3
    assert isinstance(batch["npy"], list) and batch["npy"][0][:6] == b"\x93NUMPY"  # handler None: bytes
    (labels, arrays), = list(Dataset(str(path), batch_size=3, to_tuple=("cls", "npy")))
    assert isinstance(labels, torch.Tensor) and labels.dtype == torch.int64 and labels.tolist() == [0, 1, 2]
    assert arrays.shape == (3, 3) and arrays.dtype == torch.int16
    (labels,), = list(Dataset(str(path), batch_size=3, to_tuple=("cls",), tensors="numpy"))
    assert isinstance(labels, np.ndarray)


def test_images_decoded_in_workers_as_float_tensors(image_shards: list[str]) -> None:
    ds = Dataset(image_shards, decode=SPEC, batch_size=8, to_tuple=("jpg", "cls"))
    batches = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert sum(len(b[1]) for b in batches) == 29
    images, labels = batches[0]
    assert images.shape == (8, 3, 24, 24) and images.dtype == torch.float32 and labels.dtype == torch.int64


# ---------------------------------------------------------------------------------------------
# bad input: one clear error in the main process, or skipped and counted


def test_corrupt_image_in_a_worker_is_one_line_naming_shard_key_and_field(tmp_path: Path) -> None:
    good = encode_image(picture(1), quality=90)
    path = write_tar(tmp_path / "bad.tar", [{"__key__": f"k{i}", "jpg": good if i != 5 else good[:200], "cls": 1} for i in range(8)])
    ds = Dataset(str(path), decode=AugmentSpec(size=16), batch_size=4, to_tuple=("jpg", "cls"))
    with pytest.raises(DatasetError) as e:
        list(DataLoader(ds, batch_size=None, num_workers=2))
    message = str(e.value)
    assert "\n" not in message and str(path) in message and "'k5'" in message and "'jpg'" in message, message
    skipping = Dataset(str(path), decode=AugmentSpec(size=16), batch_size=4, to_tuple=("jpg", "cls"), on_error="skip")
    assert sum(len(c) for _, c in DataLoader(skipping, batch_size=None, num_workers=2)) == 7


def test_failing_handler_names_the_field_in_process_too(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "h.tar", [{"__key__": "a", "cls": b"seven"}])
    with pytest.raises(DecodeError, match=r"h\.tar: cannot decode field 'cls' of sample 'a': handler '_int' failed"):
        list(Dataset(str(path)))
    with pytest.raises(DatasetError, match=r"field 'cls' of sample 'a'.*\(DataLoader worker 0\)$"):
        list(DataLoader(Dataset(str(path)), batch_size=None, num_workers=1))


def test_missing_shard_is_an_error_naming_it(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [4, 4])
    ds = Dataset(paths, batch_size=2)
    os.unlink(paths[1])  # gone after the dataset was made: mid-run, as a worker meets it
    with pytest.raises(DatasetError, match=f"{paths[1]}: .*no such file"):
        list(DataLoader(ds, batch_size=None, num_workers=2))


def _die_on_k3(sample: dict) -> dict:  # type: ignore[type-arg]
    if sample["__key__"].endswith("k00005"):
        os.kill(os.getpid(), signal.SIGKILL)
    return sample


@pytest.mark.timeout(60)
def test_a_dying_worker_is_an_error_not_a_hang(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [6, 6])
    ds = Dataset(paths, batch_size=2, map=_die_on_k3, to_tuple=("__key__",))
    with pytest.raises(DatasetError, match=f"DataLoader worker 0 died while reading {paths[0]}: "):
        list(ds.loader(num_workers=2))


def test_bad_arguments_are_option_errors(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [2])
    for kwargs in ({"batch_size": 0}, {"device": "tpu"}, {"on_error": "ignore"}, {"batches_per_epoch": 3},
                   {"rank": 1}, {"rank": 2, "world_size": 2}, {"decode_in": "main"}, {"lengths": [1, 2]}):
        with pytest.raises(OptionError):
            Dataset(paths, **kwargs)
    with pytest.raises(OptionError, match="stdin"):
        Dataset("-")


# ---------------------------------------------------------------------------------------------
# the gpu design, run on dali-cpu: workers batch encoded bytes, the main process decodes


@pytest.mark.skipif(not dali_available(), reason="NVIDIA DALI is not installed")
def test_main_process_decode_matches_worker_decode(image_shards: list[str]) -> None:
    spec = AugmentSpec(size=24, random_crop=True, flip=0.5, seed=4)
    cpu = Dataset(image_shards, decode=spec, batch_size=5, to_tuple=("__key__", "jpg", "cls"))
    main = Dataset(image_shards, decode=spec, device="dali-cpu", decode_in="main", batch_size=5, to_tuple=("__key__", "jpg", "cls"))
    want = {k: (im.numpy(), int(c)) for keys, ims, cls in DataLoader(cpu, batch_size=None, num_workers=2)
            for k, im, c in zip(keys, ims, cls, strict=True)}
    got = {}
    for keys, ims, cls in main.loader(num_workers=2):
        assert isinstance(ims, torch.Tensor) and ims.shape[1:] == (24, 24, 3)
        got.update({k: (im.numpy(), int(c)) for k, im, c in zip(keys, ims, cls, strict=True)})
    assert set(got) == set(want)
    for k in want:
        diff = np.abs(got[k][0].astype(int) - want[k][0])
        assert got[k][1] == want[k][1] and diff.mean() <= 1.0, (k, diff.mean())
    with pytest.raises(DatasetError, match="ds.loader"):
        list(DataLoader(main, batch_size=None, num_workers=1))


@pytest.mark.skipif(not dali_available(), reason="NVIDIA DALI is not installed")
def test_main_process_decode_skips_bad_rows_in_every_column(tmp_path: Path) -> None:
    good = encode_image(picture(2), quality=90)
    path = write_tar(tmp_path / "m.tar", [{"__key__": f"k{i}", "jpg": good if i != 2 else b"not a jpeg" * 20, "cls": i} for i in range(5)])
    ds = Dataset(str(path), decode=AugmentSpec(size=16), device="dali-cpu", decode_in="main", batch_size=5,
                 to_tuple=("jpg", "cls"), on_error="skip")
    (images, labels), = list(ds.loader(num_workers=1))
    assert images.shape[0] == 4 and labels.tolist() == [0, 1, 3, 4]
    ds_fail = Dataset(str(path), decode=AugmentSpec(size=16), device="dali-cpu", decode_in="main", batch_size=5)
    with pytest.raises(DecodeError, match="m.tar: cannot decode field 'jpg' of sample 'k2'"):
        list(ds_fail.loader(num_workers=1))


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_spawned_workers_share_the_epoch_clock(tmp_path: Path, context: str) -> None:
    import copy

    paths = make_shards(tmp_path, [9, 9])
    ds = Dataset(paths, shuffle=100, batch_size=3, to_tuple=("__key__",))
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    first, second = keys_of(loader), keys_of(loader)
    assert sorted(first) == sorted(second) == sorted(all_keys(paths)) and first != second
    assert ds.epoch == 2 and copy.deepcopy(ds).epoch == 2  # a copy has a clock of its own
    ds.set_epoch(0)
    assert keys_of(loader) == first


def test_pipe_urls_and_brace_lists(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, [3, 4])
    ds = Dataset([f"pipe:cat {paths[0]}", f"{tmp_path}/shard-{{0001..0001}}.tar"], batch_size=10, to_tuple=("__key__",))
    assert sorted(keys_of(DataLoader(ds, batch_size=None, num_workers=2))) == sorted(all_keys(paths))


@pytest.mark.skipif(not dali_available(), reason="NVIDIA DALI is not installed")
def test_dali_cpu_decodes_in_the_workers(image_shards: list[str]) -> None:
    spec = AugmentSpec(size=24, random_crop=True, seed=2, layout="CHW")
    ds = Dataset(image_shards, decode=spec, device="dali-cpu", batch_size=8, to_tuple=("__key__", "jpg"))
    got = images_by_key(ds, 2)
    want = images_by_key(Dataset(image_shards, decode=spec, batch_size=8, to_tuple=("__key__", "jpg")), 0)
    assert set(got) == set(want)
    assert all(np.abs(got[k].astype(int) - want[k]).mean() <= 1.0 for k in want)


def test_without_torch_it_is_a_plain_iterable_of_numpy(tmp_path: Path) -> None:
    import subprocess
    import sys

    paths = make_shards(tmp_path, [5])
    code = (
        "import sys; sys.modules['torch'] = None\n"  # import torch now fails, as where torch is not installed
        "import tarproc, numpy\n"
        f"ds = tarproc.Dataset({paths!r}, batch_size=2, to_tuple=('__key__', 'cls'))\n"
        "batches = list(ds)\n"
        "assert type(ds).__mro__[1:] == (tarproc.dataset.core.Dataset, object), type(ds).__mro__\n"
        "assert isinstance(batches[0][1], numpy.ndarray) and sum(len(b[0]) for b in batches) == 5\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


def test_help_shows_the_real_signature_and_docstring() -> None:
    import inspect
    import pydoc

    import tarproc

    assert list(inspect.signature(tarproc.Dataset).parameters)[:3] == ["urls", "batch_size", "shuffle"]
    text = pydoc.render_doc(tarproc.Dataset)
    assert "batch_size: 'int' = 64" in text and "Batches for training from sharded tar files" in text


def test_a_map_that_raises_names_the_shard_and_key_or_is_skipped(tmp_path: Path) -> None:
    from tarproc.errors import SampleError

    paths = make_shards(tmp_path, [6])

    def picky(sample: dict) -> dict:
        if sample["__key__"].endswith("3"):
            raise KeyError("no label")
        return sample

    with pytest.raises(SampleError, match=r"shard-0000\.tar: map failed on sample '.*3': KeyError: 'no label'"):
        list(Dataset(paths, batch_size=4, to_tuple=("__key__",), tensors="numpy", map=picky))
    ds = Dataset(paths, batch_size=4, to_tuple=("__key__",), tensors="numpy", map=picky, on_error="skip")
    keys = [k for (batch,) in ds for k in batch]
    assert len(keys) == 5 and not any(k.endswith("3") for k in keys) and ds.decode_stats.skipped == 1


def test_torch_tensors_from_map_are_stacked(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    paths = make_shards(tmp_path, [6])
    ds = Dataset(paths, batch_size=4, to_tuple=("x",), map=lambda s: {**s, "x": torch.ones(3) * int(s["cls"])})
    (first,) = next(iter(ds))
    assert isinstance(first, torch.Tensor) and first.shape == (4, 3)


def _shards_with_bad_samples(directory: Path) -> list[str]:
    """2 shards of 10: in each, one damaged image, one cls that is not a number, one sample map drops."""
    paths = []
    for s in range(2):
        samples: list[dict[str, object]] = []
        for i in range(10):
            n = s * 10 + i
            sample: dict[str, object] = {"__key__": f"s{s}k{n:03d}", "cls": n, "jpg": encode_image(picture(n), quality=90)}
            if i == 2:
                sample["jpg"] = b"\xff\xd8\xff\xe0 not a jpeg"
            if i == 5:
                sample["cls"] = "five"
            samples.append(sample)
        paths.append(str(write_tar(directory / f"bad-{s}.tar", samples)))
    return paths


def _drop_seven(sample: dict) -> dict:
    if sample["__key__"].endswith("7"):
        raise ValueError("seven")
    return sample


def _show_on_stderr(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    file: object = None, line: str | None = None) -> None:
    """Python's own ``warnings.showwarning``: the warning on stderr."""
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


@pytest.mark.parametrize("workers", [0, 2])
def test_decode_stats_add_up_over_workers_and_skipped_samples_are_said_once(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], workers: int
) -> None:
    paths = _shards_with_bad_samples(tmp_path)
    ds = Dataset(paths, batch_size=4, to_tuple=("__key__", "jpg", "cls"), decode=AugmentSpec(size=16), map=_drop_seven,
                 on_error="skip", device="cpu", tensors="numpy" if workers == 0 else "torch")
    out = 0
    with warnings.catch_warnings():
        # shown on stderr as Python shows them outside pytest, which records a forked worker's
        # warnings in that worker's memory only
        warnings.showwarning = _show_on_stderr
        for _epoch in range(2):
            batches = list(DataLoader(ds, batch_size=None, num_workers=workers) if workers else ds)
            out += sum(len(b[0]) for b in batches)
    stats = ds.decode_stats
    # every sample read is either out with its image decoded, or skipped: 3 bad of 10, per shard, per epoch
    assert (out, stats.decoded, stats.skipped) == (28, 28, 12)
    err = capfd.readouterr().err
    said = [line for line in err.splitlines() if "skipped:" in line]
    assert len(said) == 1 and ": DataWarning: skipped: " in said[0]
    assert "later ones are not said, only counted: ds.decode_stats.skipped" in said[0]
