"""Look inside samples: short field previews, and a whole-stream summary that doubles as a lint.

Previews (``preview_field``, ``sample_record``, ``format_record``): text-like fields are decoded,
control characters escaped and cut to a width; JSON is shown compact; anything else is shown as its
size and the type sniffed from its magic bytes, never as raw bytes.

>>> format_record(sample_record({"__key__": "a/1", "__url__": "x.tar", "cls": b"3", "jpg": b"\\xff\\xd8\\xff\\xe0"}))
'__key__\\ta/1\\n__url__\\tx.tar\\ncls\\t1\\t3\\njpg\\t4\\t[jpeg]'

The summary (``Summary``, ``summarize``) works on tar members rather than grouped samples so that
it can *count* what normal reading rejects or hides: keys that reappear after other keys, fields
twice in one sample, names with no key, metadata members, and names whose dots split them in a
surprising place (``Track 2.0.mp3`` -> key ``Track 2``, field ``0.mp3``).

Memory does not grow with the stream: per field the summary keeps counts, min, max and, for the
median, a histogram of sizes while there are at most ``DISTINCT_SIZES`` of them (exact), then a
uniform reservoir sample of ``RESERVOIR`` sizes (exact up to that many samples, an estimate beyond,
marked ``~`` in the report); at most ``MAX_FIELDS`` field names are itemised; the keys of the
current shard are kept to spot reappearing keys, up to ``MAX_SHARD_KEYS`` per shard (the check
stops beyond that, and the report says so).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .content import IMAGE_TYPES, median_of_counts, plural, sniff_content, tarfirst_command
from .errors import DataWarning, OptionError, TarprocError, warner
from .samples import field_names, is_metadata_name
from .sniff import escape_surrogates, escape_text, sniff_type
from .tar import ReadPolicy, ReadStats, iter_keyed_members
from .tar.policy import TAR_FIELDS, policy_with_keywords

if TYPE_CHECKING:  # json and random are imported where used: tarshow starts without them
    import random

    from .content import Observer

DEFAULT_WIDTH = 60
RESERVOIR = 10_000  # sizes kept per field for its median once it has too many distinct sizes
DISTINCT_SIZES = 1024  # a field with at most this many distinct sizes gets an exact median
FLUSH_EVERY = 4096  # samples between folding the pending sizes into the per-field totals
MAX_FIELDS = 200
MAX_SHARD_KEYS = 2_000_000
EXAMPLES = 3
_JSON_PARSE_LIMIT = 1 << 16  # bigger JSON is previewed as text rather than parsed
TEXT_TYPES = ("text", "json", "empty")
ELLIPSIS = "…"


class LintError(TarprocError):
    """The summary found problems (``tarshow --summary --strict``); ``problems`` names each kind."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__(f"the summary found problems: {'; '.join(problems)}")


def json_text(doc: Any) -> str:
    """``doc`` as JSON text that is always valid UTF-8, whatever the names in it.

    Names are read as UTF-8 with Python's ``surrogateescape``: a byte that is not UTF-8 (a koi8-r
    or cp866 name) becomes the lone surrogate U+DC80..U+DCFF, which no UTF-8 encoder may write.
    Those (and any other lone surrogate) are written as JSON escapes, ``\\udcNN`` for byte 0xNN;
    everything else is written as itself. It is reversible: in Python,
    ``json.loads(line)[...].encode("utf-8", "surrogateescape")`` gives back the original bytes.

    >>> json_text({"name": "caf\\xe9 \\udce9"})
    '{"name": "café \\\\udce9"}'
    """
    import json

    # surrogates can only be inside JSON strings, where \uXXXX means the same code point
    return escape_surrogates(json.dumps(doc, ensure_ascii=False))


# ---------------------------------------------------------------------------------------------
# previews


def cut(text: str, width: int) -> tuple[str, bool]:
    """``text`` cut to ``width`` characters (the last one an ellipsis when cut), and whether it was."""
    if width <= 0 or len(text) <= width:
        return text, False
    return text[: max(width - 1, 0)] + ELLIPSIS, True


