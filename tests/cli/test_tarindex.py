"""tarindex: the three formats, where they go, wds2idx parity, bad input, real pipes."""

from __future__ import annotations

import gzip
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tarproc.cli.tarindex import main as tarindex
from tarproc.index import IndexedShard, IndexFileError, build_index, parse_index


def test_default_outputs_next_to_each_shard(cli, shards):
    result = cli.run(tarindex, shards.paths)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == ""
    got = []
    for path in shards.paths:
        index = parse_index(Path(path + ".idx").read_text(), path + ".idx")
        assert index.shard == os.path.basename(path) and index.size == os.path.getsize(path)
        with IndexedShard(path) as ds:
            got += [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}) for s in ds]
    assert got == shards.expected
    assert cli.leftovers(shards.dir) == []


def test_output_to_stdout_and_file(cli, shards, tmp_path):
    result = cli.run(tarindex, ["-o", "-", shards.paths[0]])
    assert result.exit_code == 0
    index = parse_index(result.stdout)
    assert [e.key for e in index.entries] == [k for k, _ in shards.expected[:4]]
    out = tmp_path / "x.idx"
    assert cli.run(tarindex, ["-o", out, shards.paths[0]]).exit_code == 0
    assert out.read_text() == result.stdout
    assert not os.path.exists(shards.paths[0] + ".idx")


def test_one_output_for_many_shards_is_a_usage_error(cli, shards, tmp_path):
    result = cli.run(tarindex, ["-o", tmp_path / "x.idx", *shards.paths])
    assert result.exit_code == 2
    assert "-o takes a single shard" in result.stderr
    assert not (tmp_path / "x.idx").exists()


@pytest.mark.parametrize("args", [[], ["-"], ["pipe:cat x.tar"], ["--name", "n", "x.tar"]])
def test_usage_errors(cli, args):
    result = cli.run(tarindex, args, input=b"")
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("tarindex: error: ")


def test_dali_format_matches_wds2idx(cli, shards, tmp_path):
    """Byte for byte what DALI's own wds2idx writes for the same shard."""
    wds2idx = Path(sys.executable).parent / "wds2idx"
    if not wds2idx.exists() or shutil.which("tar") is None:
        pytest.skip("DALI's wds2idx (nvidia-dali) or GNU tar is not installed")
    for path in shards.paths:
        ours = tmp_path / (os.path.basename(path) + ".ours")
        assert cli.run(tarindex, ["--format", "dali", "-o", ours, path]).exit_code == 0
        theirs = tmp_path / (os.path.basename(path) + ".theirs")
        subprocess.run([str(wds2idx), path, str(theirs)], check=True, capture_output=True)
        assert ours.read_bytes() == theirs.read_bytes()
    # the default name is the one wds2idx picks: shard-0.tar -> shard-0.idx
    assert cli.run(tarindex, ["--format", "dali", shards.paths[1]]).exit_code == 0
    assert (shards.dir / "shard-1.idx").read_text().startswith("v1.2 4\n")


def test_dali_refuses_names_with_spaces(cli, tmp_path):
    path = cli.write_tar(tmp_path / "sp.tar", [{"__key__": "a b", "txt": b"x"}])
    result = cli.run(tarindex, ["--format", "dali", path])
    assert result.exit_code == 1
    assert "white space" in cli.one_line_error(result, "tarindex")
    assert not (tmp_path / "sp.idx").exists() and cli.leftovers(tmp_path) == []


def test_wids_descriptor(cli, shards, tmp_path):
    sub = tmp_path / "meta"
    sub.mkdir()
    out = sub / "train.json"
    result = cli.run(tarindex, ["--format", "wids", "--name", "train", "-o", out, *shards.paths])
    assert result.exit_code == 0, result.stderr
    desc = json.loads(out.read_text())
    assert desc["__kind__"] == "wids-shard-index-v1" and desc["wids_version"] == 1 and desc["name"] == "train"
    assert desc["shardlist"] == [
        {"url": f"../shard-{i}.tar", "nsamples": 4, "filesize": os.path.getsize(p)}
        for i, p in enumerate(shards.paths)
    ]
    # to stdout, shards are named as given
    result = cli.run(tarindex, ["--format", "wids", shards.paths[0]])
    assert json.loads(result.stdout)["shardlist"][0]["url"] == shards.paths[0]


