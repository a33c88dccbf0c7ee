"""Training feeds: shards -> augmented batches in a PyTorch training loop, img/s.

Rows (all on the same ImageNet-sized JPEGs, ctx.data.jpeg, split once into 4 shards so that 2
DataLoader workers each get whole shards; every side gets the same brace URL):

1. ``tarproc.Dataset`` with ``AugmentSpec(size=224, random_crop=True, flip=0.5, mean, std, CHW)``,
   shuffle 1000, batches of 64, ``DataLoader(batch_size=None, num_workers=2)`` — against three
   baselines timed in turn in the same repetitions: webdataset 1.0.2 + PIL + torchvision transforms
   (RandomResizedCrop 224, RandomHorizontalFlip, ToTensor, Normalize), target ≥ 2×; webdataset +
   ``torchvision.io.decode_jpeg`` + ``transforms.v2`` on uint8 tensors, target ≥ 3×; NVIDIA DALI's
   own CPU pipeline (``fn.readers.webdataset`` with our DALI index → ``fn.decoders.image_random_crop``
   → ``fn.resize`` → ``fn.crop_mirror_normalize``, batch 64, 2 threads), target ≥ 2×. The same
   shuffle, batch size and workers (threads) everywhere.
1b. Row 1's Dataset on the same shards re-laid with restart markers (``tarjpeg``, made once and
   cached), against the Dataset on the original shards (report), webdataset + tv2 on the original
   (whole decodes: markers can't help it), target ≥ 3×, and DALI's CPU pipeline on its faster input,
   original or re-laid (both are timed), target ≥ 2.5×. A note gives the size before and after and
   the re-layout's rate on one core.
1c. Row 1 in the steady state of a long run: every side keeps its workers (threads) across epochs
   (``persistent_workers=True``; DALI's pipeline built once, its iterator reset), the Dataset on the
   re-laid shards: reported, against webdataset + tv2 and DALI's CPU pipeline.
1d. Row 1 in the training loop's own process (``DataLoader(num_workers=0)``, as a notebook or a quick
   experiment runs it), the Dataset on the re-laid shards against webdataset + tv2 likewise:
   reported. (Here the Dataset's batch arrays are used again once the loop lets go of them.)
2. The same with rotation (±10°) and colour jitter (0.4, 0.4, 0.4, 0.1): ``AugmentSpec(rotate=10,
   brightness=.., contrast=.., saturation=.., hue=..)`` against ``T.RandomRotation(10)`` before the
   crop and ``T.ColorJitter(0.4, 0.4, 0.4, 0.1)`` after the flip (v1 on PIL images and v2 on
   tensors), and DALI's ``fn.rotate`` + ``fn.color_twist`` after the resize. Targets ≥ 2× (PIL),
   ≥ 3× (v2), ≥ 3× (DALI).
3. ``tarserve -p 2`` (2 sender processes decoding the same augmentations) -> ``Receiver.dataset()``
   in a DataLoader in this process, over ``zpush+ipc``, against row 1's ``Dataset`` on the same 2
   cores. Reported, no target.
4. Row 1 on large photos (2048x1536, ~1 MB JPEGs; 160 of them, 40 with --quick, in 4 shards of
   their own), against the same three baselines. Reported, no target: here the crop usually allows
   a reduced-size (DCT-domain) decode (a note gives the share of each scale).

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


def tv2_basic(url: str) -> Any:
    import torch
    import torchvision.transforms.v2 as T
    import webdataset as wds
    from torchvision.io import decode_jpeg

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    tf = T.Compose([T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip(),
                    T.ToDtype(torch.float32, scale=True), T.Normalize(mean, std)])
    ds = wds.WebDataset(url, shardshuffle=False).shuffle(1000).to_tuple("jpg", "cls")
    ds = ds.map_tuple(lambda jpg: tf(decode_jpeg(torch.frombuffer(bytearray(jpg), dtype=torch.uint8))), int).batched(64)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)


def tv2_jitter(url: str) -> Any:
    import torch
    import torchvision.transforms.v2 as T
    import webdataset as wds
    from torchvision.io import decode_jpeg

    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    tf = T.Compose([T.RandomRotation(10), T.RandomResizedCrop(224, antialias=True), T.RandomHorizontalFlip(),
                    T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.ToDtype(torch.float32, scale=True), T.Normalize(mean, std)])
    ds = wds.WebDataset(url, shardshuffle=False).shuffle(1000).to_tuple("jpg", "cls")
    ds = ds.map_tuple(lambda jpg: tf(decode_jpeg(torch.frombuffer(bytearray(jpg), dtype=torch.uint8))), int).batched(64)
    return torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)


def dali_basic(shards: list[str], indexes: list[str]) -> Any:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=64, num_threads=2, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        jpegs, labels = fn.readers.webdataset(paths=shards, index_paths=indexes, ext=["jpg", "cls"],
                                              random_shuffle=True, initial_fill=1000, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(),
                                          mean=[0.485 * 255, 0.456 * 255, 0.406 * 255], std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, fn.pad(labels, shape=[8])  # the label's digits, padded to one length: a tensor

    return DALIGenericIterator(pipe(), ["images", "labels"], reader_name="reader", last_batch_policy=LastBatchPolicy.PARTIAL)


def dali_jitter(shards: list[str], indexes: list[str]) -> Any:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    @pipeline_def(batch_size=64, num_threads=2, device_id=None)
    def pipe():  # type: ignore[no-untyped-def]
        jpegs, labels = fn.readers.webdataset(paths=shards, index_paths=indexes, ext=["jpg", "cls"],
                                              random_shuffle=True, initial_fill=1000, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, resize_x=224, resize_y=224)
        images = fn.rotate(images, angle=fn.random.uniform(range=(-10, 10)), keep_size=True, fill_value=0)
        images = fn.color_twist(images, brightness=fn.random.uniform(range=(0.6, 1.4)),
                                contrast=fn.random.uniform(range=(0.6, 1.4)),
                                saturation=fn.random.uniform(range=(0.6, 1.4)), hue=fn.random.uniform(range=(-36, 36)))
        images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(),
                                          mean=[0.485 * 255, 0.456 * 255, 0.406 * 255], std=[0.229 * 255, 0.224 * 255, 0.225 * 255])
        return images, fn.pad(labels, shape=[8])  # the label's digits, padded to one length: a tensor

    return DALIGenericIterator(pipe(), ["images", "labels"], reader_name="reader", last_batch_policy=LastBatchPolicy.PARTIAL)


# tarserve's side: the command (one line in a shell) and the trainer's code (receiver_recipe)
TARSERVE_ARGS = [
    "-p", "2", "--device", "cpu", "--size", "224", "--random-crop", "--flip", "0.5", "--mean", "imagenet",
    "--std", "imagenet", "--layout", "CHW", "--label", "cls", "-b", "64", "--shuffle", "1000", "-q",
]


def receiver_recipe(url: str) -> Any:
    import torch

    import tarproc

    receiver = tarproc.Receiver(url, reuse_memory=True)  # as measured before it became opt-in
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


def make_relaid_shards(ctx: Context, url: str) -> tuple[str, str]:
    """The train shards re-laid with restart markers (``tarproc.relayout``, what ``tarjpeg`` does),
    under ctx.directory / "train-relaid" (once); returns their brace URL and a note: the size
    before and after, and the re-layout's rate on one core (measured when they were made)."""
    import tarproc
    from tarproc.relayout import RelayoutStats, relayout_samples
    from tarproc.sources import expand_braces

    directory = ctx.directory / f"{SECTION}-relaid"
    stamp = directory / "source.json"
    source = {"shards": [(Path(p).name, Path(p).stat().st_size) for p in expand_braces(url)],
              "relayout": "tarjpeg defaults, 3"}  # made again when the re-layout's defaults change
    relaid = str(directory / f"train-{{000000..{SHARDS - 1:06d}}}.tar")
    try:
        made = json.loads(stamp.read_text())
        if made["source"] == json.loads(json.dumps(source)):  # as JSON gives it back: lists, not tuples
            return relaid, made["note"]
    except (OSError, ValueError, KeyError):
        pass
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    stats, seconds = RelayoutStats(), 0.0
    for shard in expand_braces(url):
        samples = list(tarproc.read_samples(shard))
        t0 = time.thread_time()
        samples = list(relayout_samples(samples, stats=stats))  # one thread: its CPU time is one core's work
        seconds += time.thread_time() - t0
        with open(directory / Path(shard).name, "wb") as f, tarproc.TarWriter(f) as writer:
            for sample in samples:
                writer.write_sample(sample)
    note = (f"re-laid shards (`tarjpeg`, restart markers, made once): {stats.summary()}; "
            f"{stats.relaid / seconds:.0f} images/s a core (CPU time)")
    stamp.write_text(json.dumps({"source": source, "note": note}) + "\n")
    log(f"train: {note}")
    return relaid, note


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


