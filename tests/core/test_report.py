"""tarproc.view.report: the self-contained HTML report (``tarshow --report``)."""

from __future__ import annotations

import base64
import io
import json
import os
import struct
from html.parser import HTMLParser

import pytest
from PIL import Image

from tarproc.errors import OptionError, TarprocError
from tarproc.tar import TarWriter
from tarproc.view.report import SampleReservoir, svg_bars, svg_histogram, write_report

EVIL = "<script>alert('x')</script>"


def jpeg(size=(120, 80), colour=(200, 30, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "JPEG")
    return buf.getvalue()


def wav(seconds: float, rate: int = 8000) -> bytes:
    data = bytes(int(seconds * rate) * 2)
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + fmt + b"data" + struct.pack("<I", len(data)) + data


def write_tar(path, samples) -> str:
    with open(path, "wb") as f, TarWriter(f) as w:
        for s in samples:
            w.write_sample(s)
    return str(path)


def dataset(n: int = 40) -> list[dict]:
    samples = []
    for i in range(n):
        s = {"__key__": f"s/{i:04d}", "jpg": jpeg((100 + i, 60), (5 * i, 100, 200)), "cls": str(i % 4).encode(),
             "txt": f"caption {i}".encode(), "json": json.dumps({"i": i, "note": f"n{i}"}).encode(),
             "wav": wav(0.25)}
        samples.append(s)
    samples[3]["__key__"] = f"evil{EVIL}"
    samples[3]["txt"] = f"a caption with {EVIL} & <b>tags</b>".encode()
    samples[3]["json"] = json.dumps({EVIL: EVIL}).encode()
    samples[7]["jpg"] = b"\xff\xd8\xff\xe0" + b"broken" * 4
    return samples


class Page(HTMLParser):
    """Every tag with its attributes, and the text, as a browser would read them."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)

    def all(self, tag: str) -> list[dict[str, str | None]]:
        return [attrs for t, attrs in self.tags if t == tag]


def card_keys(text: str) -> list[str]:
    """The keys of the sample cards (not those of the samples with problems, above them)."""
    text = text.split('<h2 id="samples">', 1)[1]

    class Keys(HTMLParser):
        def __init__(self):
            super().__init__(convert_charrefs=True)
            self.keys: list[str] = []
            self.on = False

        def handle_starttag(self, tag, attrs):
            self.on = tag == "div" and dict(attrs).get("class") == "key"

        def handle_data(self, data):
            if self.on:
                self.keys.append(data)
                self.on = False

    k = Keys()
    k.feed(text)
    return k.keys


@pytest.fixture
def shard(tmp_path):
    return write_tar(tmp_path / "data.tar", dataset())


def test_the_report_is_self_contained(shard, tmp_path):
    out = tmp_path / "report.html"
    info = write_report([shard], str(out), sample=40, seed=1)
    assert (info.samples, info.cards) == (40, 40) and out.stat().st_size == info.bytes
    page = Page(out.read_text(encoding="utf-8"))
    refs = [(tag, name, value) for tag, attrs in page.tags for name, value in attrs.items()
            if name in ("src", "href", "srcset", "poster", "data", "action", "xlink:href") and value]
    assert refs, "the report has images and audio"
    for tag, name, value in refs:  # data: URIs, and links within the page
        assert value.startswith("data:") or (tag == "a" and value.startswith("#")), (tag, name, value[:80])
        assert not value.lower().startswith(("http:", "https:", "//", "file:", "ftp:"))
    assert not page.all("link") and not page.all("script") and not page.all("iframe")
    assert "@import" not in out.read_text() and "url(" not in "".join(page.text)
    # thumbnails are small JPEGs that decode; the audio players carry the WAV
    imgs = page.all("img")
    assert len(imgs) == 39  # 40 cards, one image broken; the problem card (of that sample) above them
    for attrs in imgs:
        assert attrs["src"].startswith("data:image/jpeg;base64,")
        img = Image.open(io.BytesIO(base64.b64decode(attrs["src"].split(",", 1)[1])))
        img.load()
        assert max(img.size) <= 192 and (img.width, img.height) == (int(attrs["width"]), int(attrs["height"]))
    audios = page.all("audio")
    assert len(audios) == 40 + 1 and all(a["src"].startswith("data:audio/wav;base64,UklGR") for a in audios)
    assert len(page.all("svg")) >= 5  # size histograms, width/height, durations, classes


def test_everything_from_the_data_is_escaped(shard, tmp_path):
    out = tmp_path / "report.html"
    write_report([shard], str(out), sample=40, seed=1)
    raw = out.read_text(encoding="utf-8")
    assert EVIL not in raw and "<b>tags</b>" not in raw
    page = Page(raw)
    assert not page.all("script") and not page.all("b")
    text = "".join(page.text)
    assert f"evil{EVIL}" in text  # the key, shown as text
    assert f"a caption with {EVIL} & <b>tags</b>" in text
    assert json.dumps(EVIL) in text  # the JSON, pretty-printed as text


def test_the_sample_is_seeded_and_reproducible(shard, tmp_path):
    def keys(seed, n=5, count=None):
        out = tmp_path / f"r{seed}-{n}-{count}.html"
        write_report([shard], str(out), sample=n, seed=seed, count=count)
        return card_keys(out.read_text(encoding="utf-8"))

    a = keys(1)
    assert len(a) == 5 and a == keys(1) and a == sorted(a, key=lambda k: k.replace("evil", "s/0003"))
    assert keys(2) != a
    assert keys(1, n=100) == card_keys((tmp_path / "r1-100-None.html").read_text())
    assert len(keys(1, n=100)) == 40  # all of them, in order, when fewer than asked
    limited = keys(3, n=5, count=10)  # -c: only the first 10 samples are read, and chosen from
    assert len(limited) == 5 and all(k.startswith(("s/000", "evil")) for k in limited)


def test_reservoir_is_uniform_and_bounded():
    from collections import Counter

    hits: Counter[str] = Counter()
    members = [(f"k{i}", f, b"x", 0) for i in range(20) for f in ("a", "b")]
    for seed in range(3000):
        r = SampleReservoir(4, seed)
        assert list(r.watch(iter(members), "u")) == members  # passes every member through
        chosen = r.samples()
        assert len(chosen) == 4 and all(set(s) == {"__key__", "__url__", "a", "b"} for s in chosen)
        hits.update(s["__key__"] for s in chosen)
    expected = 3000 * 4 / 20
    assert all(abs(n - expected) < 0.15 * expected for n in hits.values()) and len(hits) == 20


def test_a_failure_leaves_nothing_under_the_final_name(tmp_path):
    good = write_tar(tmp_path / "good.tar", dataset(10))
    data = open(good, "rb").read()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: len(data) // 2 + 100])  # truncated inside a member
    out = tmp_path / "report.html"
    with pytest.raises(TarprocError, match="cut.tar"):
        write_report([good, str(cut)], str(out), sample=3)
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["cut.tar", "good.tar"]
    out.write_text("old")
    with pytest.raises(TarprocError):
        write_report([str(cut)], str(out))
    assert out.read_text() == "old"
    # skip-shard: the damaged shard is said, and the report is written with what was read
    said: list[str] = []
    info = write_report([good, str(cut)], str(out), sample=3, on_error="skip-shard", warn=said.append)
    assert info.samples >= 10 and len(said) == 1 and "cut.tar" in said[0]
    assert "damaged or unreadable" in out.read_text()


def test_bad_arguments():
    with pytest.raises(OptionError):
        write_report([], "x.html", sample=-1)


def test_video_gets_a_poster_frame(tmp_path):
    av = pytest.importorskip("av")
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        stream = c.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(5):
            for packet in stream.encode(av.VideoFrame.from_ndarray(np.full((48, 64, 3), 40 * i, np.uint8), format="rgb24")):
                c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    shard = write_tar(tmp_path / "v.tar", [{"__key__": "v1", "mp4": buf.getvalue()}, {"__key__": "v2", "mp4": b"nope"}])
    out = tmp_path / "r.html"
    write_report([shard], str(out))
    raw = out.read_text()
    page = Page(raw)
    imgs = page.all("img")
    assert len(imgs) == 1 and (imgs[0]["width"], imgs[0]["height"]) == ("64", "48")
    assert "mpeg4" in raw and "audio or video that cannot be read: 1" in raw


def test_charts_are_svg_with_escaped_labels():
    svg = svg_histogram([(0, 10, 3), (10, 20, 5)], "size <of> things", " B")
    assert svg.count("<rect") == 2 and "&lt;of&gt;" in svg and "<of>" not in svg
    bars = svg_bars([(EVIL, 4), ("b", 2)], "classes", 6)
    assert EVIL not in bars and bars.count("<rect") == 2 and "66.7%" in bars
    assert svg_histogram([], "x") == "" and svg_bars([], "x") == ""


def test_a_field_too_big_to_keep_is_described(tmp_path, monkeypatch):
    from tarproc.view import report

    monkeypatch.setattr(report, "MAX_KEEP", 1000)
    shard = write_tar(tmp_path / "big.tar", [{"__key__": "a", "bin": bytes(5000), "txt": b"small"}])
    out = tmp_path / "r.html"
    write_report([shard], str(out))
    text = "".join(Page(out.read_text()).text)
    assert "bin · 5,000 B" in text and "not shown" in text and "small" in text


def test_names_that_are_not_utf8_are_shown_escaped(tmp_path):
    # keys and field names read from the tar as bytes that are not UTF-8 (surrogate-escaped), and
    # JSON holding a lone surrogate: the page is valid UTF-8 and shows them escaped, not a failure
    shard = write_tar(tmp_path / "latin1.tar", [
        {"__key__": "caf\udce9", "t\udcffxt": b"hello", "json": b'{"k\\ud800": "\\udc80"}', "cls": b"1"},
        {"__key__": "plain", "txt": b"x", "cls": b"2"},
    ])
    out = tmp_path / "r.html"
    info = write_report([shard], str(out))
    assert info.cards == 2
    text = "".join(Page(out.read_bytes().decode("utf-8")).text)  # strict: valid UTF-8
    assert "caf\\udce9" in text and "t\\udcffxt" in text and "hello" in text


def test_metadata_members_are_not_samples(tmp_path):
    # the chosen samples are counted as the summary counts them: a __meta__/ member is no sample
    import tarfile

    shard = str(tmp_path / "meta.tar")
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as t:
        for name, data in [("__meta__/info.json", b"{}")] + [(f"s{i}.txt", f"t{i}".encode()) for i in range(6)]:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            t.addfile(member, io.BytesIO(data))
    out = tmp_path / "r.html"
    info = write_report([shard], str(out), sample=10)
    assert (info.samples, info.cards) == (6, 6)
    assert card_keys(out.read_text()) == [f"s{i}" for i in range(6)]
    info = write_report([shard], str(out), sample=3, count=3)  # -c 3: the first three samples, all chosen
    assert (info.samples, info.cards) == (3, 3) and card_keys(out.read_text()) == ["s0", "s1", "s2"]


def test_the_output_is_checked_before_reading(tmp_path):
    from tarproc.errors import SinkError

    shard = write_tar(tmp_path / "data.tar", dataset(8))
    before = open(shard, "rb").read()
    # a report that can't be written fails at once, before the (maybe long) read of the inputs
    with pytest.raises(SinkError, match="does not exist"):
        write_report([str(tmp_path / "not-there.tar")], str(tmp_path / "no" / "r.html"))
    # a report over one of its inputs (a slip of the hand) is refused: the shard is kept
    with pytest.raises(OptionError, match="data.tar"):
        write_report([shard], shard)
    with pytest.raises(OptionError, match="data.tar"):
        write_report([shard], str(tmp_path / "." / "data.tar"))
    assert open(shard, "rb").read() == before and sorted(os.listdir(tmp_path)) == ["data.tar"]


def test_capped_tallies_say_so(tmp_path, monkeypatch):
    from tarproc import content

    monkeypatch.setattr(content, "MAX_CLASSES", 5)
    monkeypatch.setattr(content, "MAX_JSON_KEYS", 4)
    shard = write_tar(tmp_path / "many.tar", [
        {"__key__": f"k{i}", "cls": str(i).encode(), "json": json.dumps({f"key{i}": i}).encode()} for i in range(40)])
    out = tmp_path / "r.html"
    write_report([shard], str(out), sample=1)
    text = "".join(Page(out.read_text()).text)
    assert "40 labels, more than 5 classes (35 labels not itemised)" in text
    assert "36 uses of keys not itemised: past the first 4 distinct keys" in text


def test_the_chosen_samples_are_kept_within_a_total(tmp_path, monkeypatch):
    # each field is under MAX_KEEP, but all the chosen samples together may hold at most MAX_KEPT_TOTAL
    from tarproc.view import report

    monkeypatch.setattr(report, "MAX_KEPT_TOTAL", 10_000)
    members = [(f"k{i}", "bin", bytes(3000), 0) for i in range(50)]
    r = report.SampleReservoir(8, seed=3)
    for _ in r.watch(iter(members), "u"):
        kept = sum(len(v) for _, s in r.chosen for v in s.values() if type(v) is bytes)
        assert kept <= 10_000 and kept == r.kept
    chosen = r.samples()
    assert len(chosen) == 8 and sum(type(s["bin"]) is bytes for s in chosen) <= 3
    assert all(isinstance(s["bin"], (bytes, report.TooBig)) for s in chosen)
    shard = write_tar(tmp_path / "big.tar", [{"__key__": f"k{i}", "bin": bytes(3000)} for i in range(10)])
    out = tmp_path / "r.html"
    write_report([shard], str(out), sample=10)
    assert "not shown" in "".join(Page(out.read_text()).text)


def test_a_size_chart_spans_the_field_from_its_reservoir(monkeypatch):
    # once a field's sizes are a reservoir sample, its chart still runs from the field's min to max
    from tarproc import show
    from tarproc.view.report import size_distribution

    monkeypatch.setattr(show, "RESERVOIR", 10)
    monkeypatch.setattr(show, "DISTINCT_SIZES", 4)
    s = show.Summary(content=False)
    sizes = [100 + i for i in range(1000)]
    sizes[500] = 5000  # one outlier, almost surely not in a reservoir of 10
    s.add_members([(f"k{i:05d}", "bin", bytes(n), i) for i, n in enumerate(sizes)], "x")
    s.finish()
    fs = s.fields["bin"]
    assert len(fs.sizes) == 10 and 5000 not in fs.sizes
    bins = size_distribution(fs).histogram()
    assert (bins[0][0], bins[-1][1]) == (100, 5000) and sum(n for _, _, n in bins) == 1000


def test_text_that_starts_like_an_image_is_shown_as_text(tmp_path):
    shard = write_tar(tmp_path / "bm.tar", [{"__key__": "a", "desc": b"BMW makes cars"}])
    out = tmp_path / "r.html"
    write_report([shard], str(out))
    page = Page(out.read_text())
    assert "BMW makes cars" in "".join(page.text) and not page.all("img")


def test_json_nested_too_deep_is_shown_as_text(tmp_path):
    deep = b"[" * 100_000 + b"]" * 100_000
    shard = write_tar(tmp_path / "deep.tar", [{"__key__": "a", "json": deep, "data": deep}])
    out = tmp_path / "r.html"
    info = write_report([shard], str(out))
    assert info.cards == 1 and "JSON that does not parse: 1" in out.read_text()


def test_a_damaged_image_on_a_card_warns_nothing(tmp_path):
    import warnings

    shard = write_tar(tmp_path / "tiff.tar", [{"__key__": f"k{i}", "note": b"MM\x00* not tiff"} for i in range(2)])
    out = tmp_path / "r.html"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_report([shard], str(out))
    assert [str(w.message) for w in caught] == []  # the card says what is wrong; nothing on stderr
    assert len(Page(out.read_text()).all("span")) >= 2


def test_audio_in_a_video_container_gets_a_player(tmp_path):
    # AAC in an .mp4 (or Opus in a .webm): the card plays it, rather than saying it has no picture
    pytest.importorskip("av")
    from mediahelpers import encode_audio

    shard = write_tar(tmp_path / "a.tar", [{"__key__": "a", "mp4": encode_audio("m4a", seconds=0.5)}])
    out = tmp_path / "r.html"
    write_report([shard], str(out))
    page = Page(out.read_text())
    audios = page.all("audio")
    assert len(audios) == 1 and audios[0]["src"].startswith("data:audio/mp4;base64,")
    assert not page.all("img") and "aac" in "".join(page.text)


# ---------------------------------------------------------------------------------------------
# problems first, with cards (issue 35)


def test_problems_come_first_with_a_card_per_damaged_sample(tmp_path):
    from damaged import PLANTED, planted_samples

    shard = write_tar(tmp_path / "planted.tar", planted_samples())
    out = tmp_path / "r.html"
    names = ["cat", "dog", "bird", "fish", "frog"]
    info = write_report([shard], str(out), sample=3, decode=2, classes=names)
    assert info.problem_cards == len(PLANTED) and info.cards == 3
    text = out.read_text(encoding="utf-8")
    problems, rest = text.split('<h2 id="samples">')
    assert '<h2 id="problems">' in problems and "<svg" not in problems  # before the charts
    assert problems.count('class="card"') == len(PLANTED)
    assert card_keys(text) and set(card_keys(text)) <= {f"s/{i:04d}" for i in range(47)}
    for key in PLANTED:
        assert f"--key {key} -f" in problems
    assert "libjpeg: Corrupt JPEG data" in problems and "fields that fail to decode (--decode): 4" in problems
    assert "<title>3 (fish): " in rest  # the class chart names the classes
    assert '<span class="label">3 (fish)</span>' in problems  # s/0003's card: cls 3


def test_a_problem_found_after_its_sample_is_gone_shows_the_field_alone(monkeypatch):
    from tarproc.view import report

    monkeypatch.setattr(report, "RECENT_SAMPLES", 1)
    keeper = report.ProblemSamples(limit=2)
    members = [(f"k{i}", field, f"{field}{i}".encode(), 0) for i in range(5) for field in ("txt", "cls")]
    assert list(keeper.watch(members, "x.tar")) == members
    keeper.note("decode_failures", "x.tar", "k1", "txt", "bad", b"txt1")  # k1 is gone: only k3 and k4 are kept
    keeper.note("decode_failures", "x.tar", "k4", "txt", "bad too", b"txt4")
    keeper.note("missing", "x.tar", "k0", "json", "no json field", None)  # not confirmed at the end: no card
    keeper.note("decode_failures", "x.tar", "k3", "cls", "worse", b"cls3")  # past the limit of cards: counted
    doc = {"missing": {}, "content": {"problems": {"decode_failures": {}}}}
    cards, more = keeper.cards(doc)
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__")), p) for s, p in cards] == [
        ("k1", ["txt"], [("decode_failures", "txt", "bad")]),
        ("k4", ["cls", "txt"], [("decode_failures", "txt", "bad too")]),
    ]
    assert more == 1
    keeper.note("decode_failures", "x.tar", "k2", "cls", "past 2 * limit kept: in k0's place", b"cls2")
    assert ("x.tar", "k2") in keeper.kept and ("x.tar", "k0") in keeper.more  # k0: a missing field only
    assert keeper.cards(doc)[1] == 2  # k3 and k2; k0's problem is not confirmed
    keeper.note("decode_failures", "x.tar", "k1", "cls", "not in the way", b"cls1")
    keeper.note("decode_failures", "x.tar", "k5", "cls", "past 2 * limit kept", b"cls5")
    assert keeper.cards(doc)[1] == 3 and ("x.tar", "k5") in keeper.more


def test_damage_gets_a_card_among_many_samples_with_a_missing_or_rare_field(tmp_path):
    # an ImageNet-like tree: a few PNGs among the JPEGs (png a rare field, not a problem), then
    # 60 samples without cls (a problem, but less than damage), then a JPEG cut short: the cut JPEG
    # has a card, the missing cls cards pull out a field the sample has, and "more" counts the
    # samples with a confirmed problem only
    from damaged import jpeg_bytes, png_bytes

    good = jpeg_bytes(1)
    samples = [{"__key__": f"s{i:03d}", "jpg": good, "cls": b"1"} for i in range(300)]
    for i in range(0, 300, 20):
        samples[i] = {"__key__": f"s{i:03d}", "png": png_bytes(i), "cls": b"2"}  # they lack jpg, a problem too
    for i in range(101, 221, 2):
        del samples[i]["cls"]
    samples[250]["jpg"] = good[: len(good) // 3]
    shard = write_tar(tmp_path / "s.tar", samples)
    out = tmp_path / "r.html"
    info = write_report([shard], str(out), sample=0)
    problems = out.read_text(encoding="utf-8").split('<h2 id="samples">')[0]
    assert info.problem_cards == 24
    assert problems.index("--key s250 -f jpg") < problems.index("--key s101")  # damage first
    assert "--key s101 -f jpg<" in problems and "--key s101 -f cls" not in problems
    # 60 + 15 + 1 - 24, less s000: read before any jpg, it is not known then to lack one
    assert "51 more samples with problems not shown as cards" in problems
