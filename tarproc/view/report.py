"""``tarshow --report``: one self-contained HTML file about a dataset, to open from disk or mail.

One pass over the shards feeds the summary (``tarproc.show.Summary``, content statistics included)
and a seeded reservoir of ``sample`` samples (``SampleReservoir``: algorithm L, so memory holds only
the chosen samples). The page then has the summary as tables with small inline SVG charts drawn here
(histograms of sizes, dimensions, durations, lengths; bars of classes), the problems with the
``tarfirst`` command for each example, and the chosen samples as cards: thumbnails and video poster
frames as JPEG ``data:`` URIs, ``<audio controls>`` with the audio as a ``data:`` URI, text, labels
and JSON. Nothing refers to another host: no external CSS, script, font or image. Everything from
the data (keys, field names, text, JSON, URLs) is HTML-escaped.

The file is written atomically (``open_sink``: a temporary file renamed at the end), so a failure
leaves nothing under the final name.

    from tarproc.view.report import write_report
    info = write_report(["train-0000.tar"], "report.html", sample=24, seed=1)
    info.samples, info.cards  # (10000, 24)
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import random
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..classnames import label_name
from ..content import (
    IMAGE_TYPES,
    PROBLEMS,
    Distribution,
    classes,
    hours,
    media_hours,
    other_keys,
    plural,
    sniff_content,
)
from ..errors import DataWarning, MissingDependencyError, OptionError, TarprocError, warner
from ..imaging import PILLOW_MODULES
from ..samples import is_metadata_name
from ..show import FieldStats, Summary
from ..sinks import open_sink

DEFAULT_SAMPLE = 48
THUMB = 192  # px, the longer side of a thumbnail or poster frame
THUMB_QUALITY = 80
MAX_AUDIO_EMBED = 8 << 20  # bigger audio fields are described, not embedded
MAX_KEEP = 64 << 20  # a chosen sample's field bigger than this is not kept in memory: its card says so
MAX_KEPT_TOTAL = 512 << 20  # nor one that would take the fields of all the chosen samples past this
MAX_TEXT = 2000  # characters of a text field shown on a card
MAX_JSON = 4000
MAX_CHART_BARS = 20
MAX_PROBLEM_CARDS = 24  # cards of samples with a problem; the rest are counted
MAX_MORE = 100_000  # samples past the cards whose problems are kept to confirm them; the rest are counted as found
MAX_DECODE_LISTED = 200  # decode failures listed on the page (tarshow --summary --decode --json lists more)
RECENT_SAMPLES = 64  # samples kept after they end: some problems are known only then (a missing field)
RECENT_BYTES = 64 << 20


@dataclass
class ReportInfo:
    """What ``write_report`` wrote: the path, the samples read, the cards shown and the file's size."""

    path: str
    samples: int
    cards: int
    bytes: int
    problems: list[str]
    decode_note: str | None = None  # why some fields were not decoded (--decode without PyAV)
    problem_cards: int = 0


# ---------------------------------------------------------------------------------------------
# the seeded sample


class TooBig(int):
    """Stands for a field of a chosen sample too big to keep (``MAX_KEEP``, ``MAX_KEPT_TOTAL``); its
    value is the size."""


