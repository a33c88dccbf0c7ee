"""GNU tar and Python's tarfile, both directions: every format, long names, unicode names."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest

# names every format can hold (v7: at most 99 bytes)
SHORT_NAMES = [
    "README",  # no key, and the first member
    "train/a.b/img000.cls",
    "train/a.b/img000.jpg",
    "train/a.b/img000.seg.PNG",  # field 'seg.png': everything after the first dot, lower-cased
    "train/img001.JPG",
    "train/img001.txt",
    "with space/it's a file.txt",
    "café/naïve.txt",
    "データ/画像001.jpg",
    "データ/画像001.txt",
    "zz/notes",  # no key: dropped
    "zz/.hidden.txt",  # no key
]
# ustar holds these with its 155-byte prefix; v7 can't
USTAR_NAMES = ["p" * 60 + "/" + "p" * 50 + "/" + "f" * 60 + ".txt", "q" * 80 + "/" + "r" * 40 + "/" + "日本" * 10 + ".txt"]
# only GNU long-name records and pax path records hold these
LONG_NAMES = [
    "L" * 150 + "/" + "n" * 120 + ".txt",
    "deep/" * 40 + "x.bin",
    "u" * 99 + ".txt",
    "ü" * 60 + "/" + "é" * 70 + ".txt",
]
FORMAT_NAMES = {
    "v7": SHORT_NAMES,
    "ustar": SHORT_NAMES + USTAR_NAMES,
    "gnu": SHORT_NAMES + USTAR_NAMES + LONG_NAMES,
    "pax": SHORT_NAMES + USTAR_NAMES + LONG_NAMES,
    "posix": SHORT_NAMES + USTAR_NAMES + LONG_NAMES,
}


def make_tree(root: Path, names: list[str]) -> dict[str, bytes]:
    files = {}
    for i, name in enumerate(names):
        data = f"{name}\n".encode() * (1 + 37 * i % 50) + os.urandom(i * 13)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        files[name] = data
    return files


def gnu_listing(ix, archive: Path) -> list[str]:
    out = ix.gnu_tar("--quoting-style=literal", "-tf", archive).stdout.decode("utf-8")
    return [line for line in out.splitlines() if not line.endswith("/")]


@pytest.mark.parametrize("fmt", list(FORMAT_NAMES))
def test_read_gnu_tar_formats(ix, tmp_path, fmt, reader):
    src = tmp_path / "src"
    files = make_tree(src, FORMAT_NAMES[fmt])
    archive = tmp_path / f"{fmt}.tar"
    ix.gnu_tar(f"--format={fmt}", "--sort=name", "-cf", archive, "-C", src, ".")
    listing = gnu_listing(ix, archive)
    assert sorted(listing) == sorted("./" + n for n in files)
    expected = ix.group((name, files[name[2:]]) for name in listing)
    assert ix.samples(archive) == expected
    # the keys as the key rule says
    keys = {k for k, _ in expected}
    assert "train/a.b/img000" in keys and "データ/画像001" in keys  # keys don't keep tar -C dir .'s "./"
    assert ("train/a.b/img000", {"cls", "jpg", "seg.png"}) in [(k, set(f)) for k, f in expected]
    assert not any(k.startswith("zz") for k in keys)


@pytest.mark.parametrize("fmt", ["gnu", "pax"])
def test_tarcat_reads_gnu_tar_from_a_pipe_compressed(ix, tmp_path, fmt):
    src = tmp_path / "src"
    files = make_tree(src, FORMAT_NAMES[fmt])
    archive = tmp_path / f"{fmt}.tar.gz"
    ix.gnu_tar(f"--format={fmt}", "--sort=name", "-czf", archive, "-C", src, ".")
    r = ix.run(ix.tarcat, [f"pipe:cat {archive}"])
    assert r.exit_code == 0, r.stderr
    listing = [n for n in gnu_listing(ix, archive)]
    assert ix.samples_of_bytes(r.stdout_bytes, tmp_path) == ix.group((n, files[n[2:]]) for n in listing)


def test_gnu_tar_links_are_read_as_their_targets_and_dirs_skipped(ix, tmp_path):
    src = tmp_path / "src"
    files = make_tree(src, ["a/x.jpg", "a/x.txt", "b/y.txt"])
    os.symlink("x.jpg", src / "a" / "x.png")
    os.link(src / "b" / "y.txt", src / "b" / "y.cls")  # one of the two is stored as a hard link entry
    archive = tmp_path / "links.tar"
    ix.gnu_tar("--sort=name", "-cf", archive, "-C", src, ".")
    r = ix.run(ix.tarcat, ["--stats", archive])
    assert r.exit_code == 0, r.stderr
    got = ix.samples_of_bytes(r.stdout_bytes, tmp_path)
    assert got == [("a/x", {"jpg": files["a/x.jpg"], "png": files["a/x.jpg"], "txt": files["a/x.txt"]}),
                   ("b/y", {"cls": files["b/y.txt"], "txt": files["b/y.txt"]})]
    assert "directory 3" in r.stderr and "hard link" not in r.stderr and "symlink" not in r.stderr
    # --links skip: links skipped and counted
    r = ix.run(ix.tarcat, ["--stats", "--links", "skip", archive])
    assert r.exit_code == 0, r.stderr
    got = ix.samples_of_bytes(r.stdout_bytes, tmp_path)
    assert got == [("a/x", {"jpg": files["a/x.jpg"], "txt": files["a/x.txt"]}), ("b/y", {"cls": files["b/y.txt"]})]
    assert "hard link 1" in r.stderr and "symlink 1" in r.stderr and "directory 3" in r.stderr


def test_a_dangling_link_is_said_and_left_out_or_with_strict_one_error(ix, tmp_path):
    """A symbolic link carries no data: one that leaves the archive (or points to a directory, or to
    a later member) is left out, said on one line and counted; --links strict makes it an error."""
    src = tmp_path / "src"
    make_tree(src, ["a/x.txt"])
    os.symlink("/etc/hostname", src / "a" / "x.cfg")
    os.symlink("a", src / "latest")  # a link to a directory: 'tar -C dir .' of a tree with 'latest -> train'
    archive = tmp_path / "dangling.tar"
    ix.gnu_tar("--sort=name", "-cf", archive, "-C", src, ".")
    r = ix.run(ix.tarcat, ["--stats", archive])
    assert r.exit_code == 0, r.stderr
    assert [k for k, _ in ix.samples_of_bytes(r.stdout_bytes, tmp_path)] == ["a/x"]
    assert "symbolic link './a/x.cfg' -> '/etc/hostname' at byte" in r.stderr and "left out: it leaves the archive" in r.stderr
    assert "symbolic link './latest' -> 'a' at byte" in r.stderr and "symlink 2" in r.stderr
    r = ix.run(ix.tarcat, ["--links", "strict", archive])
    assert r.exit_code == 1
    assert r.stderr.count("\n") == 1 and "symbolic link './a/x.cfg' -> '/etc/hostname': it leaves the archive" in r.stderr
    assert "--links skip" in r.stderr and "Traceback" not in r.stderr


def test_concatenated_archives_need_ignore_zeros(ix, tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    files = make_tree(first, ["a/1.txt"]) | make_tree(second, ["b/2.txt"])
    ix.gnu_tar("-cf", tmp_path / "1.tar", "-C", first, "a/1.txt")
    ix.gnu_tar("-cf", tmp_path / "2.tar", "-C", second, "b/2.txt")
    both = tmp_path / "both.tar"
    both.write_bytes((tmp_path / "1.tar").read_bytes() + (tmp_path / "2.tar").read_bytes())
    r = ix.run(ix.tarcat, [both])
    assert r.exit_code == 1 and "garbage after the end-of-archive blocks" in r.stderr
    r = ix.run(ix.tarcat, ["-i", both])
    assert r.exit_code == 0, r.stderr
    assert ix.samples_of_bytes(r.stdout_bytes, tmp_path) == [("a/1", {"txt": files["a/1.txt"]}),
                                                              ("b/2", {"txt": files["b/2.txt"]})]


# ----------------------------------------------------------------------------------------------
# our output read by GNU tar and tarfile

OUR_NAMES = [
    "a" * 95 + ".txt",  # 99 bytes
    "b" * 96 + ".txt",  # exactly 100: no NUL in the name field
    "c" * 97 + ".txt",  # 101, no slash: a GNU long-name record
    "d" * 60 + "/" + "e" * 60 + ".txt",  # ustar prefix split
    "p" * 155 + "/" + "n" * 96 + ".txt",  # 256: the largest prefix + name
    "p" * 155 + "/" + "m" * 97 + ".txt",  # 257: long-name record
    "q" * 156 + "/" + "r" * 10 + ".txt",  # prefix too long: long-name record
    "deep/" * 60 + "x.txt",
    "long/" + "y" * 200 + "/" + "w" * 250 + ".bin",
    "データ/" + "画像" * 20 + ".jpg",  # 126 bytes, 45 characters
    "ü" * 49 + ".txt",  # 102 bytes: the 100-byte field would cut a character in half
    "with space/and 'quotes' \"too\".txt",
    "dots.in.dir/x.y.z.txt",
]


@pytest.fixture
def our_archive(ix, tmp_path):
    """OUR_NAMES as samples (one field each) written by tarcat; returns (path, {name: data})."""
    files = {}
    samples = []
    for i, name in enumerate(OUR_NAMES):
        key, field = ix.key_rule(name)
        data = f"{i}:{name}".encode() * (i + 1)
        files[name] = data
        samples.append({"__key__": key, field: data})
    src = ix.write_tar(tmp_path / "src.tar", samples)
    out = tmp_path / "ours.tar"
    r = ix.run(ix.tarcat, ["-o", out, src])
    assert r.exit_code == 0, r.stderr
    assert out.read_bytes() == src.read_bytes()  # tarcat's output is TarWriter's canonical form
    return out, files


def test_gnu_tar_lists_our_exact_names(ix, our_archive):
    out, files = our_archive
    assert gnu_listing(ix, out) == list(files)


def test_gnu_tar_extracts_our_exact_names(ix, our_archive, tmp_path):
    out, files = our_archive
    dest = tmp_path / "dest"
    dest.mkdir()
    r = ix.gnu_tar("-xf", out, "-C", dest)
    assert r.stderr == b""
    got = {str(p.relative_to(dest)): p.read_bytes() for p in dest.rglob("*") if p.is_file()}
    assert got == files


def test_gnu_tar_compare_mode_is_clean(ix, our_archive, tmp_path):
    # 'tar -d' (diff) re-reads every header and member: no complaints about our archive
    out, _ = our_archive
    dest = tmp_path / "dest"
    dest.mkdir()
    ix.gnu_tar("-xf", out, "-C", dest)
    r = ix.gnu_tar("-df", out, "-C", dest, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("compression", ["gz", "xz", "bz2", "zst"])
def test_gnu_tar_reads_our_compressed_output(ix, our_archive, tmp_path, compression):
    out, files = our_archive
    compressed = tmp_path / f"ours.tar.{compression}"
    r = ix.run(ix.tarcat, ["-o", compressed, out])
    assert r.exit_code == 0, r.stderr
    flag = {"gz": "-z", "xz": "-J", "bz2": "-j", "zst": "--zstd"}[compression]
    if compression == "zst" and ix.gnu_tar("--zstd", "-tf", compressed, check=False).returncode != 0:
        pytest.skip("GNU tar here can't run zstd")
    listing = ix.gnu_tar("--quoting-style=literal", flag, "-tf", compressed).stdout.decode().splitlines()
    assert listing == list(files)


def test_tarfile_reads_our_names_and_data(ix, our_archive):
    out, files = our_archive
    assert ix.tarfile_members(out.read_bytes()) == list(files.items())


def test_tarfile_sees_valid_headers(ix, our_archive):
    out, _ = our_archive
    with tarfile.open(out) as tf:  # tarfile checks every header checksum
        infos = tf.getmembers()
    assert all(i.isfile() and i.mode == 0o644 and i.mtime == 0 for i in infos)
    assert out.stat().st_size % 10240 == 0


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT],
                         ids=["gnu", "pax", "ustar"])
def test_read_python_tarfile_formats(ix, tmp_path, fmt, reader):
    names = SHORT_NAMES + USTAR_NAMES + (LONG_NAMES if fmt != tarfile.USTAR_FORMAT else [])
    members = [(n, f"data of {n}".encode() * (i + 1)) for i, n in enumerate(sorted(names))]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1_700_000_000
            tf.addfile(info, io.BytesIO(data))
    path = tmp_path / "py.tar"
    path.write_bytes(buf.getvalue())
    assert ix.samples(path) == ix.group(members)


def test_python_tarfile_pax_with_non_ascii_in_ustar_fields(ix, tmp_path, reader):
    # pax records for uname, large uid, fractional mtime and a path: only 'path' changes the name
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for name in ["k/a.txt", "k/a.cls", "k/b.txt"]:
            info = tarfile.TarInfo(name)
            info.size = 3
            info.uname = "ünïcode"
            info.uid = 8**8
            info.mtime = 1.5
            tf.addfile(info, io.BytesIO(b"abc"))
    path = tmp_path / "pax.tar"
    path.write_bytes(buf.getvalue())
    assert ix.samples(path) == [("k/a", {"txt": b"abc", "cls": b"abc"}), ("k/b", {"txt": b"abc"})]