def dali_files(url: str) -> tuple[list[str], list[str]]:
    """The shards of a brace URL and their DALI indexes (``wds2idx``'s format, written by tarproc's
    index module as ``tarindex --format dali`` does, beside each shard; remade when older than it)."""
    from tarproc.index import build_index, default_index_url, index_bytes
    from tarproc.sources import expand_braces

    shards = expand_braces(url)
    indexes = [default_index_url(shard, "dali") for shard in shards]
    for shard, index in zip(shards, indexes, strict=True):
        if not os.path.exists(index) or os.path.getmtime(index) < os.path.getmtime(shard):
            Path(index).write_bytes(index_bytes(build_index(shard), "dali", shard))
    return shards, indexes


def scales_used(url: str, spec: Any) -> str:
    """How many of a data set's images the cpu backend decodes at each DCT scale (eighths) under
    ``spec``'s crops, e.g. ``8/8 100%``: where a reduced-size decode applies."""
    from collections import Counter

    import tarproc
    from tarproc.decode.cpu import jpeg_plan

    counts: Counter[int] = Counter()
    for sample in tarproc.read_samples(url):
        plan = jpeg_plan(bytes(sample["jpg"]), spec, sample["__key__"])
        counts[plan.scale if plan is not None else 8] += 1
    total = sum(counts.values())
    return ", ".join(f"{m}/8 {100 * c / total:.0f}%" for m, c in sorted(counts.items()))


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


