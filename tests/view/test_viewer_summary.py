"""``tarshow --serve --summary``: the summary of every sample, run beside the viewer
(tarproc.view.summary), and ``/api/problems`` that lists what it finds. Real HTTP on 127.0.0.1
(the ``viewer`` fixture, conftest.py), the shard of issue 35's damage (tests/damaged.py), and
named pipes as shards whose reading the test holds where it wants it, so that nothing waits on
time: what is listed while the summary runs, a page answered meanwhile, a stop in the middle."""

from __future__ import annotations

import errno
import io
import json
import multiprocessing
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from damaged import GOOD, PLANTED, jpeg_bytes, planted_samples
from tarhelpers import live_group_members, run, tar_bytes, wait_for, write_tar

from tarproc.cli.tarfirst import main as tarfirst
from tarproc.show import summarize
from tarproc.view.server import STATE
from tarproc.view.summary import SUMMARY_NOTE, BackgroundSummary, SummaryOptions

SAMPLES = GOOD + len(PLANTED)


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_tar(tmp_path_factory.mktemp("planted") / "planted.tar", planted_samples()))


def finished(v: Any) -> dict[str, Any]:
    return wait_for(lambda: (lambda d: d if d["done"] else None)(v.json("/api/problems")),
                    what="the summary's end")


def kinds_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {k["kind"] + (f":{k['field']}" if k["kind"] == "missing" else ""): k for k in doc["kinds"]}


def examples_of(kind: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    return [(x["key"], x["field"], x["reason"]) for x in kind["examples"]]


def pulled(command: str) -> bytes:
    """What a listed ``tarfirst`` command writes (run in this process)."""
    words = shlex.split(command)
    assert words[0] == "tarfirst"
    r = run(tarfirst, words[1:])
    assert r.exit_code == 0, r.stderr
    return r.stdout_bytes


def opened(v: Any, key: str, shard: int) -> dict[str, Any]:
    """The sample of this key in this shard, as the page's link finds and opens it."""
    matches = [m for m in v.json("/api/find?key=" + key)["matches"] if m["shard"] == shard]
    assert matches, key
    return v.json(f"/api/sample/{shard}/{matches[0]['pos']}")


def test_the_summary_lists_the_planted_damage(planted, viewer):
    v = viewer([planted], summary=True)
    doc = finished(v)
    assert (doc["enabled"], doc["state"], doc["shards_checked"], doc["shards"], doc["samples"]) == (
        True, "done", 1, 1, SAMPLES)
    assert doc["progress"] == f"checked 1 of 1 shard, {SAMPLES} samples"
    # the same problems as tarshow --summary, one line per kind
    assert doc["problems"] == summarize([planted]).problems()
    assert doc["message"] == f"{len(doc['problems'])} kinds of problem found"
    kinds = kinds_of(doc)
    assert examples_of(kinds["damaged_images"]) == [("s/0007", "jpg", "cut short: no end-of-image marker after the scan")]
    assert examples_of(kinds["non_integer_labels"]) == [("s/0019", "cls", "label 'dog' among 45 integer labels")]
    assert examples_of(kinds["missing:cls"]) == [("s/0015", None, "no cls field")]
    assert examples_of(kinds["extension_mismatch"]) == [("s/0003", "jpg", "PNG data named .jpg")]
    assert [x[0] for x in examples_of(kinds["undecodable_images"])] == ["s/0023", "s/0027"]
    assert "decode_failures" not in kinds  # no --decode
    assert not any(k["tentative"] for k in doc["kinds"])  # the end decided them all
    # each example: a key the viewer opens, and a command that pulls the field out
    samples = {s["__key__"]: s for s in planted_samples()}
    for name in ("damaged_images", "non_integer_labels", "missing:cls", "extension_mismatch"):
        for x in kinds[name]["examples"]:
            assert (x["shard"], x["url"]) == (0, planted)
            assert opened(v, x["key"], 0)["key"] == x["key"]
            want = samples[x["key"]][x["field"]] if x["field"] else samples[x["key"]]["jpg"]  # no -f: the first
            assert pulled(x["command"]) == want, x["command"]
    assert v.log == []


def test_the_decode_check_runs_in_processes(planted, viewer):
    before = multiprocessing.active_children()
    v = viewer([planted], summary=SummaryOptions(decode=2))
    doc = finished(v)
    failures = examples_of(kinds_of(doc)["decode_failures"])
    assert [x[0] for x in failures] == ["s/0007", "s/0011", "s/0023", "s/0027"]
    assert failures[1][2].startswith("libjpeg: Corrupt JPEG data")  # garbage inside: only a decode finds it
    assert doc["decode"] is True and doc["problems"][-1] == "fields that fail to decode (--decode): 4"
    assert multiprocessing.active_children() == before  # its processes stopped at the end
    assert v.log == []


def test_without_summary_the_endpoint_says_it_is_off(module_viewer):
    assert module_viewer.json("/api/problems") == {"enabled": False, "note": SUMMARY_NOTE}
    assert module_viewer.app[STATE]["summary"] is None


def test_a_damaged_shard_is_listed_and_the_rest_is_summarized(planted, tmp_path, viewer):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"x" * 1000)
    cut = tmp_path / "cut.tar"
    cut.write_bytes(Path(planted).read_bytes()[:20_000])  # ends inside a member
    v = viewer([str(bad), planted, str(cut)], summary=True)
    doc = finished(v)
    assert doc["state"] == "done" and doc["shards_checked"] == 3
    unreadable = kinds_of(doc)["unreadable_shards"]
    assert unreadable["count"] == 2
    assert [(x["shard"], x["key"]) for x in unreadable["examples"]] == [(0, None), (2, None)]
    assert str(bad) in unreadable["examples"][0]["reason"] and str(cut) in unreadable["examples"][1]["reason"]
    assert "damaged or unreadable shards: 2" in doc["problems"]
    # the good shard's problems are there, in shard 1
    assert [(x["shard"], x["key"]) for x in kinds_of(doc)["damaged_images"]["examples"]][0] == (1, "s/0007")
    assert v.request("/api/page")[0] == 200  # the viewer goes on
    assert v.log == []


