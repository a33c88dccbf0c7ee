"""Member matching for tarfirst: field alternatives, keys, regexes, the N-th match, early stop."""

from __future__ import annotations

import pytest

from tarproc.errors import OptionError
from tarproc.first import IMAGE_FIELDS, find_member, make_matcher, parse_alternatives

SAMPLES = [
    {"__key__": "a/0", "__url__": "u", "cls": b"0", "json": b"{}"},
    {"__key__": "a/1", "__url__": "u", "cls": b"1", "png": b"P1", "jpg": b"J1"},
    {"__key__": "b/2", "__url__": "u", "cls": b"2", "webp": b"W2"},
    {"__key__": "b/3", "__url__": "u", "cls": b"3", "seg.png": b"S3", "png": b"P3"},
]


def found(n=1, **kw):
    result = find_member(SAMPLES, make_matcher(**kw), n)
    return result if isinstance(result, int) else (result[0]["__key__"], result[1])


def test_default_is_images_in_preference_order():
    assert IMAGE_FIELDS[:3] == ("jpg", "jpeg", "png")
    assert [found(n) for n in (1, 2, 3, 4)] == [("a/1", "jpg"), ("b/2", "webp"), ("b/3", "png"), 3]


def test_fields_key_regex_combine():
    assert found(fields="png;jpg") == ("a/1", "png")
    assert found(3, fields="cls") == ("b/2", "cls")
    assert found(fields="seg.png") == ("b/3", "seg.png")
    assert found(key="b/3") == ("b/3", "png")
    assert found(key="b/3", fields="cls") == ("b/3", "cls")
    assert found(key="zzz") == 0
    # only --regex: every matching member of a sample counts, in member order
    assert [found(n, regex=r"^a/") for n in (1, 2, 3, 4, 5, 6)] == [
        ("a/0", "cls"), ("a/0", "json"), ("a/1", "cls"), ("a/1", "png"), ("a/1", "jpg"), 5
    ]
    assert found(regex=r"png$", fields="cls;png") == ("a/1", "png")


def test_stops_reading_at_the_match():
    consumed = []

    def endless():
        i = 0
        while True:
            consumed.append(i)
            yield {"__key__": f"k{i}", "__url__": "u", "cls": b"x", **({"jpg": b"J"} if i == 2 else {})}
            i += 1

    sample, field = find_member(endless(), make_matcher())
    assert (sample["__key__"], field) == ("k2", "jpg")
    assert consumed == [0, 1, 2]


@pytest.mark.parametrize("kw", [{"fields": " ; "}, {"fields": "a/b"}, {"regex": "("}, {"key": ""}])
def test_bad_options(kw):
    with pytest.raises(OptionError):
        make_matcher(**kw)
    with pytest.raises(OptionError):
        find_member([], make_matcher(), 0)


def test_parse_alternatives_separators():
    assert parse_alternatives("JPG;png, webp tif") == ("jpg", "png", "webp", "tif")