def dali_epoch(recipe: Callable[[list[str], list[str]], Any], url: str) -> Callable[[], int]:
    """One epoch of a DALI recipe (its pipeline built and its threads started inside the timing, as
    the DataLoader's workers are); DALIGenericIterator's batches are a list of one dict."""
    shards, indexes = dali_files(url)
    return lambda: count_batches(recipe(shards, indexes), lambda b: b[0]["images"], lambda b: b[0]["labels"])


def kept_epoch(recipe: Callable[[str], Any], url: str) -> Callable[[], int]:
    """Epochs of a DataLoader recipe whose workers are kept (``persistent_workers=True``, the same
    dataset and workers): built on the first call, so a warm-up call pays the workers' start."""
    import torch

    kept: list[Any] = []

    def run() -> int:
        if not kept:
            made = recipe(url)
            kept.append(torch.utils.data.DataLoader(made.dataset, batch_size=None, num_workers=made.num_workers,
                                                    persistent_workers=True))
        return count_batches(kept[0], lambda b: b[0], lambda b: b[1])

    return run


def inprocess_epoch(recipe: Callable[[str], Any], url: str) -> Callable[[], int]:
    """One epoch of a DataLoader recipe without workers: all in the loop's own process (one core)."""
    import torch

    def run() -> int:
        loader = torch.utils.data.DataLoader(recipe(url).dataset, batch_size=None, num_workers=0)
        return count_batches(loader, lambda b: b[0], lambda b: b[1])

    return run


