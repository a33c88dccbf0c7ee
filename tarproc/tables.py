"""Tables of samples: column specs and cell values (tar2tsv), table formats, and plans (tarcreate).

Column specs (``parse_columns``) are field specs, the whole grammar (``tarproc.fieldspec``
describes it); the first alternative a sample has gives the cell, and the header is the spec's
name. A cell holds:

- for ``__key__`` and ``__url__``, the sample's key and its shard;
- for a field (``cls``, ``seg.png``), its text, decoded as UTF-8;
- for a JSON path (``json.label``), the value there: a string as it is, other values as compact
  JSON;
- for ``:size``, ``:sha256`` and ``:type`` (``sniff_type``), a binary field's size, hex digest
  or kind.

Binary is never dumped raw: a field that is not UTF-8 text (or holds control characters other
than tab, newline, CR and FF) without a ``:size|:sha256|:type`` modifier is an error naming the
sample and field. A missing field is an empty cell (``null`` in JSONL), or an error with
``strict``.

Formats: ``tsv`` escapes backslash, tab, newline and CR as ``\\\\ \\t \\n \\r`` (as PostgreSQL
and MySQL do); ``csv`` is RFC 4180 (the csv module: quotes where needed, CRLF line ends);
``jsonl`` writes one JSON object per line. ``read_plan`` reads back all three exactly.

Plans (``plan_samples``): a table with a header row (TSV/CSV) or JSON objects (JSONL), one row a
sample. The key column (``__key__``) or a printf key format names samples; every other column is
a field whose cell is its text, and a column named ``@FIELD`` holds paths of files (relative to a
base directory) whose contents become the field. Empty cells (and JSON nulls) mean the field is
absent. Errors name the plan, the row (its line number; the header is row 1) and the column.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import OptionError, PlanError, SampleError, SourceError
from .fieldspec import CLASS_DIR_IMAGE_EXTENSIONS, MODIFIERS, Accepts, Alternative, FieldSpec, parse_spec, parse_specs
from .samples import Sample, field_names
from .sniff import escape_surrogates, sniff_type
from .stages import check_key_format
from .tar import check_key

TABLE_FORMATS = ("tsv", "csv", "jsonl")
KEY_COLUMN = "__key__"
_META_COLUMNS = ("__key__", "__url__")
_CHUNK = 1 << 20
_MAX_CSV_CELL = (1 << 31) - 1  # the largest limit the csv module accepts on every platform


# ---------------------------------------------------------------------------------------------
# column specs


# what tar2tsv -f takes of the field-spec grammar (tarproc/fieldspec.py): all of it; as before it,
# an empty alternative is an error and ',' is part of a field name ('a,b' is the field 'a,b')
COLUMN_SPECS = Accepts("tar2tsv -f", rename=True, modifiers=True, paths=True, drop_empty=False, commas=False)
Column = FieldSpec  # a column: its header name and the alternatives that fill its cells


def parse_alternative(text: str) -> Alternative:
    """Parse ``FIELD[.JSONPATH][:MODIFIER]``.

    >>> parse_alternative("json.label")
    Alternative(field='json', path=('label',), modifier=None)
    >>> parse_alternative("seg.png:sha256")
    Alternative(field='seg.png', path=(), modifier='sha256')
    >>> parse_alternative("meta.json.boxes.0")
    Alternative(field='meta.json', path=('boxes', '0'), modifier=None)
    """
    spec = parse_spec(text, COLUMN_SPECS)
    if spec.renamed or len(spec.alternatives) != 1:
        raise OptionError(f"bad column {text!r}: expected one FIELD[.JSONPATH][:MODIFIER]")
    return spec.alternatives[0]


def parse_columns(spec: str) -> list[Column]:
    """Parse tar2tsv's columns: field specs, the whole grammar (``tarproc.fieldspec``); a column's
    header is its ``NAME=``, else its spec text.

    >>> [(c.name, [a.field for a in c.alternatives]) for c in parse_columns("__key__ img=jpg;png cls")]
    [('__key__', ['__key__']), ('img', ['jpg', 'png']), ('cls', ['cls'])]
    >>> [a.modifier for a in parse_columns("jpg;png:size")[0].alternatives]
    ['size', 'size']
    """
    return list(parse_specs(spec, COLUMN_SPECS))


def default_columns(sample: Sample) -> list[Column]:
    """``__key__`` and every field of ``sample`` in sorted order; non-text fields as ``FIELD:size``."""
    columns = [Column(KEY_COLUMN, (Alternative(KEY_COLUMN),))]
    for field in field_names(sample):
        if _as_text(sample[field]) is None:
            columns.append(Column(f"{field}:size", (Alternative(field, (), "size"),)))
        else:
            columns.append(Column(field, (Alternative(field),)))
    return columns


# ---------------------------------------------------------------------------------------------
# cell values

_MISSING = object()
_CONTROL = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f]")


def _as_text(data: Any) -> str | None:
    """``data`` as text, or None when it is not UTF-8 text (binary must not be dumped raw)."""
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None if _CONTROL.search(text) else text


def cell_text(value: Any) -> str:
    """The text of a cell value in TSV/CSV: empty for missing, compact JSON for non-strings.

    >>> cell_text(None), cell_text("a"), cell_text(3), cell_text({"b": [1, True]}), cell_text(False)
    ('', 'a', '3', '{"b":[1,true]}', 'false')
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    return str(value)


