"""tarshow --summary / --report against the damage of issue 35: cheap checks, --decode, labels,
an empty input, class names, -f with a field no sample has, and the total duration of audio."""

from __future__ import annotations

import json
import shlex
import struct

import pytest
from damaged import PLANTED, planted_samples

from tarproc.cli.tarfirst import main as tarfirst
from tarproc.cli.tarshow import main as tarshow


@pytest.fixture(autouse=True)
def _fresh_help_option():
    # click caches the help option per command (see conftest._forget_cached_help_options)
    tarshow._help_option = None
    yield
    tarshow._help_option = None


@pytest.fixture
def planted(tmp_path, cli):
    samples = planted_samples()
    path = cli.write_tar(tmp_path / "planted.tar", samples)
    return path, {s["__key__"]: s for s in samples}


def keyed(key_of_what: str) -> str:
    return next(k for k, what in PLANTED.items() if what == key_of_what)


def problem_keys(doc: dict, name: str) -> set[str]:
    return {e["key"] for e in doc["content"]["problems"].get(name, {}).get("examples", [])}


def summary_json(cli, path, *args) -> dict:
    r = cli.run(tarshow, [path, "--summary", "--json", "-q", *args])
    assert r.exit_code == 0, r.stderr
    return json.loads(r.stdout)


def test_the_cheap_checks_find_the_planted_damage_but_the_garbage(cli, planted):
    path, _ = planted
    doc = summary_json(cli, path)
    assert doc["content"]["decode"] is None  # no --decode: headers only
    assert problem_keys(doc, "damaged_images") == {keyed("jpeg cut to a third")}
    assert problem_keys(doc, "extension_mismatch") == {keyed("png named .jpg")}
    assert problem_keys(doc, "undecodable_images") == {keyed("html named .jpg"), keyed("empty jpg")}
    assert problem_keys(doc, "non_integer_labels") == {keyed("cls dog")}
    assert doc["missing"]["cls"]["examples"] == [keyed("no cls")]
    every = {e["key"] for p in doc["content"]["problems"].values() for e in p["examples"]}
    assert keyed("jpeg with garbage inside") not in every  # its header and end marker are fine
    example = doc["content"]["problems"]["non_integer_labels"]["examples"][0]
    assert example["reason"] == "label 'dog' among 45 integer labels"
    assert doc["content"]["fields"]["jpg"]["image"]["damaged"] == 1
    reasons = {e["key"]: e["reason"] for e in doc["content"]["problems"]["undecodable_images"]["examples"]}
    assert reasons[keyed("empty jpg")] == "no data (an empty field)"  # not "the data looks like empty"


def test_decode_lists_every_failure_the_same_for_any_p(cli, planted):
    path, samples = planted
    one = summary_json(cli, path, "--decode")
    two = summary_json(cli, path, "--decode", "-p", "2")
    assert one == two
    decode = one["content"]["decode"]
    failed = [keyed(w) for w in ("jpeg cut to a third", "jpeg with garbage inside", "html named .jpg", "empty jpg")]
    assert [f["key"] for f in decode["failures"]] == failed  # in the order of the stream
    assert decode["failed"] == 4 and decode["checked"] == {"image": 47, "media": 0} and decode["not_listed"] == 0
    garbage = decode["failures"][1]
    assert garbage["reason"].startswith("libjpeg: Corrupt JPEG data")
    assert one["content"]["problems"]["decode_failures"]["count"] == 4
    assert "fields that fail to decode (--decode): 4" in one["problems"]
    # the command given pulls out the damaged bytes
    args = shlex.split(garbage["command"])
    assert args[0] == "tarfirst"
    r = cli.run(tarfirst, args[1:])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == samples[garbage["key"]]["jpg"]


def test_decode_failures_in_the_text_and_strict(cli, planted, monkeypatch):
    from tarproc import content

    path, _ = planted
    monkeypatch.setattr(content, "DECODE_SHOWN", 3)
    r = cli.run(tarshow, [path, "--summary", "--decode", "-p", "2", "--strict", "-q"])
    assert r.exit_code == 1
    assert "fields that fail to decode (--decode): 4" in r.stderr and "images cut short or damaged" in r.stderr
    out = r.stdout
    assert "fields that fail to decode (--decode): 4\n" in out and "decoded: 47 images, 0 audio/video; 4 failed" in out
    garbage = keyed("jpeg with garbage inside")
    assert f"  {garbage}.jpg in {path}: libjpeg: Corrupt JPEG data" in out
    assert f"    tarfirst {path} --key {garbage} -f jpg\n" in out
    assert "  ... and 1 more (--json lists up to 1000)" in out
    assert "unreadable  2 (header unreadable)" in out and "damaged     1" in out


