"""tarpcat: the command over many shards, its options, errors, and real pipes."""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest

from tarproc.cli.tarpcat import main as tarpcat

SIZES = [3, 0, 7, 1, 12, 5, 0, 2, 9, 4, 6, 1, 8]


@pytest.fixture
def many(tmp_path, cli):
    """13 shards of varying sizes (two empty) and all their samples by key."""
    paths, expected = [], {}
    for s, n in enumerate(SIZES):
        batch = [cli.make_sample(f"m{s:02d}/{i:04d}", i, size=100 + 37 * i) for i in range(n)]
        paths.append(str(cli.write_tar(tmp_path / f"m-{s:02d}.tar", batch)))
        expected.update({key: fields for key, fields in cli.expected_of(batch)})
    return paths, expected


def by_key(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), [k for k, n in Counter(keys).items() if n > 1]
    return dict(pairs)


@pytest.mark.parametrize("readers", ["1", "3", "8", "20"])
@pytest.mark.parametrize("order", ["roundrobin", "random"])
def test_all_samples_exactly_once(cli, many, readers, order):
    paths, expected = many
    result = cli.run(tarpcat, ["-p", readers, "--order", order, *paths])
    assert result.exit_code == 0, result.stderr
    assert by_key(cli.samples(result.stdout_bytes)) == expected


def test_one_reader_is_byte_identical_to_tarcat(cli, many):
    paths, _ = many
    ours = cli.run(tarpcat, ["-p", "1", *paths])
    theirs = cli.run(cli.tarcat, paths)
    assert ours.exit_code == theirs.exit_code == 0
    assert ours.stdout_bytes == theirs.stdout_bytes


def test_roundrobin_interleaves_the_first_shards(cli, many):
    paths, _ = many
    result = cli.run(tarpcat, ["-p", "3", "-c", "6", *paths])
    keys = [k for k, _ in cli.samples(result.stdout_bytes)]
    # lanes: shard 0 | shard 1 (empty) -> shard 3 in its place | shard 2
    assert keys == ["m00/0000", "m03/0000", "m02/0000", "m00/0001", "m04/0000", "m02/0001"]


def test_seeded_random_order_and_shuffle_are_reproducible(cli, many):
    paths, expected = many
    args = ["-p", "4", "--order", "random", "--seed", "5", "--shuffle", "7", *paths]
    first = cli.run(tarpcat, args)
    second = cli.run(tarpcat, args)
    assert first.exit_code == 0
    assert first.stdout_bytes == second.stdout_bytes
    assert by_key(cli.samples(first.stdout_bytes)) == expected
    other = cli.run(tarpcat, ["-p", "4", "--order", "random", "--seed", "6", "--shuffle", "7", *paths])
    assert other.stdout_bytes != first.stdout_bytes


def test_count_stops_early_and_leaves_no_threads(cli, many):
    paths, expected = many
    before = threading.active_count()
    urls = [f"pipe:cat {shlex.quote(p)}" for p in paths]
    result = cli.run(tarpcat, ["-p", "5", "-c", "4", "--prefetch", "2", *urls])
    assert result.exit_code == 0, result.stderr
    got = cli.samples(result.stdout_bytes)
    assert len(got) == 4 and all(expected[k] == v for k, v in got)
    assert threading.active_count() == before


def test_stats_and_output_file(cli, many, tmp_path):
    paths, expected = many
    out = tmp_path / "out" / "all.tar.gz"
    out.parent.mkdir()
    result = cli.run(tarpcat, ["-p", "4", "--stats", "-o", out, *paths])
    assert result.exit_code == 0, result.stderr
    total = sum(SIZES)
    assert f"read {len(SIZES)} shard(s) (0 failed): {total} samples, {3 * total} members" in result.stderr
    assert f"wrote {total} samples, {3 * total} members to {out}" in result.stderr
    assert result.stdout_bytes == b""
    assert by_key(cli.samples(out)) == expected
    assert cli.leftovers(out.parent) == []


def truncated(tmp_path: Path, cli) -> tuple[str, int]:
    """A shard whose data stops inside sample 3's jpg."""
    data = cli.tar_bytes([cli.make_sample(f"bad/{i:04d}", i, size=3000) for i in range(6)])
    jpg3 = [m for m in cli.infos(data) if m.name == "bad/0003.jpg"][0]
    cut = jpg3.offset_data + 1000
    path = tmp_path / "bad.tar"
    path.write_bytes(data[:cut])
    return str(path), cut


