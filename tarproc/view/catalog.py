"""What the viewer reads: a list of shards opened lazily through their indexes, paged, searched by
key and filtered, with field bytes read by range. No web stack here (``server.py`` is the web side).

Each shard is an ``IndexedShard``: ``SHARD.idx`` beside it when there is one, otherwise an index
built in memory by one read of the shard, the first time a page needs it. Samples are numbered
across all shards in order (the *position*); a shard whose index can't be had (missing, compressed,
damaged) counts as empty and its one-line error is kept to be shown.

A filter is one or more conditions joined by ``&``; each is ``FIELD=VALUE``, ``FIELD!=VALUE``,
``FIELD~TEXT`` (contains, any case) or ``FIELD`` (the sample has it). ``FIELD`` may go on into
a JSON field with dots (``json.meta.lang=en``, list items by number: ``json.tags.0=cat``);
``__key__`` is the sample's key.

>>> f = parse_filter("cls=3 & json.meta.lang!=de")
>>> [(c.path, c.op, c.value) for c in f]
[('cls', '=', '3'), ('json.meta.lang', '!=', 'de')]
>>> parse_filter("=3")
Traceback (most recent call last):
...
tarproc.errors.OptionError: filter '=3': a condition needs a field name before '='
"""

from __future__ import annotations

import os
import posixpath
import threading
import time
from collections.abc import Callable, Container, Iterator
from typing import Any, NamedTuple

from ..content import IMAGE_TYPES, field_damage, jpeg_header, not_an_image, png_header, sniff_content
from ..errors import IndexFileError, OptionError, SourceError, TarFormatError, TarprocError
from ..fieldspec import IMAGE_FORMATS
from ..index import IndexedShard, IndexEntry, default_index_url
from ..sources import local_path, open_source
from ..sources.remote import url_to_fs
from ..tar.headers import BLOCK, LONGNAME, PAX, cstr, decode_name, header_name, parse_number, parse_pax

MAX_TEXT = 1 << 20  # bytes of a text or JSON field shown in full on a sample's page
PREVIEW_BYTES = 1 << 16  # text-like fields up to this size are read for a page of samples
FILTER_READ_LIMIT = 1 << 20  # a field bigger than this is not read to test a filter (no match)
SNIFF_LIMIT = 4096  # a field with an unknown extension, up to this size, is read to see what it is
DAMAGE_READ_LIMIT = 16 << 20  # a bigger image is not read for a page: only the browser says it won't show
MAX_EXTENSION_HEADERS = 1 << 20  # bytes of pax/GNU headers before a member read to learn its long name
SHOWN_FIELDS = 30  # field names listed in the message for a filter on a field no sample has

# the image formats a browser shows (format -> Content-Type); their extensions come from the one list
_BROWSER_IMAGES = {"jpeg": "image/jpeg", "png": "image/png", "gif": "image/gif", "webp": "image/webp",
                   "bmp": "image/bmp", "avif": "image/avif"}
