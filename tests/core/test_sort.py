"""sort_samples: in-memory and external (spilled) sorts, stability, shuffles, duplicates, cleanup, memory."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import tracemalloc

import pytest

from tarproc.errors import DuplicateError, OptionError, SampleError, TarFormatError
from tarproc.sort import MIN_MEMORY, SortStats, sort_samples

SMALL = MIN_MEMORY  # a bound that makes a few hundred ~1 KB samples spill into several runs


def make(n: int, seed: int = 0, classes: int = 7, size: int = 900, url: str = "in.tar") -> list[dict]:
    """``n`` samples with shuffled distinct keys, ``cls`` with many ties, a ``json`` label and a body."""
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    out = []
    for arrival, k in enumerate(order):
        out.append({
            "__key__": f"k{k:05d}",
            "__url__": url,
            "cls": str(rng.randrange(classes)).encode(),
            "json": b'{"label": %d, "name": "n%d"}' % (k % 13, arrival),
            "bin": rng.randbytes(size),
            "arrival": str(arrival).encode(),
        })
    return out


def keys(samples) -> list[str]:
    return [s["__key__"] for s in samples]


def as_bytes(sample: dict) -> dict:
    return {k: (v.encode() if isinstance(v, str) and not k.startswith("__") else v) for k, v in sample.items()}


@pytest.fixture
def tmp(tmp_path):
    d = tmp_path / "sorttmp"
    d.mkdir()
    return d


def spilled(samples, tmp, **kw):
    """Sort through the disk (a small bound), check that it did spill and cleaned up."""
    stats = SortStats()
    out = list(sort_samples(samples, memory=SMALL, tmpdir=str(tmp), stats=stats, **kw))
    assert stats.runs >= 2, stats
    assert os.listdir(tmp) == []
    return out, stats


# ---------------------------------------------------------------------------------------------
# orders


def test_key_sort_in_memory_and_spilled_agree_with_sorted(tmp):
    data = make(1500)
    expected = sorted(data, key=lambda s: s["__key__"])
    stats = SortStats()
    assert list(sort_samples(data, stats=stats)) == expected
    assert stats.runs == 0 and stats.tmpdir is None
    out, stats = spilled(data, tmp)
    assert out == expected
    assert stats.samples == 1500 and stats.spilled_bytes > 1500 * 900
    out, _ = spilled(data, tmp, reverse=True)
    assert keys(out) == sorted(keys(data), reverse=True)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("numeric", [False, True])
def test_field_sort_is_stable_across_runs(tmp, reverse, numeric):
    # 7 classes over 1500 samples: long stretches of ties spread over every run
    data = make(1500)
    expected = sorted(data, key=lambda s: int(s["cls"]) if numeric else s["cls"].decode(), reverse=reverse)
    out, stats = spilled(data, tmp, key="cls", numeric=numeric, reverse=reverse)
    assert out == expected  # sorted() is stable: equal classes keep their input order
    for a, b in zip(out, out[1:], strict=False):
        if a["cls"] == b["cls"]:
            assert int(a["arrival"]) < int(b["arrival"])


def test_multi_pass_merge_keeps_order_and_stability(tmp):
    data = make(1500)
    stats = SortStats()
    out = list(sort_samples(data, "cls", memory=SMALL, tmpdir=str(tmp), stats=stats, fan_in=2))
    assert stats.runs > 4 and stats.merge_passes >= 3
    assert out == sorted(data, key=lambda s: s["cls"])
    assert os.listdir(tmp) == []


def test_numeric_differs_from_text_and_parses_floats():
    data = [{"__key__": k, "v": v} for k, v in [("a", b"10"), ("b", b" 9\n"), ("c", b"-1.5e1"), ("d", b"inf"), ("e", b"2.5")]]
    assert keys(sort_samples(data, "v", numeric=True)) == ["c", "e", "b", "a", "d"]
    assert keys(sort_samples(data, "v")) == ["c", "a", "e", "b", "d"]  # text, stripped: '-1.5e1' '10' '2.5' '9' 'inf'


def test_numeric_key_sort():
    data = [{"__key__": k, "x": b""} for k in ["10", "9", "100", "011"]]
    assert keys(sort_samples(data, numeric=True)) == ["9", "10", "011", "100"]


def test_json_path_field():
    data = [{"__key__": f"k{i}", "json": b'{"a": {"b": %d}, "l": [%d]}' % (5 - i, i)} for i in range(5)]
    assert keys(sort_samples(data, "json.a.b", numeric=True)) == ["k4", "k3", "k2", "k1", "k0"]
    assert keys(sort_samples(data, "json.l.0", numeric=True, reverse=True)) == ["k4", "k3", "k2", "k1", "k0"]
    with pytest.raises(SampleError, match="has no field 'json.nope'"):
        list(sort_samples(data, "json.nope"))
    bad = [{"__key__": "z", "json": b"{not json"}]
    with pytest.raises(SampleError, match="'z': field 'json' is not JSON"):
        list(sort_samples(bad, "json.a"))
    deep = [{"__key__": "d", "json": b"[" * 100_000 + b"]" * 100_000}]
    with pytest.raises(SampleError, match=r"'d': field 'json' is not JSON \(nested too deeply to parse\)"):
        list(sort_samples(deep, "json.a"))


def test_bad_values_name_the_sample():
    data = [{"__key__": "good", "__url__": "a.tar", "cls": b"1"}, {"__key__": "bad", "__url__": "a.tar", "cls": b"one"}]
    with pytest.raises(SampleError) as e:
        list(sort_samples(data, "cls", numeric=True))
    assert str(e.value) == "a.tar: sample 'bad': cls value 'one' is not a number"
    with pytest.raises(SampleError, match="'bad': cls value 'nan' is not a number"):
        list(sort_samples([{"__key__": "bad", "cls": b"nan"}], "cls", numeric=True))
    with pytest.raises(SampleError, match="'bad': field 'cls' is not UTF-8 text"):
        list(sort_samples([{"__key__": "bad", "cls": b"\xff\xfe"}], "cls"))


def test_missing_field_error_or_last(tmp):
    data = [{"__key__": f"k{i}", "x": b""} | ({"cls": b"%d" % (i % 3)} if i % 4 else {}) for i in range(12)]
    with pytest.raises(SampleError) as e:
        list(sort_samples(data, "cls"))
    assert "sample 'k0' has no field 'cls' (it has: x)" in str(e.value)
    out = keys(sort_samples(data, "cls", numeric=True, missing="last"))
    assert out[-3:] == ["k0", "k4", "k8"]  # last, in input order
    assert [int(s["cls"]) for s in sort_samples(data, "cls", numeric=True, missing="last") if "cls" in s] == sorted(
        int(s["cls"]) for s in data if "cls" in s
    )
    rev = keys(sort_samples(data, "cls", reverse=True, missing="last"))
    assert rev[-3:] == ["k0", "k4", "k8"]  # still last when reversed
    assert rev[0] == "k2"


# ---------------------------------------------------------------------------------------------
# shuffle


def test_shuffle_is_a_reproducible_permutation_in_memory_and_spilled(tmp):
    data = make(1500)
    a = keys(sort_samples(data, shuffle=True, seed=5))
    b, _ = spilled(data, tmp, shuffle=True, seed=5)
    assert a == keys(b)  # the random keys follow arrival order, so spilling does not change the order
    assert sorted(a) == sorted(keys(data)) and a != keys(data)
    assert keys(sort_samples(data, shuffle=True, seed=6)) != a
    assert keys(sort_samples(data, shuffle=True)) != keys(sort_samples(data, shuffle=True))  # no seed: random


def test_shuffle_allows_duplicate_keys_and_keeps_urls(tmp):
    # the same keys from two shards (a common case): neither the runs nor the merge may confuse them
    data = make(700, url="a.tar") + make(700, seed=1, url="b.tar")
    out, _ = spilled(data, tmp, shuffle=True, seed=1)
    assert sorted((s["__url__"], s["__key__"], s["bin"]) for s in out) == sorted(
        (s["__url__"], s["__key__"], s["bin"]) for s in data
    )


# ---------------------------------------------------------------------------------------------
# duplicates


def dup_data() -> list[dict]:
    first = make(600, url="a.tar")
    second = [dict(s, __url__="b.tar", arrival=b"second") for s in first[:50]]
    return first + second


def test_duplicate_keys_are_an_error_naming_the_key(tmp):
    with pytest.raises(DuplicateError) as e:
        list(sort_samples(dup_data()))
    message = str(e.value)
    assert message.startswith("duplicate key 'k") and "(in a.tar and b.tar)" in message and "--unique" in message
    with pytest.raises(DuplicateError):
        list(sort_samples(dup_data(), memory=SMALL, tmpdir=str(tmp)))
    assert os.listdir(tmp) == []


@pytest.mark.parametrize("unique", ["first", "last"])
def test_unique_keeps_first_or_last_in_input_order(tmp, unique):
    data = dup_data()
    stats = SortStats()
    out = list(sort_samples(data, unique=unique, memory=SMALL, tmpdir=str(tmp), stats=stats))
    assert keys(out) == sorted(set(keys(data)))
    assert stats.dropped == 50
    dup_keys = {s["__key__"] for s in data[600:]}
    for s in out:
        if s["__key__"] in dup_keys:
            assert s["__url__"] == ("a.tar" if unique == "first" else "b.tar")
    assert list(sort_samples(data, unique=unique)) == out  # in memory: the same


def test_numerically_equal_keys_are_not_duplicates():
    data = [{"__key__": k, "x": b""} for k in ["1", "01", "1"]]
    with pytest.raises(DuplicateError, match="duplicate key '1'"):
        list(sort_samples(data, numeric=True))
    assert keys(sort_samples(data, numeric=True, unique="last")) == ["01", "1"]


# ---------------------------------------------------------------------------------------------
# temporaries


def test_tmpdir_is_used_and_removed_after_early_stop(tmp):
    it = sort_samples(make(1500), memory=SMALL, tmpdir=str(tmp))
    first = next(it)
    assert first["__key__"] == "k00000"
    [d] = os.listdir(tmp)
    assert d.startswith("tarsort-") and any(n.endswith(".tar") for n in os.listdir(tmp / d))
    it.close()
    assert os.listdir(tmp) == []


def test_temporaries_removed_after_an_input_error(tmp):
    def failing():
        yield from make(1000)
        raise TarFormatError("in.tar", 1536, "truncated tar header")

    with pytest.raises(TarFormatError):
        list(sort_samples(failing(), memory=SMALL, tmpdir=str(tmp)))
    assert os.listdir(tmp) == []


def test_unwritable_tmpdir_is_a_sink_error(tmp_path):
    from tarproc.errors import SinkError

    with pytest.raises(SinkError, match="cannot create a temporary directory"):
        list(sort_samples(make(1000), memory=SMALL, tmpdir=str(tmp_path / "missing")))


def test_str_values_come_back_as_bytes_after_spilling(tmp):
    data = [as_bytes(s) for s in make(1000)]
    data[0]["txt"] = "héllo"
    out, _ = spilled(data, tmp)
    [s] = [s for s in out if s["__key__"] == data[0]["__key__"]]
    assert s["txt"] == "héllo".encode()


def test_bad_options():
    for kw in [
        {"memory": 1000},
        {"unique": "middle"},
        {"missing": "first"},
        {"shuffle": True, "key": "cls"},
        {"shuffle": True, "reverse": True},
        {"key": "cls", "unique": "first"},
        {"fan_in": 1},
    ]:
        with pytest.raises(OptionError):
            sort_samples([], **kw)


# ---------------------------------------------------------------------------------------------
# memory


def test_sorting_5x_the_bound_stays_within_it(tmp):
    """tracemalloc peak while sorting a generated stream 5x the bound stays under 1.5x the bound."""
    bound = 2 << 20
    n = 5 * bound // 1000  # ~1 KB samples: 5x the bound in data alone

    def stream():
        rng = random.Random(1)
        for i in range(n):
            yield {"__key__": f"k{rng.randrange(10**9):09d}x{i}", "__url__": "g.tar", "bin": rng.randbytes(900)}

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        stats = SortStats()
        count = 0
        last = ""
        for s in sort_samples(stream(), memory=bound, tmpdir=str(tmp), stats=stats):
            assert s["__key__"] > last
            last = s["__key__"]
            count += 1
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert count == n and stats.runs >= 5
    assert peak <= 1.5 * bound, f"peak {peak} for a bound of {bound}"
    assert os.listdir(tmp) == []


def test_a_killed_sort_in_a_child_leaves_nothing(tmp):
    """A child sorting with spilled runs is interrupted (KeyboardInterrupt from a signal): the finally removes them."""
    code = textwrap.dedent(
        f"""
        import os, signal, sys
        from tarproc.sort import sort_samples
        def stream():
            for i in range(3000):
                if i == 2000:
                    os.kill(os.getpid(), signal.SIGINT)
                yield {{"__key__": "k%05d" % (i * 7919 % 3000), "bin": bytes(900)}}
        try:
            for s in sort_samples(stream(), memory={SMALL}, tmpdir={str(tmp)!r}):
                pass
        except KeyboardInterrupt:
            print("interrupted", os.listdir({str(tmp)!r}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "interrupted []", out.stderr