class SampleReservoir:
    """A uniform random sample of ``k`` samples from a stream of members, in memory for ``k`` only.

    Algorithm L (Li 1994): draw which later sample replaces one next, so that the samples not
    chosen are never assembled. The same ``seed`` over the same data chooses the same samples.
    A field over ``MAX_KEEP`` bytes, or one that would take the fields kept past ``MAX_KEPT_TOTAL``
    (``kept``), is kept as its size only (``TooBig``).

    >>> r = SampleReservoir(2, seed=1)
    >>> members = [(f"k{i}", "txt", b"x", 0) for i in range(10)]
    >>> _ = list(r.watch(members, "x.tar"))
    >>> [s["__key__"] for s in r.samples()]
    ['k2', 'k6']
    """

    def __init__(self, k: int, seed: int = 0, limit: int | None = None) -> None:
        self.k = k
        self.rng = random.Random(seed)
        self.seen = 0  # samples started
        self.limit = limit  # samples beyond this many (-c) are not chosen
        self.chosen: list[tuple[int, dict[str, Any]]] = []
        self.kept = 0  # bytes of the fields of the chosen samples
        self._next = k - 1  # the index of the next sample to replace a chosen one, once k are chosen
        self._weight = 1.0
        if k:
            self._weight = math.exp(math.log(self.rng.random() or 1e-300) / k)
            self._skip()

    def _skip(self) -> None:
        weight = min(max(self._weight, 1e-300), 1 - 1e-16)
        self._next += int(math.log(self.rng.random() or 1e-300) / math.log1p(-weight)) + 1

    def _start(self, index: int, key: str, url: str | None) -> dict[str, Any] | None:
        if not self.k or (self.limit is not None and index >= self.limit):
            return None
        sample: dict[str, Any] = {"__key__": key, "__url__": url}
        if index < self.k:
            self.chosen.append((index, sample))
            return sample
        if index == self._next:
            slot = self.rng.randrange(self.k)
            self.kept -= sum(len(v) for v in self.chosen[slot][1].values() if type(v) is bytes)
            self.chosen[slot] = (index, sample)
            self._weight *= math.exp(math.log(self.rng.random() or 1e-300) / self.k)
            self._skip()
            return sample
        return None

    def watch(self, members: Iterable[tuple[str | None, str, Any, int]], url: str | None) -> Iterator[Any]:
        """Pass ``(key, field, data, offset)`` members through, keeping those of the chosen samples."""
        key_now: str | None = None
        current: dict[str, Any] | None = None
        for member in members:
            key, field = member[0], member[1]
            # samples as ``Summary.add_members`` counts them: no name without a key, no metadata
            if key is not None and field[:2] != "__" and not (key[0] == "_" and is_metadata_name(f"{key}.{field}")):
                if key != key_now:
                    key_now = key
                    current = self._start(self.seen, key, url)
                    self.seen += 1
                if current is not None and field not in current:
                    size = len(member[2])
                    if size <= MAX_KEEP and self.kept + size <= MAX_KEPT_TOTAL:
                        current[field] = bytes(member[2])
                        self.kept += size
                    else:
                        current[field] = TooBig(size)
            yield member

    def samples(self) -> list[dict[str, Any]]:
        """The chosen samples in the order they came."""
        return [s for _, s in sorted(self.chosen, key=lambda x: x[0])]


class ProblemSamples:
    """The samples that have a problem, kept for their cards: the summary tells ``note`` of each
    problem as it finds it (``tarproc.content.Observer``), and the sample is kept if it is the one
    being read or one of the ``RECENT_SAMPLES`` before it (a decode verdict can come later: then
    the card has the failing field alone). At most ``2 * limit`` are kept, some of which the end
    of the pass may not confirm (a label that is not an integer where most are not either)."""

    def __init__(self, limit: int = MAX_PROBLEM_CARDS) -> None:
        self.limit = limit
        self.kept: dict[tuple[str | None, str], tuple[dict[str, Any], list[tuple[str, str, str]]]] = {}
        # samples with problems past the ones kept: their problems, confirmed at the end and counted
        self.more: dict[tuple[str | None, str], list[tuple[str, str]]] = {}
        self.more_unconfirmed = 0  # past MAX_MORE of those: counted as they come
        self._missing_only = False  # whether a sample may be kept for a missing field alone
        self._current: dict[str, Any] | None = None
        self._recent: deque[dict[str, Any]] = deque()
        self._recent_bytes = 0
        self._by_key: dict[tuple[str | None, str], dict[str, Any]] = {}

    def watch(self, members: Iterable[tuple[str | None, str, Any, int]], url: str | None) -> Iterator[Any]:
        """Pass ``(key, field, data, offset)`` members through, holding the recent samples' fields."""
        for member in members:
            key, field = member[0], member[1]
            if key is not None and field[:2] != "__" and not (key[0] == "_" and is_metadata_name(f"{key}.{field}")):
                current = self._current
                if current is None or key != current["__key__"] or url != current["__url__"]:
                    current = self._start(key, url)
                if field not in current:
                    data = member[2]
                    size = len(data)
                    current[field] = (data if type(data) is bytes else bytes(data)) if size <= MAX_KEEP else TooBig(size)
                    current["__bytes__"] += size if size <= MAX_KEEP else 0
            yield member

    def _start(self, key: str, url: str | None) -> dict[str, Any]:
        done = self._current
        if done is not None:
            self._recent.append(done)
            self._recent_bytes += done["__bytes__"]
            while self._recent and (len(self._recent) > RECENT_SAMPLES or self._recent_bytes > RECENT_BYTES):
                old = self._recent.popleft()
                self._recent_bytes -= old["__bytes__"]
                self._by_key.pop((old["__url__"], old["__key__"]), None)
        sample: dict[str, Any] = {"__key__": key, "__url__": url, "__bytes__": 0}
        self._current = self._by_key[(url, key)] = sample
        return sample

    def note(self, kind: str, url: str | None, key: str, field: str, reason: str, data: Any) -> None:
        """A problem of kind ``kind`` (a key of ``PROBLEMS``, or ``missing``) in ``key.field``."""
        entry = self.kept.get((url, key))
        if entry is None:
            if (url, key) in self.more or (len(self.kept) >= 2 * self.limit
                                           and not (kind != "missing" and self._make_room())):
                self._count_more(url, key, [(kind, field)])
                return
            sample = self._by_key.get((url, key))
            if sample is None:  # gone by now: the failing field alone
                sample = {"__key__": key, "__url__": url, "__bytes__": 0}
                if data is not None and len(data) <= MAX_KEEP:
                    sample[field] = bytes(data)
            entry = self.kept[(url, key)] = (sample, [])
            self._missing_only = self._missing_only or kind == "missing"
        entry[1].append((kind, field, reason))

    def _make_room(self) -> bool:
        """Give the card of a sample kept for a missing field alone to a damaged one (the missing
        field's sample is counted instead); False when every sample kept has damage."""
        if self._missing_only:
            for where, (_, problems) in self.kept.items():
                if all(kind == "missing" for kind, _, _ in problems):
                    del self.kept[where]
                    self._count_more(*where, [(kind, field) for kind, field, _ in problems])
                    return True
            self._missing_only = False
        return False

    def _count_more(self, url: str | None, key: str, problems: list[tuple[str, str]]) -> None:
        more = self.more.get((url, key))
        if more is not None:
            more.extend(problems)
        elif len(self.more) < MAX_MORE:
            self.more[(url, key)] = problems
        else:
            self.more_unconfirmed += 1

    def cards(self, d: dict[str, Any]) -> tuple[list[tuple[dict[str, Any], list[tuple[str, str, str]]]], int]:
        """The samples whose problems the summary document ``d`` confirms, at most ``limit``, and how
        many more samples have problems. Damage comes before a missing field: a field that a tenth
        of the samples lack would otherwise take every card."""
        content = (d.get("content") or {}).get("problems", {})

        def confirmed(kind: str, field: str) -> bool:
            return field in d["missing"] if kind == "missing" else kind in content

        chosen = []
        for sample, problems in self.kept.values():
            problems = [p for p in problems if confirmed(p[0], p[1])]
            if problems:
                chosen.append((sample, problems))
        chosen.sort(key=lambda c: all(kind == "missing" for kind, _, _ in c[1]))  # stable: in reading order
        more = sum(any(confirmed(kind, field) for kind, field in problems) for problems in self.more.values())
        return chosen[:self.limit], len(chosen[self.limit:]) + more + self.more_unconfirmed