def test_damaged_shard_fails_naming_file_and_offset(cli, many, tmp_path):
    paths, _ = many
    bad, _ = truncated(tmp_path, cli)
    out = tmp_path / "out.tar"
    result = cli.run(tarpcat, ["-p", "3", "-o", out, *paths[:5], bad, *paths[5:]])
    assert result.exit_code == 1
    line = cli.one_line_error(result, "tarpcat")
    assert bad in line and "truncated" in line and "at byte " in line
    assert not out.exists() and cli.leftovers(tmp_path) == []


def test_skip_shard_keeps_all_other_samples(cli, many, tmp_path):
    paths, expected = many
    bad, _ = truncated(tmp_path, cli)
    result = cli.run(tarpcat, ["-p", "3", "--on-error", "skip-shard", "--stats", *paths[:5], bad, *paths[5:]])
    assert result.exit_code == 0
    got = by_key(cli.samples(result.stdout_bytes))
    good_before = {k: v for k, v in got.items() if k.startswith("bad/")}
    assert sorted(good_before) == ["bad/0000", "bad/0001", "bad/0002"]  # the samples before the damage
    assert {k: v for k, v in got.items() if not k.startswith("bad/")} == expected
    assert f"warning: {bad}: truncated" in result.stderr
    assert "(1 failed)" in result.stderr


def test_usage_errors_exit_2(cli, many):
    paths, _ = many
    for args in (["--seed", "1"], ["-p", "0"], ["--order", "sorted"], ["--prefetch", "0"], ["-", "-"]):
        result = cli.run(tarpcat, [*args, *paths])
        assert result.exit_code == 2, (args, result.stderr)
        assert "Traceback" not in result.stderr


def test_reads_stdin_by_default(cli, many):
    paths, _ = many
    data = Path(paths[4]).read_bytes()
    result = cli.run(tarpcat, [], input=data)
    assert result.exit_code == 0, result.stderr
    assert result.stdout_bytes == cli.run(cli.tarcat, [paths[4]]).stdout_bytes


def test_help_has_examples(cli):
    result = cli.run(tarpcat, ["--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.stdout and "tarpcat -p" in result.stdout


# ------------------------------------------------------------------------------------------------
# real processes


def command() -> list[str]:
    return [sys.executable, "-m", "tarproc.cli.tarpcat"]


def test_real_pipe_to_head_ends_quietly(cli, tmp_path):
    # 8 MB of output: far more than a pipe holds, so tarpcat is still writing when head leaves
    paths = [
        str(cli.write_tar(tmp_path / f"big-{s}.tar", [cli.make_sample(f"b{s}/{i:04d}", i, 50_000) for i in range(20)]))
        for s in range(8)
    ]
    cmd = shlex.join([*command(), "-p", "4", *paths]) + " | head -c 100 > /dev/null; echo ${PIPESTATUS[0]}"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=60)
    assert proc.stdout.decode().strip() == "141"
    assert proc.stderr == b""


def test_real_pipeline_into_tarcat(many, cli):
    paths, expected = many
    cmd = (
        shlex.join([*command(), "-p", "3", "--order", "random", *paths])
        + " | "
        + shlex.join([sys.executable, "-m", "tarproc.cli.tarcat", "--stats"])
    )
    proc = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert by_key(cli.samples(proc.stdout)) == expected
    assert f"wrote {sum(SIZES)} samples" in proc.stderr.decode()


def test_local_shards_with_big_members_pass_through_the_kernel_alike(tmp_path):
    """Local shards are read in the consumer's thread, big data left in the files and copied by
    the kernel (sendfile) to a real file: the same bytes as the threaded path (pipe: inputs),
    which reads everything, for every order."""
    import random

    from tarproc.tar import TarWriter

    rng = random.Random(3)
    paths = []
    for s in range(5):
        path = tmp_path / f"big-{s}.tar"
        with open(path, "wb") as f, TarWriter(f) as w:
            for i in range(rng.randint(0, 12)):
                w.write_sample({"__key__": f"b{s}/{i:03d}", "jpg": rng.randbytes(rng.choice([10, 70_000, 300_000])),
                                "cls": b"%d" % i})
        paths.append(str(path))
    run = [sys.executable, "-m", "tarproc.cli.tarpcat", "-q", "-p", "3"]
    for order in (["--order", "roundrobin"], ["--order", "random", "--seed", "4"]):
        out = tmp_path / "local.tar"
        assert subprocess.run([*run, *order, "-o", str(out), *paths], timeout=120).returncode == 0
        piped = subprocess.run([*run, *order, *(f"pipe:cat {shlex.quote(p)}" for p in paths)],
                               capture_output=True, timeout=120)
        assert piped.returncode == 0 and out.read_bytes() == piped.stdout and len(piped.stdout) > 1_000_000
