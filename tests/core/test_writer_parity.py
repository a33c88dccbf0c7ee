"""The C writer (``tarproc._speedups.pack``) and the pure-Python reference writer give byte-identical
archives, and the same errors, for any members: random names (long, unicode, split or not at a
slash, lone surrogates), sizes, data types, writer options and ways of adding (``add``,
``write_members``, ``write_sample``). The other writer tests (test_writer.py) run on both paths too.
"""

from __future__ import annotations

import array
import io
import random
from typing import Any

import pytest
from tarhelpers import built

import tarproc.tar as tario
import tarproc.tar.writer as tar_writer
from tarproc.errors import TarprocError
from tarproc.tar import TarWriter, iter_members

C_PACK = tar_writer._pack  # what the import found: None when the extension is not built


@pytest.fixture
def c_pack() -> Any:
    return built(C_PACK)


class CountingPack:
    """The C writer, counting the members it wrote itself (not handed back to Python)."""

    def __init__(self, pack: Any) -> None:
        self.pack = pack
        self.members = 0

    def __call__(self, buf: Any, used: int, members: Any, start: int, templates: bytes, direct: int) -> Any:
        result = self.pack(buf, used, members, start, templates, direct)
        self.members += result[1] - start
        return result


def _write_both(monkeypatch: pytest.MonkeyPatch, c_pack: Any, script: Any, **options: Any) -> tuple[Any, Any, int]:
    """Run ``script(writer)`` with the C writer and with the Python writer: (C result, Python result,
    members the C writer wrote itself). A result is (bytes, offset, members, samples, errors seen)."""
    results = []
    counting = CountingPack(c_pack)
    for pack in (counting, None):
        monkeypatch.setattr(tar_writer, "_pack", pack)
        buf = io.BytesIO()
        errors: list[tuple[str, str]] = []
        w = TarWriter(buf, **options)
        script(w, errors)
        w.close()
        assert len(buf.getvalue()) == w.offset
        results.append((buf.getvalue(), w.offset, w.members, w.samples, errors))
    return results[0], results[1], counting.members


ALPHABETS = [
    "abcdefghijklmnopqrstuvwxyz0123456789_-",
    "abc/",  # many slashes: every way of splitting a ustar prefix
    "é日本語ü/a",  # 2- and 3-byte UTF-8
    "😀/x",  # 4-byte UTF-8
]


def _random_name(rng: random.Random) -> str:
    alphabet = rng.choice(ALPHABETS)
    # lengths around the limits that matter: 100 (name), 155 + 1 + 100 = 256 (prefix + name)
    length = rng.choice([1, 5, 50, 99, 100, 101, 120, 154, 155, 156, 200, 254, 255, 256, 257, 300, 600, 1500])
    length = max(1, length + rng.randint(-3, 3))
    name = "".join(rng.choice(alphabet) for _ in range(length))
    if rng.random() < 0.3:
        name = rng.choice(["", "dir/", "a" * 150 + "/", "./", "é" * 60 + "/"]) + name + rng.choice([".txt", ".jpg", ""])
    # a name ending in '/' reads as an old-style directory entry, whose data would read as headers
    return name + "x" if name.endswith("/") else name


def _random_data(rng: random.Random) -> Any:
    size = rng.choice([0, 0, 1, 2, 100, 511, 512, 513, 1023, 1024, 1025, 4000, rng.randint(0, 8000)])
    if rng.random() < 0.02:
        size = rng.choice([(1 << 16) - 1, 1 << 16, (1 << 16) + 1, 200_000])  # around the direct write
    raw = rng.randbytes(size)
    kind = rng.random()
    if kind < 0.6:
        return raw
    if kind < 0.75:
        return bytearray(raw)
    if kind < 0.9:
        return memoryview(raw)
    if kind < 0.95:
        return memoryview(array.array("i", raw[: size - size % 4]))  # len() counts items, not bytes
    return memoryview(raw)[::2]  # not contiguous: the C writer leaves it to Python