class RowExtractor:
    """Turn samples into rows of cell values (``str``, ``int`` or JSON values; None for missing)."""

    def __init__(self, columns: list[Column], strict: bool = False) -> None:
        self.columns = columns
        self.names = [c.name for c in columns]
        self.strict = strict
        self._getters = [self._getter(c) for c in columns]
        self._unmatched = list(range(len(columns)))  # columns no sample has had a value for yet
        self.rows = 0

    def __call__(self, sample: Sample) -> list[Any]:
        cache: dict[str, Any] = {}  # parsed JSON fields, for the columns of this sample
        row = [getter(sample, cache) for getter in self._getters]
        self.rows += 1
        if self._unmatched:
            self._unmatched = [i for i in self._unmatched if row[i] is None]
        return row

    def never_matched(self) -> list[str]:
        """The columns that were empty in every row so far (a field or JSON path no sample has).

        >>> x = RowExtractor(parse_columns("__key__ json.nope")); _ = x({"__key__": "a", "json": b"{}"})
        >>> x.never_matched()
        ['json.nope']
        """
        return [self.names[i] for i in self._unmatched]

    def _getter(self, column: Column) -> Callable[[Sample, dict[str, Any]], Any]:
        strict = self.strict
        name = column.name
        if len(column.alternatives) == 1 and not strict:  # the common case, without a wrapper
            return self._alternative(column.alternatives[0], None)
        alternatives = [self._alternative(a, _MISSING) for a in column.alternatives]

        def get(sample: Sample, cache: dict[str, Any]) -> Any:
            for alternative in alternatives:
                value = alternative(sample, cache)
                if value is not _MISSING:
                    return value
            if strict:
                have = ", ".join(field_names(sample)) or "none"
                raise SampleError(
                    f"sample {sample['__key__']!r} has no {name!r} (its fields: {have})",
                    sample.get("__url__"),
                    sample["__key__"],
                )
            return None

        return get

    @staticmethod
    def _alternative(alt: Alternative, missing: Any) -> Callable[[Sample, dict[str, Any]], Any]:
        """A function giving the value of ``alt`` in a sample, or ``missing``."""
        field = alt.field
        if field in _META_COLUMNS:
            return lambda sample, cache: sample.get(field, missing)
        if alt.modifier == "size":
            return lambda sample, cache: missing if (d := sample.get(field)) is None else len(d)
        if alt.modifier == "sha256":
            return lambda sample, cache: missing if (d := sample.get(field)) is None else hashlib.sha256(d).hexdigest()
        if alt.modifier == "type":
            return lambda sample, cache: missing if (d := sample.get(field)) is None else sniff_type(d)
        if not alt.path:

            def text(sample: Sample, cache: dict[str, Any]) -> Any:
                data = sample.get(field)
                if data is None:
                    return missing
                value = _as_text(data)
                if value is None:
                    raise _binary_error(sample, field, len(data))
                return value

            return text
        path = alt.path

        def json_path(sample: Sample, cache: dict[str, Any]) -> Any:
            doc = cache.get(field, _MISSING)
            if doc is _MISSING:
                data = sample.get(field)
                if data is None:
                    return missing
                try:
                    doc = load_json(data)
                except ValueError as e:
                    raise SampleError(
                        f"sample {sample['__key__']!r}: field {field!r} is not valid JSON ({e})",
                        sample.get("__url__"),
                        sample["__key__"],
                    ) from None
                cache[field] = doc
            value = _walk(doc, path)
            return missing if value is _MISSING else value

        return json_path


