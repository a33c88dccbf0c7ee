"""tar2tsv: columns, formats and escaping, missing and binary fields, damaged input, real pipes."""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import subprocess
import sys

import pytest

from tarproc.cli.tar2tsv import main as tar2tsv

TEXTS = ["plain", "tab\there", "two\nlines", "cr\rx", 'say "hi", ok', "back\\slash", "ünï ✓"]


@pytest.fixture
def texty(tmp_path, cli):
    samples = [
        {"__key__": f"k{i}", "cls": str(i), "txt": t, "json": json.dumps({"label": i, "box": [i, 2]})}
        for i, t in enumerate(TEXTS)
    ]
    return cli.write_tar(tmp_path / "texty.tar", samples)


def test_issue_example_columns(cli, shards):
    r = cli.run(tar2tsv, [shards.paths[0], "-f", "__key__ cls json.i jpg;png:size jpg;png:type"])
    assert r.exit_code == 0, r.stderr
    sizes = [200 + 97 * n for n in range(4)]
    assert r.stdout.splitlines() == ["__key__\tcls\tjson.i\tjpg;png:size\tjpg;png:type"] + [
        f"s0/{n:04d}\t{n}\t{n}\t{sizes[n]}\tbinary" for n in range(4)
    ]


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_formats_escape_everything(cli, texty, fmt):
    r = cli.run(tar2tsv, [texty, "-f", "__key__ txt json.box", "--format", fmt])
    assert r.exit_code == 0, r.stderr
    out = r.stdout
    if fmt == "tsv":
        lines = out.split("\n")[:-1]
        assert len(lines) == len(TEXTS) + 1
        assert lines[2] == "k1\ttab\\there\t[1,2]"
        assert lines[3] == "k2\ttwo\\nlines\t[2,2]"
        assert lines[5] == "k4\tsay \"hi\", ok\t[4,2]"
    elif fmt == "csv":
        rows = list(csv.reader(io.StringIO(out, newline="")))
        assert rows[0] == ["__key__", "txt", "json.box"]
        assert [r[1] for r in rows[1:]] == TEXTS
    else:
        objs = [json.loads(line) for line in out.splitlines()]
        assert [o["txt"] for o in objs] == TEXTS
        assert objs[0] == {"__key__": "k0", "txt": "plain", "json.box": [0, 2]}


def test_missing_field_empty_cell_or_strict_error(cli, shards):
    r = cli.run(tar2tsv, [shards.paths[0], "-f", "__key__ png:size", "--no-header"])
    assert r.stdout.splitlines() == ["s0/0000\t", "s0/0001\t297", "s0/0002\t", "s0/0003\t"]
    r = cli.run(tar2tsv, [shards.paths[0], "-f", "__key__ png:size", "--format", "jsonl", "-c", "1"])
    assert json.loads(r.stdout) == {"__key__": "s0/0000", "png:size": None}
    r = cli.run(tar2tsv, [shards.paths[0], "-f", "__key__ png:size", "--strict"])
    assert r.exit_code == 1
    assert cli.one_line_error(r, "tar2tsv") == (
        f"tar2tsv: error: {shards.paths[0]}: sample 's0/0000' has no 'png:size' (its fields: cls, jpg, json)"
    )


def test_binary_field_is_an_error_not_dumped(cli, shards, tmp_path):
    out = tmp_path / "t.tsv"
    r = cli.run(tar2tsv, [shards.paths[0], "-f", "__key__ jpg;png", "-o", out])
    assert r.exit_code == 1
    assert "sample 's0/0000': field 'jpg' is binary (200 bytes), not text; use jpg:size" in cli.one_line_error(
        r, "tar2tsv"
    )
    assert not out.exists() and not cli.leftovers(tmp_path)


def test_sha256_and_default_columns(cli, shards):
    r = cli.run(tar2tsv, [shards.paths[1], "-f", "k=__key__ h=jpg:sha256", "-c", "1"])
    data = shards.expected[4][1]["jpg"]
    assert r.stdout == f"k\th\ns1/0004\t{hashlib.sha256(data).hexdigest()}\n"
    r = cli.run(tar2tsv, [shards.paths[1], "--skip", "2", "-c", "1"])  # no -f: the first sample's fields
    assert r.stdout == '__key__\tcls\tjpg:size\tjson\ns1/0006\t6\t782\t{"i": 6}\n'


