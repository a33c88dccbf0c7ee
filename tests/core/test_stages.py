"""Sample stages: slices, field selection, shuffling, rekeying, composition."""

from __future__ import annotations

import itertools

import pytest

from tarproc.errors import OptionError, SampleError
from tarproc.stages import compose, parse_fields, parse_slice, rekey, select_fields, shuffle, slice_samples


def _samples(n: int) -> list[dict]:
    return [{"__key__": f"k{i:03d}", "__url__": "u.tar", "txt": str(i).encode()} for i in range(n)]


@pytest.mark.parametrize(
    "text, expected",
    [
        ("10:20", (10, 20, 1)),
        ("::2", (0, None, 2)),
        ("5:", (5, None, 1)),
        (":7", (0, 7, 1)),
        (":", (0, None, 1)),
        ("0:100:10", (0, 100, 10)),
        ("3:9:", (3, 9, 1)),
    ],
)
def test_parse_slice(text, expected):
    assert parse_slice(text) == expected


@pytest.mark.parametrize("text", ["5", "", "a:b", "1:2:3:4", "-1:5", "1:-5", "0:5:0", "0:5:-1", "1.5:3"])
def test_parse_slice_bad(text):
    with pytest.raises(OptionError):
        parse_slice(text)


def test_slice_samples():
    keys = lambda it: [s["__key__"] for s in it]  # noqa: E731
    assert keys(slice_samples(_samples(10), 2, 5)) == ["k002", "k003", "k004"]
    assert keys(slice_samples(_samples(10), 0, None, 3)) == ["k000", "k003", "k006", "k009"]
    assert keys(slice_samples(_samples(10), 8)) == ["k008", "k009"]
    assert keys(slice_samples(_samples(3), 5, 10)) == []


def test_slice_stops_reading_at_hi():
    consumed = []

    def source():
        for s in _samples(1000):
            consumed.append(s["__key__"])
            yield s

    assert len(list(slice_samples(source(), 0, 5))) == 5
    assert len(consumed) == 5


def test_parse_fields():
    assert parse_fields("image:jpg,jpeg,png cls") == [("image", ["jpg", "jpeg", "png"]), ("cls", ["cls"])]
    assert parse_fields("jpg,png") == [("jpg", ["jpg", "png"])]
    assert parse_fields("Img:JPG;PNG  txt") == [("img", ["jpg", "png"]), ("txt", ["txt"])]
    assert parse_fields("seg.png") == [("seg.png", ["seg.png"])]


@pytest.mark.parametrize("spec", ["", "   ", ":jpg", "img:", "a a", "x:jpg x:png", ",", "a:,"])
def test_parse_fields_bad(spec):
    with pytest.raises(OptionError):
        parse_fields(spec)


def _rich_samples():
    return [
        {"__key__": "a", "__url__": "u", "jpg": b"J", "cls": b"1", "extra": b"x"},
        {"__key__": "b", "__url__": "u", "png": b"P", "jpeg": b"E", "cls": b"2"},
        {"__key__": "c", "__url__": "u", "txt": b"T", "cls": b"3"},
    ]


def test_select_fields_rename_and_alternatives():
    out = list(select_fields(_rich_samples()[:2], parse_fields("image:jpg,jpeg,png cls")))
    assert out == [
        {"__key__": "a", "__url__": "u", "image": b"J", "cls": b"1"},
        {"__key__": "b", "__url__": "u", "image": b"E", "cls": b"2"},  # first alternative present wins
    ]


def test_select_fields_missing_policies():
    fields = parse_fields("image:jpg,jpeg,png cls")
    with pytest.raises(SampleError) as info:
        list(select_fields(_rich_samples(), fields))
    assert info.value.key == "c" and "jpg/jpeg/png" in str(info.value) and "cls, txt" in str(info.value)
    assert [s["__key__"] for s in select_fields(_rich_samples(), fields, missing="skip")] == ["a", "b"]
    kept = list(select_fields(_rich_samples(), fields, missing="keep"))
    assert kept[2] == {"__key__": "c", "__url__": "u", "cls": b"3"}
    with pytest.raises(OptionError):
        list(select_fields(_rich_samples(), fields, missing="ignore"))


