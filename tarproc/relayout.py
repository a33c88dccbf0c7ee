"""Re-lay a dataset's JPEGs with restart markers, once, so that every epoch's crops decode less.

A baseline JPEG is one run of entropy-coded data: a crop must Huffman-decode every row down to its
bottom, and every column of those rows, before it can skip any. With a restart marker every K MCUs
(16 x 16 pixels for 4:2:0) the data is cut into segments that decode on their own, and
``tarproc._jpeg.decode_region`` (the cpu backend's crop decoder) reads only the segments that
intersect the window. The rewrite is libjpeg's transcoding (``jpegtran -restart``): the same
coefficients, written again with the markers, so the decoded pixels are exactly the input's. The
input's Huffman tables are kept where they can code the new data (the size grows by the markers,
about 1%); elsewhere, or with ``optimize=True``, tables are optimized for each image (a statistics
pass more, about twice the time; usually a few percent smaller than the input).

``relayout_samples`` is the stage (``tarjpeg`` is its command): every ``.jpg``/``.jpeg`` field is
rewritten, every other byte of the sample is kept (the JPEG's EXIF, ICC and other APPn markers
too). A field it can't improve is passed through unchanged and counted by reason: progressive,
already has restart markers, CMYK, arithmetic coding, not a JPEG, or damaged (libjpeg reports an
error or corrupt data: the field is left as it is, with a ``DataWarning`` naming the sample, or
a ``DecodeError`` with ``strict=True``).

>>> from tarproc.relayout import relayout_jpeg
>>> relayout_jpeg(b"not a jpeg")
(b'not a jpeg', 'not a JPEG')
"""

from __future__ import annotations

import concurrent.futures
from collections import Counter, deque
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .errors import DataWarning, DecodeError, MissingDependencyError, OptionError, warn
from .fieldspec import IMAGE_FORMATS
from .samples import Sample

_jpeg: Any
try:
    from . import _jpeg  # type: ignore[attr-defined, no-redef]
except ImportError:  # pragma: no cover - built wherever libjpeg-turbo's headers are
    _jpeg = None

RELAID = "relaid"
"""The outcome of a field that was rewritten with restart markers."""

PASSED = ("progressive", "restart markers", "CMYK", "arithmetic coding", "not a JPEG", "damaged")
"""Why a field is passed through unchanged, in the order the summary lists them."""

JPEG_EXTENSIONS = tuple(ext for ext, fmt in IMAGE_FORMATS.items() if fmt == "jpeg")  # the one list: fieldspec
"""The fields re-laid: those whose last extension is one of these (``jpg``, ``left.jpeg``)."""

MAX_INTERVAL = 65535


BytesLike = bytes | bytearray | memoryview


def relayout_jpeg(data: BytesLike, interval: int = 0, optimize: bool = False) -> tuple[BytesLike, str]:
    """A JPEG with a restart marker every ``interval`` MCUs: ``(new bytes, "relaid")``, or
    ``(data, reason)`` unchanged where it can't be improved (a reason in ``PASSED``).

    Args:
        data: the JPEG file's bytes.
        interval: MCUs per restart segment; 0 chooses, from each image's width, the divisor of its
            MCU row that cuts it into about 16 segments (a crop then reads little more than its
            own columns; fewer in a small file, where the markers would cost more than ~2%); an
            interval that neither divides the row nor is a multiple of it still
            decodes, but crops can't skip segments in it.
        optimize: Huffman tables optimized for the image, always (else the input's where they
            can code the new data).

    Raises:
        ValueError: the JPEG is damaged (libjpeg's words: cut short, corrupt data).
        MissingDependencyError: ``tarproc._jpeg`` is not built (no libjpeg-turbo headers).
    """
    if not 0 <= interval <= MAX_INTERVAL:
        raise OptionError(f"restart interval must be 0 (chosen from the width) to {MAX_INTERVAL} MCUs, not {interval}")
    if _jpeg is None:
        raise MissingDependencyError("re-laying JPEGs needs tarproc._jpeg, built against libjpeg-turbo: install "
                                     "libjpeg62-turbo-dev (Debian) and reinstall tarproc")
    if bytes(data[:3]) != b"\xff\xd8\xff":
        return data, "not a JPEG"
    out = _jpeg.relayout(data, interval, optimize)
    if isinstance(out, str):
        return data, out
    return out, RELAID


def is_jpeg_field(name: str) -> bool:
    """Whether the stage re-lays field ``name`` (its last extension is jpg or jpeg)."""
    return name.rsplit(".", 1)[-1].lower() in JPEG_EXTENSIONS and not name.startswith("__")


