"""tarproc.show: field previews and the whole-stream summary (lint)."""

from __future__ import annotations

import io
import json
import statistics

import pytest

from tarproc import show
from tarproc.errors import TarFormatError
from tarproc.show import Summary, format_record, label_of, preview_field, sample_record, summarize
from tarproc.stages import parse_fields
from tarproc.tar import TarWriter, iter_keyed_members


def tar(samples=(), members=()) -> bytes:
    buf = io.BytesIO()
    with TarWriter(buf) as w:
        for s in samples:
            w.write_sample(s)
        for name, data in members:
            w.add(name, data)
    return buf.getvalue()


def summary_of(data: bytes, url: str = "x.tar", content: bool = False) -> Summary:
    """The summary of a tar in memory; byte sizes only unless ``content`` (the lint tests use fake media)."""
    s = Summary(content=content)
    s.add_members(iter_keyed_members(io.BytesIO(data), url, stats=s.stats), url)
    s.finish()
    return s


# ---------------------------------------------------------------------------------------------
# previews


def test_text_preview_is_cut_to_width_with_an_ellipsis():
    p = preview_field(b"abcdefghij" * 10, width=8)
    assert p == {"size": 100, "type": "text", "preview": "abcdefg…", "truncated": True}
    assert preview_field(b"short", width=8) == {"size": 5, "type": "text", "preview": "short"}
    assert preview_field(b"x" * 500, width=0)["preview"] == "x" * 500  # 0 = no limit


def test_json_preview_is_compact_and_keeps_unicode():
    p = preview_field(b'{\n  "label": "chat noir",\n  "n": [1, 2]\n}')
    assert p["type"] == "json" and p["preview"] == '{"label":"chat noir","n":[1,2]}'
    assert preview_field('{"é": "ü"}'.encode())["preview"] == '{"é":"ü"}'


def test_control_characters_are_escaped_never_printed():
    # text with an ANSI escape is not text to sniff_type: it is shown as [binary], never printed
    assert preview_field(b"red \x1b[31mALERT\x1b[0m") == {"size": 18, "type": "binary"}
    # newlines, tabs and invisible format characters (a right-to-left override) are escaped
    p = preview_field("a\nb\tc\u202eevil".encode(), width=0)
    assert p == {"size": 12, "type": "text", "preview": "a\\nb\\tc\\u202eevil"}


def test_binary_fields_show_type_and_size_only():
    assert preview_field(b"\xff\xd8\xff\xe0" + bytes(100)) == {"size": 104, "type": "jpeg"}
    assert preview_field(b"\x93NUMPY" + bytes(50)) == {"size": 56, "type": "npy"}
    assert preview_field(bytes(range(256))) == {"size": 256, "type": "binary"}
    assert preview_field(b"") == {"size": 0, "type": "empty", "preview": ""}


def test_multibyte_text_cut_by_the_byte_limit_does_not_show_garbage():
    p = preview_field(("é" * 400).encode(), width=20)
    assert p["preview"] == "é" * 19 + "…"
    assert "\ufffd" not in p["preview"]


def test_sample_record_and_text_format():
    sample = {"__key__": "a/1", "__url__": "s.tar", "jpg": b"\x89PNG\r\n\x1a\n" + bytes(8), "cls": b"7\n"}
    rec = sample_record(sample)
    assert list(rec["fields"]) == ["cls", "jpg"]  # sorted
    assert format_record(rec).splitlines() == ["__key__\ta/1", "__url__\ts.tar", "cls\t2\t7\\n", "jpg\t16\t[png]"]
    json.dumps(rec)  # JSON-ready


def test_field_spec_picks_first_present_alternative_in_spec_order():
    sample = {"__key__": "k", "png": b"\x89PNG\r\n\x1a\n", "cls": b"1", "txt": b"t"}
    rec = sample_record(sample, parse_fields("txt jpg,png nothere"))
    assert list(rec["fields"]) == ["txt", "png"]


def test_keys_with_control_characters_are_escaped():
    rec = sample_record({"__key__": "a\x1b]0;x\x07", "cls": b"1"})
    assert "\x1b" not in format_record(rec) and "\x07" not in format_record(rec)


def test_label_from_cls_or_json():
    assert label_of({"cls": b"  12\n"}) == "12"
    assert label_of({"json": b'{"caption": "a dog", "x": 1}'}) == "a dog"
    assert label_of({"json": b"[1, 2]"}) is None
    assert label_of({"jpg": b"\xff\xd8\xff"}) is None


# ---------------------------------------------------------------------------------------------
# summary


def test_summary_counts_fields_and_sizes():
    samples = [{"__key__": f"s{i:03d}", "txt": b"x" * (10 + i), "cls": b"%d" % (i % 10)} for i in range(15)]
    s = summary_of(tar(samples))
    d = s.as_dict()
    assert (d["samples"], d["members"], d["shards"]) == (15, 30, 0)  # add_members alone counts no shards
    assert d["bytes"] == sum(10 + i for i in range(15)) + 15
    f = d["fields"]["txt"]
    assert (f["samples"], f["min"], f["median"], f["max"], f["median_exact"]) == (15, 10, 17.0, 24, True)
    assert d["missing"] == {} and d["non_adjacent_keys"]["count"] == 0
    assert "no problems found" in s.format_text()