def kept_dali_epoch(recipe: Callable[[list[str], list[str]], Any], url: str) -> Callable[[], int]:
    """Epochs of a DALI recipe whose pipeline (and threads) are kept: the iterator reset each epoch."""
    shards, indexes = dali_files(url)
    kept: list[Any] = []

    def run() -> int:
        if kept:
            kept[0].reset()
        else:
            kept.append(recipe(shards, indexes))
        return count_batches(kept[0], lambda b: b[0]["images"], lambda b: b[0]["labels"])

    return run


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


def warm_up(url: str, n: int, dali: bool) -> None:
    """One untimed epoch of each side of row 1: the imports (torch, torchvision, webdataset, DALI,
    the decoders) are paid once per program, not per epoch, so they stay out of every timed pass."""
    runs = [(recipe.__name__, epoch(recipe, url)) for recipe in (ours_basic, torchvision_basic, tv2_basic)]
    if dali:
        runs.append(("dali_basic", dali_epoch(dali_basic, url)))
    for name, run in runs:
        if run() != n:
            raise RuntimeError(f"warm-up: {name} did not deliver {n} images")


def rate(n: int, times: list[float]) -> float:
    return n / statistics.median(times)


def cpu_seconds() -> float:
    """CPU seconds of this process and of the children it has waited for (DataLoader workers are
    joined when their epoch ends): what other load on the machine inflates far less than wall time."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def cpu_counted(run: Callable[[], int], spent: list[float]) -> Callable[[], int]:
    """``run``, appending to ``spent`` the CPU seconds each call took (``cpu_seconds``)."""

    def counted() -> int:
        before = cpu_seconds()
        n = run()
        spent.append(cpu_seconds() - before)
        return n

    return counted


def decode_only_ms(url: str) -> float:
    """Milliseconds of one thread's CPU per image for row 1's decode alone (``decode_into``: the JPEG
    crop decode, resample, flip and normalize into a batch slot) over a data set's images, read first."""
    import numpy as np

    import tarproc
    from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec
    from tarproc.decode.cpu import decode_into

    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW", seed=0)
    images = [(bytes(s["jpg"]), s["__key__"]) for s in tarproc.read_samples(url)]
    out = np.zeros((64, 3, 224, 224), np.float32)
    t0 = time.thread_time()
    for i, (data, key) in enumerate(images):
        decode_into(data, spec, key, out[i % 64])
    return 1000 * (time.thread_time() - t0) / len(images)


# ------------------------------------------------------------------------------------------------