def test_an_empty_input_is_a_problem(cli, tmp_path):
    empty = tmp_path / "empty.tar"
    empty.write_bytes(bytes(1024))
    r = cli.run(tarshow, [empty, "--summary", "--strict"])
    assert r.exit_code == 1
    assert "no samples: the input holds no sample" in r.stderr and "no samples" in r.stdout
    assert "no problems found" not in r.stdout
    r = cli.run(tarshow, [empty, "--summary", "--strict", "-c", "0"])  # none asked for: not a problem
    assert r.exit_code == 0 and "no problems found" in r.stdout
    out = tmp_path / "r.html"
    assert cli.run(tarshow, [empty, "--report", out, "-q"]).exit_code == 0
    assert "no samples: the input holds no sample" in out.read_text()


def test_the_report_puts_problems_first_with_cards_and_class_names(cli, planted, tmp_path):
    path, _ = planted
    (tmp_path / "classes.txt").write_text("zero\none\ntwo\nthree\nfour\n")
    out = tmp_path / "r.html"
    r = cli.run(tarshow, [path, "--report", out, "--decode", "-p", "2", "--sample", "4"])
    assert r.exit_code == 0, r.stderr
    text = out.read_text()
    problems = text.index('<h2 id="problems">')
    assert problems < text.index("<svg") and problems < text.index('<h2 id="samples">')
    top = text[problems:text.index('<h2 id="samples">')]
    assert top.count('class="card"') == len(PLANTED)  # one card per damaged sample
    garbage = keyed("jpeg with garbage inside")
    assert f"tarfirst {path} --key {garbage} -f jpg" in top and "Corrupt JPEG data" in top
    assert "fields that fail to decode (--decode): 4" in top
    # class names: from the classes.txt beside the shard, on the chart and the cards
    assert "3 (three)" in text and "<title>3 (three): " in text
    names = tmp_path / "names.txt"
    names.write_text("cat\ndog\nbird\nfish\nfrog\n")
    r = cli.run(tarshow, [path, "--report", out, "--classes", names, "-q"])
    assert r.exit_code == 0, r.stderr
    text = out.read_text()
    assert "3 (fish)" in text and "3 (three)" not in text
    r = cli.run(tarshow, [path, "--summary", "--classes", names, "-q"])
    assert "most        1 (dog) (10), 0 (cat) (9)" in r.stdout


def test_a_field_no_sample_has_is_said(cli, planted):
    path, _ = planted
    r = cli.run(tarshow, [path, "-f", "jgp", "-c", "3"])
    assert r.exit_code == 0
    assert r.stderr == ("tarshow: warning: -f 'jgp': no sample has that field (in 3 samples read; "
                        "their fields: cls, jpg)\n")
    r = cli.run(tarshow, [path, "-f", "jpg;jgp", "-c", "3"])  # one of the alternatives is there: fine
    assert r.exit_code == 0 and r.stderr == ""


def test_bad_classes_and_options_are_one_line(cli, planted, tmp_path):
    path, _ = planted
    r = cli.run(tarshow, [path, "--summary", "--classes", tmp_path / "missing.txt"])
    assert r.exit_code == 1
    assert r.stderr == f"tarshow: error: {tmp_path / 'missing.txt'}: no such file\n"
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"cat\n\xff\xfe\n")
    r = cli.run(tarshow, [path, "--summary", "--classes", binary])
    assert r.exit_code == 1 and r.stderr == f"tarshow: error: {binary}: line 2: not UTF-8 text\n"
    r = cli.run(tarshow, [path, "--summary", "--classes", tmp_path])  # not "not a tar file"
    assert r.exit_code == 1 and r.stderr == f"tarshow: error: {tmp_path}: is a directory, not a list of class names\n"
    for args in (["--decode"], ["-p", "2"], ["--summary", "-p", "2"], ["--summary", "--decode", "--bytes-only"],
                 ["--classes", binary]):
        r = cli.run(tarshow, [path, *args])
        assert r.exit_code == 2, (args, r.stderr)
        assert r.stderr.startswith("tarshow: error: ") and r.stdout == ""