def preview_field(data: bytes | bytearray | memoryview, width: int = DEFAULT_WIDTH) -> dict[str, Any]:
    """``{"size", "type"}`` plus, for text-like data, ``"preview"`` (and ``"truncated"`` when cut).

    >>> preview_field(b'{ "a": [1, 2] }')
    {'size': 15, 'type': 'json', 'preview': '{"a":[1,2]}'}
    >>> preview_field(b"x" * 100, width=10)
    {'size': 100, 'type': 'text', 'preview': 'xxxxxxxxx…', 'truncated': True}
    >>> preview_field(bytes([0, 1, 2, 200]))
    {'size': 4, 'type': 'binary'}
    """
    kind = sniff_content(data)
    out: dict[str, Any] = {"size": len(data), "type": kind}
    if kind not in TEXT_TYPES:
        return out
    text = None
    if kind == "json" and len(data) <= _JSON_PARSE_LIMIT:
        import json

        try:
            text = json.dumps(json.loads(bytes(data)), separators=(",", ":"), ensure_ascii=False)
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            text = None
    if text is None:
        # only the start is needed: a few bytes per character shown, and a bit for escapes
        limit = width * 4 + 16 if width > 0 else len(data)
        head = bytes(data[:limit])
        text = head.decode("utf-8", errors="replace")
        if len(head) < len(data) and text.endswith("\ufffd"):
            text = text.rstrip("\ufffd") + ELLIPSIS  # a character cut by the byte limit
        if kind == "json":
            text = " ".join(text.split())
    shown, truncated = cut(escape_text(text), width)
    out["preview"] = shown
    if truncated:
        out["truncated"] = True
    return out


def pick_fields(sample: dict[str, Any], spec: list[tuple[str, list[str]]] | None) -> list[str]:
    """The fields of ``sample`` to show: all in sorted order, or the first present alternative of each
    entry of a ``parse_fields`` spec."""
    if spec is None:
        return field_names(sample)
    out = []
    for _name, alternatives in spec:
        for alt in alternatives:
            if alt in sample:
                out.append(alt)
                break
    return out


def sample_record(
    sample: dict[str, Any], spec: list[tuple[str, list[str]]] | None = None, width: int = DEFAULT_WIDTH
) -> dict[str, Any]:
    """One sample as a JSON-ready dict: ``{"__key__", "__url__", "fields": {name: preview_field(...)}}``."""
    fields = {name: preview_field(sample[name], width) for name in pick_fields(sample, spec)}
    return {"__key__": sample.get("__key__"), "__url__": sample.get("__url__"), "fields": fields}


def format_record(record: dict[str, Any]) -> str:
    """A ``sample_record`` as text lines: ``__key__ TAB key``, ``__url__``, then ``FIELD TAB SIZE TAB PREVIEW``
    (``[TYPE]`` for binary data)."""
    lines = [f"__key__\t{escape_text(str(record['__key__']))}"]
    if record.get("__url__") is not None:
        lines.append(f"__url__\t{escape_text(str(record['__url__']))}")
    for name, info in record["fields"].items():
        shown = info["preview"] if "preview" in info else f"[{info['type']}]"
        lines.append(f"{escape_text(name)}\t{info['size']}\t{shown}")
    return "\n".join(lines)


def image_fields(sample: dict[str, Any], spec: list[tuple[str, list[str]]] | None = None) -> list[str]:
    """Fields holding an image: those sniffed as one, or those a ``parse_fields`` spec names."""
    if spec is not None:
        return pick_fields(sample, spec)
    return [name for name in pick_fields(sample, None) if sniff_content(sample[name][:512]) in IMAGE_TYPES]


def label_of(sample: dict[str, Any], width: int = 30) -> str | None:
    """A short label for captions: ``cls``, ``label``, ``txt``, or a label-like key of ``json``."""
    for name in ("cls", "label", "class", "txt"):
        value = sample.get(name)
        if isinstance(value, (bytes, bytearray, memoryview)) and sniff_type(value) in ("text", "json"):
            return cut(escape_text(" ".join(bytes(value[:256]).decode("utf-8", "replace").split())), width)[0]
    data = sample.get("json")
    if isinstance(data, (bytes, bytearray, memoryview)) and len(data) <= _JSON_PARSE_LIMIT:
        import json

        try:
            doc = json.loads(bytes(data))
        except (ValueError, RecursionError):
            return None
        if isinstance(doc, dict):
            for name in ("label", "cls", "class", "caption", "text"):
                if name in doc and isinstance(doc[name], (str, int, float)):
                    return cut(escape_text(str(doc[name])), width)[0]
    return None


