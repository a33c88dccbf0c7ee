"""tarproc.Dataset over remote shards with index files beside them, on real servers on 127.0.0.1:
the counts come from the remote ``.idx`` files (equal steps, every key once), and a reader that
starts mid-shard reads from there with range requests (S3, moto); a server that ignores range
requests (Python's http.server) is read from the start, said once."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tarhelpers import write_tar

import tarproc
from tarproc.dataset import Dataset

SIZES = [100, 73]


def make(directory: Path) -> list[Path]:
    paths, n = [], 0
    for s, size in enumerate(SIZES):
        path = directory / f"train-{s}.tar"
        write_tar(path, [{"__key__": f"k{n + i:04d}", "cls": i, "bin": b"x" * 3000} for i in range(size)])
        Path(str(path) + ".idx").write_bytes(tarproc.build_index(str(path)).jsonl_bytes())
        paths.append(path)
        n += size
    return paths


def every_rank(urls: list[str], world: int = 3) -> tuple[Counter[str], list[int], list[Dataset]]:
    keys: Counter[str] = Counter()
    steps, datasets = [], []
    for rank in range(world):
        ds = Dataset(urls, batch_size=8, shuffle=20, seed=2, rank=rank, world_size=world, to_tuple=("__key__",),
                     tensors="numpy")
        batches = [list(b) for (b,) in ds]
        steps.append(len(batches))
        keys.update(k for b in batches for k in b)
        datasets.append(ds)
    return keys, steps, datasets


def use_s3(s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsspec's s3:// (and the DataLoader workers it forks) pointed at the moto server's bucket."""
    import fsspec.config

    conf: dict[str, Any] = {}
    fsspec.config.set_conf_env(conf, envdict=s3.env)
    monkeypatch.setitem(fsspec.config.conf, "s3", conf["s3"])
    for name, value in s3.env.items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)


def expected() -> Counter[str]:
    return Counter(f"k{i:04d}" for i in range(sum(SIZES)))


def test_over_http_counts_from_the_index_files_and_no_range_requests(tmp_path: Path, http_server: Any,
                                                                      capfd: pytest.CaptureFixture[str]) -> None:
    for path in make(tmp_path):
        shutil.copy(path, http_server.root)
        shutil.copy(str(path) + ".idx", http_server.root)
    urls = [f"{http_server.url}/train-{s}.tar" for s in range(len(SIZES))]
    with pytest.warns(tarproc.NetworkWarning) as said:  # a warning of Python's, which shows it on stderr
        keys, steps, datasets = every_rank(urls)
    assert keys == expected() and len(set(steps)) == 1
    assert all(d.count_sources[u].startswith("index ") for d in datasets for u in urls)
    err = "".join(f"{w.message}\n" for w in said)
    assert "the server ignores range requests" in err  # said, then read from the start