def test_summary_reports_samples_missing_a_common_field():
    samples = [{"__key__": f"s{i}", "jpg": b"\xff\xd8\xff", "cls": b"1"} for i in range(5)]
    del samples[3]["jpg"]
    s = summary_of(tar(samples))
    assert s.missing() == {"jpg": {"count": 1, "examples": ["s3"], "command": "tarfirst x.tar --key s3 -f cls"}}
    assert "jpg: 1 sample (e.g. 's3')" in s.format_text()


def test_summary_counts_what_reading_rejects_or_hides():
    members = [
        ("a.jpg", b"1"), ("a.cls", b"1"),
        ("b.jpg", b"22"), ("b.jpg", b"33"),          # a field twice in one sample
        ("a.txt", b"late"),                           # key 'a' reappears after 'b'
        ("README", b"no key"), ("dir/.hidden", b"x"),  # names without a key
        ("__meta__/info.json", b"{}"),                # metadata
        ("Track 2.0.mp3", b"ID3"), ("model.v2.jpg", b"x"),  # dotted names split surprisingly
    ]
    s = summary_of(tar(members=members))
    d = s.as_dict()
    assert d["non_adjacent_keys"]["count"] == 1
    assert d["non_adjacent_keys"]["examples"][0]["key"] == "a"
    assert d["non_adjacent_keys"]["examples"][0]["first_offset"] == 0
    assert d["duplicate_fields"]["count"] == 1
    dup = d["duplicate_fields"]["examples"][0]
    assert (dup["key"], dup["field"], dup["first_offset"], dup["offset"]) == ("b", "jpg", 2048, 3072)
    assert d["names_without_key"] == {"count": 2, "examples": ["README", "dir/.hidden"]}
    assert d["metadata_members"] == 1
    reasons = {(x["field"], x["reason"]): (x["count"], x["examples"]) for x in d["surprising_names"]}
    assert reasons[("0.mp3", "a number was split at its dot")] == (1, ["Track 2.0.mp3"])
    assert reasons[("v2.jpg", "a version-like part became part of the field")] == (1, ["model.v2.jpg"])
    assert d["members"] == 10 and d["samples"] == 5  # a, b, a again, Track 2, model
    text = s.format_text()
    assert "reappear" in text and "twice in one sample" in text and "'README'" in text
    assert "field '0.mp3': 1 sample, a number was split at its dot (e.g. 'Track 2.0.mp3')" in text


def test_rare_fields_are_listed():
    samples = [{"__key__": f"s{i:02d}", "cls": b"1"} for i in range(30)]
    samples[7]["seg.png"] = b"\x89PNG\r\n\x1a\n"
    assert summary_of(tar(samples)).rare_fields() == {"seg.png": 1}


def test_median_is_exact_from_a_histogram_while_sizes_repeat():
    s = Summary()
    s.add_members([(f"k{i:06d}", "cls", b"x" * (1 + i % 3), i) for i in range(50_001)], "x")
    s.finish()
    fs = s.fields["cls"]
    assert fs.sizes == [] and len(fs.hist) == 3  # memory: one entry per distinct size
    assert fs.median() == statistics.median(1 + i % 3 for i in range(50_001))
    assert s.as_dict()["fields"]["cls"]["median_exact"] is True


def test_median_uses_a_bounded_reservoir(monkeypatch):
    monkeypatch.setattr(show, "RESERVOIR", 100)
    monkeypatch.setattr(show, "DISTINCT_SIZES", 20)
    monkeypatch.setattr(show, "FLUSH_EVERY", 64)
    s = Summary()
    # a few repeated sizes first (histogram), then many distinct ones (switch to the reservoir)
    sizes = [5] * 300 + [i % 1000 for i in range(20_000)]
    s.add_members([(f"k{i:05d}", "bin", bytes(n), i) for i, n in enumerate(sizes)], "x")
    s.finish()
    fs = s.fields["bin"]
    assert fs.hist is None and len(fs.sizes) == 100  # memory does not grow with the stream
    assert (fs.min, fs.max, fs.samples, fs.bytes) == (0, 999, 20_300, sum(sizes))
    assert abs(fs.median() - statistics.median(sizes)) < 150  # an estimate
    assert s.as_dict()["fields"]["bin"]["median_exact"] is False


def test_reservoir_is_a_uniform_sample(monkeypatch):
    monkeypatch.setattr(show, "DISTINCT_SIZES", 0)
    monkeypatch.setattr(show, "RESERVOIR", 1000)
    s = Summary(seed=3)
    # size 0 in the first half, 1..n in the second: about half the reservoir should be zeros
    s.add_members([(f"k{i:06d}", "x", bytes(0 if i < 20_000 else 1 + i % 7), i) for i in range(40_000)], "x")
    s.finish()
    zeros = s.fields["x"].sizes.count(0)
    assert 430 < zeros < 570


