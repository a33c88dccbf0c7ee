"""Reading shards over HTTP from a real server on 127.0.0.1 (started by the http_server fixture)."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess

import pytest


@pytest.fixture
def served(ix, shards, http_server):
    for path in shards.paths:
        shutil.copy(path, http_server.root)
    return http_server


def one_line_error(result, prog="tarcat"):
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{prog}: error: ") and "Traceback" not in result.stderr
    return lines[0]


def test_tarcat_brace_list_over_http(ix, shards, served):
    r = ix.run(ix.tarcat, [f"{served.url}/shard-{{0..2}}.tar"])
    assert r.exit_code == 0, r.stderr
    local = ix.run(ix.tarcat, shards.paths)
    assert r.stdout_bytes == local.stdout_bytes
    assert sorted(served.requests) == [f"/shard-{i}.tar" for i in range(3)]  # each once (read ahead: in any order)


def test_tarsplit_from_http(ix, shards, served, tmp_path):
    r = ix.run(ix.tarsplit, ["-n", "6", "-o", tmp_path / "s", f"{served.url}/shard-{{0..2}}.tar"])
    assert r.exit_code == 0, r.stderr
    assert ix.samples(str(tmp_path / "s-{000000..000001}.tar")) == shards.expected


def test_compressed_shard_over_http(ix, shards, served):
    data = open(shards.paths[1], "rb").read()
    (served.root / "c.tar.gz").write_bytes(gzip.compress(data))
    r = ix.run(ix.tarcat, [f"{served.url}/c.tar.gz"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == data


def test_not_found(ix, served, tmp_path):
    url = f"{served.url}/shard-7.tar"
    out = tmp_path / "out.tar"
    r = ix.run(ix.tarcat, ["-o", out, f"{served.url}/shard-0.tar", url])
    assert r.exit_code == 1
    line = one_line_error(r)
    assert url in line and "not found" in line
    assert not out.exists() and [n for n in os.listdir(tmp_path) if ".tmp-" in n] == []


def test_server_error(ix, served):
    url = f"{served.url}/error/shard-0.tar"
    r = ix.run(ix.tarcat, ["--retries", "0", url])  # retried by default: tests/interop/test_faults.py
    assert r.exit_code == 1
    assert url in one_line_error(r)


def test_connection_refused(ix, tmp_path):
    """The first open of a process, to a host it never reached: one line at once, no retries (a
    process of its own: this one may have reached that port before, and would retry)."""
    url = f"http://127.0.0.1:{ix.free_port()}/shard-0.tar"  # nothing listens there
    r = subprocess.run([ix.scripts.tarcat, url], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr == f"tarcat: error: {url}: open failed at byte 0: Connection refused\n"


def test_connection_dropped_halfway(ix, shards, served, tmp_path):
    url = f"{served.url}/half/shard-2.tar"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = ix.run(ix.tarcat, ["--retries", "0", "--prefetch", "0", "-o", out_dir / "out.tar", f"{served.url}/shard-0.tar", url])
    assert r.exit_code == 1
    line = one_line_error(r)
    assert url in line
    # the offset is what had been handed to the tar reader when the read failed (data of the failed
    # read itself is not counted), so only its presence is checked
    assert "read failed at byte" in line or "truncated" in line
    assert os.listdir(out_dir) == []  # no partial output, no temporary


def test_connection_dropped_halfway_tarsplit(ix, shards, served, tmp_path):
    url = f"{served.url}/half/shard-2.tar"
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = ix.run(ix.tarsplit, ["--retries", "0", "--prefetch", "0", "-n", "5", "-o", out_dir / "s", f"{served.url}/shard-{{0..1}}.tar", url])
    assert r.exit_code == 1
    assert url in one_line_error(r, "tarsplit")
    names = sorted(os.listdir(out_dir))
    # 8 good samples and at most 2 complete ones from the first half of shard 2 (how many arrive
    # before the error depends on timing): the first shard of 5 is finished, the second never is
    assert names == ["s-000000.tar"]
    assert ix.samples(out_dir / "s-000000.tar") == shards.expected[:5]


def test_skip_shard_over_http(ix, shards, served):
    r = ix.run(ix.tarcat, ["--on-error", "skip-shard", f"{served.url}/shard-0.tar", f"{served.url}/missing.tar",
                           f"{served.url}/shard-2.tar"])
    assert r.exit_code == 0, r.stderr
    assert f"{served.url}/missing.tar" in r.stderr
    got = [k for k, _ in ix.samples_of_bytes(r.stdout_bytes, served.root)]
    assert got == [k for k, _ in shards.expected[:4] + shards.expected[8:]]


def test_installed_script_over_http(ix, shards, served):
    r = subprocess.run([ix.scripts.tarcat, "-c", "3", f"{served.url}/shard-{{0..2}}.tar"], capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr == b""
    assert [k for k, _ in ix.samples_of_bytes(r.stdout, served.root)] == [k for k, _ in shards.expected[:3]]
