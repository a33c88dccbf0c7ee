"""What the fields hold: content statistics for ``tarshow --summary``, read from headers where possible.

Per field, ``ContentStats`` counts the types sniffed from the bytes and, by the kind of the field:

- images: the format by content and how many carry another format's extension (a PNG named
  ``.jpg``), width and height distributions, mode and channels, and those whose header cannot be
  read. Only the header is read: JPEG's frame header and PNG's IHDR (``media_headers``),
  ``Image.open`` (lazy) for the rest; no pixel is decoded.
- audio and video: duration, sample rate, channels, fps, resolution and codec, from
  ``tarproc.decode.media.probe`` (WAV in pure Python, the rest with PyAV when installed).
- text: length in characters, empty ones, and those that are not UTF-8.
- JSON: which top-level keys in how many documents, and their value types; documents that don't parse.
- labels (``cls``, ``label``, ...): the class histogram.

Memory does not grow with the stream: a ``Distribution`` keeps exact value counts while there are at
most ``DISTINCT_VALUES`` distinct values, then log-spaced buckets (2**(1/16) apart: a median within
about 2%, marked estimated); every tally of names (classes, JSON keys, codecs) keeps at most a fixed
number of distinct names and counts the rest as "other". Each problem keeps ``EXAMPLES`` examples,
each with the ``tarfirst`` command that pulls the sample out.

>>> c = ContentStats()
>>> c.add("a", "cls", b"3", "x.tar"); c.add("b", "cls", b"3", "x.tar"); c.add("c", "txt", b"\\xff", "x.tar")
>>> c.fields["cls"].labels.top(2), c.problem_lines()
([('3', 2)], ['text that is not UTF-8: 1'])
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import MissingDependencyError, TarprocError
from .fieldspec import (
    AUDIO_EXTENSIONS,
    IMAGE_FORMATS,
    JSON_EXTENSIONS,
    LABEL_FIELDS,
    TEXT_EXTENSIONS,
    VIDEO_EXTENSIONS,
)
from .media_headers import (
    MAX_AUDIO_CHANNELS,
    MIN_AUDIO_RATE,
    field_damage,
    jpeg_ends,
    jpeg_header,
    not_an_image,
    odd_audio,
    png_damage,
    png_ends,
    png_header,
    riff_damage,
)
from .sniff import escape_text, is_text, sniff_type

if TYPE_CHECKING:
    from .decode.check import DecodeCheck

DISTINCT_VALUES = 1024  # a distribution keeps exact counts up to this many distinct values
LOG_STEPS = 16  # buckets per doubling once it has more
MAX_NAMES = 1000  # distinct names kept per tally (codecs, modes, resolutions, JSON value types)
MAX_CLASSES = 10_000  # distinct labels kept per label field
MAX_JSON_KEYS = 200  # distinct top-level JSON keys kept per field
MAX_KEY_CHARS = 200  # a longer JSON key is counted with the keys not itemised
JSON_PARSE_LIMIT = 1 << 20  # bigger JSON documents are counted, not parsed
EXAMPLES = 3
CHART_BINS = 20

# the image formats sniff_type recognises, and the extensions that claim one of them; PNM
# (.ppm, .pgm, ...) has no magic sniff_type knows, so those fields are sniffed like any other
IMAGE_TYPES = frozenset(IMAGE_FORMATS.values()) - {"pnm"}
CLAIMED_FORMATS = {ext: fmt for ext, fmt in IMAGE_FORMATS.items() if fmt in IMAGE_TYPES}
MEDIA_TYPES = frozenset({"wav", "flac", "ogg", "mp3", "mp4", "matroska", "avi"})
_MAGIC = {"jpeg": b"\xff\xd8\xff", "png": b"\x89PNG\r\n\x1a\n", "gif": b"GIF89a"}
_MAGIC_LEN = {name: len(magic) for name, magic in _MAGIC.items()}

# problem kinds: (the key in the JSON document, the heading in the text report)
PROBLEMS = {
    "undecodable_images": "images whose header cannot be read",
    "extension_mismatch": "images whose content is another format than their extension says",
    "undecodable_media": "audio or video that cannot be read",
    "non_utf8_text": "text that is not UTF-8",
    "invalid_json": "JSON that does not parse",
    "json_missing_keys": "keys most JSON documents have, missing from others",  # one per key and document
    "damaged_images": "images cut short or damaged (no end marker, or chunks past the end)",
    "non_integer_labels": "labels that are not integers among integer labels",
    "decode_failures": "fields that fail to decode (--decode)",
    "odd_audio": "audio whose header declares a rate or channel count no recording has (damage, or a decode bomb)",
}
DECODE_SHOWN = 20  # decode failures the text report lists one by one (--json lists up to MAX_LISTED)
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null",
               list: "array", dict: "object"}


def sniff_content(data: bytes | bytearray | memoryview) -> str:
    """``sniff_type``, but text whose first bytes look like an image's magic is text: "BMW makes
    cars" starts like a BMP (``BM``), and no image is all printable UTF-8.

    >>> sniff_content(b"BMW makes cars"), sniff_content(b"BM" + bytes(60))
    ('text', 'bmp')
    """
    kind = sniff_type(data)
    if kind in IMAGE_TYPES and is_text(data[:512], complete=len(data) <= 512):
        return "text"
    return kind


def plural(n: int, word: str, words: str | None = None) -> str:
    """``"1 sample"``, ``"2 samples"``.

    >>> plural(1, "sample"), plural(0, "sample"), plural(3, "class", "classes")
    ('1 sample', '0 samples', '3 classes')
    """
    return f"{n} {word if n == 1 else (words or word + 's')}"


def tarfirst_command(url: str | None, key: str, field: str | None) -> str:
    """The command that writes this sample's field to stdout (``field`` None: its first member).

    >>> tarfirst_command("data/train 1.tar", "a/001", "jpg")
    "tarfirst 'data/train 1.tar' --key a/001 -f jpg"
    """
    import shlex  # here: tarshow starts without it

    command = f"tarfirst {shlex.quote(url or '-')} --key {shlex.quote(key)}"
    return command if field is None else f"{command} -f {shlex.quote(field)}"


class Tally:
    """Counts of names, at most ``limit`` distinct ones; the rest are counted in ``other``."""

    __slots__ = ("counts", "limit", "other")

    def __init__(self, limit: int = MAX_NAMES) -> None:
        self.counts: Counter[str] = Counter()
        self.limit = limit
        self.other = 0

    def add(self, name: str, n: int = 1) -> None:
        counts = self.counts
        if name in counts or len(counts) < self.limit:
            counts[name] += n
        else:
            self.other += n

    def top(self, n: int | None = None) -> list[tuple[str, int]]:
        return self.counts.most_common(n)

    def as_dict(self) -> dict[str, Any]:
        return {"counts": dict(self.counts.most_common()), "other": self.other, "distinct": len(self.counts)}


class Distribution:
    """Count, min, max, mean and median of numbers, plus a histogram for charts, in bounded memory.

    Exact while there are at most ``DISTINCT_VALUES`` distinct values; then each value falls in a
    log-spaced bucket (``LOG_STEPS`` per doubling), and the median is a bucket's middle (``exact``
    False). Values <= 0 share one bucket.

    >>> d = Distribution()
    >>> for v in (3, 1, 2, 2): d.add(v)
    >>> d.count, d.min, d.max, d.median(), d.exact
    (4, 1, 3, 2.0, True)
    """

    __slots__ = ("count", "min", "max", "total", "values", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.min = math.inf
        self.max = -math.inf
        self.total = 0.0
        self.values: Counter[float] | None = Counter()
        self.buckets: Counter[int] = Counter()

    @property
    def exact(self) -> bool:
        return self.values is not None

    def add(self, v: float, n: int = 1) -> None:
        """Count ``v`` (``n`` times)."""
        self.count += n
        self.total += v * n
        if v < self.min:
            self.min = v
        if v > self.max:
            self.max = v
        values = self.values
        if values is not None:
            values[v] += n
            if len(values) > DISTINCT_VALUES:
                self.values = None
                for value, k in values.items():
                    self.buckets[_bucket(value)] += k
        else:
            self.buckets[_bucket(v)] += n

    def _points(self) -> list[tuple[float, int]]:
        """(value, count) pairs in value order: the exact values, or each bucket's middle (clamped)."""
        if self.values is not None:
            return sorted(self.values.items())
        return [(min(max(_bucket_value(b), self.min), self.max), n) for b, n in sorted(self.buckets.items())]

    def median(self) -> float | None:
        return median_of_counts(self._points(), self.count)

    def histogram(self, bins: int = CHART_BINS) -> list[tuple[float, float, int]]:
        """``[(low, high, count)]``: equal-width bins from min to max; where the values are whole
        numbers spanning at most ``bins``, one bin per number (``low == high``).

        >>> d = Distribution()
        >>> for v in (1, 2, 2, 4): d.add(v)
        >>> d.histogram()
        [(1, 1, 1), (2, 2, 2), (3, 3, 0), (4, 4, 1)]
        """
        if not self.count:
            return []
        lo, hi = self.min, self.max
        if hi == lo:
            return [(lo, hi, self.count)]
        values = self.values
        if values is not None and hi - lo < bins and all(float(v).is_integer() for v in values):
            return [(v, v, values.get(v, 0)) for v in range(int(lo), int(hi) + 1)]
        width = (hi - lo) / bins
        counts = [0] * bins
        for value, n in self._points():
            counts[min(int((value - lo) / width), bins - 1)] += n
        return [(lo + i * width, lo + (i + 1) * width, c) for i, c in enumerate(counts)]

    def as_dict(self) -> dict[str, Any]:
        if not self.count:
            return {"count": 0}
        return {
            "count": self.count, "min": self.min, "median": self.median(), "max": self.max,
            "mean": self.total / self.count, "median_exact": self.exact,
            "histogram": [[lo, hi, n] for lo, hi, n in self.histogram()],
        }