# extension (the last part of a field name) -> (kind, Content-Type); kind drives the page
_TYPES: dict[str, tuple[str, str]] = {
    **{ext: ("image", _BROWSER_IMAGES[fmt]) for ext, fmt in IMAGE_FORMATS.items() if fmt in _BROWSER_IMAGES},
    "ico": ("image", "image/x-icon"), "svg": ("image", "image/svg+xml"),
    "wav": ("audio", "audio/wav"), "mp3": ("audio", "audio/mpeg"), "flac": ("audio", "audio/flac"),
    "ogg": ("audio", "audio/ogg"), "oga": ("audio", "audio/ogg"), "opus": ("audio", "audio/ogg"),
    "m4a": ("audio", "audio/mp4"), "aac": ("audio", "audio/aac"), "weba": ("audio", "audio/webm"),
    "mp4": ("video", "video/mp4"), "m4v": ("video", "video/mp4"), "webm": ("video", "video/webm"),
    "ogv": ("video", "video/ogg"), "mov": ("video", "video/quicktime"), "mkv": ("video", "video/x-matroska"),
    "json": ("json", "application/json"), "jsn": ("json", "application/json"),
    "txt": ("text", "text/plain; charset=utf-8"), "text": ("text", "text/plain; charset=utf-8"),
    "transcript": ("text", "text/plain; charset=utf-8"), "caption": ("text", "text/plain; charset=utf-8"),
    "cls": ("text", "text/plain; charset=utf-8"), "cls2": ("text", "text/plain; charset=utf-8"),
    "label": ("text", "text/plain; charset=utf-8"), "index": ("text", "text/plain; charset=utf-8"),
    "inx": ("text", "text/plain; charset=utf-8"), "id": ("text", "text/plain; charset=utf-8"),
    "md": ("text", "text/plain; charset=utf-8"), "csv": ("text", "text/plain; charset=utf-8"),
    "tsv": ("text", "text/plain; charset=utf-8"), "yaml": ("text", "text/plain; charset=utf-8"),
    "yml": ("text", "text/plain; charset=utf-8"), "xml": ("text", "text/plain; charset=utf-8"),
    "html": ("text", "text/plain; charset=utf-8"), "srt": ("text", "text/plain; charset=utf-8"),
    "vtt": ("text", "text/plain; charset=utf-8"),
}
_SNIFFED = {  # sniff_type name -> (kind, Content-Type), for fields whose extension says nothing
    "jpeg": ("image", "image/jpeg"), "png": ("image", "image/png"), "gif": ("image", "image/gif"),
    "webp": ("image", "image/webp"), "bmp": ("image", "image/bmp"), "wav": ("audio", "audio/wav"),
    "mp3": ("audio", "audio/mpeg"), "flac": ("audio", "audio/flac"), "ogg": ("audio", "audio/ogg"),
    "json": ("json", "application/json"), "text": ("text", "text/plain; charset=utf-8"),
    "empty": ("text", "text/plain; charset=utf-8"),
}
BINARY = ("binary", "application/octet-stream")
TEXT_KINDS = ("text", "json")


def field_type(field: str) -> tuple[str, str]:
    """``(kind, Content-Type)`` of a field by its extension (the part after its last dot).

    >>> field_type("jpg"), field_type("seg.PNG"), field_type("npy")
    (('image', 'image/jpeg'), ('image', 'image/png'), ('binary', 'application/octet-stream'))
    """
    return _TYPES.get(field.rpartition(".")[2].lower(), BINARY)


def sniffed_type(data: bytes) -> tuple[str, str]:
    """``(kind, Content-Type)`` from a field's first bytes (for unknown extensions)."""
    return _SNIFFED.get(sniff_content(data), BINARY)


# the formats whose header Pillow reads for sure (a plugin may be missing for AVIF/HEIC: not a damage)
_PILLOW_HEADERS = frozenset({"jpeg", "png", "gif", "bmp", "webp", "tiff"})


def wants_image_check(field: str, kind: str) -> bool:
    """Whether a field is read for a page to check its image (``image_problem``): a browser
    image by its extension (not SVG or ICO, which are no format of the one list), or one sniffed."""
    ext = field.rpartition(".")[2].lower()
    return kind == "image" and (ext in IMAGE_FORMATS or field_type(field)[0] == "binary")


def image_problem(data: bytes) -> str | None:
    """Why an image field would show as a blank box, by checks that decode no pixel: no image
    in it, cut short (``content.field_damage``) or a header that can't be read. None when fine.

    >>> image_problem(b""), image_problem(b"hello"), image_problem(bytes.fromhex("ffd8ffe0"))
    ('no data (an empty field)', 'not an image (the data looks like text)', 'cut short: no end-of-image marker after the scan')
    """
    sniffed = sniff_content(data)
    if sniffed not in IMAGE_TYPES:
        return not_an_image(sniffed)
    damage = field_damage(sniffed, data)
    if damage is not None:
        return damage
    if sniffed == "jpeg" and jpeg_header(data) is not None or sniffed == "png" and png_header(data) is not None:
        return None
    if sniffed not in _PILLOW_HEADERS:
        return None
    import io
    import warnings

    from PIL import Image

    from ..imaging import PILLOW_MODULES

    try:
        with warnings.catch_warnings():
            # the reason goes to the page, not to stderr as Pillow's warnings would
            warnings.filterwarnings("ignore", module=PILLOW_MODULES)
            with Image.open(io.BytesIO(data)) as img:
                img.size  # noqa: B018 -- the header is read on open; the size proves it parsed
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        reason = str(e)
        if reason.startswith("cannot identify image file"):  # it names the BytesIO object: not for people
            reason = f"not a {sniffed} header Pillow can read"
        return " ".join(f"header unreadable: {reason}".split())[:160]
    return None


