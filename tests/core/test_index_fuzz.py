"""Fuzz: damaged index files give the right key's bytes or IndexFileError, never anything else.

Deterministic (fixed seeds) and bounded (a fixed number of mutations, a second or two): valid
``tarproc`` index files are damaged (bit flips, truncation, line swaps, numbers changed or made
huge, NaN, deep nesting, keys changed or swapped, invalid UTF-8) and opened with IndexedShard,
which then reads every sample by position and by key, whole and a field at a time. Every outcome
must be either bytes equal to what ``read_samples`` gives for that key and field, or
``IndexFileError`` (the stale-index error is one too). A failure names the seed and the mutation.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tarproc import TarWriter, read_samples
from tarproc.index import IndexedShard, IndexFileError, build_index

CASES = 2000  # mutations, over two seeds; about a second in all


def make_shard(path: Path) -> Path:
    """Samples of every shape the index records: plain, a GNU long name, upper-case extensions
    (a names map), a dotted field, empty and block-sized data."""
    rng = random.Random(1)
    with open(path, "wb") as f, TarWriter(f) as w:
        for i, size in enumerate((0, 1, 511, 512, 513, 1500)):
            w.write_sample({"__key__": f"s/{i:04d}", "cls": str(i), "bin": rng.randbytes(size), "json": {"i": i}})
        w.write_sample({"__key__": "deep/" + "d" * 110 + "/" + "n" * 110, "txt": b"long name"})
        w.add("u/7.JPG", b"upper jpeg")
        w.add("u/7.CLS", b"7")
        w.add("m/8.seg.png", b"dotted field")
        w.add("m/8.cls", b"8")
        w.write_sample({"__key__": "s/0009", "cls": b"9"})
    return path


_NUMBER = re.compile(rb"-?\d+")
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')
_VALUES = [b"0", b"-1", b"-512", b"1", b"512", b"1024", b"4096", b"1.5", b"1e400", b"NaN", b"Infinity",
           b"-Infinity", b"true", b"null", b'"12"', b"[]", b"{}", b"9" * 19, b"9" * 4299, b"9" * 4301, b"1" * 6000]


def _number_spans(data: bytes) -> list[tuple[int, int]]:
    return [m.span() for m in _NUMBER.finditer(data)]


def _replace(data: bytes, span: tuple[int, int], new: bytes) -> bytes:
    return data[: span[0]] + new + data[span[1] :]


def _swap(data: bytes, a: tuple[int, int], b: tuple[int, int]) -> bytes:
    """``data`` with the spans ``a`` and ``b`` (``a`` first, apart) swapped."""
    return data[: a[0]] + data[b[0] : b[1]] + data[a[1] : b[0]] + data[a[0] : a[1]] + data[b[1] :]


def mutate(rng: random.Random, data: bytes) -> tuple[str, bytes]:
    """One damage, described for the failure message."""
    kind = rng.choice(["bit", "byte", "truncate", "swap lines", "copy line", "drop line", "number", "value",
                       "swap numbers", "string", "swap strings", "nest", "utf8", "combo"])
    lines = data.split(b"\n")
    spans = _number_spans(data)
    strings = [m.span() for m in _STRING.finditer(data)]
    if not data:
        return "empty", data
    if (len(lines) < 2 and "line" in kind) or (len(spans) < 2 and kind in ("number", "value", "swap numbers", "nest")) \
            or (len(strings) < 2 and "string" in kind):
        kind = "bit"  # too little left (a combo after a truncation) for that kind
    if kind == "bit":
        out = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        return kind, bytes(out)
    if kind == "byte":
        at = rng.randrange(len(data))
        return f"{kind} {at}", data[:at] + bytes([rng.randrange(256)]) + data[at + 1 :]
    if kind == "truncate":
        at = rng.randrange(len(data))
        return f"{kind} {at}", data[:at]
    if kind in ("swap lines", "copy line", "drop line"):
        i, j = rng.randrange(len(lines) - 1), rng.randrange(len(lines) - 1)
        if kind == "swap lines":
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "copy line":
            lines.insert(j, lines[i])
        else:
            del lines[i]
        return f"{kind} {i} {j}", b"\n".join(lines)
    if kind == "number":  # a plausible neighbour: what a stale or hand-edited index holds
        span = rng.choice(spans)
        n = int(data[span[0] : span[1]])
        n = rng.choice([n + 1, n - 1, n + 512, n - 512, n + 1024, n * 2, 0, -n])
        return f"{kind} {span} -> {n}", _replace(data, span, str(n).encode())
    if kind == "value":
        span, value = rng.choice(spans), rng.choice(_VALUES)
        return f"{kind} {span} -> {value[:20]!r}", _replace(data, span, value)
    if kind == "swap numbers":
        a, b = sorted(rng.sample(spans, 2))
        return f"{kind} {a} {b}", _swap(data, a, b)
    if kind == "string":  # one character of a key, field or member name
        span = rng.choice(strings)
        if span[1] - span[0] <= 2:
            return kind, data
        at = rng.randrange(span[0] + 1, span[1] - 1)
        char = bytes([rng.choice(b"abcsu0179./_-.")])
        return f"{kind} {at} -> {char!r}", data[:at] + char + data[at + 1 :]
    if kind == "swap strings":
        a, b = sorted(rng.sample(strings, 2))
        return f"{kind} {a} {b}", _swap(data, a, b)
    if kind == "nest":
        depth = rng.choice([5, 900, 5000, 200_000])
        span = rng.choice(spans)
        return f"{kind} {depth} at {span}", _replace(data, span, b"[" * depth + b"]" * depth)
    if kind == "utf8":
        at = rng.randrange(len(data))
        return f"{kind} {at}", data[:at] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xe2\x80\xa8"]) + data[at:]
    # combo: two or three of the above
    what = []
    for _ in range(rng.randint(2, 3)):
        one, data = mutate(rng, data)
        what.append(one)
    return "combo: " + "; ".join(what), data


def check_outcomes(shard: Path, idx: Path, expected: dict[str, dict[str, bytes]]) -> tuple[int, int]:
    """Open and query with a damaged index; returns how many samples came back (all verified) and
    how many reads were refused (-1 when the index was refused when opened)."""
    served = refused = 0

    def verify(get: Callable[[], dict[str, Any]]) -> None:
        nonlocal served, refused
        try:
            sample = get()
        except IndexFileError:
            refused += 1
            return
        key = sample["__key__"]
        assert key in expected, f"a sample came back under key {key!r}, which the shard doesn't have"
        for field, value in sample.items():
            if not field.startswith("__"):
                assert field in expected[key], f"{key!r} came back with field {field!r}, which it doesn't have"
                assert bytes(value) == expected[key][field], f"wrong bytes for {key!r} field {field!r}"
        served += 1

    try:
        ds = IndexedShard(shard, index=idx)
    except IndexFileError:
        return 0, -1
    with ds:
        for i in range(len(ds)):
            verify(lambda i=i: ds[i])  # type: ignore[misc]
        for key in ds.keys():
            verify(lambda key=key: ds[key])  # type: ignore[misc]
            for field in ds.index.entries[ds.index.position(key)].fields:
                verify(lambda key=key, field=field: ds.get(key, fields=[field]))  # type: ignore[misc]
    return served, refused


@pytest.mark.parametrize("seed", [0, 1])
def test_damaged_index_files(tmp_path, seed):
    shard = make_shard(tmp_path / "f.tar")
    expected = {s["__key__"]: {k: bytes(v) for k, v in s.items() if not k.startswith("__")}
                for s in read_samples(str(shard))}
    valid = build_index(str(shard)).jsonl_text().encode()
    assert len(expected) == 10 and b'"names":{"jpg":"u/7.JPG","cls":"u/7.CLS"}' in valid
    idx = tmp_path / "f.idx"
    idx.write_bytes(valid)
    assert check_outcomes(shard, idx, expected) == (10 + 10 + 24, 0)  # the valid index serves everything

    rng = random.Random(seed)
    served = at_open = at_read = 0
    for case in range(CASES // 2):
        what, damaged = mutate(rng, valid)
        idx.write_bytes(damaged)
        try:
            n, refused = check_outcomes(shard, idx, expected)
        except AssertionError as e:
            raise AssertionError(f"seed {seed}, case {case} ({what}): {e}") from None
        except Exception as e:
            raise AssertionError(f"seed {seed}, case {case} ({what}): {type(e).__name__}: {e}"[:2000]) from None
        served += n
        at_open += refused < 0
        at_read += refused > 0
    # the damage reaches every check: the parser, the stale check, the headers read, and some
    # damage is harmless (a changed digit of a key's member that isn't read, say)
    assert at_open > CASES // 4 and at_read > CASES // 100 and served > CASES, (at_open, at_read, served)
