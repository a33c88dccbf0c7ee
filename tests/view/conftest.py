"""Fixtures for the viewer and report tests: a real headless Chromium driven by selenium.

- ``browser``: a selenium Chrome webdriver over Debian's ``/usr/bin/chromium`` and
  ``/usr/bin/chromedriver`` (installed by ``make install-browser``), one per test module; the
  test is skipped, saying why, when either is missing or the browser does not start.
- ``console_errors(driver)``: the browser console's SEVERE entries since the last call (reading
  the log empties it), as strings.

Nothing may leave 127.0.0.1: selenium's driver manager would download a driver and send usage
statistics, so the driver is given by path (``Service``) and ``SE_AVOID_STATS`` is set before
selenium is imported; Chromium's own background traffic is switched off with its flags.
"""

from __future__ import annotations

import http.client
import io
import json
import math
import os
import struct
import threading
import wave
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WINDOW = (1280, 900)

_QUIET_FLAGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-dev-shm-usage",
    "--disable-gpu",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
    # no traffic to any other host: updates, sync, metrics, field trials, safe browsing, DNS prefetch
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-sync",
    "--disable-client-side-phishing-detection",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-pings",
    "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,AutofillServerCommunication",
    "--autoplay-policy=no-user-gesture-required",
]


def _missing() -> str | None:
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return f"{path} is not installed (apt-get install {package}, or run `make install-browser` as root)"
    return None


def _start() -> Any:
    os.environ["SE_AVOID_STATS"] = "true"  # before selenium starts: no statistics, no driver download
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed (pip install selenium)")
    options = Options()
    options.binary_location = CHROMIUM
    for flag in _QUIET_FLAGS:
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER)
    try:
        driver = webdriver.Chrome(service=service, options=options)
    except Exception as e:  # noqa: BLE001 -- any failure to start the browser is a reason to skip
        pytest.skip(f"chromium did not start: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
    driver.set_window_size(*WINDOW)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    return driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Chromium (selenium webdriver), shared by the tests of one module."""
    reason = _missing()
    if reason is not None:
        pytest.skip(reason)
    driver = _start()
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: Any) -> list[str]:
    """The browser console's errors (level SEVERE) since the last call, as strings."""
    return [
        f"{e.get('source', '')}: {e.get('message', '')}"
        for e in driver.get_log("browser")
        if e.get("level") == "SEVERE"
    ]


@pytest.fixture
def console_errors_of() -> Any:
    """``console_errors`` as a fixture, for test modules (which cannot import each other)."""
    return console_errors


# -------------------------------------------------------------------------------------------
# a small dataset of images, audio, labels and JSON, and the viewer serving it on 127.0.0.1


def jpeg_bytes(color: tuple[int, int, int], size: tuple[int, int] = (48, 32)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="JPEG", quality=80)
    return buf.getvalue()


def wav_bytes(seconds: float = 0.5, rate: int = 8000, freq: float = 440.0) -> bytes:
    """A mono 16-bit sine tone, written with the standard library's ``wave``."""
    frames = int(seconds * rate)
    samples = (int(12000 * math.sin(2 * math.pi * freq * t / rate)) for t in range(frames))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(struct.pack(f"<{frames}h", *samples))
    return buf.getvalue()


HOSTILE = "<script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"


def make_samples(shard: int, count: int) -> list[dict[str, Any]]:
    """Samples ``s{shard}/{i:04d}``: a JPEG, ``cls`` = i % 5, JSON with ``meta.lang`` (en every
    third sample, else de) and a caption; every fifth a WAV; sample 3 of shard 0 a hostile caption."""
    out = []
    for i in range(count):
        n = shard * count + i
        caption = HOSTILE if (shard, i) == (0, 3) else f"caption {n}"
        sample: dict[str, Any] = {
            "__key__": f"s{shard}/{i:04d}",
            "jpg": jpeg_bytes(((n * 37) % 256, (n * 91) % 256, 128)),
            "cls": str(i % 5).encode(),
            "json": json.dumps({"meta": {"lang": "en" if i % 3 == 0 else "de"}, "n": n, "caption": caption}).encode(),
            "txt": caption.encode(),
        }
        if i % 5 == 0:
            sample["wav"] = wav_bytes(freq=300.0 + 10 * i)
        out.append(sample)
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    """Two shards of 30 samples (``make_samples``) in a folder of their own, beside a secret file
    that nothing may read through the viewer."""
    from tarproc import TarWriter

    root = tmp_path_factory.mktemp("viewdata")
    (root / "secret.txt").write_text("TOP-SECRET-CONTENT\n")
    urls, expected = [], {}
    for shard in range(2):
        path = root / "data" / f"shard-{shard:04d}.tar"
        path.parent.mkdir(exist_ok=True)
        samples = make_samples(shard, 30)
        with open(path, "wb") as f, TarWriter(f) as w:
            for sample in samples:
                w.write_sample(sample)
        urls.append(str(path))
        expected.update({s["__key__"]: s for s in samples})
    return SimpleNamespace(root=root, urls=urls, expected=expected, secret=root / "secret.txt", hostile=HOSTILE)


class Viewer:
    """The viewer's application served on 127.0.0.1 in a thread, and raw HTTP requests to it
    (``http.client``, so that paths go out exactly as written, ``..`` and all)."""

    def __init__(self, urls: list[str], **kw: Any) -> None:
        import asyncio

        from aiohttp import web

        from tarproc.view.server import make_app

        self.loop = asyncio.new_event_loop()
        self.log: list[str] = []
        kw.setdefault("log", self.log.append)
        self.app = make_app(urls, **kw)
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = next(a[1] for a in self.runner.addresses if isinstance(a, tuple))
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def request(self, path: str, headers: dict[str, str] | None = None, method: str = "GET") -> Any:
        """``(status, headers, body)`` of one request, the path sent as it is."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.putrequest(method, path, skip_host="Host" in (headers or {}), skip_accept_encoding=True)
            for name, value in (headers or {}).items():
                conn.putheader(name, value)
            conn.endheaders()
            response = conn.getresponse()
            body = response.read()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, body
        finally:
            conn.close()

    def json(self, path: str) -> Any:
        status, _, body = self.request(path)
        assert status == 200, (path, status, body)
        return json.loads(body)

    def close(self) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def viewer() -> Iterator[Callable[..., Viewer]]:
    """``viewer(urls, **make_app_options)``: a started ``Viewer``, stopped after the test."""
    started: list[Viewer] = []

    def start(urls: list[str], **kw: Any) -> Viewer:
        v = Viewer(urls, **kw)
        started.append(v)
        return v

    yield start
    for v in started:
        v.close()


@pytest.fixture(scope="module")
def module_viewer(dataset: SimpleNamespace) -> Iterator[Viewer]:
    """The viewer of ``dataset``, shared by the tests of one module."""
    v = Viewer(dataset.urls)
    yield v
    v.close()