def test_field_count_is_bounded(monkeypatch):
    monkeypatch.setattr(show, "MAX_FIELDS", 3)
    s = Summary()
    s.add_members([("k", f"f{i}", b"x", i) for i in range(10)], "x")
    s.finish()
    assert len(s.fields) == 3 and s.other_fields == 7


def test_count_stops_before_the_next_sample():
    s = Summary()
    s.add_members([(f"k{i}", f, b"x", i) for i in range(10) for f in ("a", "b")], "x", count=4)
    s.finish()
    assert s.samples == 4 and s.stopped_early and s.fields["b"].samples == 4


def test_summarize_damaged_shard_reports_up_to_the_damage(tmp_path):
    good = tar([{"__key__": f"s{i}", "txt": b"t" * 600} for i in range(4)])
    damaged = tmp_path / "bad.tar"
    damaged.write_bytes(good[: 1536 * 3 + 512 + 100])  # each member is 1536 bytes: cut inside the 4th one's data
    acc = Summary()
    with pytest.raises(TarFormatError) as e:
        summarize([str(damaged)], summary=acc)
    assert e.value.url == str(damaged) and e.value.offset > 0
    assert "truncated" in e.value.reason and e.value.member == "s3.txt"
    assert acc.samples == 3 and acc.stats.shards_failed == 1
    assert str(e.value) in acc.as_dict()["errors"]


def test_summarize_skip_shard_goes_on(tmp_path):
    good = tar([{"__key__": f"s{i}", "txt": b"t"} for i in range(4)])
    (tmp_path / "a.tar").write_bytes(good)
    (tmp_path / "b.tar").write_bytes(b"garbage" * 100)
    (tmp_path / "c.tar").write_bytes(good)
    warnings: list[str] = []
    urls = [str(tmp_path / n) for n in ("a.tar", "b.tar", "c.tar")]
    s = summarize(urls, on_error="skip-shard", warn=warnings.append)
    assert s.samples == 8 and s.stats.shards == 3 and s.stats.shards_failed == 1
    assert len(warnings) == 1 and "b.tar" in warnings[0]
    assert "damaged or unreadable: " in s.format_text()


def test_keys_reappearing_in_another_shard_are_not_flagged(tmp_path):
    data = tar([{"__key__": "a", "txt": b"1"}, {"__key__": "b", "txt": b"2"}])
    (tmp_path / "a.tar").write_bytes(data)
    s = summarize([str(tmp_path / "a.tar")] * 2)
    assert s.non_adjacent == 0 and s.samples == 4


def test_a_name_without_a_key_first_in_the_shard():
    s = summary_of(tar(members=[("README", b"x"), ("a.txt", b"1"), ("NOTES", b"y"), ("a.cls", b"2")]))
    assert s.stats.no_key_count == 2 and s.samples == 1 and s.fields["cls"].samples == 1


# ---------------------------------------------------------------------------------------------
# issue 14: the problems --strict fails on, and JSON for names that are not UTF-8


def test_problems_are_exactly_what_the_report_lists():
    clean = [{"__key__": f"s{i:03d}", "txt": b"x", "cls": b"1"} for i in range(25)]
    assert summary_of(tar(clean)).problems() == []
    rare = clean + [{"__key__": "t", "txt": b"x", "cls": b"1", "seg": b"s"}]
    members = [("a.jpg", b"1"), ("b.jpg", b"2"), ("b.jpg", b"3"), ("a.cls", b"4"), ("README", b"r"),
               ("Track 2.0.mp3", b"ID3")]
    missing = [{"__key__": f"m{i}", "jpg": b"j", "cls": b"1"} for i in range(4)] + [{"__key__": "z", "cls": b"2"}]
    cases = {
        "rare": (tar(rare), ["fields in under 10% of samples (seg: 1)"]),
        "lint": (tar(members=members), ["keys that reappear after other keys: 1", "fields twice in one sample: 1",
                                        "names without a key: 1", "dotted names that split surprisingly: 1"]),
        "missing": (tar(missing), ["samples missing a field most samples have (jpg: 1)"]),
    }
    for name, (data, expected) in cases.items():
        s = summary_of(data)
        found = [p for p in s.problems() if not p.startswith("samples missing") or name == "missing"]
        assert found == expected, name
        assert "no problems found" not in s.format_text()
        assert s.as_dict()["problems"] == s.problems()


def test_json_text_is_valid_utf8_and_gives_the_bytes_back():
    raw = "привет".encode("koi8-r")
    name = raw.decode("utf-8", "surrogateescape")  # how tario reads a name that is not UTF-8
    text = show.json_text({"__key__": name, "ok": "ёж", "q": 'a"\\'})
    text.encode("utf-8")  # strict: no lone surrogate left
    assert "ёж" in text and "\\udcd0" in text  # UTF-8 stays as it is; byte 0xd0 is \udcd0
    doc = json.loads(text)
    assert doc["__key__"].encode("utf-8", "surrogateescape") == raw and doc["q"] == 'a"\\'