# ---------------------------------------------------------------------------------------------
# charts: small inline SVG, drawn here


def _esc(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v:.3g}"
    return f"{v:.0f}" if float(v).is_integer() or abs(v) >= 100 else f"{v:.3g}"


def svg_histogram(bins: list[tuple[float, float, int]], caption: str, unit: str = "") -> str:
    """A bar chart of ``(low, high, count)`` bins, with the range under it; each bar says its bin."""
    if not bins:
        return ""
    w, h, pad = 240, 72, 14
    top = max(n for _, _, n in bins) or 1
    bw = w / len(bins)
    bars = []
    for i, (lo, hi, n) in enumerate(bins):
        bh = (h - pad) * n / top
        label = f"{_fmt(lo)}–{_fmt(hi)}{unit}: {n}" if hi != lo else f"{_fmt(lo)}{unit}: {n}"
        bars.append(f'<rect x="{i * bw + 1:.1f}" y="{h - pad - bh:.1f}" width="{max(bw - 2, 1):.1f}" '
                    f'height="{bh:.1f}"><title>{_esc(label)}</title></rect>')
    lo, hi = bins[0][0], bins[-1][1]
    return (
        f'<figure class="chart"><svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
        f'aria-label="{_esc(caption)}">{"".join(bars)}'
        f'<text x="0" y="{h - 2}">{_esc(_fmt(lo) + unit)}</text>'
        f'<text x="{w}" y="{h - 2}" text-anchor="end">{_esc(_fmt(hi) + unit)}</text></svg>'
        f"<figcaption>{_esc(caption)}</figcaption></figure>"
    )


def svg_bars(items: list[tuple[str, int]], caption: str, total: int | None = None) -> str:
    """Horizontal bars for named counts (classes, formats), the biggest first."""
    if not items:
        return ""
    items = items[:MAX_CHART_BARS]
    row, w, label_w = 14, 300, 110
    h = row * len(items)
    top = max(n for _, n in items) or 1
    parts = []
    for i, (name, n) in enumerate(items):
        bw = (w - label_w - 40) * n / top
        share = f" ({100 * n / total:.1f}%)" if total else ""
        shown = name if len(name) <= 16 else name[:15] + "…"
        parts.append(
            f'<text x="{label_w - 4}" y="{i * row + 12}" text-anchor="end">{_esc(shown)}</text>'
            f'<rect x="{label_w}" y="{i * row + 2}" width="{max(bw, 1):.1f}" height="{row - 4}">'
            f"<title>{_esc(name)}: {n}{share}</title></rect>"
            f'<text x="{label_w + bw + 4:.1f}" y="{i * row + 12}">{n}</text>'
        )
    return (f'<figure class="chart"><svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" '
            f'aria-label="{_esc(caption)}">{"".join(parts)}</svg><figcaption>{_esc(caption)}</figcaption></figure>')