def wav(seconds: float, rate: int = 8000, declared: int | None = None) -> bytes:
    data = bytes(int(seconds * rate) * 2)
    size = len(data) if declared is None else declared
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + fmt + b"data" + struct.pack("<I", size) + data


def test_total_duration_of_audio(cli, tmp_path):
    samples = [{"__key__": f"a{i}", "wav": wav(1.5)} for i in range(4)]
    samples.append({"__key__": "cut", "wav": wav(1.0, declared=64000)})  # its data chunk claims more than there is
    path = cli.write_tar(tmp_path / "audio.tar", samples)
    doc = summary_json(cli, path)
    audio = doc["content"]["fields"]["wav"]["audio"]
    assert audio["total_seconds"] == 6.0 and audio["total_hours"] == round(6 / 3600, 4)
    assert problem_keys(doc, "undecodable_media") == {"cut"}
    r = cli.run(tarshow, [path, "--summary", "-q"])
    assert "    total       6 s\n" in r.stdout
    many = [{"__key__": f"a{i}", "wav": wav(100.0, rate=100)} for i in range(45)]  # 4500 s
    path = cli.write_tar(tmp_path / "long.tar", many)
    r = cli.run(tarshow, [path, "--summary", "-q", "--decode"])
    assert "    total       1.25 h (4500 s)\n" in r.stdout and "decoded: 0 images, 45 audio/video; 0 failed" in r.stdout
    out = tmp_path / "r.html"
    assert cli.run(tarshow, [path, "--report", out, "-q", "--sample", "1"]).exit_code == 0
    assert "1.25 h (4500 s) of audio" in out.read_text()


def test_audio_bombs_are_problems(cli, tmp_path):
    # issue 35's audio bombs: a 3.6 KB WAV at 1 Hz "an hour long", and 65,535 channels
    def pcm(rate: int, channels: int, frames: int) -> bytes:
        data = bytes(channels * frames)  # 8-bit
        fmt = struct.pack("<IHHIIHH", 16, 1, channels, rate, rate * channels, channels, 8)
        return (b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVEfmt " + fmt + b"data"
                + struct.pack("<I", len(data)) + data)

    samples = [{"__key__": "good", "wav": pcm(16000, 2, 1600)}, {"__key__": "slow", "wav": pcm(1, 1, 3600)},
               {"__key__": "wide", "wav": pcm(8000, 65535, 2)}]
    path = cli.write_tar(tmp_path / "bombs.tar", samples)
    doc = summary_json(cli, path)
    reasons = {e["key"]: e["reason"] for e in doc["content"]["problems"]["odd_audio"]["examples"]}
    assert reasons == {"slow": "sample rate 1 Hz (3600 s declared)", "wide": "65,535 channels (training keeps at most 64)"}
    r = cli.run(tarshow, [path, "--summary", "--strict", "-q"])
    assert r.exit_code == 1 and "a decode bomb" in r.stderr
    assert f"tarfirst {path} --key wide -f wav" in r.stdout


def test_serve_gets_the_class_names(cli, planted, tmp_path, monkeypatch):
    from tarproc.view import server

    path, _ = planted
    calls = []
    monkeypatch.setattr(server, "serve", lambda *args, **kw: calls.append((args, kw)))
    names = tmp_path / "names.txt"
    names.write_text("cat\ndog\n")
    assert cli.run(tarshow, [path, "--serve", "--classes", names]).exit_code == 0
    assert cli.run(tarshow, [path, "--serve"]).exit_code == 0  # the viewer looks beside the shards itself
    assert [kw for _, kw in calls] == [{"classes": ["cat", "dog"]}, {"classes": None}]


def test_decode_without_pyav_says_so_once(cli, tmp_path, monkeypatch):
    from tarproc.decode import check
    from tarproc.errors import MissingDependencyError

    def no_av():
        raise MissingDependencyError("audio and video fields need PyAV: pip install 'tarproc[media]'")

    monkeypatch.setattr(check, "import_av", no_av)
    samples = [{"__key__": f"s{i}", "mp4": b"\x00\x00\x00\x18ftypmp42" + bytes(40)} for i in range(5)]
    path = cli.write_tar(tmp_path / "video.tar", samples)
    r = cli.run(tarshow, [path, "--summary", "--decode", "-q"])
    warnings = [line for line in r.stderr.splitlines() if "not decoded" in line]
    assert warnings == ["tarshow: warning: --decode: audio and video not decoded: audio and video fields need PyAV: "
                        "pip install 'tarproc[media]'"]
    assert "not decoded: 5 audio/video" in r.stdout