def median_of_counts(points: Iterable[tuple[float, int]], n: int) -> float | None:
    """The median of ``n`` values given as ``(value, count)`` pairs in value order.

    >>> median_of_counts([(1, 1), (2, 2), (7, 1)], 4), median_of_counts([(1, 1), (2, 1)], 2), median_of_counts([], 0)
    (2.0, 1.5, None)
    """
    lo_rank, hi_rank = (n - 1) // 2, n // 2  # 0-based ranks of the middle one or two
    seen = 0
    lo: float | None = None
    for value, count in points:
        seen += count
        if lo is None and seen > lo_rank:
            lo = value
        if seen > hi_rank:
            return (lo + value) / 2 if lo is not None else float(value)
    return None  # no values (or counts that add up to less than n)


def _bucket(v: float) -> int:
    if v <= 0:
        return -(1 << 30)
    return math.floor(math.log2(v) * LOG_STEPS)


def _bucket_value(b: int) -> float:
    if b == -(1 << 30):
        return 0.0
    return float(2 ** ((b + 0.5) / LOG_STEPS))


Observer = Callable[[str, "str | None", str, str, str, Any], None]
"""Hears each problem as it is found: ``(kind, url, key, field, reason, data)`` (``data``: the
field's bytes where the caller has them, else None). The report keeps the samples it names."""