def test_hostile_keys_are_data(tmp_path, viewer):
    hostile = "<script>window.__pwned=1</script>"
    good = GOOD_JPEG
    url = str(write_tar(tmp_path / "h.tar", [{"__key__": f"k{i}", "jpg": good} for i in range(3)]
                        + [{"__key__": hostile, "jpg": good[:-40]}]))
    v = viewer([url], summary=True)
    finished(v)
    status, headers, body = v.request("/api/problems")
    # JSON, never taken for HTML (the page shows it as text: test_viewer_browser.py)
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert headers["x-content-type-options"] == "nosniff" and "default-src 'none'" in headers["content-security-policy"]
    x = kinds_of(json.loads(body))["damaged_images"]["examples"][0]
    assert x["key"] == hostile and x["command"] == f"tarfirst {url} --key '{hostile}' -f jpg"


# -------------------------------------------------------------------------------------------
# while it runs: a named pipe as the last shard holds the summary where the test wants it


def fifo_writer(path: Path) -> int:
    """The writing end of a named pipe, once its reader (the summary) has opened it."""

    def attempt() -> int | None:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no reader yet
                return None
            raise
        os.set_blocking(fd, True)
        return fd

    return wait_for(attempt, what=f"the summary opening {path.name}")


def write_all(fd: int, data: bytes) -> bool:
    """Write ``data`` whole; False if the reader closed the pipe first (it stopped)."""
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        return False
    return True