def test_a_version_part_with_an_underscore_is_surprising_too():
    """``bird.v2_0001.jpg`` (key ``bird``, field ``v2_0001.jpg``): a new user's, missed before."""
    d = summary_of(tar(members=[("bird.v2_0001.jpg", b"x"), ("bird.v2_0002.jpg", b"y"), ("cat.seg.png", b"z")])).as_dict()
    fields = {x["field"]: x["reason"] for x in d["surprising_names"]}
    assert fields == {"v2_0001.jpg": "a version-like part became part of the field",
                      "v2_0002.jpg": "a version-like part became part of the field"}


# ---------------------------------------------------------------------------------------------
# issue 27: what the fields hold (content statistics)


def image_bytes(size=(40, 30), fmt="JPEG", mode="RGB") -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new(mode, size, 128 if mode == "L" else (10, 200, 30, 255)[: len(mode)]).save(buf, fmt)
    return buf.getvalue()


def wav_bytes(seconds: float, rate: int = 16000, channels: int = 1) -> bytes:
    import struct

    data = bytes(int(seconds * rate) * 2 * channels)
    fmt = struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * 2 * channels, 2 * channels, 16)
    return b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + fmt + b"data" + struct.pack("<I", len(data)) + data


def content_of(samples, url="x.tar"):
    s = summary_of(tar(samples), url, content=True)
    return s, s.as_dict()


def test_image_formats_sizes_modes_and_extensions_that_lie():
    samples = [{"__key__": f"s{i}", "jpg": image_bytes((100 + i, 50))} for i in range(5)]
    samples.append({"__key__": "png-named-jpg", "jpg": image_bytes((64, 64), "PNG", "RGBA")})
    samples.append({"__key__": "grey", "jpg": image_bytes((10, 20), mode="L")})
    samples.append({"__key__": "broken", "jpg": b"\xff\xd8\xff\xe0" + b"broken" * 5})
    samples.append({"__key__": "not-an-image", "jpg": b"hello there"})
    s, d = content_of(samples)
    im = d["content"]["fields"]["jpg"]["image"]
    assert im["count"] == 9 and im["undecodable"] == 2
    assert im["formats"]["counts"] == {"jpeg": 7, "png": 1}
    assert im["extension_mismatch"] == {"png named .jpg": 1}
    assert (im["width"]["min"], im["width"]["median"], im["width"]["max"]) == (10, 101, 104)
    assert (im["height"]["min"], im["height"]["max"]) == (20, 64) and im["height"]["median_exact"]
    assert im["modes"]["counts"] == {"RGB": 5, "RGBA": 1, "L": 1}
    assert im["channels"]["counts"] == {"3": 5, "4": 1, "1": 1}
    problems = d["content"]["problems"]
    assert problems["extension_mismatch"]["count"] == 1
    example = problems["extension_mismatch"]["examples"][0]
    assert example["command"] == "tarfirst x.tar --key png-named-jpg -f jpg" and "PNG" in example["reason"]
    bad = problems["undecodable_images"]
    assert bad["count"] == 2 and [e["key"] for e in bad["examples"]] == ["broken", "not-an-image"]
    assert "images whose header cannot be read: 2" in s.problems()
    text = s.format_text()
    assert "png named .jpg: 1" in text and "tarfirst x.tar --key broken -f jpg" in text
    assert "no problems found" not in text


def test_a_png_named_png_and_a_jpeg_named_jpeg_are_no_problem():
    s, d = content_of([{"__key__": "a", "png": image_bytes(fmt="PNG"), "jpeg": image_bytes()}])
    assert d["content"]["problems"] == {} and s.problems() == []
    assert "no problems found" in s.format_text()


def test_text_lengths_empty_and_not_utf8():
    texts = ["", "  \n", "héllo", "a" * 100, "ünïcödé"]
    samples = [{"__key__": f"t{i}", "txt": t.encode()} for i, t in enumerate(texts)]
    samples.append({"__key__": "koi8", "txt": "привет".encode("koi8-r")})
    s, d = content_of(samples)
    t = d["content"]["fields"]["txt"]["text"]
    assert (t["count"], t["empty"], t["non_utf8"]) == (6, 2, 1)
    assert (t["length"]["min"], t["length"]["median"], t["length"]["max"]) == (0, 5, 100)  # characters, not bytes
    example = d["content"]["problems"]["non_utf8_text"]["examples"][0]
    assert example["key"] == "koi8" and example["command"] == "tarfirst x.tar --key koi8 -f txt"
    assert "text that is not UTF-8: 1" in s.problems()


