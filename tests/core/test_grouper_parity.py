"""The C grouper (``_speedups.Grouper``) and the Python reference (``samples._group_python``) give
the same samples, in the same order, with the same stats, warnings and errors, pulling the same
members before each sample -- over random member streams with every irregularity grouping meets:
repeated fields, keys that come back (in order and out of order), names without a key, metadata
names and fields.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from tarhelpers import built

import tarproc.samples as samples_module
from tarproc.errors import DuplicateError
from tarproc.samples import _group_python, _Rules
from tarproc.tar import ReadStats

C_GROUPER = samples_module._Grouper


@pytest.fixture
def c_grouper() -> Any:
    return built(C_GROUPER)


def _members(rng: random.Random, n: int) -> list[tuple[Any, str, bytes, int]]:
    keys = [f"k{i:03d}" for i in range(rng.choice([3, 30, 300]))]
    out, offset, k = [], 0, 0
    for _ in range(n):
        r = rng.random()
        if r < 0.55:
            key = keys[k]  # the same key again
        elif r < 0.85:
            k = min(k + 1, len(keys) - 1)  # the next key, in order
            key = keys[k]
        elif r < 0.90:
            key = rng.choice(keys)  # a key from anywhere: maybe one that comes back
        elif r < 0.93:
            key = None
        elif r < 0.96:
            key = rng.choice(["__meta__", "_under", "__x__/y", "_"])
        else:
            key = keys[k] + rng.choice(["-b", "+", "/a", ""])  # sorts before or after its neighbours
        field = rng.choice(["jpg", "cls", "txt", "json", "__f__", "_x", "seg.png"])
        out.append((key, field if key is not None else f"name{offset}", rng.randbytes(rng.randint(0, 3)), offset))
        offset += 512 * rng.randint(1, 3)
    return out


def _run(grouper: Any, members: list[Any], dup: str, stop_after: int | None = None) -> tuple[Any, ...]:
    """What a grouper does with members: (samples and members pulled before each, error, stats,
    warnings, members pulled in all)."""
    stats, warnings = ReadStats(), []
    pulled = [0]

    def source() -> Any:
        for item in members:
            pulled[0] += 1
            yield item

    rules = _Rules("u.tar", dup, stats, warnings.append)
    it = grouper(source(), "u.tar", rules) if grouper is not None else _group_python(source(), "u.tar", rules)
    got, error = [], None
    try:
        for sample in it:
            got.append((sample, pulled[0]))
            if stop_after is not None and len(got) == stop_after:
                break
    except DuplicateError as e:
        error = (str(e), e.url, e.key, pulled[0])
    return got, error, stats.as_dict(), stats.no_key, warnings, pulled[0]


def test_random_member_streams_group_alike(c_grouper):
    seen = {"errors": 0, "warnings": 0, "duplicates": 0, "metadata": 0, "no key": 0}
    for seed in range(60):
        rng = random.Random(seed)
        members = _members(rng, rng.choice([0, 1, 5, 50, 400]))
        for dup in ("error", "warn", "skip"):
            c = _run(c_grouper, members, dup)
            py = _run(None, members, dup)
            assert c == py, (seed, dup)
            stop = rng.randint(1, 5)
            assert _run(c_grouper, members, dup, stop) == _run(None, members, dup, stop), (seed, dup, stop)
            seen["errors"] += c[1] is not None
            seen["warnings"] += len(c[4])
            seen["duplicates"] += c[2]["duplicates"]
            seen["metadata"] += c[2]["metadata_members"]
            seen["no key"] += c[2]["names_without_key"]
    assert min(seen.values()) > 20, seen  # every irregularity was met, many times


def test_sorted_streams_with_keys_out_of_order_late(c_grouper):
    """Keys in order for a long time (no key index is built), then one that came before: it is
    still found, with the offset of its first member."""
    members = [(f"s{i:05d}", f, b"", 1024 * i + j) for i in range(5000) for j, f in enumerate(("cls", "jpg"))]
    members.append(("s00017", "txt", b"", 99))
    members.append(("s99999", "txt", b"", 100))
    for dup in ("error", "warn"):
        c, py = _run(c_grouper, members, dup), _run(None, members, dup)
        assert c == py
    c = _run(c_grouper, members, "error")
    assert c[1] is not None and "key 's00017' reappears at byte 99 after other keys (first seen at byte 17408)" in c[1][0]
    assert len(c[0]) == 5000  # every sample before it was handed out first


def test_bad_members_are_type_errors(c_grouper):
    rules = _Rules("u", "error", ReadStats(), print)
    with pytest.raises(TypeError):
        list(c_grouper(iter([("k", "f", b"")]), "u", rules))
    with pytest.raises(TypeError):
        list(c_grouper(iter([(1, "f", b"", 0)]), "u", rules))
    with pytest.raises(TypeError):
        c_grouper([], "u", rules)  # not an iterator


def test_after_an_error_the_grouper_is_over_as_a_generator_is(c_grouper):
    """An error ends the C grouper as it ends a generator: what follows is StopIteration, not the
    sample it was building; and a callback can't re-enter it."""
    members = [("a", "t", b"1", 0), ("a", "t", b"2", 512), ("b", "t", b"3", 1024)]
    for grouper in (c_grouper, None):
        rules = _Rules("u", "error", ReadStats(), print)
        it = grouper(iter(members), "u", rules) if grouper else _group_python(iter(members), "u", rules)
        with pytest.raises(DuplicateError):
            next(it)
        with pytest.raises(StopIteration):
            next(it)

    def boom() -> Any:
        yield ("a", "t", b"1", 0)
        raise OSError("read failed")

    for grouper in (c_grouper, None):
        rules = _Rules("u", "error", ReadStats(), print)
        it = grouper(boom(), "u", rules) if grouper else _group_python(boom(), "u", rules)
        with pytest.raises(OSError):
            next(it)
        with pytest.raises(StopIteration):
            next(it)

    holder: list[Any] = []
    rules = _Rules("u", "warn", ReadStats(), lambda message: next(holder[0]))
    holder.append(c_grouper(iter(members), "u", rules))
    with pytest.raises(ValueError, match="already executing"):
        next(holder[0])


def test_an_empty_key_groups_alike(c_grouper):
    members = [("", "t", b"1", 0), ("", "__x__", b"2", 512), ("", "u", b"3", 1024), ("b", "t", b"4", 1536)]
    for dup in ("error", "warn"):
        assert _run(c_grouper, members, dup) == _run(None, members, dup)