PIL = "webdataset + PIL + torchvision"
TV2 = "webdataset + `torchvision.io.decode_jpeg` + transforms.v2"
DALI = "NVIDIA DALI's CPU pipeline (`fn.readers.webdataset`, 2 threads)"


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    from common import alternate_many

    from tarproc.decode import dali_available

    url = make_shards(ctx)
    n = ctx.data.jpeg_samples * REPEAT
    reps = ctx.reps  # 5 (2 with --quick)
    rows: list[Row] = []
    notes: list[str] = []
    workers = f"{WORKERS} DataLoader workers"
    dali = dali_available()
    if not dali:
        notes.append("NVIDIA DALI's CPU pipeline: not measured: NVIDIA DALI is not installed")

    log(f"train: {n} JPEGs in {SHARDS} shards, crop + flip + normalize, {workers}")
    warm_up(url, n, dali)

    def versus(measure: str, label: str, data: str, count: int, ours: Callable[[str], Any],
               others: list[tuple[str, Callable[[], int], str, float]]) -> None:
        """Ours and every baseline timed in turn, rep by rep; a row per baseline (``target``: the
        ratio wanted, 0 for none)."""
        series = [("tarproc", reps, epoch(ours, data))] + [(name, reps, run) for name, run, _, _ in others]
        times = alternate_many(series, count, label)
        ours_rate = rate(count, times[0])
        spreads = [f"Dataset {spread(times[0])}"]
        for (name, _, row_name, target), t in zip(others, times[1:], strict=True):
            met = yes_no(ours_rate >= target * rate(count, t)) if target else "—"
            rows.append(Row(f"{measure}, img/s, {workers}", ours_rate, "img/s", row_name, rate(count, t),
                            f"≥ {target:g}×" if target else "report", met))
            spreads.append(f"{name} {spread(t)}")
        notes.append(f"{label}: " + "; ".join(spreads))

    def baselines(pil: Callable[[str], Any], tv2: Callable[[str], Any], dali_recipe: Callable[..., Any], data: str,
                  targets: tuple[float, float, float]) -> list[tuple[str, Callable[[], int], str, float]]:
        chosen = [("webdataset+PIL", epoch(pil, data), PIL, targets[0]),
                  ("webdataset+tv2", epoch(tv2, data), TV2, targets[1])]
        if dali:
            chosen.append(("DALI", dali_epoch(dali_recipe, data), DALI, targets[2]))
        return chosen

    def relaid_versus(url: str, count: int) -> None:
        """Row 1's Dataset on re-laid shards, against the original's Dataset, webdataset + tv2 (whole
        decodes: markers can't help it) and DALI on its faster input, original or re-laid."""
        relaid, made = make_relaid_shards(ctx, url)
        log("train: row 1 on re-laid shards (restart markers)")
        cpu: dict[str, list[float]] = {"re-laid": [], "original": []}
        series = [("Dataset re-laid", reps, cpu_counted(epoch(ours_basic, relaid), cpu["re-laid"])),
                  ("Dataset", reps, cpu_counted(epoch(ours_basic, url), cpu["original"])),
                  ("webdataset+tv2", reps, epoch(tv2_basic, url))]
        if dali:
            series += [("DALI", reps, dali_epoch(dali_basic, url)), ("DALI re-laid", reps, dali_epoch(dali_basic, relaid))]
        times = alternate_many(series, count, "re-laid")
        got = {name: rate(count, t) for (name, _, _), t in zip(series, times, strict=True)}
        measure = f"row 1 on re-laid shards (restart markers), img/s, {workers}"
        ours_rate = got["Dataset re-laid"]
        rows.append(Row(measure, ours_rate, "img/s", "`Dataset` on the original shards", got["Dataset"], "report", "—"))
        rows.append(Row(measure, ours_rate, "img/s", TV2, got["webdataset+tv2"], "≥ 3×",
                        yes_no(ours_rate >= 3 * got["webdataset+tv2"])))
        if dali:
            which = "re-laid" if got["DALI re-laid"] > got["DALI"] else "original"
            best = max(got["DALI"], got["DALI re-laid"])
            rows.append(Row(measure, ours_rate, "img/s", f"{DALI}, its faster input ({which})", best, "≥ 2.5×",
                            yes_no(ours_rate >= 2.5 * best)))
        notes.append(f"{made}. Re-laid row: " + "; ".join(f"{name} {spread(t)}" for (name, _, _), t
                                                         in zip(series, times, strict=True)))
        # where an image's time goes: the decode alone, the Dataset's CPU (all its processes), its wall x 2 cores
        costs = [f"{which}: decode_into alone {decode_only_ms(data):.2f}, the Dataset's CPU "
                 f"{1000 * statistics.median(cpu[which]) / count:.2f}, its wall x {WORKERS} cores "
                 f"{1000 * WORKERS * statistics.median(t) / count:.2f}"
                 for which, data, t in (("re-laid", relaid, times[0]), ("original", url, times[1]))]
        notes.append("ms an image, row 1: " + "; ".join(costs) + ". The CPU past decode_into is partly per epoch "
                     "(each epoch's workers are new processes: fork, exit, the first pages of their shared batch "
                     "buffers) and partly per image (reading into fresh memory, the shuffle buffer, Python); the wall "
                     "past the CPU is start-up, the epoch's end and other load")

    def kept_versus(url: str, count: int) -> None:
        """Row 1 in the steady state of a long run: every side keeps its workers (threads) and their
        memory across epochs (``persistent_workers=True``; DALI's pipeline built once, its iterator
        reset), re-laid shards for the Dataset, the original ones for the others. Reported."""
        relaid, _ = make_relaid_shards(ctx, url)
        log("train: row 1, workers kept across epochs (persistent_workers=True; DALI's pipeline built once)")
        series = [("Dataset re-laid", reps, kept_epoch(ours_basic, relaid)), ("webdataset+tv2", reps, kept_epoch(tv2_basic, url))]
        if dali:
            series.append(("DALI", reps, kept_dali_epoch(dali_basic, url)))
        for name, _, run in series:  # the workers' (threads') start, untimed
            if run() != count:
                raise RuntimeError(f"kept workers: {name} did not deliver {count} images")
        times = alternate_many(series, count, "kept workers")
        got = {name: rate(count, t) for (name, _, _), t in zip(series, times, strict=True)}
        measure = f"row 1 on re-laid shards, workers kept across epochs, img/s, {workers}"
        ours_rate = got["Dataset re-laid"]
        rows.append(Row(measure, ours_rate, "img/s", f"{TV2}, workers kept", got["webdataset+tv2"], "report", "—"))
        if dali:
            rows.append(Row(measure, ours_rate, "img/s", f"{DALI}, pipeline kept", got["DALI"], "report", "—"))
        notes.append("workers kept across epochs (each side's steady state; the rows above start theirs every "
                     "epoch, as a DataLoader does by default): " + "; ".join(f"{name} {spread(t)}" for (name, _, _), t
                                                                          in zip(series, times, strict=True)))

    def inprocess_versus(url: str, count: int) -> None:
        """Row 1 without DataLoader workers (the loop's process, one core): the Dataset on re-laid
        shards against webdataset + tv2 on the original ones. Reported."""
        relaid, _ = make_relaid_shards(ctx, url)
        log("train: row 1 in the loop's process (num_workers=0)")
        series = [("Dataset re-laid", reps, inprocess_epoch(ours_basic, relaid)),
                  ("webdataset+tv2", reps, inprocess_epoch(tv2_basic, url))]
        times = alternate_many(series, count, "no workers")
        got = {name: rate(count, t) for (name, _, _), t in zip(series, times, strict=True)}
        rows.append(Row("row 1 on re-laid shards, in the loop's process (num_workers=0), img/s",
                        got["Dataset re-laid"], "img/s", f"{TV2}, num_workers=0", got["webdataset+tv2"], "report", "—"))
        notes.append("no workers (the loop's process; the Dataset decodes on one thread, torch's operations in tv2 may "
                     "use its intra-op threads): " + "; ".join(
            f"{name} {spread(t)}" for (name, _, _), t in zip(series, times, strict=True)))

    versus("RandomResizedCrop 224 + flip + normalize", "crop + flip", url, n, ours_basic,
           baselines(torchvision_basic, tv2_basic, dali_basic, url, (2, 3, 2)))
    relaid_versus(url, n)
    kept_versus(url, n)
    inprocess_versus(url, n)
    log("train: + rotation 10° + colour jitter 0.4/0.4/0.4/0.1")
    versus("same + rotate 10 + colour jitter", "rotate + jitter", url, n, ours_jitter,
           baselines(torchvision_jitter, tv2_jitter, dali_jitter, url, (2, 3, 3)))
    notes.append(
        "the baselines: webdataset + PIL: `.decode(\"pil\")` + torchvision transforms on PIL images; "
        "webdataset + tv2: the raw bytes through `torchvision.io.decode_jpeg` + `transforms.v2` on uint8 tensors "
        "(RandomResizedCrop antialiased, ToDtype + Normalize); DALI: `fn.readers.webdataset` (our DALI index, "
        "shuffle 1000) -> `fn.decoders.image_random_crop` -> `fn.resize` 224 -> `fn.crop_mirror_normalize` "
        "(coin-flip mirror), batch 64, 2 threads, `device_id=None`, through `DALIGenericIterator`; with rotation "
        "and jitter `fn.rotate` (±10°, keep_size) and `fn.color_twist` after the resize: DALI's fast order, which "
        "rotates the 224x224 crop (black corners inside it) where the Dataset and torchvision rotate the image "
        "before the crop, i.e. less work for DALI"
    )

    log("train: tarserve -p 2 -> Receiver.dataset() vs Dataset, 2 workers")
    firsts: list[float] = []
    try:
        t_serve, t_ours = alternate(reps, reps, tarserve_epoch(url, firsts), epoch(ours_basic, url), n, "tarserve")
    except Exception as e:  # said in the table and on stderr; the other rows of the section still count
        log(f"train: the tarserve row failed: {type(e).__name__}: {e}")
        rows.append(Row("`tarserve -p 2` → `Receiver.dataset()`: **failed** (see the notes)", 0.0, "img/s",
                        f"`Dataset`, {workers}", 0.0, "report", "**no**"))
        notes.append(f"tarserve row failed: {type(e).__name__}: {e}")
        t_serve = []
    if t_serve:
        rows.append(Row("`tarserve -p 2` → `Receiver.dataset()`, row 1's augmentations, img/s", rate(n, t_serve),
                        "img/s", f"`Dataset`, {workers}", rate(n, t_ours), "report", "—"))
        notes.append(
            f"tarserve -p 2 -> Receiver {spread(t_serve)}, first batch after median {statistics.median(firsts):.2f} s "
            f"(tarserve's start-up included); Dataset {spread(t_ours)}. Both decode in 2 processes on the same cores; "
            "tarserve's senders start a fresh Python (imports: ~0.25 s before the first batch) every run, where "
            "DataLoader workers are forked from a process that has imported everything; over ipc both hand "
            "batches over through shared memory (tarserve: a ring of memfd blocks, acknowledged as before)"
        )
    notes.append(
        "lines of user code (imports, pipeline, the for loop): Dataset "
        f"{code_lines(ours_basic)} (with rotate + jitter {code_lines(ours_jitter)}); webdataset + PIL + torchvision "
        f"{code_lines(torchvision_basic)} ({code_lines(torchvision_jitter)}); webdataset + tv2 {code_lines(tv2_basic)} "
        f"({code_lines(tv2_jitter)}); DALI {code_lines(dali_basic)} ({code_lines(dali_jitter)}) plus the index "
        f"(`tarindex --format dali`); tarserve 1 command line + {code_lines(receiver_recipe, loop=2)} lines in the trainer"
    )
    large, count = make_large_shards(ctx)
    log(f"train: row 1 on {count} large photos {LARGE[0]}x{LARGE[1]}")
    versus(f"row 1 on large photos ({LARGE[0]}x{LARGE[1]}, ~1 MB)", "large", large, count, ours_basic,
           baselines(torchvision_basic, tv2_basic, dali_basic, large, (0, 0, 0)))
    from tarproc.decode import IMAGENET_MEAN, IMAGENET_STD, AugmentSpec

    spec = AugmentSpec(size=224, random_crop=True, flip=0.5, mean=IMAGENET_MEAN, std=IMAGENET_STD, layout="CHW", seed=0)
    notes.append(f"reduced-size (DCT) decode, the scales the cpu backend decodes at under row 1's crops: ImageNet-like "
                 f"500x375 {scales_used(str(ctx.data.jpeg), spec)}; large photos {scales_used(large, spec)}")
    return rows, notes