def test_count_skip_noheader_and_several_inputs(cli, shards):
    r = cli.run(tar2tsv, [*shards.paths, "-f", "__key__ __url__", "--skip", "3", "-c", "3", "--noheader"])
    assert r.stdout.splitlines() == [
        f"s0/0003\t{shards.paths[0]}", f"s1/0004\t{shards.paths[1]}", f"s1/0005\t{shards.paths[1]}"
    ]


def test_output_file_format_by_suffix_and_compression(cli, texty, tmp_path):
    r = cli.run(tar2tsv, [texty, "-f", "__key__ cls", "-o", tmp_path / "t.csv.gz"])
    assert r.exit_code == 0, r.stderr
    assert gzip.decompress((tmp_path / "t.csv.gz").read_bytes()).decode().startswith("__key__,cls\r\nk0,0\r\n")
    r = cli.run(tar2tsv, [texty, "-f", "__key__", "-o", tmp_path / "t.jsonl"])
    assert (tmp_path / "t.jsonl").read_text().splitlines()[0] == '{"__key__":"k0"}'


def test_stdin(cli, shards):
    data = open(shards.paths[2], "rb").read()
    r = cli.run(tar2tsv, ["-f", "__key__ cls", "--no-header", "-c", "2"], input=data)
    assert r.stdout == "s2/0008\t8\ns2/0009\t9\n"


@pytest.mark.parametrize(
    "args",
    [["-f", "jpg:bogus"], ["-f", "a a"], ["-f", ""], ["--format", "xml"], ["--no-header", "--format", "jsonl"]],
)
def test_usage_errors_exit_2(cli, shards, args):
    r = cli.run(tar2tsv, [shards.paths[0], *args])
    assert r.exit_code == 2, r.stderr


def test_damaged_input_names_file_and_offset(cli, shards, tmp_path):
    data = open(shards.paths[0], "rb").read()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:3000])
    out = tmp_path / "out.tsv"
    r = cli.run(tar2tsv, [cut, "-f", "__key__ cls", "-o", out])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tar2tsv")
    assert str(cut) in line and "at byte" in line
    assert not out.exists() and not cli.leftovers(tmp_path)


def test_real_pipe_head_ends_quietly(cli, tmp_path):
    path = cli.write_tar(tmp_path / "many.tar", ({"__key__": f"k{i:05d}", "cls": str(i)} for i in range(20000)))
    cmd = f"{sys.executable} -m tarproc.cli.tar2tsv {path} -f '__key__ cls' | head -n 2"
    p = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, text=True, timeout=60)
    assert p.stdout == "__key__\tcls\nk00000\t0\n"
    assert p.stderr == ""
    assert p.returncode == 141


def test_jsonl_is_valid_utf8_for_names_that_are_not(cli, tmp_path):
    """koi8-r member names (bytes that are not UTF-8): \\udcNN escapes, reversible, never invalid bytes."""
    import tarfile

    path = tmp_path / "koi8.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="koi8-r") as tf:
        for name in ("данные/кот.txt", "данные/пёс.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            tf.addfile(info, io.BytesIO(b"ok"))
    r = cli.run(tar2tsv, [str(path), "--format", "jsonl", "-f", "__key__ txt"])
    assert r.exit_code == 0, r.stderr
    lines = r.stdout_bytes.decode("utf-8").splitlines()  # strict: valid UTF-8
    keys = [json.loads(line)["__key__"].encode("utf-8", "surrogateescape").decode("koi8-r") for line in lines]
    assert keys == ["данные/кот", "данные/пёс"]


def test_a_column_no_sample_has_is_said_once(cli, texty):
    r = cli.run(tar2tsv, [texty, "-f", "__key__ json.nonexistent nope json.label"])
    assert r.exit_code == 0, r.stderr
    assert len(r.stdout.splitlines()) == len(TEXTS) + 1
    said = [line for line in r.stderr.splitlines() if "warning" in line]
    assert said == [f"tar2tsv: warning: column {c!r} is empty in all {len(TEXTS)} rows: no sample has that field or "
                    "JSON path (see the samples' fields with: tarshow -c 1 INPUT)" for c in ("json.nonexistent", "nope")]