def _random_options(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.3:
        return {}
    return {
        "mtime": rng.choice([0, 1, 1_700_000_000, 8**11 - 1, 8**11 + 5]),
        "uid": rng.choice([0, 1000, 8**7 - 1, 8**7]),  # the last is base-256
        "gid": rng.choice([0, 100, 65534]),
        "uname": rng.choice(["", "root", "ü" * 10]),
        "gname": rng.choice(["", "users", "g" * 32]),
        "mode": rng.choice([0o644, 0o600, 0o777, 0o7777]),
    }


@pytest.mark.parametrize("seed", range(12))
def test_random_archives_are_byte_identical(monkeypatch, c_pack, seed):
    rng = random.Random(seed)
    options = _random_options(rng)
    members = [(_random_name(rng), _random_data(rng)) for _ in range(rng.choice([1, 10, 300, 1500]))]
    members += [(f"tail/{i:05d}.bin", rng.randbytes(700)) for i in range(rng.choice([0, 2000]))]  # fills the buffer

    def by_add(w: TarWriter, errors: list) -> None:
        for name, data in members:
            w.add(name, data)

    def by_samples(w: TarWriter, errors: list) -> None:
        for i in range(0, len(members), 3):
            w.write_members(f"k{i}", members[i : i + 3])

    for script in (by_add, by_samples):
        c, py, by_c = _write_both(monkeypatch, c_pack, script, **options)
        assert c[0] == py[0], f"seed {seed}: {script.__name__}: first difference at byte " + str(
            next((i for i, (a, b) in enumerate(zip(c[0], py[0], strict=False)) if a != b), min(len(c[0]), len(py[0])))
        )
        assert c[1:] == py[1:]
        assert by_c > 0.5 * len(members)  # the C writer did the work, Python only what it handed back
    # and it reads back as written
    expect = [(name, data.tobytes() if isinstance(data, memoryview) else bytes(data)) for name, data in members]
    assert [(name, data) for name, data, _ in iter_members(io.BytesIO(c[0]))] == expect


def test_write_sample_with_every_value_type(monkeypatch, c_pack):
    def script(w: TarWriter, errors: list) -> None:
        rng = random.Random(7)  # the same samples on both paths
        for i in range(400):
            key = f"{'d' * rng.choice([0, 90, 150, 250])}/s{i:05d}" if i % 3 else f"s{i:05d}"
            w.write_sample({
                "__key__": key.lstrip("/"),
                "__url__": "x.tar",
                "txt": "ünï" * rng.randint(0, 50),
                "cls": rng.randint(0, 999),
                "f": rng.random(),
                "json": {"a": [1, 2], "b": "é"},
                "jpg": rng.randbytes(rng.randint(0, 3000)),
                "npy": memoryview(array.array("d", [rng.random() for _ in range(rng.randint(0, 20))])),
                "ba": bytearray(rng.randbytes(rng.randint(0, 600))),
            })

    c, py, by_c = _write_both(monkeypatch, c_pack, script, mtime=12345)
    assert c == py
    assert by_c == 400 * 7


def test_write_sample_in_one_call_where_every_value_is_bytes(monkeypatch, c_pack):
    """write_sample's one C call (_pack_samples) for samples of bytes: the Python writer's bytes,
    offsets and counts, buffer boundaries included; anything else (a repeated key, a value to
    encode, big or non-contiguous data, upper-case or '/' fields, a released view) is left to the
    rest of the writer, with the same result or error."""
    calls = {"done": 0}
    real = tar_writer._pack_samples

    def counting(*args: Any) -> Any:
        result = real(*args)
        calls["done"] += result[2]  # samples packed
        return result

    monkeypatch.setattr(tar_writer, "_pack_samples", counting)
    released = memoryview(b"gone")
    released.release()

    def script(w: TarWriter, errors: list) -> None:
        rng = random.Random(11)
        for i in range(3000):
            key = rng.choice([f"s{i:05d}", f"{'d' * rng.choice([90, 150, 250])}/s{i:05d}", f"é日/{i}", f"{i}"])
            sample: dict[str, Any] = {"__key__": key, "__url__": "u", "jpg": rng.randbytes(rng.choice([0, 1, 511, 512,
                                      5000, 60_000, 65_535, 65_536, 100_000]))}
            sample[rng.choice(["cls", "txt", "x" * 200, "a.b"])] = memoryview(rng.randbytes(rng.randint(0, 900)))
            odd = rng.random()
            if odd < 0.02:
                sample["Upper"] = b"u"
            elif odd < 0.04:
                sample["json"] = {"a": 1}
            elif odd < 0.05:
                sample["view"] = memoryview(b"abcdef")[::2]
            elif odd < 0.06:
                sample["gone"] = released
            elif odd < 0.07:
                sample["__key__"] = w.last_key or key
            elif odd < 0.08:
                sample = {"__key__": key, "__url__": "u"}
            try:
                w.write_sample(sample)
            except (TarprocError, ValueError, TypeError) as e:
                errors.append((type(e).__name__, str(e)))

    c, py, _ = _write_both(monkeypatch, c_pack, script)
    assert c == py
    assert len(c[4]) > 50 and calls["done"] > 2000


def test_write_samples_loops_in_c_as_write_sample_does(monkeypatch, c_pack):
    """write_samples (the C loop, _pack_samples) gives what write_sample gives sample by sample:
    bytes, counts and errors, with samples that fill the buffer, need the Python writer, repeat a
    key; and what it packed before an iterator raises is written, not lost."""
    rng = random.Random(5)
    samples: list[dict[str, Any]] = []
    for i in range(4000):
        sample: dict[str, Any] = {"__key__": f"s{i:05d}", "jpg": rng.randbytes(rng.choice([0, 100, 3000, 70_000])),
                                  "cls": str(i).encode()}
        if i % 97 == 0:
            sample["json"] = {"i": i}  # encoded by the Python writer
        samples.append(sample)

    def in_one_call(w: TarWriter, errors: list) -> None:
        w.write_samples(iter(samples))

    def one_by_one(w: TarWriter, errors: list) -> None:
        for sample in samples:
            w.write_sample(sample)

    loop, _, _ = _write_both(monkeypatch, c_pack, in_one_call)
    single, py, _ = _write_both(monkeypatch, c_pack, one_by_one)
    assert loop == single == py

    def failing() -> Any:
        yield from samples[:1000]
        raise OSError("the input broke")

    for pack in (c_pack, None):
        monkeypatch.setattr(tar_writer, "_pack", pack)
        buf = io.BytesIO()
        w = TarWriter(buf)
        with pytest.raises(OSError, match="the input broke") as caught:
            w.write_samples(failing())
        assert "failing" in "".join(str(entry.name) for entry in caught.traceback)  # where it was raised
        w.close()
        assert w.samples == 1000
        assert [name for name, _, _ in iter_members(io.BytesIO(buf.getvalue()))][-1] == "s00999.jpg"
    with pytest.raises(TarprocError, match="written twice in a row"):
        TarWriter(io.BytesIO()).write_samples([samples[0], dict(samples[0])])


def test_the_c_writer_runs_no_python_code_while_it_holds_a_borrowed_key(c_pack):
    """A last key that is a str subclass (whose __eq__ could drop the sample's key while the C
    writer holds it) is left to the Python writer: no crash, the same output."""
    class Odd(str):
        def __eq__(self, other: object) -> bool:
            sample.pop("__key__", None)
            return False

        __hash__ = str.__hash__

    sample = {"__key__": "".join(["ke", "y-", "one"]), "txt": b"hello"}
    buf = io.BytesIO()
    w = TarWriter(buf)
    w.last_key = Odd("zzz")
    w.write_samples([dict(sample)])
    w.close()
    assert [name for name, _, _ in iter_members(io.BytesIO(buf.getvalue()))] == ["key-one.txt"]


def test_write_samples_refuses_writes_from_its_own_iterator(monkeypatch, c_pack):
    """The C loop holds the buffer's state while the samples' iterator runs: a write to the same
    writer from there is an error, not bytes overwritten."""
    for pack in (c_pack, None):
        monkeypatch.setattr(tar_writer, "_pack", pack)
        w = TarWriter(io.BytesIO())

        def samples(w: TarWriter = w) -> Any:
            yield {"__key__": "a", "t": b"1"}
            w.add("side.txt", b"s")
            yield {"__key__": "b", "t": b"2"}

        if pack is None:  # the Python writer has no such state: it just writes
            w.write_samples(samples())
            assert w.members == 3
        else:
            with pytest.raises(RuntimeError, match="write_samples is running"):
                w.write_samples(samples())


def test_surrogate_names_go_through_python_and_match(monkeypatch, c_pack):
    names = ["bad-\udcff.txt", "\udce9" * 120 + ".bin", "ok.txt", "dir/\udc80/" + "x" * 200]

    def script(w: TarWriter, errors: list) -> None:
        for i, name in enumerate(names):
            w.add(name, b"d" * (i * 300))

    c, py, by_c = _write_both(monkeypatch, c_pack, script)
    assert c == py
    assert by_c == 1  # only "ok.txt": surrogates are encoded by the Python writer


def test_errors_are_the_python_writers_and_writing_goes_on(monkeypatch, c_pack):
    """A member the writer refuses raises the same error on both paths, with the members before it
    written and nothing of it; the archive written after that is the same too."""
    bad: list[tuple[Any, Any]] = [
        ("", b"x"),
        ("a\x00b.txt", b"x"),
        ("\ud800.txt", b"x"),  # a surrogate that surrogateescape can't encode
        ("str-data.txt", "text, not bytes"),
        ("int-data.txt", 5),
        (b"bytes-name.txt", b"x"),
    ]

    def script(w: TarWriter, errors: list) -> None:
        for i, item in enumerate(bad):
            members = [(f"before{i}.txt", b"b" * i), item, (f"after{i}.txt", b"a")]
            try:
                w.write_members(f"k{i}", members)
            except (TarprocError, ValueError, TypeError, UnicodeError, AttributeError) as e:
                errors.append((type(e).__name__, str(e)))
            try:
                w.add(*item)
            except (TarprocError, ValueError, TypeError, UnicodeError, AttributeError) as e:
                errors.append((type(e).__name__, str(e)))
        w.add("end.txt", b"end")

    c, py, _ = _write_both(monkeypatch, c_pack, script)
    assert c == py
    assert len(c[4]) == 2 * len(bad)


def test_a_closed_writer_refuses_on_both_paths(monkeypatch, c_pack):
    for pack in (c_pack, None):
        monkeypatch.setattr(tar_writer, "_pack", pack)
        w = TarWriter(io.BytesIO())
        w.close()
        with pytest.raises(ValueError, match="closed"):
            w.write_members("k", [("k.txt", b"x")])
        with pytest.raises(ValueError, match="closed"):
            w.add("k.txt", b"x")


def test_members_as_any_iterable_and_lists_for_pairs(monkeypatch, c_pack):
    def script(w: TarWriter, errors: list) -> None:
        w.write_members("a", (m for m in [("a.txt", b"1"), ("a.bin", b"22")]))  # a generator
        w.write_members("b", [["b.txt", b"3"], ("b.bin", bytearray(b"4"))])  # a list, not a tuple
        w.write_members("c", ())

    c, py, _ = _write_both(monkeypatch, c_pack, script)
    assert c == py


def test_the_gather_buffer_is_not_kept_by_the_writer(c_pack):
    """Writes come from a reused buffer: a stream that copies what it is given (as io's contract
    asks) sees the right bytes in every write."""
    writes: list[bytes] = []

    class Copying:
        def write(self, data: Any) -> int:
            writes.append(bytes(data))
            return len(data)

    w = TarWriter(Copying())
    members = [(f"m{i:05d}.bin", bytes([i % 256]) * 3000) for i in range(1000)]
    for name, data in members:
        w.add(name, data)
    w.close()
    assert len(writes) > 2
    raw = b"".join(writes)
    assert [(n, d) for n, d, _ in iter_members(io.BytesIO(raw))] == members


def test_pack_checks_its_arguments(c_pack):
    buf = bytearray(4096)
    templates = bytes(3 * 512)
    with pytest.raises(ValueError):
        c_pack(buf, 0, [], 0, b"short", 1 << 16)
    with pytest.raises(ValueError):
        c_pack(buf, 5000, [], 0, templates, 1 << 16)
    with pytest.raises(TypeError):
        c_pack(buf, 0, 42, 0, templates, 1 << 16)
    with pytest.raises(TypeError):
        c_pack(b"read-only", 0, [], 0, templates, 1 << 16)
    assert c_pack(buf, 0, [("a", b"x" * 5000)], 0, templates, 1 << 16) == (0, 0, tar_writer._PACK_PYTHON)  # never fits
    assert c_pack(buf, 100, [("a", b"x" * 5000)], 0, templates, 1 << 16) == (100, 0, tar_writer._PACK_FULL)
    assert c_pack(buf, 0, [("a", b"x" * 5000)], 0, templates, 4096) == (512, 0, tar_writer._PACK_BIG)
    assert c_pack(buf, 0, [("a", b"x")], 1, templates, 1 << 16) == (0, 1, tar_writer._PACK_DONE)


KEYS = ["s0001", "dir/sub/s2", "é/日本/k", "a" * 300, "./x", "a.b", "dir/", "", "__meta__/x", "___", "__ab__",
        "a/__x__", "__x", "k\x00", "bad-\udcff", 7, None, "x/y.z/w", ".", "/", "//k"]
FIELDS = ["txt", "cls", "jpg", "seg.png", "TXT", "Jpg", "é", "__url__", "__local_path__", "_x", "a/b", "x\x00",
          "", "json", "a" * 200]
VALUES: list[Any] = [b"bytes", b"", "str é", 3, 2.5, {"b": [1, 2]}, [1], True, bytearray(b"ba"), memoryview(b"mv"),
                     None, object()]


def _outcome(fn: Any, sample: Any) -> Any:
    try:
        return "ok", fn(sample)
    except Exception as e:  # the type and the message must be the same on both paths
        return type(e).__name__, str(e)


def test_sample_members_is_the_same_on_both_paths(monkeypatch, c_pack):
    """tario.sample_members with the C writer (_speedups.members for the common case, else the
    Python code) against the Python code alone: the same members, or the same error."""
    rng = random.Random(5)
    by_c = 0
    for i in range(3000):
        sample: dict[Any, Any] = {}
        if rng.random() < 0.97:
            sample["__key__"] = rng.choice(KEYS) if rng.random() < 0.5 else f"k{i:05d}"
        for _ in range(rng.choice([0, 1, 2, 3, 5])):
            field = rng.choice(FIELDS) if rng.random() < 0.6 else rng.choice(["txt", "cls", "jpg", "json"])
            sample[field] = rng.choice(VALUES) if rng.random() < 0.4 else rng.randbytes(rng.randint(0, 50))
        if rng.random() < 0.02:
            sample[5] = b"a field that is not a str"
        monkeypatch.setattr(tar_writer, "_pack", c_pack)
        fast = _outcome(tario.sample_members, sample)
        by_c += tar_writer._members(sample) is not None
        monkeypatch.setattr(tar_writer, "_pack", None)
        assert fast == _outcome(tario.sample_members, sample), sample
    assert by_c > 300  # the C function took the common case


def test_tarproc_pure_python_turns_the_c_writer_off():
    import os
    import subprocess
    import sys

    code = "import tarproc.tar.reader as r, tarproc.tar.writer as w; print(w._pack is None and w._members is None and r._scan is None)"
    out = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TARPROC_PURE_PYTHON="1"),
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"