# ---------------------------------------------------------------------------------------------
# summary


class FieldStats:
    """Counts and sizes of one field: exact count/min/max/total, and for the median either an exact
    histogram (while the field has at most ``DISTINCT_SIZES`` distinct sizes) or a reservoir sample.

    Sizes are first appended to ``pending`` (the cheapest thing to do per member) and folded in by
    ``flush`` every ``FLUSH_EVERY`` samples and at the end.
    """

    __slots__ = ("samples", "duplicates", "bytes", "min", "max", "hist", "sizes", "pending", "missing_examples",
                 "missing_first", "next_replace", "weight")

    def __init__(self) -> None:
        self.samples = 0  # samples having this field (flushed)
        self.duplicates = 0  # further members of this field in a sample that has it already
        self.bytes = 0  # of all its members, duplicates included
        self.min = 1 << 62  # of the first member of each sample
        self.max = -1
        self.hist: Counter[int] | None = Counter()  # size -> samples, until there are too many sizes
        self.sizes: list[int] = []  # the reservoir, once hist is None
        self.pending: list[int] = []  # sizes not yet folded in
        self.missing_examples: list[str] = []
        # (url, key, a field it has) of the first sample lacking this field
        self.missing_first: tuple[str | None, str, str] | None = None
        self.next_replace = 0  # the sample number whose size goes into the full reservoir next
        self.weight = 1.0

    @property
    def median_exact(self) -> bool:
        return self.hist is not None or len(self.sizes) == self.samples

    def flush(self, rng: random.Random, k: int) -> None:
        """Fold ``pending`` into the totals and the histogram or the reservoir of ``k`` sizes.

        Reservoir sampling, algorithm L (Li 1994): rather than drawing a random number per size,
        draw which later size is the next to replace one, O(k log(n/k)) draws in all.
        """
        chunk = self.pending
        if not chunk:
            return
        self.pending = []
        n0 = self.samples
        n1 = self.samples = n0 + len(chunk)
        self.bytes += sum(chunk)
        self.min = min(self.min, min(chunk))
        self.max = max(self.max, max(chunk))
        if self.hist is not None:
            self.hist.update(chunk)
            if len(self.hist) <= DISTINCT_SIZES:
                return
            # too many distinct sizes: from now on a uniform sample of k of them
            hist, self.hist = self.hist, None
            self.sizes = rng.sample(list(hist), counts=list(hist.values()), k=min(k, n1))
            if n1 > k:
                # the k-th smallest of n1 uniform keys, as algorithm L would have it at this point
                self.weight = rng.betavariate(k, n1 - k + 1)
                self.next_replace = n1
                self._skip(rng)
            return
        sizes = self.sizes
        room = k - len(sizes)
        if room > 0:
            sizes.extend(chunk[:room])
            if len(sizes) < k:
                return
            self.next_replace = k
            self._plan(rng, k)
        while self.next_replace <= n1:
            sizes[rng.randrange(k)] = chunk[self.next_replace - n0 - 1]
            self._plan(rng, k)

    def _plan(self, rng: random.Random, k: int) -> None:
        self.weight *= math.exp(math.log(rng.random() or 1e-300) / k)
        self._skip(rng)

    def _skip(self, rng: random.Random) -> None:
        weight = min(max(self.weight, 1e-300), 1 - 1e-16)
        self.next_replace += int(math.log(rng.random() or 1e-300) / math.log1p(-weight)) + 1

    def median(self) -> float | None:
        if self.hist is not None:
            return median_of_counts(sorted(self.hist.items()), self.samples)
        if not self.sizes:
            return None
        s = sorted(self.sizes)
        mid = len(s) // 2
        return float(s[mid]) if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


# what makes a field surprising (the reason shown, and a test on the field name)
_DIGIT_START = re.compile(r"\d")
_VERSION_START = re.compile(r"v\d+[._-]")  # v2.jpg, v2_0001.jpg, v2-left.png