def test_wids_reads_our_descriptor(cli, shards, tmp_path, monkeypatch):
    wids = pytest.importorskip("wids")
    out = tmp_path / "train.json"
    assert cli.run(tarindex, ["--format", "wids", "-o", out, *shards.paths]).exit_code == 0
    monkeypatch.setenv("WIDS_CACHE", str(tmp_path / "cache"))
    ds = wids.ShardListDataset(str(out), transformations=[])
    assert len(ds) == 12
    for i in (0, 5, 11):
        sample = ds[i]
        key, fields = shards.expected[i]
        assert sample["__key__"] == key
        assert {k[1:]: v.read() if hasattr(v, "read") else v for k, v in sample.items() if k.startswith(".")} == fields


def test_compressed_shard(cli, shards, tmp_path):
    tmp_path = tmp_path / "bad"
    tmp_path.mkdir()
    gz = tmp_path / "c.tar.gz"
    gz.write_bytes(gzip.compress(Path(shards.paths[0]).read_bytes()))
    result = cli.run(tarindex, [gz])
    assert result.exit_code == 1
    line = cli.one_line_error(result, "tarindex")
    assert line == (
        f"tarindex: error: {gz}: compressed (gzip) shard: random access needs a plain tar; "
        f"decompress it first (tarcat {gz} -o {tmp_path / 'c.tar'})"
    )
    assert sorted(os.listdir(tmp_path)) == ["c.tar.gz"]


def test_truncated_shard_leaves_no_index(cli, shards, tmp_path):
    tmp_path = tmp_path / "bad"
    tmp_path.mkdir()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(Path(shards.paths[2]).read_bytes()[:3000])
    result = cli.run(tarindex, [cut])
    assert result.exit_code == 1
    line = cli.one_line_error(result, "tarindex")
    assert f"{cut}: truncated" in line and "at byte " in line
    assert sorted(os.listdir(tmp_path)) == ["cut.tar"]


def test_skip_shard_goes_on(cli, shards, tmp_path):
    cut = tmp_path / "cut.tar"
    cut.write_bytes(Path(shards.paths[2]).read_bytes()[:3000])
    result = cli.run(tarindex, ["--on-error", "skip-shard", "--format", "wids", shards.paths[0], cut, shards.paths[1]])
    assert result.exit_code == 0
    assert "warning: " in result.stderr and "cut.tar: truncated" in result.stderr
    urls = [s["url"] for s in json.loads(result.stdout)["shardlist"]]
    assert urls == [shards.paths[0], shards.paths[1]]


@pytest.mark.parametrize("where", ["sibling", "elsewhere"])
def test_the_command_a_stale_index_error_names_rebuilds_it(cli, shards, tmp_path, where):
    """IndexedShard's stale-index error ends with a tarindex command line; running it is the fix."""
    path = shards.paths[0]
    idx = path + ".idx" if where == "sibling" else str(tmp_path / "elsewhere.idx")
    args = [path] if where == "sibling" else ["-o", idx, path]
    assert cli.run(tarindex, args).exit_code == 0
    cli.write_tar(path, [{"__key__": "new", "txt": b"rewritten shard"}])
    with pytest.raises(IndexFileError) as e:
        IndexedShard(path, index=None if where == "sibling" else idx)
    command = str(e.value).rsplit("rebuild it with: ", 1)[1]
    assert str(e.value).startswith(f"{idx}: stale index: ") and command.split()[0] == "tarindex"
    assert cli.run(tarindex, shlex.split(command)[1:]).exit_code == 0
    with IndexedShard(path, index=None if where == "sibling" else idx) as ds:
        assert ds.keys() == ["new"] and ds.index_url == idx and ds["new"]["txt"] == b"rewritten shard"


