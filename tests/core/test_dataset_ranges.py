"""Images that wait in the shuffle buffer as ranges of their local shard (``FileRange``), read when
their batch is made: the same pixels as images read at once, a fraction of the memory, and every
promise kept when the shard changes under the reader, across workers and a resume."""

from __future__ import annotations

import io
import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from tarhelpers import encode_image, write_tar

import tarproc.dataset.core as core
from tarproc.dataset import Dataset
from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec
from tarproc.errors import SourceError
from tarproc.tar.ranges import held_files

torch = pytest.importorskip("torch")

SPEC = AugmentSpec(size=24, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")
BIG = 1 << 16  # the reader leaves data this big in a local file (tar.reader._VIEW)


def noisy_jpeg(i: int) -> bytes:
    """A 320x240 JPEG of noise, ~90 KB: over BIG, as a photo of a training set is."""
    rng = np.random.default_rng(i)
    data = encode_image(rng.integers(0, 256, (240, 320, 3), dtype=np.uint8), quality=95)
    assert len(data) > BIG
    return data


@pytest.fixture(scope="module")
def originals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Every shard's bytes by name: 5 shards of 8 samples, each a big JPEG, a label, and on every
    third sample a big field that is not an image."""
    out, n = {}, 0
    directory = tmp_path_factory.mktemp("made")
    for s in range(5):
        samples = []
        for _ in range(8):
            sample: dict[str, object] = {"__key__": f"s{s}/k{n:03d}", "jpg": noisy_jpeg(n), "cls": n % 7}
            if n % 3 == 0:
                sample["bin"] = bytes([n]) * (BIG + 100)
            samples.append(sample)
            n += 1
        path = write_tar(directory / f"shard-{s}.tar", samples)
        out[path.name] = path.read_bytes()
    return out


def shards(directory: Path, originals: dict[str, bytes]) -> list[str]:
    directory.mkdir(exist_ok=True)
    for name, data in originals.items():
        (directory / name).write_bytes(data)
    return [str(directory / name) for name in sorted(originals)]


def dataset(paths: list[str], **kw: object) -> Dataset:
    kw.setdefault("to_tuple", ("__key__", "jpg", "cls"))
    return Dataset(paths, decode=SPEC, shuffle=100, seed=3, batch_size=4, tensors="numpy", **kw)  # type: ignore[arg-type]


def by_key(batches: object) -> dict[str, np.ndarray]:
    return {k: np.array(image) for keys, images, _ in batches for k, image in zip(keys, images, strict=True)}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, originals: dict[str, bytes]) -> dict[str, np.ndarray]:
    """Epoch 0's images with every image read at once (no shard held: the limit at 0)."""
    paths = shards(tmp_path_factory.mktemp("reference"), originals)
    held = core.HELD_FILES
    core.HELD_FILES = 0
    try:
        return by_key(dataset(paths))
    finally:
        core.HELD_FILES = held


def _epoch_and_peak(paths: list[str]) -> tuple[dict[str, np.ndarray], int, int]:
    """Epoch 0 of dict batches: the images by key, the big non-image fields seen (each checked:
    bytes, its content), and the peak of Python's allocations (tracemalloc) while it ran."""
    got, bins = {}, 0
    tracemalloc.start()
    try:
        for batch in dataset(paths, to_tuple=None):
            got.update(zip(batch["__key__"], batch["jpg"], strict=True))
            for k, b in zip(batch["__key__"], batch.get("bin", [None] * len(batch["__key__"])), strict=True):
                if b is not None:  # the samples without one have None
                    assert type(b) is bytes and b == bytes([int(k[-3:])]) * (BIG + 100)  # read for the loop
                    bins += 1
            del batch
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return got, bins, peak


def test_images_wait_as_ranges_the_same_pixels_in_a_fraction_of_the_memory(
        tmp_path: Path, originals: dict[str, bytes], reference: dict[str, np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    paths = shards(tmp_path, originals)
    images = sum(len(data) for data in originals.values()) * 0.75  # about: the JPEGs are 3/4 of the shards
    held = held_files()
    got, bins, peak = _epoch_and_peak(paths)
    assert _same(got, reference) and bins == 14
    assert held_files() == held  # every shard let go of with the epoch's last image
    monkeypatch.setattr(core, "HELD_FILES", 0)  # every image read at once: the buffer (100 > 40) holds them all
    got, bins, eager = _epoch_and_peak(paths)
    assert _same(got, reference) and bins == 14
    assert eager > images and peak < eager / 3, (peak, eager, images)


def test_a_shard_rewritten_under_the_reader_still_gives_the_images_it_had(
        tmp_path: Path, originals: dict[str, bytes], reference: dict[str, np.ndarray]) -> None:
    """A rewrite (a new file renamed over the shard, as every tool here writes) after the shuffle
    buffer has taken the shard's samples: the images still come from the file they were in."""
    paths = shards(tmp_path, originals)
    it = iter(dataset(paths))
    first = [next(it)]
    for path in paths:
        new = Path(path + ".new")
        new.write_bytes(b"\0" * os.path.getsize(path))
        os.replace(new, path)
    assert _same(by_key(first + list(it)), reference)


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    return set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


def _change(path: str, how: str) -> None:
    if how == "cut":
        os.truncate(path, 1000)
    else:  # rewritten in place, as cp over it or rsync --inplace do: the same size, other bytes
        data = Path(path).read_bytes()
        with open(path, "r+b") as f:
            f.write(data[::-1])


@pytest.mark.parametrize("how", ["cut", "rewritten in place"])
def test_a_shard_changed_in_place_under_the_reader_is_an_error_naming_it(
        tmp_path: Path, originals: dict[str, bytes], how: str) -> None:
    """The shards changed in place instead: never a short image nor other bytes -- the error names
    the shard."""
    paths = shards(tmp_path, originals)
    it = iter(dataset(paths))
    next(it)
    for path in paths:
        _change(path, how)
    with pytest.raises(SourceError, match=r"shard-\d\.tar: the file was modified after its member headers were read"):
        list(it)


def test_with_on_error_skip_the_images_of_a_changed_shard_are_skipped_and_said(
        tmp_path: Path, originals: dict[str, bytes], reference: dict[str, np.ndarray]) -> None:
    paths = shards(tmp_path, originals)
    ds = dataset(paths, on_error="skip")
    it = iter(ds)
    first = [next(it)]
    _change(paths[2], "rewritten in place")
    with pytest.warns(Warning, match=r"skipped: .*shard-2\.tar: the file was modified after .*field 'jpg' of sample"):
        rest = list(it)
    got = by_key(first + rest)
    waiting = {k for k in reference if k.startswith("s2/")} - set(by_key(first))
    assert set(got) == set(reference) - waiting and waiting  # the rest: every other image, its pixels
    assert all(np.array_equal(got[k], reference[k]) for k in got)
    assert ds.decode_stats.skipped == len(waiting)


def test_past_the_limit_of_shards_held_the_images_are_read(
        tmp_path: Path, originals: dict[str, bytes], reference: dict[str, np.ndarray],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shard held is a descriptor: past ``HELD_FILES`` a reader reads the images at once."""
    monkeypatch.setattr(core, "HELD_FILES", held_files() + 2)
    paths = shards(tmp_path, originals)
    most, got = 0, {}
    for keys, images, _ in dataset(paths):
        most = max(most, held_files())
        got.update(zip(keys, images, strict=True))
    assert most == core.HELD_FILES and _same(got, reference)


@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_with_workers_every_image_once_with_its_pixels(
        tmp_path: Path, originals: dict[str, bytes], reference: dict[str, np.ndarray], workers: int) -> None:
    """Ranges in the workers' shuffle buffers, a state taken mid-epoch, a new loader: the rest of
    the epoch once, each image as an uninterrupted epoch gives it."""
    paths = shards(tmp_path, originals)
    loader = dataset(paths).loader(num_workers=workers)
    loader.dataset.set_epoch(0)
    first = []
    for i, batch in enumerate(loader):
        first.append(batch)
        if i == 3:
            break
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = dataset(paths).loader(num_workers=workers)
    resumed.load_state_dict(state)
    rest = list(resumed)
    keys = [k for keys, _, _ in first + rest for k in keys]
    assert sorted(keys) == sorted(reference)
    assert _same(by_key(first + rest), reference)


def test_pngs_and_cmyk_jpegs_left_in_the_shard_decode_as_when_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The images Pillow decodes (PNG, CMYK JPEG) take the view of the read buffer as well."""
    from PIL import Image

    samples = []
    for i in range(6):
        array = np.random.default_rng(i).integers(0, 256, (240, 320, 3), dtype=np.uint8)
        fmt, mode = [("PNG", None), ("JPEG", "CMYK")][i % 2]
        data = encode_image(array, fmt, mode=mode, **({"quality": 95} if fmt == "JPEG" else {}))
        assert len(data) > BIG and (mode is None or Image.open(io.BytesIO(data)).mode == "CMYK")
        samples.append({"__key__": f"k{i}", "png" if fmt == "PNG" else "jpg": data, "cls": i})
    paths = [str(write_tar(tmp_path / "mixed.tar", samples))]

    def images() -> dict[str, np.ndarray]:
        ds = Dataset(paths, decode=SPEC, shuffle=10, seed=1, batch_size=3, to_tuple=("__key__", "jpg;png"), tensors="numpy")
        return {k: np.array(image) for keys, images in ds for k, image in zip(keys, images, strict=True)}

    left = images()
    monkeypatch.setattr(core, "HELD_FILES", 0)
    assert len(left) == 6 and _same(left, images())


def test_dict_batches_of_jpgs_and_pngs_give_each_image_in_its_field(tmp_path: Path) -> None:
    """A dict batch whose rows decoded images of several fields: each such column a list, the
    image in the rows that have the field and None in the others -- no row's image lost."""
    samples = []
    for i in range(6):
        array = np.random.default_rng(i).integers(0, 256, (240, 320, 3), dtype=np.uint8)
        fmt = "PNG" if i % 3 == 1 else "JPEG"
        samples.append({"__key__": f"k{i}", fmt.lower().replace("jpeg", "jpg"): encode_image(array, fmt)})
    paths = [str(write_tar(tmp_path / "mixed.tar", samples))]
    seen: dict[str, str] = {}
    for batch in Dataset(paths, decode=SPEC, shuffle=10, seed=1, batch_size=3, tensors="numpy"):
        for field in ("jpg", "png"):
            for key, image in zip(batch["__key__"], batch.get(field, [None] * len(batch["__key__"])), strict=True):
                if image is not None:
                    assert np.asarray(image).shape == (3, 24, 24) and key not in seen
                    seen[key] = field
    assert seen == {s["__key__"]: "png" if "png" in s else "jpg" for s in samples}