def surprising_reason(key: str, field: str) -> str | None:
    """Why ``KEY.FIELD`` is probably not split where its author meant, or None.

    >>> surprising_reason("Track 2", "0.mp3")
    'a number was split at its dot'
    >>> surprising_reason("model", "v2.jpg"), surprising_reason("bird", "v2_0001.jpg")
    ('a version-like part became part of the field', 'a version-like part became part of the field')
    >>> surprising_reason("img", "seg.png") is None
    True
    """
    if _DIGIT_START.match(field):
        base = key.rsplit("/", 1)[-1]
        if base[-1:].isdigit():
            return "a number was split at its dot"
        return "the field starts with a digit"
    if "." in field and _VERSION_START.match(field):
        return "a version-like part became part of the field"
    return None


class Summary:
    """Accumulates the summary of a stream of members; see the module docstring for its memory bounds.

    >>> s = Summary()
    >>> members = [("a", "cls", b"1", 0), ("a", "jpg", b"123", 1024), ("b", "cls", b"2", 2048),
    ...            ("b", "jpg", b"45", 3072), ("c", "cls", b"3", 4096)]
    >>> s.add_members(members, "x.tar")
    >>> s.finish()
    >>> s.samples, s.fields["cls"].samples, s.missing()
    (3, 3, {'jpg': {'count': 1, 'examples': ['c'], 'command': 'tarfirst x.tar --key c -f cls'}})
    """

    def __init__(self, seed: int = 0, content: bool = True, decode: int | None = None,
                 observer: Observer | None = None) -> None:
        """``content``: what the fields hold too (else byte sizes only); ``decode``: decode every
        image, audio and video field in that many processes (``tarproc.decode.check``; needs
        ``content``); ``observer``: hears each problem of a sample as it is found (the report's
        problem cards)."""
        import random

        from .content import ContentStats

        self.stats = ReadStats()
        self.samples = 0
        self.fields: dict[str, FieldStats] = {}
        self.other_fields = 0  # members of fields beyond MAX_FIELDS
        self.non_adjacent = 0
        self.non_adjacent_examples: list[dict[str, Any]] = []
        self.duplicates = 0
        self.duplicate_examples: list[dict[str, Any]] = []
        self.surprising: dict[str, tuple[str, list[str]]] = {}  # field -> (reason, example names)
        self.surprising_first: dict[str, tuple[str | None, str]] = {}  # field -> (url, key) of its first sample
        self.errors: list[str] = []
        self.key_check_stopped: list[str] = []  # shards with too many keys to check them all
        self.stopped_early = False
        self._rng = random.Random(seed)
        # what the fields hold (image sizes, text lengths, JSON keys...); None: byte sizes only
        checker = None
        if decode is not None:
            if not content:
                raise OptionError("decoding the fields needs the content statistics (content=True)")
            from .decode.check import DecodeCheck

            def failed(url: str | None, key: str, field: str, reason: str, data: bytes) -> None:
                if observer is not None:
                    observer("decode_failures", url, key, field, reason, data)

            checker = DecodeCheck(decode, failed)
        self.content: ContentStats | None = ContentStats(decode=checker, observer=observer) if content else None
        self.observer = observer
        self._want_examples: set[str] = set()  # fields still collecting examples of samples lacking them
        self._want_names: set[str] = set()  # surprising fields still collecting example names
        # the sample being read
        self._key = ""  # no sample: keys are never empty
        self._url: str | None = None  # the shard being read
        self._sample_fields: dict[str, int] = {}

    # -- reading --

    def _end_sample(self) -> None:
        if not self._key:
            return
        self.samples += 1
        if self._want_examples and len(self._sample_fields) < len(self.fields):
            self._note_missing(self._key, self._sample_fields)
        if self.observer is not None and len(self._sample_fields) < len(self.fields):
            self._observe_missing(self._key, self._sample_fields, self.samples)
        self._key = ""
        self._sample_fields = {}

    def _note_missing(self, key: str, have: dict[str, int]) -> None:
        for name in list(self._want_examples):
            if name not in have:
                fs = self.fields[name]
                if fs.missing_first is None and have:
                    fs.missing_first = (self._url, key, next(iter(have)))
                examples = fs.missing_examples
                examples.append(key)
                if len(examples) >= EXAMPLES:
                    self._want_examples.discard(name)

    def _observe_missing(self, key: str, have: dict[str, int], samples: int) -> None:
        """Tell the observer of the fields that most of the ``samples`` read so far have and this
        sample lacks (a problem if most samples have them at the end: the report checks then). Not
        every field seen so far: a rare field (a PNG among JPEGs) would make every other sample one
        to keep, and crowd the damaged ones out of the report's cards."""
        assert self.observer is not None
        for name, fs in self.fields.items():
            if name not in have and 2 * (fs.samples + len(fs.pending)) > samples:
                self.observer("missing", self._url, key, name, f"no {name} field", None)

    def _new_field(self, key: str, field: str) -> FieldStats | None:
        if len(self.fields) >= MAX_FIELDS:
            return None
        fs = self.fields[field] = FieldStats()
        self._want_examples.add(field)
        reason = surprising_reason(key, field)
        if reason is not None:
            self.surprising[field] = (reason, [])
            self._want_names.add(field)
        return fs

    def _note_name(self, key: str, field: str) -> None:
        self.surprising_first.setdefault(field, (self._url, key))
        examples = self.surprising[field][1]
        examples.append(f"{key}.{field}")
        if len(examples) >= EXAMPLES:
            self._want_names.discard(field)

    def _flush(self) -> None:
        for fs in self.fields.values():
            fs.flush(self._rng, RESERVOIR)

    def add_members(
        self, members: Iterable[tuple[str | None, str, bytes, int]], url: str | None, count: int | None = None
    ) -> None:
        """Add one shard's ``(key, field, data, offset)`` members (as ``iter_keyed_members`` yields them).

        With ``count``, stop before the sample that would make ``self.samples`` exceed it
        (``stopped_early`` is then set).
        """
        if count == 0:  # none asked for (-c 0): stopped before the first, even in an empty shard
            self.stopped_early = True
            return
        stats = self.stats
        fields = self.fields
        self._url = url
        want_examples = self._want_examples
        want_names = self._want_names
        seen_keys: set[str] = set()  # keys of this shard already finished
        key_offsets: dict[str, int] = {}
        check_keys = True
        # the sample being read and the sample count, in locals for speed; written back at the end
        cur_key = self._key
        have = self._sample_fields
        samples = self.samples
        limit = count if count is not None else -1
        content_add = self.content.add if self.content is not None else None
        observe = self.observer is not None
        try:
            for key, field, data, offset in members:
                if key != cur_key:
                    if key is None:
                        stats.no_key_count += 1
                        if len(stats.no_key) < EXAMPLES:
                            stats.no_key.append(field)
                        continue
                    if (key[0] == "_" or field[:2] == "__") and is_metadata_name(f"{key}.{field}"):
                        stats.metadata += 1
                        continue
                    if cur_key:  # the end of a sample
                        samples += 1
                        if want_examples and len(have) < len(fields):
                            self._note_missing(cur_key, have)
                        if observe and len(have) < len(fields):
                            self._observe_missing(cur_key, have, samples)
                        if not samples % FLUSH_EVERY:
                            self._flush()
                        cur_key, have = "", {}
                    if samples == limit:
                        self.stopped_early = True
                        return
                    if check_keys:
                        if key in seen_keys:
                            self.non_adjacent += 1
                            if len(self.non_adjacent_examples) < EXAMPLES:
                                self.non_adjacent_examples.append(
                                    {"key": key, "url": url, "offset": offset, "first_offset": key_offsets.get(key)}
                                )
                        elif len(seen_keys) < MAX_SHARD_KEYS:
                            seen_keys.add(key)
                            if len(key_offsets) < 1000:  # offsets only for examples, so a few suffice
                                key_offsets[key] = offset
                        else:
                            check_keys = False
                            self.key_check_stopped.append(str(url))
                    cur_key = key
                    have = {}
                elif field[:2] == "__":
                    stats.metadata += 1
                    continue
                if field in have:
                    self._duplicate(cur_key, field, url, offset, have[field], len(data))
                    continue
                have[field] = offset
                fs = fields.get(field)
                if fs is None:
                    fs = self._new_field(cur_key, field)
                    if fs is None:
                        self.other_fields += 1
                        continue
                if want_names and field in want_names:
                    self._note_name(cur_key, field)
                fs.pending.append(len(data))
                if content_add is not None:
                    content_add(cur_key, field, data, url)
        finally:
            # a damaged shard: what was read up to the damage still counts
            self.samples = samples
            self._key, self._sample_fields = cur_key, have
            self._end_sample()
            self._flush()

    def _duplicate(self, key: str, field: str, url: str | None, offset: int, first: int, size: int) -> None:
        self.duplicates += 1
        if len(self.duplicate_examples) < EXAMPLES:
            self.duplicate_examples.append(
                {"key": key, "field": field, "url": url, "offset": offset, "first_offset": first}
            )
        fs = self.fields.get(field)
        if fs is not None:
            fs.duplicates += 1
            fs.bytes += size

    def add_shard(
        self,
        url: str,
        *,
        policy: ReadPolicy = ReadPolicy(),
        count: int | None = None,
        wrap: Callable[[Iterator[Any]], Iterable[Any]] | None = None,
        **old: Any,
    ) -> None:
        """Read one shard (any URL ``open_source`` takes); a ``TarprocError`` is recorded and re-raised.
        ``policy`` as for ``iter_members`` (its keywords given directly still work, deprecated)."""
        policy = policy_with_keywords(policy, old, TAR_FIELDS, "Summary.add_shard")
        from .sources import open_source

        self.stats.shards += 1
        try:
            with open_source(url) as stream:
                members = iter_keyed_members(stream, url, policy=policy, stats=self.stats)
                self.add_members(wrap(members) if wrap else members, url, count)
        except TarprocError as e:
            self.stats.shards_failed += 1
            self.errors.append(str(e))
            raise

    def finish(self) -> None:
        self._end_sample()
        self._flush()
        if self.content is not None:
            self.content.finish()

    def close(self) -> None:
        """Stop the decode workers if any are left (after an error; ``finish`` stops them too)."""
        if self.content is not None:
            self.content.close()

    # -- results --

    def missing(self) -> dict[str, dict[str, Any]]:
        """Fields most samples have (over half) that some lack: ``{field: {"count", "examples"}}``."""
        out = {}
        for name, fs in sorted(self.fields.items()):
            if 2 * fs.samples > self.samples and fs.samples < self.samples:
                out[name] = {"count": self.samples - fs.samples, "examples": fs.missing_examples[:EXAMPLES],
                             "command": None if fs.missing_first is None else tarfirst_command(*fs.missing_first)}
        return out

    def rare_fields(self) -> dict[str, int]:
        """Fields found in under 10% of the samples (only said once there are 20 samples or more)."""
        if self.samples < 20:
            return {}
        return {name: fs.samples for name, fs in sorted(self.fields.items()) if 10 * fs.samples < self.samples}

    def as_dict(self) -> dict[str, Any]:
        """The summary as one JSON-ready document."""
        st = self.stats
        doc: dict[str, Any] = {
            "shards": st.shards,
            "shards_failed": st.shards_failed,
            "samples": self.samples,
            "members": st.members,
            "bytes": st.bytes,
            "fields": {
                name: {
                    "samples": fs.samples,
                    "members": fs.samples + fs.duplicates,
                    "bytes": fs.bytes,
                    "min": fs.min if fs.samples else None,
                    "median": fs.median(),
                    "max": fs.max if fs.samples else None,
                    "median_exact": fs.median_exact,
                }
                for name, fs in sorted(self.fields.items())
            },
            "other_fields_members": self.other_fields,
            "missing": self.missing(),
            "rare_fields": self.rare_fields(),
            "non_adjacent_keys": {"count": self.non_adjacent, "examples": self.non_adjacent_examples},
            "key_check_stopped": self.key_check_stopped,
            "duplicate_fields": {"count": self.duplicates, "examples": self.duplicate_examples},
            "names_without_key": {"count": st.no_key_count, "examples": st.no_key[:EXAMPLES]},
            "metadata_members": st.metadata,
            "skipped_entries": dict(sorted(st.skipped_entries.items())),
            "surprising_names": sorted(
                (
                    {"field": field, "reason": reason, "count": self.fields[field].samples, "examples": examples,
                     "command": tarfirst_command(*self.surprising_first[field], field)
                     if field in self.surprising_first else None}
                    for field, (reason, examples) in self.surprising.items()
                ),
                key=lambda x: (-x["count"], x["field"]),
            ),
            "errors": list(self.errors),
            "stopped_early": self.stopped_early,
            "content": None if self.content is None else self.content.as_dict(),
        }
        doc["problems"] = _problems(doc)
        return doc

    def problems(self) -> list[str]:
        """One line per kind of problem the report lists (empty when it says "no problems found")."""
        return self.as_dict()["problems"]

    def format_text(self, d: dict[str, Any] | None = None, names: Sequence[str] | None = None) -> str:
        """A readable report (of ``d``, this summary's ``as_dict()``, when the caller has it;
        ``names``: class names for integer labels, ``tarproc.classnames``)."""
        d = self.as_dict() if d is None else d
        lines = [
            f"shards      {d['shards']}" + (f" ({d['shards_failed']} failed)" if d["shards_failed"] else ""),
            f"samples     {d['samples']}" + (" (stopped at -c)" if self.stopped_early else ""),
            f"members     {d['members']}",
            f"bytes       {d['bytes']}",
            "",
            "fields      samples       %        min     median        max",
        ]
        n = max(d["samples"], 1)
        for name, f in d["fields"].items():
            median = "-" if f["median"] is None else f"{f['median']:g}" + ("" if f["median_exact"] else "~")
            lines.append(
                f"  {escape_text(name):<10}{f['samples']:>7} {100 * f['samples'] / n:>6.1f}%"
                f" {f['min']:>10} {median:>10} {f['max']:>10}"
            )
        if d["other_fields_members"]:
            lines.append(f"  (more than {MAX_FIELDS} fields: {d['other_fields_members']} members not itemised)")
        lines.append("")
        if d.get("content"):
            from .content import format_content

            lines.extend(format_content(d["content"], d["samples"], names))

        def examples(items: Iterable[Any]) -> str:
            shown = ", ".join(escape_text(repr(x)) if isinstance(x, str) else x for x in items)
            return f" (e.g. {shown})" if shown else ""

        def problem(heading: str, details: Iterable[str] = ()) -> None:
            lines.append(heading)
            lines.extend(details)

        def pull(command: str | None) -> list[str]:
            """The tarfirst command that pulls the first example out, under its line."""
            return [] if command is None else [f"    {escape_text(command)}"]

        if no_samples(d):
            problem(f"{NO_SAMPLES} (an empty tar, or members that are no sample: metadata, names without a key)")
        missing = d["missing"]
        if missing:
            problem("samples missing a field most samples have:", (
                line for name, m in missing.items()
                for line in [f"  {escape_text(name)}: {plural(m['count'], 'sample')}{examples(m['examples'])}",
                             *pull(m["command"])]
            ))
        if d["rare_fields"]:
            problem("fields in under 10% of samples:", (
                f"  {escape_text(name)}: {plural(c, 'sample')}" for name, c in d["rare_fields"].items()
            ))
        na = d["non_adjacent_keys"]
        if na["count"]:
            problem(f"keys that reappear after other keys (tar made without --sort=name?): {na['count']}", (
                f"  {escape_text(repr(e['key']))} in {escape_text(str(e['url']))} at byte {e['offset']}"
                + ("" if e["first_offset"] is None else f", first at byte {e['first_offset']}")
                for e in na["examples"]
            ))
        for url in d["key_check_stopped"]:
            lines.append(f"reappearing keys: not checked past {MAX_SHARD_KEYS} keys in {escape_text(url)}")
        dup = d["duplicate_fields"]
        if dup["count"]:
            problem(f"fields twice in one sample: {dup['count']}", (
                f"  {escape_text(repr(e['key']))} field {escape_text(repr(e['field']))} in "
                f"{escape_text(str(e['url']))} at bytes {e['first_offset']} and {e['offset']}"
                for e in dup["examples"]
            ))
        nk = d["names_without_key"]
        if nk["count"]:
            problem(f"names without a key (no dot in the basename, or a leading dot): {nk['count']}"
                    f"{examples(nk['examples'])}")
        surprising = [s for s in d["surprising_names"] if s["count"]]
        if surprising:
            problem("dotted names that split surprisingly (key = basename up to its first dot):", (
                line for s in surprising
                for line in [f"  field {escape_text(repr(s['field']))}: {plural(s['count'], 'sample')}, "
                             f"{s['reason']}{examples(s['examples'])}", *pull(s["command"])]
            ))
        other = []
        if d["metadata_members"]:
            other.append(f"metadata members skipped: {d['metadata_members']}")
        if d["skipped_entries"]:
            other.append("entries that are not files: " + ", ".join(f"{k} {v}" for k, v in d["skipped_entries"].items()))
        lines.extend(other)
        for error in d["errors"]:
            problem(f"damaged or unreadable: {escape_text(error)}")
        if d.get("content"):
            from .content import format_problems

            lines.extend(format_problems(d["content"]))
        if not d["problems"]:  # the same list --strict goes by
            lines.append("no problems found")
        return "\n".join(lines)