def test_links_and_ignore_zeros_reach_the_index(cli, shards, tmp_path):
    """--links and -i (shared reading options) used to be accepted and ignored by tarindex."""
    linked = tmp_path / "l.tar"
    with tarfile.open(linked, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in [("a.txt", b"x" * 3000), ("b.txt", None), ("c.txt", b"z")]:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.linkname = tarfile.LNKTYPE, "a.txt"
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    result = cli.run(tarindex, [linked])
    assert result.exit_code == 1
    assert "member 'b.txt' is a link or a sparse file" in cli.one_line_error(result, "tarindex")
    assert not Path(str(linked) + ".idx").exists()
    assert cli.run(tarindex, ["--links", "skip", linked]).exit_code == 0
    with IndexedShard(linked) as ds:
        assert ds.keys() == ["a", "c"] and ds["c"]["txt"] == b"z"

    joined = tmp_path / "cat.tar"
    joined.write_bytes(Path(shards.paths[0]).read_bytes() + Path(shards.paths[1]).read_bytes())
    result = cli.run(tarindex, [joined])
    assert result.exit_code == 1 and "garbage after the end-of-archive" in cli.one_line_error(result, "tarindex")
    assert cli.run(tarindex, ["-i", joined]).exit_code == 0
    with IndexedShard(joined) as ds:
        assert [(s["__key__"], {k: v for k, v in s.items() if not k.startswith("__")}) for s in ds] == \
            shards.expected[:8]


def test_verbose_says_what_was_written(cli, shards):
    result = cli.run(tarindex, ["-v", shards.paths[0]])
    assert result.stderr == f"tarindex: {shards.paths[0]}: 4 samples, {os.path.getsize(shards.paths[0])} bytes " \
        f"-> {shards.paths[0]}.idx\n"


def test_help(cli):
    result = cli.run(tarindex, ["--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.stdout and "tarindex --format dali" in result.stdout


def test_real_pipes(shards, tmp_path):
    """A real subprocess: the index on stdout through head, and a quiet end when head stops early."""
    cmd = [sys.executable, "-m", "tarproc.cli.tarindex"]
    proc = subprocess.run(
        f"{' '.join(cmd)} -o - {shards.paths[0]} | head -2", shell=True, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0 and proc.stderr == ""
    lines = proc.stdout.splitlines()
    assert json.loads(lines[0])["samples"] == 4 and json.loads(lines[1])["key"] == shards.expected[0][0]
    # a made-up shard big enough that the index doesn't fit a pipe's buffer
    big = tmp_path / "many.tar"
    from tarhelpers import write_tar

    write_tar(big, ({"__key__": f"k{i:06d}", "txt": b"x"} for i in range(20000)))
    proc = subprocess.run(
        f"set -o pipefail; {' '.join(cmd)} -o - {big} | head -c 100 >/dev/null; echo ${{PIPESTATUS[0]}}",
        shell=True, capture_output=True, text=True, executable="/bin/bash", timeout=60,
    )
    assert proc.stdout.strip() == "141" and proc.stderr == ""
    assert build_index(str(big)).entries[-1].key == "k019999"


# issue 35: other tools' index files beside the shards


def _energon_index(shard: str) -> bytes:
    """What ``energon prepare`` writes to SHARD.tar.idx: each sample's first header, then the end."""
    offsets = [e.offset for e in build_index(shard).entries]
    with tarfile.open(shard) as tar:
        for _ in tar:
            pass
        offsets.append(tar.offset)
    return b"".join(n.to_bytes(8, "little") for n in offsets)


def test_energon_index_is_never_overwritten_without_overwrite(cli, shards):
    energon = _energon_index(shards.paths[1])
    target = Path(shards.paths[1] + ".idx")
    target.write_bytes(energon)
    result = cli.run(tarindex, shards.paths)
    assert result.exit_code == 1
    line = cli.one_line_error(result, "tarindex")
    assert line == (f"tarindex: error: {target}: an energon index (megatron-energon's energon prepare) is there; "
                    "tarindex doesn't replace another tool's index: write yours elsewhere with -o, or give "
                    "--overwrite to replace it")
    assert target.read_bytes() == energon
    assert not os.path.exists(shards.paths[0] + ".idx")  # checked before any is written
    result = cli.run(tarindex, ["--overwrite", *shards.paths])
    assert result.exit_code == 0, result.stderr
    assert parse_index(target.read_text()).size == os.path.getsize(shards.paths[1])


def test_other_tools_indexes_at_the_target(cli, shards, tmp_path):
    """A DALI index where a tarproc one would go, a wids descriptor at -o: refused the same way;
    an index of the format being written is replaced as before."""
    shard = shards.paths[0]
    dali = Path(shard + ".idx")
    dali.write_text(build_index(shard).dali_text())
    result = cli.run(tarindex, [shard])
    assert result.exit_code == 1 and "a DALI index (wds2idx) is there" in cli.one_line_error(result, "tarindex")
    assert cli.run(tarindex, ["--format", "dali", "-o", dali, shard]).exit_code == 0
    wids = tmp_path / "train.json"
    assert cli.run(tarindex, ["--format", "wids", "-o", wids, shard]).exit_code == 0
    assert cli.run(tarindex, ["--format", "wids", "-o", wids, shard]).exit_code == 0
    result = cli.run(tarindex, ["-o", wids, shard])
    assert result.exit_code == 1 and f"{wids}: a wids descriptor is there" in cli.one_line_error(result, "tarindex")
    assert json.loads(wids.read_text())["__kind__"] == "wids-shard-index-v1"


def test_check_says_what_each_index_is(cli, shards):
    first, second, third = shards.paths
    Path(first + ".idx").write_bytes(_energon_index(first))
    assert cli.run(tarindex, [second]).exit_code == 0
    assert cli.run(tarindex, ["--format", "dali", second, third]).exit_code == 0
    result = cli.run(tarindex, ["--check", *shards.paths])
    assert result.exit_code == 0, result.stderr
    dali = [p[: -len(".tar")] + ".idx" for p in shards.paths]
    assert result.stdout.splitlines() == [
        f"{first}.idx: energon index (4 samples) matches {first}",
        f"{second}.idx: tarproc index (4 samples) matches {second}",
        f"{dali[1]}: DALI index (4 samples) matches {second}",
        f"{dali[2]}: DALI index (4 samples) matches {third}",
    ]
    assert result.stderr == ""


def test_check_fails_on_an_index_that_disagrees(cli, shards):
    first, second, _ = shards.paths
    energon = _energon_index(first)
    Path(first + ".idx").write_bytes(energon[:8] + (int.from_bytes(energon[8:16], "little") + 512).to_bytes(8, "little")
                                     + energon[16:])
    result = cli.run(tarindex, ["--check", first])
    assert result.exit_code == 1
    line = cli.one_line_error(result, "tarindex")
    assert line.startswith(f"tarindex: error: {first}.idx: energon index doesn't match {first}: byte 8: sample 1 ")
    # a shard without an index, and skip-shard: each a warning, exit 1 at the end
    result = cli.run(tarindex, ["--check", "--on-error", "skip-shard", first, second])
    assert result.exit_code == 1 and result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"tarindex: warning: {first}.idx: energon index doesn't match")
    assert lines[1].startswith(f"tarindex: warning: {second}: no index file (looked for {second}.idx and ")
    assert lines[2] == "tarindex: error: 2 of 2 shards have no index that matches them"


@pytest.mark.parametrize("args", [["--check", "--format", "dali"], ["--check", "--overwrite"],
                                  ["--check", "-o", "-"]])
def test_check_usage_errors(cli, shards, args):
    result = cli.run(tarindex, [*args, shards.paths[0]])
    assert result.exit_code == 2 and result.stderr.startswith("tarindex: error: ")