class Problems:
    """Counts and examples of one kind of problem (``name``, a key of ``PROBLEMS``)."""

    __slots__ = ("count", "examples", "name", "observer")

    def __init__(self, name: str = "", observer: Observer | None = None) -> None:
        self.count = 0
        self.examples: list[dict[str, Any]] = []
        self.name = name
        self.observer = observer

    def add(self, key: str, field: str, url: str | None, reason: str, data: Any = None) -> None:
        self.count += 1
        if len(self.examples) < EXAMPLES:
            self.examples.append({"key": key, "field": field, "url": url, "reason": reason,
                                  "command": tarfirst_command(url, key, field)})
        if self.observer is not None:
            self.observer(self.name, url, key, field, reason, data)


class FieldContent:
    """What one field holds: counts and distributions for each kind of content it has."""

    def __init__(self, field: str) -> None:
        ext = field.rsplit(".", 1)[-1].lower()
        # how its members are read: by their name where it says the kind, else by their first bytes
        self.route = ("label" if field in LABEL_FIELDS or ext in LABEL_FIELDS else "json" if ext in JSON_EXTENSIONS
                      else "text" if ext in TEXT_EXTENSIONS
                      else "media" if ext in AUDIO_EXTENSIONS or ext in VIDEO_EXTENSIONS else "sniff")
        self.claimed = CLAIMED_FORMATS.get(ext)  # the image format the name claims
        self.types: Tally = Tally(MAX_NAMES)  # content type -> members
        self.kinds: Counter[str] = Counter()  # image, audio, video, text, json, label, other
        # images
        self.formats: Tally = Tally()
        self.mismatched: Tally = Tally()  # "png named .jpg" -> count
        self.width = Distribution()
        self.height = Distribution()
        self.modes: Tally = Tally()
        self.channels: Tally = Tally()
        self.undecodable = 0
        self.damaged = 0  # header read, but cut short (end marker, chunk lengths)
        # audio and video
        self.duration = {"audio": Distribution(), "video": Distribution()}
        self.codecs = {"audio": Tally(), "video": Tally()}
        self.sample_rates: Tally = Tally()
        self.audio_channels: Tally = Tally()
        self.fps: Tally = Tally()
        self.resolutions: Tally = Tally()
        self.media_undecodable = 0
        self.media_unprobed = 0  # no PyAV
        # text
        self.length = Distribution()
        self.empty = 0
        self.non_utf8 = 0
        # JSON
        self.json_docs = 0  # parsed documents that are objects
        self.json_other: Tally = Tally()  # top-level types other than an object
        self.json_invalid = 0
        self.json_unparsed = 0  # over JSON_PARSE_LIMIT
        self.json_keys: Counter[str] = Counter()
        self.json_types: dict[str, Tally] = {}
        self.json_other_keys = 0
        self.json_missing_examples: dict[str, list[tuple[str, str | None]]] = {}  # key -> (sample, url)
        self.json_first_docs: list[tuple[str, str | None]] = []  # the first few documents: (sample, url)
        # labels
        self.labels: Tally = Tally(MAX_CLASSES)
        self.integer_labels = 0
        self.other_labels = 0  # not an integer (an empty label included)
        self.other_label_examples: list[tuple[str, str | None, str]] = []  # (sample, url, label)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"types": dict(self.types.counts.most_common()), "kinds": dict(self.kinds)}
        k = self.kinds
        if k["image"]:
            out["image"] = {
                "count": k["image"], "formats": self.formats.as_dict(), "extension_mismatch": dict(self.mismatched.counts),
                "width": self.width.as_dict(), "height": self.height.as_dict(), "modes": self.modes.as_dict(),
                "channels": self.channels.as_dict(), "undecodable": self.undecodable, "damaged": self.damaged,
            }
        for kind in ("audio", "video"):
            if k[kind]:
                seconds = self.duration[kind].total
                doc: dict[str, Any] = {"count": k[kind], "duration": self.duration[kind].as_dict(),
                                       "total_seconds": round(seconds, 3), "total_hours": round(seconds / 3600, 4),
                                       "codecs": self.codecs[kind].as_dict()}
                if kind == "audio":
                    doc.update(sample_rates=self.sample_rates.as_dict(), channels=self.audio_channels.as_dict())
                else:
                    doc.update(fps=self.fps.as_dict(), resolutions=self.resolutions.as_dict())
                out[kind] = doc
        if k["media"]:
            out["media"] = {"count": k["media"], "undecodable": self.media_undecodable, "unprobed": self.media_unprobed}
        if k["text"]:
            out["text"] = {"count": k["text"], "length": self.length.as_dict(), "empty": self.empty,
                           "non_utf8": self.non_utf8}
        if k["json"]:
            out["json"] = {
                "count": k["json"], "objects": self.json_docs, "invalid": self.json_invalid,
                "not_parsed_too_big": self.json_unparsed, "other_top_level": self.json_other.as_dict(),
                "keys": {name: {"count": n, "types": dict(self.json_types[name].counts.most_common())}
                         for name, n in self.json_keys.most_common()},
                "other_keys": self.json_other_keys,
            }
        if k["label"]:
            out["labels"] = {"count": k["label"], **self.labels.as_dict(), "integers": self.integer_labels}
        return out


