"""The C index builder (``_speedups.index_file``) and the Python reference (``index_stream``'s own
reader and grouper) give the same index -- entries, size, stats -- or the same error, over shards of
every shape: our writer's, Python tarfile's three formats, GNU tar's, with directories, ``./``
prefixes, ustar prefixes, GNU long names, pax paths and times, upper-case and non-ASCII names, big
members between small ones (the data skipped), and every irregularity (links, metadata, names
without a key, duplicates, damage, cuts, garbage after the end), plus random damage to headers and
extension records. The C builder must also really index the plain ones (it may hand a shard to
Python only where something is irregular).
The tarproc format's lines (``_speedups.jsonl_lines``) are compared with ``_jsonl_lines`` too.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import tarfile
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from pathlib import Path
from typing import Any

import pytest
from tarhelpers import built, tarfile_shard

import tarproc.shard_index as index_module  # where the C fast paths are looked up
from tarproc import TarWriter
from tarproc.errors import TarprocError
from tarproc.index import IndexEntry, ShardIndex, build_index
from tarproc.tar import ReadStats

C_INDEX = index_module._index_file
C_LINES = index_module._jsonl_lines


@pytest.fixture
def c_index() -> Any:
    return built(C_INDEX)


def outcome(monkeypatch: pytest.MonkeyPatch, path: Path, c: Any, **kw: Any) -> tuple[Any, ...]:
    """What indexing gives with the C builder (``c``) or without it (None): the index and the
    stats, or the error; and whether the C builder answered."""
    answered = []

    def counted(*args: Any) -> Any:
        got = c(*args)
        answered.append(got is not None)
        return got

    monkeypatch.setattr(index_module, "_index_file", counted if c is not None else None)
    stats = ReadStats()
    try:
        index = build_index(str(path), stats=stats, warn=lambda message: None, **kw)
    except TarprocError as e:
        result: tuple[Any, ...] = ("error", type(e).__name__, str(e), getattr(e, "offset", None))
    else:
        result = ("index", index.shard, index.size, index.entries, stats.as_dict(), stats.no_key)
    return result, any(answered)


def compare(monkeypatch: pytest.MonkeyPatch, path: Path, c: Any, **kw: Any) -> tuple[Any, bool]:
    got, answered = outcome(monkeypatch, path, c, **kw)
    want, _ = outcome(monkeypatch, path, None, **kw)
    assert got == want, f"{path.name} {kw}: C {got!r:.600}\nPython {want!r:.600}"
    return got, answered


# -- shards -----------------------------------------------------------------------------------


def ours(path: Path, rng: random.Random, n: int = 12) -> Path:
    """Our writer: sizes around the block and the skip threshold, a varying number of small
    members before a big one (so the read after a skip is sometimes too short)."""
    sizes = [0, 1, 511, 512, 513, 1500, 4000, 65535, 65536, 70000, 200_000]
    with open(path, "wb") as f, TarWriter(f) as w:
        for i in range(n):
            sample: dict[str, Any] = {"__key__": f"d{i % 3}/s{i:04d}"}
            for j in range(rng.randint(0, 3)):
                sample[f"f{j}.txt"] = rng.randbytes(rng.choice(sizes[:6]))
            sample["jpg"] = rng.randbytes(rng.choice(sizes))
            sample["cls"] = str(i).encode()
            w.write_sample(sample)
    return path


def with_tarfile(path: Path, fmt: int, members: list[tuple[str, Any]]) -> Path:
    """Python tarfile: (name, bytes) files, (name, None) directories, (name, "->x") symlinks."""
    return tarfile_shard(path, members, fmt)


PLAIN_MEMBERS = [
    ("train", None),
    ("train/a.jpg", b"A" * 70000),
    ("train/a.cls", b"1"),
    ("train/b.JPG", b"B" * 100),  # an upper-case extension: a names map
    ("train/b.Cls", b"2"),
    ("./train/c.seg.png", b"C" * 600),  # './': a names map, and a dotted field
    ("./train/c.cls", b"3"),
    ("p" * 90 + "/" + "q" * 60 + ".jpg", b"D" * 2000),  # a ustar prefix (or a long name)
    ("p" * 90 + "/" + "q" * 60 + ".cls", b"4"),
    ("e.txt", b""),
]

IRREGULAR: dict[str, list[tuple[str, Any]]] = {
    "symlink": [("a.jpg", b"x" * 10), ("b.jpg", "->a.jpg"), ("b.cls", b"2")],
    "no key": [("README", b"read me"), ("a.jpg", b"x")],
    "metadata dir": [("__meta__/x.json", b"{}"), ("a.jpg", b"x")],
    "metadata field": [("a.jpg", b"x"), ("a.__f__", b"y")],
    "underscore key": [("_a.jpg", b"x"), ("_a.cls", b"1")],
    "duplicate field": [("a.jpg", b"x"), ("a.JPG", b"y")],
    "reappearing key": [("a.jpg", b"x"), ("b.jpg", b"y"), ("a.cls", b"1")],
    "old-style directory": [("d/", b""), ("d/a.jpg", b"x")],
    "long name": [("n" * 120 + ".jpg", b"x"), ("n" * 120 + ".cls", b"1")],
    "non-ASCII": [("ä/Ü.JPG", b"x" * 3), ("ä/Ü.cls", b"1"), ("k\\\"\n.txt", b"q")],
}


def gnu_tar(path: Path, root: Path, fmt: str) -> Path | None:
    tar = shutil.which("tar")
    if tar is None:
        return None
    subprocess.run([tar, "-cf", str(path), f"--format={fmt}", "--sort=name", "-C", str(root), "."], check=True)
    return path


# -- tests ------------------------------------------------------------------------------------


def test_plain_shards_are_indexed_in_c_alike(tmp_path, monkeypatch, c_index):
    rng = random.Random(7)
    for i in range(12):
        _, answered = compare(monkeypatch, ours(tmp_path / f"o{i}.tar", rng, n=rng.randint(1, 25)), c_index)
        assert answered, "the C builder handed a plain shard of our writer's to Python"
    for fmt, name in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax")):
        got, answered = compare(monkeypatch, with_tarfile(tmp_path / f"{name}.tar", fmt, PLAIN_MEMBERS), c_index)
        assert got[0] == "index" and len(got[3]) == 5 and answered, name  # GNU long names, pax paths too
        assert got[3][1].names == {"jpg": "train/b.JPG", "cls": "train/b.Cls"}
        assert got[3][2].names == {"seg.png": "./train/c.seg.png", "cls": "./train/c.cls"}
        assert got[3][3].key == "p" * 90 + "/" + "q" * 60 and got[4]["skipped_entries"] == {"directory": 1}
    # an archive of end blocks only: no entries, and the size is the file's
    empty = tmp_path / "empty.tar"
    empty.write_bytes(bytes(10240))
    got, answered = compare(monkeypatch, empty, c_index)
    assert got[0] == "index" and got[3] == [] and got[2] == 10240 and answered


def test_gnu_tar_shards_alike(tmp_path, monkeypatch, c_index):
    root = tmp_path / "root"
    rng = random.Random(3)
    for i in range(30):
        d = root / f"part{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:05d}.jpg").write_bytes(rng.randbytes(rng.choice([100, 5000, 70000, 150_000])))
        (d / f"{i:05d}.cls").write_bytes(str(i).encode())
    for fmt in ("gnu", "ustar", "posix"):
        path = gnu_tar(tmp_path / f"g-{fmt}.tar", root, fmt)
        if path is None:
            pytest.skip("GNU tar is not installed")
        got, answered = compare(monkeypatch, path, c_index)
        assert got[0] == "index" and len(got[3]) == 30
        assert got[3][0].names == {"jpg": "./part0/00000.jpg", "cls": "./part0/00000.cls"}
        assert answered, fmt  # posix: a pax header (times) before each member


@pytest.mark.parametrize("case", sorted(IRREGULAR))
@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("dup", ["error", "warn"])
def test_irregular_shards_alike(tmp_path, monkeypatch, c_index, case, fmt, dup):
    path = with_tarfile(tmp_path / "x.tar", fmt, IRREGULAR[case])
    compare(monkeypatch, path, c_index, dup=dup)
    compare(monkeypatch, path, c_index, dup=dup, links="skip")


def test_damaged_and_cut_shards_alike(tmp_path, monkeypatch, c_index):
    good = ours(tmp_path / "good.tar", random.Random(11), n=8).read_bytes()
    headers = [i for i in range(0, len(good), 512) if good[i + 257 : i + 262] == b"ustar"]
    cases: dict[str, bytes] = {
        "empty file": b"",
        "short": good[:300],
        "no end blocks": good[: headers[-1]],
        "cut in a header": good[: headers[3] + 200],
        "cut in data": good[: headers[-1] + 700],
        "one zero block, then the end": good[: headers[-1] + 1024] + bytes(512),
        "garbage after the end": good + b"x",
        "garbage far after the end": good + bytes(300_000) + b"\x01" + bytes(100),
        "zeros after the end": good + bytes(300_000),
    }
    for i in (1, 4):
        bad = bytearray(good)
        bad[headers[i] + 148] ^= 1  # checksum
        cases[f"checksum {i}"] = bytes(bad)
        bad = bytearray(good)
        bad[headers[i] + 124] = 0x80  # base-256 size
        cases[f"base-256 size {i}"] = bytes(bad)
        bad = bytearray(good)
        bad[headers[i] + 156] = ord("3")  # a character device
        cases[f"type {i}"] = bytes(bad)
    for name, data in cases.items():
        path = tmp_path / (name.replace(" ", "-") + ".tar")  # the failure names the case
        path.write_bytes(data)
        compare(monkeypatch, path, c_index)
    compare(monkeypatch, tmp_path / "good.tar", c_index, max_member_size=1000)  # too big: the error


@pytest.mark.parametrize("fmt", ["ours", tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["ours", "gnu", "pax"])
def test_random_damage_alike(tmp_path, monkeypatch, c_index, fmt):
    """Random damage to headers (checksums kept right, most of the time) and to the extension
    data after them: GNU long names and pax records."""
    rng = random.Random(5)
    if fmt == "ours":
        good = ours(tmp_path / "good.tar", rng, n=6).read_bytes()
    else:
        members = [m for m in PLAIN_MEMBERS if m[1] is None or len(m[1]) < 5000] + [("ä/" + "l" * 120 + ".txt", b"x")]
        good = with_tarfile(tmp_path / "good.tar", fmt, members).read_bytes()
    headers = [i for i in range(0, len(good), 512) if good[i + 257 : i + 262] == b"ustar"]
    extension_data = [i + 512 for i in headers if good[i + 156] in b"Lx"]
    kinds = {"index": 0, "error": 0, "by C": 0}
    for _ in range(500):
        bad = bytearray(good)
        if extension_data and rng.random() < 0.3:  # the records of a long name or a pax header
            at = rng.choice(extension_data) + rng.randrange(40)
            bad[at] = rng.choice([0, ord(" "), ord("="), ord("\n"), ord("9"), ord("x"), rng.randrange(256)])
        for _ in range(rng.randint(1, 3)):
            header = rng.choice(headers)
            at = header + rng.choice([rng.randrange(512), 0, 5, 100, 124, 130, 134, 156, 257, 345])
            bad[at] = rng.choice([0, ord("."), ord("/"), ord("_"), ord("5"), ord("7"), ord("0"), rng.randrange(256)])
            if rng.random() < 0.7:  # a header that still checks: damage only a reader's rules find
                bad[header + 148 : header + 156] = b" " * 8
                bad[header + 148 : header + 156] = b"%06o\0 " % sum(bad[header : header + 512])
        if rng.random() < 0.2:
            del bad[rng.randrange(len(bad)) :]
        path = tmp_path / "r.tar"
        path.write_bytes(bytes(bad))
        got, answered = compare(monkeypatch, path, c_index, dup=rng.choice(["error", "skip"]))
        kinds[got[0]] += 1
        kinds["by C"] += answered
    assert kinds["index"] > 40 and kinds["error"] > 40 and kinds["by C"] > 40, kinds


# -- the tarproc format's lines ---------------------------------------------------------------


def python_lines(entries: list[Any]) -> bytes:
    return ShardIndex("s.tar", 0, entries)._jsonl_lines().encode("ascii")


@pytest.fixture
def c_lines() -> Any:
    return built(C_LINES)


def test_lines_alike(tmp_path, c_lines):
    odd = ["plain", "quo\"te", "back\\slash", "tab\there", "nl\n", "\x00\x1f\x7f", "é", "日本", "\U0001f600",
           "\udcff", "/", ""]
    rng = random.Random(2)
    entries = []
    for i in range(300):
        key = rng.choice(odd) + str(i)
        fields = {rng.choice(odd) + f"{j}": (rng.randrange(1 << 40), rng.randrange(1 << 33)) for j in range(rng.randint(0, 3))}
        names = {f: rng.choice(odd) for f in fields} if rng.random() < 0.3 else rng.choice([None, {}])
        number = rng.choice([0, 7, 512, (1 << 63) - 1, -1, -(1 << 63)])  # the int64 range, negatives too
        entries.append(IndexEntry(key, number, rng.randrange(1 << 50), fields, names))
    assert c_lines(entries, encode_basestring_ascii) == python_lines(entries)
    assert c_lines([], encode_basestring_ascii) == b""
    # each line is the JSON of the entry
    for line, e in zip(python_lines(entries).splitlines(), entries, strict=True):
        record = json.loads(line)
        assert record["key"] == e.key and record.get("names", {}) == (e.names or {})
    # entries the builders don't make: the Python code writes them
    for bad in (IndexEntry(1, 0, 0, {}), IndexEntry("k", True, 0, {}), IndexEntry("k", 1 << 64, 0, {}),
                IndexEntry("k", 0, 0, {"f": (1, 2, 3)}), IndexEntry("k", 0, 0, {"f": [1, 2]}), ("k", 0, 0, {})):
        assert c_lines([bad], encode_basestring_ascii) is None
    index = build_index(str(ours(tmp_path / "o.tar", rng)))
    assert index.jsonl_bytes().split(b"\n", 1)[1] == python_lines(index.entries)


def test_jsonl_bytes_same_either_way(tmp_path, monkeypatch):
    path = with_tarfile(tmp_path / "u.tar", tarfile.USTAR_FORMAT, PLAIN_MEMBERS)
    index = build_index(str(path))
    fast = index.jsonl_bytes()
    monkeypatch.setattr(index_module, "_jsonl_lines", None)
    assert index.jsonl_bytes() == fast
    assert fast.decode("ascii") == index.jsonl_text()


def test_c_entries_are_collected_like_python_ones(tmp_path, monkeypatch, c_index):
    """The C builder's entries are tracked by the garbage collector when it returns, as the
    Python builder's are: a cycle a user makes through an entry's dict is collected."""
    import gc
    import weakref

    path = with_tarfile(tmp_path / "g.tar", tarfile.USTAR_FORMAT, [("a.jpg", b"x"), ("b.jpg", b"y")])

    class Box:
        entry: Any = None

    for c in (c_index, None):
        monkeypatch.setattr(index_module, "_index_file", c)
        entry = build_index(str(path)).entries[0]
        assert gc.is_tracked(entry)
        box = Box()
        box.entry = entry
        entry.fields["box"] = box  # type: ignore[assignment]
        gone = weakref.ref(box)
        del entry, box
        gc.collect()
        assert gone() is None, "C" if c else "Python"


@pytest.mark.parametrize("length", [4095, 4096, 4097])
@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT], ids=["gnu", "pax"])
def test_names_up_to_4096_bytes_are_indexed_in_c_alike(tmp_path, monkeypatch, c_index, length, fmt):
    """A long name (GNU) or pax path of up to 4096 bytes, key included, is the C builder's; a longer
    one is the Python builder's, with the same index."""
    name = "d/" + "a" * (length - 6) + ".jpg"
    path = with_tarfile(tmp_path / "l.tar", fmt, [(name, b"x"), (name[:-3] + "cls", b"1"), ("e.jpg", b"y")])
    got, answered = compare(monkeypatch, path, c_index)
    assert got[0] == "index" and got[3][0].key == name[:-4] and answered == (length <= 4096)
