"""The fault-injecting test servers of tests/faultserver.py, checked with urllib and http.client."""

from __future__ import annotations

import http.client
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from faultserver import CuttingProxy, FaultServer

SIZE = 1 << 20


@pytest.fixture
def data(tmp_path: Path) -> bytes:
    blob = os.urandom(SIZE)
    (tmp_path / "a.tar").write_bytes(blob)
    return blob


@pytest.fixture
def server(tmp_path: Path, data: bytes) -> Iterator[FaultServer]:
    with FaultServer(tmp_path) as fs:
        yield fs


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10) as r:
        return r.status, dict(r.headers), r.read()


def port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def test_whole_file_and_headers(server: FaultServer, data: bytes) -> None:
    status, headers, body = get(server.url + "/a.tar")
    assert status == 200 and body == data
    assert headers["Content-Length"] == str(SIZE) and headers["Accept-Ranges"] == "bytes"
    assert headers["Content-Type"] == "application/x-tar"
    assert headers["ETag"].startswith(f'"{SIZE:x}-') and headers["Last-Modified"].endswith("GMT")
    with pytest.raises(urllib.error.HTTPError) as e:
        get(server.url + "/missing.tar")
    assert e.value.code == 404


def test_ranges_and_keep_alive(server: FaultServer, data: bytes) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port(server.url), timeout=10)
    conn.request("GET", "/a.tar", headers={"Range": "bytes=100-199"})
    r = conn.getresponse()
    assert r.status == 206 and r.read() == data[100:200]
    assert r.headers["Content-Range"] == f"bytes 100-199/{SIZE}" and r.headers["Content-Length"] == "100"
    conn.request("GET", "/a.tar", headers={"Range": f"bytes={SIZE - 10}-"})  # same connection
    r = conn.getresponse()
    assert r.status == 206 and r.read() == data[-10:]
    conn.request("GET", "/a.tar", headers={"Range": f"bytes={SIZE}-"})
    r = conn.getresponse()
    r.read()
    assert r.status == 416 and r.headers["Content-Range"] == f"bytes */{SIZE}"
    conn.request("HEAD", "/a.tar")
    r = conn.getresponse()
    assert r.status == 200 and r.read() == b"" and r.headers["Content-Length"] == str(SIZE)
    conn.close()
    assert [(q.method, q.range, q.status, q.sent) for q in server.requests] == [
        ("GET", "bytes=100-199", 206, 100),
        ("GET", f"bytes={SIZE - 10}-", 206, 10),
        ("GET", f"bytes={SIZE}-", 416, len(b"range not satisfiable\n")),
        ("HEAD", None, 200, 0),
    ]
    assert len(server.gets("/a.tar")) == 3 and server.gets("/b.tar") == []


def test_ignore_range(server: FaultServer, data: bytes) -> None:
    server.ignore_range = True
    status, headers, body = get(server.url + "/a.tar", {"Range": "bytes=0-9"})
    assert status == 200 and body == data and "Accept-Ranges" not in headers


def test_cut(server: FaultServer, data: bytes) -> None:
    server.cut("/a.tar", after=1000)
    conn = http.client.HTTPConnection("127.0.0.1", port(server.url), timeout=10)
    conn.request("GET", "/a.tar")
    r = conn.getresponse()
    assert r.status == 200 and r.headers["Content-Length"] == str(SIZE)
    with pytest.raises((http.client.IncompleteRead, ConnectionResetError)):
        r.read()
    conn.close()
    assert get(server.url + "/a.tar")[2] == data  # only once
    assert [(q.status, q.sent) for q in server.gets()] == [(200, 1000), (200, SIZE)]


def test_fail_then_succeed(server: FaultServer, data: bytes) -> None:
    server.fail("*", 503, retry_after=1)
    with pytest.raises(urllib.error.HTTPError) as e:
        get(server.url + "/a.tar")
    assert e.value.code == 503 and e.value.headers["Retry-After"] == "1"
    assert get(server.url + "/a.tar")[2] == data
    assert [q.status for q in server.gets()] == [503, 200]


def test_stall_and_clear(server: FaultServer, data: bytes) -> None:
    server.stall("/a.tar", after=5000, seconds=0.5)
    t = time.monotonic()
    assert get(server.url + "/a.tar")[2] == data
    assert time.monotonic() - t >= 0.45
    server.cut("/a.tar", after=0)
    server.clear()
    assert get(server.url + "/a.tar")[2] == data


def test_cutting_proxy(server: FaultServer, data: bytes) -> None:
    with CuttingProxy(server.url, cut_after=50_000) as proxy:
        conn = http.client.HTTPConnection("127.0.0.1", port(proxy.url), timeout=10)
        conn.request("GET", "/a.tar")
        r = conn.getresponse()
        assert r.status == 200
        got = b""
        with pytest.raises((http.client.IncompleteRead, ConnectionResetError)):
            while chunk := r.read1(1 << 16):
                got += chunk
            r.read()
        conn.close()
        assert len(got) < 50_000 and got == data[: len(got)]
        assert get(proxy.url + "/a.tar")[2] == data
        assert (proxy.cuts, proxy.connections) == (1, 2)
