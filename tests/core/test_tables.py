"""Tables: column specs, cell values, the three formats (written and read back), plans."""

from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import random

import pytest

from tarproc.errors import OptionError, SampleError
from tarproc.tables import (
    PlanError,
    RowExtractor,
    default_columns,
    format_for_name,
    format_table,
    parse_columns,
    plan_samples,
    read_table,
    tsv_escape,
    tsv_unescape,
)

JPEG = b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4


def sample(**fields):
    s = {"__key__": "a/001", "__url__": "s.tar"}
    s.update({k: v.encode() if isinstance(v, str) else v for k, v in fields.items()})
    return s


def row(spec, s, strict=False):
    return RowExtractor(parse_columns(spec), strict=strict)(s)


# -------------------------------------------------------------------------------------------
# column specs


def test_parse_columns_names_and_alternatives():
    cols = parse_columns("__key__ cls json.label img=jpg;png:size seg.png:type meta.json.a.0")
    assert [c.name for c in cols] == ["__key__", "cls", "json.label", "img", "seg.png:type", "meta.json.a.0"]
    img = cols[3].alternatives
    assert [(a.field, a.modifier) for a in img] == [("jpg", "size"), ("png", "size")]
    assert (cols[2].alternatives[0].field, cols[2].alternatives[0].path) == ("json", ("label",))
    assert (cols[4].alternatives[0].field, cols[4].alternatives[0].modifier) == ("seg.png", "type")
    assert (cols[5].alternatives[0].field, cols[5].alternatives[0].path) == ("meta.json", ("a", "0"))


@pytest.mark.parametrize(
    "spec",
    ["", "   ", "a=", "=b", "jpg:bogus", "a;;b", "__key__:size", "json.a:size", "x..y", "a/b", "cls cls", "__x__"],
)
def test_parse_columns_bad(spec):
    with pytest.raises(OptionError):
        parse_columns(spec)


# -------------------------------------------------------------------------------------------
# cell values


def test_text_json_and_modifiers():
    s = sample(cls="3", json='{"label": "dog", "box": [1, 2.5], "o": {"b": null}, "t": true}', jpg=JPEG)
    spec = "__key__ __url__ cls json.label json.box json.box.1 json.o json.t json.o.b jpg:size jpg:sha256 jpg:type"
    assert row(spec, s) == [
        "a/001", "s.tar", "3", "dog", [1, 2.5], 2.5, {"b": None}, True, None,
        len(JPEG), hashlib.sha256(JPEG).hexdigest(), "jpeg",
    ]
    lines = list(format_table([row(spec, s)], spec.split(), "tsv"))
    assert lines[1].split("\t")[4:9] == ['[1,2.5]', "2.5", '{"b":null}', "true", ""]  # null: an empty cell


def test_alternatives_first_present_wins_and_missing_is_empty():
    s = sample(png=b"\x89PNG\r\n\x1a\nxx", cls="1")
    assert row("jpg;png:type x=json.a;cls nope", s) == ["png", "1", None]
    assert row("json.a.b", sample(json='{"a": [1]}')) == [None]  # a path that leads nowhere


def test_strict_names_the_key_and_url():
    with pytest.raises(SampleError) as e:
        row("__key__ txt", sample(cls="1"), strict=True)
    assert str(e.value) == "s.tar: sample 'a/001' has no 'txt' (its fields: cls)"


@pytest.mark.parametrize("data", [JPEG, b"\x00\x01abc", bytes([0xC3, 0x28])])
def test_binary_is_never_dumped(data):
    with pytest.raises(SampleError, match=r"sample 'a/001': field 'bin' is binary .*use bin:size"):
        row("bin", sample(bin=data))


def test_bad_json_names_sample_and_field():
    with pytest.raises(SampleError, match=r"s.tar: sample 'a/001': field 'json' is not valid JSON"):
        row("json.a", sample(json="{nope"))


def test_default_columns():
    cols = default_columns(sample(txt="hi", jpg=JPEG, cls="2"))
    assert [c.name for c in cols] == ["__key__", "cls", "jpg:size", "txt"]


# -------------------------------------------------------------------------------------------
# formats: written, then read back exactly

NASTY = [
    "tab\there", "new\nline", "cr\rhere", "crlf\r\nx", "back\\slash", "\\t literal", 'quote "q"', "comma, x",
    " lead and trail ", "ünïcödé ✓", "end\\", "\\", "=1+2", "'", "@notafile",
]


def test_tsv_escape_roundtrip_random():
    rng = random.Random(7)
    alphabet = "ab\\\t\n\rtnr \"'"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))
        escaped = tsv_escape(text)
        assert not set(escaped) & set("\t\n\r")
        assert tsv_unescape(escaped) == text