class ContentStats:
    """Accumulates what every field holds (see the module docstring); ``add`` takes one member."""

    def __init__(self, probe_media: bool = True, decode: DecodeCheck | None = None,
                 observer: Observer | None = None) -> None:
        """``decode``: also decode every image, audio and video field (``tarproc.decode.check``);
        ``observer``: hears each problem as it is found (see ``Observer``)."""
        self.fields: dict[str, FieldContent] = {}
        self.observer = observer
        self.problems = {name: Problems(name, observer) for name in PROBLEMS}
        self.media_note: str | None = None  # why audio and video were not probed (no PyAV)
        self.decode = decode
        self._probe_media = probe_media
        self._probe: Any = None

    def add(self, key: str, field: str, data: bytes | bytearray | memoryview, url: str | None) -> None:
        fc = self.fields.get(field)
        if fc is None:
            fc = self.fields[field] = FieldContent(field)
        route = fc.route
        # a field named for its kind is read as that kind without sniffing (the reading says what it is)
        if route == "label":
            fc.kinds["label"] += 1
            self._label(fc, key, field, data, url)
            return
        if route == "json":
            fc.kinds["json"] += 1
            self._json(fc, key, field, data, url)
            return
        if route == "text":
            fc.kinds["text"] += 1
            self._text(fc, key, field, data, url)
            return
        claimed = fc.claimed
        if claimed is not None and data[:_MAGIC_LEN.get(claimed, 0)] == _MAGIC.get(claimed):
            sniffed = claimed  # what the name says, as its first bytes confirm
        else:
            sniffed = sniff_content(data)
        fc.types.add(sniffed)
        if claimed is not None or sniffed in IMAGE_TYPES:  # named an image: whatever it holds is one or broken
            fc.kinds["image"] += 1
            self._image(fc, key, field, data, url, sniffed, claimed)
            if self.decode is not None:
                self.decode.add(url, key, field, "image", data)
        elif route == "media" or sniffed in MEDIA_TYPES:
            fc.kinds["media"] += 1
            self._media(fc, key, field, data, url)
            if self.decode is not None:
                self.decode.add(url, key, field, "media", data)
        elif sniffed == "json":
            fc.kinds["json"] += 1
            self._json(fc, key, field, data, url)
        elif sniffed == "text":
            fc.kinds["text"] += 1
            self._text(fc, key, field, data, url)
        else:
            fc.kinds["other"] += 1

    # -- kinds --

    def _label(self, fc: FieldContent, key: str, field: str, data: Any, url: str | None) -> None:
        try:
            text = str(data, "utf-8").strip()
        except UnicodeDecodeError:
            fc.types.add("binary")
            fc.non_utf8 += 1
            self.problems["non_utf8_text"].add(key, field, url, "a label that is not UTF-8")
            return
        fc.types.add("text" if text else "empty")
        fc.labels.add(text[:64])
        if text.isascii() and (text.isdigit() or (text[:1] == "-" and text[1:].isdigit())):
            fc.integer_labels += 1
            return
        # a label that is not an integer: a problem where most labels are (said in finish)
        fc.other_labels += 1
        if len(fc.other_label_examples) < EXAMPLES:
            fc.other_label_examples.append((key, url, text[:64]))
        if self.observer is not None and fc.integer_labels:
            self.observer("non_integer_labels", url, key, field, f"label {text[:64]!r}", data)

    def _text(self, fc: FieldContent, key: str, field: str, data: Any, url: str | None) -> None:
        try:
            text = str(data, "utf-8")
        except UnicodeDecodeError as e:
            fc.types.add("binary")
            fc.non_utf8 += 1
            self.problems["non_utf8_text"].add(key, field, url, f"byte 0x{data[e.start]:02x} at {e.start} is not UTF-8")
            return
        fc.length.add(len(text))
        if fc.route == "text":
            fc.types.add("text" if text else "empty")
        if not text.strip():
            fc.empty += 1

    def _json(self, fc: FieldContent, key: str, field: str, data: Any, url: str | None) -> None:
        import json

        direct = fc.route == "json"
        if len(data) > JSON_PARSE_LIMIT:
            fc.json_unparsed += 1
            if direct:
                fc.types.add("json")
            return
        try:
            doc = json.loads(bytes(data))
        except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
            if direct:
                fc.types.add(sniff_type(data))
            fc.json_invalid += 1
            reason = "nested too deep to parse" if isinstance(e, RecursionError) else " ".join(str(e).split())[:120]
            self.problems["invalid_json"].add(key, field, url, reason)
            return
        if direct:
            fc.types.add("json")
        if not isinstance(doc, dict):
            fc.json_other.add(_JSON_TYPES.get(type(doc), "other"))
            return
        fc.json_docs += 1
        keys, types = fc.json_keys, fc.json_types
        first = fc.json_first_docs
        known = 0
        for name, value in doc.items():
            tally = types.get(name)
            if tally is None:
                if len(keys) >= MAX_JSON_KEYS or len(name) > MAX_KEY_CHARS:
                    fc.json_other_keys += 1
                    continue
                tally = types[name] = Tally()
                if first:  # a key new here: every document before lacks it
                    fc.json_missing_examples[name] = first[:EXAMPLES]
            known += 1
            keys[name] += 1
            tally.add(_JSON_TYPES.get(type(value), "other"))
        if len(first) < EXAMPLES:
            first.append((key, url))
        if known < len(keys):  # this document lacks a key others have: keep a few examples of that
            missing = fc.json_missing_examples
            for name in keys:
                if name not in doc:
                    examples = missing.setdefault(name, [])
                    if len(examples) < EXAMPLES:
                        examples.append((key, url))

    def _image(self, fc: FieldContent, key: str, field: str, data: Any, url: str | None, sniffed: str,
               claimed: str | None) -> None:
        if sniffed not in IMAGE_TYPES:
            fc.undecodable += 1
            self.problems["undecodable_images"].add(key, field, url, not_an_image(sniffed), data)
            return
        fc.formats.add(sniffed)
        if claimed is not None and claimed != sniffed and {claimed, sniffed} != {"heic", "heif"}:
            fc.mismatched.add(f"{sniffed} named .{field.rsplit('.', 1)[-1]}")
            self.problems["extension_mismatch"].add(key, field, url, f"{sniffed.upper()} data named .{field}", data)
        # Pillow reads a WebP's header only once the whole file is there: cut short is said first
        damage = field_damage(sniffed, data) if sniffed == "webp" else None
        header = self._read_header(data, sniffed) if damage is None else None
        if isinstance(header, str):
            fc.undecodable += 1
            self.problems["undecodable_images"].add(key, field, url, header, data)
            return
        if damage is None:
            damage = field_damage(sniffed, data)
        if damage is not None:
            fc.damaged += 1
            self.problems["damaged_images"].add(key, field, url, damage, data)
        if header is None:
            return
        width, height, mode, channels = header
        fc.width.add(width)
        fc.height.add(height)
        fc.modes.add(mode)
        fc.channels.add(str(channels))

    def _read_header(self, data: Any, sniffed: str) -> tuple[int, int, str, int] | str:
        """``(width, height, mode, channels)`` from the header, or why it cannot be read."""
        # JPEG and PNG headers are read here: no import at all (simplejpeg would bring numpy, ~0.1 s)
        if sniffed == "jpeg":
            found = jpeg_header(data)
            if found is not None:
                return found
        elif sniffed == "png":
            found = png_header(data)
            if found is not None:
                return found
        # anything else, or a header the above cannot read: Pillow (which says why it cannot)
        import io
        import warnings

        from PIL import Image

        from .imaging import PILLOW_MODULES

        try:
            with warnings.catch_warnings():
                # nothing from Pillow on stderr: a damaged header is counted and its example says
                # why (only Pillow's: the filters are the process's, and another thread's warnings,
                # a retried read, must still show)
                warnings.filterwarnings("ignore", module=PILLOW_MODULES)
                with Image.open(io.BytesIO(bytes(data))) as img:
                    width, height = img.size
                    return width, height, img.mode, len(img.getbands())
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
            reason = str(e)
            if reason.startswith("cannot identify image file"):  # it names the BytesIO object: not for people
                reason = f"not a {sniffed} header Pillow can read"
            return " ".join(f"header unreadable: {reason}".split())[:160]

    def _media(self, fc: FieldContent, key: str, field: str, data: Any, url: str | None) -> None:
        if not self._probe_media:
            fc.media_unprobed += 1
            return
        if self._probe is None:
            from .decode.media import probe

            self._probe = probe
        try:
            info = self._probe(data)
        except MissingDependencyError as e:
            fc.media_unprobed += 1
            self.media_note = str(e)
            return
        except TarprocError as e:  # MediaError: damaged, cut, or not media
            fc.media_undecodable += 1
            self.problems["undecodable_media"].add(key, field, url, str(e), data)
            return
        kind = info.kind if info.kind in ("audio", "video") else "audio"
        fc.kinds[kind] += 1
        fc.codecs[kind].add(info.codec or "?")
        if info.duration is not None and math.isfinite(info.duration) and info.duration >= 0:
            fc.duration[kind].add(round(info.duration, 3))
        if kind == "audio":
            if info.sample_rate:
                fc.sample_rates.add(str(info.sample_rate))
            if info.channels:
                fc.audio_channels.add(str(info.channels))
            odd = odd_audio(info.sample_rate, info.channels, info.duration)
            if odd is not None:
                self.problems["odd_audio"].add(key, field, url, odd, data)
        else:
            if info.fps and math.isfinite(info.fps):
                fc.fps.add(f"{info.fps:g}")
            if info.width and info.height:
                fc.resolutions.add(f"{info.width}x{info.height}")

    # -- results --

    def finish(self) -> None:
        """Wait for the decode checks; turn the JSON key counts into the missing-key problem (keys in
        over half the documents), and the label counts into the non-integer one (where most are)."""
        if self.decode is not None:
            self.decode.finish()
            decoded = self.problems["decode_failures"] = Problems("decode_failures")
            decoded.count = self.decode.failed
            decoded.examples = [{k: e[k] for k in ("key", "field", "url", "reason", "command")}
                                for e in self.decode.failures[:EXAMPLES]]
        labels = self.problems["non_integer_labels"] = Problems("non_integer_labels")
        for field, fc in sorted(self.fields.items()):
            if fc.other_labels and fc.integer_labels > fc.other_labels:
                labels.count += fc.other_labels
                for key, url, text in fc.other_label_examples:
                    if len(labels.examples) < EXAMPLES:
                        labels.examples.append({
                            "key": key, "field": field, "url": url,
                            "reason": f"label {text!r} among {plural(fc.integer_labels, 'integer label')}",
                            "command": tarfirst_command(url, key, field),
                        })
        problems = self.problems["json_missing_keys"] = Problems("json_missing_keys")
        for field, fc in sorted(self.fields.items()):
            for name, n in fc.json_keys.most_common():
                if 2 * n > fc.json_docs and n < fc.json_docs:
                    problems.count += fc.json_docs - n
                    for key, url in fc.json_missing_examples.get(name, []):
                        if len(problems.examples) < EXAMPLES:
                            problems.examples.append({
                                "key": key, "field": field, "url": url, "reason": f"no key {name!r}",
                                "command": tarfirst_command(url, key, field),
                            })

    def problems_dict(self) -> dict[str, dict[str, Any]]:
        return {name: {"count": p.count, "examples": p.examples} for name, p in self.problems.items() if p.count}

    def problem_lines(self) -> list[str]:
        """One line per kind of problem found, with its count (for ``--strict``)."""
        return [f"{PROBLEMS[name]}: {p.count}" for name, p in self.problems.items() if p.count]

    def close(self) -> None:
        """Stop the decode workers, if any (``finish`` does; this is for an error on the way)."""
        if self.decode is not None:
            self.decode.close()

    def as_dict(self) -> dict[str, Any]:
        return {
            "fields": {name: fc.as_dict() for name, fc in sorted(self.fields.items())},
            "problems": self.problems_dict(),
            "media_note": self.media_note,
            "decode": None if self.decode is None else self.decode.as_dict(),
        }


