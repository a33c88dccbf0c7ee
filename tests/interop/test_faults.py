"""Remote shards over servers that misbehave, on 127.0.0.1: a cut connection, a 503, a stall, a
server that ignores range requests (``tests/faultserver.py``), and moto's S3 behind a proxy that
cuts connections. What must hold: the output is byte-for-byte the local one, a retry is a range
request at the byte reached, an epoch is exactly once, the shard cache holds exact copies and a cut
never leaves an entry."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from faultserver import CuttingProxy, FaultServer
from tarhelpers import write_tar

import tarproc
from tarproc.cli.tar2tsv import main as tar2tsv_main
from tarproc.cli.tarindex import main as tarindex_main
from tarproc.cli.tarpcat import main as tarpcat_main
from tarproc.cli.tarproc import main as tarproc_main
from tarproc.cli.tarshow import main as tarshow_main
from tarproc.dataset import Dataset

SHARDS = 4
PER_SHARD = 40


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """SHARDS shards of PER_SHARD samples (~4 KB each), each with its index beside it."""
    d = tmp_path / "www"
    d.mkdir()
    for s in range(SHARDS):
        path = d / f"train-{s}.tar"
        write_tar(path, [{"__key__": f"k{s}-{i:03d}", "cls": i, "bin": os.urandom(4000)} for i in range(PER_SHARD)])
        Path(str(path) + ".idx").write_bytes(tarproc.build_index(str(path)).jsonl_bytes())
    return d


@pytest.fixture
def server(data: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FaultServer(data) as s:
        yield s


def paths(data: Path) -> list[str]:
    return [str(data / f"train-{s}.tar") for s in range(SHARDS)]


def urls(server: Any) -> list[str]:
    return [f"{server.url}/train-{s}.tar" for s in range(SHARDS)]


def size(data: Path, s: int) -> int:
    return (data / f"train-{s}.tar").stat().st_size


def warnings(stderr: str) -> list[str]:
    """The warning lines, named after the program (``tarcat: warning: ...``; in-process: pytest's name)."""
    return [line for line in stderr.splitlines() if re.match(r"[\w.-]+: warning: ", line)]


def retried_at(stderr: str) -> list[int]:
    """The bytes the warnings say reading went on from."""
    return [int(m) for m in re.findall(r"retry \d+ of \d+ in [\d.]+ s, from byte (\d+)", stderr)]


# ---------------------------------------------------------------------------------------------
# the commands


def test_tarcat_over_a_cut_connection_is_the_local_output_and_the_retry_a_range_request(ix, data, server):
    cut = size(data, 1) // 2 + 100
    server.cut("/train-1.tar", after=cut)
    r = ix.run(ix.tarcat, urls(server))
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == ix.run(ix.tarcat, paths(data)).stdout_bytes
    (at,) = retried_at(r.stderr)
    assert 0 < at <= cut  # what the client had read when the reset came
    gets = server.gets("/train-1.tar")
    assert [(g.range, g.status) for g in gets] == [(None, 200), (f"bytes={at}-", 206)]
    (line,) = warnings(r.stderr)
    assert f"{server.url}/train-1.tar: read failed at byte {at}" in line and "retry 1 of 5" in line


def test_a_503_is_retried_after_the_wait_the_server_asks_for(ix, data, server):
    server.fail("/train-0.tar", 503, retry_after=1)
    started = time.monotonic()
    r = ix.run(ix.tarcat, urls(server))
    assert r.exit_code == 0, r.stderr
    assert time.monotonic() - started >= 0.9
    assert r.stdout_bytes == ix.run(ix.tarcat, paths(data)).stdout_bytes
    (line,) = warnings(r.stderr)
    assert "open failed at byte 0 (HTTP 503" in line and "in 1.0 s" in line


def test_a_stall_past_the_timeout_reconnects(ix, data, server):
    server.stall("/train-2.tar", after=5000, seconds=30)
    r = ix.run(ix.tarcat, ["--timeout", "0.5", *urls(server)])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == ix.run(ix.tarcat, paths(data)).stdout_bytes
    (line,) = warnings(r.stderr)
    assert "timed out" in line and "train-2.tar" in line


def test_a_server_that_ignores_range_is_read_again_from_the_start_and_skipped(ix, data, server):
    server.ignore_range = True
    server.cut("/train-3.tar", after=size(data, 3) // 3)
    r = ix.run(ix.tarcat, urls(server))
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == ix.run(ix.tarcat, paths(data)).stdout_bytes
    assert "the server ignores range requests: reading from the start and skipping" in r.stderr
    assert [g.status for g in server.gets("/train-3.tar")] == [200, 200]


def test_retries_used_up_is_one_error_and_no_output(ix, data, server, tmp_path):
    server.cut("/train-1.tar", after=3000)
    server.fail("/train-1.tar", 503, times=10)  # no way on from byte 3000
    out = tmp_path / "out" / "all.tar"
    out.parent.mkdir()
    r = ix.run(ix.tarcat, ["--retries", "2", "-o", out, *urls(server)])
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 3 and len(warnings(r.stderr)) == 2 and "Traceback" not in r.stderr
    assert lines[2] == f"tarcat: error: {server.url}/train-1.tar: read failed at byte 3000 (3 attempts): HTTP 503 Service Unavailable"
    assert os.listdir(out.parent) == []  # no partial file, no temporary one


@pytest.mark.parametrize("command", ["tarsplit", "tarshow", "tar2tsv", "tarpcat", "tarindex", "tarproc"])
def test_every_reading_command_reconnects(ix, data, server, tmp_path, command):
    """Each command's output over cut connections is its output over a clean server."""
    mains = {"tarsplit": ix.tarsplit, "tarshow": tarshow_main, "tar2tsv": tar2tsv_main, "tarpcat": tarpcat_main,
             "tarindex": tarindex_main, "tarproc": tarproc_main}

    def run(name: str) -> tuple[Any, bytes]:
        out = tmp_path / name
        out.mkdir()
        args = {"tarsplit": ["-n", "50", "-o", out / "s"], "tarshow": ["--summary"], "tar2tsv": ["-f", "__key__ cls"],
                "tarpcat": ["-p", "2", "-o", out / "all.tar"], "tarindex": ["--format", "wids", "-o", out / "w.json"],
                "tarproc": ["-c", "true", "-o", out / "all.tar"]}[command]
        r = ix.run(mains[command], [*args, *urls(server)])
        assert r.exit_code == 0, r.stderr
        files = b"".join((out / n).read_bytes() for n in sorted(os.listdir(out)))
        return r, r.stdout_bytes + files

    _, clean = run("clean")
    for s in range(SHARDS):
        server.cut(f"/train-{s}.tar", after=size(data, s) // 2)
    r, cut = run("cut")
    assert cut == clean
    assert len(retried_at(r.stderr)) == SHARDS


def test_read_samples_and_a_pipe_in_a_real_pipeline(ix, data, server, tmp_path):
    """tarcat | tarsplit as subprocesses, every shard cut once: the shards written are the local ones'."""
    for s in range(SHARDS):
        server.cut(f"/train-{s}.tar", after=size(data, s) // 2)
    out = tmp_path / "split"
    out.mkdir()
    cat = subprocess.Popen([ix.scripts.tarcat, "-q", *urls(server)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    split = subprocess.run([ix.scripts.tarsplit, "-q", "-n", str(PER_SHARD), "-o", str(out / "s-%d.tar")],
                           stdin=cat.stdout, capture_output=True)
    assert cat.stdout is not None
    cat.stdout.close()
    assert cat.wait(timeout=60) == 0 and split.returncode == 0, split.stderr
    for s in range(SHARDS):
        assert ix.samples(out / f"s-{s}.tar") == ix.samples(data / f"train-{s}.tar")
    assert len(server.gets()) == 2 * SHARDS


# ---------------------------------------------------------------------------------------------
# the Dataset


def keys_of(ds: Dataset) -> Counter[str]:
    return Counter(k for (batch,) in ds for k in batch)


def all_keys() -> Counter[str]:
    return Counter(f"k{s}-{i:03d}" for s in range(SHARDS) for i in range(PER_SHARD))


def test_a_dataset_epoch_over_cut_connections_is_exactly_once(data, server):
    for s in range(SHARDS):  # closed, then reset (what was received and not read is lost: read again)
        server.cut(f"/train-{s}.tar", after=size(data, s) // 3)
        server.cut(f"/train-{s}.tar", after=size(data, s) // 2, reset=True)
    ds = Dataset(urls(server), batch_size=16, shuffle=30, to_tuple=("__key__",), tensors="numpy")
    assert keys_of(ds) == all_keys()
    assert sum(len(server.gets(f"/train-{s}.tar")) for s in range(SHARDS)) == 3 * SHARDS  # cut twice, then whole


def test_a_dataset_in_dataloader_workers_over_cut_connections(data, server):
    pytest.importorskip("torch")
    for s in range(SHARDS):
        server.cut(f"/train-{s}.tar", after=size(data, s) // 2)
    ds = Dataset(urls(server), batch_size=16, to_tuple=("__key__",), part_size=None)
    assert Counter(k for (batch,) in ds.loader(num_workers=2) for k in batch) == all_keys()


def test_skip_shard_counts_says_and_fills_in_what_an_epoch_lost(data, server, capfd):
    server.cut("/train-2.tar", after=size(data, 2) // 3, times=2)  # read ahead, then by the reader
    ds = Dataset(urls(server), batch_size=16, to_tuple=("__key__", "__valid__"), tensors="numpy", retries=0,
                 on_error="skip-shard", part_size=None)
    steps = len(ds)
    with pytest.warns(tarproc.TarprocWarning) as said:  # warnings of Python's, which shows them on stderr
        batches = [(list(keys), list(valid)) for keys, valid in ds]
    assert [len(k) for k, _ in batches] == [16] * (steps - 1) + [SHARDS * PER_SHARD - 16 * (steps - 1)]
    real = Counter(k for keys, valid in batches for k, v in zip(keys, valid, strict=True) if v)
    filled = sum(not v for _, valid in batches for v in valid)
    assert ds.skipped_shards == 1 and 0 < ds.lost < PER_SHARD and filled == ds.lost
    assert sum(real.values()) == SHARDS * PER_SHARD - ds.lost and max(real.values()) == 1
    assert set(real) <= set(all_keys())
    err = "".join(f"{w.message}\n" for w in said)
    assert "train-2.tar: read failed at byte" in err and f"{ds.lost} samples of this epoch lost" in err
    assert "marked __valid__ = False" in err


def test_without_skip_shard_a_failed_read_ends_the_epoch_with_the_error(data, server):
    server.cut("/train-2.tar", after=size(data, 2) // 3, times=2)  # read ahead, then by the reader
    ds = Dataset(urls(server), batch_size=16, to_tuple=("__key__",), tensors="numpy", retries=0)
    with pytest.raises(tarproc.SourceError, match=r"train-2.tar: read failed at byte \d+"):
        keys_of(ds)


# ---------------------------------------------------------------------------------------------
# the shard cache


def versions(cache: Path) -> dict[str, list[bytes]]:
    """The cache's entries: the URL each holds -> the bytes of its versions."""
    import json

    root = cache / "shards"
    found: dict[str, list[bytes]] = {}
    for name in sorted(os.listdir(root)):
        if name.endswith(".json"):
            meta = json.loads((root / name).read_text())
            found.setdefault(meta["url"], []).append((root / name[: -len(".json")]).read_bytes())
    return found


def entries(cache: Path) -> dict[str, bytes]:
    """The cache's entries, one version a URL: the URL -> its bytes."""
    found = versions(cache)
    assert all(len(v) == 1 for v in found.values())
    return {url: v[0] for url, v in found.items()}


def leftovers(cache: Path) -> list[str]:
    tmp = cache / "shards" / ".tmp"
    return os.listdir(tmp) if tmp.exists() else []


def test_the_second_epoch_reads_the_cache_and_not_the_server(data, server, tmp_path):
    cache = tmp_path / "cache"
    server.cut("/train-1.tar", after=size(data, 1) // 2)  # filled over a reconnect all the same
    ds = Dataset(urls(server), batch_size=16, shuffle=30, to_tuple=("__key__",), tensors="numpy",
                 cache_dir=str(cache))
    assert ds.part_size is None  # whole shards: what a reader reads whole becomes an entry
    assert keys_of(ds) == all_keys()
    kept = {u: v for u, v in entries(cache).items() if u.endswith(".tar")}  # the .idx files are kept too
    assert kept == {u: Path(p).read_bytes() for u, p in zip(urls(server), paths(data), strict=True)}
    requests = len(server.requests)
    ds.set_epoch(1)
    assert keys_of(ds) == all_keys()
    assert len(server.requests) == requests  # not even a HEAD
    assert leftovers(cache) == []


@pytest.mark.timeout(180)
def test_dataloader_workers_with_indexes_and_a_cache_make_no_request_after_the_first_epoch(data, server, tmp_path):
    """Readers start mid-shard with the remote .idx files; the Loader reads the indexes in the main
    process, through the cache, just before its workers fork: a fill running then must not be
    inherited as one to wait for (that hung the second epoch), and no epoch after the first asks
    the store for anything, indexes included."""
    pytest.importorskip("torch")
    ds = Dataset(urls(server), batch_size=7, shuffle=30, to_tuple=("__key__",), tensors="numpy",
                 cache_dir=str(tmp_path / "cache"))  # batches of 7: the workers' blocks meet mid-shard
    loader = ds.loader(num_workers=2)
    for epoch in range(4):
        ds.set_epoch(epoch)
        mark = len(server.requests)
        assert Counter(k for (batch,) in loader for k in batch) == all_keys()
        if epoch:
            assert server.requests[mark:] == [], epoch


def test_a_cut_never_leaves_an_entry(ix, data, server, tmp_path):
    cache = tmp_path / "cache"
    server.cut("/train-1.tar", after=size(data, 1) // 3, times=2)  # read ahead, then by the reader
    r = ix.run(ix.tarcat, ["--retries", "0", "--cache", cache, *urls(server)])
    assert r.exit_code == 1
    # train-1 never complete, so never an entry (train-2, opened ahead, may be: its copy is whole)
    kept = entries(cache)
    assert urls(server)[0] in kept and urls(server)[1] not in kept
    assert all(kept[u] == Path(p).read_bytes() for u, p in zip(urls(server), paths(data), strict=True) if u in kept)


def test_the_commands_cache_and_a_changed_shard_is_a_new_entry(ix, data, server, tmp_path):
    cache = tmp_path / "cache"
    first = ix.run(ix.tarcat, ["--cache", cache, *urls(server)])
    assert first.exit_code == 0, first.stderr
    gets = len(server.gets())
    again = ix.run(ix.tarcat, ["--cache", cache, *urls(server)])
    assert again.stdout_bytes == first.stdout_bytes
    assert server.gets()[gets:] == []  # a HEAD each: the version in the cache is the server's
    write_tar(data / "train-0.tar", [{"__key__": "new", "cls": 1}])
    changed = ix.run(ix.tarcat, ["--cache", cache, urls(server)[0]])
    assert ix.samples_of_bytes(changed.stdout_bytes, tmp_path) == [("new", {"cls": b"1"})]
    assert (data / "train-0.tar").read_bytes() in versions(cache)[urls(server)[0]]  # beside the old one


def test_the_cache_size_evicts_the_least_recently_used(ix, data, server, tmp_path):
    cache = tmp_path / "cache"
    bound = size(data, 0) * 2 + size(data, 0) // 2  # two shards fit
    for s in range(SHARDS):
        r = ix.run(ix.tarcat, ["--cache", cache, "--cache-size", str(bound), urls(server)[s]])
        assert r.exit_code == 0, r.stderr
    assert set(entries(cache)) == set(urls(server)[-2:])


def test_two_processes_filling_the_same_cache(ix, data, server, tmp_path):
    cache = tmp_path / "cache"
    server.latency = 0.05  # so that the two overlap
    runs = [subprocess.Popen([ix.scripts.tarcat, "-q", "--cache", str(cache), *urls(server)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in runs]
    assert [p.returncode for p in runs] == [0, 0], outs
    local = ix.run(ix.tarcat, paths(data)).stdout_bytes
    assert outs[0][0] == outs[1][0] == local
    assert entries(cache) == {u: Path(p).read_bytes() for u, p in zip(urls(server), paths(data), strict=True)}
    assert leftovers(cache) == []


def test_a_process_killed_while_filling_leaves_no_entry(ix, data, server, tmp_path):
    cache = tmp_path / "cache"
    server.stall("/train-0.tar", after=5000, seconds=30)
    p = subprocess.Popen([ix.scripts.tarcat, "-q", "--cache", str(cache), "-o", str(tmp_path / "o.tar"),
                          urls(server)[0]], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not leftovers(cache) and time.monotonic() < deadline:
        time.sleep(0.05)
    p.kill()
    p.wait()
    assert not (cache / "shards" / "train-0.tar").exists() and entries(cache) == {}
    server.clear()
    r = ix.run(ix.tarcat, ["--cache", cache, urls(server)[0]])  # the next filler removes what was left
    assert r.exit_code == 0, r.stderr
    assert leftovers(cache) == [] and list(entries(cache).values()) == [(data / "train-0.tar").read_bytes()]


# ---------------------------------------------------------------------------------------------
# S3 (moto) behind a proxy that cuts connections


def test_s3_behind_a_cutting_proxy(ix, s3, data, tmp_path):
    for s in range(SHARDS):
        s3.client.upload_file(str(data / f"train-{s}.tar"), s3.bucket, f"train-{s}.tar")
    with CuttingProxy(s3.endpoint, cut_after=size(data, 0) // 2, times=2) as proxy:
        env = {**s3.env, "FSSPEC_S3_ENDPOINT_URL": proxy.url}
        r = subprocess.run([ix.scripts.tarcat, "-q", *[f"s3://{s3.bucket}/train-{s}.tar" for s in range(SHARDS)]],
                           env=env, capture_output=True, timeout=120)
        assert r.returncode == 0, r.stderr.decode()
        assert r.stdout == ix.run(ix.tarcat, paths(data)).stdout_bytes
        assert proxy.cuts == 2


def test_a_copy_that_does_not_match_the_manifest_sha256_is_not_kept(data, server, tmp_path, capfd):
    import json

    manifest = tmp_path / "manifest.jsonl"
    rows = []
    for s in range(SHARDS):
        digest = hashlib.sha256((data / f"train-{s}.tar").read_bytes()).hexdigest()
        rows.append({"shard": f"train-{s}.tar", "samples": PER_SHARD, "sha256": "0" * 64 if s == 2 else digest})
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cache = tmp_path / "cache"
    with pytest.warns(tarproc.CacheWarning) as said:  # a warning of Python's, which shows it on stderr
        ds = Dataset(urls(server), batch_size=16, to_tuple=("__key__",), tensors="numpy", lengths=str(manifest),
                     cache_dir=str(cache))
        assert keys_of(ds) == all_keys()
    assert set(entries(cache)) == {u for i, u in enumerate(urls(server)) if i != 2} and leftovers(cache) == []
    assert any(f"{urls(server)[2]}: its sha256 is " in str(w.message) for w in said)


def test_parts_ask_the_store_for_their_bytes_only(data, server):
    """With an index beside each shard a part is a range request that ends past its last sample,
    not an open-ended one whose rest the read-ahead would fetch for nothing."""
    ds = Dataset(urls(server), batch_size=16, shuffle=30, to_tuple=("__key__",), tensors="numpy", part_size=10)
    assert keys_of(ds) == all_keys()
    gets = [g for s in range(SHARDS) for g in server.gets(f"/train-{s}.tar")]
    assert any(g.range and not g.range.endswith("-") for g in gets)  # bytes=a-b
    assert sum(g.sent for g in gets) < 1.3 * sum(size(data, s) for s in range(SHARDS))


def test_skip_shard_keeps_padding_marked_and_copies_as_read(data, server):
    """Fill-ins are copies of samples as read (a map that changes samples in place runs on them
    once), and pad=True's padding stays marked not valid."""
    server.cut("/train-2.tar", after=size(data, 2) // 5, times=2)  # well inside rank 1's share (its first 27)

    def bump(sample: dict[str, Any]) -> dict[str, Any]:
        sample["mapped"] = sample.get("mapped", 0) + 1  # in place
        return sample

    ds = Dataset(urls(server), batch_size=16, to_tuple=("mapped", "__valid__"), tensors="numpy", retries=0,
                 on_error="skip-shard", part_size=None, map=bump, pad=True, rank=1, world_size=3)
    rows = [(m, v) for mapped, valid in ds for m, v in zip(mapped.tolist(), valid.tolist(), strict=True)]
    assert ds.lost > 0 and {m for m, _ in rows} == {1}  # mapped once, the copies too
    fair = Dataset(urls(server), batch_size=16, to_tuple=("cls", "__valid__"), tensors="numpy", pad=True, rank=1,
                   world_size=3)
    padding = sum(not v for _, valid in fair for v in valid.tolist())
    assert padding > 0 and sum(not v for _, v in rows) == padding + ds.lost