@dataclass
class RelayoutStats:
    """What a re-layout did: fields rewritten, fields passed through by reason, and the rewritten
    fields' bytes before and after."""

    samples: int = 0
    relaid: int = 0
    passed: Counter[str] = field(default_factory=Counter)
    bytes_before: int = 0
    bytes_after: int = 0

    def add(self, outcome: str, before: int, after: int) -> None:
        if outcome == RELAID:
            self.relaid += 1
            self.bytes_before += before
            self.bytes_after += after
        else:
            self.passed[outcome] += 1

    def summary(self) -> str:
        """``1000 JPEGs re-laid (110.2 MB -> 108.9 MB, -1.2%), 12 passed through (10 progressive, 2 CMYK)``."""
        change = (self.bytes_after / self.bytes_before - 1) * 100 if self.bytes_before else 0.0
        text = (f"{self.samples} samples, {self.relaid} JPEGs re-laid ({_mb(self.bytes_before)} -> "
                f"{_mb(self.bytes_after)}, {change:+.1f}%)")
        total = sum(self.passed.values())
        if total:
            reasons = ", ".join(f"{self.passed[r]} {r}" for r in PASSED if self.passed[r])
            text += f", {total} passed through unchanged ({reasons})"
        return text


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n} bytes"


class _Outcome(NamedTuple):
    field: str
    outcome: str  # RELAID or a reason in PASSED
    before: int
    after: int
    error: str  # libjpeg's words, for a damaged field


def _relay_sample(sample: Sample, interval: int, optimize: bool) -> tuple[Sample, list[_Outcome]]:
    """The sample with its JPEG fields re-laid, and what became of each."""
    out = dict(sample)
    outcomes = []
    for name, value in sample.items():
        if not isinstance(value, (bytes, bytearray, memoryview)) or not is_jpeg_field(name):
            continue
        error = ""
        try:
            new, outcome = relayout_jpeg(value, interval, optimize)
        except ValueError as e:
            new, outcome, error = value, "damaged", str(e) or "libjpeg could not read it"
        out[name] = new
        outcomes.append(_Outcome(name, outcome, len(value), len(new), error))
    return out, outcomes


def relayout_samples(
    samples: Iterable[Sample],
    *,
    interval: int = 0,
    optimize: bool = False,
    threads: int = 1,
    strict: bool = False,
    stats: RelayoutStats | None = None,
) -> Generator[Sample, None, None]:
    """Re-lay the JPEG fields of each sample with restart markers (``relayout_jpeg``), in order.

    Args:
        samples: the samples (dicts with ``__key__``), e.g. from ``read_samples``.
        interval: MCUs per restart segment; 0 chooses per image (see ``relayout_jpeg``).
        optimize: optimize every image's Huffman tables (see ``relayout_jpeg``).
        threads: samples re-laid at once. libjpeg runs without the GIL, so threads use as many
            cores; up to ``4 * threads`` samples are in flight, and come out in input order.
        strict: a damaged JPEG is a ``DecodeError`` naming the sample, instead of a
            ``DataWarning`` and the field passed through as it is.
        stats: counts added to as samples go by (fields re-laid or passed through, bytes).

    >>> from tarproc.relayout import relayout_samples
    >>> [s["txt"] for s in relayout_samples([{"__key__": "a", "txt": b"kept"}])]
    [b'kept']
    """
    if threads < 1:
        raise OptionError(f"threads must be at least 1, not {threads}")
    if not 0 <= interval <= MAX_INTERVAL:
        raise OptionError(f"restart interval must be 0 (chosen from the width) to {MAX_INTERVAL} MCUs, not {interval}")
    stats = stats if stats is not None else RelayoutStats()

    def finish(sample: Sample, done: tuple[Sample, list[_Outcome]]) -> Sample:
        out, outcomes = done
        stats.samples += 1
        for o in outcomes:
            if o.outcome == "damaged":
                url, key = sample.get("__url__"), sample.get("__key__")
                if strict:
                    raise DecodeError(o.error, url, key=key, field=o.field)
                where = f"{url}: " if url else ""
                warn(f"{where}field {o.field!r} of sample {key!r} passed through unchanged: {o.error}", DataWarning)
            stats.add(o.outcome, o.before, o.after)
        return out

    if threads == 1:
        for sample in samples:
            yield finish(sample, _relay_sample(sample, interval, optimize))
        return
    pending: deque[tuple[Sample, concurrent.futures.Future[Any]]] = deque()
    with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="tarjpeg") as pool:
        try:
            for sample in samples:
                pending.append((sample, pool.submit(_relay_sample, sample, interval, optimize)))
                if len(pending) >= 4 * threads:
                    first, future = pending.popleft()
                    yield finish(first, future.result())
            while pending:
                first, future = pending.popleft()
                yield finish(first, future.result())
        finally:
            for _, future in pending:
                future.cancel()