@pytest.mark.parametrize("fmt", ["tsv", "csv", "jsonl"])
def test_formats_read_back_exactly(fmt):
    names = ["__key__", "txt", "odd\tname"]
    rows = [[f"k{i}", text, str(i)] for i, text in enumerate(NASTY)]
    data = "".join(format_table(rows, names, fmt)).encode()
    back = list(read_table(io.BytesIO(data), "t", fmt))
    assert [list(cells.values()) for _, cells in back] == rows
    assert all(list(cells) == names for _, cells in back)
    if fmt == "tsv":
        assert data.count(b"\n") == len(rows) + 1  # one line per row: nothing unescaped
    if fmt == "csv":  # and any RFC 4180 reader agrees
        assert list(csv.reader(io.StringIO(data.decode(), newline="")))[1:] == rows
    if fmt == "jsonl":
        assert [json.loads(line)["txt"] for line in data.decode().splitlines()] == NASTY


def test_sniffed_format_and_names():
    assert [c for _, c in read_table(io.BytesIO(b'{"__key__": "a", "n": 1}\n'), "x")] == [{"__key__": "a", "n": "1"}]
    assert [c for _, c in read_table(io.BytesIO(b"__key__,cls\na,1\n"), "x")] == [{"__key__": "a", "cls": "1"}]
    assert [c for _, c in read_table(io.BytesIO(b"\xef\xbb\xbf__key__\tcls\r\na\t1\r\n"), "x")] == [
        {"__key__": "a", "cls": "1"}
    ]
    assert format_for_name("p.TSV") == "tsv" and format_for_name("p.ndjson.zst") == "jsonl"
    assert format_for_name("p.txt") is None


def test_rows_are_line_numbers_even_with_multiline_csv():
    data = b'__key__,txt\na,"two\nlines"\n\nb,x\nc\n'
    rows = read_table(io.BytesIO(data), "p.csv", "csv")
    assert next(rows)[0] == 2
    assert next(rows)[0] == 5
    with pytest.raises(PlanError) as e:
        next(rows)
    assert str(e.value) == "p.csv: row 6: 1 cells, but the header has 2 columns"


@pytest.mark.parametrize(
    "fmt, data, message",
    [
        ("tsv", b"__key__\tcls\na\t1\nb\n", "p: row 3: 1 cells, but the header has 2 columns"),
        ("tsv", b"__key__\tcls\tcls\n", "p: row 1: column 'cls' appears twice in the header"),
        ("tsv", b"", "p: no header row (an empty plan)"),
        ("tsv", b"__key__\tcls\na\t\xff\n", "p: row 2: not UTF-8 text (byte 2 of the line)"),
        ("csv", b'__key__,cls\na,"1\n', "p: row 2: bad CSV: unexpected end of data"),
        ("jsonl", b'{"__key__": "a"}\n\n{"__key__": \n', "p: row 3: bad JSON: Expecting value at column 13"),
        ("jsonl", b"[1, 2]\n", "p: row 1: expected a JSON object, got list"),
    ],
)
def test_bad_tables(fmt, data, message):
    with pytest.raises(PlanError) as e:
        list(read_table(io.BytesIO(data), "p", fmt))
    assert str(e.value).startswith(message)


# -------------------------------------------------------------------------------------------
# plans


def plan(text, tmp_path=None, fmt="tsv", **kw):
    rows = read_table(io.BytesIO(text.encode()), "plan.tsv", fmt)
    if tmp_path is not None:
        kw.setdefault("base_dir", str(tmp_path))
    return list(plan_samples(rows, "plan.tsv", **kw))


def test_plan_literal_and_file_fields(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(JPEG)
    got = plan("__key__\tcls\t@jpg\t__url__\na\t1\timgs/a.jpg\tx.tar\nb\t2\t\t\n", tmp_path)
    assert got == [{"__key__": "a", "cls": b"1", "jpg": JPEG}, {"__key__": "b", "cls": b"2"}]


def test_plan_errors_name_row_column_and_path(tmp_path):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "outside.jpg").write_bytes(b"x")
    cases = [
        ("__key__\t@jpg\na\timgs/x.jpg\n", "plan.tsv: row 2, column jpg: no such file 'imgs/x.jpg'"),
        ("__key__\t@jpg\na\timgs\n", "plan.tsv: row 2, column jpg: 'imgs' is a directory, not a file"),
        ("__key__\t@jpg\na\t/etc/hostname\n", "plan.tsv: row 2, column jpg: path '/etc/hostname' is absolute"),
        ("__key__\t@jpg\na\timgs/../../x\n", "plan.tsv: row 2, column jpg: path 'imgs/../../x' is absolute or"),
        ("__key__\tcls\na\t1\nb\t2\na\t3\n", "plan.tsv: row 4, column __key__: duplicate key 'a'"),
        ("__key__\tcls\n\t1\n", "plan.tsv: row 2, column __key__: no key"),
        ("__key__\tcls\na.b\t1\n", "plan.tsv: row 2, column __key__: sample key 'a.b' cannot be written"),
        ("__key__\tcls\na\t\n", "plan.tsv: row 2: sample 'a' has no fields"),
        ("__key__\tjpg\t@jpg\na\t1\tx\n", "plan.tsv: row 2: columns 'jpg' and '@jpg' both give field 'jpg'"),
        ("cls\n1\n", "plan.tsv: row 2, column __key__: no key"),
    ]
    for text, message in cases:
        with pytest.raises(PlanError) as e:
            plan(text, tmp_path / "imgs" if "../" in text else tmp_path)
        assert str(e.value).startswith(message), (text, str(e.value))
    # -P (absolute_names) allows leaving the base directory
    assert plan("__key__\t@jpg\na\t../outside.jpg\n", tmp_path / "imgs", absolute_names=True)[0]["jpg"] == b"x"


