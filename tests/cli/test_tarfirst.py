"""tarfirst: the N-th member matching fields, a key or a regex; early stop; terminal manners."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tarproc.cli.tarfirst import main as tarfirst


def data_of(shards, n, field):
    return shards.expected[n][1][field]


def test_first_image_by_default(cli, shards):
    r = cli.run(tarfirst, shards.paths)
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == data_of(shards, 0, "jpg")
    r = cli.run(tarfirst, [*shards.paths, "--nth", "2"])  # sample 1 has a png instead of a jpg
    assert r.stdout_bytes == data_of(shards, 1, "png")


def test_fields_nth_key_regex(cli, shards):
    assert cli.run(tarfirst, [*shards.paths, "-f", "cls", "--nth", "6"]).stdout == "5"
    assert cli.run(tarfirst, [*shards.paths, "-f", "png;jpg", "--nth", "3"]).stdout_bytes == data_of(shards, 2, "jpg")
    r = cli.run(tarfirst, [*shards.paths, "--key", "s2/0009", "-f", "json"])
    assert r.stdout == '{"i": 9}'
    r = cli.run(tarfirst, [*shards.paths, "--regex", r"^s1/.*\.json$", "--nth", "2", "-v"])
    assert r.stdout == '{"i": 5}'
    assert r.stderr == f"tarfirst: wrote s1/0005.json (8 bytes) from {shards.paths[1]}\n"


def test_nothing_matches_exit_1_naming_inputs(cli, shards):
    r = cli.run(tarfirst, [shards.paths[0], "-f", "flac"])
    assert r.exit_code == 1 and r.stdout == ""
    assert cli.one_line_error(r, "tarfirst") == f"tarfirst: error: no member with fields flac in {shards.paths[0]}"
    r = cli.run(tarfirst, [*shards.paths, "-f", "png", "--nth", "4"])
    assert cli.one_line_error(r, "tarfirst") == (
        f"tarfirst: error: no member with fields png in {', '.join(shards.paths)} (found 3, asked for number 4)"
    )
    r = cli.run(tarfirst, [shards.paths[0], "--key", "nope", "-o", shards.dir / "x.jpg"])
    assert r.exit_code == 1 and not (shards.dir / "x.jpg").exists()


def test_stops_reading_before_damage(cli, shards, tmp_path):
    # the match is in sample 0; the shard is cut after sample 1: tarfirst never gets there
    data = open(shards.paths[0], "rb").read()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:7000])
    r = cli.run(tarfirst, [cut, "-f", "cls"])
    assert r.exit_code == 0 and r.stdout == "0"
    r = cli.run(tarfirst, [cut, "-f", "cls", "--nth", "4"])  # further in, the damage is found and named
    assert r.exit_code == 1 and str(cut) in cli.one_line_error(r, "tarfirst") and "at byte" in r.stderr


def test_binary_not_to_terminal_unless_force(cli, shards, monkeypatch):
    monkeypatch.setattr("tarproc.cli.tarfirst.stdout_is_terminal", lambda: True)
    r = cli.run(tarfirst, [shards.paths[0]])
    assert r.exit_code == 1 and r.stdout_bytes == b""
    assert "refusing to write binary data (binary, 200 bytes) to a terminal" in cli.one_line_error(r, "tarfirst")
    assert cli.run(tarfirst, [shards.paths[0], "--force"]).stdout_bytes == data_of(shards, 0, "jpg")
    assert cli.run(tarfirst, [shards.paths[0], "-f", "json"]).stdout == '{"i": 0}'  # text is fine


def test_output_file_bytes_as_they_are(cli, shards, tmp_path):
    out = tmp_path / "x.jpg.gz"  # a suffix does not compress a member's bytes
    r = cli.run(tarfirst, [shards.paths[0], "-o", out])
    assert r.exit_code == 0 and out.read_bytes() == data_of(shards, 0, "jpg")


def test_stdin(cli, shards):
    r = cli.run(tarfirst, ["-f", "cls"], input=open(shards.paths[1], "rb").read())
    assert r.stdout == "4"


@pytest.mark.parametrize("args", [["--nth", "0"], ["--regex", "("], ["-f", ";"]])
def test_usage_errors_exit_2(cli, shards, args):
    assert cli.run(tarfirst, [shards.paths[0], *args]).exit_code == 2


def test_real_pipe_source_is_stopped_early(cli, tmp_path):
    # 3 MB of samples, then a producer that would go on for a minute: tarfirst ends at once
    path = cli.write_tar(tmp_path / "big.tar", ({"__key__": f"k{i:03d}", "bin": bytes(100_000)} for i in range(30)))
    p = subprocess.run(  # the timeout, under the producer's minute, fails a tarfirst that waited for it
        [sys.executable, "-m", "tarproc.cli.tarfirst", f"pipe:cat {path}; sleep 600", "--regex", r"k001\.bin"],
        capture_output=True, timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout == bytes(100_000)


def test_verbose_escapes_the_member_name(cli, tmp_path):
    path = cli.write_tar(tmp_path / "esc.tar", [{"__key__": "k\x1b[31m", "cls": b"1"}])
    r = cli.run(tarfirst, [path, "-f", "cls", "-v", "-o", tmp_path / "out"])
    assert r.exit_code == 0, r.stderr
    assert "\x1b" not in r.stderr and "wrote k" in r.stderr