def test_over_s3_a_reader_starts_mid_shard_with_range_requests(tmp_path: Path, s3: Any,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    for path in make(tmp_path):
        for name in (path.name, path.name + ".idx"):
            s3.client.upload_file(str(path.parent / name), s3.bucket, name)
    use_s3(s3, monkeypatch)
    urls = [f"s3://{s3.bucket}/train-{s}.tar" for s in range(len(SIZES))]
    keys, steps, datasets = every_rank(urls)
    assert keys == expected() and len(set(steps)) == 1
    assert all(d.count_sources[u].startswith("index ") for d in datasets for u in urls)
    assert sum(d.seeks for d in datasets) >= 2  # parts begun mid-shard, read from there


def test_relaid_shards_over_s3_through_the_cache_on_two_ranks_give_the_originals_batches_and_resume(
        tmp_path: Path, s3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The crossing of issue 37's re-layout with remote training: shards re-laid by ``tarjpeg`` (a
    real process), on S3 with index files, read through the shard cache by 2 ranks x 2 DataLoader
    workers with random crops: every sample once, equal steps, and each image the pixels the local
    originals give that sample; a rank resumed mid-epoch goes on exactly as it would have, and a
    resume on another layout (1 rank, 1 worker; 1 rank in the loop's process) hands out every
    remaining sample once, each with the originals' pixels. The cached copies are local files:
    their images wait in the shuffle buffers as ranges (``FileRange``), here for every image (the
    reader's threshold lowered from 64 KiB to 1 KiB, in the workers too, forked after)."""
    pytest.importorskip("torch")
    from tarhelpers import encode_image, photo

    import tarproc.tar.reader
    from tarproc.decode import AugmentSpec
    from tarproc.decode import cpu as cpu_backend
    from tarproc.tar.ranges import held_files

    monkeypatch.setattr(tarproc.tar.reader, "_VIEW", 1024)

    if cpu_backend._jpeg is None:
        pytest.skip("tarproc._jpeg is not built: no crop decoder for restart markers")
    originals, relaid = tmp_path / "originals", tmp_path / "relaid"
    originals.mkdir()
    relaid.mkdir()
    n = 0
    for s, size in enumerate((10, 7)):
        samples = [{"__key__": f"k{n + i:03d}", "jpg": encode_image(photo(120, 90, n + i), quality=85), "cls": str(i % 3)}
                   for i in range(size)]
        n += size
        write_tar(originals / f"train-{s}.tar", samples)
        out = relaid / f"train-{s}.tar"
        subprocess.run([str(Path(sys.executable).parent / "tarjpeg"), str(originals / f"train-{s}.tar"), "-o", str(out), "-q"], check=True)
        assert out.read_bytes().count(b"\xff\xdd") == size  # every JPEG has a restart interval now
        for name, path in ((f"train-{s}.tar", out), (f"train-{s}.tar.idx", None)):
            data = tarproc.build_index(str(out)).jsonl_bytes() if path is None else path.read_bytes()
            s3.client.put_object(Bucket=s3.bucket, Key=name, Body=data)
    use_s3(s3, monkeypatch)
    local = [str(originals / f"train-{s}.tar") for s in range(2)]
    remote = [f"s3://{s3.bucket}/train-{s}.tar" for s in range(2)]
    spec = AugmentSpec(size=48, random_crop=True, flip=0.5)
    network = tarproc.Network(cache_dir=str(tmp_path / "cache"))

    def loader(urls: list[str], rank: int = 0, world: int = 2, workers: int = 2, **kw: Any) -> Any:
        ds = Dataset(urls, decode=spec, to_tuple=("__key__", "jpg", "cls"), batch_size=3, shuffle=5, seed=7,
                     rank=rank, world_size=world, **kw)
        return ds.loader(num_workers=workers)

    def batches(it: Any) -> list[tuple[list[str], Any]]:
        return [(list(keys), images.numpy().copy()) for keys, images, _ in it]

    def by_key(runs: list[list[tuple[list[str], Any]]]) -> dict[str, Any]:
        return {k: image for run in runs for keys, images in run for k, image in zip(keys, images, strict=True)}

    pixels = by_key([batches(loader(local, rank)) for rank in range(2)])  # the originals, read locally
    runs = {rank: batches(loader(remote, rank, network=network)) for rank in range(2)}
    keys = [k for run in runs.values() for batch, _ in run for k in batch]
    assert sorted(keys) == sorted(pixels) == [f"k{i:03d}" for i in range(n)]  # every sample once
    assert len(runs[0]) == len(runs[1])  # equal steps
    assert all(np.array_equal(image, pixels[k]) for k, image in by_key(list(runs.values())).items())
    for s in range(2):  # the epochs read through the cache: a verified copy of each re-laid shard
        copies = list((tmp_path / "cache" / "shards").glob(f"*-train-{s}.tar"))
        assert [c.read_bytes() for c in copies] == [(relaid / f"train-{s}.tar").read_bytes()]

    first = loader(remote, 0, network=network)
    it = iter(first)
    next(it)
    state = json.loads(json.dumps(first.state_dict()))
    del it
    resumed = loader(remote, 0, network=network)
    resumed.load_state_dict(state)
    rest = batches(resumed)
    assert [k for k, _ in rest] == [k for k, _ in runs[0][1:]]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(rest, runs[0][1:], strict=True))

    other = loader(remote, 0, world=1, workers=1, network=network)
    other.load_state_dict(state)
    left = [(k, image) for keys, images in batches(other) for k, image in zip(keys, images, strict=True)]
    handed = {k for r in runs.values() for k in r[0][0]}  # step 1 of both ranks
    assert sorted(k for k, _ in left) == sorted(set(pixels) - handed)
    assert all(np.array_equal(image, pixels[k]) for k, image in left)
    # and in the loop's own process (no workers: batch arrays used again once let go of), every
    # batch kept as it came: the same samples and pixels, none written over by a later batch
    here = loader(remote, 0, world=1, workers=0, network=network)
    here.load_state_dict(state)
    held, kept = held_files(), []
    most = held
    for keys, images, _ in here:
        kept.append((list(keys), images))
        most = max(most, held_files())
    assert most > held == held_files()  # the cached copies held for their images' ranges, let go of at the end
    assert sorted(k for keys, _ in kept for k in keys) == sorted(set(pixels) - handed)
    assert all(np.array_equal(image.numpy(), pixels[k]) for keys, images in kept for k, image in zip(keys, images, strict=True))
