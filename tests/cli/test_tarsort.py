"""tarsort: key, field, numeric and random orders, duplicates, spilling to --tmpdir, errors, real pipes."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest
from tarhelpers import PATIENCE, wait_for

from tarproc.cli.tarsort import main as tarsort

SPILL = ["--buffer-size", "256KiB"]  # small enough that the shards below go through temporary runs


def keys(items):
    return [k for k, _ in items]


def make_shards(cli, directory, n_shards=3, per_shard=150, size=1500, seed=0):
    """Shards whose keys are interleaved across shards (each shard itself sorted, as tar --sort=name makes)."""
    rng = random.Random(seed)
    numbers = list(range(n_shards * per_shard))
    rng.shuffle(numbers)
    paths, everything = [], []
    for s in range(n_shards):
        mine = sorted(numbers[s * per_shard : (s + 1) * per_shard])
        samples = [
            {"__key__": f"k{n:05d}", "cls": str(n % 11).encode(), "bin": rng.randbytes(size),
             "json": b'{"label": %d}' % (n % 5)}
            for n in mine
        ]
        paths.append(str(cli.write_tar(directory / f"shard-{s}.tar", samples)))
        everything += samples
    return paths, cli.expected_of(everything)


@pytest.fixture
def data(cli, tmp_path):
    paths, expected = make_shards(cli, tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    return paths, expected, tmp


def test_sorts_by_key_across_shards_in_memory_and_spilled(cli, data):
    paths, expected, tmp = data
    want = sorted(expected)
    r = cli.run(tarsort, paths)
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == want
    r2 = cli.run(tarsort, [*paths, *SPILL, "--tmpdir", tmp, "--stats"])
    assert r2.exit_code == 0, r2.stderr
    assert r2.stdout_bytes == r.stdout_bytes  # byte-identical whether spilled or not
    assert "temporary runs" in r2.stderr and f"under {tmp}" in r2.stderr and "wrote 450 samples" in r2.stderr
    assert os.listdir(tmp) == []
    # an independent reader agrees on the member order
    names = [name for name, _ in cli.members(r.stdout_bytes)]
    assert names == [f"{k}.{f}" for k, fields in want for f in sorted(fields)]


def test_reverse(cli, data):
    paths, expected, tmp = data
    r = cli.run(tarsort, [*paths, "-r", *SPILL, "--tmpdir", tmp])
    assert keys(cli.samples(r.stdout_bytes)) == sorted(keys(expected), reverse=True)


@pytest.mark.parametrize("args, sort_key", [
    (["-k", "cls"], lambda s: s[1]["cls"].decode()),
    (["-k", "cls", "--numeric"], lambda s: int(s[1]["cls"])),
    (["-k", "json.label", "-n"], lambda s: int(s[1]["json"][10:-1])),
])
def test_field_sort_is_stable(cli, data, args, sort_key):
    paths, expected, tmp = data
    r = cli.run(tarsort, [*paths, *args, *SPILL, "--tmpdir", tmp])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == sorted(expected, key=sort_key)  # sorted() is stable too
    assert os.listdir(tmp) == []


def test_numeric_reverse_field(cli, data):
    paths, expected, _ = data
    r = cli.run(tarsort, [*paths, "-k", "cls", "-n", "-r"])
    assert cli.samples(r.stdout_bytes) == sorted(expected, key=lambda s: int(s[1]["cls"]), reverse=True)


def test_random_is_reproducible_and_a_permutation(cli, data):
    paths, expected, tmp = data
    a = cli.run(tarsort, [*paths, "--random", "--seed", "3"]).stdout_bytes
    b = cli.run(tarsort, [*paths, "--random", "--seed", "3", *SPILL, "--tmpdir", tmp]).stdout_bytes
    c = cli.run(tarsort, [*paths, "--random", "--seed", "4"]).stdout_bytes
    assert a == b and a != c
    got = cli.samples(a)
    assert sorted(got) == sorted(expected) and keys(got) != keys(expected)


def test_duplicate_key_is_an_error_naming_it(cli, tmp_path):
    a = cli.write_tar(tmp_path / "a.tar", [{"__key__": k, "txt": b"a"} for k in ["x1", "x2", "x3"]])
    b = cli.write_tar(tmp_path / "b.tar", [{"__key__": k, "txt": b"b"} for k in ["x2", "x4"]])
    out = tmp_path / "out.tar"
    r = cli.run(tarsort, [a, b, "-o", out])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarsort")
    assert f"duplicate key 'x2' (in {a} and {b})" in line and "--unique" in line
    assert not out.exists() and cli.leftovers(tmp_path) == []
    first = cli.samples(cli.run(tarsort, [a, b, "--unique", "first"]).stdout_bytes)
    last = cli.samples(cli.run(tarsort, [a, b, "-u", "last", "--stats"]).stdout_bytes)
    assert first == [(k, {"txt": b"b" if k == "x4" else b"a"}) for k in ["x1", "x2", "x3", "x4"]]
    assert last == [(k, {"txt": b"b" if k in ("x2", "x4") else b"a"}) for k in ["x1", "x2", "x3", "x4"]]


def test_missing_field(cli, tmp_path):
    shard = cli.write_tar(tmp_path / "a.tar", [
        {"__key__": "a", "cls": b"2"}, {"__key__": "b", "txt": b"-"}, {"__key__": "c", "cls": b"1"},
    ])
    r = cli.run(tarsort, [shard, "-k", "cls"])
    assert r.exit_code == 1
    assert f"{shard}: sample 'b' has no field 'cls'" in cli.one_line_error(r, "tarsort")
    r = cli.run(tarsort, [shard, "-k", "cls", "--missing", "last"])
    assert keys(cli.samples(r.stdout_bytes)) == ["c", "a", "b"]


def test_unparsable_number_names_key_field_and_value(cli, tmp_path):
    shard = cli.write_tar(tmp_path / "a.tar", [{"__key__": "a", "cls": b"2"}, {"__key__": "b", "cls": b"two"}])
    r = cli.run(tarsort, [shard, "-k", "cls", "-n"])
    assert r.exit_code == 1
    assert cli.one_line_error(r, "tarsort") == f"tarsort: error: {shard}: sample 'b': cls value 'two' is not a number"


@pytest.mark.parametrize("args", [
    ["--seed", "1"],
    ["--random", "-k", "cls"],
    ["--random", "-r"],
    ["-k", "cls", "--unique", "first"],
    ["--missing", "last"],
    ["--memory", "1000"],
    ["--memory", "lots"],
    ["--tmpdir", "/nonexistent/dir"],
])
def test_usage_errors_exit_2(cli, data, args):
    paths, _, _ = data
    r = cli.run(tarsort, [*paths, *args])
    assert r.exit_code == 2, r.stderr
    assert r.stdout_bytes == b""


@pytest.mark.parametrize("cut", [700, 60_000, 200_000])
def test_damaged_input_one_line_error_and_nothing_left(cli, data, tmp_path, cut):
    paths, _, tmp = data
    broken = tmp_path / "broken.tar"
    whole = open(paths[1], "rb").read()
    broken.write_bytes(whole[:cut])
    out = tmp_path / "out" / "sorted.tar"
    out.parent.mkdir()
    r = cli.run(tarsort, [paths[0], broken, "-o", out, *SPILL, "--tmpdir", tmp])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarsort")
    assert f"{broken}: truncated" in line and "at byte" in line
    assert os.listdir(out.parent) == [] and os.listdir(tmp) == []


def test_output_file_and_stdin(cli, data, tmp_path):
    paths, expected, _ = data
    out = tmp_path / "sorted.tar.gz"
    r = cli.run(tarsort, ["-", "-o", out], input=open(paths[2], "rb").read())
    assert r.exit_code == 0 and r.stdout_bytes == b""
    assert keys(cli.samples(str(out))) == sorted(keys(expected[300:]))


def test_help_has_examples(cli):
    r = cli.run(tarsort, ["--help"])
    assert r.exit_code == 0 and "Examples:" in r.stdout and "tarsort --random --seed" in r.stdout


# ---------------------------------------------------------------------------------------------
# real processes


def command(*args):
    return [sys.executable, "-m", "tarproc.cli.tarsort", *map(str, args)]


def test_subprocess_pipeline_with_head(data, tmp_path):
    paths, expected, tmp = data
    cmd = (
        f"set -o pipefail; cat {paths[0]} | {' '.join(command('-', '--buffer-size', '256KiB', '--tmpdir', tmp))}"
        " | tar -tf - | head -n 3"
    )
    r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    want = sorted(keys(expected[:150]))
    assert r.stdout.split() == [f"{want[0]}.bin", f"{want[0]}.cls", f"{want[0]}.json"], r.stderr
    # head left early: tarsort ends quietly (status 141 or 0, never a traceback) and removes its runs
    assert "Traceback" not in r.stderr and "error" not in r.stderr
    assert os.listdir(tmp) == []


def test_sigterm_while_spilling_removes_the_runs(cli, tmp_path):
    [shard], _ = make_shards(cli, tmp_path, n_shards=1, per_shard=1000, size=3000)
    tmp = tmp_path / "tmp"
    out = tmp_path / "out"
    tmp.mkdir()
    out.mkdir()
    # 3 MB of a shard, then a stall (pipes are read in 1 MiB blocks): tarsort has spilled runs
    # and waits for more input when the signal comes
    source = f"pipe:head -c {os.path.getsize(shard) - 1024} '{shard}'; exec sleep 600"
    p = subprocess.Popen(command(source, "--buffer-size", "256KiB", "--tmpdir", tmp, "-o", out / "s.tar"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: len([n for d in os.listdir(tmp) for n in os.listdir(tmp / d) if n.endswith(".tar")]) >= 2,
                 what="tarsort spilling two runs")
        time.sleep(0.2)  # the scenario: a signal while it waits for more input
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=PATIENCE)
    finally:
        if p.poll() is None:
            p.terminate()  # not kill: let it remove its runs and stop its pipe: child
            p.wait(timeout=20)
    assert p.returncode == 143, err
    assert err.decode().strip() == "tarsort: terminated"
    assert os.listdir(tmp) == [] and os.listdir(out) == []