NO_SAMPLES = "no samples: the input holds no sample"


def no_samples(d: dict[str, Any]) -> bool:
    """Whether a summary document read no sample at all (not for ``-c 0``: that asks for none)."""
    return not d["samples"] and not d["stopped_early"] and not d["errors"]  # a shard that failed says why itself


def _problems(d: dict[str, Any]) -> list[str]:
    """The kinds of problem a summary document lists, one line each with its count (``--strict``)."""

    def some(items: dict[str, int]) -> str:
        shown = [f"{name}: {n}" for name, n in list(items.items())[:EXAMPLES]]
        more = len(items) - len(shown)
        return ", ".join(shown) + (f" and {more} more" if more else "")

    out = []
    if no_samples(d):
        out.append(NO_SAMPLES)
    if d["missing"]:
        out.append(f"samples missing a field most samples have ({some({k: m['count'] for k, m in d['missing'].items()})})")
    if d["rare_fields"]:
        out.append(f"fields in under 10% of samples ({some(d['rare_fields'])})")
    if d["non_adjacent_keys"]["count"]:
        out.append(f"keys that reappear after other keys: {d['non_adjacent_keys']['count']}")
    if d["duplicate_fields"]["count"]:
        out.append(f"fields twice in one sample: {d['duplicate_fields']['count']}")
    if d["names_without_key"]["count"]:
        out.append(f"names without a key: {d['names_without_key']['count']}")
    surprising = sum(s["count"] for s in d["surprising_names"])
    if surprising:
        out.append(f"dotted names that split surprisingly: {surprising}")
    if d["errors"]:
        out.append(f"damaged or unreadable shards: {len(d['errors'])}")
    if d.get("content"):
        from .content import PROBLEMS

        out.extend(f"{PROBLEMS[name]}: {p['count']}" for name, p in d["content"]["problems"].items())
    return out