class Condition(NamedTuple):
    path: str  # FIELD or FIELD.json.path, as written
    op: str  # "=", "!=", "~" or "has"
    value: str


_OPS = ("!=", "=", "~")


def parse_filter(text: str) -> list[Condition]:
    """Conditions of a filter (see the module docstring); ``OptionError`` saying what is wrong."""
    out = []
    for part in text.split("&"):
        part = part.strip()
        if not part:
            continue
        cut = min(((part.find(op), op) for op in _OPS if op in part), default=None)
        if cut is None:
            out.append(Condition(part, "has", ""))
            continue
        at, op = cut
        path, value = part[:at].strip(), part[at + len(op) :].strip()
        if not path:
            raise OptionError(f"filter {text!r}: a condition needs a field name before {op!r}")
        out.append(Condition(path, op, value))
    if not out:
        raise OptionError(f"filter {text!r}: no condition (write e.g. cls=3 or json.meta.lang=en)")
    return out


class Located(NamedTuple):
    shard: int  # number of the shard in the list
    pos: int  # position in the shard
    position: int  # position across all shards


class Catalog:
    """The shards of a viewer, opened on first use (thread-safe: the server reads in threads)."""

    def __init__(self, urls: list[str], *, warn: Callable[[str], None] | None = None) -> None:
        if not urls:
            raise OptionError("no shards to show")
        self.urls = list(urls)
        self.names = [posixpath.basename(u.rstrip("/")) or u for u in self.urls]
        self._shards: list[IndexedShard | None] = [None] * len(urls)
        self.errors: list[str | None] = [None] * len(urls)
        self._locks = [threading.Lock() for _ in urls]
        self._fds: list[int | None] = [None] * len(urls)
        self._bases: dict[int, int] = {}
        self._fields: dict[int, frozenset[str]] = {}
        self._warn = warn
        self._closed = False

    # -- shards --

    def shard(self, i: int) -> IndexedShard | None:
        """Shard ``i`` with its index (built in memory once when it has no ``.idx``); None when it
        can't be indexed (its error is in ``errors[i]``)."""
        opened = self._shards[i]
        if opened is not None or self.errors[i] is not None:
            return opened
        with self._locks[i]:
            if self._shards[i] is None and self.errors[i] is None and not self._closed:
                try:
                    self._shards[i] = IndexedShard(self.urls[i], stale="rebuild", warn=self._warn)
                except TarprocError as e:
                    self.errors[i] = str(e)
                except OSError as e:
                    self.errors[i] = f"{self.urls[i]}: {e.strerror or e}"
            return self._shards[i]

    def count(self, i: int) -> int:
        shard = self.shard(i)
        return 0 if shard is None else len(shard)

    def known(self) -> tuple[int, bool]:
        """Samples in the shards opened so far, and whether every shard has been opened."""
        total, complete = 0, True
        for i in range(len(self.urls)):
            shard = self._shards[i]
            if shard is not None:
                total += len(shard)
            elif self.errors[i] is None:
                complete = False
        return total, complete

    def open_all(self, stop: threading.Event | None = None, *, indexed_only: bool = False) -> None:
        """Open every shard, in order, until ``stop`` is set. ``indexed_only``: only those with a
        ``.idx`` beside them (cheap to load), not those whose index would take a read of the shard."""
        for i in range(len(self.urls)):
            if stop is not None and stop.is_set():
                return
            if not indexed_only or has_index_file(self.urls[i]):
                self.shard(i)

    def close(self) -> None:
        self._closed = True
        for i, shard in enumerate(self._shards):
            with self._locks[i]:
                if shard is not None:
                    shard.close()
                fd, self._fds[i] = self._fds[i], None
                if fd is not None:
                    os.close(fd)

    # -- positions --

    def walk(self, start: int) -> Iterator[Located]:
        """Every sample from position ``start`` on, opening shards as they are reached."""
        base = 0
        for i in range(len(self.urls)):
            n = self.count(i)
            if start < base + n:
                for pos in range(max(start - base, 0), n):
                    yield Located(i, pos, base + pos)
            base += n

    def locate(self, shard: int, pos: int) -> Located | None:
        """The sample at ``pos`` in shard number ``shard``, None when there is none."""
        if not 0 <= shard < len(self.urls) or pos < 0 or pos >= self.count(shard):
            return None
        return Located(shard, pos, self._base(shard) + pos)

    def _base(self, shard: int) -> int:
        """The position of shard ``shard``'s first sample (fixed once the shards before it are open)."""
        base = self._bases.get(shard)
        if base is None:
            base = self._bases[shard] = sum(self.count(i) for i in range(shard))
        return base

    def is_open(self, shard: int) -> bool:
        """Whether ``shard(shard)`` and ``locate`` in it answer without reading (no index to build)."""
        return (self._shards[shard] is not None or self.errors[shard] is not None) and shard in self._bases

    def find_key(self, key: str) -> list[Located]:
        """Where a key is, in every shard (the first place first)."""
        out = []
        base = 0
        for i in range(len(self.urls)):
            shard = self.shard(i)
            if shard is not None:
                try:
                    pos = shard.index.position(key)
                except KeyError:
                    pass
                else:
                    out.append(Located(i, pos, base + pos))
                base += len(shard)
        return out

    def fields_of(self, i: int) -> frozenset[str]:
        """Every field name the samples of shard ``i`` have (from its index, gathered once)."""
        known = self._fields.get(i)
        if known is None:
            shard = self.shard(i)
            names: set[str] = set()
            for entry in shard.index.entries if shard is not None else ():
                names.update(entry.fields)
            known = self._fields[i] = frozenset(names)
        return known

    def absent_field(self, path: str) -> str | None:
        """Why a filter on ``path`` (``FIELD`` or ``FIELD.json.path``) can match nothing: no sample
        of any shard has a field it starts with. None as soon as one shard has one: the shards
        already open are asked first (no read), the others opened in order only until one has it.

        The field sets come from the indexes, so that a filter on a misspelt field answers at once
        instead of scanning the whole dataset to find nothing."""
        if path == "__key__":
            return None
        order = [i for i in range(len(self.urls)) if self._shards[i] is not None]
        order += [i for i in range(len(self.urls)) if i not in order]
        seen: set[str] = set()
        for i in order:
            fields = self.fields_of(i)
            if _split_path(path, fields)[0] is not None:
                return None
            seen.update(fields)
        first = path.split(".")[0]
        also = f" nor any other field that {path} starts with" if "." in path else ""
        shown = sorted(seen)
        listed = ", ".join(shown[:SHOWN_FIELDS]) + (f", ... ({len(shown)} in all)" if len(shown) > SHOWN_FIELDS else "")
        return f"no sample has a field {first}{also} (fields seen: {listed or 'none'})"

    def entry(self, at: Located) -> IndexEntry:
        shard = self.shard(at.shard)
        assert shard is not None  # a Located comes from an opened shard
        return shard.index.entries[at.pos]

    # -- reading --

    def read_fields(self, at: Located, fields: list[str]) -> dict[str, bytes]:
        """Whole fields of one sample, each checked against its tar header (``IndexedShard``)."""
        if not fields:
            return {}
        shard = self.shard(at.shard)
        assert shard is not None
        sample = shard.sample(at.pos, fields=fields)
        return {f: sample[f] for f in fields if f in sample}

    def field_span(self, at: Located, field: str) -> tuple[int, int] | None:
        """``(data_offset, size)`` of a field in its shard, None when the sample has no such field."""
        return self.entry(at).fields.get(field)

    def read_range(self, shard: int, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of shard number ``shard``: ``os.pread`` on a local file, a range
        request for a URL. Raises ``SourceError`` when fewer bytes come back."""
        url = self.urls[shard]
        want = end - start
        parts = []
        got = 0
        fd = self._fd(shard)
        if fd is not None:
            try:
                while got < want:
                    piece = os.pread(fd, want - got, start + got)
                    if not piece:
                        break
                    parts.append(piece)
                    got += len(piece)
            except OSError as e:
                raise SourceError(f"cannot read bytes {start}-{end}: {e.strerror or e}", url) from None
        else:
            with open_source(url, offset=start, end=end) as source:
                while got < want:
                    piece = source.read(want - got)
                    if not piece:
                        break
                    parts.append(piece)
                    got += len(piece)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if len(data) != want:
            raise SourceError(f"asked for bytes {start}-{end} and got {len(data)}: the shard changed", url)
        return data

    def _fd(self, shard: int) -> int | None:
        """A descriptor of a local shard, opened once (``os.pread`` on it is safe in threads)."""
        fd = self._fds[shard]
        if fd is None and local_path(self.urls[shard]) is not None:
            with self._locks[shard]:
                if self._closed:
                    raise SourceError("the viewer is stopping", self.urls[shard])
                if self._fds[shard] is None:
                    try:
                        self._fds[shard] = os.open(local_path(self.urls[shard]) or "", os.O_RDONLY)
                    except OSError as e:
                        raise SourceError(f"cannot open: {e.strerror or e}", self.urls[shard]) from None
                fd = self._fds[shard]
        return fd

    def read_field(self, at: Located, field: str, start: int, end: int, check: bool) -> bytes:
        """Bytes ``[start, end)`` of a field's data. ``check``: first make sure that the tar header
        before the data is this member's (a valid checksum, the size the index gives and the
        member's name, ``KEY.FIELD``: bytes served under a key are that member's, not those of
        another sample's member of the same size); ``IndexFileError`` if not. From the field's
        start, header and data come in one read."""
        span = self.field_span(at, field)
        assert span is not None
        offset, size = span
        if not check:
            return self.read_range(at.shard, offset + start, offset + end)
        if start == 0:
            data = self.read_range(at.shard, offset - 512, offset + end)
            self._check_header(at, field, data[:512])
            return data[512:]
        self._check_header(at, field, self.read_range(at.shard, offset - 512, offset))
        return self.read_range(at.shard, offset + start, offset + end)

    def _check_header(self, at: Located, field: str, header: bytes) -> None:
        entry = self.entry(at)
        offset, size = entry.fields[field]
        problem = _header_problem(header, size)
        if problem is None:
            expected = entry.member_name(field)
            name = header_name(header, 0)
            if name != expected:
                name = self._long_name(at, entry, field) or name
            if name != expected:
                problem = f"a member named {name!r}, not {expected!r}"
        if problem:
            raise IndexFileError(
                f"the index doesn't match the shard at byte {offset - 512}: {problem} (field {field!r} of "
                f"sample {entry.key!r}); rebuild the index (tarindex {self.urls[at.shard]})",
                self.urls[at.shard],
            )

    def _long_name(self, at: Located, entry: IndexEntry, field: str) -> str | None:
        """The name a pax or GNU long-name header before a member gives it (a name too long for
        the header's own field), None when there is none. Those headers lie between the end of
        the sample's member before this one (or the sample's first header) and this one."""
        start = entry.offset
        for name, (offset, size) in entry.fields.items():
            if name == field:
                break
            start = offset + -(-size // BLOCK) * BLOCK
        header = entry.fields[field][0] - BLOCK
        if not 0 < header - start <= MAX_EXTENSION_HEADERS:
            return None
        return _extension_name(self.read_range(at.shard, start, header), self.urls[at.shard], start)

    # -- filters --

    def matches(self, at: Located, conditions: list[Condition]) -> bool:
        entry = self.entry(at)
        for cond in conditions:
            if not self._holds(at, entry, cond):
                return False
        return True

    def _holds(self, at: Located, entry: IndexEntry, cond: Condition) -> bool:
        if cond.path == "__key__":
            value: Any = entry.key
            rest: list[str] = []
        else:
            field, rest = _split_path(cond.path, entry.fields)
            if field is None:
                return False
            if cond.op == "has" and not rest:
                return True
            if entry.fields[field][1] > FILTER_READ_LIMIT:
                return False
            data = self.read_fields(at, [field]).get(field)
            if data is None:
                return False
            if rest:
                import json

                try:
                    value = json.loads(data)
                except (ValueError, RecursionError):  # RecursionError: nested too deep
                    return False
                for part in rest:
                    if isinstance(value, dict) and part in value:
                        value = value[part]
                    elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                        value = value[int(part)]
                    else:
                        return False
            else:
                value = data.decode("utf-8", "replace").strip()
        if cond.op == "has":
            return True
        text = _as_text(value)
        if cond.op == "~":
            return cond.value.casefold() in text.casefold()
        return (text == cond.value) == (cond.op == "=")

    def scan(
        self, start: int, n: int, conditions: list[Condition] | None, *, max_seconds: float = 3.0
    ) -> tuple[list[Located], int | None]:
        """Up to ``n`` samples from position ``start`` that pass the filter, and the position to go
        on from (None at the end). Stops early after ``max_seconds`` of filtering, so that a rare
        match in a big dataset answers in pieces."""
        found: list[Located] = []
        deadline = time.monotonic() + max_seconds
        for at in self.walk(start):
            if len(found) >= n:
                return found, at.position
            if conditions is None or self.matches(at, conditions):
                found.append(at)
            elif time.monotonic() > deadline:
                return found, at.position + 1
        return found, None


def has_index_file(url: str) -> bool:
    """Whether ``SHARD.idx`` exists beside a shard (a local file, or a URL asked once)."""
    index_url = default_index_url(url)
    path = local_path(index_url)
    if path is not None:
        return os.path.exists(path)
    try:
        fs, fs_path = url_to_fs(index_url)
        return bool(fs.exists(fs_path))
    except Exception:  # noqa: BLE001 -- a store that can't say: treat as no index
        return False


def _split_path(path: str, fields: Container[str]) -> tuple[str | None, list[str]]:
    """The longest field name that starts ``path`` (field names hold dots: ``seg.png``), and the rest."""
    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        name = ".".join(parts[:k])
        if name in fields:
            return name, parts[k:]
    return None, []


def _as_text(value: Any) -> str:
    """A value as the filter compares it: strings as they are, everything else as JSON."""
    if isinstance(value, str):
        return value
    import json

    return json.dumps(value, ensure_ascii=False)


def _extension_name(data: bytes, url: str, base: int) -> str | None:
    """The long name the extension headers in ``data`` (pax ``path`` or GNU ``L``) give the
    member after them; None without one, or when they don't parse (then the names differ)."""
    name = None
    pos = 0
    while pos + BLOCK <= len(data):
        block = data[pos : pos + BLOCK]
        size = parse_number(block[124:136])
        if size is None or size < 0:
            return None
        body = data[pos + BLOCK : pos + BLOCK + size]
        if block[156] == PAX:
            try:
                name = parse_pax(body, url, base + pos).get("path", name)
            except TarFormatError:
                return None
        elif block[156] == LONGNAME:
            name = decode_name(cstr(body))
        pos += BLOCK + -(-size // BLOCK) * BLOCK
    return name


def _octal(field: bytes) -> int | None:
    text = field.split(b"\0", 1)[0].strip(b" \0")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        return None


def _header_problem(header: bytes, size: int) -> str | None:
    """Why a 512-byte tar header is not one for a member of ``size`` bytes; None when it is."""
    stored = _octal(header[148:156])
    blanked = header[:148] + b" " * 8 + header[156:]
    if stored is None or stored not in (sum(blanked), sum(b - 256 if b > 127 else b for b in blanked)):
        return "no valid tar header there"
    if header[124] & 0x80:  # base-256 size (GNU, for members of 8 GiB and more)
        declared: int | None = int.from_bytes(header[125:136], "big")
    else:
        declared = _octal(header[124:136])
    if declared != size:
        return f"a member of {declared} bytes, not {size}"
    return None
