"""The viewer (``tarshow --serve``): time to show a page of 50 samples from the ~1 GB JPEG shard.

A page shown is what the browser asks for: ``/api/page?start=S&n=50`` (keys, fields, previews of
the text fields) and then the 50 thumbnails (``/media/...``, whole JPEGs), six at a time as a
browser does over HTTP/1.1. Each repetition starts a fresh viewer (no index in memory) on
127.0.0.1 in this process and asks for the page in the middle of the shard:

- with ``SHARD.idx`` beside the shard (the index is read, then 50 samples by random access);
- without it (the first page builds the index in memory by one read of the shard);
- the next page of that same viewer (the index now in memory).

Baseline: what a page-making script does without an index, reading the shard with
``read_samples`` from the start until it has the same 50 samples. Rates are pages/s (1 / the
median time); higher is better. The shard is in the page cache, so building its index in memory
reads 1 GB at memory speed (the C scanner); from a disk or a remote store that read is what the
``.idx`` saves.
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from common import Context, Row, alternate_many, log, spread, warm, yes_no

SECTION = "view"
PAGE = 50
BROWSER_CONNECTIONS = 6


class Viewer:
    """A fresh viewer of one shard on 127.0.0.1, in a thread of this process."""

    def __init__(self, url: str) -> None:
        import asyncio

        from aiohttp import web

        from tarproc.view.server import make_app

        self.loop = asyncio.new_event_loop()
        self.runner = web.AppRunner(make_app([url], warm=False), access_log=None, handle_signals=False)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = next(a[1] for a in self.runner.addresses if isinstance(a, tuple))
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.pool = ThreadPoolExecutor(BROWSER_CONNECTIONS)
        self.local = threading.local()

    def get(self, path: str) -> bytes:
        import http.client

        conn = getattr(self.local, "conn", None)
        if conn is None:  # one keep-alive connection per thread, as a browser keeps its six
            conn = self.local.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        conn.request("GET", path)
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status} {body[:200]!r}")
        return body

    def show_page(self, start: int) -> int:
        """The page from ``start`` and its thumbnails; returns the thumbnails received."""
        page = json.loads(self.pool.submit(self.get, f"/api/page?start={start}&n={PAGE}").result())
        urls = [f["url"] for s in page["samples"] for f in s["fields"] if f["kind"] == "image"]
        return sum(1 for body in self.pool.map(self.get, urls) if body[:3] == b"\xff\xd8\xff")

    def close(self) -> None:
        import asyncio

        self.pool.shutdown()
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(60)
        self.loop.close()


def first_page(shard: Path, start: int) -> Callable[[], tuple[float, int]]:
    """A fresh viewer per call; times only the page (not the server's start, a few ms)."""

    def run() -> tuple[float, int]:
        import time

        viewer = Viewer(str(shard))
        try:
            t0 = time.perf_counter()
            got = viewer.show_page(start)
            return time.perf_counter() - t0, got
        finally:
            viewer.close()

    return run


def next_page(shard: Path, start: int) -> Callable[[], tuple[float, int]]:
    """The page after ``start``'s, from a viewer that has shown ``start``'s (index in memory)."""

    def run() -> tuple[float, int]:
        import time

        viewer = Viewer(str(shard))
        try:
            viewer.show_page(start)
            t0 = time.perf_counter()
            got = viewer.show_page(start + PAGE)
            return time.perf_counter() - t0, got
        finally:
            viewer.close()

    return run


def scan_page(shard: Path, start: int) -> Callable[[], tuple[float, int]]:
    """The baseline: read_samples from the start of the shard until the page's 50 samples."""

    def run() -> tuple[float, int]:
        import time

        import tarproc

        t0 = time.perf_counter()
        got = 0
        for i, sample in enumerate(tarproc.read_samples(str(shard))):
            if i >= start:
                got += sample["jpg"][:3] == b"\xff\xd8\xff"
                if i + 1 >= start + PAGE:
                    break
        return time.perf_counter() - t0, got

    return run


def _self_timed(run: Callable[[], Any]) -> tuple[float, Any]:
    import gc

    gc.collect()
    return run()  # type: ignore[no-any-return]


def run(ctx: Context) -> tuple[list[Row], list[str]]:
    from tarproc.index import build_index

    shard, n = ctx.data.big, ctx.data.big_samples
    gb = shard.stat().st_size / 1e9
    start = (n // 2) // PAGE * PAGE  # the middle of the shard
    indexed, bare = ctx.out_dir / "indexed", ctx.out_dir / "bare"
    for d in (indexed, bare):
        d.mkdir()
        (d / shard.name).symlink_to(shard)  # the viewer looks for NAME.idx beside the link
    (indexed / f"{shard.name}.idx").write_text(build_index(str(shard)).jsonl_text())
    warm(shard)
    reps = ctx.reps
    log(f"[view] a page of {PAGE} samples (#{start:,}) from {shard.name} ({gb:.2f} GB): with .idx, without, "
        f"next page, and a read_samples scan ({reps} reps)")
    first_page(indexed / shard.name, start)()  # warm-up: imports, the first connection
    with_idx, without, following, scan = alternate_many(
        [("with .idx", reps, first_page(indexed / shard.name, start)),
         ("without .idx", reps, first_page(bare / shard.name, start)),
         ("next page", reps, next_page(bare / shard.name, start)),
         ("read_samples scan", reps, scan_page(shard, start))],
        PAGE, "viewer page", clock=_self_timed,
    )
    base = 1 / statistics.median(scan)
    label = f"{gb:.2f} GB JPEG shard, page of {PAGE} at #{start:,} with thumbnails"
    rows = [
        Row(f"viewer, first page, with .idx ({label})", 1 / statistics.median(with_idx), "pages/s",
            "read_samples scan to the page", base, "< 0.5 s", yes_no(statistics.median(with_idx) < 0.5)),
        Row(f"viewer, first page, no .idx: index built in memory ({label})", 1 / statistics.median(without),
            "pages/s", "read_samples scan to the page", base, "< 5 s", yes_no(statistics.median(without) < 5)),
        Row(f"viewer, next page, index in memory ({label})", 1 / statistics.median(following), "pages/s",
            "read_samples scan to the page", base, "< 0.5 s", yes_no(statistics.median(following) < 0.5)),
    ]
    notes = [
        f"viewer page with .idx: {spread(with_idx)}",
        f"viewer page without .idx (builds the index): {spread(without)}",
        f"viewer next page (index in memory): {spread(following)}",
        f"read_samples scan to #{start:,} + {PAGE}: {spread(scan)}",
    ]
    return rows, notes
