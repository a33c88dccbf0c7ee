"""tarcreate / tsv2tar: plans in three formats, @file fields, keys, errors naming row/column/path,
determinism, and the tar2tsv -> tarcreate round trip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tarproc.cli.tar2tsv import main as tar2tsv
from tarproc.cli.tarcreate import main as tarcreate
from tarproc.cli.tarcreate import tsv2tar

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 3


@pytest.fixture
def images(tmp_path):
    d = tmp_path / "data"
    (d / "imgs").mkdir(parents=True)
    for i in range(3):
        (d / "imgs" / f"{i}.jpg").write_bytes(JPEG + bytes([i]))
    return d


def test_tsv_plan_with_files_and_literals(cli, images, tmp_path):
    plan = tmp_path / "plan.tsv"
    plan.write_text("__key__\t@jpg\tcls\ttxt\n" + "".join(f"s/{i}\timgs/{i}.jpg\t{i}\tline\\t{i}\n" for i in range(3)))
    r = cli.run(tarcreate, [plan, "-C", images, "-o", tmp_path / "out.tar"])
    assert r.exit_code == 0, r.stderr
    members = cli.members((tmp_path / "out.tar").read_bytes())
    assert members[:3] == [("s/0.cls", b"0"), ("s/0.jpg", JPEG + b"\x00"), ("s/0.txt", b"line\t0")]
    assert len(members) == 9


def test_output_is_deterministic(cli, images, tmp_path):
    plan = tmp_path / "plan.csv"
    plan.write_text("__key__,@jpg,cls\r\na,imgs/0.jpg,1\r\nb,imgs/1.jpg,2\r\n")
    outs = [cli.run(tarcreate, [plan, "-C", images]).stdout_bytes for _ in range(2)]
    assert outs[0] == outs[1] and len(outs[0]) % 10240 == 0
    assert [k for k, _ in cli.samples(outs[0])] == ["a", "b"]


def test_missing_file_one_line_naming_row_column_path(cli, images, tmp_path):
    plan = tmp_path / "plan.tsv"
    plan.write_text("__key__\t@jpg\n" + "".join(f"k{i}\timgs/{i}.jpg\n" for i in range(3)) + "k9\timgs/x.jpg\n")
    out = tmp_path / "out.tar"
    r = cli.run(tarcreate, [plan, "-C", images, "-o", out])
    assert r.exit_code == 1
    assert cli.one_line_error(r, "tarcreate") == f"tarcreate: error: {plan}: row 5, column jpg: no such file 'imgs/x.jpg'"
    assert not out.exists() and not cli.leftovers(tmp_path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("__key__\tcls\na\t1\nb\n", "row 3: 1 cells, but the header has 2 columns"),
        ("__key__\tcls\na\t1\na\t2\n", "row 3, column __key__: duplicate key 'a'"),
        ("__key__\t@jpg\na\t/etc/hostname\n", "row 2, column jpg: path '/etc/hostname' is absolute or leaves -C DIR"),
        ("__key__\t@jpg\na\t../x.jpg\n", "row 2, column jpg: path '../x.jpg' is absolute or leaves -C DIR"),
    ],
)
def test_plan_errors(cli, tmp_path, text, message):
    plan = tmp_path / "plan.tsv"
    plan.write_text(text)
    r = cli.run(tarcreate, [plan, "-o", tmp_path / "out.tar"])
    assert r.exit_code == 1
    assert cli.one_line_error(r, "tarcreate") == f"tarcreate: error: {plan}: {message}" + (
        "; use --absolute-names to allow it" if "absolute" in message else ""
    )
    assert not (tmp_path / "out.tar").exists()


def test_bad_jsonl_line(cli, tmp_path):
    plan = tmp_path / "plan.jsonl"
    plan.write_text('{"__key__": "a", "cls": 1}\n{"__key__": "b", cls: 2}\n')
    r = cli.run(tarcreate, [plan])
    assert r.exit_code == 1
    assert cli.one_line_error(r, "tarcreate").startswith(f"tarcreate: error: {plan}: row 2: bad JSON: ")


def test_absolute_names_option(cli, images, tmp_path):
    plan = tmp_path / "plan.tsv"
    plan.write_text(f"__key__\t@jpg\na\t{images}/imgs/2.jpg\nb\t../imgs/1.jpg\n")
    r = cli.run(tarcreate, [plan, "-P", "-C", images / "imgs"])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == [("a", {"jpg": JPEG + b"\x02"}), ("b", {"jpg": JPEG + b"\x01"})]


def test_key_numbering_stdin_and_sniffed_format(cli, images):
    plan = "@jpg\nimgs/0.jpg\nimgs/1.jpg\n"
    r = cli.run(tarcreate, ["-C", images, "--key", "img-%04d"], input=plan)
    assert r.exit_code == 0, r.stderr
    assert [k for k, _ in cli.samples(r.stdout_bytes)] == ["img-0000", "img-0001"]
    r = cli.run(tarcreate, ["--key-column", "name"], input='{"name": "x", "cls": 5}\n')
    assert cli.samples(r.stdout_bytes) == [("x", {"cls": b"5"})]


@pytest.mark.parametrize("args", [["--key", "abc"], ["--key", "%d.x"], ["--format", "xml"], ["--mode", "9z"]])
def test_usage_errors_exit_2(cli, args):
    r = cli.run(tarcreate, args, input="__key__\tcls\na\t1\n")
    assert r.exit_code == 2, r.stderr


def test_refuses_terminal(cli, monkeypatch):
    monkeypatch.setattr("tarproc.sinks.stdout_is_terminal", lambda: True)
    r = cli.run(tarcreate, [], input="__key__\tcls\na\t1\n")
    assert r.exit_code == 1 and "terminal" in r.stderr


def test_tsv2tar_alias(cli):
    r = cli.run(tsv2tar, ["--help"])
    assert r.exit_code == 0 and r.stdout.startswith("Usage: tsv2tar ")
    r = cli.run(tsv2tar, [], input="__key__\tcls\na\t1\n")
    assert cli.samples(r.stdout_bytes) == [("a", {"cls": b"1"})]
    r = cli.run(tsv2tar, [], input="__key__\tcls\na\t1\na\t2\n")
    assert cli.one_line_error(r, "tsv2tar") == "tsv2tar: error: -: row 3, column __key__: duplicate key 'a'"


def test_a_key_with_a_lone_surrogate_is_one_error(cli, tmp_path):
    """JSON can carry a lone surrogate (``"\\ud800"``); no tar name can: refused naming row and key."""
    plan = tmp_path / "plan.jsonl"
    plan.write_text('{"__key__": "k\\ud800", "cls": "1"}\n')
    r = cli.run(tarcreate, [plan])
    assert cli.one_line_error(r, "tarcreate") == (
        f"tarcreate: error: {plan}: row 1, column __key__: sample key 'k\\ud800' cannot be written: it holds the "
        "lone surrogate '\\ud800' (character 1), which no UTF-8 name can carry")


NASTY = ["tab\tx", "nl\nx", "cr\rx", "crlf\r\n", 'q "x", y', "bs\\t", "ü ✓", " sp ", "=1", "@a", "\\"]


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_round_trip_tar2tsv_tarcreate(cli, tmp_path, fmt):
    samples = [
        {"__key__": f"d{i % 3}/k{i:03d}", "txt": text, "cls": str(i), "json": json.dumps({"t": text, "i": i})}
        for i, text in enumerate(NASTY)
    ]
    src = cli.write_tar(tmp_path / "src.tar", samples)
    table = cli.run(tar2tsv, [src, "-f", "__key__ cls json txt", "--format", fmt])
    assert table.exit_code == 0, table.stderr
    back = cli.run(tarcreate, ["--format", fmt], input=table.stdout_bytes)
    assert back.exit_code == 0, back.stderr
    assert back.stdout_bytes == src.read_bytes()


def test_real_pipeline_round_trip(cli, tmp_path, shards):
    # the text fields of a shard, through two real processes, give the same tar as tarcat -f
    py = sys.executable
    cmd = (
        f"{py} -m tarproc.cli.tar2tsv {shards.paths[0]} -f '__key__ cls json' --format csv"
        f" | {py} -m tarproc.cli.tarcreate --format csv -o {tmp_path / 'back.tar'}"
    )
    subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], check=True, timeout=60)
    expected = cli.run(cli.tarcat, [shards.paths[0], "-f", "cls json"]).stdout_bytes
    assert (tmp_path / "back.tar").read_bytes() == expected


@pytest.fixture
def tree(tmp_path):
    """An image-folder tree: three classes (one with a dot in its name), a nested folder, upper-case
    and dotted file names, and a file that is not an image."""
    root = tmp_path / "train"
    files = {"cat/a.JPEG": b"A", "cat/b.v2_0001.jpg": b"B", "dog/c.png": b"C", "dog/sub/d.jpg": b"D",
             "bird.v2/e.webp": b"E", "dog/notes.txt": b"not an image"}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def test_classes_from_dirs(cli, tree, tmp_path):
    classes = tmp_path / "classes.txt"
    r = cli.run(tarcreate, ["--classes-from-dirs", tree, "--classes", classes, "--no-shuffle"])
    assert r.exit_code == 0, r.stderr
    assert classes.read_text() == "bird.v2\ncat\ndog\n"  # line i: label i (sorted, as ImageFolder)
    assert cli.samples(r.stdout_bytes) == [
        ("bird.v2/e", {"cls": b"0", "webp": b"E"}), ("cat/a", {"cls": b"1", "jpeg": b"A"}),
        ("cat/b_v2_0001", {"cls": b"1", "jpg": b"B"}), ("dog/c", {"cls": b"2", "png": b"C"}),
        ("dog/sub/d", {"cls": b"2", "jpg": b"D"}),
    ]
    assert "1 files without an image suffix left out" in r.stderr
    shuffled = [cli.run(tarcreate, ["--classes-from-dirs", tree, "--seed", seed]).stdout_bytes for seed in "112"]
    assert shuffled[0] == shuffled[1] != shuffled[2]  # the order: the seed's, across classes
    assert sorted(cli.samples(shuffled[0])) == cli.samples(r.stdout_bytes)


def test_classes_from_dirs_refuses_what_it_cannot_do(cli, tree, tmp_path):
    (tree / "cat" / "b_v2_0001.png").write_bytes(b"same key as b.v2_0001.jpg")
    r = cli.run(tarcreate, ["--classes-from-dirs", tree])
    assert cli.one_line_error(r, "tarcreate").endswith("'cat/b.v2_0001.jpg' and 'cat/b_v2_0001.png' both make the "
                                                       "sample key 'cat/b_v2_0001'")
    (tmp_path / "empty").mkdir()
    r = cli.run(tarcreate, ["--classes-from-dirs", tmp_path / "empty"])
    assert r.exit_code == 2 and "no class directories" in r.stderr
    r = cli.run(tarcreate, ["--classes-from-dirs", tree, "plan.tsv"])
    assert r.exit_code == 2 and "not both" in r.stderr
