"""The HTML report (``tarshow --report``) in a real headless Chromium, opened from file:// as a
colleague would open it from a mail: thumbnails decode, audio players get a duration, the console
has no error, and nothing is fetched from anywhere. Saves the screenshot kept in docs/report.png."""

from __future__ import annotations

import io
import json
import os
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageDraw

from tarproc.tar import TarWriter
from tarproc.view.report import write_report

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "docs" / "report.png"
SCREEN = (1200, 900)
CAPTIONS = ["a red kite over a hill", "two dogs on a beach at dusk", "a bowl of ripe lemons", "a city street in the rain",
            "a lighthouse on a rocky coast", "snow on pine trees", "a cup of coffee and a book", "a sailing boat"]


def picture(i: int) -> bytes:
    """A small made-up photo: a sky gradient, a hill and a sun, different for each ``i``."""
    rng = np.random.default_rng(i)
    w, h = int(rng.integers(280, 420)), int(rng.integers(200, 300))
    top, bottom = rng.integers(40, 255, 3), rng.integers(0, 160, 3)
    t = np.linspace(0, 1, h)[:, None, None]
    sky = (top * (1 - t) + bottom * t).astype(np.uint8).repeat(w, axis=1)
    img = Image.fromarray(sky)
    draw = ImageDraw.Draw(img)
    sun = int(rng.integers(20, 50))
    x, y = int(rng.integers(sun, w - sun)), int(rng.integers(sun, h // 2))
    draw.ellipse((x - sun, y - sun, x + sun, y + sun), fill=tuple(int(c) for c in rng.integers(180, 256, 3)))
    draw.polygon([(0, h), (0, int(h * 0.7)), (w // 2, int(h * rng.uniform(0.45, 0.7))), (w, int(h * 0.75)), (w, h)],
                 fill=tuple(int(c) for c in rng.integers(0, 120, 3)))
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85)
    return buf.getvalue()


def tone(seconds: float, freq: float, rate: int = 16000) -> bytes:
    n = int(seconds * rate)
    pcm = (np.sin(2 * np.pi * freq * np.arange(n) / rate) * 6000 * np.hanning(n)).astype("<i2").tobytes()
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt " + fmt + b"data" + struct.pack("<I", len(pcm)) + pcm


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("report")
    shard = tmp / "speech-and-pictures-0000.tar"
    with open(shard, "wb") as f, TarWriter(f) as w:
        for i in range(64):
            caption = CAPTIONS[i % len(CAPTIONS)]
            sample = {"__key__": f"{i:09d}", "jpg": picture(i), "txt": caption.encode(), "cls": str(i % 5).encode(),
                      "json": json.dumps({"url": f"https://example.com/{i}.jpg", "caption": caption,
                                          "width": 400, "height": 300, "status": "success"}).encode(),
                      "wav": tone(0.5 + (i % 4) * 0.5, 220 + 30 * (i % 7))}
            if i == 9:
                sample["txt"] = b"<script>document.title='pwned'</script> an escaped caption"
            w.write_sample(sample)
    out = tmp / "report.html"
    cwd = os.getcwd()
    os.chdir(tmp)  # a relative input: the screenshot shows no temporary directory
    try:
        write_report([shard.name], str(out), sample=12, seed=4)
    finally:
        os.chdir(cwd)
    return out


def test_report_in_a_browser(browser, console_errors_of, report):
    browser.get(report.as_uri())
    # the viewport (what the screenshot shows) is SCREEN: the window is that plus its frame
    frame = browser.execute_script("return [window.outerWidth - window.innerWidth, window.outerHeight - window.innerHeight]")
    browser.set_window_size(SCREEN[0] + frame[0], SCREEN[1] + frame[1])
    assert browser.title == "speech-and-pictures-0000.tar"
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
    assert len(images) == 12
    assert all(done and w > 0 and h > 0 for done, w, h in images), images
    durations = browser.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const players = Array.from(document.querySelectorAll('audio'));
        Promise.all(players.map(a => new Promise(resolve => {
            if (a.readyState >= 1) return resolve(a.duration);
            a.addEventListener('loadedmetadata', () => resolve(a.duration));
            a.addEventListener('error', () => resolve(-1));
            a.load();
        }))).then(done);
    """)
    assert len(durations) == 12
    assert all(d in (0.5, 1.0, 1.5, 2.0) or abs(d - round(d * 2) / 2) < 0.01 for d in durations), durations
    assert browser.title != "pwned"  # the caption's script is text, not a script
    assert browser.execute_script("return document.scripts.length") == 0
    # nothing was fetched from anywhere: the only resource is the page itself
    entries = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert entries == []
    assert console_errors_of(browser) == []
    browser.execute_script("window.scrollTo(0, 0)")
    SCREENSHOT.parent.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(SCREENSHOT))
    with Image.open(SCREENSHOT) as shot:
        assert shot.size == SCREEN