def test_plan_key_format_and_key_column():
    assert [s["__key__"] for s in plan("__key__\tcls\nx\t1\ny\t2\n", key_format="img-%03d")] == ["img-000", "img-001"]
    assert plan("name\tcls\nx\t1\n", key_column="name") == [{"__key__": "x", "cls": b"1"}]
    for bad in ("abc", "%d.x", "%s%s"):
        with pytest.raises(OptionError):
            plan("cls\n1\n", key_format=bad)


def test_plan_jsonl_values_and_varying_columns():
    text = '{"__key__": "a", "cls": 3, "json": {"x": [1]}, "txt": null}\n{"__key__": "b", "flag": true}\n'
    assert plan(text, fmt="jsonl") == [
        {"__key__": "a", "cls": b"3", "json": b'{"x":[1]}'},
        {"__key__": "b", "flag": b"true"},
    ]


def test_plan_is_read_one_row_at_a_time():
    consumed = []

    def rows():
        for i in range(10**9):
            consumed.append(i)
            yield i + 2, {"__key__": f"k{i}", "cls": str(i)}

    samples = plan_samples(rows(), "p")
    assert [next(samples)["__key__"] for _ in range(3)] == ["k0", "k1", "k2"]
    assert len(consumed) == 3


class _Generated:
    """An endless plan stream made on the fly; counts the bytes handed out."""

    def __init__(self):
        self.rows = itertools.count()
        self.head = b"cls\ttxt\n"
        self.given = 0

    def read(self, size):
        out = [self.head]
        self.head = b""
        for i in self.rows:
            out.append(b"%d\tsome text for row %d\n" % (i % 10, i))
            if len(out) > size // 32:
                break
        data = b"".join(out)
        self.given += len(data)
        return data


def test_plan_stream_is_read_a_chunk_at_a_time():
    # an endless plan: the samples come out while the stream has been read only a chunk or two ahead
    stream = _Generated()
    samples = plan_samples(read_table(stream, "big.tsv", "tsv"), "big.tsv", key_format="%07d")
    for i, s in enumerate(itertools.islice(samples, 100_000)):
        assert s["txt"] == b"some text for row %d" % i
    assert stream.given < 100_000 * 26 + (2 << 20)


# ------------------------------------------------------------------------------------------------
# found in review: big CSV cells, non-finite JSON, deep nesting, odd path parts, sniffing


def test_csv_round_trip_of_a_cell_over_the_csv_modules_default_limit():
    big = "x" * 300_000
    text = "".join(format_table([["a", big]], ["__key__", "txt"], "csv"))
    assert [c for _, c in read_table(io.BytesIO(text.encode()), "p.csv", "csv")] == [{"__key__": "a", "txt": big}]


@pytest.mark.parametrize("doc", [b'{"x": 1e999}', b'{"x": NaN}', b'{"x": -Infinity}', b"[" * 100_000])
def test_json_that_cannot_be_written_back_is_an_error_naming_the_sample(doc):
    with pytest.raises(SampleError, match=r"sample 'a/001': field 'json' is not valid JSON"):
        row("json.x", sample(json=doc))


def test_json_path_parts_that_are_not_ascii_digits_lead_nowhere():
    assert row("json.a.²", sample(json='{"a": [1, 2, 3]}')) == [None]


def test_jsonl_plan_with_nan_is_a_plan_error():
    with pytest.raises(PlanError, match="row 1"):
        list(read_table(io.BytesIO(b'{"__key__": "a", "x": NaN}\n'), "p.jsonl", "jsonl"))


def test_format_is_sniffed_from_the_first_non_blank_line():
    data = b'\n{"__key__": "a", "cls": "1"}\n'
    assert [c for _, c in read_table(io.BytesIO(data), "-")] == [{"__key__": "a", "cls": "1"}]


def test_one_column_csv_with_quoted_cells_is_sniffed_as_csv():
    text = "".join(format_table([['he said "hi", then\nleft"'], ['"quoted"']], ["txt"], "csv"))
    assert [c for _, c in read_table(io.BytesIO(text.encode()), "-")] == [
        {"txt": 'he said "hi", then\nleft"'}, {"txt": '"quoted"'}
    ]
    # a one-column list of paths stays TSV
    assert [c for _, c in read_table(io.BytesIO(b"@jpg\na.jpg\nb.jpg\n"), "-")] == [{"@jpg": "a.jpg"}, {"@jpg": "b.jpg"}]
