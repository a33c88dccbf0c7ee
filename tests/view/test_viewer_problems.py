"""The viewer's server (tarproc.view.server) on what goes wrong in a dataset: broken images marked
and listed with their ``tarfirst`` command, class names on labels, a filter on a field no sample
has, and its fuzz findings (a rewritten shard under an old index, clients that don't read, field
names with dots and backslashes). Real HTTP on 127.0.0.1 (the ``viewer`` fixture, conftest.py)."""

from __future__ import annotations

import io
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from tarhelpers import wait_for

from tarproc import TarWriter
from tarproc.index import build_index
from tarproc.view.server import CATALOG, STATE, FieldProblems


def jpeg(color: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (48, 32), color).save(buf, format="JPEG")
    return buf.getvalue()


def png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (5, 4), (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


def without_frame_header(data: bytes) -> bytes:
    """A JPEG with its start-of-frame segment cut out: it ends well, but no header says its size."""
    at = data.find(b"\xff\xc0")
    length = int.from_bytes(data[at + 2 : at + 4], "big")
    return data[:at] + data[at + 2 + length :]


def write(path: Path, samples: list[dict[str, Any]], index: bool = False) -> str:
    with open(path, "wb") as f, TarWriter(f) as w:
        for sample in samples:
            w.write_sample(sample)
    if index:
        Path(f"{path}.idx").write_text(build_index(str(path)).jsonl_text())
    return str(path)


def fields_of(sample: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in sample["fields"]}


HOSTILE_KEY = "<script>window.__pwned=1</script>"


def broken_samples() -> list[dict[str, Any]]:
    good = jpeg()
    return [
        {"__key__": "good", "jpg": good, "cls": b"1"},
        {"__key__": "cut", "jpg": good[:-40], "cls": b"2"},
        {"__key__": "noiend", "png": png()[:-12]},
        {"__key__": "text", "jpg": b"this is no image at all"},
        {"__key__": "headless", "jpg": without_frame_header(good)},
        {"__key__": HOSTILE_KEY, "jpg": good[:-40]},
    ]


# -------------------------------------------------------------------------------------------
# broken images


def test_broken_images_carry_their_problem(tmp_path, viewer):
    url = write(tmp_path / "broken.tar", broken_samples())
    v = viewer([url])
    page = v.json("/api/page?n=10")
    problems = {s["key"]: {f["name"]: f["problem"] for f in s["fields"]} for s in page["samples"]}
    assert problems["good"] == {"jpg": None, "cls": None}
    assert problems["cut"]["jpg"] == "cut short: no end-of-image marker after the scan"
    assert problems["noiend"]["png"] == "cut short: no IEND chunk at the end"
    assert problems["text"]["jpg"] == "not an image (the data looks like text)"
    assert problems["headless"]["jpg"].startswith("header unreadable: ")
    assert problems[HOSTILE_KEY]["jpg"].startswith("cut short")
    # and each is listed, the latest last, with the command that pulls it out and where it is
    listed = page["field_problems"]
    assert [(p["key"], p["field"]) for p in listed] == [
        ("cut", "jpg"), ("noiend", "png"), ("text", "jpg"), ("headless", "jpg"), (HOSTILE_KEY, "jpg")]
    cut = listed[0]
    assert (cut["shard"], cut["pos"], cut["index"]) == (0, 1, 1)
    assert cut["command"] == f"tarfirst {url} --key cut -f jpg"
    assert listed[-1]["command"] == f"tarfirst {url} --key '{HOSTILE_KEY}' -f jpg"  # shell-quoted
    # the sample's own page says the same
    assert fields_of(v.json("/api/sample/0/2"))["png"]["problem"] == "cut short: no IEND chunk at the end"
    assert v.log == []


def test_only_the_fields_shown_are_checked(tmp_path, viewer):
    v = viewer([write(tmp_path / "broken.tar", broken_samples())])
    page = v.json("/api/page?n=2")
    assert [(p["key"], p["field"]) for p in page["field_problems"]] == [("cut", "jpg")]
    shard = v.app[CATALOG].shard(0)
    # one read for each sample shown (and the 8 bytes that say the shard is not compressed)
    shown = sum(512 + 512 + 512 + -(-len(s["jpg"]) // 512) * 512 for s in broken_samples()[:2])  # cls, jpg
    assert shard is not None and (shard.reads, shard.bytes_read) == (3, 8 + shown)
    page = v.json("/api/page?start=2&n=2")  # the next page adds its own
    assert [(p["key"], p["field"]) for p in page["field_problems"]] == [("cut", "jpg"), ("noiend", "png"), ("text", "jpg")]


def test_the_list_of_problems_is_bounded():
    class Catalog:
        urls = ["x.tar"]

    found = FieldProblems(limit=3)
    for i in range(5):
        found.add(Catalog(), {"shard": 0, "pos": i, "index": i, "key": f"k{i}",  # type: ignore[arg-type]
                              "fields": [{"name": "jpg", "problem": "cut short"}, {"name": "cls", "problem": None}]})
    assert [p["key"] for p in found.latest()] == ["k2", "k3", "k4"]
    found.add(Catalog(), {"shard": 0, "pos": 2, "index": 2, "key": "k2",  # type: ignore[arg-type]
                          "fields": [{"name": "jpg", "problem": "cut short"}]})
    assert [p["key"] for p in found.latest()] == ["k3", "k4", "k2"]  # found again: the latest


# -------------------------------------------------------------------------------------------
# class names


def test_labels_show_class_names(tmp_path, viewer):
    folder = tmp_path / "data"
    folder.mkdir()
    url = write(folder / "s.tar", [{"__key__": "a", "cls": b"1", "jpg": jpeg()},
                                   {"__key__": "b", "cls": b"7", "label": b"0"}])
    (folder / "classes.txt").write_text("cat\ndog\n")
    page = viewer([url]).json("/api/page")
    a, b = (fields_of(s) for s in page["samples"])
    assert (a["cls"]["text"], a["cls"]["label"]) == ("1", "1 (dog)")  # classes.txt beside the shard
    assert "label" not in b["cls"] and b["label"]["label"] == "0 (cat)"  # 7 has no name
    assert fields_of(viewer([url]).json("/api/sample/0/0"))["cls"]["label"] == "1 (dog)"
    named = viewer([url], classes=["zero", "one"]).json("/api/page")  # given: those, not the file's
    assert fields_of(named["samples"][0])["cls"]["label"] == "1 (one)"
    (folder / "classes.txt").unlink()
    assert "label" not in fields_of(viewer([url]).json("/api/page")["samples"][0])["cls"]


def test_serve_takes_classes(dataset):
    import inspect

    from tarproc.view.server import make_app, serve

    assert inspect.signature(serve).parameters["classes"].default is None
    app = make_app(dataset.urls, classes=["a", "b"], warm=False)
    assert app[STATE]["classes"] == ["a", "b"]


# -------------------------------------------------------------------------------------------
# a filter on a field no sample has


def test_a_filter_on_an_absent_field_says_so(module_viewer):
    for text in ("clss=3", "clss", "cls=1 & clss!=3", "clss~x"):
        status, _, body = module_viewer.request("/api/page?filter=" + quote(text))
        assert status == 400, text
        assert body.decode().strip() == f"filter {text!r}: no sample has a field clss (fields seen: cls, jpg, json, txt, wav)"
    status, _, body = module_viewer.request("/api/page?filter=" + quote("json2.meta.lang=en"))
    assert status == 400 and b"no sample has a field json2 nor any other field that json2.meta.lang starts with" in body
    # fields that exist, a JSON path the field may not hold, and the key: filtered as before
    assert module_viewer.request("/api/page?filter=" + quote("json.nothing=1"))[0] == 200
    assert module_viewer.request("/api/page?filter=" + quote("__key__~s1"))[0] == 200


def test_the_field_set_comes_from_the_indexes_without_a_scan(tmp_path, viewer):
    urls = [write(tmp_path / f"s{i}.tar", [{"__key__": f"{i}-{j}", "cls": b"1"} for j in range(3)], index=True)
            for i in range(3)]
    v = viewer(urls, warm=False)
    status, _, body = v.request("/api/page?filter=nope")
    assert status == 400 and b"(fields seen: cls)" in body
    shards = [v.app[CATALOG].shard(i) for i in range(3)]
    # the indexes said it: no sample was read (8 bytes say that the shard is not compressed)
    assert [(s.reads, s.bytes_read) for s in shards if s is not None] == [(1, 8)] * 3


def test_a_field_found_in_the_first_shard_opens_no_other(tmp_path, viewer):
    urls = [write(tmp_path / f"s{i}.tar", [{"__key__": f"{i}-{j}", "cls": b"1", f"only{i}": b"x"} for j in range(3)])
            for i in range(3)]
    v = viewer(urls, warm=False)
    assert v.json("/api/page?n=1&filter=only0")["next"] == 1
    catalog = v.app[CATALOG]
    assert catalog.known() == (3, False)  # shards 1 and 2 not opened (no .idx: they'd be read)
    page = v.json("/api/page?n=1&filter=only2")  # found in the last shard: all opened on the way
    assert [s["key"] for s in page["samples"]] == ["2-0"]


# -------------------------------------------------------------------------------------------
# fuzz findings


def test_media_checks_the_member_name_under_a_stale_index(tmp_path, viewer):
    # a rewrite of the shard with the same members in another order: every size and offset of the
    # old index still lands on a valid header of the right size, of another sample
    path = tmp_path / "s.tar"
    samples = [{"__key__": k, "bin": bytes([65 + i]) * 100} for i, k in enumerate("abc")]
    write(path, samples, index=True)
    write(path, samples[::-1])
    v = viewer([str(path)])
    status, _, body = v.request("/media/0/0/bin")
    assert status == 502, body
    assert b"C" * 20 not in body and b"a member named 'c.bin', not 'a.bin'" in body
    assert b"rebuild the index" in body
    assert v.request("/media/0/0/bin", {"Range": "bytes=10-19"})[0] == 502
    assert v.request("/api/sample/0/0")[0] == 502
    assert v.request("/media/0/1/bin")[:3:2] == (200, b"B" * 100)  # the one in place is still served


@pytest.mark.parametrize("fmt", ["pax", "gnu"])
def test_media_reads_long_names_from_their_extension_headers(tmp_path, viewer, fmt):
    import tarfile

    key = "d/" + "k" * 150  # too long for a header's name: a pax record or a GNU long name holds it
    path = tmp_path / "long.tar"
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT if fmt == "pax" else tarfile.GNU_FORMAT) as tar:
        for name, data in ((f"{key}.txt", b"long one"), ("short.txt", b"short one")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    Path(f"{path}.idx").write_text(build_index(str(path)).jsonl_text())
    v = viewer([str(path)])
    assert v.request("/media/0/0/txt")[:3:2] == (200, b"long one")
    assert v.request("/media/0/1/txt")[:3:2] == (200, b"short one")


ODD_FIELDS = {"seg..png": png(), "a\\b.txt": b"backslash", "..": b"two dots", ".": b"one dot",
              "x%2e.txt": b"percent", "a b.txt": b"space"}


def test_every_field_a_sample_has_loads(tmp_path, viewer):
    v = viewer([write(tmp_path / "odd.tar", [{"__key__": "k", **ODD_FIELDS}])])
    fields = fields_of(v.json("/api/sample/0/0"))
    assert set(fields) == set(ODD_FIELDS)
    for name, data in ODD_FIELDS.items():
        status, _, body = v.request(fields[name]["url"])
        assert (status, body) == (200, data), (name, fields[name]["url"])
    assert fields[".."]["url"] == "/media/0/0?field=.."  # a browser would take ".." out of a path
    assert fields["seg..png"]["url"] == "/media/0/0/seg..png" and fields["a\\b.txt"]["url"] == "/media/0/0/a%5Cb.txt"
    assert v.log == []


def test_traversal_is_still_refused(tmp_path, viewer):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET\n")
    (tmp_path / "data").mkdir()
    v = viewer([write(tmp_path / "data" / "odd.tar", [{"__key__": "k", **ODD_FIELDS}])])
    for path in ("/media/0/0/..%2F..%2Fsecret.txt", "/media/0/0/%2E%2E%2Fsecret.txt", "/media/0/0/..%2F",
                 "/media/0/0?field=..%2F..%2Fsecret.txt", "/media/0/0?field=", "/media/0/0", "/media/0/0/",
                 "/media/0/0/jpg%00", "/media/0/0?field=txt%00", "/media/0/0/../../secret.txt",
                 "/media/0/0/..\\..\\secret.txt", "/media/0/..%2F0/txt", "/media/0/0/" + quote(str(secret), safe=""),
                 "/media/0/0/secret.txt", "/media/0/0/" + "x" * 5000):
        status, _, body = v.request(path)
        assert 400 <= status < 500, (path, status, body)
        assert b"TOP-SECRET" not in body and len(body) < 300, path
    assert v.log == []


BIG = 16 << 20  # more than the kernel's buffers of a connection would take from a client that doesn't read
# what a stalled response may hold, in the server's buffers and in the kernel's send queue together
# (a piece, the buffer's high mark, a capped send buffer; left to grow, the kernel's alone takes ~3 MiB)
PER_STREAM = 768 << 10


def queued(transport: Any) -> int:
    """Bytes of a connection held in the server: its buffer, and the kernel's send queue (Linux)."""
    import fcntl
    import struct
    import termios

    sock = transport.get_extra_info("socket")
    kernel = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, bytes(4)))[0]
    return int(transport.get_write_buffer_size()) + kernel


def test_clients_that_do_not_read_hold_a_bounded_amount(tmp_path, viewer):
    import termios

    if not hasattr(termios, "TIOCOUTQ"):
        pytest.skip("no TIOCOUTQ here to read a socket's send queue")
    url = write(tmp_path / "big.tar", [{"__key__": "big", "bin": bytes(range(256)) * (BIG // 256)}])
    limit = 4
    v = viewer([url], max_media_streams=limit)
    clients = []

    def transports() -> list[Any]:
        return [h.transport for h in v.runner.server.connections if h.transport is not None]

    def stalled() -> int:  # a response waiting for its client: the buffer above its high mark
        return sum(t.get_write_buffer_size() > t.get_write_buffer_limits()[1] for t in transports())

    try:
        for _ in range(limit):
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the client's kernel takes little
            client.connect(("127.0.0.1", v.port))
            client.sendall(b"GET /media/0/0/bin HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            clients.append(client)
        wait_for(lambda: stalled() == limit, what="every response stalled")
        held = [queued(t) for t in transports()]
        assert sum(held) <= limit * PER_STREAM, held
        streams = v.app[STATE]["streams"]
        assert (len(streams.active), streams.stalled()) == (limit, limit)
        assert streams.held() <= sum(held)
        # one more is refused at once, saying why; the rest of the viewer answers
        status, headers, body = v.request("/media/0/0/bin")
        assert status == 503 and b"busy: 4 fields are being sent already" in body and headers["retry-after"] == "1"
        assert v.request("/api/page")[0] == 200
    finally:
        for client in clients:
            client.close()
    wait_for(lambda: not v.app[STATE]["streams"].active, what="the streams of the closed clients ended")
    assert v.request("/media/0/0/bin", {"Range": "bytes=0-9"})[:3:2] == (206, bytes(range(10)))
    assert v.log == []