def test_shuffle_same_seed_same_order_and_permutation():
    samples = _samples(200)
    a = [s["__key__"] for s in shuffle(_samples(200), 50, seed=7)]
    b = [s["__key__"] for s in shuffle(_samples(200), 50, seed=7)]
    c = [s["__key__"] for s in shuffle(_samples(200), 50, seed=8)]
    assert a == b
    assert a != c
    assert sorted(a) == [s["__key__"] for s in samples]  # every sample exactly once
    assert len(set(a)) == 200


def test_shuffle_whole_buffer_is_a_real_permutation():
    n = 100
    keys = [s["__key__"] for s in _samples(n)]
    for seed in range(5):
        out = [s["__key__"] for s in shuffle(_samples(n), n, seed=seed)]
        assert sorted(out) == keys
        assert out != keys
        # the first sample out is drawn from the whole buffer, not from the first few inputs
    firsts = {next(iter(shuffle(_samples(n), n, seed=seed)))["__key__"] for seed in range(40)}
    assert len(firsts) > 20
    assert max(int(k[1:]) for k in firsts) > n // 2


def test_shuffle_lets_go_of_what_it_handed_out():
    """Nothing the buffer handed out stays referenced by it, in its tail (the last samples, once
    the input ran out) too: a sample it held alive would keep its decoded image (or its batch's
    array) to the end of the input."""
    import weakref

    class Sample:
        pass

    made: list[weakref.ref] = []

    def source():  # type: ignore[no-untyped-def]
        for _ in range(40):
            sample = Sample()
            made.append(weakref.ref(sample))
            yield sample

    out = shuffle(source(), 10, seed=3)
    for handed in range(1, 41):
        next(out)  # and dropped: the buffer's samples and at most the one it handed out last live on
        assert sum(ref() is not None for ref in made) <= min(10, 40 - handed) + 1, handed
    assert next(out, None) is None and all(ref() is None for ref in made)


def test_shuffle_fills_buffer_before_first_output():
    consumed = []

    def source():
        for s in _samples(100):
            consumed.append(s)
            yield s

    it = shuffle(source(), 30, seed=1)
    next(it)
    assert len(consumed) == 31  # 30 to fill the buffer, then one to replace the first output


def test_shuffle_small_inputs_and_bad_buffer():
    assert list(shuffle([], 10, seed=0)) == []
    assert [s["__key__"] for s in shuffle(_samples(1), 10, seed=0)] == ["k000"]
    assert [s["__key__"] for s in shuffle(_samples(3), 1, seed=0)] == ["k000", "k001", "k002"]
    with pytest.raises(OptionError):
        list(shuffle(_samples(3), 0))


def test_rekey():
    out = list(rekey(_samples(3), "img-%03d"))
    assert [s["__key__"] for s in out] == ["img-000", "img-001", "img-002"]
    assert [s["txt"] for s in out] == [b"0", b"1", b"2"]
    assert [s["__key__"] for s in rekey(_samples(2), start=5)] == ["000000005", "000000006"]
    with pytest.raises(OptionError):
        list(rekey(_samples(1), "%s-%s"))
    with pytest.raises(OptionError):
        list(rekey(_samples(1), "no-field%"))


def test_compose_applies_stages_in_order():
    stages = [
        lambda s: slice_samples(s, 0, 10),
        lambda s: shuffle(s, 10, seed=3),
        lambda s: rekey(s, "%02d"),
    ]
    out = list(compose(_samples(50), *stages))
    assert [s["__key__"] for s in out] == [f"{i:02d}" for i in range(10)]
    assert sorted(int(s["txt"]) for s in out) == list(range(10))
    assert list(compose(_samples(2))) == _samples(2)
    assert (
        list(itertools.islice(compose(itertools.repeat({"__key__": "x"}), lambda s: slice_samples(s, 0, 3)), 5))
        == [{"__key__": "x"}] * 3
    )
