"""End to end: a tiny model trains for two epochs on generated images, fed by tarproc.Dataset with
DataLoader(num_workers=2), and by tarserve -> Receiver.dataset(); the loss goes down and every
key is seen once per epoch."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tarhelpers import encode_image, write_tar

import tarproc
from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses Linux processes and ipc sockets")
CLASSES = 3


def colour_image(label: int, seed: int) -> np.ndarray:
    """Mostly red, green or blue by class, with noise and a random gradient: learnable, not trivial."""
    rng = np.random.default_rng(seed)
    h, w = 40, 48
    base = rng.uniform(40, 120, 3)
    base[label] += 90
    y, x = np.mgrid[0:h, 0:w]
    gradient = (x / w - 0.5)[..., None] * rng.uniform(-60, 60, 3)
    return np.clip(base + gradient + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], set[str]]:
    directory = tmp_path_factory.mktemp("train")
    paths, keys, n = [], set(), 0
    for s in range(4):
        samples = []
        for _ in range(24 + s * 3):  # unequal shards
            label = n % CLASSES
            samples.append({"__key__": f"img{n:04d}", "jpg": encode_image(colour_image(label, n), quality=90), "cls": label})
            keys.add(f"img{n:04d}")
            n += 1
        paths.append(str(write_tar(directory / f"train-{s}.tar", samples)))
    return paths, keys


def model_and_optimizer() -> tuple[object, object]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
        torch.nn.Linear(8, CLASSES),
    )
    return model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)


def step(model, optimizer, images, labels) -> float:  # type: ignore[no-untyped-def]
    loss = torch.nn.functional.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


SPEC = AugmentSpec(size=32, random_crop=True, scale=(0.5, 1.0), flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")


@pytest.mark.timeout(120)
def test_training_through_the_dataset(shards: tuple[list[str], set[str]]) -> None:
    paths, keys = shards
    ds = tarproc.Dataset(paths, decode=SPEC, shuffle=40, seed=1, batch_size=12, to_tuple=("__key__", "jpg", "cls"))
    model, optimizer = model_and_optimizer()
    losses: list[list[float]] = []
    for epoch in range(2):
        ds.set_epoch(epoch)
        seen: list[str] = []
        losses.append([])
        for batch_keys, images, labels in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2):
            assert images.shape[1:] == (3, 32, 32) and images.dtype == torch.float32
            losses[-1].append(step(model, optimizer, images, labels))
            seen += batch_keys
        assert Counter(seen) == Counter(keys)  # every key once per epoch
    assert np.mean(losses[1]) < np.mean(losses[0]) and losses[1][-1] < losses[0][0]


@pytest.mark.timeout(120)
def test_training_through_tarserve_and_the_receiver_dataset(shards: tuple[list[str], set[str]], tmp_path: Path) -> None:
    paths, keys = shards
    feed = f"ipc://{tmp_path}/feed"
    args = ["--to", f"zpush+{feed}", "-p", "2", "--epochs", "2", "--shuffle-shards", "--shuffle", "20", "--seed", "1",
            "--device", "cpu", "--size", "32", "--random-crop", "--scale", "0.5,1", "--flip", "0.5",
            "--mean", "imagenet", "--std", "imagenet", "--layout", "CHW", "--label", "cls", "-b", "12", "-q"]
    with tarproc.Receiver(f"zpull+{feed}", timeout=60) as receiver:
        sender = subprocess.Popen([sys.executable, "-m", "tarproc.cli.tarserve", *paths, *args], stderr=subprocess.PIPE)
        model, optimizer = model_and_optimizer()
        seen: dict[int, list[str]] = {0: [], 1: []}
        losses: dict[int, list[float]] = {0: [], 1: []}
        for batch in torch.utils.data.DataLoader(receiver.dataset(), batch_size=None):
            epoch = batch["__epoch__"]
            losses[epoch].append(step(model, optimizer, batch["image"], batch["cls"]))
            seen[epoch] += batch["__key__"]
    _, err = sender.communicate(timeout=60)
    assert sender.returncode == 0, err.decode()
    assert Counter(seen[0]) == Counter(seen[1]) == Counter(keys)
    assert np.mean(losses[1]) < np.mean(losses[0])