def test_json_key_coverage_value_types_and_problems():
    docs = [{"url": f"u{i}", "caption": f"c{i}", "width": 10 * i} for i in range(8)]
    docs[2]["caption"] = None
    del docs[5]["caption"]
    docs[6]["rare"] = [1]
    samples = [{"__key__": f"j{i}", "json": json.dumps(doc).encode()} for i, doc in enumerate(docs)]
    samples.append({"__key__": "bad", "json": b'{"url": '})
    samples.append({"__key__": "list", "json": b"[1, 2]"})
    s, d = content_of(samples)
    j = d["content"]["fields"]["json"]["json"]
    assert (j["count"], j["objects"], j["invalid"]) == (10, 8, 1)
    assert j["keys"]["url"] == {"count": 8, "types": {"string": 8}}
    assert j["keys"]["caption"] == {"count": 7, "types": {"string": 6, "null": 1}}
    assert j["keys"]["width"]["types"] == {"integer": 8} and j["keys"]["rare"]["count"] == 1
    assert j["other_top_level"]["counts"] == {"array": 1}
    p = d["content"]["problems"]
    assert p["invalid_json"]["examples"][0]["key"] == "bad"
    # caption is in 7 of 8 documents: the one lacking it is named; "rare" (1 of 8) is no problem
    missing = p["json_missing_keys"]
    assert missing["count"] == 1 and missing["examples"][0]["key"] == "j5"
    assert missing["examples"][0]["reason"] == "no key 'caption'"
    assert "caption" in s.format_text()


def test_label_histogram():
    samples = [{"__key__": f"k{i}", "cls": str(i % 3).encode() + b"\n"} for i in range(10)]
    _, d = content_of(samples)
    labels = d["content"]["fields"]["cls"]["labels"]
    assert labels["counts"] == {"0": 4, "1": 3, "2": 3} and labels["distinct"] == 3 and labels["count"] == 10


def test_audio_statistics_and_undecodable_audio():
    samples = [{"__key__": f"a{i}", "wav": wav_bytes(0.5 * (i + 1), rate=16000 if i < 3 else 8000)} for i in range(4)]
    samples.append({"__key__": "cut", "wav": b"RIFF\x00\x00\x00\x00WAVEfmt "})
    s, d = content_of(samples)
    f = d["content"]["fields"]["wav"]
    a = f["audio"]
    assert a["count"] == 4 and a["codecs"]["counts"] == {"pcm_s16le": 4}
    assert (a["duration"]["min"], a["duration"]["max"]) == (0.5, 2.0)
    assert a["sample_rates"]["counts"] == {"16000": 3, "8000": 1} and a["channels"]["counts"] == {"1": 4}
    assert f["media"]["undecodable"] == 1
    assert d["content"]["problems"]["undecodable_media"]["examples"][0]["command"] == "tarfirst x.tar --key cut -f wav"
    assert "duration    min 0.5 s" in s.format_text()


def test_video_statistics():
    av = pytest.importorskip("av")
    import numpy as np

    buf = io.BytesIO()
    with av.open(buf, "w", format="mp4") as c:
        stream = c.add_stream("mpeg4", rate=10)
        stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
        for i in range(10):
            frame = av.VideoFrame.from_ndarray(np.full((48, 64, 3), 20 * i, np.uint8), format="rgb24")
            for packet in stream.encode(frame):
                c.mux(packet)
        for packet in stream.encode():
            c.mux(packet)
    _, d = content_of([{"__key__": "v", "mp4": buf.getvalue()}])
    v = d["content"]["fields"]["mp4"]["video"]
    assert v["codecs"]["counts"] == {"mpeg4": 1} and v["resolutions"]["counts"] == {"64x48": 1}
    assert v["fps"]["counts"] == {"10": 1} and v["duration"]["max"] == pytest.approx(1.0)


def test_content_statistics_can_be_left_out():
    s = summary_of(tar([{"__key__": "a", "jpg": b"not a jpeg"}]), content=False)
    assert s.as_dict()["content"] is None and s.problems() == []
    assert "content" not in s.format_text()


def test_distributions_stay_bounded_and_their_median_close():
    from tarproc import content

    d = content.Distribution()
    values = [1.0 + (i * 7919 % 100_003) / 7.0 for i in range(200_000)]  # 100,003 distinct values
    for v in values:
        d.add(v)
    assert not d.exact and d.values is None
    assert len(d.buckets) <= content.LOG_STEPS * 20  # log-spaced: a bounded number of buckets
    true_median = statistics.median(values)
    assert abs(d.median() - true_median) / true_median < 0.03
    assert (d.min, d.max, d.count) == (min(values), max(values), 200_000)
    bins = d.histogram()
    assert len(bins) == content.CHART_BINS and sum(n for _, _, n in bins) == 200_000
    assert d.as_dict()["median_exact"] is False


def test_name_tallies_are_bounded():
    from tarproc import content

    samples = [{"__key__": f"k{i}", "cls": str(i).encode(), "json": json.dumps({f"key{i}": i}).encode()}
               for i in range(content.MAX_CLASSES + 50)]
    _, d = content_of(samples)
    labels = d["content"]["fields"]["cls"]["labels"]
    assert labels["distinct"] == content.MAX_CLASSES and labels["other"] == 50
    j = d["content"]["fields"]["json"]["json"]
    assert len(j["keys"]) == content.MAX_JSON_KEYS and j["other_keys"] == content.MAX_CLASSES + 50 - content.MAX_JSON_KEYS