# ---------------------------------------------------------------------------------------------
# the text report


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _dist(name: str, d: dict[str, Any], unit: str = "") -> str:
    if not d.get("count"):
        return f"    {name:<12}-"
    median = _num(d["median"]) + ("" if d["median_exact"] else "~")
    return f"    {name:<12}min {_num(d['min'])}{unit}  median {median}{unit}  max {_num(d['max'])}{unit}"


def _tally(name: str, t: dict[str, Any], shown: int = 8, names: Sequence[str] | None = None) -> str:
    from .classnames import label_name

    counts = list(t["counts"].items())
    parts = [f"{escape_text(label_name(str(k), names))} ({v})" for k, v in counts[:shown]]
    rest = sum(v for _, v in counts[shown:]) + t["other"]
    if rest:
        parts.append(f"others ({rest})")
    return f"    {name:<12}{', '.join(parts) or '-'}"


def other_keys(n: int) -> str:
    """What a JSON field's ``other_keys`` count is, in words."""
    return (f"{n} uses of keys not itemised: past the first {MAX_JSON_KEYS} distinct keys, or names over "
            f"{MAX_KEY_CHARS} characters")


def classes(labels: dict[str, Any]) -> str:
    """``"3 classes"``, or where the tally is full ``"more than 10000 classes (N labels not itemised)"``."""
    if labels["other"]:
        return f"more than {labels['distinct']} classes ({plural(labels['other'], 'label')} not itemised)"
    return plural(labels["distinct"], "class", "classes")