def split_at_sample(data: bytes, n: int) -> tuple[bytes, bytes]:
    """A tar's bytes cut where its ``n``-th sample's first member starts."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        at = tar.getmembers()[n * 2].offset  # jpg and cls: 2 members a sample
    return data[:at], data[at:]


GOOD_JPEG = jpeg_bytes(0)


def pipe_sample(i: int) -> dict[str, Any]:
    """Sample ``p/I`` of a shard read through a pipe: a JPEG (cut short in ``p/0005``) and a label."""
    return {"__key__": f"p/{i:04d}", "jpg": GOOD_JPEG if i != 5 else GOOD_JPEG[:-40], "cls": b"1"}


def slow_samples(n: int) -> list[dict[str, Any]]:
    return [pipe_sample(i) for i in range(n)]


def one_sample(i: int) -> bytes:
    """The tar members of sample ``p/I``, with no end of archive after them."""
    return split_at_sample(tar_bytes([pipe_sample(i), pipe_sample(i + 1)]), 1)[0]


def test_problems_are_listed_as_they_are_found(planted, tmp_path, viewer):
    pipe = tmp_path / "slow.tar"
    os.mkfifo(pipe)
    v = viewer([planted, str(pipe)], summary=True)
    fd = fifo_writer(pipe)  # the first shard is read: the summary waits on the second
    try:
        head, tail = split_at_sample(tar_bytes(slow_samples(20)), 10)
        write_all(fd, head)
        doc = wait_for(lambda: (lambda d: d if d["samples"] >= SAMPLES + 10 else None)(v.json("/api/problems")),
                       what="the first samples of the pipe read")
        assert (doc["state"], doc["done"], doc["shards_checked"], doc["shard"]) == ("running", False, 1, 1)
        assert doc["progress"] == f"checked 1 of 2 shards, {doc['samples']} samples"
        kinds = kinds_of(doc)
        # found so far, the cut JPEG of the pipe too; the label and the missing field not decided yet
        assert [(x["shard"], x["key"]) for x in kinds["damaged_images"]["examples"]] == [(0, "s/0007"), (1, "p/0005")]
        assert kinds["damaged_images"]["tentative"] is False
        assert kinds["non_integer_labels"]["tentative"] and kinds["missing:cls"]["tentative"]
        assert doc["problems"] == [] and doc["message"] is None
        assert v.request("/api/page?n=5")[0] == 200  # the pages answer meanwhile
        write_all(fd, tail)
    finally:
        os.close(fd)
    doc = finished(v)
    assert (doc["state"], doc["shards_checked"], doc["samples"]) == ("done", 2, SAMPLES + 20)
    assert kinds_of(doc)["damaged_images"]["count"] == 2


def test_a_stop_ends_it_between_two_members(planted, tmp_path):
    pipe = tmp_path / "slow.tar"
    os.mkfifo(pipe)
    before = multiprocessing.active_children()
    background = BackgroundSummary([planted, str(pipe)], SummaryOptions(decode=2))
    background.start()
    fd = fifo_writer(pipe)
    try:
        head, tail = split_at_sample(tar_bytes(slow_samples(40)), 20)
        write_all(fd, head)
        wait_for(lambda: background.snapshot()["samples"] >= SAMPLES + 20, what="the pipe's first samples read")
        assert len(multiprocessing.active_children()) > len(before)  # the decode processes are up
        assert background.stop(wait=0) is False  # asked; the thread waits on the pipe
        write_all(fd, tail)  # it stops at the next member (and closes the pipe)
    finally:
        os.close(fd)
    assert background.stop() is True
    doc = background.snapshot()
    assert (doc["state"], doc["done"], doc["message"]) == ("stopped", True, "stopped")
    assert doc["samples"] < SAMPLES + 40
    assert multiprocessing.active_children() == before  # the decode processes are gone


def test_a_failure_of_the_summary_is_listed_not_raised(planted, monkeypatch):
    from tarproc import show

    def broken(self: Any, *args: Any, **kw: Any) -> None:
        raise RuntimeError("a bug\nsecond line")

    monkeypatch.setattr(show.Summary, "finish", broken)
    said: list[str] = []
    background = BackgroundSummary([planted], log=said.append)
    background.start()
    wait_for(lambda: background.snapshot()["done"], what="the summary's end")
    doc = background.snapshot()
    assert (doc["state"], doc["message"]) == ("failed", "the summary stopped: RuntimeError: a bug")
    assert doc["kinds"][-1]["kind"] == "summary_failed"
    assert said == ["tarshow: error: the summary stopped: RuntimeError: a bug"]


def test_options_are_checked():
    from tarproc.errors import OptionError

    with pytest.raises(OptionError, match="decoding processes"):
        SummaryOptions(decode=0)
    with pytest.raises(OptionError, match="content"):
        SummaryOptions(decode=2, content=False)


# -------------------------------------------------------------------------------------------
# the process: Ctrl-C in the middle of a summary with its decode processes


def test_ctrl_c_stops_the_summary_and_its_processes(planted, tmp_path):
    pipe = tmp_path / "big.tar"
    os.mkfifo(pipe)
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    cmd = [str(Path(sys.executable).parent / "tarshow"), planted, str(pipe), "--serve", "--summary", "--decode",
           "-p", "2", "--port", "0"]
    err = open(tmp_path / "stderr.txt", "wb")  # noqa: SIM115 -- read while the process runs
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True)
    fd = None
    try:
        url = wait_for(lambda: (lambda m: m.group(1) if m else None)(re.search(
            r"serving 2 shards on (http://127\.0\.0\.1:\d+/)", (tmp_path / "stderr.txt").read_text())),
            what="the server's line")
        fd = fifo_writer(pipe)
        head, _ = split_at_sample(tar_bytes(slow_samples(40)), 20)
        write_all(fd, head)
        doc = wait_for(lambda: (lambda d: d if d["samples"] >= SAMPLES + 20 else None)(_get_json(url + "api/problems")),
                       what="the summary reading the pipe")
        assert doc["state"] == "running"
        assert len(live_group_members(proc.pid)) >= 3  # tarshow and its 2 decode processes
        proc.send_signal(signal.SIGINT)
        # more samples, one at a time, that never end the shard: only a stop closes the pipe
        more = iter(range(20, 10**9))
        wait_for(lambda: not write_all(fd, one_sample(next(more))), what="the summary stopping")
        proc.wait(timeout=60)
    finally:
        if fd is not None:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
        err.close()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 130, stderr
    assert "tarshow: interrupted" in stderr and "Traceback" not in stderr and "warning" not in stderr
    assert live_group_members(proc.pid) == []  # no decode process left behind


def _get_json(url: str) -> Any:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=30) as response:
        return json.loads(response.read())
