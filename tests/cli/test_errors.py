"""The error boundary: data errors (exit 1, one line naming file and offset), usage errors (exit 2),
--traceback, --on-error skip-shard, duplicate policies, and nothing partial left behind."""

from __future__ import annotations

import gzip
import os
import re

import pytest


def commands(cli):
    return {"tarcat": (cli.tarcat, []), "tarsplit": (cli.tarsplit, ["-n", "100", "-o"])}


@pytest.fixture
def damaged(cli, shards, tmp_path):
    """Damaged versions of shard-0 (4 samples, 20480 bytes)."""
    data = open(shards.paths[0], "rb").read()
    d = tmp_path / "bad"
    d.mkdir()
    out = {}
    out["truncated"] = d / "truncated.tar"
    out["truncated"].write_bytes(data[:5000])  # in the padding of s0/0001.json (the 5th member)
    flipped = bytearray(data)
    flipped[1024 + 10] ^= 0x01  # the name of the second member's header
    out["checksum"] = d / "checksum.tar"
    out["checksum"].write_bytes(bytes(flipped))
    out["nontar"] = d / "notes.txt"
    out["nontar"].write_bytes(b"just some text that is long enough to fill a header block " * 20)
    out["short"] = d / "short.txt"
    out["short"].write_bytes(b"hello\n")
    out["empty"] = d / "empty.tar"
    out["empty"].write_bytes(b"")
    gz = gzip.compress(data)
    out["truncated_gz"] = d / "truncated.tar.gz"
    out["truncated_gz"].write_bytes(gz[: len(gz) // 2])
    out["corrupt_gz"] = d / "corrupt.tar.gz"
    out["corrupt_gz"].write_bytes(gz[:20] + bytes(b ^ 0x55 for b in gz[20:40]) + gz[40:])
    out["no_end"] = d / "no-end.tar"
    out["no_end"].write_bytes(data[:4096])  # ends cleanly after a member, without end blocks
    out["garbage_after_end"] = d / "garbage.tar"
    out["garbage_after_end"].write_bytes(data + b"GARBAGE")
    return out


# ----------------------------------------------------------------------------------------------
# data errors: exit 1, one line, names the file and the byte offset


@pytest.mark.parametrize(
    "kind, words, offset",
    [
        ("truncated", "truncated", 5000),
        ("checksum", "checksum", 1024),
        ("nontar", "not a tar archive", 0),
        ("short", "not a tar archive", 0),
        ("empty", "empty", 0),
        ("no_end", "end-of-archive", 4096),
        ("garbage_after_end", "garbage", 20480),
    ],
)
@pytest.mark.parametrize("prog", ["tarcat", "tarsplit"])
def test_damaged_input(cli, damaged, tmp_path, kind, words, offset, prog):
    command, args = commands(cli)[prog]
    if prog == "tarsplit":
        args = args + [str(tmp_path / "split")]
    r = cli.run(command, [*args, damaged[kind]])
    assert r.exit_code == 1, r.stderr
    line = cli.one_line_error(r, prog)
    assert str(damaged[kind]) in line
    assert words in line
    assert f"at byte {offset}" in line
    if prog == "tarsplit":
        assert r.stdout_bytes == b""
        assert [n for n in os.listdir(tmp_path) if n.startswith("split")] == []
        assert cli.leftovers(tmp_path) == []


def test_truncated_member_names_the_member(cli, damaged):
    r = cli.run(cli.tarcat, [damaged["truncated"]])
    line = cli.one_line_error(r, "tarcat")
    assert "member 's0/0001.json'" in line


def test_missing_input_names_it(cli, shards, tmp_path):
    missing = tmp_path / "nope" / "shard-9.tar"
    r = cli.run(cli.tarcat, [shards.paths[0], missing])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarcat")
    assert str(missing) in line and "no such file" in line


def test_missing_list_file(cli, tmp_path):
    r = cli.run(cli.tarcat, ["-T", tmp_path / "list.txt"])
    assert r.exit_code == 1
    assert str(tmp_path / "list.txt") in cli.one_line_error(r, "tarcat")


def test_directory_as_input(cli, tmp_path):
    r = cli.run(cli.tarcat, [tmp_path])
    assert r.exit_code == 1
    assert "directory" in cli.one_line_error(r, "tarcat")


def test_failing_pipe_source(cli, shards):
    r = cli.run(cli.tarcat, [f"pipe:cat {shards.paths[0]}; exit 4"])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarcat")
    assert "pipe:cat" in line and "status 4" in line


@pytest.mark.parametrize("kind", ["truncated_gz", "corrupt_gz"])
def test_damaged_gzip(cli, damaged, kind):
    r = cli.run(cli.tarcat, [damaged[kind]])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarcat")
    assert str(damaged[kind]) in line and "gzip" in line


def test_truncated_gzip_names_the_byte_offset(cli, damaged):
    r = cli.run(cli.tarcat, [damaged["truncated_gz"]])
    assert r.exit_code == 1
    assert re.search(r"at byte \d+", cli.one_line_error(r, "tarcat"))


def test_member_bigger_than_limit(cli, tmp_path):
    path = cli.write_tar(tmp_path / "big.tar", [{"__key__": "k", "bin": b"x" * 5000}])
    r = cli.run(cli.tarcat, ["--max-member-size", "4KB", path])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarcat")
    assert "k.bin" in line and "5000" in line and "at byte 0" in line


def test_output_directory_missing(cli, shards, tmp_path):
    r = cli.run(cli.tarcat, ["-o", tmp_path / "no" / "out.tar", shards.paths[0]])
    assert r.exit_code == 1
    assert "does not exist" in cli.one_line_error(r, "tarcat")


def test_output_is_a_directory(cli, shards, tmp_path):
    r = cli.run(cli.tarcat, ["-o", tmp_path, shards.paths[0]])
    assert r.exit_code == 1
    assert "directory" in cli.one_line_error(r, "tarcat")


# ----------------------------------------------------------------------------------------------
# duplicates


@pytest.fixture
def unsorted(cli, tmp_path):
    """Key 'a' reappears after 'b' (a tar made without --sort=name)."""
    a1 = cli.tar_bytes([{"__key__": "a", "txt": b"first"}])[:1024]
    b = cli.tar_bytes([{"__key__": "b", "txt": b"bee"}])[:1024]
    a2 = cli.tar_bytes([{"__key__": "a", "cls": b"second"}])
    path = tmp_path / "unsorted.tar"
    path.write_bytes(a1 + b + a2)
    return path


@pytest.fixture
def dupfield(cli, tmp_path):
    """Field 'txt' twice in sample 'a'."""
    one = cli.tar_bytes([{"__key__": "a", "txt": b"one"}])[:1024]
    two = cli.tar_bytes([{"__key__": "a", "txt": b"two"}, {"__key__": "c", "txt": b"c"}])
    path = tmp_path / "dupfield.tar"
    path.write_bytes(one + two)
    return path


def test_reappearing_key_is_an_error(cli, unsorted):
    r = cli.run(cli.tarcat, [unsorted])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarcat")
    assert str(unsorted) in line and "'a'" in line and "reappears at byte 2048" in line and "byte 0" in line


def test_duplicate_field_is_an_error(cli, dupfield):
    r = cli.run(cli.tarcat, [dupfield])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarcat")
    assert "duplicate field 'txt'" in line and "bytes 0 and 1024" in line


def test_dup_warn(cli, unsorted, dupfield):
    r = cli.run(cli.tarcat, ["--dup", "warn", unsorted, dupfield])
    assert r.exit_code == 0, r.stderr
    warnings = r.stderr.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("tarcat: warning: ") for w in warnings)
    assert "reappears" in warnings[0] and "duplicate field" in warnings[1]
    assert cli.members(r.stdout_bytes) == [("a.txt", b"first"), ("b.txt", b"bee"), ("a.txt", b"one"), ("c.txt", b"c")]


def test_dup_skip_is_silent(cli, unsorted, dupfield):
    r = cli.run(cli.tarcat, ["--dup", "skip", "--stats", unsorted, dupfield])
    assert r.exit_code == 0, r.stderr
    assert "warning" not in r.stderr
    assert "duplicates dropped: 2" in r.stderr
    assert [n for n, _ in cli.members(r.stdout_bytes)] == ["a.txt", "b.txt", "a.txt", "c.txt"]


def test_same_key_in_different_shards_is_fine(cli, shards):
    r = cli.run(cli.tarsplit, ["-n", "2", "-o", shards.dir / "x", shards.paths[0], shards.paths[0]])
    assert r.exit_code == 0, r.stderr


# ----------------------------------------------------------------------------------------------
# --on-error skip-shard


def test_skip_shard_goes_on(cli, shards, damaged, tmp_path):
    missing = tmp_path / "missing.tar"
    args = ["--on-error", "skip-shard", shards.paths[1], missing, damaged["truncated"], damaged["checksum"], shards.paths[2]]
    r = cli.run(cli.tarcat, args)
    assert r.exit_code == 0, r.stderr
    got = cli.samples(r.stdout_bytes, dup="skip")
    keys = [k for k, _ in got]
    # good shards complete; damaged ones up to the damage
    assert keys[:4] == [k for k, _ in shards.expected[4:8]]
    assert keys[-4:] == [k for k, _ in shards.expected[8:]]
    assert "s0/0000" in keys[4:-4]
    assert "s0/0003" not in keys
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 3
    assert str(missing) in lines[0] and str(damaged["truncated"]) in lines[1] and str(damaged["checksum"]) in lines[2]
    assert all("skipping" in line for line in lines)


def test_skip_shard_stats_report(cli, shards, damaged, tmp_path):
    r = cli.run(cli.tarsplit, ["--on-error", "skip-shard", "--stats", "-n", "5", "-o", tmp_path / "out",
                               shards.paths[0], damaged["nontar"]])
    assert r.exit_code == 0, r.stderr
    assert "read 2 shard(s) (1 failed)" in r.stderr
    assert re.search(r"tarsplit: skipped shard: .*notes\.txt: not a tar archive", r.stderr)


# ----------------------------------------------------------------------------------------------
# usage errors: exit 2


@pytest.mark.parametrize(
    "prog, args, words",
    [
        ("tarcat", ["--bogus"], "No such option"),
        ("tarcat", ["--slice", "abc"], "bad slice"),
        ("tarcat", ["--slice", "1:2:3:4"], "bad slice"),
        ("tarcat", ["--slice", "1:5:0"], "bad slice"),
        ("tarcat", ["--slice", "-1:5"], "bad slice"),
        ("tarcat", ["-f", "a:"], "bad field spec"),
        ("tarcat", ["-f", ":jpg"], "bad field spec"),
        ("tarcat", ["-f", "jpg jpg"], "twice"),
        ("tarcat", ["-f", " "], "empty field spec"),
        ("tarcat", ["--missing", "maybe"], "--missing"),
        ("tarcat", ["-c", "-1"], "--count"),
        ("tarcat", ["--shuffle", "0"], "--shuffle"),
        ("tarcat", ["--rekey", "abc"], "bad key format"),
        ("tarcat", ["--mode", "9x"], "bad --mode"),
        ("tarcat", ["--dup", "maybe"], "--dup"),
        ("tarcat", ["-", "-"], "stdin"),
        ("tarcat", ["--mtime", "soon"], "--mtime"),
        ("tarsplit", ["-s", "abc", "-o", "x"], "bad size"),
        ("tarsplit", ["-s", "12 parsecs", "-o", "x"], "bad size"),
        ("tarsplit", ["-s", "0", "-o", "x"], "maxsize"),
        ("tarsplit", ["-n", "0", "-o", "x"], "--maxcount"),
        ("tarsplit", ["-o", "x-%d-%d.tar"], "pattern"),
        ("tarsplit", ["-n", "1"], "-o"),
        ("tarsplit", ["--maxshards", "0", "-o", "x"], "--maxshards"),
        ("tarcat", ["--max-member-size", "lots"], "bad size"),
    ],
)
def test_usage_errors(cli, shards, tmp_path, monkeypatch, prog, args, words):
    command = cli.tarcat if prog == "tarcat" else cli.tarsplit
    monkeypatch.chdir(tmp_path)
    extra = [] if "-" in args or args == ["--bogus"] else [shards.paths[0]]
    r = cli.run(command, [*args, *extra])
    assert r.exit_code == 2, (r.stderr, r.stdout)
    assert words in r.stderr
    assert "Traceback" not in r.stderr
    assert "internal error" not in r.stderr
    assert r.stdout_bytes == b""
    assert "--help" in r.stderr  # says where to look
    assert [n for n in os.listdir(tmp_path) if n.startswith("x")] == []


@pytest.mark.parametrize("size", ["1.2.3", "1..2", ".", "1e", "e9", "-5", "1e-3"])
def test_malformed_number_size_is_a_usage_error(cli, shards, tmp_path, size):
    r = cli.run(cli.tarsplit, ["-s", size, "-o", tmp_path / "x", shards.paths[0]])
    assert r.exit_code == 2, r.stderr
    assert "bad size" in r.stderr and "internal error" not in r.stderr


def test_huge_size_is_a_usage_error(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-s", "1e999", "-o", tmp_path / "x", shards.paths[0]])
    assert r.exit_code == 2, r.stderr
    assert "internal error" not in r.stderr


@pytest.mark.parametrize("args", [["--uid", "-1"], ["--uname", "u" * 40], ["--gid", str(1 << 64)]])
def test_bad_writer_metadata_is_a_usage_error(cli, shards, args):
    r = cli.run(cli.tarcat, [*args, shards.paths[0]])
    assert r.exit_code == 2, r.stderr
    assert "internal error" not in r.stderr


# ----------------------------------------------------------------------------------------------
# --traceback


def test_traceback_flag(cli, damaged):
    r = cli.run(cli.tarcat, ["--traceback", damaged["truncated"]])
    assert r.exit_code == 1
    assert "Traceback (most recent call last)" in r.stderr
    assert "TarFormatError" in r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("tarcat: error: ")


def test_no_traceback_without_the_flag_even_for_internal_errors(cli, shards, monkeypatch):
    import tarproc.cli.tarcat as mod

    def boom(*a, **k):
        raise RuntimeError("kaboom\nsecond line")

    monkeypatch.setattr(mod, "write_tar", boom)
    r = cli.run(cli.tarcat, [shards.paths[0]])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarcat")
    assert "internal error: RuntimeError: kaboom" in line and "--traceback" in line
    r = cli.run(cli.tarcat, ["--traceback", shards.paths[0]])
    assert "Traceback (most recent call last)" in r.stderr and "kaboom" in r.stderr


# ----------------------------------------------------------------------------------------------
# nothing partial


def test_tarcat_output_not_created_on_failure(cli, shards, damaged, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for name in ["out.tar", "out.tar.gz"]:
        out = out_dir / name
        r = cli.run(cli.tarcat, ["-o", out, shards.paths[0], shards.paths[1], damaged["truncated"]])
        assert r.exit_code == 1
        assert str(damaged["truncated"]) in cli.one_line_error(r, "tarcat")
        assert not out.exists()
        assert os.listdir(out_dir) == []


def test_tarcat_failure_keeps_the_old_output(cli, shards, damaged, tmp_path):
    out = tmp_path / "out.tar"
    out.write_bytes(b"previous contents")
    r = cli.run(cli.tarcat, ["-o", out, shards.paths[0], damaged["checksum"]])
    assert r.exit_code == 1
    assert out.read_bytes() == b"previous contents"
    assert cli.leftovers(tmp_path) == []


def test_tarcat_large_output_not_created_on_failure(cli, tmp_path):
    # more than the writer's buffers hold, so the temporary file really had data on disk
    samples = [cli.make_sample(f"k{i:03d}", i, size=100_000) for i in range(40)]
    data = cli.tar_bytes(samples)
    bad = tmp_path / "bad.tar"
    bad.write_bytes(data[: len(data) - 20000])
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    r = cli.run(cli.tarcat, ["-o", out_dir / "out.tar", bad])
    assert r.exit_code == 1
    assert os.listdir(out_dir) == []


def test_tarsplit_failure_keeps_finished_shards_only(cli, shards, damaged, tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    # 8 good samples, then a shard that breaks in its second sample: -n 3 closes two shards
    # (6 samples), the third (2 good samples + 1 from the damaged shard) is being written
    r = cli.run(cli.tarsplit, ["-n", "3", "-o", out_dir / "s", shards.paths[1], shards.paths[2], damaged["truncated"]])
    assert r.exit_code == 1
    assert "truncated" in cli.one_line_error(r, "tarsplit")
    names = sorted(os.listdir(out_dir))
    assert names == ["s-000000.tar", "s-000001.tar"]
    got = [cli.samples(out_dir / n) for n in names]
    assert got == [shards.expected[4:7], shards.expected[7:10]]


def test_tarsplit_failure_with_compressed_shards(cli, shards, damaged, tmp_path):
    (tmp_path / "out").mkdir()
    r = cli.run(cli.tarsplit, ["-n", "3", "-o", tmp_path / "out" / "s-%d.tar.gz", shards.paths[1], damaged["checksum"]])
    assert r.exit_code == 1
    assert sorted(os.listdir(tmp_path / "out")) == ["s-0.tar.gz"]
    assert cli.samples(tmp_path / "out" / "s-0.tar.gz") == shards.expected[4:7]


def test_tarsplit_manifest_not_written_on_failure(cli, shards, damaged, tmp_path):
    manifest = tmp_path / "m.jsonl"
    r = cli.run(cli.tarsplit, ["-n", "2", "--manifest", manifest, "-o", tmp_path / "s", shards.paths[0],
                               damaged["truncated"]])
    assert r.exit_code == 1
    assert not manifest.exists()
    assert cli.leftovers(tmp_path) == []


def test_diagnostics_escape_terminal_control_characters(capsys):
    # names in messages come from the data; one place, the stderr writer, makes them harmless
    from tarproc.cli.common import say, warn

    warn("shard.tar: k\x1b]0;PWNED\x07\x1b[31m.jpg: cannot decode")
    say("two\nlines\x9b")
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err and "\x9b" not in err
    assert err == "warning: shard.tar: k\\x1b]0;PWNED\\x07\\x1b[31m.jpg: cannot decode\ntwo\nlines\\x9b\n"


def test_no_tar_is_read_from_a_terminal(tmp_path):
    """With no input and a terminal on stdin, the commands that read a tar refuse at once (exit 2)
    instead of waiting silently, as GNU tar does."""
    import os
    import pty
    import subprocess
    import sys

    leader, follower = pty.openpty()
    try:
        for command in (["tarcat", "-o", str(tmp_path / "x.tar")], ["tarshow"], ["tarsplit", "-o", str(tmp_path / "s-%d.tar")]):
            r = subprocess.run([sys.executable, "-m", "tarproc.cli.run", *command], stdin=follower, capture_output=True,
                               text=True, timeout=60)
            assert r.returncode == 2, (command, r.stderr)
            assert f"{command[0]}: error: refusing to read a tar archive from a terminal" in r.stderr
        assert not (tmp_path / "x.tar").exists()
    finally:
        os.close(leader)
        os.close(follower)


@pytest.mark.parametrize("command,args,status,message", [
    ("tarcat", ["--slice", "0:99999999999999999999", "IN"], 2, "bad slice '0:99999999999999999999'; numbers must be at most"),
    ("tarcat", ["x{a,b.tar"], 2, "unbalanced braces in 'x{a,b.tar'"),
    ("tarcat", ["x{1..99999999}.tar"], 2, "'x{1..99999999}.tar' expands to more than 1,000,000 URLs"),
    ("tarcat", ["x{1..2000}{1..2000}.tar"], 2, "expands to more than 1,000,000 URLs"),
    ("tarcreate", ["--key-format", "%.2147483647d", "PLAN"], 2, "bad key format '%.2147483647d': a width or precision over 255"),
    ("tarcreate", ["--key-format", "%.300d", "PLAN"], 2, "bad key format '%.300d'"),
    ("tarcreate", ["PLAN-NUL"], 1, "row 1, column txt: path 'x\\x00y' contains a NUL byte"),
    ("tarcreate", ["PLAN-SURROGATE"], 1, "row 1, column txt: text that is not valid Unicode ('\\ud800' at character 0)"),
], ids=["slice", "braces", "brace-range", "brace-product", "key-precision", "key-width", "nul-path", "surrogate"])
def test_bad_arguments_and_plans_are_one_line_errors(cli, tmp_path, command, args, status, message):
    from tarproc.cli.tarcreate import main as tarcreate

    (tmp_path / "in.tar").write_bytes(cli.tar_bytes([{"__key__": "a", "txt": b"x"}]))
    (tmp_path / "plan.jsonl").write_text('{"__key__": "a", "txt": "ok"}\n')
    (tmp_path / "nul.jsonl").write_text('{"__key__": "a", "@txt": "x\\u0000y"}\n')
    (tmp_path / "surrogate.jsonl").write_text('{"__key__": "a", "txt": "\\ud800"}\n')
    names = {"IN": "in.tar", "PLAN": "plan.jsonl", "PLAN-NUL": "nul.jsonl", "PLAN-SURROGATE": "surrogate.jsonl"}
    args = [str(tmp_path / names[a]) if a in names else a for a in args]
    r = cli.run(tarcreate if command == "tarcreate" else cli.tarcat, [*args, "-o", str(tmp_path / "out.tar")])
    assert r.exit_code == status, r.stderr
    assert message in r.stderr.splitlines()[0] and "internal error" not in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out.tar").exists()


def test_bad_braces_are_a_named_error_from_the_python_api():
    import tarproc
    from tarproc.errors import OptionError

    with pytest.raises(OptionError, match="unbalanced braces in 'x{a,b.tar'"):
        list(tarproc.read_samples("x{a,b.tar"))


@pytest.mark.parametrize("args,option", [
    (["-c", "5", "-c", "10"], "-c"), (["--count", "5", "-c10"], "-c"), (["--count=5", "--count", "1"], "--count"),
    (["--max-member-size", "1M", "--max-member-size", "2M"], "--max-member-size"),
])
def test_an_option_that_takes_one_value_given_twice_is_a_usage_error(cli, tmp_path, args, option):
    (tmp_path / "in.tar").write_bytes(cli.tar_bytes([{"__key__": "a", "txt": b"x"}]))
    r = cli.run(cli.tarcat, [*args, str(tmp_path / "in.tar")])
    assert r.exit_code == 2
    assert f"option {option} is given more than once" in r.stderr


def test_repeatable_options_flags_and_values_that_look_like_options_are_fine(cli, tmp_path):
    from tarproc.cli.tarproc import main as tarproc_main

    (tmp_path / "in.tar").write_bytes(cli.tar_bytes([{"__key__": "a", "txt": b"x"}]))
    r = cli.run(cli.tarcat, ["-q", "-q", "-T", "/dev/null", "-T", "/dev/null", str(tmp_path / "in.tar"), "-o",
                             str(tmp_path / "out.tar")])
    assert r.exit_code == 0, r.stderr
    r = cli.run(tarproc_main, ["-c", "-c", str(tmp_path / "in.tar"), "-o", str(tmp_path / "p.tar")])
    assert "is given more than once" not in r.stderr  # the value of -c is "-c" (a command), not a second -c


def test_a_brace_range_of_huge_numbers_is_refused_at_once():
    from tarproc.errors import OptionError
    from tarproc.sources import expand_urls

    with pytest.raises(OptionError, match="expands to more than 1,000,000 URLs"):
        expand_urls(["x{0..1000000000000000000000000000000000}.tar"])