def size_distribution(fs: FieldStats) -> Distribution:
    """A field's member sizes as a ``Distribution`` (from the summary's histogram or its reservoir)."""
    d = Distribution()
    if fs.hist is not None:
        for size, n in sorted(fs.hist.items()):
            d.add(size, n)
    elif fs.sizes:
        # the reservoir stands for all the samples: each of its sizes for about samples/len of them
        # (whole counts that add up to the samples), the chart from the field's own min to max
        n = len(fs.sizes)
        for i, size in enumerate(sorted(fs.sizes)):
            weight = (i + 1) * fs.samples // n - i * fs.samples // n
            if weight:
                d.add(size, weight)
        d.min, d.max = min(d.min, fs.min), max(d.max, fs.max)
    return d


def _hist(d: dict[str, Any] | None, caption: str, unit: str = "") -> str:
    if not d or not d.get("count"):
        return ""
    return svg_histogram([(lo, hi, n) for lo, hi, n in d["histogram"]], caption, unit)


# ---------------------------------------------------------------------------------------------
# the page

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.2em;margin:1.4em 0 .5em;border-bottom:1px solid #ccc}
h3{font-size:1em;margin:1em 0 .3em}a{color:#2a5d9f}
table{border-collapse:collapse;margin:.3em 0}td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #e4e4e4}
td:first-child,th:first-child{text-align:left}code,pre{font:12px ui-monospace,monospace}
pre{white-space:pre-wrap;word-break:break-word;margin:.2em 0;background:#f0f0f0;padding:4px}
.charts,.block{display:flex;flex-wrap:wrap;gap:12px;align-items:flex-start}.block p{margin:.3em 0}.chart{margin:0}.chart svg{background:#fff;border:1px solid #ddd}
.chart rect{fill:#4a7fb5}.chart text{font:10px sans-serif;fill:#444}figcaption{font-size:12px;color:#555}
.problem{color:#a02020}.ok{color:#207020}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(230px,1fr));gap:10px}
.card{background:#fff;border:1px solid #ddd;border-radius:4px;padding:8px;overflow:hidden}
.card .key{font:12px ui-monospace,monospace;word-break:break-all;color:#333}
.card img{display:block;max-width:100%;height:auto;margin:4px 0;background:#eee}
.card audio{width:100%}.card p{overflow-wrap:anywhere;margin:.2em 0}.field{margin-top:4px}.name{font-size:11px;color:#777}
.label{display:inline-block;background:#e8eef6;border-radius:3px;padding:0 6px}
.note{color:#777;font-size:12px}
"""


class _Page:
    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, *parts: str) -> None:
        self.parts.extend(parts)

    def table(self, header: list[str], rows: Iterable[list[Any]]) -> None:
        self.add("<table><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in header) + "</tr>")
        for row in rows:
            self.add("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>")
        self.add("</table>")


def _overview(page: _Page, d: dict[str, Any], urls: list[str]) -> None:
    problems = (f'<a class="problem" href="#problems">{_esc(plural(len(d["problems"]), "kind"))} of problem</a>'
                if d["problems"] else '<span class="ok">no problems found</span>')
    durations = media_hours(d["content"]) if d.get("content") else {}
    media = "".join(f" · {_esc(hours(h * 3600))} of {kind}" for kind, h in durations.items())
    page.add(f"<p>{_esc(plural(d['samples'], 'sample'))} in {_esc(plural(d['shards'], 'shard'))} · "
             f"{_esc(plural(d['members'], 'member'))} · {_esc(_size(d['bytes']))}{media} · {problems}"
             + (" (stopped at -c)" if d["stopped_early"] else "") + "</p>")
    shown = urls[:20]
    page.add("<p class=note>inputs: " + ", ".join(f"<code>{_esc(u)}</code>" for u in shown)
             + (f" and {len(urls) - len(shown)} more" if len(urls) > len(shown) else "")
             + ' · <a href="#problems">problems</a> · <a href="#samples">samples</a> · <a href="#fields">fields</a>'
             ' · <a href="#content">content</a></p>')


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return plural(n, "byte")


def _fields(page: _Page, d: dict[str, Any], acc: Summary) -> None:
    page.add('<h2 id="fields">Fields</h2>')
    n = max(d["samples"], 1)
    rows = []
    for name, f in d["fields"].items():
        median = "-" if f["median"] is None else f"{f['median']:g}" + ("" if f["median_exact"] else "~")
        rows.append([name, f["samples"], f"{100 * f['samples'] / n:.1f}%", f["min"], median, f["max"], f"{f['bytes']:,}"])
    page.table(["field", "samples", "%", "min bytes", "median", "max bytes", "total bytes"], rows)
    charts = [svg_histogram(size_distribution(acc.fields[name]).histogram(), f"{name}: size", " B")
              for name in d["fields"]]
    page.add('<div class="charts">', *charts, "</div>")


def _tally_rows(t: dict[str, Any]) -> list[tuple[str, int]]:
    items = [(str(k), int(v)) for k, v in t["counts"].items()]
    if t.get("other"):
        items.append(("(others)", int(t["other"])))
    return items


def _content(page: _Page, content: dict[str, Any], names: Sequence[str] | None = None) -> None:
    if not content["fields"]:
        return
    page.add('<h2 id="content">Content</h2>')
    for name, f in content["fields"].items():
        page.add(f"<h3>{_esc(name)}</h3>")
        kinds = ", ".join(f"{k} {n}" for k, n in f["kinds"].items() if k != "media")
        types = ", ".join(f"{k} {n}" for k, n in f["types"].items())
        page.add(f"<p class=note>kinds: {_esc(kinds)}; sniffed types: {_esc(types)}</p><div class=block>")
        charts: list[str] = []
        if "image" in f:
            im = f["image"]
            page.table(["image", ""], [
                ["formats", ", ".join(f"{k} {v}" for k, v in _tally_rows(im["formats"]))],
                ["modes", ", ".join(f"{k} {v}" for k, v in _tally_rows(im["modes"]))],
                ["channels", ", ".join(f"{k} {v}" for k, v in _tally_rows(im["channels"]))],
                ["misnamed", ", ".join(f"{k}: {v}" for k, v in im["extension_mismatch"].items()) or "none"],
                ["header unreadable", im["undecodable"]],
                ["cut short or damaged", im.get("damaged", 0)],
            ])
            charts += [_hist(im["width"], f"{name}: width", " px"), _hist(im["height"], f"{name}: height", " px")]
        for kind in ("audio", "video"):
            if kind in f:
                m = f[kind]
                rows = [["codecs", ", ".join(f"{k} {v}" for k, v in _tally_rows(m["codecs"]))],
                        ["total duration", hours(m["total_seconds"])]]
                if kind == "audio":
                    rows += [["sample rates", ", ".join(f"{k} {v}" for k, v in _tally_rows(m["sample_rates"]))],
                             ["channels", ", ".join(f"{k} {v}" for k, v in _tally_rows(m["channels"]))]]
                else:
                    rows += [["fps", ", ".join(f"{k} {v}" for k, v in _tally_rows(m["fps"]))],
                             ["resolutions", ", ".join(f"{k} {v}" for k, v in _tally_rows(m["resolutions"]))]]
                page.table([kind, ""], rows)
                charts.append(_hist(m["duration"], f"{name}: {kind} duration", " s"))
        if "media" in f and (f["media"]["undecodable"] or f["media"]["unprobed"]):
            page.table(["audio/video", ""], [["unreadable", f["media"]["undecodable"]],
                                             ["not probed", f["media"]["unprobed"]]])
        if "text" in f:
            t = f["text"]
            page.table(["text", ""], [["texts", t["count"]], ["empty", t["empty"]], ["not UTF-8", t["non_utf8"]]])
            charts.append(_hist(t["length"], f"{name}: length", " chars"))
        if "json" in f:
            j = f["json"]
            objects = max(j["objects"], 1)
            page.add(f"<p>{_esc(plural(j['count'], 'JSON document'))}, {_esc(plural(j['objects'], 'object'))}, "
                     f"{j['invalid']} invalid</p>")
            page.table(["key", "documents", "%", "value types"], [
                [k, v["count"], f"{100 * v['count'] / objects:.1f}%", ", ".join(f"{t} {n}" for t, n in v["types"].items())]
                for k, v in list(j["keys"].items())[:100]
            ])
            if len(j["keys"]) > 100 or j["other_keys"]:
                more = [f"{len(j['keys']) - 100} more keys in tarshow --summary --json"] if len(j["keys"]) > 100 else []
                if j["other_keys"]:
                    more.append(other_keys(j["other_keys"]))
                page.add(f"<p class=note>{_esc('; '.join(more))}</p>")
        if "labels" in f:
            lb = f["labels"]
            page.add(f"<p>{_esc(plural(lb['count'], 'label'))}, {_esc(classes(lb))}</p>")
            bars = [(label_name(k, names), n) for k, n in _tally_rows(lb)]
            charts.append(svg_bars(bars, f"{name}: most frequent classes", lb["count"]))
        page.add(*[c for c in charts if c], "</div>")
    if content.get("media_note"):
        page.add(f"<p class=note>audio and video not probed: {_esc(content['media_note'])}</p>")


def _problems(page: _Page, d: dict[str, Any], cards: list[str], more: int) -> None:
    """The problems, first on the page: each kind with its examples and their tarfirst commands
    (every decode failure, up to ``MAX_DECODE_LISTED``), then a card for each sample that has one."""
    page.add('<h2 id="problems">Problems</h2>')
    if not d["problems"]:
        page.add('<p class="ok">no problems found</p>')
    else:
        page.add("<ul>" + "".join(f'<li class="problem">{_esc(p)}</li>' for p in d["problems"]) + "</ul>")
    content = d.get("content") or {}
    for name, p in content.get("problems", {}).items():
        examples = p["examples"]
        if name == "decode_failures" and content.get("decode"):
            examples = content["decode"]["failures"][:MAX_DECODE_LISTED]
        page.add(f"<h3>{_esc(PROBLEMS[name])}: {p['count']}</h3><ul>")
        for e in examples:
            page.add(f"<li><code>{_esc(e['key'])}.{_esc(e['field'])}</code> in <code>{_esc(e['url'])}</code>: "
                     f"{_esc(e['reason'])}<br><code>{_esc(e['command'])}</code></li>")
        page.add("</ul>")
        if p["count"] > len(examples):
            page.add(f"<p class=note>and {p['count'] - len(examples)} more"
                     + (" (tarshow --summary --decode --json lists them)" if name == "decode_failures" else "")
                     + "</p>")
    if cards:
        page.add('<h3 id="problem-samples">Samples with problems</h3><div class="cards">', *cards, "</div>")
    if more:
        page.add(f"<p class=note>{_esc(plural(more, 'more sample'))} with problems not shown as cards</p>")


def _data_uri(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def _jpeg_uri(img: Any) -> str:
    buf = io.BytesIO()
    img.convert("RGB").save(buf, "JPEG", quality=THUMB_QUALITY)
    return _data_uri("image/jpeg", buf.getvalue())


def _img_tag(img: Any, alt: str) -> str:
    return f'<img src="{_jpeg_uri(img)}" width="{img.width}" height="{img.height}" alt="{_esc(alt)}">'


def _card(sample: dict[str, Any], thumb: int, names: Sequence[str] | None = None,
          problems: list[tuple[str, str, str]] | None = None) -> str:
    """One sample as a card; ``problems``: ``(kind, field, reason)`` said at its top, each with the
    tarfirst command of its field."""
    from ..content import LABEL_FIELDS, tarfirst_command
    from ..imaging import decode_image
    from ..sniff import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS

    key = str(sample["__key__"])
    out = [f'<div class="card"><div class="key" title="{_esc(sample["__url__"])}">{_esc(key)}</div>']
    for kind, field, reason in problems or []:
        # a missing field: the command pulls out one the sample has (tarfirst -f FIELD would find nothing)
        shown = next((k for k in sample if not k.startswith("__")), None) if kind == "missing" else field
        command = tarfirst_command(sample["__url__"], key, shown)
        out.append(f'<div class="problem">{_esc(field)}: {_esc(reason)}<br><code>{_esc(command)}</code></div>')
    fields = (k for k in sample if not k.startswith("__"))
    for name in sorted(fields, key=lambda k: (_card_order(k, sample[k]), k)):
        data: bytes = sample[name]
        if isinstance(data, TooBig):
            out.append(f'<div class="field"><span class="name">{_esc(name)} · {int(data):,} B</span><br>'
                       f'<span class="note">(not shown: {_too_big(int(data))})</span></div>')
            continue
        kind = sniff_content(data)
        ext = name.rsplit(".", 1)[-1].lower()
        body: str
        if kind in IMAGE_TYPES:
            try:
                body = _img_tag(decode_image(data, max_size=thumb), f"{key}.{name}")
            except TarprocError as e:
                body = f'<span class="problem">{_esc(e)}</span>'
        elif ext in AUDIO_EXTENSIONS or (kind in ("wav", "flac", "mp3", "ogg") and ext not in VIDEO_EXTENSIONS):
            body = _audio(data, ext)
        elif ext in VIDEO_EXTENSIONS or kind in ("mp4", "matroska", "avi"):
            body = _video(data, ext, thumb, f"{key}.{name}")
        elif name in LABEL_FIELDS or ext in LABEL_FIELDS:
            body = f'<span class="label">{_esc(label_name(_text(data, 200), names))}</span>'
        elif kind == "json":
            body = f"<pre>{_esc(_json(data))}</pre>"
        elif kind in ("text", "empty"):
            body = f"<p>{_esc(_text(data, MAX_TEXT))}</p>" if data.strip() else '<span class="note">(empty)</span>'
        else:
            body = f'<span class="note">[{_esc(kind)}]</span>'
        out.append(f'<div class="field"><span class="name">{_esc(name)} · {len(data):,} B</span><br>{body}</div>')
    out.append("</div>")
    return "".join(out)


def _too_big(size: int) -> str:
    if size > MAX_KEEP:
        return f"over {MAX_KEEP >> 20} MiB"
    return f"the chosen samples' fields are kept up to {MAX_KEPT_TOTAL >> 20} MiB in all"


def _card_order(name: str, data: bytes) -> int:
    """Pictures first, then labels, text, audio, JSON and the rest."""
    from ..content import LABEL_FIELDS
    from ..sniff import AUDIO_EXTENSIONS, VIDEO_EXTENSIONS

    if isinstance(data, TooBig):
        return 6
    ext = name.rsplit(".", 1)[-1].lower()
    kind = sniff_content(data[:512])
    if kind in IMAGE_TYPES or ext in VIDEO_EXTENSIONS:
        return 0
    if name in LABEL_FIELDS or ext in LABEL_FIELDS:
        return 1
    if kind in ("text", "empty"):
        return 2
    if ext in AUDIO_EXTENSIONS:
        return 3
    return 4 if kind == "json" else 5


def _text(data: bytes, limit: int) -> str:
    text = data.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json(data: bytes) -> str:
    try:
        text = json.dumps(json.loads(data), indent=1, ensure_ascii=False)
    except (ValueError, RecursionError):  # not JSON, or nested too deep
        text = data.decode("utf-8", errors="replace")
    return text if len(text) <= MAX_JSON else text[: MAX_JSON - 1] + "…"


def _audio(data: bytes, ext: str) -> str:
    from ..decode.media import probe

    try:
        info = probe(data)
        desc = (f"{info.codec}, {info.duration:.2f} s" if info.duration is not None else info.codec) + (
            f", {info.sample_rate} Hz" if info.sample_rate else "") + (f", {info.channels} ch" if info.channels else "")
    except MissingDependencyError:
        desc = ""
    except TarprocError as e:
        return f'<span class="problem">{_esc(e)}</span>'
    note = f'<span class="note">{_esc(desc)}</span>' if desc else ""
    if len(data) > MAX_AUDIO_EMBED:
        return f'{note} <span class="note">(over {MAX_AUDIO_EMBED >> 20} MiB: not embedded)</span>'
    mime = _audio_type(data, ext)
    return f'<audio controls preload="metadata" src="{_data_uri(mime, data)}"></audio>{note}'


def _audio_type(data: bytes, ext: str) -> str:
    """The Content-Type of an audio field, as the viewer serves it: by its bytes, else by its name
    (audio in a video container: ``video/mp4`` -> ``audio/mp4``)."""
    from .catalog import field_type, sniffed_type

    for kind, mime in (sniffed_type(data[:512]), field_type(ext)):
        if kind == "audio":
            return mime
        if kind == "video":
            return "audio/" + mime.partition("/")[2]
    return "audio/wav"


def _video(data: bytes, ext: str, thumb: int, alt: str) -> str:
    from ..decode.media import poster_frame, probe

    try:
        info = probe(data)
        if info.kind == "audio":  # AAC in an .mp4, Opus in a .webm: no picture, a player
            return _audio(data, ext)
        img = poster_frame(data, thumb)
    except TarprocError as e:  # MediaError, MissingDependencyError
        return f'<span class="problem">{_esc(e)}</span>'
    desc = ", ".join(x for x in (info.codec, f"{info.duration:.2f} s" if info.duration else "",
                                 f"{info.width}x{info.height}" if info.width else "",
                                 f"{info.fps:g} fps" if info.fps else "") if x)
    return f'{_img_tag(img, alt)}<span class="note">{_esc(desc)}</span>'


def render_html(acc: Summary, samples: list[dict[str, Any]], urls: list[str], title: str, thumb: int = THUMB,
                wrap: Callable[[Iterable[dict[str, Any]]], Iterable[dict[str, Any]]] | None = None,
                seed: int | None = None, problem_samples: ProblemSamples | None = None,
                names: Sequence[str] | None = None) -> str:
    """The whole page for a finished summary and the chosen samples (``wrap``: a progress bar;
    ``seed``: the seed that chose them, to say so; ``problem_samples``: the samples with problems,
    shown as cards with the problems; ``names``: class names for integer labels)."""
    from .. import __version__

    d = acc.as_dict()
    page = _Page()
    page.add("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>",
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{_esc(title)}</title><style>{_CSS}</style></head><body>",
             f"<h1>{_esc(title)}</h1><p class=note>tarshow --report (tarproc {_esc(__version__)})</p>")
    _overview(page, d, urls)
    with warnings.catch_warnings():
        # a damaged field is said on its card: nothing from Pillow on stderr (the reader's warnings still are)
        warnings.filterwarnings("ignore", module=PILLOW_MODULES)
        chosen_problems, more = problem_samples.cards(d) if problem_samples is not None else ([], 0)
        _problems(page, d, [_card(sample, thumb, names, problems) for sample, problems in chosen_problems], more)
        chosen = "all of them" if len(samples) == d["samples"] else (
            "chosen at random" + (f" (seed {seed})" if seed is not None else ""))
        page.add(f'<h2 id="samples">Samples</h2><p class=note>{len(samples)} of {d["samples"]} samples, {chosen}</p>'
                 "<div class=cards>")
        for sample in (wrap(samples) if wrap else samples):
            page.add(_card(sample, thumb, names))
    page.add("</div>")
    _fields(page, d, acc)
    if d.get("content"):
        _content(page, d["content"], names)
    text = acc.format_text(d, names)
    page.add(f"<details><summary>the summary as text (<code>tarshow --summary</code>)</summary><pre>{_esc(text)}</pre>"
             "</details>")
    page.add("</body></html>\n")
    return "".join(page.parts)


def write_report(
    urls: Iterable[str],
    path: str,
    *,
    sample: int = DEFAULT_SAMPLE,
    seed: int = 0,
    count: int | None = None,
    content: bool = True,
    on_error: str = "fail",
    warn: Callable[[str], None] | None = None,
    wrap: Callable[[Iterator[Any]], Iterable[Any]] | None = None,
    wrap_cards: Callable[[Iterable[dict[str, Any]]], Iterable[dict[str, Any]]] | None = None,
    thumb: int = THUMB,
    title: str | None = None,
    decode: int | None = None,
    classes: Sequence[str] | None = None,
    **tar: Any,
) -> ReportInfo:
    """Read ``urls`` once and write the report to ``path`` (a local path, '-' or a URL ``open_sink``
    takes).

    Args:
        count: stop after that many samples.
        on_error: ``"skip-shard"`` records a damaged shard, warns (``warn``, a callback; default a
            ``DataWarning``) and goes on; ``"fail"`` raises (and writes nothing).
        wrap: wraps each shard's member iterator (a progress bar); ``wrap_cards`` the cards'.
        decode: decode every image, audio and video field in that many processes and list the
            failures (``tarproc.decode.check``); None: headers only.
        classes: class names for integer labels (``tarproc.classnames``), on the charts and cards.
        tar: ``policy`` (a ``ReadPolicy``) as for ``Summary.add_shard``.
    """
    if sample < 0:
        raise OptionError(f"bad sample size {sample}; must be >= 0")
    urls = list(urls)
    _refuse_an_input(path, urls)
    problem_samples = ProblemSamples()
    acc = Summary(content=content, decode=decode, observer=problem_samples.note)
    reservoir = SampleReservoir(sample, seed, count)
    # opened first: a report that can't be written fails before the read, not after it; on any
    # error (Ctrl-C included) the sink is aborted and nothing is left under the final name
    try:
        with open_sink(path, compression=None) as sink:
            for url in urls:

                def members(items: Iterator[Any], url: str = url) -> Iterable[Any]:
                    return problem_samples.watch(reservoir.watch(wrap(items) if wrap else items, url), url)

                try:
                    acc.add_shard(url, count=count, wrap=members, **tar)
                except TarprocError as e:
                    if on_error == "fail":
                        raise
                    warner(warn, DataWarning)(f"{e}; skipping the rest of this shard")
                if acc.stopped_early:
                    break
            acc.finish()
            chosen = reservoir.samples()
            first = urls[0].rstrip("/").rsplit("/", 1)[-1] if urls else "(no input)"
            name = first if len(urls) <= 1 else f"{first} and {plural(len(urls) - 1, 'more shard')}"
            # names that are not UTF-8 (surrogate-escaped) are written as \udcNN, as the text summary shows them
            text = render_html(acc, chosen, urls, title or name, thumb, wrap_cards, seed, problem_samples,
                               classes).encode("utf-8", "backslashreplace")
            sink.write(text)
    finally:
        acc.close()  # the decode workers, if any
    checker = acc.content.decode if acc.content is not None else None
    cards = len(problem_samples.cards(acc.as_dict())[0])
    return ReportInfo(path, acc.samples, len(chosen), len(text), acc.problems(),
                      checker.note if checker is not None else None, cards)


def _refuse_an_input(path: str, urls: list[str]) -> None:
    """An ``OptionError`` when the report would replace one of its own inputs."""
    import os

    from ..sources import local_path

    out = local_path(path) if path != "-" else None
    if out is None:
        return
    out = os.path.realpath(out)
    for url in urls:
        shard = local_path(url) if url != "-" else None
        if shard is not None and os.path.realpath(shard) == out:
            raise OptionError(f"--report {path}: that is an input ({url}); give the report another name")


__all__ = ["DEFAULT_SAMPLE", "MAX_PROBLEM_CARDS", "ProblemSamples", "ReportInfo", "SampleReservoir", "render_html",
           "svg_bars", "svg_histogram", "write_report"]