def summarize(
    urls: Iterable[str],
    *,
    policy: ReadPolicy = ReadPolicy(),
    count: int | None = None,
    warn: Callable[[str], None] | None = None,
    summary: Summary | None = None,
    wrap: Callable[[Iterator[Any]], Iterable[Any]] | None = None,
    **old: Any,
) -> Summary:
    """Summarize the members of all ``urls``, read as ``policy`` says. With its ``on_error="fail"`` a
    damaged shard raises (the partial summary is in ``summary`` if one was passed); ``"skip-shard"``
    records it, warns (``warn``, a callback; default a ``DataWarning``) and goes on. The policy's
    keywords given directly still work, deprecated."""
    policy = policy_with_keywords(policy, old, (*TAR_FIELDS, "on_error"), "summarize")
    summary = summary if summary is not None else Summary()
    for url in urls:
        try:
            summary.add_shard(url, policy=policy, count=count, wrap=wrap)
        except TarprocError as e:
            if policy.on_error == "fail":
                summary.finish()
                raise
            warner(warn, DataWarning)(f"{e}; skipping the rest of this shard")
        if summary.stopped_early:
            break
    summary.finish()
    return summary


__all__ = [
    "DEFAULT_WIDTH",
    "IMAGE_TYPES",
    "FieldStats",
    "Summary",
    "cut",
    "escape_text",
    "format_record",
    "image_fields",
    "label_of",
    "pick_fields",
    "preview_field",
    "sample_record",
    "summarize",
    "surprising_reason",
]