def test_problem_commands_quote_odd_keys_and_urls():
    s, d = content_of([{"__key__": "it's a key", "txt": b"\xff"}], url="my shards/a.tar")
    assert d["content"]["problems"]["non_utf8_text"]["examples"][0]["command"] == (
        "tarfirst 'my shards/a.tar' --key 'it'\"'\"'s a key' -f txt")


def test_one_sample_is_singular():
    samples = [{"__key__": f"s{i}", "txt": b"x", "cls": b"1"} for i in range(4)] + [{"__key__": "z", "cls": b"1"}]
    text = summary_of(tar(samples)).format_text()
    assert "txt: 1 sample (e.g. 'z')" in text and "1 samples" not in text


def test_jpeg_and_png_headers_agree_with_pillow():
    from PIL import Image

    from tarproc.content import jpeg_header, png_header

    cases = []
    for mode in ("L", "RGB", "CMYK"):
        for kw in ({}, {"progressive": True}, {"quality": 20, "optimize": True}):
            buf = io.BytesIO()
            Image.new(mode, (37, 21)).save(buf, "JPEG", **kw)
            cases.append((jpeg_header, buf.getvalue()))
    for mode in ("L", "RGB", "RGBA", "P", "LA", "1", "I;16"):
        buf = io.BytesIO()
        Image.new(mode, (19, 33)).save(buf, "PNG")
        cases.append((png_header, buf.getvalue()))
    for read, data in cases:
        with Image.open(io.BytesIO(data)) as img:
            assert read(data) == (img.width, img.height, img.mode, len(img.getbands())), img.mode
        for cut in range(0, min(len(data), 400), 7):  # cut anywhere: None, never an exception
            found = read(data[:cut])
            assert found is None or found[:2] == (img.width, img.height)
    assert jpeg_header(b"\xff\xd8\xff\xe0broken") is None and png_header(b"\x89PNG\r\n\x1a\n" + bytes(30)) is None


def test_a_json_key_first_seen_late_still_names_the_documents_lacking_it():
    # "caption" is in 5 of 7 documents but not in the first two: those two are the examples
    docs = [{"url": "a"}, {"url": "b"}] + [{"url": f"u{i}", "caption": "c"} for i in range(5)]
    samples = [{"__key__": f"j{i}", "json": json.dumps(doc).encode()} for i, doc in enumerate(docs)]
    s, d = content_of(samples)
    missing = d["content"]["problems"]["json_missing_keys"]
    assert missing["count"] == 2 and [e["key"] for e in missing["examples"]] == ["j0", "j1"]
    assert "tarfirst x.tar --key j0 -f json" in s.format_text()


def test_capped_tallies_say_so_in_the_text(monkeypatch):
    from tarproc import content

    monkeypatch.setattr(content, "MAX_CLASSES", 5)
    monkeypatch.setattr(content, "MAX_JSON_KEYS", 4)
    samples = [{"__key__": f"k{i}", "cls": str(i).encode(), "json": json.dumps({f"key{i}": i}).encode()}
               for i in range(40)]
    s, d = content_of(samples)
    assert d["content"]["fields"]["json"]["json"]["other_keys"] == 36
    text = s.format_text()
    assert "40 labels, more than 5 classes (35 labels not itemised)" in text
    assert "36 uses of keys not itemised: past the first 4 distinct keys" in text
    assert "lists them all" not in text


def test_missing_json_keys_are_counted_per_key_and_said_so():
    docs = [{"a": 1, "b": 2}] * 4 + [{}]  # one document lacks both keys: two misses
    s, d = content_of([{"__key__": f"j{i}", "json": json.dumps(doc).encode()} for i, doc in enumerate(docs)])
    assert d["content"]["problems"]["json_missing_keys"]["count"] == 2
    assert "keys most JSON documents have, missing from others: 2" in s.problems()


def test_content_knows_the_media_extensions_decode_knows():
    # content.py keeps its own copy (importing tarproc.decode would bring numpy into tarshow --summary)
    from tarproc import content
    from tarproc.decode import media

    assert content.AUDIO_EXTENSIONS == media.AUDIO_EXTENSIONS and content.VIDEO_EXTENSIONS == media.VIDEO_EXTENSIONS
    assert show.IMAGE_TYPES is content.IMAGE_TYPES


