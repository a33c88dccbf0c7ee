"""Training feeds: shards -> augmented batches in a PyTorch training loop, img/s.

Rows (all on the same ImageNet-sized JPEGs, ctx.data.jpeg, split once into 4 shards so that 2
DataLoader workers each get whole shards; every side gets the same brace URL):

1. ``tarproc.Dataset`` with ``AugmentSpec(size=224, random_crop=True, flip=0.5, mean, std, CHW)``,
   shuffle 1000, batches of 64, ``DataLoader(batch_size=None, num_workers=2)`` — against
   webdataset 1.0.2 + torchvision transforms (RandomResizedCrop 224, RandomHorizontalFlip,
   ToTensor, Normalize), the same shuffle, batch size and workers. Target ≥ 2×.
2. The same with rotation (±10°) and colour jitter (0.4, 0.4, 0.4, 0.1): ``AugmentSpec(rotate=10,
   brightness=.., contrast=.., saturation=.., hue=..)`` against ``T.RandomRotation(10)`` before the
   crop and ``T.ColorJitter(0.4, 0.4, 0.4, 0.1)`` after the flip. Target ≥ 2×.
3. ``tarserve -p 2`` (2 sender processes decoding the same augmentations) -> ``Receiver.dataset()``
   in a DataLoader in this process, over ``zpush+ipc``, against row 1's ``Dataset`` on the same 2
   cores. Reported, no target.
4. Row 1 on large photos (2048x1536, ~1 MB JPEGs; 160 of them, 40 with --quick, in 4 shards of
   their own). Reported, no target: here the crop usually allows a reduced-size (DCT-domain) decode.

images/s = images received ÷ wall seconds from building the pipeline to the last batch: DataLoader
workers start every epoch (and tarserve starts per run), which is what a user waits for. Every pass
checks that the number of images received equals the number of samples written, and every batch's
shape (a fast wrong answer must not count). The imports are paid once, in an untimed warm-up epoch.
The recipes below are the user code timed; a note gives their line counts.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from common import BIN, Context, Row, alternate, log, spread, yes_no

SECTION = "train"
SHARDS = 4
REPEAT = 2  # the JPEGs twice: 2,000 images an epoch (400 with --quick)
LARGE = (2048, 1536)  # the large photos of row 4
LARGE_COUNT = {False: 160, True: 40}  # by ctx.quick
WORKERS = 2

# ------------------------------------------------------------------------------------------------
# the recipes: what a user writes (imports included); each returns the loader its loop iterates


def ours_basic(url: str) -> Any:
    import torch

    import tarproc
    from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec

    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW")
    ds = tarproc.Dataset(url, decode=spec, shuffle=1000, to_tuple=("jpg", "cls"), batch_size=64)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)


def torchvision_basic(url: str) -> Any:
    import torch
    import torchvision.transforms as T
    import webdataset as wds

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)])
    ds = wds.WebDataset(url, shardshuffle=False).shuffle(1000).decode("pil").to_tuple("jpg", "cls")
    ds = ds.map_tuple(tf, lambda x: x).batched(64)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)


def ours_jitter(url: str) -> Any:
    import torch

    import tarproc
    from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec

    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW",
                       rotate=10, brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1)
    ds = tarproc.Dataset(url, decode=spec, shuffle=1000, to_tuple=("jpg", "cls"), batch_size=64)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)


def torchvision_jitter(url: str) -> Any:
    import torch
    import torchvision.transforms as T
    import webdataset as wds

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    tf = T.Compose([T.RandomRotation(10), T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                    T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToTensor(), T.Normalize(mean, std)])
    ds = wds.WebDataset(url, shardshuffle=False).shuffle(1000).decode("pil").to_tuple("jpg", "cls")
    ds = ds.map_tuple(tf, lambda x: x).batched(64)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)


# tarserve's side: the command (one line in a shell) and the trainer's code (receiver_recipe)
TARSERVE_ARGS = [
    "-p", "2", "--device", "cpu", "--size", "224", "--random-crop", "--flip", "0.5", "--mean", "imagenet",
    "--std", "imagenet", "--layout", "CHW", "--label", "cls", "-b", "64", "--shuffle", "1000", "-q",
]


def receiver_recipe(url: str) -> Any:
    import torch

    import tarproc

    receiver = tarproc.Receiver(url)
    return torch.utils.data.DataLoader(receiver.dataset(), batch_size=None)


def code_lines(fn: Callable[..., Any], loop: int = 1) -> int:
    """Non-blank source lines of a recipe's body (imports, pipeline, ``loader = ...``) plus the
    ``loop`` lines that take the batch apart: ``for images, labels in loader:`` for a tuple, one more
    (``images, labels = batch["image"], batch["cls"]``) for the Receiver's dict batches."""
    source = textwrap.dedent(inspect.getsource(fn))
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    lines = source.splitlines()[body[0].lineno - 1 : body[-1].end_lineno]
    return sum(1 for line in lines if line.strip()) + loop


