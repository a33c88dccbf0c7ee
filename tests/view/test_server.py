"""The viewer's server (tarproc.view.server) over real HTTP on 127.0.0.1: pages, key jumps,
filters, every field, media by byte range, and everything it must refuse."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tarproc import TarWriter
from tarproc.index import build_index
from tarproc.view.catalog import parse_filter
from tarproc.view.media import parse_range
from tarproc.view.page import CSS, HTML, JS


def keys(page: dict[str, Any]) -> list[str]:
    return [s["key"] for s in page["samples"]]


def filtered(viewer: Any, text: str, n: int = 200) -> list[str]:
    """Every key that passes a filter: a filtered scan answers in pieces of at most ~3 s (on a busy
    machine, before the end), saying where to go on; follow it as the page does."""
    found: list[str] = []
    start = 0
    while True:
        page = viewer.json(f"/api/page?n={n}&start={start}&filter=" + quote(text))
        assert page["filter"] == text
        found += keys(page)
        if page["next"] is None or len(found) >= n:
            return found
        start = page["next"]


def all_keys() -> list[str]:
    return [f"s{shard}/{i:04d}" for shard in range(2) for i in range(30)]


# -------------------------------------------------------------------------------------------
# pages, keys, filters


def test_pages_run_across_shards(dataset, viewer):
    module_viewer = viewer(dataset.urls)
    page = module_viewer.json("/api/page?start=0&n=10")
    assert keys(page) == all_keys()[:10]
    # no .idx: the second shard is indexed when a page reaches it, not before
    assert (page["next"], page["total"], page["complete"], page["shards"], page["problems"]) == (10, 30, False, 2, [])
    assert [s["index"] for s in page["samples"]] == list(range(10))
    page = module_viewer.json("/api/page?start=25&n=10")
    assert keys(page) == all_keys()[25:35] and page["next"] == 35
    assert [(s["shard"], s["pos"]) for s in page["samples"][4:6]] == [(0, 29), (1, 0)]
    page = module_viewer.json("/api/page?start=55&n=10")
    assert keys(page) == all_keys()[55:] and page["next"] is None
    assert (page["total"], page["complete"]) == (60, True)
    page = module_viewer.json("/api/page?start=60")
    assert page["samples"] == [] and page["next"] is None
    assert len(module_viewer.json("/api/page")["samples"]) == 50  # the default page


def test_index_files_are_loaded_in_the_background(tmp_path, dataset, viewer):
    urls = []
    for url in dataset.urls:
        copy = tmp_path / Path(url).name
        copy.write_bytes(Path(url).read_bytes())
        (tmp_path / f"{copy.name}.idx").write_text(build_index(str(copy)).jsonl_text())
        urls.append(str(copy))
    v = viewer(urls)
    deadline = time.monotonic() + 30
    while (page := v.json("/api/page?n=1"))["complete"] is False and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (page["total"], page["complete"]) == (60, True)  # the total is known without paging there


def test_page_previews_each_field(module_viewer, dataset):
    page = module_viewer.json("/api/page?start=30&n=6")
    first = page["samples"][0]
    assert first["key"] == "s1/0000" and first["shard_name"] == "shard-0001.tar"
    fields = {f["name"]: f for f in first["fields"]}
    expected = dataset.expected["s1/0000"]
    assert set(fields) == set(expected) - {"__key__"}
    assert fields["txt"]["text"] == "caption 30" and fields["cls"]["text"] == "0"
    assert json.loads(fields["json"]["text"]) == json.loads(expected["json"])
    for name, kind, mime in (("jpg", "image", "image/jpeg"), ("wav", "audio", "audio/wav")):
        assert (fields[name]["kind"], fields[name]["type"]) == (kind, mime)
        assert "text" not in fields[name]  # media are not read for a page: the browser asks for them
        assert fields[name]["url"] == f"/media/1/0/{name}"
        assert fields[name]["size"] == len(expected[name])
    assert [("wav" in {f["name"] for f in s["fields"]}) for s in page["samples"]] == [True] + [False] * 4 + [True]


def test_sample_shows_every_field(module_viewer, dataset):
    sample = module_viewer.json("/api/sample/1/7")
    assert (sample["key"], sample["index"], sample["shard"], sample["pos"]) == ("s1/0007", 37, 1, 7)
    expected = dataset.expected["s1/0007"]
    fields = {f["name"]: f for f in sample["fields"]}
    assert set(fields) == {"cls", "jpg", "json", "txt"}
    assert json.loads(fields["json"]["text"]) == json.loads(expected["json"])
    assert "\n  " in fields["json"]["text"]  # pretty-printed
    for name, f in fields.items():
        status, headers, body = module_viewer.request(f["url"])
        assert status == 200 and body == expected[name]


def test_key_jump(module_viewer):
    assert module_viewer.json("/api/find?key=s1/0007")["matches"] == [{"shard": 1, "pos": 7, "index": 37}]
    assert module_viewer.json("/api/find?key=" + quote("s0/0000"))["matches"] == [{"shard": 0, "pos": 0, "index": 0}]
    assert module_viewer.json("/api/find?key=nope")["matches"] == []
    assert module_viewer.request("/api/find")[0] == 400
    assert module_viewer.request("/api/find?key=" + "x" * 5000)[0] == 400


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cls=3", [k for k in all_keys() if int(k[-4:]) % 5 == 3]),
        ("cls!=0", [k for k in all_keys() if int(k[-4:]) % 5 != 0]),
        ("json.meta.lang=en", [k for k in all_keys() if int(k[-4:]) % 3 == 0]),
        ("cls=0 & json.meta.lang=en", [k for k in all_keys() if int(k[-4:]) % 15 == 0]),
        ("json.n=42", ["s1/0012"]),
        ("txt~CAPTION 4", ["s0/0004"] + [f"s1/{i:04d}" for i in range(10, 20)]),  # captions 4 and 40-49
        ("wav", [k for k in all_keys() if int(k[-4:]) % 5 == 0]),
        ("__key__~s1/002", [f"s1/002{i}" for i in range(10)]),
        ("json.meta.missing=en", []),
    ],
)
def test_filters(module_viewer, text, expected):
    assert filtered(module_viewer, text) == expected


def test_filtered_pages_go_on_where_they_stopped(module_viewer):
    wanted = [k for k in all_keys() if int(k[-4:]) % 5 == 3]
    page = module_viewer.json("/api/page?n=4&filter=cls%3D3")
    assert keys(page) == wanted[:4]
    assert page["next"] == 19  # just after the 4th match (s0/0018)
    page = module_viewer.json(f"/api/page?n=4&filter=cls%3D3&start={page['next']}")
    assert keys(page) == wanted[4:8]


def test_bad_filters_are_4xx(module_viewer):
    for text in ("=3", "!=x", " & "):
        status, _, body = module_viewer.request("/api/page?filter=" + quote(text))
        assert status == 400 and b"filter" in body and b"Traceback" not in body
    assert module_viewer.request("/api/page?filter=" + "a" * 2000)[0] == 400


def test_parse_filter():
    conditions = [tuple(c) for c in parse_filter("a.b = x y & c~Z & d")]
    assert conditions == [("a.b", "=", "x y"), ("c", "~", "Z"), ("d", "has", "")]


# -------------------------------------------------------------------------------------------
# media by byte range


def test_media_whole_and_by_range(module_viewer, dataset):
    wav = dataset.expected["s0/0005"]["wav"]
    size = len(wav)
    url = "/media/0/5/wav"
    status, headers, body = module_viewer.request(url)
    assert (status, headers["content-type"], headers["accept-ranges"], body) == (200, "audio/wav", "bytes", wav)
    assert int(headers["content-length"]) == size
    for header, (a, b) in {
        "bytes=0-9": (0, 10),
        "bytes=100-": (100, size),
        "bytes=-20": (size - 20, size),
        f"bytes={size - 5}-{size + 1000}": (size - 5, size),
        "bytes=4000-4000": (4000, 4001),
        f"bytes=-{size * 3}": (0, size),
    }.items():
        status, headers, body = module_viewer.request(url, {"Range": header})
        assert status == 206, header
        assert body == wav[a:b], header
        assert headers["content-range"] == f"bytes {a}-{b - 1}/{size}"
        assert int(headers["content-length"]) == b - a
    for header in (f"bytes={size}-", f"bytes={size + 10}-{size + 20}", "bytes=-0"):
        status, headers, body = module_viewer.request(url, {"Range": header})
        assert status == 416, header
        assert headers["content-range"] == f"bytes */{size}"
        assert wav[:4] not in body
    for header in ("bytes=0-1,5-9", "bytes=abc", "items=0-5", "bytes=9-3", "bytes=--1", "bytes=" + "9" * 30 + "-"):
        status, headers, body = module_viewer.request(url, {"Range": header})
        assert (status, body) == (200, wav), header  # ignored, as RFC 9110 says: the whole field
    status, headers, body = module_viewer.request(url, {"Range": "bytes=0-9", "If-Range": '"x"'})
    assert (status, body) == (200, wav)
    status, headers, body = module_viewer.request(url, method="HEAD")
    assert (status, body, int(headers["content-length"])) == (200, b"", size)


def test_media_types_and_policies(module_viewer, dataset):
    expected = dataset.expected["s0/0000"]
    for field, mime in (("jpg", "image/jpeg"), ("json", "application/json"), ("cls", "text/plain"),
                        ("txt", "text/plain"), ("wav", "audio/wav")):
        status, headers, body = module_viewer.request(f"/media/0/0/{field}")
        assert status == 200 and body == expected[field]
        assert headers["content-type"].split(";")[0] == mime
        assert headers["x-content-type-options"] == "nosniff"
        assert headers["content-security-policy"].startswith("sandbox")  # an SVG/HTML field runs no script


def test_unknown_extensions_are_sniffed_or_downloads(tmp_path, viewer):
    path = tmp_path / "odd.tar"
    png = _png()
    with open(path, "wb") as f, TarWriter(f) as w:
        w.write_sample({"__key__": "a", "pic": png, "npy": b"\x93NUMPY" + bytes(200), "svg": b"<svg onload='x()'/>",
                        "seg.png": png, "html": b"<script>alert(1)</script>"})
    v = viewer([str(path)])
    fields = {f["name"]: f for f in v.json("/api/sample/0/0")["fields"]}
    assert (fields["pic"]["kind"], fields["pic"]["type"]) == ("image", "image/png")  # by its bytes
    assert (fields["seg.png"]["kind"], fields["npy"]["kind"], fields["html"]["kind"]) == ("image", "binary", "text")
    assert fields["html"]["text"] == "<script>alert(1)</script>"  # data, shown as text by the page
    status, headers, body = v.request("/media/0/0/npy")
    assert headers["content-type"] == "application/octet-stream" and headers["content-disposition"] == "attachment"
    status, headers, body = v.request("/media/0/0/html")
    assert headers["content-type"].startswith("text/plain")  # never rendered as a page of ours
    status, headers, body = v.request("/media/0/0/" + quote("seg.png"))
    assert status == 200 and body == png and headers["content-type"] == "image/png"


def _png() -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (5, 4), (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


def test_parse_range_doctests_hold():
    assert parse_range(None, 10) is None
    assert parse_range("bytes=0-0", 1) == (0, 1)


# -------------------------------------------------------------------------------------------
# what it refuses


def _traversals(secret: Path) -> list[str]:
    absolute = str(secret)
    return [
        "/media/0/0/../../../secret.txt",
        "/media/0/0/..%2F..%2F..%2Fsecret.txt",
        "/media/0/0/%2e%2e%2f%2e%2e%2fsecret.txt",
        "/media/0/0/%2E%2E",
        "/media/0/%2e%2e/jpg",
        "/media/0/0/..",
        "/media/0/0/..%5csecret.txt",
        "/media/0/0/..\\..\\secret.txt",
        "/static/../../secret.txt",
        "/static/%2e%2e/%2e%2e/secret.txt",
        "/../../../../" + absolute.lstrip("/"),
        "/" + absolute,
        "//" + absolute.lstrip("/"),
        "/media/0/0/" + quote(absolute, safe=""),
        "/media/0/0/" + quote("file://" + absolute, safe=""),
        "/media/0/0/jpg%00",
        "/media/0/0/jpg/../../secret.txt",
        "/api/sample/0/0/../../../secret.txt",
        "/" + absolute + "%00",
        "/media/0/0/__key__",
        "/media/0/0/__url__",
        "/media/0/0/" + "x" * 300,
        "/media/2/0/jpg",
        "/media/0/30/jpg",
        "/media/0/-1/jpg",
        "/media/-1/0/jpg",
        "/media/99999999999999999999999999/0/jpg",
        "/media/0/99999999999999999999999999/jpg",
        "/media/999999999999/0/jpg",
        "/media/0/999999999999/jpg",
        "/media/0x1/0/jpg",
        "/media/%D9%A3/0/jpg",  # an Arabic-Indic digit 3
        "/api/sample/0/1e3",
        "/api/sample/2/0",
        "/api/page?start=-1",
        "/api/page?start=1e3",
        "/api/page?start=" + "9" * 40,
        "/api/page?n=0",
        "/api/page?n=100000",
        "/api/page?n=abc",
        "/api/page?start=%D9%A3",
        "/nothing-here",
        "/static/",
        "/static/secret.txt",
    ]


def test_traversal_and_bad_numbers_get_4xx_and_nothing(module_viewer, dataset):
    for path in _traversals(dataset.secret):
        status, headers, body = module_viewer.request(path)
        assert 400 <= status < 500, (path, status, body)
        assert b"TOP-SECRET" not in body, path
        assert b"Traceback" not in body and b'File "' not in body, path
        assert len(body) < 300, path  # a short message
    assert module_viewer.log == []  # none of them was an error of the server's


def test_read_only(module_viewer):
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, _, body = module_viewer.request("/media/0/0/jpg", method=method)
        assert status == 405 and b"Traceback" not in body
    assert module_viewer.request("/media/0/0/jpg")[0] == 200  # and nothing changed


def test_host_must_be_loopback(module_viewer):
    port = module_viewer.port
    for host in ("evil.example", f"evil.example:{port}", "192.168.1.5", "127.0.0.1.evil.example", ""):
        status, _, body = module_viewer.request("/api/page", {"Host": host})
        assert status == 403, host
        assert b"samples" not in body
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", "127.0.0.2", "LOCALHOST"):
        assert module_viewer.request("/api/page?n=1", {"Host": host})[0] == 200, host


def test_any_host_when_allowed(dataset, viewer):
    v = viewer(dataset.urls, allowed_hosts=None)
    assert v.request("/api/page?n=1", {"Host": "box.lan:8000"})[0] == 200


def test_page_loads_nothing_from_other_hosts(module_viewer):
    status, headers, body = module_viewer.request("/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    policy = headers["content-security-policy"]
    assert "default-src 'none'" in policy and "script-src 'self'" in policy and "connect-src 'self'" in policy
    for text in (HTML, CSS, JS):
        assert not re.search(r"(https?:)?//[a-z0-9]", text, re.IGNORECASE)  # no URL of another host
        assert "innerHTML" not in text and "eval(" not in text  # data only ever as text
    for path, mime in (("/static/viewer.js", "text/javascript"), ("/static/viewer.css", "text/css")):
        status, headers, body = module_viewer.request(path)
        assert status == 200 and headers["content-type"].startswith(mime)
    assert module_viewer.request("/favicon.ico")[0] == 204


# -------------------------------------------------------------------------------------------
# shards that can't be read


def test_broken_shards_are_named_not_fatal(tmp_path, dataset, viewer):
    missing = str(tmp_path / "gone.tar")
    damaged = tmp_path / "damaged.tar"
    damaged.write_bytes(Path(dataset.urls[0]).read_bytes()[:5000])
    compressed = tmp_path / "c.tar.gz"
    import gzip

    compressed.write_bytes(gzip.compress(Path(dataset.urls[1]).read_bytes()))
    v = viewer([missing, str(damaged), str(compressed), dataset.urls[1]], warm=False)
    page = v.json("/api/page?n=100")
    assert keys(page) == all_keys()[30:]
    problems = "\n".join(page["problems"])
    assert "gone.tar" in problems and "damaged.tar" in problems and "decompress" in problems
    assert page["samples"][0]["shard"] == 3
    for path in ("/api/sample/0/0", "/media/1/0/jpg", "/media/2/0/jpg"):
        status, _, body = v.request(path)
        assert status == 502, path
        assert body.count(b"\n") == 1 and b"Traceback" not in body


def test_a_shard_gone_after_start_is_a_502(tmp_path, dataset, viewer):
    path = tmp_path / "s.tar"
    path.write_bytes(Path(dataset.urls[0]).read_bytes())
    v = viewer([str(path)], warm=False)
    assert len(v.json("/api/page?n=5")["samples"]) == 5  # indexed
    path.unlink()
    status, _, body = v.request("/media/0/3/jpg")
    assert status == 502 and b"s.tar: cannot open: No such file" in body
    assert v.log == [f"tarshow: error: {path}: cannot open: No such file or directory"]


def test_a_shard_changed_under_its_index_is_an_error_not_wrong_bytes(tmp_path, viewer):
    path = tmp_path / "s.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        w.write_sample({"__key__": "a", "bin": b"A" * 100})
        w.write_sample({"__key__": "b", "bin": b"B" * 100})
    (tmp_path / "s.tar.idx").write_text(build_index(str(path)).jsonl_text())
    with open(path, "wb") as f, TarWriter(f) as w:  # the same size, other members
        w.write_sample({"__key__": "a", "bin": b"X" * 300})
        w.write_sample({"__key__": "b", "bin": b"Y" * 300})
    v = viewer([str(path)])
    status, _, body = v.request("/media/0/1/bin")
    assert status == 502 and b"doesn't match" in body and b"Y" * 20 not in body
    status, _, body = v.request("/api/sample/0/1")
    assert status == 502 and b"doesn't match" in body
    assert len(v.log) == 2 and all(line.startswith("tarshow: error: ") for line in v.log)


def test_index_beside_the_shard_is_used(tmp_path, viewer):
    path = tmp_path / "s.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        for i in range(5):
            w.write_sample({"__key__": f"k{i}", "txt": f"t{i}".encode()})
    (tmp_path / "s.tar.idx").write_text(build_index(str(path)).jsonl_text())
    v = viewer([str(path)], warm=False)
    assert keys(v.json("/api/page")) == ["k0", "k1", "k2", "k3", "k4"]
    from tarproc.view.server import CATALOG

    shard = v.app[CATALOG].shard(0)
    assert shard is not None and shard.index_url == str(path) + ".idx"


# -------------------------------------------------------------------------------------------
# remote shards, read by range


@pytest.mark.parametrize("with_index", [True, False])
def test_remote_shards_by_range(dataset, range_server, viewer, with_index):
    server, root, base = range_server
    for url in dataset.urls:
        name = Path(url).name
        (root / name).write_bytes(Path(url).read_bytes())
        if with_index:
            (root / f"{name}.idx").write_text(build_index(url).jsonl_text())
    v = viewer([f"{base}/{Path(u).name}" for u in dataset.urls], warm=False)
    page = v.json("/api/page?start=28&n=4")
    assert keys(page) == ["s0/0028", "s0/0029", "s1/0000", "s1/0001"]
    assert page["samples"][2]["fields"][0]["text"] == "0"
    assert filtered(v, "json.meta.lang=en & cls=0") == [k for k in all_keys() if int(k[-4:]) % 15 == 0]
    wav = dataset.expected["s1/0005"]["wav"]
    server.log.clear()
    status, headers, body = v.request("/media/1/5/wav", {"Range": "bytes=44-143"})
    assert (status, body, headers["content-range"]) == (206, wav[44:144], f"bytes 44-143/{len(wav)}")
    shard_gets = [rng for path, rng in server.log if path == "/shard-0001.tar"]
    assert shard_gets and all(rng and rng.startswith("bytes=") for rng in shard_gets)  # never the whole shard
    assert v.json("/api/find?key=s1/0029")["matches"] == [{"shard": 1, "pos": 29, "index": 59}]
    if with_index:
        assert all(rng for path, rng in server.log if path.endswith(".tar"))


# -------------------------------------------------------------------------------------------
# serve(): the process, its line on stderr, Ctrl-C and SIGTERM


def _start_server(args: list[str], tmp_path: Path, script: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    if script is not None:
        cmd = [sys.executable, "-c", script, *args]
    else:
        cmd = [str(Path(sys.executable).parent / "tarshow"), "--serve", "--port", "0", *args]
    err = open(tmp_path / "stderr.txt", "wb")  # noqa: SIM115 -- read while the process runs
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        text = (tmp_path / "stderr.txt").read_text()
        found = re.search(r"serving \d+ shards? on (http://127\.0\.0\.1:(\d+)/) \(Ctrl-C to stop\)", text)
        if found:
            return proc, found.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the server did not start: {(tmp_path / 'stderr.txt').read_text()}")


def _get(url: str) -> bytes:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as response:
        return response.read()


@pytest.mark.parametrize(("signum", "status", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                        (signal.SIGTERM, 143, "terminated")])
def test_server_process_stops_cleanly(dataset, tmp_path, signum, status, word):
    proc, url = _start_server(dataset.urls, tmp_path)
    try:
        assert b"<title>tarshow</title>" in _get(url)
        assert json.loads(_get(url + "api/page?n=3"))["samples"][2]["key"] == "s0/0002"
        proc.send_signal(signum)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == status, stderr
    assert f"tarshow: {word}" in stderr
    assert "Traceback" not in stderr
    assert proc.stdout is not None and proc.stdout.read() == b""  # data only on stdout: none here


def test_stop_does_not_wait_for_a_stalled_download(dataset, tmp_path):
    import socket

    big = tmp_path / "big.tar"
    with open(big, "wb") as f, TarWriter(f) as w:
        w.write_sample({"__key__": "big", "bin": bytes(32 << 20)})
    proc, url = _start_server([str(big), dataset.urls[0]], tmp_path)
    try:
        port = int(url.rsplit(":", 1)[1].strip("/"))
        with socket.create_connection(("127.0.0.1", port), timeout=30) as stalled:
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.sendall(b"GET /media/0/0/bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert stalled.recv(64).startswith(b"HTTP/1.1 200")  # and then read no more
            time.sleep(0.5)  # the scenario: the server's send is stuck on the full socket
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=30)  # a server that waited for the stalled client for ever: TimeoutExpired
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in (tmp_path / "stderr.txt").read_text()


def test_serve_returns_on_sigterm_without_a_handler(dataset, tmp_path):
    script = "import sys\nfrom tarproc.view.server import serve\nserve(sys.argv[1:], port=0)\nprint('returned')\n"
    proc, url = _start_server(dataset.urls, tmp_path, script=script)
    try:
        _get(url)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert (proc.returncode, out) == (0, b"returned\n")


def test_serve_refuses_what_it_cannot_serve(tmp_path, capsys):
    from tarproc.errors import OptionError, SourceError, TransportError
    from tarproc.view.server import serve

    with pytest.raises(SourceError, match="no such file"):
        serve([str(tmp_path / "none.tar")], port=0)
    with pytest.raises(OptionError, match="stdin or pipe"):
        serve(["-"], port=0)
    with pytest.raises(OptionError, match="port"):
        serve([str(tmp_path)], port=70000)
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        shard = tmp_path / "s.tar"
        shard.write_bytes(bytes(10240))
        with pytest.raises(TransportError, match="cannot listen on 127.0.0.1"):
            serve([str(shard)], port=busy.getsockname()[1])


def test_serve_warns_off_loopback(dataset, capsys):
    from tarproc.errors import TransportError
    from tarproc.view.server import serve

    # 192.0.2.1 (TEST-NET-1) is no address of this machine: the warning comes, then the bind fails,
    # so that the test never listens anywhere but on 127.0.0.1
    with pytest.raises(TransportError, match="cannot listen on 192.0.2.1"):
        serve(dataset.urls, host="192.0.2.1", port=0)
    assert "tarshow: warning: serving on 192.0.2.1, not on a loopback address" in capsys.readouterr().err


# -------------------------------------------------------------------------------------------
# shards on S3 (a moto server on 127.0.0.1)


@pytest.fixture(scope="module")
def moto_endpoint():  # type: ignore[no-untyped-def]
    try:
        import boto3  # noqa: F401
        import s3fs  # noqa: F401
        from moto.server import ThreadedMotoServer
    except ImportError as e:
        pytest.skip(f"moto server / boto3 / s3fs not importable: {e}")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    try:
        server.start()
    except Exception as e:  # pragma: no cover - depends on the machine
        pytest.skip(f"moto server could not start on 127.0.0.1: {type(e).__name__}: {e}")
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def test_s3_shards_by_range(dataset, moto_endpoint, viewer, tmp_path, monkeypatch):
    import boto3
    import fsspec.config

    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": str(tmp_path / "aws-config"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-creds"),
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setitem(fsspec.config.conf, "s3", {"endpoint_url": moto_endpoint})
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="viewer")
    client.upload_file(dataset.urls[0], "viewer", "a/shard-0000.tar")
    index = tmp_path / "shard-0000.tar.idx"
    index.write_text(build_index(dataset.urls[0]).jsonl_text())
    client.upload_file(str(index), "viewer", "a/shard-0000.tar.idx")
    v = viewer(["s3://viewer/a/shard-0000.tar", dataset.urls[1]])
    page = v.json("/api/page?start=27&n=6")
    assert keys(page) == all_keys()[27:33]
    assert page["samples"][0]["shard_name"] == "shard-0000.tar"
    jpg = dataset.expected["s0/0010"]["jpg"]
    status, headers, body = v.request("/media/0/10/jpg")
    assert (status, body, headers["content-type"]) == (200, jpg, "image/jpeg")
    status, headers, body = v.request("/media/0/10/jpg", {"Range": "bytes=100-199"})
    assert (status, body) == (206, jpg[100:200])
    assert filtered(v, "cls=4") == [k for k in all_keys() if int(k[-4:]) % 5 == 4]


def test_names_that_are_not_utf8(tmp_path, viewer):
    # a key and a field read from the tar as bytes that are not UTF-8 (surrogate-escaped): the page
    # that holds them answers, and the field's URL (bytes percent-encoded) serves that field
    key, field = "caf\udce9", "t\udcffxt"
    path = tmp_path / "latin1.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        w.write_sample({"__key__": "before", "txt": b"first"})
        w.write_sample({"__key__": key, field: b"hello", "json": b'{"a": "\\ud800"}'})
    v = viewer([str(path)])
    page = v.json("/api/page?n=10")
    assert [s["key"] for s in page["samples"]] == ["before", key]
    fields = {f["name"]: f for f in page["samples"][1]["fields"]}
    assert fields[field]["url"] == "/media/0/1/t%FFxt"
    status, headers, body = v.request(fields[field]["url"])
    assert status == 200 and body == b"hello"
    assert v.json("/api/sample/0/1")["key"] == key
    assert v.json("/api/find?key=caf%E9")["matches"] == [{"shard": 0, "pos": 1, "index": 1}]
    assert v.log == []


def test_text_that_starts_like_an_image_is_shown_as_text(tmp_path, viewer):
    path = tmp_path / "bm.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        w.write_sample({"__key__": "a", "desc": b"BMW makes cars", "pic": b"BM" + bytes(60)})
    v = viewer([str(path)])
    fields = {f["name"]: f for f in v.json("/api/sample/0/0")["fields"]}
    assert (fields["desc"]["kind"], fields["desc"]["text"]) == ("text", "BMW makes cars")
    assert fields["pic"]["kind"] == "image"


def test_json_nested_too_deep_is_text_and_filters_pass_it_by(tmp_path, viewer):
    deep = b"[" * 100_000 + b"]" * 100_000
    path = tmp_path / "deep.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        w.write_sample({"__key__": "a", "json": deep})
        w.write_sample({"__key__": "b", "json": b'{"x": 1}'})
    v = viewer([str(path)])
    assert len(v.json("/api/page")["samples"]) == 2
    fields = {f["name"]: f for f in v.json("/api/sample/0/0")["fields"]}
    assert fields["json"]["text"][:3] == "[[[" and len(fields["json"]["text"]) == len(deep)
    assert filtered(v, "json.x=1") == ["b"]
    assert v.log == []