def test_text_that_starts_like_an_image_is_text_and_header_reads_warn_nothing():
    import warnings

    samples = [{"__key__": f"k{i}", "desc": b"BMW makes cars", "note": b"MM\x00* not tiff"} for i in range(3)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        s, d = content_of(samples)
    assert [str(w.message) for w in caught] == []  # Pillow's complaints about a broken TIFF stay inside
    desc = d["content"]["fields"]["desc"]
    assert desc["kinds"] == {"text": 3} and "image" not in desc
    bad = d["content"]["problems"]["undecodable_images"]
    assert bad["count"] == 3 and {e["field"] for e in bad["examples"]} == {"note"}


DEEP_JSON = b"[" * 100_000 + b"]" * 100_000  # valid JSON that Python's parser can't nest so deep


def test_json_nested_too_deep_is_a_problem_not_a_crash():
    assert preview_field(DEEP_JSON)["type"] == "text"
    assert label_of({"__key__": "a", "json": b'{"label": ' + DEEP_JSON + b"}"}) is None
    s, d = content_of([{"__key__": "deep", "json": DEEP_JSON, "txt": b"x"}, {"__key__": "ok", "json": b"{}"}])
    j = d["content"]["fields"]["json"]["json"]
    assert (j["count"], j["objects"], j["invalid"]) == (2, 1, 1)
    example = d["content"]["problems"]["invalid_json"]["examples"][0]
    assert example["key"] == "deep" and "nested too deep" in example["reason"]


def test_a_huge_json_key_is_not_kept():
    docs = [{"x" * 100_000: 1, "a": 1}, {"a": 2}]
    s, d = content_of([{"__key__": f"j{i}", "json": json.dumps(doc).encode()} for i, doc in enumerate(docs)])
    j = d["content"]["fields"]["json"]["json"]
    assert list(j["keys"]) == ["a"] and j["other_keys"] == 1
    assert len(s.format_text()) < 5000


def test_one_json_object_is_singular():
    s, _ = content_of([{"__key__": "a", "json": b"{}"}])
    assert "json: 1 JSON document, 1 object" in s.format_text()


def test_image_fields_are_not_text_that_starts_like_one():
    from tarproc.show import image_fields

    sample = {"__key__": "a", "desc": b"BMW makes cars", "jpg": image_bytes(), "bmp": b"BM" + bytes(60)}
    assert image_fields(sample) == ["bmp", "jpg"]


def test_a_preview_of_text_that_starts_like_an_image_is_text():
    assert preview_field(b"BMW makes cars") == {"size": 14, "type": "text", "preview": "BMW makes cars"}
    assert preview_field(b"BM" + bytes(60)) == {"size": 62, "type": "bmp"}


def test_histogram_bins_whole_numbers_one_each_and_fractions_evenly():
    from tarproc import content

    d = content.Distribution()
    for v in (3, 5, 5, 7):
        d.add(v)
    assert d.histogram() == [(3, 3, 1), (4, 4, 0), (5, 5, 2), (6, 6, 0), (7, 7, 1)]
    d = content.Distribution()
    for v in (1.0, 1.5, 2.25, 3.0):  # whole numbers at the ends only: durations, not counts
        d.add(v)
    bins = d.histogram()
    assert len(bins) == content.CHART_BINS and sum(n for *_, n in bins) == 4
    assert [n for lo, hi, n in bins if lo <= 1.5 < hi] == [1]


# ---------------------------------------------------------------------------------------------
# damage (issue 35): the cheap checks, labels, an empty input, --decode


def test_images_cut_short_are_damaged_not_unreadable():
    jpg, png, webp = image_bytes((80, 60)), image_bytes((80, 60), "PNG"), image_bytes((80, 60), "WEBP")
    samples = [{"__key__": f"ok{i}", "jpg": jpg, "png": png, "webp": webp} for i in range(3)]
    samples.append({"__key__": "cut", "jpg": jpg[: len(jpg) // 2], "png": png[:-30], "webp": webp[:-20]})
    s, d = content_of(samples)
    damaged = d["content"]["problems"]["damaged_images"]
    assert damaged["count"] == 3 and {e["key"] for e in damaged["examples"]} == {"cut"}
    reasons = {e["field"]: e["reason"] for e in damaged["examples"]}
    assert reasons["jpg"] == "cut short: no end-of-image marker after the scan"
    assert reasons["png"].startswith("cut short: its 'IDAT' chunk at byte 33 declares")
    assert reasons["webp"].startswith("cut short: its RIFF header declares")
    assert "undecodable_images" not in d["content"]["problems"]  # their headers read
    assert d["content"]["fields"]["png"]["image"]["width"]["count"] == 4  # the PNG and JPEG count as images


def test_a_jpeg_with_bytes_after_its_end_or_an_exif_thumbnail_is_fine():
    from tarproc.content import field_damage

    jpg = image_bytes((80, 60))
    thumb = image_bytes((8, 8))  # an APP1 segment holding a whole JPEG, with its own end marker
    app1 = b"\xff\xe1" + (len(thumb) + 2).to_bytes(2, "big") + thumb
    with_thumb = jpg[:2] + app1 + jpg[2:]
    assert field_damage("jpeg", jpg + bytes(100)) is None and field_damage("jpeg", with_thumb) is None
    cut = with_thumb[: len(app1) + 200]
    assert field_damage("jpeg", cut) == "cut short: no end-of-image marker after the scan"


def test_labels_that_are_not_integers_among_integers():
    samples = [{"__key__": f"s{i}", "cls": str(i % 3).encode()} for i in range(6)]
    samples += [{"__key__": "dog", "cls": b"dog"}, {"__key__": "empty", "cls": b""}, {"__key__": "neg", "cls": b"-1"}]
    s, d = content_of(samples)
    p = d["content"]["problems"]["non_integer_labels"]
    assert p["count"] == 2 and [e["key"] for e in p["examples"]] == ["dog", "empty"]
    assert p["examples"][0]["command"] == "tarfirst x.tar --key dog -f cls"
    assert "labels that are not integers among integer labels: 2" in s.problems()
    # names as labels, a few numbers among them: not a problem (most are not integers)
    _, d = content_of([{"__key__": f"s{i}", "cls": b"cat" if i % 3 else b"7"} for i in range(6)])
    assert "non_integer_labels" not in d["content"]["problems"]


def test_an_empty_input_is_a_problem_but_c_0_is_not():
    s = summary_of(tar())
    assert s.problems() == ["no samples: the input holds no sample"]
    assert "no samples: the input holds no sample" in s.format_text()
    s = Summary(content=False)
    s.add_members(iter_keyed_members(io.BytesIO(tar([{"__key__": "a", "txt": b"x"}])), "x.tar"), "x.tar", count=0)
    s.finish()
    assert s.stopped_early and s.problems() == []


def test_decode_checks_images_in_order_whatever_the_processes(monkeypatch):
    from tarproc.decode import check

    good = image_bytes((80, 60))
    sos = good.index(b"\xff\xda")
    garbled = good[: sos + 40] + b"\xff\x23" * 50 + good[sos + 40:]  # bytes of no marker in the scan
    samples = [{"__key__": f"s{i:02d}", "jpg": garbled if i in (3, 17) else good, "png": image_bytes((9, 9), "PNG")}
               for i in range(20)]
    monkeypatch.setattr(check, "BATCH_ITEMS", 3)  # several batches in flight
    docs = []
    for processes in (1, 2):
        s = Summary(decode=processes)
        s.add_members(iter_keyed_members(io.BytesIO(tar(samples)), "x.tar", stats=s.stats), "x.tar")
        s.finish()
        docs.append(s.as_dict())
    assert docs[0] == docs[1]
    decode = docs[0]["content"]["decode"]
    assert decode["checked"] == {"image": 40, "media": 0} and decode["failed"] == 2
    assert [f["key"] for f in decode["failures"]] == ["s03", "s17"]
    assert decode["failures"][0]["reason"].startswith("libjpeg: ")
    assert "damaged_images" not in docs[0]["content"]["problems"]  # its end marker is there


def test_decode_without_pyav_notes_it_once_and_counts_nothing_failed(monkeypatch):
    from tarproc.decode import check
    from tarproc.errors import MissingDependencyError

    def no_av():
        raise MissingDependencyError("audio and video fields need PyAV: pip install 'tarproc[media]'")

    monkeypatch.setattr(check, "import_av", no_av)
    samples = [{"__key__": f"s{i}", "flac": b"fLaC" + bytes(60), "wav": wav_bytes(0.1)} for i in range(3)]
    s = Summary(decode=1, content=True)
    s.content._probe_media = False  # headers too would need PyAV
    s.add_members(iter_keyed_members(io.BytesIO(tar(samples)), "x.tar", stats=s.stats), "x.tar")
    s.finish()
    decode = s.as_dict()["content"]["decode"]
    assert decode["unchecked"] == 3 and decode["failed"] == 0 and decode["checked"]["media"] == 3  # the WAVs
    assert decode["note"] == "audio and video fields need PyAV: pip install 'tarproc[media]'"


def test_decode_needs_the_content_statistics():
    from tarproc.errors import OptionError

    with pytest.raises(OptionError):
        Summary(content=False, decode=1)


def test_decode_workers_leave_ctrl_c_and_sigterm_to_the_parent(monkeypatch):
    # a forked worker that raised on Ctrl-C (or ran the command's SIGTERM handler) could do so while
    # holding the result queue's lock: `tarshow --summary --decode -p 2` then hung on Ctrl-C
    import signal

    from tarhelpers import assert_workers_leave_signals_to_parent, children

    from tarproc.decode import check

    monkeypatch.setattr(check, "BATCH_ITEMS", 1)
    before = set(children())
    previous = signal.signal(signal.SIGTERM, lambda *_: None)  # as the commands' handler
    try:
        c = check.DecodeCheck(processes=2)
        c.add("x.tar", "a", "jpg", "image", image_bytes((8, 8)))  # starts the pool
        assert_workers_leave_signals_to_parent([pid for pid in children() if pid not in before])
        c.finish()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert c.checked["image"] == 1 and c.failed == 0


def test_the_summary_flags_audio_beyond_what_training_keeps():
    """content.py copies the decoder's channel bound (importing the decoders would cost tarshow
    ~0.2 s): the two must agree."""
    from tarproc.content import MAX_AUDIO_CHANNELS
    from tarproc.decode.audio import MAX_CHANNELS

    assert MAX_AUDIO_CHANNELS == MAX_CHANNELS


def test_an_input_that_fails_to_read_is_that_problem_not_an_empty_one(tmp_path):
    import warnings

    from tarproc.errors import DataWarning
    from tarproc.show import NO_SAMPLES
    from tarproc.tar import ReadPolicy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataWarning)
        problems = summarize([str(tmp_path / "missing.tar")], policy=ReadPolicy(on_error="skip-shard")).problems()
    assert problems == ["damaged or unreadable shards: 1"] and NO_SAMPLES not in problems