def hours(seconds: float) -> str:
    """A total duration for people: ``"1.25 h (4500 s)"``, or seconds alone under a minute.

    >>> hours(4500), hours(12.5)
    ('1.25 h (4500 s)', '12.5 s')
    """
    if seconds < 60:
        return f"{seconds:g} s"
    return f"{seconds / 3600:.3g} h ({seconds:.0f} s)"


def format_content(doc: dict[str, Any], samples: int, names: Sequence[str] | None = None) -> list[str]:
    """The ``content`` part of the text report: what each field holds (``names``: class names for
    integer labels, ``tarproc.classnames``)."""
    if not doc["fields"]:
        return []
    lines = ["content"]
    for field, f in doc["fields"].items():
        name = escape_text(field)
        if "image" in f:
            im = f["image"]
            lines.append(f"  {name}: {plural(im['count'], 'image')}")
            lines.append(_tally("format", im["formats"]))
            lines += [_dist("width", im["width"], " px"), _dist("height", im["height"], " px")]
            lines += [_tally("mode", im["modes"]), _tally("channels", im["channels"])]
            for what, n in im["extension_mismatch"].items():
                lines.append(f"    {'misnamed':<12}{escape_text(what)}: {n}")
            if im["undecodable"]:
                lines.append(f"    {'unreadable':<12}{im['undecodable']} (header unreadable)")
            if im.get("damaged"):
                lines.append(f"    {'damaged':<12}{im['damaged']} (cut short: end marker or chunk lengths)")
        for kind in ("audio", "video"):
            if kind in f:
                m = f[kind]
                lines.append(f"  {name}: {m['count']} {kind}")
                lines += [_dist("duration", m["duration"], " s")]
                if m["duration"].get("count"):
                    lines.append(f"    {'total':<12}{hours(m['total_seconds'])}")
                lines.append(_tally("codec", m["codecs"]))
                if kind == "audio":
                    lines += [_tally("sample rate", m["sample_rates"]), _tally("channels", m["channels"])]
                else:
                    lines += [_tally("fps", m["fps"]), _tally("resolution", m["resolutions"])]
        if "media" in f and (f["media"]["undecodable"] or f["media"]["unprobed"]):
            m = f["media"]
            if m["undecodable"]:
                lines.append(f"  {name}: {m['undecodable']} audio/video unreadable")
            if m["unprobed"]:
                lines.append(f"  {name}: {m['unprobed']} audio/video not probed")
        if "text" in f:
            t = f["text"]
            lines.append(f"  {name}: {plural(t['count'], 'text')}")
            lines.append(_dist("length", t["length"], " chars"))
            extra = [f"empty {t['empty']}"] if t["empty"] else []
            extra += [f"not UTF-8 {t['non_utf8']}"] if t["non_utf8"] else []
            if extra:
                lines.append(f"    {'':<12}{', '.join(extra)}")
        if "json" in f:
            j = f["json"]
            objects = j["objects"]
            lines.append(f"  {name}: {plural(j['count'], 'JSON document')}, {plural(objects, 'object')}"
                         + (f", {j['invalid']} invalid" if j["invalid"] else ""))
            for key, info in list(j["keys"].items())[:30]:
                share = 100 * info["count"] / max(objects, 1)
                types = ", ".join(f"{t} {n}" for t, n in info["types"].items())
                lines.append(f"    {escape_text(key):<20}{info['count']:>8} {share:>6.1f}%  {types}")
            if len(j["keys"]) > 30:
                lines.append(f"    ... and {len(j['keys']) - 30} more keys (--json lists them)")
            if j["other_keys"]:
                lines.append(f"    ({other_keys(j['other_keys'])})")
        if "labels" in f:
            lb = f["labels"]
            lines.append(f"  {name}: {plural(lb['count'], 'label')}, {classes(lb)}")
            lines.append(_tally("most", lb, 10, names))
    if doc.get("media_note"):
        lines.append(f"  audio and video not probed: {doc['media_note']}")
    decode = doc.get("decode")
    if decode is not None:
        checked = decode["checked"]
        lines.append(f"  decoded: {plural(checked['image'], 'image')}, {checked['media']} audio/video; "
                     f"{decode['failed']} failed")
        if decode["unchecked"]:
            lines.append(f"  not decoded: {decode['unchecked']} audio/video ({decode['note']})")
    lines.append("")
    return lines


