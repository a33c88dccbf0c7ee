"""Samples: the key rule, metadata and no-key names, duplicates, per-shard grouping, skip-shard."""

from __future__ import annotations

import io

import pytest
from tarhelpers import c_or_python

import tarproc.samples as samples_module
from tarproc.errors import DuplicateError, OptionError, SourceError, TarFormatError
from tarproc.samples import group_samples, is_metadata_name, read_samples, split_name
from tarproc.tar import ReadStats, iter_members

_C_GROUPER = samples_module._Grouper  # None when the extension is not built (or TARPROC_PURE_PYTHON is set)


@pytest.fixture(autouse=True, params=["c-grouper", "python-grouper"])
def grouper(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here with the C grouper and with the Python one (the reference)."""
    return c_or_python(request, monkeypatch, samples_module, "_Grouper", _C_GROUPER)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("dir.v2/img.seg.PNG", ("dir.v2/img", "seg.png")),
        ("a.txt", ("a", "txt")),
        ("a.b.c.d", ("a", "b.c.d")),
        ("x/y/z.JPG", ("x/y/z", "jpg")),
        ("./s/001.cls", ("s/001", "cls")),  # the "./" of tar -C dir . is not part of the key
        ("././s/002.cls", ("s/002", "cls")),
        ("k.", ("k", "")),
        ("ünï.ÜX", ("ünï", "üx")),
        ("README", None),
        ("a/.hidden.txt", None),
        (".hidden", None),
        ("dir.v2/noext", None),
        ("dir/", None),
        ("", None),
    ],
)
def test_split_name_key_rule(name, expected):
    assert split_name(name) == expected


@pytest.mark.parametrize(
    "name, expected",
    [
        ("__meta__/x.json", True),
        ("__index__.json", True),
        ("k.__url__", True),
        ("k.__key__", True),
        ("a/b.__extra__", True),
        ("____/x.txt", False),  # too short to be __name__
        ("__a__/x.txt", True),
        ("_x_/y.txt", False),
        ("k.txt", False),
        ("__init__py/a.txt", False),
    ],
)
def test_is_metadata_name(name, expected):
    assert is_metadata_name(name) is expected


def _tar(members) -> bytes:
    from tarproc.tar import TarWriter

    buf = io.BytesIO()
    with TarWriter(buf) as w:
        for name, data in members:
            w.add(name, data)
    return buf.getvalue()


def _group(members, **kw):
    raw = _tar(members)
    return list(group_samples(iter_members(io.BytesIO(raw), "s.tar"), "s.tar", **kw))


def test_grouping_basic():
    samples = _group([("a.cls", b"1"), ("a.jpg", b"J"), ("b.cls", b"2"), ("b.seg.PNG", b"P"), ("c.txt", b"t")])
    assert samples == [
        {"__key__": "a", "__url__": "s.tar", "cls": b"1", "jpg": b"J"},
        {"__key__": "b", "__url__": "s.tar", "cls": b"2", "seg.png": b"P"},
        {"__key__": "c", "__url__": "s.tar", "txt": b"t"},
    ]


def test_names_without_key_are_counted_and_dropped():
    stats = ReadStats()
    samples = _group(
        [
            ("a.txt", b"1"),
            ("README", b"r"),
            ("a/.hidden.txt", b"h"),
            ("a.cls", b"c"),
            ("b/noext", b"n"),
            ("b.txt", b"2"),
        ],
        stats=stats,
    )
    assert [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples] == [
        ("a", ["cls", "txt"]),
        ("b", ["txt"]),
    ]
    assert stats.no_key_count == 3
    assert stats.no_key == ["README", "a/.hidden.txt", "b/noext"]
    assert stats.samples == 2


def test_first_member_without_key_is_counted(reader):
    stats = ReadStats()
    samples = _group([("README", b"r"), ("a.txt", b"1")], stats=stats)
    assert [s["__key__"] for s in samples] == ["a"]
    assert stats.no_key_count == 1


def test_read_samples_shard_starting_with_readme(tmp_path, reader):
    path = tmp_path / "r.tar"
    path.write_bytes(_tar([("README", b"r"), ("a.txt", b"1"), ("b.txt", b"2")]))
    stats = ReadStats()
    samples = list(read_samples(str(path), stats=stats, on_error="skip-shard", warn=lambda m: None))
    assert [s["__key__"] for s in samples] == ["a", "b"]
    assert stats.no_key_count == 1


def test_metadata_members_are_skipped():
    stats = ReadStats()
    samples = _group(
        [
            ("__meta__/x.json", b"{}"),
            ("a.__url__", b"http://evil"),
            ("a.txt", b"1"),
            ("a.__key__", b"other"),
            ("a.__url__", b"http://evil"),
            ("__meta__/y.json", b"{}"),
            ("a.zz", b"z"),
            ("b.txt", b"2"),
        ],
        stats=stats,
    )
    assert samples == [
        {"__key__": "a", "__url__": "s.tar", "txt": b"1", "zz": b"z"},
        {"__key__": "b", "__url__": "s.tar", "txt": b"2"},
    ]
    assert stats.metadata == 5


def test_reappearing_key_names_both_offsets():
    raw = _tar([("a.txt", b"1"), ("b.txt", b"2"), ("a.cls", b"3")])
    offsets = [o for _, _, o in iter_members(io.BytesIO(raw))]
    assert offsets == [0, 1024, 2048]
    with pytest.raises(DuplicateError) as info:
        list(group_samples(iter_members(io.BytesIO(raw)), "s.tar"))
    e = info.value
    assert e.key == "a" and e.url == "s.tar"
    assert "byte 2048" in str(e) and "byte 0" in str(e)


def test_duplicate_field_names_both_offsets():
    raw = _tar([("a.txt", b"1"), ("a.cls", b"c"), ("a.TXT", b"2")])
    with pytest.raises(DuplicateError) as info:
        list(group_samples(iter_members(io.BytesIO(raw)), "s.tar"))
    e = info.value
    assert e.key == "a"
    assert "'txt'" in str(e) and "bytes 0 and 2048" in str(e)


def test_dup_warn_keeps_first_and_reports():
    messages = []
    stats = ReadStats()
    samples = _group(
        [
            ("a.txt", b"first"),
            ("a.txt", b"second"),
            ("b.txt", b"b"),
            ("a.cls", b"late"),
            ("a.json", b"late2"),
            ("c.txt", b"c"),
        ],
        dup="warn",
        warn=messages.append,
        stats=stats,
    )
    assert samples == [
        {"__key__": "a", "__url__": "s.tar", "txt": b"first"},
        {"__key__": "b", "__url__": "s.tar", "txt": b"b"},
        {"__key__": "c", "__url__": "s.tar", "txt": b"c"},
    ]
    assert stats.duplicates == 2
    assert len(messages) == 2
    assert "bytes 0 and 1024" in messages[0] and "s.tar" in messages[0]
    assert "byte 3072" in messages[1] and "byte 0" in messages[1]


def test_dup_skip_is_silent_but_counted(capsys):
    stats = ReadStats()
    samples = _group(
        [("a.txt", b"first"), ("a.txt", b"second"), ("b.txt", b"b"), ("a.cls", b"late")],
        dup="skip",
        stats=stats,
        warn=lambda m: pytest.fail(f"warned: {m}"),
    )
    assert [s["__key__"] for s in samples] == ["a", "b"]
    assert samples[0]["txt"] == b"first"
    assert stats.duplicates == 2
    assert capsys.readouterr().err == ""


def test_bad_policies_are_option_errors(tmp_path):
    with pytest.raises(OptionError):
        group_samples([], dup="ignore")
    with pytest.raises(OptionError):
        list(read_samples(str(tmp_path / "x.tar"), dup="nope"))
    with pytest.raises(OptionError):
        list(read_samples(str(tmp_path / "x.tar"), on_error="continue"))


# -- read_samples over shards --------------------------------------------------------------------


def _sample_members(keys, fields=("cls", "jpg", "txt")):
    return [(f"{k}.{f}", f"{k}-{f}".encode() * 50) for k in keys for f in fields]


def test_grouping_restarts_at_each_shard(tmp_path, reader):
    a = tmp_path / "a.tar"
    b = tmp_path / "b.tar"
    a.write_bytes(_tar([("x.txt", b"1"), ("k.txt", b"2")]))
    b.write_bytes(_tar([("k.cls", b"3"), ("x.cls", b"4")]))  # k continues across shards; x reappears
    stats = ReadStats()
    samples = list(read_samples([str(a), str(b)], stats=stats))
    assert [(s["__key__"], s["__url__"], sorted(s)[-1]) for s in samples] == [
        ("x", str(a), "txt"),
        ("k", str(a), "txt"),
        ("k", str(b), "cls"),
        ("x", str(b), "cls"),
    ]
    assert stats.shards == 2 and stats.samples == 4 and stats.members == 4


def test_read_samples_fail_raises(tmp_path):
    good = tmp_path / "good.tar"
    good.write_bytes(_tar(_sample_members(["a"])))
    with pytest.raises(SourceError) as info:
        list(read_samples([str(good), str(tmp_path / "missing.tar")]))
    assert info.value.url == str(tmp_path / "missing.tar")


@pytest.mark.parametrize("cut_kind", ["inside-sample", "member-boundary"])
def test_skip_shard_yields_only_complete_samples(tmp_path, reader, cut_kind):
    good1 = tmp_path / "good1.tar"
    good2 = tmp_path / "good2.tar"
    bad = tmp_path / "bad.tar"
    good1.write_bytes(_tar(_sample_members(["g1-0", "g1-1"])))
    good2.write_bytes(_tar(_sample_members(["g2-0"])))
    raw = _tar(_sample_members([f"b-{i}" for i in range(6)]))
    offsets = [o for _, _, o in iter_members(io.BytesIO(raw))]
    # members of sample b-3 are at offsets[9:12]; cut after its 'cls' member or after its last member
    cut = offsets[10] + 700 if cut_kind == "inside-sample" else offsets[12]
    bad.write_bytes(raw[:cut])
    warnings = []
    stats = ReadStats()
    urls = [str(good1), str(tmp_path / "missing.tar"), str(bad), str(good2)]
    samples = list(read_samples(urls, on_error="skip-shard", warn=warnings.append, stats=stats))
    assert [s["__key__"] for s in samples] == ["g1-0", "g1-1", "b-0", "b-1", "b-2", "g2-0"]
    for s in samples:
        assert sorted(s) == ["__key__", "__url__", "cls", "jpg", "txt"]
        assert s["txt"] == f"{s['__key__']}-txt".encode() * 50
    assert len(warnings) == 2
    assert "missing.tar" in warnings[0] and "no such file" in warnings[0]
    assert "bad.tar" in warnings[1] and f"at byte {cut}" in warnings[1]
    assert stats.shards_failed == 2 and len(stats.errors) == 2
    assert stats.samples == 6


def test_skip_shard_with_damage_in_first_header_and_duplicate(tmp_path):
    notar = tmp_path / "notar.tar"
    notar.write_bytes(b"hello world\n" * 100)
    dup = tmp_path / "dup.tar"
    dup.write_bytes(_tar([("a.txt", b"1"), ("b.txt", b"2"), ("a.cls", b"3"), ("c.txt", b"4")]))
    good = tmp_path / "good.tar"
    good.write_bytes(_tar([("z.txt", b"z")]))
    warnings = []
    samples = list(read_samples([str(notar), str(dup), str(good)], on_error="skip-shard", warn=warnings.append))
    assert [s["__key__"] for s in samples] == ["a", "b", "z"]
    assert "not a tar archive" in warnings[0]
    assert "reappears" in warnings[1]
    with pytest.raises(TarFormatError):
        list(read_samples([str(notar), str(good)]))


def test_read_samples_brace_and_join_urls(tmp_path):
    for i in range(3):
        (tmp_path / f"s-{i}.tar").write_bytes(_tar([(f"k{i}.txt", b"x")]))
    (tmp_path / "extra.tar").write_bytes(_tar([("e.txt", b"x")]))
    pattern = str(tmp_path / "s-{0..2}.tar") + "::" + str(tmp_path / "extra.tar")
    assert [s["__key__"] for s in read_samples(pattern)] == ["k0", "k1", "k2", "e"]
