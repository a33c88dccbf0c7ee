"""The viewer in a real browser (headless Chromium through selenium, see conftest.py): thumbnails
that decode, audio with a duration, paging, filtering, the key jump, data shown as text, nothing
asked of another host, and no console errors. Skipped, saying why, where Chromium or its driver
is not installed."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("selenium")

WAIT = 30  # seconds; the page answers in milliseconds, but the machine may be busy


def wait_for(driver: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(lambda d: condition(d), message=what)


def card_keys(driver: Any) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll('.card')].map(c => c.dataset.key)")


def status_text(driver: Any) -> str:
    return driver.execute_script("return document.getElementById('status').textContent")


def open_viewer(driver: Any, url: str, expect: int) -> None:
    driver.get(url)
    wait_for(driver, lambda d: len(card_keys(d)) == expect and "loading" not in status_text(d), f"{expect} cards")


def submit(driver: Any, input_id: str, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    box = driver.find_element(By.ID, input_id)
    box.clear()
    box.send_keys(text + Keys.ENTER)


def no_console_errors(driver: Any, console_errors_of: Any) -> None:
    errors = console_errors_of(driver)
    assert errors == [], errors


def test_thumbnails_decode(browser, module_viewer, console_errors_of):
    open_viewer(browser, module_viewer.url + "/", 50)
    assert card_keys(browser)[:3] == ["s0/0000", "s0/0001", "s0/0002"]
    wait_for(browser, lambda d: d.execute_script(
        "return [...document.querySelectorAll('img.thumb')].every(i => i.complete)"), "images loaded")
    widths = browser.execute_script(
        "return [...document.querySelectorAll('img.thumb')].map(i => [i.naturalWidth, i.naturalHeight])")
    assert widths == [[48, 32]] * 50
    assert "samples #0 to #49 of 60" in status_text(browser)
    assert "2 shards, 60 samples" in browser.execute_script("return document.getElementById('dataset').textContent")
    no_console_errors(browser, console_errors_of)


def test_audio_has_a_duration(browser, module_viewer, console_errors_of):
    open_viewer(browser, module_viewer.url + "/#start=0&n=25", 25)
    wait_for(browser, lambda d: d.execute_script(
        "const a = [...document.querySelectorAll('.card audio')];"
        "return a.length === 5 && a.every(x => x.readyState >= 1)"), "audio metadata")
    durations = browser.execute_script("return [...document.querySelectorAll('.card audio')].map(a => a.duration)")
    assert all(abs(d - 0.5) < 0.01 for d in durations), durations
    # seeking needs byte ranges: the server's answer lets the browser seek anywhere
    seekable = browser.execute_script(
        "const a = document.querySelector('.card audio'); return [a.seekable.length, a.seekable.end(0)]")
    assert seekable[0] == 1 and abs(seekable[1] - 0.5) < 0.01
    no_console_errors(browser, console_errors_of)


def test_paging(browser, module_viewer, console_errors_of):
    from selenium.webdriver.common.by import By

    open_viewer(browser, module_viewer.url + "/#start=0&n=25", 25)
    assert browser.find_element(By.ID, "prev").get_attribute("disabled") is not None
    browser.find_element(By.ID, "next").click()
    wait_for(browser, lambda d: card_keys(d)[:1] == ["s0/0025"], "second page")
    assert card_keys(browser) == [f"s0/{i:04d}" for i in range(25, 30)] + [f"s1/{i:04d}" for i in range(20)]
    assert "start=25" in browser.current_url
    browser.find_element(By.ID, "next").click()
    wait_for(browser, lambda d: card_keys(d)[:1] == ["s1/0020"], "last page")
    assert len(card_keys(browser)) == 10
    assert browser.find_element(By.ID, "next").get_attribute("disabled") is not None
    browser.find_element(By.ID, "prev").click()
    wait_for(browser, lambda d: card_keys(d)[:1] == ["s0/0025"], "back a page")
    submit(browser, "start", "57")
    wait_for(browser, lambda d: card_keys(d) == ["s1/0027", "s1/0028", "s1/0029"], "from #57")
    no_console_errors(browser, console_errors_of)


def test_filtering(browser, module_viewer, console_errors_of):
    from selenium.webdriver.common.by import By

    open_viewer(browser, module_viewer.url + "/", 50)
    submit(browser, "filter", "cls=3")
    expected = [f"s{s}/{i:04d}" for s in range(2) for i in range(30) if i % 5 == 3]
    wait_for(browser, lambda d: card_keys(d) == expected, "cls=3")
    assert "12 matches" in status_text(browser)
    texts = browser.execute_script(
        "return [...document.querySelectorAll('.card')].map(c => c.querySelector('.field.text .text').textContent)")
    assert texts == ["3"] * 12  # cls, the first text field of each card
    submit(browser, "filter", "json.meta.lang=en & cls=0")
    wait_for(browser, lambda d: card_keys(d) == ["s0/0000", "s0/0015", "s1/0000", "s1/0015"], "two conditions")
    submit(browser, "filter", "=oops")
    wait_for(browser, lambda d: "needs a field name" in status_text(d), "a bad filter's message")
    assert browser.find_element(By.ID, "status").get_attribute("class") == "error"
    console_errors_of(browser)  # the 400 of the bad filter is logged by the browser: expected
    browser.find_element(By.ID, "clear").click()
    wait_for(browser, lambda d: len(card_keys(d)) == 50, "filter cleared")
    no_console_errors(browser, console_errors_of)


def test_key_jump_shows_every_field(browser, module_viewer, console_errors_of):
    open_viewer(browser, module_viewer.url + "/", 50)
    submit(browser, "key", "s1/0015")
    wait_for(browser, lambda d: d.execute_script("return !document.getElementById('detail').hidden"), "detail")
    detail = browser.execute_script(
        "const b = document.getElementById('detailbody');"
        "return [b.querySelector('h2').textContent, [...b.querySelectorAll('.name')].map(n => n.textContent),"
        " b.querySelectorAll('img').length, b.querySelectorAll('audio').length]")
    assert detail == ["s1/0015", ["cls", "jpg", "json", "txt", "wav"], 1, 1]
    assert card_keys(browser)[0] == "s1/0015"
    assert browser.execute_script("return document.querySelector('.card.current').dataset.key") == "s1/0015"
    browser.execute_script("document.getElementById('close').click()")
    wait_for(browser, lambda d: d.execute_script("return document.getElementById('detail').hidden"), "closed")
    submit(browser, "key", "no/such/key")
    wait_for(browser, lambda d: "no sample with key" in status_text(d), "no such key")
    no_console_errors(browser, console_errors_of)


def test_data_is_shown_as_text_and_nothing_leaves(browser, module_viewer, dataset, console_errors_of):
    open_viewer(browser, module_viewer.url + "/#start=0&n=10", 10)
    shown = browser.execute_script(
        "return [...document.querySelector('.card[data-key=\"s0/0003\"]').querySelectorAll('.text')]"
        ".map(t => t.textContent)")
    assert dataset.hostile in shown  # the caption, as its characters
    assert browser.execute_script("return window.__pwned === undefined")
    assert browser.execute_script("return document.querySelectorAll('script').length") == 1  # our own only
    origin = module_viewer.url
    resources = browser.execute_script("return performance.getEntriesByType('resource').map(r => r.name)")
    assert resources and all(r.startswith(origin + "/") for r in resources), resources
    no_console_errors(browser, console_errors_of)


def webm_bytes(frames: int = 10, rate: int = 10) -> bytes:
    """A tiny VP8 video (64x48, ``frames`` frames at ``rate`` fps), encoded with PyAV."""
    import io

    av = pytest.importorskip("av")
    np = pytest.importorskip("numpy")
    buf = io.BytesIO()
    with av.open(buf, "w", format="webm") as container:
        stream = container.add_stream("libvpx", rate=rate)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(frames):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), i * 20, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def test_video_plays_from_the_tar(browser, viewer, tmp_path, console_errors_of):
    from tarproc import TarWriter

    path = tmp_path / "video.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        w.write_sample({"__key__": "clip/0", "webm": webm_bytes(), "txt": b"ten frames"})
    v = viewer([str(path)])
    open_viewer(browser, v.url + "/", 1)
    wait_for(browser, lambda d: d.execute_script(
        "const v = document.querySelector('.card video'); return v && v.readyState >= 1"), "video metadata")
    width, height, duration = browser.execute_script(
        "const v = document.querySelector('.card video'); return [v.videoWidth, v.videoHeight, v.duration]")
    assert (width, height) == (64, 48) and abs(duration - 1.0) < 0.15, duration
    no_console_errors(browser, console_errors_of)


def test_broken_images_are_marked_and_listed(browser, viewer, tmp_path, console_errors_of):
    import io
    import shlex

    from PIL import Image

    from tarproc import TarWriter

    buf = io.BytesIO()
    Image.new("RGB", (48, 32), (10, 200, 10)).save(buf, format="JPEG")
    good = buf.getvalue()
    hostile = "<img src=x onerror=window['__pwned']=1>"
    path = tmp_path / "broken.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        w.write_sample({"__key__": "good", "jpg": good, "cls": b"1"})
        w.write_sample({"__key__": "cut", "jpg": good[:-40]})  # the server finds it cut short
        w.write_sample({"__key__": "odd", "svg": b"this is no SVG"})  # only the browser finds it can't show it
        w.write_sample({"__key__": hostile, "jpg": good[:-40]})
    v = viewer([str(path)], classes=["cat", "dog"])
    open_viewer(browser, v.url + "/", 4)
    assert browser.execute_script("return document.querySelector('.card .field.text .text').textContent") == "1 (dog)"

    def marks(d: Any) -> dict[str, str]:
        return d.execute_script(
            "const out = {}; for (const c of document.querySelectorAll('.card')) {"
            " const m = c.querySelector('.broken'); out[c.dataset.key] = m ? m.textContent : ''; } return out")

    wait_for(browser, lambda d: marks(d)["odd"] != "", "the browser's own mark")
    assert marks(browser) == {"good": "", "cut": "broken image: cut short: no end-of-image marker after the scan",
                              "odd": "broken image: the browser cannot display it",
                              hostile: "broken image: cut short: no end-of-image marker after the scan"}
    assert browser.execute_script("return document.querySelectorAll('.card img').length") == 1  # the good one
    listed = browser.execute_script(
        "return [document.getElementById('problems').hidden, document.getElementById('problemcount').textContent,"
        " [...document.querySelectorAll('#problemlist .problem')].map(p => [p.querySelector('a').textContent,"
        " p.textContent, p.querySelector('code') ? p.querySelector('code').textContent : null])]")
    hidden, count, entries = listed
    assert (hidden, count) == (False, "3 problems found so far")
    assert [e[0] for e in entries] == ["odd.svg", hostile + ".jpg", "cut.jpg"]  # the latest first
    assert entries[2][2] == f"tarfirst {path} --key cut -f jpg"
    assert entries[1][2] == f"tarfirst {path} --key {shlex.quote(hostile)} -f jpg"
    assert entries[0][2] == f"tarfirst {path} --key odd -f svg"
    assert browser.execute_script("return window.__pwned === undefined")  # the key shown as text
    # its link opens the sample, which shows the same mark
    browser.execute_script(
        "[...document.querySelectorAll('#problemlist a')].find(a => a.textContent === 'cut.jpg').click()")
    wait_for(browser, lambda d: d.execute_script("return !document.getElementById('detail').hidden"), "detail")
    detail = browser.execute_script(
        "const b = document.getElementById('detailbody');"
        "return [b.querySelector('h2').textContent, b.querySelector('.broken').textContent]")
    assert detail == ["cut", "broken image: cut short: no end-of-image marker after the scan"]
    browser.execute_script("document.getElementById('close').click()")
    submit(browser, "filter", "clss=3")  # a misspelt field: said at once, not a scan that finds nothing
    wait_for(browser, lambda d: "no sample has a field clss (fields seen: cls, jpg, svg)" in status_text(d),
             "the absent field's message")
    console_errors_of(browser)  # the SVG that fails to load and the 400 are logged by the browser: expected


def test_the_panel_lists_the_summary_and_its_links_open_the_samples(browser, viewer, tmp_path, console_errors_of):
    from damaged import planted_samples

    from tarproc import TarWriter
    from tarproc.view.summary import SUMMARY_NOTE

    hostile = "<img src=x onerror=window['__pwned']=1>"
    samples = planted_samples()
    path = tmp_path / "planted.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        for sample in samples:
            w.write_sample(sample)
        w.write_sample({"__key__": hostile, "jpg": samples[0]["jpg"][:-40], "cls": b"1"})
    v = viewer([str(path)], summary=True)
    open_viewer(browser, v.url + "/", len(samples) + 1)
    wait_for(browser, lambda d: "kinds of problem found" in d.execute_script(
        "return document.getElementById('summaryprogress').textContent"), "the summary's end")
    progress, count = browser.execute_script(
        "return [document.getElementById('summaryprogress').textContent,"
        " document.getElementById('problemcount').textContent]")
    assert progress == f"checked 1 of 1 shard, {len(samples) + 1} samples: 5 kinds of problem found"
    assert count.startswith("summary: 5 kinds of problem")

    def listed(kind: str) -> list[list[str]]:
        return browser.execute_script(
            "return [...document.querySelectorAll('#summarylist .kind[data-kind=\"' + arguments[0] + '\"] .example')]"
            ".map(x => [x.querySelector('a').textContent, x.textContent, x.querySelector('code').textContent])", kind)

    damaged = listed("damaged_images")
    assert [x[0] for x in damaged] == ["s/0007.jpg", hostile + ".jpg"]
    assert damaged[0][2] == f"tarfirst {path} --key s/0007 -f jpg"
    assert [x[0] for x in listed("non_integer_labels")] == ["s/0019.cls"]
    assert [x[0] for x in listed("missing")] == ["s/0015"]
    assert browser.execute_script("return window.__pwned === undefined")  # the key shown as text
    # a link finds the sample by its key and opens it, past the first page too
    browser.execute_script("document.getElementById('count').value = '10'; "
                           "document.getElementById('nav').requestSubmit()")
    wait_for(browser, lambda d: len(card_keys(d)) == 10, "a page of 10")
    browser.execute_script(
        "[...document.querySelectorAll('#summarylist a')].find(a => a.textContent === 's/0019.cls').click()")
    wait_for(browser, lambda d: d.execute_script("return !document.getElementById('detail').hidden"), "detail")
    assert browser.execute_script("return document.querySelector('#detailbody h2').textContent") == "s/0019"
    assert card_keys(browser)[0] == "s/0019"
    browser.execute_script("document.getElementById('close').click()")
    console_errors_of(browser)  # the broken images the page shows are logged by the browser: expected
    # without --summary: what the pages show, and one line saying what --summary does
    plain = viewer([str(path)])
    open_viewer(browser, plain.url + "/#start=0&n=10", 10)
    wait_for(browser, lambda d: d.execute_script("return !document.getElementById('problems').hidden"), "the panel")
    note, shown = browser.execute_script(
        "return [document.getElementById('summarynote').textContent,"
        " document.getElementById('summaryview').hidden]")
    assert (note, shown) == (SUMMARY_NOTE, True)
