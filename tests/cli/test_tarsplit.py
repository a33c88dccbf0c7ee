"""tarsplit in-process: limits, names, numbering, --maxshards, --post, --manifest, invariants."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import re

import pytest

import tarproc


def shard_files(directory, prefix="out-"):
    return sorted(n for n in os.listdir(directory) if n.startswith(prefix) and ".tmp-" not in n)


def read_shards(cli, directory, names):
    return [cli.samples(os.path.join(directory, n)) for n in names]


@pytest.fixture
def many(cli, tmp_path):
    """One tar of 40 samples of varied size (about 1.2 MB)."""
    samples = [cli.make_sample(f"k{i:04d}", i, size=1000 + (i * 7919) % 60000) for i in range(40)]
    (tmp_path / "in").mkdir()
    path = cli.write_tar(tmp_path / "in" / "many.tar", samples)
    return path, cli.expected_of(samples)


def test_maxcount(cli, shards, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    r = cli.run(cli.tarsplit, ["-n", "5", "-o", out / "out-%06d.tar", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == b""
    names = shard_files(out)
    assert names == ["out-000000.tar", "out-000001.tar", "out-000002.tar"]
    got = read_shards(cli, out, names)
    assert [len(s) for s in got] == [5, 5, 2]
    assert sum(got, []) == shards.expected
    assert cli.leftovers(out) == []


def test_reads_stdin_by_default(cli, shards, tmp_path):
    data = open(shards.paths[0], "rb").read()
    r = cli.run(cli.tarsplit, ["-n", "3", "-o", tmp_path / "out"], input=data)
    assert r.exit_code == 0, r.stderr
    names = shard_files(tmp_path)
    assert names == ["out-000000.tar", "out-000001.tar"]
    assert sum(read_shards(cli, tmp_path, names), []) == shards.expected[:4]


def test_prefix_gets_the_default_pattern(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-n", "4", "-o", tmp_path / "train", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert shard_files(tmp_path, "train") == [f"train-{i:06d}.tar" for i in range(3)]


def test_start_numbering(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-n", "4", "--start", "7", "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert shard_files(tmp_path) == ["out-000007.tar", "out-000008.tar", "out-000009.tar"]


def test_pattern_with_other_width(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-n", "6", "-o", tmp_path / "val-%03d.tar", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert shard_files(tmp_path, "val") == ["val-000.tar", "val-001.tar"]


def test_maxsize_bound_and_greedy(cli, many, tmp_path):
    path, expected = many
    maxsize = 200_000
    r = cli.run(cli.tarsplit, ["-s", "200KB", "-o", tmp_path / "out", path])
    assert r.exit_code == 0, r.stderr
    names = shard_files(tmp_path)
    assert len(names) >= 4
    got = read_shards(cli, tmp_path, names)
    assert sum(got, []) == expected
    for name, shard_samples in zip(names, got, strict=True):
        size = os.path.getsize(tmp_path / name)
        assert size % 10240 == 0
        assert size <= maxsize, (name, size)
        # the shard is exactly what TarWriter makes of its samples
        assert (tmp_path / name).read_bytes() == cli.tar_bytes({"__key__": k, **f} for k, f in shard_samples)
    # greedy: a shard was closed only because its next sample would not have fit
    for shard_samples, nxt in zip(got, got[1:], strict=False):
        with_next = cli.tar_bytes({"__key__": k, **f} for k, f in shard_samples + [nxt[0]])
        assert len(with_next) > maxsize


@pytest.mark.parametrize("maxsize", [20480, 30000, 51200])
def test_maxsize_bound_and_greedy_small_samples(cli, tmp_path, maxsize):
    samples = [cli.make_sample(f"k{i:04d}", i, size=100 + (i * 577) % 2500) for i in range(150)]
    path = cli.write_tar(tmp_path / "in.tar", samples)
    out = tmp_path / "out"
    out.mkdir()
    r = cli.run(cli.tarsplit, ["-s", str(maxsize), "-o", out / "s", path])
    assert r.exit_code == 0, r.stderr
    names = shard_files(out, "s-")
    got = read_shards(cli, out, names)
    assert sum(got, []) == cli.expected_of(samples)
    for name in names:
        assert os.path.getsize(out / name) <= maxsize, name
    for shard_samples, nxt in zip(got, got[1:], strict=False):
        assert len(cli.tar_bytes({"__key__": k, **f} for k, f in shard_samples + [nxt[0]])) > maxsize


@pytest.mark.parametrize("text, value", [("1e9", 10**9), ("500KB", 500_000), ("64KiB", 65536), ("0.5M", 500_000)])
def test_maxsize_units(cli, many, tmp_path, text, value):
    path, expected = many
    r = cli.run(cli.tarsplit, ["-s", text, "-v", "-o", tmp_path / "out", path])
    assert r.exit_code == 0, r.stderr
    names = shard_files(tmp_path)
    total = len(cli.tar_bytes({"__key__": k, **f} for k, f in expected))
    assert len(names) >= -(-total // value)  # at least ceil(total / maxsize) shards
    got = read_shards(cli, tmp_path, names)
    for name, shard_samples in zip(names, got, strict=True):
        # only a single sample bigger than the limit may make a bigger shard
        assert os.path.getsize(tmp_path / name) <= value or len(shard_samples) == 1
    if value >= total:
        assert names == ["out-000000.tar"]
    assert sum(got, []) == expected


def test_sample_bigger_than_maxsize_gets_its_own_shard(cli, tmp_path):
    small = [cli.make_sample(f"a{i}", i, size=100) for i in range(3)]
    big = cli.make_sample("big", 9, size=50_000)
    samples = small[:2] + [big] + small[2:]
    path = cli.write_tar(tmp_path / "in.tar", samples)
    r = cli.run(cli.tarsplit, ["-s", "20000", "-v", "-o", tmp_path / "out", path])
    assert r.exit_code == 0, r.stderr
    names = shard_files(tmp_path)
    got = read_shards(cli, tmp_path, names)
    assert [[k for k, _ in s] for s in got] == [["a0", "a1"], ["big"], ["a2"]]
    sizes = [os.path.getsize(tmp_path / n) for n in names]
    assert sizes[0] <= 20000 and sizes[1] > 20000 and sizes[2] <= 20000


def test_both_limits_verbose_says_which_closed_each_shard(cli, tmp_path):
    # 3 small samples, then 2 big ones (each ~6 KB data): -n 3 closes the first shard by count,
    # -s 21000 the second by size (two b's make 20480 bytes with the end record), the last one
    # ends with the input
    samples = [cli.make_sample(f"a{i}", i, size=100) for i in range(3)]
    samples += [cli.make_sample(f"b{i}", i, size=6000) for i in range(3)]
    path = cli.write_tar(tmp_path / "in.tar", samples)
    r = cli.run(cli.tarsplit, ["-n", "3", "-s", "21000", "-v", "-o", tmp_path / "out", path])
    assert r.exit_code == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    names = shard_files(tmp_path)
    got = read_shards(cli, tmp_path, names)
    assert [[k for k, _ in s] for s in got] == [["a0", "a1", "a2"], ["b0", "b1"], ["b2"]]
    assert len(lines) == 3
    for line, name, shard_samples, closed in zip(lines, names, got, ["maxcount", "maxsize", "end"], strict=True):
        assert name in line
        assert f"{len(shard_samples)} samples" in line
        assert f"{os.path.getsize(tmp_path / name)} bytes" in line
        assert line.endswith(f"(closed by {closed})")


def test_default_limit_is_1e9_bytes(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-v", "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert shard_files(tmp_path) == ["out-000000.tar"]
    assert "closed by end" in r.stderr


def test_compressed_shards_by_suffix(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-n", "6", "-o", tmp_path / "out-%02d.tar.gz", *shards.paths])
    assert r.exit_code == 0, r.stderr
    names = shard_files(tmp_path)
    assert names == ["out-00.tar.gz", "out-01.tar.gz"]
    for name in names:
        data = (tmp_path / name).read_bytes()
        assert data[:2] == b"\x1f\x8b"
        gzip.decompress(data)
    assert sum(read_shards(cli, tmp_path, names), []) == shards.expected


def test_never_splits_a_sample(cli, many, tmp_path):
    path, expected = many
    r = cli.run(cli.tarsplit, ["-s", "70000", "-o", tmp_path / "out", path])
    assert r.exit_code == 0, r.stderr
    names = shard_files(tmp_path)
    seen: dict[str, str] = {}
    for name in names:
        for member, _ in cli.members((tmp_path / name).read_bytes()):
            key = member.split(".", 1)[0]
            assert seen.setdefault(key, name) == name, f"sample {key} split over {seen[key]} and {name}"
    assert sorted(seen) == sorted(k for k, _ in expected)
    # every sample is complete in its shard
    assert sum(read_shards(cli, tmp_path, names), []) == expected


def test_empty_input_writes_no_shard(cli, tmp_path):
    empty = cli.write_tar(tmp_path / "empty.tar", [])
    assert empty.read_bytes() == bytes(10240)
    r = cli.run(cli.tarsplit, ["-n", "2", "-v", "-o", tmp_path / "out", empty])
    assert r.exit_code == 0, r.stderr
    assert shard_files(tmp_path) == []
    assert cli.leftovers(tmp_path) == []
    assert "no shard written" in r.stderr


def test_input_with_only_unkeyed_names_writes_no_shard(cli, tmp_path):
    import io
    import tarfile

    path = tmp_path / "dirs.tar"
    with tarfile.open(path, "w") as tf:
        for name in ["d", "d/e"]:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            tf.addfile(info)
        info = tarfile.TarInfo("d/e/.hidden")
        info.size = 1
        tf.addfile(info, io.BytesIO(b"x"))
    r = cli.run(cli.tarsplit, ["-n", "2", "-o", tmp_path / "out", path])
    assert r.exit_code == 0, r.stderr
    assert shard_files(tmp_path) == []


def test_maxshards_exceeded_is_an_error(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-n", "5", "--maxshards", "2", "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarsplit")
    assert "--maxshards" in line and "2 shard" in line
    assert "s2/0010" in line  # the first sample that did not fit
    names = shard_files(tmp_path)
    assert names == ["out-000000.tar", "out-000001.tar"]
    assert sum(read_shards(cli, tmp_path, names), []) == shards.expected[:10]
    assert cli.leftovers(tmp_path) == []


def test_maxshards_exactly_enough(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-n", "4", "--maxshards", "3", "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert len(shard_files(tmp_path)) == 3


def test_post_runs_on_each_shard(cli, shards, tmp_path):
    log = tmp_path / "post.log"
    r = cli.run(cli.tarsplit, ["-n", "5", "--post", f"cp {{}} {{}}.copy && echo {{}} >> {log}",
                               "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 0, r.stderr
    names = shard_files(tmp_path)
    shards_ = [n for n in names if n.endswith(".tar")]
    assert shards_ == [f"out-{i:06d}.tar" for i in range(3)]
    for name in shards_:
        # the post command saw the finished shard under its final name
        assert (tmp_path / (name + ".copy")).read_bytes() == (tmp_path / name).read_bytes()
    assert log.read_text().split() == [str(tmp_path / n) for n in shards_]


def test_post_without_braces_appends_the_path(cli, shards, tmp_path):
    log = tmp_path / "post.log"
    script = tmp_path / "post.sh"
    script.write_text(f'#!/bin/sh\necho "$1" >> {log}\n')
    script.chmod(0o755)
    r = cli.run(cli.tarsplit, ["-n", "8", "--post", str(script), "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert log.read_text().split() == [str(tmp_path / f"out-{i:06d}.tar") for i in range(2)]


def test_post_path_is_shell_quoted(cli, shards, tmp_path):
    d = tmp_path / "dir with space; $x"
    d.mkdir()
    log = tmp_path / "post.log"
    r = cli.run(cli.tarsplit, ["-n", "20", "--post", f"ls -l {{}} > {log}", "-o", d / "out", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert "out-000000.tar" in log.read_text()


def test_failing_post_is_an_error(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-n", "5", "--post", "exit 3", "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarsplit")
    assert "--post" in line and "status 3" in line and "out-000000.tar" in line
    # it stopped at the first shard; that shard itself is complete
    assert shard_files(tmp_path) == ["out-000000.tar"]
    assert cli.samples(tmp_path / "out-000000.tar") == shards.expected[:5]
    assert cli.leftovers(tmp_path) == []


def test_manifest(cli, shards, tmp_path):
    manifest = tmp_path / "m.jsonl"
    r = cli.run(cli.tarsplit, ["-n", "5", "--manifest", manifest, "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 0, r.stderr
    lines = manifest.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    names = shard_files(tmp_path)
    assert len(records) == len(names) == 3
    counts = [5, 5, 2]
    for rec, name, count, i in zip(records, names, counts, range(3), strict=True):
        data = (tmp_path / name).read_bytes()
        assert rec["shard"] == str(tmp_path / name)
        assert rec["samples"] == count
        assert rec["bytes"] == len(data)
        assert rec["sha256"] == hashlib.sha256(data).hexdigest()
        keys = [k for k, _ in shards.expected[5 * i: 5 * i + count]]
        assert (rec["first_key"], rec["last_key"]) == (keys[0], keys[-1])
    assert [rec["closed_by"] for rec in records] == ["maxcount", "maxcount", "end"]


def test_manifest_of_compressed_shards_describes_the_files(cli, shards, tmp_path):
    manifest = tmp_path / "m.jsonl"
    r = cli.run(cli.tarsplit, ["-n", "7", "--manifest", manifest, "-o", tmp_path / "out-%d.tar.zst", *shards.paths])
    assert r.exit_code == 0, r.stderr
    for rec in map(json.loads, manifest.read_text().splitlines()):
        data = open(rec["shard"], "rb").read()
        assert rec["bytes"] == len(data)
        assert rec["sha256"] == hashlib.sha256(data).hexdigest()
        assert rec["tar_bytes"] % 10240 == 0 and rec["tar_bytes"] > rec["bytes"]


def test_manifest_of_empty_input_is_empty(cli, tmp_path):
    empty = cli.write_tar(tmp_path / "empty.tar", [])
    manifest = tmp_path / "m.jsonl"
    r = cli.run(cli.tarsplit, ["--manifest", manifest, "-o", tmp_path / "out", empty])
    assert r.exit_code == 0, r.stderr
    assert manifest.read_text() == ""


def test_shards_are_deterministic(cli, shards, tmp_path):
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
        assert cli.run(cli.tarsplit, ["-n", "5", "-o", tmp_path / d / "out", *shards.paths]).exit_code == 0
    for name in shard_files(tmp_path / "a"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_writer_options(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-n", "20", "--mtime", "1234567", "--uname", "u", "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 0, r.stderr
    for info in cli.infos((tmp_path / "out-000000.tar").read_bytes()):
        assert info.mtime == 1234567 and info.uname == "u"


def test_stats(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["--stats", "-n", "5", "-o", tmp_path / "out", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert "tarsplit: read 3 shard(s) (0 failed): 12 samples, 36 members" in r.stderr
    assert "tarsplit: wrote 12 samples in" in r.stderr


def test_version_and_help(cli):
    r = cli.run(cli.tarsplit, ["--version"])
    assert r.exit_code == 0 and r.stdout.strip() == f"tarsplit (tarproc) {tarproc.__version__}"
    r = cli.run(cli.tarsplit, ["-h"])
    assert r.exit_code == 0 and "Example" in r.stdout and re.search(r"-n, --maxcount", r.stdout)


def test_output_is_required(cli, shards):
    r = cli.run(cli.tarsplit, [shards.paths[0]])
    assert r.exit_code == 2
    assert "-o" in r.stderr


# -------------------------------------------------------------------------------------------------
# -o naming (issue 14): a tar suffix keeps its place and its compression, a directory gets shards
# inside it, and no shard name ever starts with '-'

MAGIC = {".tar.gz": b"\x1f\x8b", ".tgz": b"\x1f\x8b", ".tar.zst": b"\x28\xb5\x2f\xfd",
         ".tar.xz": b"\xfd7zXZ\x00", ".tar.bz2": b"BZh", ".tar": None}


def all_files(directory):
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


@pytest.mark.parametrize("suffix", list(MAGIC))
def test_tar_name_gets_the_number_before_its_suffix_and_is_compressed_by_it(cli, shards, tmp_path, suffix):
    out = tmp_path / "out"
    out.mkdir()
    r = cli.run(cli.tarsplit, ["-n", "5", "-o", out / f"val{suffix}", *shards.paths])
    assert r.exit_code == 0, r.stderr
    names = [f"val-{i:06d}{suffix}" for i in range(3)]
    assert all_files(out) == names
    for name in names:
        data = (out / name).read_bytes()
        if MAGIC[suffix] is None:
            assert data[257:262] == b"ustar"  # a plain tar
        else:
            assert data.startswith(MAGIC[suffix]), (name, data[:6])
    assert sum(read_shards(cli, out, names), []) == shards.expected


def test_gzip_tar_name_in_a_subdirectory(cli, shards, tmp_path):
    (tmp_path / "out").mkdir()
    r = cli.run(cli.tarsplit, ["-n", "20", "-o", tmp_path / "out" / "val.tar.gz", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert all_files(tmp_path / "out") == ["val-000000.tar.gz"]
    data = (tmp_path / "out" / "val-000000.tar.gz").read_bytes()
    assert data[:2] == b"\x1f\x8b"
    assert cli.samples(gzip.decompress(data)) == shards.expected


@pytest.mark.parametrize("slash", ["", "/"])
def test_existing_directory_gets_the_shards_inside(cli, shards, tmp_path, slash):
    d = tmp_path / "existing_dir"
    d.mkdir()
    r = cli.run(cli.tarsplit, ["-n", "5", "-o", f"{d}{slash}", *shards.paths])
    assert r.exit_code == 0, r.stderr
    names = [f"shard-{i:06d}.tar" for i in range(3)]
    assert all_files(d) == names
    assert sorted(os.listdir(tmp_path)) == ["existing_dir", "shard-0.tar", "shard-1.tar", "shard-2.tar"]
    assert sum(read_shards(cli, d, names), []) == shards.expected


def test_missing_directory_with_a_slash_is_an_error_not_a_dash_name(cli, shards, tmp_path):
    r = cli.run(cli.tarsplit, ["-n", "5", "-o", f"{tmp_path}/nowhere/", *shards.paths])
    assert r.exit_code == 1
    assert "does not exist" in cli.one_line_error(r, "tarsplit")
    assert not list(tmp_path.rglob("-*")) and not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("name", ["", ".tar", ".tar.gz", "-x", "-%03d.tar", "val.gz"])
def test_names_that_would_start_with_a_dash_are_usage_errors(cli, shards, tmp_path, name):
    out = tmp_path / "out"
    out.mkdir()
    target = f"{out}/{name}" if name else ""
    r = cli.run(cli.tarsplit, ["-n", "5", "-o", target, *shards.paths])
    assert r.exit_code == 2, r.stderr
    assert r.stderr.startswith("tarsplit: error: bad shard name") and "Traceback" not in r.stderr
    assert os.listdir(out) == []
    assert not list(tmp_path.glob("-*"))


def test_bad_name_fails_before_the_input_is_read(cli, tmp_path):
    manifest = tmp_path / "m.jsonl"
    r = cli.run(cli.tarsplit, ["-o", tmp_path / ".tar", "--manifest", manifest, tmp_path / "missing.tar"])
    assert r.exit_code == 2 and "bad shard name" in r.stderr and "missing.tar" not in r.stderr
    assert os.listdir(tmp_path) == []


def test_help_documents_the_naming_rule(cli):
    r = cli.run(cli.tarsplit, ["--help"])
    assert "val.tar.gz -> val-000000.tar.gz" in r.stdout and "out/shard-000000.tar" in r.stdout
    assert "start with '-'" in r.stdout
