"""tarshow: previews, --json, --summary, --grid and --view, through the CLI."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile

import pytest
from PIL import Image

import tarproc.sinks
from tarproc.cli import tarshow as tarshow_module
from tarproc.cli.tarshow import main as tarshow
from tarproc.tar import TarWriter


@pytest.fixture(autouse=True)
def _fresh_help_option():
    # click caches the help option per command (see conftest._forget_cached_help_options)
    tarshow._help_option = None
    yield
    tarshow._help_option = None


def jpeg(colour, size=(64, 48)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, "JPEG", quality=95)
    return buf.getvalue()


@pytest.fixture
def images(tmp_path, cli):
    """A shard of 6 samples: jpg + cls + json; sample 2 has a png instead, sample 4 a broken jpg."""
    samples = []
    for i in range(6):
        s = {"__key__": f"img/{i:04d}", "jpg": jpeg((40 * i, 100, 200)), "cls": str(i % 3).encode(),
             "json": json.dumps({"caption": f"thing {i}", "i": i}).encode()}
        if i == 2:
            buf = io.BytesIO()
            Image.new("RGB", (30, 30), (0, 255, 0)).save(buf, "PNG")
            del s["jpg"]
            s["png"] = buf.getvalue()
        if i == 4:
            s["jpg"] = b"\xff\xd8\xff\xe0" + b"broken" * 10
        samples.append(s)
    return cli.write_tar(tmp_path / "images.tar", samples)


def records(out: str) -> list[list[str]]:
    return [block.splitlines() for block in out.strip("\n").split("\n\n")]


# ---------------------------------------------------------------------------------------------
# previews


def test_text_previews_per_sample(cli, shards):
    r = cli.run(tarshow, [shards.paths[0], "-c", "2"])
    assert r.exit_code == 0, r.stderr
    assert r.stderr == ""
    first, second = records(r.stdout)
    assert first[:2] == ["__key__\ts0/0000", f"__url__\t{shards.paths[0]}"]
    assert first[2:] == ["cls\t1\t0", "jpg\t200\t[binary]", 'json\t8\t{"i":0}']
    assert second[0] == "__key__\ts0/0001" and "png\t297\t[binary]" in second


def test_skip_count_fields_and_width(cli, shards):
    r = cli.run(tarshow, [*shards.paths, "--skip", "5", "-c", "3", "-f", "json jpg,png", "-w", "5"])
    assert r.exit_code == 0, r.stderr
    blocks = records(r.stdout)
    assert [b[0] for b in blocks] == ["__key__\ts1/0005", "__key__\ts1/0006", "__key__\ts1/0007"]
    assert blocks[0][2:] == ['json\t8\t{"i"…', "png\t685\t[binary]"]  # -f order, first alternative present


def test_stdin_is_the_default_input(cli, shards):
    with open(shards.paths[1], "rb") as f:
        r = cli.run(tarshow, ["-c", "1"], input=f.read())
    assert r.exit_code == 0, r.stderr
    assert r.stdout.startswith("__key__\ts1/0004\n__url__\t-\n")


def test_json_lines(cli, images):
    r = cli.run(tarshow, [images, "--json"])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout.splitlines()
    docs = [json.loads(line) for line in lines]
    assert [d["__key__"] for d in docs] == [f"img/{i:04d}" for i in range(6)]
    d = docs[0]
    assert d["__url__"] == str(images)
    assert d["fields"]["jpg"]["type"] == "jpeg" and "preview" not in d["fields"]["jpg"]
    assert d["fields"]["cls"] == {"size": 1, "type": "text", "preview": "0"}
    assert d["fields"]["json"]["preview"] == '{"caption":"thing 0","i":0}'
    assert docs[2]["fields"]["png"]["type"] == "png"


def test_never_prints_raw_binary_or_escapes(cli, tmp_path):
    evil = {"__key__": "k\x1b[2J", "txt": b"ok\x1b]0;owned\x07", "bin": bytes(range(256)), "note": "é\u202e".encode()}
    path = cli.write_tar(tmp_path / "evil.tar", [evil])
    for args in ([], ["--json"]):
        r = cli.run(tarshow, [path, *args])
        assert r.exit_code == 0, r.stderr
        assert all(c.isprintable() or c in "\n\t" for c in r.stdout), repr(r.stdout)
    r = cli.run(tarshow, [path])
    assert "note\t5\té\\u202e" in r.stdout and "txt\t12\t[binary]" in r.stdout and "bin\t256\t[binary]" in r.stdout


def test_damaged_input_one_line_error(cli, shards, tmp_path):
    data = open(shards.paths[0], "rb").read()
    bad = tmp_path / "cut.tar"
    bad.write_bytes(data[:2000])
    r = cli.run(tarshow, [bad])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarshow")
    assert str(bad) in line and "at byte" in line


def test_usage_errors_exit_2(cli, shards, tmp_path):
    for args in (["--summary", "--view"], ["--grid", tmp_path / "g.png", "--json"], ["--view-protocol", "kitty"],
                 ["--columns", "3"], ["--grid", tmp_path / "g.tar"], ["--summary", "-f", "jpg"], ["-w", "-1"]):
        r = cli.run(tarshow, [shards.paths[0], *args])
        assert r.exit_code == 2, (args, r.stderr)
        assert r.stdout == ""
    assert not list(tmp_path.glob("g.*"))


def test_help_has_examples(cli):
    r = cli.run(tarshow, ["--help"])
    assert r.exit_code == 0
    assert "Examples:" in r.stdout and "--summary" in r.stdout and "tarshow train-0000.tar --grid" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 100


# ---------------------------------------------------------------------------------------------
# --summary


def test_summary_text(cli, shards):
    r = cli.run(tarshow, [*shards.paths, "--summary"])
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "shards      3" in out and "samples     12" in out and "members     36" in out
    assert "jpg: 3 samples (e.g. 's0/0001', 's1/0005', 's2/0009')" in out  # the png samples lack a jpg
    assert "non-adjacent" not in out and "reappear" not in out


def _lint_tar(tmp_path):  # type: ignore[no-untyped-def]
    """A shard with every kind of problem --summary reports: a key that reappears, a field twice,
    a name without a key, a dotted name that splits surprisingly."""
    members = [("a.jpg", b"1"), ("a.cls", b"1"), ("b.cls", b"2"), ("a.txt", b"x"), ("c.cls", b"3"),
               ("c.cls", b"4"), ("NOTES", b"n"), ("Track 2.0.mp3", b"ID3")]
    path = tmp_path / "lint.tar"
    with open(path, "wb") as f, TarWriter(f) as w:
        for name, data in members:
            w.add(name, data)
    return path


def test_summary_json_finds_the_lint_problems(cli, tmp_path):
    path = _lint_tar(tmp_path)
    r = cli.run(tarshow, [path, "--summary", "--json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["samples"] == 5 and d["members"] == 8  # a, b, a again, c, Track 2; NOTES is a member too
    assert d["non_adjacent_keys"]["count"] == 1 and d["non_adjacent_keys"]["examples"][0]["key"] == "a"
    assert d["duplicate_fields"]["count"] == 1 and d["duplicate_fields"]["examples"][0]["key"] == "c"
    assert d["names_without_key"] == {"count": 1, "examples": ["NOTES"]}
    assert d["surprising_names"][0]["field"] == "0.mp3"
    # normal reading of the same shard refuses it: the lint is the way to see why
    assert cli.run(tarshow, [path]).exit_code == 1


def test_summary_of_a_damaged_shard_reports_then_fails(cli, shards, tmp_path):
    data = open(shards.paths[0], "rb").read()
    bad = tmp_path / "cut.tar"
    bad.write_bytes(data[: 512 * 9 + 100])
    r = cli.run(tarshow, [shards.paths[1], bad, shards.paths[2], "--summary"])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarshow")
    assert str(bad) in line and "at byte" in line
    assert "shards      2 (1 failed)" in r.stdout and "damaged or unreadable" in r.stdout
    r = cli.run(tarshow, [shards.paths[1], bad, shards.paths[2], "--summary", "--json", "--on-error", "skip-shard"])
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert d["shards"] == 3 and d["shards_failed"] == 1 and d["samples"] >= 8 and len(d["errors"]) == 1
    assert "warning: " in r.stderr and str(bad) in r.stderr


def test_summary_count(cli, shards):
    r = cli.run(tarshow, [*shards.paths, "--summary", "--json", "-c", "5"])
    d = json.loads(r.stdout)
    assert d["samples"] == 5 and d["stopped_early"] is True and d["shards"] == 2


# ---------------------------------------------------------------------------------------------
# --grid


def test_grid_writes_a_contact_sheet(cli, images, tmp_path):
    out = tmp_path / "sheet.png"
    r = cli.run(tarshow, [images, "--grid", out, "--thumb", "32", "--columns", "5"])
    assert r.exit_code == 0, r.stderr
    # sample 4's jpg is broken: warned about, counted, skipped
    assert "img/0004.jpg" in r.stderr and "cannot decode" in r.stderr
    assert "5 images from 6 samples (1 undecodable skipped)" in r.stderr
    sheet = Image.open(out)
    assert sheet.format == "PNG" and sheet.width == 5 * 32 + 4 * 4
    assert sheet.getpixel((16 + 2 * 36, 16)) == (0, 255, 0)  # the third cell is the png sample
    assert cli.leftovers(tmp_path) == []


def test_grid_count_stops_early_and_jpeg_by_suffix(cli, images, tmp_path):
    out = tmp_path / "two.jpg"
    r = cli.run(tarshow, [images, "--grid", out, "-c", "2", "-q"])
    assert r.exit_code == 0, r.stderr
    assert r.stderr == ""
    assert Image.open(out).format == "JPEG" and Image.open(out).width == 2 * 160 + 4


def test_grid_to_stdout_and_refused_on_a_terminal(cli, images, monkeypatch):
    r = cli.run(tarshow, [images, "--grid", "-", "-c", "1", "-q"])
    assert r.exit_code == 0
    assert Image.open(io.BytesIO(r.stdout_bytes)).format == "PNG"
    monkeypatch.setattr(tarproc.sinks, "stdout_is_terminal", lambda: True)
    r = cli.run(tarshow, [images, "--grid", "-"])
    assert r.exit_code == 1 and "terminal" in cli.one_line_error(r, "tarshow")


def test_grid_with_no_images_or_damage_leaves_nothing(cli, shards, images, tmp_path):
    out = tmp_path / "none.png"
    r = cli.run(tarshow, [shards.paths[0], "--grid", out])  # fake jpgs: not decodable
    assert r.exit_code == 1 and "no images" in r.stderr.splitlines()[-1]
    bad = tmp_path / "cut.tar"
    bad.write_bytes(open(images, "rb").read()[:5000])
    r = cli.run(tarshow, [bad, "--grid", out])
    assert r.exit_code == 1 and str(bad) in r.stderr
    assert not out.exists() and cli.leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------
# --view


@pytest.mark.parametrize("protocol, marker", [("kitty", "\x1b_Ga=T,f=100"), ("iterm", "\x1b]1337;File=inline=1;"),
                                              ("sixel", "\x1bP0;1;0q"), ("blocks", "▀")])
def test_view_protocols(cli, images, protocol, marker):
    r = cli.run(tarshow, [images, "--view", "--view-protocol", protocol, "-c", "3"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.count("__key__") == 3
    if protocol == "blocks":
        assert marker in r.stdout and "\x1b[38;2;" in r.stdout
    else:
        assert r.stdout.count(marker) == 3  # one image per sample


def test_view_detects_kitty_from_the_environment_and_warns_on_bad_images(cli, images, monkeypatch):
    monkeypatch.setenv("TERM", "xterm-kitty")
    r = cli.run(tarshow, [images, "--view", "--skip", "4", "-c", "1"])
    assert r.exit_code == 0
    assert "\x1b_G" not in r.stdout and "img/0004.jpg" in r.stderr
    r = cli.run(tarshow, [images, "--view", "-c", "1", "-f", "jpg"])
    assert r.stdout.count("\x1b_Ga=T,f=100") == 1


def test_delay_between_samples(cli, shards, monkeypatch):
    sleeps: list[float] = []
    monkeypatch.setattr(tarshow_module.time, "sleep", sleeps.append)
    r = cli.run(tarshow, [shards.paths[0], "-d", "0.5"])
    assert r.exit_code == 0 and sleeps == [0.5, 0.5, 0.5]


# ---------------------------------------------------------------------------------------------
# real pipes


def run_module(args, **kw):
    return subprocess.run([sys.executable, "-m", "tarproc.cli.tarshow", *args], capture_output=True, **kw)


def test_pipeline_tarcat_to_tarshow(shards):
    cat = subprocess.Popen([sys.executable, "-m", "tarproc.cli.tarcat", *shards.paths, "-f", "cls json"],
                           stdout=subprocess.PIPE)
    show = subprocess.run([sys.executable, "-m", "tarproc.cli.tarshow", "--json"], stdin=cat.stdout,
                          capture_output=True)
    cat.stdout.close()
    assert cat.wait() == 0 and show.returncode == 0, show.stderr
    docs = [json.loads(line) for line in show.stdout.decode().splitlines()]
    assert len(docs) == 12 and set(docs[5]["fields"]) == {"cls", "json"}


def test_head_ends_quietly(tmp_path, cli):
    path = cli.write_tar(tmp_path / "many.tar", [{"__key__": f"k{i:05d}", "txt": b"x" * 50} for i in range(3000)])
    proc = subprocess.run(f"{sys.executable} -m tarproc.cli.tarshow {path} | head -n 2", shell=True,
                          capture_output=True, env=dict(os.environ, PYTHONWARNINGS="ignore"))
    assert proc.returncode == 0
    assert proc.stdout.decode().splitlines() == ["__key__\tk00000", f"__url__\t{path}"]
    assert proc.stderr == b""


def test_names_from_the_data_are_escaped_in_warnings(cli, tmp_path):
    key = "k\x1b]0;PWNED\x07\x1b[31m"
    path = cli.write_tar(tmp_path / "esc.tar", [{"__key__": key, "jpg": b"\xff\xd8\xff\xe0broken"}])
    r = cli.run(tarshow, [path, "--grid", tmp_path / "g.png"])
    assert "cannot decode" in r.stderr
    assert "\x1b" not in r.stderr and "\x07" not in r.stderr


# ---------------------------------------------------------------------------------------------
# issue 14: --strict, and names that are not UTF-8


def test_strict_summary_exits_1_naming_the_problems(cli, tmp_path):
    path = _lint_tar(tmp_path)
    r = cli.run(tarshow, [path, "--summary"])
    assert r.exit_code == 0 and "names without a key" in r.stdout  # without --strict: a report only
    r = cli.run(tarshow, [path, "--summary", "--strict"])
    assert r.exit_code == 1
    assert "names without a key" in r.stdout and "no problems found" not in r.stdout  # the report is still written
    line = cli.one_line_error(r, "tarshow")
    for said in ("keys that reappear after other keys: 1", "fields twice in one sample: 1",
                 "names without a key: 1", "dotted names that split surprisingly: 1",
                 "samples missing a field most samples have (cls: 2)"):
        assert said in line, line
    r = cli.run(tarshow, [path, "--summary", "--strict", "--json"])
    assert r.exit_code == 1
    assert json.loads(r.stdout)["problems"] == cli.one_line_error(r, "tarshow").split(": ", 3)[3].split("; ")


def test_strict_summary_of_clean_shards_exits_0(cli, tmp_path):
    path = cli.write_tar(tmp_path / "clean.tar", [cli.make_sample(f"k{i:03d}", i) for i in range(30)])
    # the same keys in two shards are fine; the fake images would be content problems: sizes only
    r = cli.run(tarshow, [path, path, "--summary", "--strict", "--bytes-only"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout.rstrip().endswith("no problems found") and r.stderr == ""
    r = cli.run(tarshow, [path, "--summary", "--strict", "--json", "--bytes-only"])
    assert r.exit_code == 0 and json.loads(r.stdout)["problems"] == []


def test_strict_counts_a_skipped_damaged_shard(cli, tmp_path):
    good = cli.write_tar(tmp_path / "good.tar", [cli.make_sample(f"k{i:03d}", i) for i in range(5)])
    bad = tmp_path / "bad.tar"
    bad.write_bytes(good.read_bytes()[:1500])
    r = cli.run(tarshow, [good, bad, "--summary", "--strict", "--on-error", "skip-shard", "-q"])
    assert r.exit_code == 1
    assert "damaged or unreadable shards: 1" in r.stderr.splitlines()[-1]


def test_strict_needs_summary(cli, shards):
    r = cli.run(tarshow, [shards.paths[0], "--strict"])
    assert r.exit_code == 2 and "--strict" in r.stderr and r.stdout == ""


KOI8 = ["привет", "мир", "ёлка"]


@pytest.fixture
def koi8(tmp_path):
    """A tar whose member names are koi8-r bytes (not UTF-8), as an old Russian archiver writes them:
    three samples with a jpg and a cls, a name without a key, and a key that reappears."""
    import tarfile

    path = tmp_path / "koi8.tar"
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT, encoding="koi8-r") as tf:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))

        for i, key in enumerate(KOI8):
            add(f"{key}.jpg", jpeg((80 * i, 0, 0), size=(32, 32)))
            add(f"{key}.cls", str(i).encode())
        add("каталог/безключа", b"z")
        add(f"{KOI8[0]}.txt", b"again")  # reappears after other keys
    assert "привет".encode("koi8-r") in path.read_bytes()
    return path


@pytest.mark.parametrize("args", [["--json"], ["--summary", "--json"]])
def test_json_output_is_valid_utf8_for_names_that_are_not(cli, koi8, args):
    r = cli.run(tarshow, [koi8, *args, "--dup", "skip"] if args == ["--json"] else [koi8, *args])
    assert r.exit_code == 0, r.stderr
    text = r.stdout_bytes.decode("utf-8")  # strict: raises on any byte that is not UTF-8
    docs = [json.loads(line) for line in text.splitlines()]
    assert "\\udcd0" in text  # the escape for byte 0xd0, the documented form

    def original(name: str) -> str:  # the documented way back to the bytes, then to the text
        return name.encode("utf-8", "surrogateescape").decode("koi8-r")

    if args == ["--json"]:
        assert [original(d["__key__"]) for d in docs] == KOI8
    else:
        (d,) = docs
        assert original(d["names_without_key"]["examples"][0]) == "каталог/безключа"
        assert original(d["non_adjacent_keys"]["examples"][0]["key"]) == KOI8[0]


@pytest.mark.parametrize("args", [[], ["--summary"], ["--view", "--view-protocol", "blocks"], ["--grid", "GRID"]])
def test_text_outputs_never_crash_on_names_that_are_not_utf8(cli, koi8, tmp_path, args):
    args = [str(tmp_path / "g.png") if a == "GRID" else a for a in args]
    r = cli.run(tarshow, [koi8, "--dup", "skip", *args])
    assert r.exit_code == 0, r.stderr
    r.stdout_bytes.decode("utf-8")
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    if not args:
        assert "__key__\t\\udcd0\\udcd2\\udcc9\\udcd7\\udcc5\\udcd4" in r.stdout  # escaped, never raw bytes
    if "--grid" in args:
        assert Image.open(tmp_path / "g.png").format == "PNG" and "3 images" in r.stderr


def test_grid_captions_escape_control_characters_in_keys(cli, tmp_path, monkeypatch):
    from PIL import ImageDraw

    drawn: list[str] = []
    monkeypatch.setattr(ImageDraw.ImageDraw, "text", lambda self, xy, text, *a, **kw: drawn.append(text))
    path = cli.write_tar(tmp_path / "ctl.tar", [{"__key__": "a\nb\x1b[1m", "jpg": jpeg((0, 0, 255))}])
    r = cli.run(tarshow, [path, "--grid", tmp_path / "g.png", "-q"])
    assert r.exit_code == 0, r.stderr
    assert drawn == ["a\\nb\\x1b[1m"]


def test_summary_reads_links_and_concatenated_archives_as_tarcat_does(tmp_path):
    from click.testing import CliRunner

    from tarproc.cli.tarshow import main as tarshow

    one = tmp_path / "one.tar"
    with tarfile.open(one, "w", format=tarfile.GNU_FORMAT) as tf:
        for name in ("a.txt", "a.cls"):
            info = tarfile.TarInfo(name)
            info.size = 1
            tf.addfile(info, io.BytesIO(b"1"))
        info = tarfile.TarInfo("b.txt")
        info.type, info.linkname = tarfile.LNKTYPE, "a.txt"
        tf.addfile(info)
    both = tmp_path / "both.tar"
    both.write_bytes(one.read_bytes() * 2)
    r = CliRunner().invoke(tarshow, ["--summary", "--json", str(one)])
    assert r.exit_code == 0, r.output
    assert '"samples": 2' in r.output
    r = CliRunner().invoke(tarshow, ["--summary", "--json", "--links", "skip", str(one)])
    assert '"samples": 1' in r.output
    r = CliRunner().invoke(tarshow, ["--summary", "--json", "-i", "--dup", "warn", str(both)])
    assert r.exit_code == 0, r.output


# ---------------------------------------------------------------------------------------------
# issue 27: content statistics, --report and --serve


def png_named_jpg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (30, 20), (0, 255, 0)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def content_shard(tmp_path, cli):
    samples = [{"__key__": f"c/{i:03d}", "jpg": jpeg((10 * i, 0, 0), size=(64 + i, 48)), "cls": str(i % 2).encode(),
                "txt": f"caption {i}".encode()} for i in range(6)]
    samples[1]["jpg"] = png_named_jpg()
    samples[2]["txt"] = b"caf\xe9"
    return cli.write_tar(tmp_path / "content.tar", samples)


def test_summary_says_what_the_fields_hold(cli, content_shard):
    r = cli.run(tarshow, [content_shard, "--summary"])
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    assert "jpg: 6 images" in out and "format      jpeg (5), png (1)" in out
    assert "width       min 30 px  median 66.5 px  max 69 px" in out and "png named .jpg: 1" in out
    assert "cls: 6 labels, 2 classes" in out and "not UTF-8 1" in out
    assert f"tarfirst {content_shard} --key c/001 -f jpg" in out and f"tarfirst {content_shard} --key c/002 -f txt" in out
    r = cli.run(tarshow, [content_shard, "--summary", "--json"])
    doc = json.loads(r.stdout)
    assert doc["content"]["fields"]["jpg"]["image"]["extension_mismatch"] == {"png named .jpg": 1}
    assert doc["problems"] == ["images whose content is another format than their extension says: 1",
                               "text that is not UTF-8: 1"]
    r = cli.run(tarshow, [content_shard, "--summary", "--strict"])
    assert r.exit_code == 1 and "png named" not in r.stderr and "images whose content" in r.stderr
    r = cli.run(tarshow, [content_shard, "--summary", "--json", "--bytes-only"])
    assert json.loads(r.stdout)["content"] is None and json.loads(r.stdout)["problems"] == []


def test_the_tarfirst_command_of_a_problem_pulls_the_sample_out(cli, content_shard):
    import shlex

    doc = json.loads(cli.run(tarshow, [content_shard, "--summary", "--json"]).stdout)
    command = doc["content"]["problems"]["extension_mismatch"]["examples"][0]["command"]
    argv = shlex.split(command)
    assert argv[0] == "tarfirst"
    proc = subprocess.run([sys.executable, "-m", "tarproc.cli.tarfirst", *argv[1:]], capture_output=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == png_named_jpg()


def test_the_byte_level_problems_name_a_tarfirst_command_too(cli, tmp_path):
    """A sample missing a field most have, and a dotted name that splits surprisingly, each come
    with the command that pulls a member of the first such sample out (a field it does have)."""
    import shlex

    path = tmp_path / "names dir" / "lint.tar"
    path.parent.mkdir()
    members = [("a.jpg", b"A"), ("a.cls", b"1"), ("b.jpg", b"B"), ("b.cls", b"2"), ("bird.v2_0001.jpg", b"V"),
               ("bird.v2_0001.cls", b"3")]
    with open(path, "wb") as f, TarWriter(f) as w:
        for name, data in members:
            w.add(name, data)
    r = cli.run(tarshow, [path, "--summary", "--bytes-only"])
    assert r.exit_code == 0, r.stderr
    quoted = shlex.quote(str(path))
    lines = r.stdout.splitlines()
    at = lines.index("  cls: 1 sample (e.g. 'bird')")
    assert lines[at + 1] == f"    tarfirst {quoted} --key bird -f v2_0001.jpg"
    assert f"    tarfirst {quoted} --key bird -f v2_0001.cls" in lines
    doc = json.loads(cli.run(tarshow, [path, "--summary", "--json", "--bytes-only"]).stdout)
    commands = [doc["missing"]["cls"]["command"]] + [s["command"] for s in doc["surprising_names"]]
    got = []
    for command in commands:
        argv = shlex.split(command)
        proc = subprocess.run([sys.executable, "-m", "tarproc.cli.tarfirst", *argv[1:]], capture_output=True)
        assert proc.returncode == 0, proc.stderr
        got.append(proc.stdout)
    assert sorted(got) == [b"3", b"V", b"V"]


def test_report_writes_one_html_file(cli, content_shard, tmp_path):
    out = tmp_path / "r.html"
    r = cli.run(tarshow, [content_shard, "--report", out, "--sample", "4", "--seed", "7"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == ""  # data only on stdout: the report goes to its file
    assert r.stderr == f"tarshow: wrote {out}: 4 samples of 6, 2 kinds of problem (0.0 MB)\n"
    text = out.read_text(encoding="utf-8")
    problems, samples = text.split('<h2 id="samples">')
    assert text.startswith("<!DOCTYPE html>") and samples.count('class="card"') == 4
    assert problems.count('class="card"') == 2  # the two samples with a problem, as cards
    assert "png named .jpg" in text and f"tarfirst {content_shard} --key c/001 -f jpg" in text
    r = cli.run(tarshow, [content_shard, "--report", out, "-c", "2", "-q"])  # -c: the first 2 samples only
    assert r.exit_code == 0 and r.stderr == ""
    samples = out.read_text().split('<h2 id="samples">')[1]
    assert samples.count('class="card"') == 2 and "c/005" not in out.read_text()


def test_report_of_bad_input_is_one_line_and_leaves_no_file(cli, tmp_path):
    out = tmp_path / "r.html"
    r = cli.run(tarshow, [tmp_path / "missing.tar", "--report", out])
    assert r.exit_code == 1 and not out.exists()
    assert "missing.tar" in cli.one_line_error(r, "tarshow") and "Traceback" not in r.stderr
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"x" * 1000)
    r = cli.run(tarshow, [bad, "--report", out])
    assert r.exit_code == 1 and not out.exists() and "bad.tar" in cli.one_line_error(r, "tarshow")


@pytest.mark.parametrize("args, said", [
    (["--sample", "3"], "--sample and --seed work with --report only"),
    (["--seed", "3"], "--sample and --seed work with --report only"),
    (["--bytes-only"], "--bytes-only works with --summary and --report only"),
    (["--port", "9000"], "--port and --host have no effect without --serve"),
    (["--host", "0.0.0.0"], "--port and --host have no effect without --serve"),
    (["--report", "x.html", "--summary"], "--summary and --report cannot be used together"),
    (["--report", "x.html", "--json"], "--json works with"),
    (["--serve", "--grid", "g.png"], "--grid and --serve cannot be used together"),
    (["--serve", "-c", "3"], "--serve shows every sample"),
    (["--report", "x.html", "-f", "jpg"], "--report reads every field"),
])
def test_report_and_serve_usage_errors(cli, content_shard, args, said):
    r = cli.run(tarshow, [content_shard, *args])
    assert r.exit_code == 2 and said in r.stderr, r.stderr


def test_serve_calls_the_viewer(cli, content_shard, monkeypatch):
    import types

    calls = []
    fake = types.ModuleType("tarproc.view.server")
    fake.serve = lambda urls, host, port, quiet, *, classes: calls.append((urls, host, port, quiet))
    monkeypatch.setitem(sys.modules, "tarproc.view.server", fake)
    import tarproc.view

    monkeypatch.setattr(tarproc.view, "server", fake, raising=False)
    r = cli.run(tarshow, [content_shard, content_shard, "--serve"])
    assert r.exit_code == 0, r.stderr
    r = cli.run(tarshow, [content_shard, "--serve", "--port", "0", "--host", "::1", "-q"])
    assert r.exit_code == 0, r.stderr
    assert calls == [([str(content_shard)] * 2, "127.0.0.1", 8000, False), ([str(content_shard)], "::1", 0, True)]


def test_help_shows_the_new_options_with_examples(cli):
    r = cli.run(tarshow, ["--help"])
    for said in ("--report PATH", "--sample N", "--seed", "--serve", "--port", "--host", "--bytes-only",
                 "--report report.html --sample 48 --seed 1", "--serve "):
        assert said in r.stdout, said


def test_report_ctrl_c_leaves_nothing(content_shard, tmp_path):
    # the input never ends (pipe: a shard, then a long wait); once the report's temporary file
    # exists the read is under way: Ctrl-C then ends with 130, one line, and no file of the report
    import signal
    import time

    from tarhelpers import wait_for

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    source = f"pipe:cat {content_shard}; sleep 60"
    proc = subprocess.Popen([sys.executable, "-m", "tarproc.cli.tarshow", source, "--report", str(out_dir / "r.html"),
                             "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: os.listdir(out_dir), what="the report's temporary file appearing")
        time.sleep(0.3)  # the scenario: a signal while it waits on its input
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.decode().count("\n") == 1 and "Traceback" not in err.decode()
    assert os.listdir(out_dir) == []


# issue 35: --serve --summary, the summary's problems in the viewer


def test_serve_summary_is_accepted(cli, content_shard, monkeypatch):
    import types

    from tarproc.tar import ReadPolicy
    from tarproc.view.summary import SummaryOptions

    calls = []
    fake = types.ModuleType("tarproc.view.server")
    fake.serve = lambda urls, host, port, quiet, **kw: calls.append(kw)
    monkeypatch.setitem(sys.modules, "tarproc.view.server", fake)
    import tarproc.view

    monkeypatch.setattr(tarproc.view, "server", fake, raising=False)
    for args in (["--serve", "--summary"], ["--summary", "--serve", "--decode", "-p", "2", "--ignore-zeros"],
                 ["--serve", "--summary", "--bytes-only"], ["--serve"]):
        r = cli.run(tarshow, [content_shard, *args])
        assert r.exit_code == 0, r.stderr
    assert calls == [
        {"classes": None, "summary": SummaryOptions()},
        {"classes": None, "summary": SummaryOptions(decode=2, policy=ReadPolicy(ignore_zeros=True))},
        {"classes": None, "summary": SummaryOptions(content=False)},
        {"classes": None},  # no summary: the viewer as before
    ]


@pytest.mark.parametrize("args, said", [
    (["--serve", "--decode"], "--decode works with --summary and --report only (and with --serve --summary)"),
    (["--serve", "--decode", "-p", "2"], "--decode works with --summary and --report only"),
    (["--serve", "--summary", "--strict"], "--strict has no effect with --serve"),
    (["--serve", "--summary", "--json"], "--json works with"),
    (["--serve", "--summary", "-c", "3"], "--serve shows every sample"),
    (["--serve", "--summary", "-f", "jpg"], "--serve shows every sample"),
    (["--serve", "--summary", "--report", "x.html"], "--report and --serve cannot be used together"),
    (["--serve", "--summary", "--decode", "--bytes-only"], "cannot be used with --bytes-only"),
])
def test_serve_summary_usage_errors(cli, content_shard, args, said):
    r = cli.run(tarshow, [content_shard, *args])
    assert r.exit_code == 2 and said in r.stderr, r.stderr


def test_help_shows_serve_summary_with_an_example(cli):
    r = cli.run(tarshow, ["--help"])
    text = " ".join(r.stdout.split())
    assert "--serve --summary --decode -p 4 # and list every problem" in text
    assert "--serve --summary also reads every sample once in the background" in text
    assert "with --serve: list its problems in the viewer" in text
