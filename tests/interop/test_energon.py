"""megatron-energon's ``energon prepare`` output beside our shards (issue 35): its binary
``SHARD.tar.idx`` and ``.nv-meta/`` must not stop a tarproc reader, and tarindex must not destroy them.

The shards are made here, prepared by the real ``energon prepare`` (a subprocess, non-interactive),
then read with tarproc. Skipped where megatron-energon isn't installed (``make test-fast``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from tarhelpers import run, write_tar

from tarproc import IndexedShard, read_samples
from tarproc.cli.tarindex import main as tarindex
from tarproc.dataset.counts import shard_counts
from tarproc.index import build_index, check_energon_index, index_kind, load_energon_index
from tarproc.samples import read_samples_from

ENERGON = Path(sys.executable).parent / "energon"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    pytest.importorskip("megatron.energon", reason="megatron-energon is not installed (pip install -e '.[dev]')")
    if not ENERGON.exists():
        pytest.skip(f"no energon command next to {sys.executable}")
    root = tmp_path_factory.mktemp("energon")
    keys: dict[str, list[str]] = {}
    for s in range(3):
        shard_keys = [f"s{s}/{i:03d}" for i in range(4)]
        if s == 1:
            shard_keys.insert(1, f"s{s}/" + "long" * 30)  # a GNU long name: extra headers before the sample
        samples = [{"__key__": k, "txt": f"caption {k}" * (i + 1), "cls": str(i)} for i, k in enumerate(shard_keys)]
        keys[str(write_tar(root / f"shard-{s}.tar", samples))] = shard_keys
    proc = subprocess.run(
        [str(ENERGON), "prepare", str(root), "--non-interactive", "--split-ratio", "1,0,0", "--skip-dataset-yaml",
         "--no-progress", "--num-workers", "1"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return SimpleNamespace(root=root, urls=list(keys), keys=keys)


def test_energon_wrote_what_tarproc_recognises(prepared):
    info = json.loads((prepared.root / ".nv-meta" / ".info.json").read_text())
    assert info["shard_counts"] == {Path(u).name: len(k) for u, k in prepared.keys.items()}
    for url, keys in prepared.keys.items():
        idx = Path(url + ".idx")
        assert index_kind(idx.read_bytes()) == "energon"
        energon = load_energon_index(str(idx))
        assert energon.samples == len(keys)
        check_energon_index(energon, build_index(url), url)


def test_dataset_counts_and_reads(prepared, tmp_path):
    found = shard_counts(prepared.urls, cache_dir=str(tmp_path / "cache"))
    assert found.counts == {u: len(k) for u, k in prepared.keys.items()}
    assert all(found.sources[u] == f"energon index {u}.idx" for u in prepared.urls)
    assert [s["__key__"] for s in read_samples(prepared.urls)] == [k for keys in prepared.keys.values() for k in keys]


def test_reading_from_energon_offsets(prepared):
    """Each offset energon gives is where its sample begins: a reader started there finds it."""
    for url, keys in prepared.keys.items():
        offsets = load_energon_index(url + ".idx").offsets
        for i, key in enumerate(keys):
            samples = read_samples_from(url, offsets[i])
            assert next(samples)["__key__"] == key
            samples.close()  # type: ignore[attr-defined]


def test_random_access_and_the_viewer(prepared):
    from tarproc.view.catalog import Catalog

    url = prepared.urls[1]
    with IndexedShard(url) as shard:
        assert shard.keys() == prepared.keys[url] and shard.index_url is None
    catalog = Catalog(prepared.urls)
    try:
        assert [catalog.count(i) for i in range(3)] == [len(k) for k in prepared.keys.values()]
        assert catalog.errors == [None, None, None]
    finally:
        catalog.close()


def test_tarindex_checks_and_keeps_energon_indexes(prepared):
    result = run(tarindex, ["--check", *prepared.urls])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [f"{u}.idx: energon index ({len(k)} samples) matches {u}"
                                          for u, k in prepared.keys.items()]
    url = prepared.urls[0]
    before = Path(url + ".idx").read_bytes()
    result = run(tarindex, [url])
    assert result.exit_code == 1
    assert result.stderr == (f"tarindex: error: {url}.idx: an energon index (megatron-energon's energon prepare) is "
                             "there; tarindex doesn't replace another tool's index: write yours elsewhere with -o, or "
                             "give --overwrite to replace it\n")
    assert Path(url + ".idx").read_bytes() == before