def media_hours(doc: dict[str, Any]) -> dict[str, float]:
    """Total hours of audio and of video over all fields of a content document (kinds with some)."""
    out: dict[str, float] = {}
    for f in doc["fields"].values():
        for kind in ("audio", "video"):
            if kind in f:
                out[kind] = out.get(kind, 0.0) + f[kind]["total_seconds"] / 3600
    return out


def format_problems(doc: dict[str, Any]) -> list[str]:
    """The content problems, each example with the command that pulls the sample out."""
    lines = []
    for name, p in doc["problems"].items():
        lines.append(f"{PROBLEMS[name]}: {p['count']}")
        examples = p["examples"]
        if name == "decode_failures" and doc.get("decode"):  # every one, up to a bound
            examples = doc["decode"]["failures"][:DECODE_SHOWN]
        for e in examples:
            lines.append(f"  {escape_text(e['key'])}.{escape_text(e['field'])} in {escape_text(str(e['url']))}: "
                         f"{escape_text(e['reason'])}")
            lines.append(f"    {escape_text(e['command'])}")
        if name == "decode_failures" and p["count"] > len(examples):
            lines.append(f"  ... and {p['count'] - len(examples)} more (--json lists up to {decode_listed()})")
    return lines


def decode_listed() -> int:
    """How many decode failures ``--json`` lists one by one."""
    from .decode.check import MAX_LISTED

    return MAX_LISTED


__all__ = ["MAX_AUDIO_CHANNELS", "MIN_AUDIO_RATE", "PROBLEMS", "ContentStats", "Distribution", "FieldContent", "Observer",
           "Tally", "classes", "field_damage", "hours", "jpeg_ends", "jpeg_header", "media_hours", "median_of_counts",
           "not_an_image", "odd_audio", "plural", "png_damage", "png_ends", "png_header", "riff_damage", "sniff_content",
           "tarfirst_command"]
