"""tarcat in-process: inputs, selection stages, output files, determinism, stdout hygiene."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import os
import stat
import tarfile

import pytest
import zstandard

import tarproc


def keys(items):
    return [k for k, _ in items]


# ----------------------------------------------------------------------------------------------
# inputs


def test_concatenates_brace_list_in_order(cli, shards):
    r = cli.run(cli.tarcat, [str(shards.dir / "shard-{0..2}.tar")])
    assert r.exit_code == 0, r.stderr
    assert r.stderr == ""
    assert cli.samples(r.stdout_bytes) == shards.expected
    # an independent reader sees the same members, fields in sorted order
    names = [n for n, _ in cli.members(r.stdout_bytes)]
    assert names[:3] == ["s0/0000.cls", "s0/0000.jpg", "s0/0000.json"]
    assert len(names) == 12 * 3


def test_double_colon_joins_lists(cli, shards):
    d = shards.dir
    r = cli.run(cli.tarcat, [f"{d}/shard-2.tar::{d}/shard-{{0..1}}.tar"])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[8:] + shards.expected[:8]


def test_several_arguments_are_read_in_order(cli, shards):
    r = cli.run(cli.tarcat, [shards.paths[1], shards.paths[0]])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[4:8] + shards.expected[:4]


def test_files_from_list_file(cli, shards, tmp_path):
    listing = tmp_path / "list.txt"
    listing.write_text(f"# shards\n{shards.paths[2]}\n\n  {shards.paths[0]}  \n")
    r = cli.run(cli.tarcat, ["-T", listing])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[8:] + shards.expected[:4]


def test_files_from_stdin(cli, shards):
    r = cli.run(cli.tarcat, ["-T", "-"], input="\n".join(shards.paths[:2]) + "\n")
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[:8]


@pytest.mark.parametrize("args", [[], ["-"]], ids=["no-args", "dash"])
def test_reads_stdin(cli, shards, args):
    data = open(shards.paths[1], "rb").read()
    r = cli.run(cli.tarcat, args, input=data)
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[4:8]
    # TarWriter output is canonical: re-writing it gives the same bytes
    assert r.stdout_bytes == data


def test_reads_compressed_input_detected_from_data(cli, shards, tmp_path):
    plain = [open(p, "rb").read() for p in shards.paths]
    odd = tmp_path / "no-suffix.bin"  # the name says nothing: detection is by magic bytes
    odd.write_bytes(gzip.compress(plain[0]))
    zst = tmp_path / "x.tar.zst"
    zst.write_bytes(zstandard.ZstdCompressor().compress(plain[1]))
    r = cli.run(cli.tarcat, [odd, zst, "-"], input=bz2.compress(plain[2]))
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected


def test_pipe_source(cli, shards):
    r = cli.run(cli.tarcat, [f"pipe:cat {shards.paths[0]}"])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[:4]


# ----------------------------------------------------------------------------------------------
# selection


def test_count(cli, shards):
    r = cli.run(cli.tarcat, ["-c", "5", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[:5]


def test_count_zero_is_an_empty_archive(cli, shards):
    r = cli.run(cli.tarcat, ["-c", "0", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert cli.members(r.stdout_bytes) == []
    assert r.stdout_bytes == bytes(10240)


def test_skip(cli, shards):
    r = cli.run(cli.tarcat, ["--skip", "3", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[3:]


@pytest.mark.parametrize(
    "spec, expected_slice",
    [("2:9:3", slice(2, 9, 3)), ("5:", slice(5, None)), (":4", slice(0, 4)), ("::5", slice(0, None, 5))],
)
def test_slice(cli, shards, spec, expected_slice):
    r = cli.run(cli.tarcat, ["--slice", spec, *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[expected_slice]


def test_skip_then_slice_then_count(cli, shards):
    # documented order: --skip, --slice (relative to what is left), -c
    r = cli.run(cli.tarcat, ["--skip", "1", "--slice", "1:10:2", "-c", "3", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert cli.samples(r.stdout_bytes) == shards.expected[1:][1:10:2][:3]


def test_fields_rename_and_alternatives(cli, shards):
    r = cli.run(cli.tarcat, ["-f", "image:jpg,jpeg,png cls", *shards.paths])
    assert r.exit_code == 0, r.stderr
    got = cli.samples(r.stdout_bytes)
    want = []
    for key, fields in shards.expected:
        image = fields.get("jpg", fields.get("png"))
        want.append((key, {"image": image, "cls": fields["cls"]}))
    assert got == want
    # the png of sample 1 was taken as the alternative
    assert got[1][1]["image"] == shards.expected[1][1]["png"]


def test_fields_first_alternative_wins(cli, tmp_path):
    path = cli.write_tar(tmp_path / "a.tar", [{"__key__": "k", "jpeg": b"JPEG", "png": b"PNG"}])
    r = cli.run(cli.tarcat, ["-f", "img:png,jpeg", path])
    assert cli.samples(r.stdout_bytes) == [("k", {"img": b"PNG"})]
    r = cli.run(cli.tarcat, ["-f", "img:jpeg,png", path])
    assert cli.samples(r.stdout_bytes) == [("k", {"img": b"JPEG"})]


def test_fields_without_rename_keep_the_first_alternative_name(cli, shards):
    r = cli.run(cli.tarcat, ["-f", "jpg,png json", shards.paths[0]])
    assert r.exit_code == 0, r.stderr
    got = cli.samples(r.stdout_bytes)
    assert [sorted(f) for _, f in got] == [["jpg", "json"]] * 4
    assert got[1][1]["jpg"] == shards.expected[1][1]["png"]


def test_missing_field_is_an_error_by_default(cli, shards, tmp_path):
    out = tmp_path / "out.tar"
    r = cli.run(cli.tarcat, ["-f", "jpg cls", "-o", out, shards.paths[0]])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarcat")
    assert "s0/0001" in line and "jpg" in line and "--missing" in line
    assert shards.paths[0] in line
    assert not out.exists() and cli.leftovers(tmp_path) == []


def test_missing_skip_drops_incomplete_samples(cli, shards):
    r = cli.run(cli.tarcat, ["-f", "jpg cls", "--missing", "skip", *shards.paths])
    assert r.exit_code == 0, r.stderr
    got = cli.samples(r.stdout_bytes)
    want = [(k, {"jpg": f["jpg"], "cls": f["cls"]}) for k, f in shards.expected if "jpg" in f]
    assert got == want and len(got) == 9


def test_missing_keep_writes_what_there_is(cli, shards):
    r = cli.run(cli.tarcat, ["-f", "jpg cls", "--missing", "keep", shards.paths[0]])
    assert r.exit_code == 0, r.stderr
    got = cli.samples(r.stdout_bytes)
    assert keys(got) == keys(shards.expected[:4])
    assert got[1][1] == {"cls": shards.expected[1][1]["cls"]}
    assert got[0][1] == {"jpg": shards.expected[0][1]["jpg"], "cls": shards.expected[0][1]["cls"]}


def test_shuffle_same_seed_same_output_all_samples_kept(cli, shards):
    args = ["--shuffle", "5", "--seed", "7", *shards.paths]
    a = cli.run(cli.tarcat, args)
    b = cli.run(cli.tarcat, args)
    assert a.exit_code == b.exit_code == 0
    assert a.stdout_bytes == b.stdout_bytes
    got = cli.samples(a.stdout_bytes)
    assert sorted(got) == sorted(shards.expected)
    assert len(got) == len(shards.expected)


def test_shuffle_changes_the_order(cli, shards):
    orders = set()
    for seed in range(4):
        r = cli.run(cli.tarcat, ["--shuffle", "100", "--seed", str(seed), *shards.paths])
        assert r.exit_code == 0, r.stderr
        orders.add(tuple(keys(cli.samples(r.stdout_bytes))))
    assert len(orders) > 1
    assert orders - {tuple(keys(shards.expected))}


def test_rekey(cli, shards):
    r = cli.run(cli.tarcat, ["--rekey", "%09d", "--skip", "2", *shards.paths])
    assert r.exit_code == 0, r.stderr
    got = cli.samples(r.stdout_bytes)
    assert keys(got) == [f"{i:09d}" for i in range(10)]
    assert [f for _, f in got] == [f for _, f in shards.expected[2:]]
    assert cli.members(r.stdout_bytes)[0][0] == "000000000.cls"


def test_rekey_with_prefix(cli, shards):
    r = cli.run(cli.tarcat, ["--rekey", "train/img-%04d", shards.paths[0]])
    assert keys(cli.samples(r.stdout_bytes)) == [f"train/img-{i:04d}" for i in range(4)]


def test_stats_report_on_stderr_only(cli, shards):
    plain = cli.run(cli.tarcat, shards.paths)
    r = cli.run(cli.tarcat, ["--stats", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == plain.stdout_bytes  # nothing extra on stdout
    nbytes = sum(len(v) for _, f in shards.expected for v in f.values())
    assert f"tarcat: read 3 shard(s) (0 failed): 12 samples, 36 members, {nbytes} bytes of member data" in r.stderr
    assert "duplicates dropped: 0" in r.stderr
    assert "tarcat: wrote 12 samples, 36 members to -" in r.stderr


def test_stats_counts_names_without_key_and_skipped_entries(cli, tmp_path):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "d" / "a.txt").write_bytes(b"A")
    (src / "d" / "readme").write_bytes(b"no key")
    path = tmp_path / "in.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        tf.add(src / "d", arcname="d")
    r = cli.run(cli.tarcat, ["--stats", "-o", tmp_path / "out.tar", path])
    assert r.exit_code == 0, r.stderr
    assert "1 samples" in r.stderr
    assert "directory 1" in r.stderr
    assert "names without a key: 1" in r.stderr and "readme" in r.stderr


def test_name_without_key_as_first_member(cli, tmp_path):
    path = tmp_path / "in.tar"
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in [("README", b"read me"), ("a.txt", b"A")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    r = cli.run(cli.tarcat, ["--stats", path])
    assert r.exit_code == 0, r.stderr
    assert cli.members(r.stdout_bytes) == [("a.txt", b"A")]
    assert "names without a key: 1" in r.stderr


# ----------------------------------------------------------------------------------------------
# output


def test_output_file(cli, shards, tmp_path):
    out = tmp_path / "out.tar"
    r = cli.run(cli.tarcat, ["-o", out, *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes == b""
    assert cli.samples(out) == shards.expected
    assert cli.leftovers(tmp_path) == []
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o666 & ~_umask()


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(
    "suffix, decompress, magic",
    [
        (".tar.gz", gzip.decompress, b"\x1f\x8b"),
        (".tgz", gzip.decompress, b"\x1f\x8b"),
        (".tar.zst", lambda d: zstandard.ZstdDecompressor().decompressobj().decompress(d), b"\x28\xb5\x2f\xfd"),
        (".tar.xz", lzma.decompress, b"\xfd7zXZ\x00"),
        (".tar.bz2", bz2.decompress, b"BZh"),
    ],
)
def test_output_compressed_by_suffix(cli, shards, tmp_path, suffix, decompress, magic):
    plain = cli.run(cli.tarcat, shards.paths).stdout_bytes
    out = tmp_path / ("out" + suffix)
    r = cli.run(cli.tarcat, ["-o", out, *shards.paths])
    assert r.exit_code == 0, r.stderr
    data = out.read_bytes()
    assert data.startswith(magic)
    assert decompress(data) == plain
    # and tarcat reads its own compressed output back
    back = cli.run(cli.tarcat, [out])
    assert back.stdout_bytes == plain


def test_compressed_output_is_deterministic(cli, shards, tmp_path):
    cli.run(cli.tarcat, ["-o", tmp_path / "a.tar.gz", *shards.paths])
    cli.run(cli.tarcat, ["-o", tmp_path / "b.tar.gz", *shards.paths])
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()


def test_output_replaces_existing_file(cli, shards, tmp_path):
    out = tmp_path / "out.tar"
    out.write_bytes(b"old")
    r = cli.run(cli.tarcat, ["-o", out, shards.paths[0]])
    assert r.exit_code == 0
    assert cli.samples(out) == shards.expected[:4]


def test_output_to_a_pipe_command(cli, shards, tmp_path):
    out = tmp_path / "piped.tar"
    r = cli.run(cli.tarcat, ["-o", f"pipe:cat > '{out}'", *shards.paths])
    assert r.exit_code == 0, r.stderr
    assert out.read_bytes() == cli.run(cli.tarcat, shards.paths).stdout_bytes


def test_output_to_a_failing_pipe_command(cli, shards):
    r = cli.run(cli.tarcat, ["-o", "pipe:exit 3", shards.paths[0]])
    assert r.exit_code == 1
    line = cli.one_line_error(r, "tarcat")
    assert "pipe:exit 3" in line and ("status 3" in line or "stopped reading" in line)


def test_output_through_a_symlink_replaces_its_target(cli, shards, tmp_path):
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "target.tar"
    target.write_bytes(b"old")
    link = tmp_path / "link.tar"
    link.symlink_to(target)
    r = cli.run(cli.tarcat, ["-o", link, shards.paths[0]])
    assert r.exit_code == 0, r.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert cli.samples(target) == shards.expected[:4]
    assert cli.leftovers(tmp_path) == [] and cli.leftovers(real_dir) == []


def test_mtime_minus_one_means_now(cli, shards):
    import time

    before = int(time.time())
    out = cli.run(cli.tarcat, ["--mtime", "-1", shards.paths[0]]).stdout_bytes
    after = int(time.time())
    assert all(before <= i.mtime <= after for i in cli.infos(out))


def test_deterministic_output_and_default_metadata(cli, shards):
    a = cli.run(cli.tarcat, shards.paths).stdout_bytes
    b = cli.run(cli.tarcat, shards.paths).stdout_bytes
    assert a == b
    assert len(a) % 10240 == 0
    for info in cli.infos(a):
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode) == (0, 0, 0, "", "", 0o644)


def test_source_date_epoch_sets_mtime(cli, shards, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1600000000")
    out = cli.run(cli.tarcat, [shards.paths[0]]).stdout_bytes
    assert {i.mtime for i in cli.infos(out)} == {1600000000}


def test_writer_options_change_headers(cli, shards):
    base = cli.run(cli.tarcat, [shards.paths[0]]).stdout_bytes
    args = ["--mtime", "1700000000", "--uid", "1000", "--gid", "100", "--uname", "alice", "--gname", "staff",
            "--mode", "600", shards.paths[0]]
    r = cli.run(cli.tarcat, args)
    assert r.exit_code == 0, r.stderr
    assert r.stdout_bytes != base
    for info in cli.infos(r.stdout_bytes):
        assert (info.mtime, info.uid, info.gid, info.uname, info.gname, info.mode) == (
            1700000000, 1000, 100, "alice", "staff", 0o600)
    # only headers changed: same members
    assert cli.members(r.stdout_bytes) == cli.members(base)
    assert cli.run(cli.tarcat, args).stdout_bytes == r.stdout_bytes


@pytest.mark.parametrize("option, value", [("--mtime", "5"), ("--uid", "7"), ("--uname", "bob")])
def test_each_writer_option_alone_changes_output(cli, shards, option, value):
    base = cli.run(cli.tarcat, [shards.paths[0]]).stdout_bytes
    assert cli.run(cli.tarcat, [option, value, shards.paths[0]]).stdout_bytes != base


def test_stdout_carries_only_tar_data_even_with_warnings(cli, tmp_path):
    # a key reappearing later (unsorted tar) with --dup warn: warning on stderr, clean tar on stdout
    parts = [cli.tar_bytes([{"__key__": "a", "txt": b"1"}])[:1024],
             cli.tar_bytes([{"__key__": "b", "txt": b"2"}])[:1024],
             cli.tar_bytes([{"__key__": "a", "cls": b"3"}])]
    path = tmp_path / "unsorted.tar"
    path.write_bytes(b"".join(parts))
    r = cli.run(cli.tarcat, ["--dup", "warn", "--stats", path])
    assert r.exit_code == 0, r.stderr
    assert "warning:" in r.stderr and "reappears" in r.stderr
    assert cli.members(r.stdout_bytes) == [("a.txt", b"1"), ("b.txt", b"2")]
    assert r.stdout_bytes == cli.tar_bytes([{"__key__": "a", "txt": b"1"}, {"__key__": "b", "txt": b"2"}])


def test_version(cli):
    r = cli.run(cli.tarcat, ["--version"])
    assert r.exit_code == 0
    assert r.stdout.strip() == f"tarcat (tarproc) {tarproc.__version__}"


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_has_examples(cli, flag):
    r = cli.run(cli.tarcat, [flag])
    assert r.exit_code == 0
    assert "Usage: tarcat" in r.stdout
    assert "Example" in r.stdout
    assert "--shuffle" in r.stdout and "--rekey" in r.stdout


def test_refuses_a_terminal_unless_forced(cli, shards, monkeypatch):
    import tarproc.sinks

    monkeypatch.setattr(tarproc.sinks, "stdout_is_terminal", lambda: True)
    r = cli.run(cli.tarcat, [shards.paths[0]])
    assert r.exit_code == 1
    assert "terminal" in cli.one_line_error(r, "tarcat")
    assert r.stdout_bytes == b""
    r = cli.run(cli.tarcat, ["--force", shards.paths[0]])
    assert r.exit_code == 0
    assert cli.samples(r.stdout_bytes) == shards.expected[:4]
    # writing to a file is fine even when stdout is a terminal
    assert cli.run(cli.tarcat, ["-o", shards.dir / "x.tar", shards.paths[0]]).exit_code == 0


def test_output_to_a_fifo_writes_into_it(cli, shards, tmp_path):
    """An existing FIFO (like /dev/null, a device) is written to, not replaced by a regular file."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that opening it for writing won't block
    try:
        r = cli.run(cli.tarcat, ["-o", fifo, shards.paths[0]])  # 20 KiB: fits the pipe buffer
        assert r.exit_code == 0, r.stderr
        is_fifo = stat.S_ISFIFO(os.lstat(fifo).st_mode)
        chunks = []
        while True:
            try:
                chunk = os.read(reader, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(reader)
    assert is_fifo, "the FIFO was replaced by a regular file"
    assert cli.samples(b"".join(chunks)) == shards.expected[:4]


# ----------------------------------------------------------------------------------------------
# oversampling: an input listed more than once


def test_oversampling_a_shard_with_shuffle_and_rekey_writes_each_copy(cli, shards):
    a, b = shards.paths[0], shards.paths[1]
    r = cli.run(cli.tarcat, [a, a, b, "--shuffle", "1000", "--seed", "1", "--rekey", "mix-%09d"])
    assert r.exit_code == 0, r.stderr
    assert r.stderr == ""  # --rekey: nothing to warn about
    got = cli.samples(r.stdout_bytes)
    assert keys(got) == [f"mix-{i:09d}" for i in range(12)]
    # every sample of a twice, of b once (the fields tell them apart: each body starts with its key)
    bodies = sorted(f.get("jpg", f.get("png")) for _, f in got)
    expected = [f.get("jpg", f.get("png")) for _, f in shards.expected]
    assert bodies == sorted(expected[:4] * 2 + expected[4:8])
    assert [k for k, _ in cli.samples(r.stdout_bytes)] == keys(got)  # and it reads back


def test_a_shuffle_that_puts_two_copies_together_is_an_error_saying_to_rekey(cli, shards):
    a, b = shards.paths[0], shards.paths[1]
    failed = []
    for seed in range(30):
        r = cli.run(cli.tarcat, [a, a, b, "--shuffle", "1000", "--seed", str(seed)])
        if r.exit_code != 0:
            failed.append((seed, r))
    assert failed, "no seed put two copies of a sample next to each other"
    seed, r = failed[0]
    assert r.exit_code == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and "Traceback" not in r.stderr
    assert lines[0].startswith("tarcat: warning: ") and "--rekey" in lines[0]
    assert lines[1].startswith("tarcat: error: key 's0/") and "written twice in a row" in lines[1]
    assert "an input listed more than once repeats its keys; give --rekey 'mix-%09d'" in lines[1]
    # the same seed, as the message says
    r = cli.run(cli.tarcat, [a, a, b, "--shuffle", "1000", "--seed", str(seed), "--rekey", "mix-%09d"])
    assert r.exit_code == 0 and r.stderr == ""
    assert len(cli.samples(r.stdout_bytes)) == 12


@pytest.mark.parametrize("how", ["arguments", "brace list", "list file"])
def test_an_input_listed_twice_is_warned_about_once(cli, shards, tmp_path, how):
    a, b = shards.paths[0], shards.paths[1]
    if how == "arguments":
        args = [a, a, b]
    elif how == "brace list":
        args = [str(shards.dir / "shard-{0,0,1}.tar")]
    else:
        listing = tmp_path / "list.txt"
        listing.write_text(f"{a}\n{b}\n{a}\n")
        args = ["-T", str(listing)]
    r = cli.run(cli.tarcat, args)
    # shards of several samples: the copies are not next to each other, and all is written
    assert r.exit_code == 0, r.stderr
    written = [name[: -len(".cls")] for name, _ in cli.members(r.stdout_bytes) if name.endswith(".cls")]
    expected = keys(shards.expected)
    assert written == (expected[:4] + expected[4:8] + expected[:4] if how == "list file" else
                       expected[:4] * 2 + expected[4:8])
    lines = r.stderr.splitlines()
    assert lines == [f"tarcat: warning: {a} is listed 2 times: every copy of a sample is written with the same key, "
                     "and readers refuse a key that reappears (--dup), or read two copies next to each other as "
                     "one sample; give --rekey 'mix-%09d' to give every sample a new key"]
    # what the warning says: the output can't be read as it is
    back = cli.run(cli.tarcat, ["-", "-o", "/dev/null"], input=r.stdout_bytes)
    assert back.exit_code == 1 and "reappears" in back.stderr


def test_several_inputs_listed_twice_are_named_in_one_warning(cli, shards):
    a, b, c = shards.paths
    r = cli.run(cli.tarcat, [a, b, c, b, a, a])
    assert r.exit_code == 0, r.stderr
    assert r.stderr.splitlines() == [f"tarcat: warning: {a} (3 times), {b} (2 times) are listed more than once: every "
                                     "copy of a sample is written with the same key, and readers refuse a key "
                                     "that reappears (--dup), or read two copies next to each other as one sample; "
                                     "give --rekey 'mix-%09d' to give every sample a new key"]


def test_a_one_sample_shard_listed_twice_is_an_error_saying_to_rekey(cli, tmp_path):
    one = str(cli.write_tar(tmp_path / "one.tar", [{"__key__": "solo", "txt": b"x"}]))
    two = str(cli.write_tar(tmp_path / "two.tar", [{"__key__": "duo", "txt": b"y"}]))
    r = cli.run(cli.tarcat, [one, one, two, "-o", tmp_path / "mix.tar"])
    assert r.exit_code == 1
    assert r.stderr.splitlines()[1:] == [
        "tarcat: error: key 'solo' written twice in a row; readers would merge the two samples: an input listed "
        "more than once repeats its keys; give --rekey 'mix-%09d' to give every sample a new key"]
    assert not (tmp_path / "mix.tar").exists() and cli.leftovers(tmp_path) == []
    r = cli.run(cli.tarcat, [one, one, two, "--rekey", "mix-%09d"])
    assert r.exit_code == 0 and r.stderr == ""
    assert cli.samples(r.stdout_bytes) == [("mix-000000000", {"txt": b"x"}), ("mix-000000001", {"txt": b"x"}),
                                           ("mix-000000002", {"txt": b"y"})]


def test_two_shards_sharing_a_key_next_to_each_other_is_an_error_saying_to_rekey(cli, tmp_path):
    x = str(cli.write_tar(tmp_path / "x.tar", [{"__key__": "a", "txt": b"1"}, {"__key__": "b", "txt": b"2"}]))
    y = str(cli.write_tar(tmp_path / "y.tar", [{"__key__": "b", "txt": b"3"}]))
    r = cli.run(cli.tarcat, [x, y])
    assert cli.one_line_error(r, "tarcat") == (
        "tarcat: error: key 'b' written twice in a row; readers would merge the two samples: two inputs share keys; "
        "give --rekey 'mix-%09d' to give every sample a new key")
    r = cli.run(cli.tarcat, [x, y, "--rekey", "%03d"])
    assert r.exit_code == 0 and keys(cli.samples(r.stdout_bytes)) == ["000", "001", "002"]
