"""Servers that hurt without failing outright, on 127.0.0.1 (``tests/faultserver.py``): one that
drips a byte now and then, one that stops listening for a while mid-run, one that redirects to
itself, one that names no version. What must hold: a drip is a failure retried at the byte reached,
not a hang; a refusal from a host that answered before is retried, one where nothing ever listened
is one line at once; a redirect loop is one line; every warning is one line named after the program."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from faultserver import FaultServer
from tarhelpers import write_tar

from tarproc.errors import SourceError
from tarproc.sources import Network, remote
from tarproc.sources.remote import BACKOFF_MAX, Identity, RemoteReader

SHARDS = 3
PER_SHARD = 30


@pytest.fixture
def data(tmp_path: Path) -> Path:
    d = tmp_path / "www"
    d.mkdir()
    for s in range(SHARDS):
        write_tar(d / f"train-{s}.tar", [{"__key__": f"k{s}-{i:03d}", "bin": os.urandom(4000)} for i in range(PER_SHARD)])
    return d


@pytest.fixture
def server(data: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FaultServer(data) as s:
        yield s


def urls(server: Any) -> list[str]:
    return [f"{server.url}/train-{s}.tar" for s in range(SHARDS)]


def local(ix: Any, data: Path) -> bytes:
    return ix.run(ix.tarcat, [data / f"train-{s}.tar" for s in range(SHARDS)]).stdout_bytes


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if re.match(r"[\w.-]+: warning: ", line)]


# ---------------------------------------------------------------------------------------------
# a server that drips


@pytest.mark.timeout(60)  # a safety net: without a floor this read never ends
@pytest.mark.parametrize("every", [0.05, 0.4])  # far below the timeout, and just below it
def test_a_drip_is_a_failure_retried_at_the_byte_reached(ix, data, server, every):
    half = (data / "train-1.tar").stat().st_size // 2
    server.drip("/train-1.tar", after=half, every=every)
    r = ix.run(ix.tarcat, ["--timeout", "0.5", "--speed-time", "1", "--prefetch", "0", *urls(server)])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == local(ix, data)
    (line,) = warnings(r.stderr)
    assert "/train-1.tar: read failed at byte" in line and "(slower than 1,024 bytes/s for 1 s)" in line
    at = int(re.search(r"from byte (\d+)", line)[1])  # type: ignore[index]
    assert half <= at < half + 100
    assert [g.range for g in server.gets("/train-1.tar")] == [None, f"bytes={at}-"]


@pytest.mark.timeout(60)
def test_a_drip_that_never_ends_is_one_error_when_the_retries_are_used_up(ix, data, server):
    # each answer drips from its first byte: no progress between the attempts (bytes that came
    # before a read failed are read again)
    server.drip("/train-0.tar", after=0, every=0.05, times=10)
    r = ix.run(ix.tarcat, ["--timeout", "0.5", "--speed-time", "0.5", "--retries", "1", urls(server)[0]])
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and len(warnings(r.stderr)) == 1
    assert re.fullmatch(rf"tarcat: error: {re.escape(urls(server)[0])}: read failed at byte \d+ \(2 attempts\): "
                        r"slower than 1,024 bytes/s for 0.5 s", lines[1])


# ---------------------------------------------------------------------------------------------
# a server that stops listening for a while


def test_the_server_refuses_then_listens_again_on_its_port(server):
    port = int(server.url.rsplit(":", 1)[1])
    server.refuse()
    assert server.refusing.is_set()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=10)
    server.resume()
    assert not server.refusing.is_set()
    with urllib.request.urlopen(urls(server)[0], timeout=10) as answer:
        assert answer.status == 200


@pytest.mark.parametrize("prefetch", ["0", "32MiB"])  # opened by the reader, or ahead by threads
def test_a_refusal_mid_run_is_retried_and_the_run_complete(ix, data, server, monkeypatch, prefetch):
    said: list[str] = []

    def warn(message: str) -> None:  # the server listens again once a refusal has been retried
        said.append(message)
        if "Connection refused" in message:
            server.resume()

    monkeypatch.setattr(remote, "warn_stderr", warn)
    server.refuse(after="/train-0.tar")  # served; the next connection is refused
    r = ix.run(ix.tarcat, ["--prefetch", prefetch, *urls(server)])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == local(ix, data)
    assert said and all("open failed at byte 0 (Connection refused); retry 1 of 5 in " in m for m in said)


def test_a_refusal_from_a_host_never_reached_is_an_error_at_once(server):
    url = urls(server)[0]
    server.refuse()
    said: list[str] = []
    with pytest.raises(SourceError) as e:
        RemoteReader(url, network=Network(retries=3, backoff=0), warn=said.append)
    assert str(e.value) == f"{url}: open failed at byte 0: Connection refused" and said == []


def test_a_refusal_from_a_host_reached_by_another_process_is_retried(server):
    url = urls(server)[0]
    server.refuse()
    remote.mark_reached(url)  # what a Dataset's worker is told of its parent's hosts
    said: list[str] = []
    with pytest.raises(SourceError, match=r"open failed at byte 0 \(3 attempts\): Connection refused"):
        RemoteReader(url, network=Network(retries=2, backoff=0), warn=said.append, sleep=lambda s: None)
    assert len(said) == 2


def test_the_warning_says_the_wait_it_takes(server):
    url = urls(server)[0]
    server.fail("/train-0.tar", 503, retry_after=1000)  # more than BACKOFF_MAX
    said: list[str] = []
    slept: list[float] = []
    RemoteReader(url, network=Network(retries=1), warn=said.append, sleep=slept.append).close()
    assert slept == [BACKOFF_MAX]
    assert said == [f"{url}: open failed at byte 0 (HTTP 503 Service Unavailable); retry 1 of 1 in "
                    f"{BACKOFF_MAX:.1f} s, from byte 0"]


def test_a_warning_is_one_line_named_after_the_program(ix, data, server):
    server.cut("/train-1.tar", after=10_000)
    r = subprocess.run([ix.scripts.tarcat, *urls(server)], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.decode().startswith(f"tarcat: warning: {urls(server)[1]}: read failed at byte 10000 (")
    assert len(r.stderr.decode().splitlines()) == 1


# ---------------------------------------------------------------------------------------------
# a server that redirects to itself; one that names no version


def test_a_redirect_loop_is_one_line(ix, server):
    url = f"{server.url}/loop/train-0.tar"
    r = ix.run(ix.tarcat, [url])
    assert r.exit_code == 1
    assert r.stderr == (f"tarcat: error: {url}: cannot open: a redirect loop or too many redirects (last answer: "
                        "HTTP 302 Found)\n")


def test_a_server_without_etag_is_read_again_at_the_byte_reached(ix, data, tmp_path, monkeypatch):
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    with FaultServer(data, etag=False) as server:
        assert remote.identify(urls(server)[0]) == Identity((data / "train-0.tar").stat().st_size, None)
        server.cut("/train-2.tar", after=20_000)
        r = ix.run(ix.tarcat, urls(server))
        assert r.exit_code == 0, r.stderr
        assert r.stdout_bytes == local(ix, data)
        assert [g.range for g in server.gets("/train-2.tar")] == [None, "bytes=20000-"]


def test_a_cached_copy_of_a_shard_rewritten_at_the_same_size_is_never_served(ix, data, tmp_path, monkeypatch):
    """A store that names no version (no ETag, no Last-Modified): the cache key is the URL and the
    size only, so a rewrite at the same size would be served stale; the copy is checked first."""
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    cache = tmp_path / "cache"
    with FaultServer(data, etag=False) as server:
        url = urls(server)[0]
        first = subprocess.run([ix.scripts.tarcat, "-q", "--cache", str(cache), url], capture_output=True)
        assert first.returncode == 0 and first.stdout == (data / "train-0.tar").read_bytes()
        size = (data / "train-0.tar").stat().st_size
        write_tar(data / "train-0.tar", [{"__key__": f"new-{i:03d}", "bin": os.urandom(4000)} for i in range(PER_SHARD)])
        assert (data / "train-0.tar").stat().st_size == size  # rewritten at the same size
        again = subprocess.run([ix.scripts.tarcat, "-q", "--cache", str(cache), url], capture_output=True, text=False)
        assert again.returncode == 0, again.stderr
        assert again.stdout == (data / "train-0.tar").read_bytes()  # the store's bytes, not the copy's
        (line,) = warnings(again.stderr.decode())
        assert line.startswith("tarcat: warning: ") and "changed on the server since it was cached" in line
        third = subprocess.run([ix.scripts.tarcat, "-q", "--cache", str(cache), url], capture_output=True)
        assert third.stdout == (data / "train-0.tar").read_bytes() and warnings(third.stderr.decode()) == []