def load_json(data: str | bytes | bytearray) -> Any:
    """``json.loads`` for strict JSON: NaN, Infinity and numbers too large for a float are
    errors (they can't be written back as JSON), and so is nesting too deep to parse.

    >>> load_json('{"a": [1, 2.5]}')
    {'a': [1, 2.5]}
    >>> load_json('{"a": 1e999}')
    Traceback (most recent call last):
    ...
    ValueError: number 1e999 is out of range
    """
    try:
        return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text} is out of range")
    return value


def _walk(doc: Any, path: tuple[str, ...]) -> Any:
    """Follow a dotted path through objects (keys) and arrays (indexes); _MISSING if it leads nowhere."""
    for part in path:
        if isinstance(doc, dict):
            if part not in doc:
                return _MISSING
            doc = doc[part]
        elif isinstance(doc, list) and part.isascii() and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return _MISSING
    return doc


def _binary_error(sample: Sample, field: str, size: int) -> SampleError:
    return SampleError(
        f"sample {sample['__key__']!r}: field {field!r} is binary ({size} bytes), not text; "
        f"use {field}:size, {field}:sha256 or {field}:type",
        sample.get("__url__"),
        sample["__key__"],
    )


# ---------------------------------------------------------------------------------------------
# writing tables

_TSV_SPECIAL = re.compile(r"[\\\t\n\r]")
_TSV_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
_TSV_UNESCAPE = re.compile(r"\\([\\tnr])")
_TSV_UNESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}


def tsv_escape(text: str) -> str:
    r"""Escape backslash, tab, newline and CR for a TSV cell.

    >>> tsv_escape("a\tb\nc\\d")
    'a\\tb\\nc\\\\d'
    """
    return text.translate(_TSV_ESCAPES) if _TSV_SPECIAL.search(text) else text


def tsv_unescape(text: str) -> str:
    r"""Undo ``tsv_escape``; other backslashes are kept as they are (hand-written paths).

    >>> tsv_unescape(tsv_escape("a\tb\nc\\d\r")) == "a\tb\nc\\d\r"
    True
    >>> tsv_unescape(r"C:\x")
    'C:\\x'
    """
    if "\\" not in text:
        return text
    return _TSV_UNESCAPE.sub(lambda m: _TSV_UNESCAPES[m.group(1)], text)