# ------------------------------------------------------------------------------------------------
# data: jpeg.tar as 4 shards, made once


def make_shards(ctx: Context) -> str:
    """jpeg.tar's samples REPEAT times (distinct keys), as SHARDS shards under ctx.directory / SECTION
    (once); returns the brace URL. Repeated so that an epoch is long enough for the steady state,
    not the DataLoader's start-up, to decide the rate (a real epoch has millions of images)."""
    import tarproc

    directory = ctx.directory / SECTION
    stamp = directory / "source.json"
    source = {"jpeg_size": ctx.data.jpeg.stat().st_size, "samples": ctx.data.jpeg_samples, "shards": SHARDS,
              "repeat": REPEAT}
    url = str(directory / f"train-{{000000..{SHARDS - 1:06d}}}.tar")
    try:
        if json.loads(stamp.read_text()) == source and len(list(directory.glob("train-*.tar"))) == SHARDS:
            return url
    except (OSError, ValueError):
        pass
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    per_shard = -(-ctx.data.jpeg_samples * REPEAT // SHARDS)
    with tarproc.ShardWriter(str(directory / "train-%06d.tar"), maxcount=per_shard) as writer:
        for r in range(REPEAT):
            for sample in tarproc.read_samples(str(ctx.data.jpeg)):
                sample["__key__"] = f"r{r}/{sample['__key__']}"
                writer.write(sample)
    written = sorted(p.name for p in directory.glob("train-*.tar"))
    if len(written) != SHARDS:
        raise RuntimeError(f"expected {SHARDS} shards in {directory}, found {written}")
    stamp.write_text(json.dumps(source) + "\n")
    log(f"train: wrote {SHARDS} shards of {per_shard} samples in {directory}")
    return url


def make_large_shards(ctx: Context) -> tuple[str, int]:
    """Large photo-like JPEGs (LARGE, quality 90, ~1 MB) in SHARDS shards of their own (once)."""
    import io

    import numpy as np
    from PIL import Image

    import tarproc

    count = LARGE_COUNT[ctx.quick]
    directory = ctx.directory / f"{SECTION}-large"
    stamp = directory / "source.json"
    source = {"size": LARGE, "count": count, "shards": SHARDS}
    url = str(directory / f"large-{{000000..{SHARDS - 1:06d}}}.tar")
    try:
        if json.loads(stamp.read_text()) == source:
            return url, count
    except (OSError, ValueError):
        pass
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    w, h = LARGE
    with tarproc.ShardWriter(str(directory / "large-%06d.tar"), maxcount=-(-count // SHARDS)) as writer:
        for i in range(count):
            rng = np.random.default_rng([77, i])
            coarse = Image.fromarray(rng.integers(0, 256, (9, 12, 3), dtype=np.uint8)).resize((w, h), Image.Resampling.BICUBIC)
            mid = Image.fromarray(rng.integers(0, 256, (96, 128, 3), dtype=np.uint8)).resize((w, h), Image.Resampling.BILINEAR)
            pixels = 0.6 * np.asarray(coarse, np.float32) + 0.4 * np.asarray(mid, np.float32)
            pixels += rng.normal(0.0, 6.0, (h, w, 3)).astype(np.float32)
            buf = io.BytesIO()
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
            writer.write({"__key__": f"large{i:05d}", "jpg": buf.getvalue(), "cls": i % 1000})
    stamp.write_text(json.dumps(source) + "\n")
    log(f"train: wrote {count} large photos ({w}x{h}) in {directory}")
    return url, count


# ------------------------------------------------------------------------------------------------
# the measures: each runs one epoch and returns the number of images received (checked)


def count_batches(loader: Any, image: Callable[[Any], Any], label: Callable[[Any], Any]) -> int:
    """Iterate a loader to its end; the images received (every batch: 224x224 CHW float, one label per image)."""
    n = 0
    for batch in loader:
        images, labels = image(batch), label(batch)
        if tuple(images.shape[1:]) != (3, 224, 224) or len(labels) != len(images):
            raise RuntimeError(f"bad batch: images {tuple(images.shape)}, {len(labels)} labels")
        n += len(images)
    return n


def epoch(recipe: Callable[[str], Any], url: str) -> Callable[[], int]:
    return lambda: count_batches(recipe(url), lambda b: b[0], lambda b: b[1])


def tarserve_epoch(url: str, firsts: list[float]) -> Callable[[], int]:
    """tarserve -p 2 sending to a Receiver in this process; appends the seconds to the first batch to ``firsts``."""

    def run() -> int:
        tmp = Path(tempfile.mkdtemp(prefix="tarproc-bench-"))
        address = f"ipc://{tmp / 'feed'}"
        t0 = time.perf_counter()
        loader = receiver_recipe(f"zpull+{address}")
        command = [str(BIN / "tarserve"), url, "--to", f"zpush+{address}", *TARSERVE_ARGS]
        proc = subprocess.Popen(command, start_new_session=True)  # its own group: an error ends its senders too
        try:
            n = 0
            for batch in loader:
                if n == 0:
                    firsts.append(time.perf_counter() - t0)
                n += count_batches([batch], lambda b: b["image"], lambda b: b["cls"])
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)
        if rc != 0:
            raise RuntimeError(f"tarserve exited with status {rc}")
        return n

    return run


def warm_up(url: str, n: int) -> None:
    """One untimed epoch of each side of row 1: the imports (torch, torchvision, webdataset, the
    decoders) are paid once per program, not per epoch, so they stay out of every timed pass."""
    for recipe in (ours_basic, torchvision_basic):
        if epoch(recipe, url)() != n:
            raise RuntimeError(f"warm-up: {recipe.__name__} did not deliver {n} images")


def rate(n: int, times: list[float]) -> float:
    return n / statistics.median(times)


# ------------------------------------------------------------------------------------------------


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    url = make_shards(ctx)
    n = ctx.data.jpeg_samples * REPEAT
    reps = ctx.reps  # 5 (2 with --quick)
    rows: list[Row] = []
    notes: list[str] = []
    workers = f"{WORKERS} DataLoader workers"

    log(f"train: {n} JPEGs in {SHARDS} shards, crop + flip + normalize, {workers}")
    warm_up(url, n)

    def versus_webdataset(measure: str, label: str, ours: Callable[[str], Any], theirs: Callable[[str], Any]) -> None:
        t_ours, t_base = alternate(reps, reps, epoch(ours, url), epoch(theirs, url), n, label)
        rows.append(Row(f"{measure}, img/s, {workers}", rate(n, t_ours), "img/s", "webdataset + torchvision",
                        rate(n, t_base), "≥ 2×", yes_no(rate(n, t_ours) >= 2 * rate(n, t_base))))
        notes.append(f"{label}: Dataset {spread(t_ours)}; webdataset + torchvision {spread(t_base)}")

    versus_webdataset("RandomResizedCrop 224 + flip + normalize", "crop + flip", ours_basic, torchvision_basic)
    log("train: + rotation 10° + colour jitter 0.4/0.4/0.4/0.1")
    versus_webdataset("same + rotate 10 + colour jitter", "rotate + jitter", ours_jitter, torchvision_jitter)

    log("train: tarserve -p 2 -> Receiver.dataset() vs Dataset, 2 workers")
    firsts: list[float] = []
    t_serve, t_ours = alternate(reps, reps, tarserve_epoch(url, firsts), epoch(ours_basic, url), n, "tarserve")
    rows.append(Row("`tarserve -p 2` → `Receiver.dataset()`, row 1's augmentations, img/s", rate(n, t_serve),
                    "img/s", f"`Dataset`, {workers}", rate(n, t_ours), "report", "—"))
    notes.append(
        f"tarserve -p 2 -> Receiver {spread(t_serve)}, first batch after median {statistics.median(firsts):.2f} s "
        f"(tarserve's start-up included); Dataset {spread(t_ours)}. Both decode in 2 processes on the same cores; "
        "tarserve's senders start a fresh Python (imports) every run and add a hop per batch (serialize, ipc "
        "socket, the receiver's ZMQ I/O thread), where DataLoader workers are forked and hand batches over "
        "through shared memory"
    )
    notes.append(
        "lines of user code (imports, pipeline, the for loop): Dataset "
        f"{code_lines(ours_basic)} (with rotate + jitter {code_lines(ours_jitter)}); webdataset + torchvision "
        f"{code_lines(torchvision_basic)} ({code_lines(torchvision_jitter)}); tarserve 1 command line + "
        f"{code_lines(receiver_recipe, loop=2)} lines in the trainer"
    )
    large, count = make_large_shards(ctx)
    log(f"train: row 1 on {count} large photos {LARGE[0]}x{LARGE[1]}")
    t_ours, t_base = alternate(reps, reps, epoch(ours_basic, large), epoch(torchvision_basic, large), count, "large")
    rows.append(Row(f"row 1 on large photos ({LARGE[0]}x{LARGE[1]}, ~1 MB), img/s, {workers}", rate(count, t_ours),
                    "img/s", "webdataset + torchvision", rate(count, t_base), "report", "—"))
    notes.append(f"large photos: Dataset {spread(t_ours)}; webdataset + torchvision {spread(t_base)}")
    return rows, notes
