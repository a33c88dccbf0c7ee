"""tarproc.Dataset over remote shards with index files beside them, on real servers on 127.0.0.1:
the counts come from the remote ``.idx`` files (equal steps, every key once), and a reader that
starts mid-shard reads from there with range requests (S3, moto); a server that ignores range
requests (Python's http.server) is read from the start, said once."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

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
    import fsspec.config

    for path in make(tmp_path):
        for name in (path.name, path.name + ".idx"):
            s3.client.upload_file(str(path.parent / name), s3.bucket, name)
    conf: dict[str, Any] = {}
    fsspec.config.set_conf_env(conf, envdict=s3.env)
    monkeypatch.setitem(fsspec.config.conf, "s3", conf["s3"])
    for name, value in s3.env.items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    urls = [f"s3://{s3.bucket}/train-{s}.tar" for s in range(len(SIZES))]
    keys, steps, datasets = every_rank(urls)
    assert keys == expected() and len(set(steps)) == 1
    assert all(d.count_sources[u].startswith("index ") for d in datasets for u in urls)
    assert sum(d.seeks for d in datasets) >= 2  # parts begun mid-shard, read from there