class _Lines:
    """A file-like ``write`` target for csv.writer that collects what it writes."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        self.parts.append(text)
        return len(text)


def format_table(rows: Iterable[list[Any]], names: list[str], fmt: str, header: bool = True) -> Iterator[str]:
    """Yield the text of a table, one row (with its line end) at a time.

    >>> list(format_table([["a", 3, None]], ["__key__", "n", "x"], "tsv"))
    ['__key__\\tn\\tx\\n', 'a\\t3\\t\\n']
    >>> list(format_table([["a", 3, None]], ["__key__", "n", "x"], "jsonl"))
    ['{"__key__":"a","n":3,"x":null}\\n']
    """
    if fmt == "tsv":
        if header:
            yield "\t".join(tsv_escape(n) for n in names) + "\n"
        search = _TSV_SPECIAL.search
        for row in rows:
            cells = [v if type(v) is str else str(v) if type(v) is int else cell_text(v) for v in row]
            if search("".join(cells)):  # one look per row; escaping is rare
                cells = [tsv_escape(c) for c in cells]
            yield "\t".join(cells) + "\n"
    elif fmt == "csv":
        out = _Lines()
        writer = csv.writer(out, lineterminator="\r\n")  # RFC 4180; CR and LF in cells get quoted
        if header:
            writer.writerow(names)
            yield out.parts.pop()
        for row in rows:
            writer.writerow([v if type(v) is str else cell_text(v) for v in row])
            yield out.parts.pop()
    elif fmt == "jsonl":
        dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
        for row in rows:
            # a name that is not UTF-8 holds lone surrogates (surrogateescape): JSON escapes
            # (\udcNN for byte 0xNN) keep the line valid UTF-8, as tarshow --json does
            line = dumps(dict(zip(names, row, strict=True)))
            yield escape_surrogates(line) + "\n"
    else:
        raise OptionError(f"bad table format {fmt!r}; use one of {', '.join(TABLE_FORMATS)}")


# ---------------------------------------------------------------------------------------------
# reading plans

_SUFFIXES = {".tsv": "tsv", ".tab": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
_COMPRESSED = (".gz", ".tgz", ".zst", ".zstd", ".xz", ".bz2")


def format_for_name(name: str) -> str | None:
    """The table format a name's suffix says (ignoring a compression suffix), or None.

    >>> format_for_name("plan.csv.gz"), format_for_name("x.jsonl"), format_for_name("-")
    ('csv', 'jsonl', None)
    """
    lower = name.lower()
    for suffix in _COMPRESSED:
        if lower.endswith(suffix):
            lower = lower[: -len(suffix)]
            break
    return _SUFFIXES.get(os.path.splitext(lower)[1])


def _raw_lines(stream: Any) -> Iterator[bytes]:
    """Lines of a byte stream, each with its ``\\n`` (the last one may lack it), read in chunks."""
    rest = b""
    while True:
        chunk = stream.read(_CHUNK)
        if not chunk:
            break
        if rest:
            chunk = rest + chunk
        lines = chunk.split(b"\n")
        rest = lines.pop()
        for line in lines:
            yield line + b"\n"
    if rest:
        yield rest


def _text_lines(stream: Any, url: str | None) -> Iterator[str]:
    """Decoded lines; a byte-order mark at the start (spreadsheets write one) is dropped."""
    for number, raw in enumerate(_raw_lines(stream), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PlanError(f"not UTF-8 text (byte {e.start} of the line)", url, number) from None
        if number == 1 and line.startswith("\ufeff"):
            line = line[1:]
        yield line


def _sniff(line: str, second: str | None) -> str:
    """The format of a plan from its first non-blank line (and the next, for one column)."""
    if line.lstrip().startswith("{"):
        return "jsonl"
    if "\t" in line:
        return "tsv"
    if "," in line or line.startswith('"'):
        return "csv"
    # one column: TSV, unless the data is quoted the way CSV quotes cells with quotes, commas or
    # line breaks (TSV never quotes)
    if second is not None and second.startswith('"'):
        return "csv"
    return "tsv"


def read_table(stream: Any, url: str | None, fmt: str | None = None) -> Iterator[tuple[int, dict[str, str | None]]]:
    """Yield ``(row, {column: cell})`` for each record of a TSV/CSV/JSONL table, one at a time.

    ``row`` is the line number where the record starts (the header is row 1); blank lines are
    skipped. Cells are text or None (a JSON null); JSON numbers, booleans, objects and arrays
    become their compact JSON text. ``fmt`` None: from the first non-blank line (``{`` JSONL, a
    tab TSV, a comma or a leading quote CSV; a single column is TSV unless the next line starts
    with a quote, as CSV quotes a cell).

    >>> import io
    >>> list(read_table(io.BytesIO(b"__key__\\tcls\\na\\t1\\n"), "p.tsv", "tsv"))
    [(2, {'__key__': 'a', 'cls': '1'})]
    """
    lines = _text_lines(stream, url)
    if fmt is None:
        head: list[str] = []
        for line in lines:  # up to the second non-blank line, kept to be read again
            head.append(line)
            if sum(1 for h in head if h.strip()) == 2:
                break
        filled = [h for h in head if h.strip()]
        if not filled:
            raise PlanError("no header row (an empty plan)", url)
        fmt = _sniff(filled[0], filled[1] if len(filled) > 1 else None)
        lines = itertools.chain(head, lines)
    if fmt == "tsv":
        yield from _read_tsv(lines, url)
    elif fmt == "csv":
        yield from _read_csv(lines, url)
    elif fmt == "jsonl":
        yield from _read_jsonl(lines, url)
    else:
        raise OptionError(f"bad table format {fmt!r}; use one of {', '.join(TABLE_FORMATS)}")


def _check_header(names: list[str], url: str | None) -> None:
    for name in names:
        if not name:
            raise PlanError("empty column name in the header", url, 1)
    seen = set()
    for name in names:
        if name in seen:
            raise PlanError(f"column {name!r} appears twice in the header", url, 1)
        seen.add(name)


def _header_rows(
    rows: Iterable[tuple[int, list[str]]], url: str | None
) -> Iterator[tuple[int, dict[str, str | None]]]:
    """The rows (line number, cells; blank lines left out) after the header, as dicts by column name.

    The first row is the header; a row with another number of cells, or no header at all, is an error.
    """
    names: list[str] | None = None
    for number, cells in rows:
        if names is None:
            names = cells
            _check_header(names, url)
            continue
        if len(cells) != len(names):
            raise PlanError(f"{len(cells)} cells, but the header has {len(names)} columns", url, number)
        yield number, dict(zip(names, cells, strict=True))
    if names is None:
        raise PlanError("no header row (an empty plan)", url)


def _read_tsv(lines: Iterator[str], url: str | None) -> Iterator[tuple[int, dict[str, str | None]]]:
    return _header_rows(_tsv_cells(lines), url)


def _tsv_cells(lines: Iterator[str]) -> Iterator[tuple[int, list[str]]]:
    for number, line in enumerate(lines, 1):
        line = line.rstrip("\n")
        if line.endswith("\r"):  # a CRLF file; a CR in a cell is written escaped
            line = line[:-1]
        if line:
            yield number, [tsv_unescape(c) for c in line.split("\t")]


def _read_csv(lines: Iterator[str], url: str | None) -> Iterator[tuple[int, dict[str, str | None]]]:
    return _header_rows(_csv_cells(lines, url), url)


def _csv_cells(lines: Iterator[str], url: str | None) -> Iterator[tuple[int, list[str]]]:
    # the csv module refuses cells over 128 KiB by default; tar2tsv writes cells of any size
    csv.field_size_limit(max(csv.field_size_limit(), _MAX_CSV_CELL))
    reader = csv.reader(lines, strict=True)
    start = 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise PlanError(f"bad CSV: {e}", url, start) from None
        number, start = start, reader.line_num + 1
        if cells:
            yield number, cells


def _read_jsonl(lines: Iterator[str], url: str | None) -> Iterator[tuple[int, dict[str, str | None]]]:
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = load_json(line.rstrip("\r\n"))
        except json.JSONDecodeError as e:
            raise PlanError(f"bad JSON: {e.msg} at column {e.colno}", url, number) from None
        except ValueError as e:
            raise PlanError(f"bad JSON: {e}", url, number) from None
        if not isinstance(obj, dict):
            raise PlanError(f"expected a JSON object, got {type(obj).__name__}", url, number)
        yield number, {k: v if v is None or isinstance(v, str) else cell_text(v) for k, v in obj.items()}


# ---------------------------------------------------------------------------------------------
# plans -> samples


def safe_relative(path: str) -> bool:
    """Whether ``path`` stays inside its base directory: not absolute, no ``..`` escape.

    >>> safe_relative("imgs/a.jpg"), safe_relative("/etc/passwd"), safe_relative("a/../../b")
    (True, False, False)
    """
    if os.path.isabs(path):
        return False
    norm = os.path.normpath(path)
    return norm != ".." and not norm.startswith(".." + os.sep)


def plan_samples(
    rows: Iterable[tuple[int, dict[str, str | None]]],
    url: str | None,
    *,
    base_dir: str = ".",
    key_column: str = KEY_COLUMN,
    key_format: str | None = None,
    absolute_names: bool = False,
) -> Iterator[Sample]:
    """Turn plan rows (``read_table``) into samples, reading ``@FIELD`` files relative to ``base_dir``.

    Columns named ``__...__`` other than the key column are ignored (``__url__``). With
    ``key_format`` keys are ``key_format % i`` for the i-th sample (from 0) and a key column is
    ignored. A key seen before is an error; so is a row with no fields, or an ``@`` path that is
    absolute or climbs out of ``base_dir`` (unless ``absolute_names``).

    >>> rows = [(2, {"__key__": "a", "cls": "1", "txt": ""})]
    >>> list(plan_samples(rows, "p.tsv"))
    [{'__key__': 'a', 'cls': b'1'}]
    """
    if key_format is not None:
        check_key_format(key_format)
    seen: set[str] = set()  # keys so far: a few dozen bytes a row, no file data
    layout: tuple[tuple[str, str, bool], ...] | None = None
    layout_of: tuple[str, ...] | None = None
    index = 0
    for number, cells in rows:
        names = tuple(cells)
        if names != layout_of:  # the same for every row of a TSV/CSV plan; may vary in JSONL
            layout = _layout(names, url, number, key_column)
            layout_of = names
        assert layout is not None
        if key_format is not None:
            key = key_format % index
        else:
            value = cells.get(key_column)
            if not value:
                raise PlanError("no key", url, number, key_column)
            key = value
            try:
                check_key(key)
            except SampleError as e:
                raise PlanError(e.message, url, number, key_column) from None
            if key in seen:
                raise PlanError(f"duplicate key {key!r}", url, number, key_column)
            seen.add(key)
        sample: Sample = {"__key__": key}
        for column, field, is_file in layout:
            value = cells[column]
            if value is None or value == "":
                continue
            if is_file:
                sample[field] = _read_file(value, base_dir, absolute_names, url, number, field)
            else:
                try:
                    sample[field] = value.encode()
                except UnicodeEncodeError as e:  # a lone surrogate ("\ud800" in JSON)
                    raise PlanError(f"text that is not valid Unicode ({value[e.start]!r} at character {e.start})",
                                    url, number, field) from None
        if len(sample) == 1:
            raise PlanError(f"sample {key!r} has no fields (every cell is empty)", url, number)
        index += 1
        yield sample


def _layout(names: tuple[str, ...], url: str | None, row: int, key_column: str) -> tuple[tuple[str, str, bool], ...]:
    """``(column, field, is_file)`` for the field columns of a header."""
    out = []
    fields: dict[str, str] = {}
    for column in names:
        if column == key_column or (column.startswith("__") and column.endswith("__")):
            continue
        is_file = column.startswith("@")
        field = column[1:] if is_file else column
        if not field or "/" in field or field.startswith("__"):
            raise PlanError(f"bad column name {column!r}: not a field name", url, row)
        if field in fields:
            raise PlanError(f"columns {fields[field]!r} and {column!r} both give field {field!r}", url, row)
        fields[field] = column
        out.append((column, field, is_file))
    return tuple(out)


def _read_file(path: str, base_dir: str, absolute_names: bool, url: str | None, row: int, field: str) -> bytes:
    if "\x00" in path:
        raise PlanError(f"path {path!r} contains a NUL byte", url, row, field)
    if not absolute_names and not safe_relative(path):
        raise PlanError(f"path {path!r} is absolute or leaves -C DIR; use --absolute-names to allow it", url, row, field)
    try:
        with open(os.path.join(base_dir, path), "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise PlanError(f"no such file {path!r}", url, row, field) from None
    except IsADirectoryError:
        raise PlanError(f"{path!r} is a directory, not a file", url, row, field) from None
    except OSError as e:
        raise PlanError(f"cannot read {path!r}: {e.strerror}", url, row, field) from None


# the image files a class directory gives (fieldspec's subset for --classes-from-dirs: the ones it
# always took)
IMAGE_SUFFIXES = frozenset(CLASS_DIR_IMAGE_EXTENSIONS)


@dataclass
class ClassFolders:
    """A plan made from an image-folder tree (one directory per class), as ``class_folder_plan``
    returns it: ``rows`` for ``plan_samples`` (base directory: the root), the class names (a
    class's label is its place in this list), and the files left out (not images)."""

    rows: list[tuple[int, dict[str, str | None]]]
    classes: list[str]
    skipped: int


def class_folder_plan(root: str, seed: int | None = 0) -> ClassFolders:
    """The samples of an image-folder tree: ``ROOT/CLASS/.../NAME.EXT`` becomes the sample
    ``CLASS/.../NAME`` with the image as field ``EXT`` (lower-cased: ``.JPEG`` gives ``jpeg``) and
    ``cls``, the class's index among the sorted class directories (as torchvision's ImageFolder
    numbers them). Dots in a file name's stem become ``_`` (``bird.v2_0001.jpg`` ->
    ``bird_v2_0001``): readers split names at the first dot. Two files that come to the same key
    are an error naming both. ``seed``: the samples in an order shuffled across classes (None:
    class by class, in name order). Files without an image suffix are counted, not read.
    """
    import random

    try:
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
    except OSError as e:
        raise SourceError(f"cannot read the class directories: {e.strerror}", root) from None
    if not classes:
        raise OptionError(f"{root}: no class directories (ROOT/CLASS/IMAGE files) in it")
    rows: list[tuple[int, dict[str, str | None]]] = []
    keys: dict[str, str] = {}
    skipped = 0
    for label, name in enumerate(classes):
        for directory, subdirs, files in os.walk(os.path.join(root, name)):
            subdirs.sort()
            for file in sorted(files):
                stem, dot, suffix = file.rpartition(".")
                if not dot or not stem or suffix.lower() not in IMAGE_SUFFIXES:
                    skipped += 1
                    continue
                rel = os.path.relpath(os.path.join(directory, file), root)
                key = os.path.join(os.path.dirname(rel), stem.replace(".", "_")).replace(os.sep, "/")
                if key in keys:
                    raise SampleError(f"{keys[key]!r} and {rel!r} both make the sample key {key!r}", root, key)
                keys[key] = rel
                rows.append((len(rows) + 1, {KEY_COLUMN: key, "@" + suffix.lower(): rel, "cls": str(label)}))
    if seed is not None:
        random.Random(seed).shuffle(rows)
    return ClassFolders(rows, classes, skipped)


__all__ = [
    "KEY_COLUMN",
    "MODIFIERS",
    "TABLE_FORMATS",
    "Alternative",
    "ClassFolders",
    "Column",
    "PlanError",
    "RowExtractor",
    "cell_text",
    "class_folder_plan",
    "default_columns",
    "format_for_name",
    "format_table",
    "parse_alternative",
    "parse_columns",
    "plan_samples",
    "read_table",
    "safe_relative",
    "tsv_escape",
    "tsv_unescape",
]
