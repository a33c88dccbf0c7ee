"""Sample stages: small generators that take an iterable of samples first and yield samples.

Compose them by nesting, or with ``compose(samples, stage1, stage2...)``::

    samples = read_samples("train-{0000..0009}.tar")
    samples = select_fields(samples, parse_fields("image=jpg;jpeg;png cls"))
    samples = shuffle(samples, 1000, seed=0)
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .errors import OptionError, SampleError
from .fieldspec import Accepts, FieldSpec, parse_specs
from .samples import Sample, field_names
from .tar import check_key

Stage = Callable[[Iterable[Sample]], Iterable[Sample]]


def compose(samples: Iterable[Sample], *stages: Stage) -> Iterable[Sample]:
    """Apply stages left to right."""
    for stage in stages:
        samples = stage(samples)
    return samples


def parse_slice(text: str) -> tuple[int, int | None, int]:
    """Parse ``lo:hi[:step]`` (each part optional) into ``(lo, hi, step)``.

    >>> parse_slice("10:20"), parse_slice("::2"), parse_slice("5:")
    ((10, 20, 1), (0, None, 2), (5, None, 1))
    """
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise OptionError(f"bad slice {text!r}; expected lo:hi or lo:hi:step")
    try:
        lo = int(parts[0]) if parts[0] else 0
        hi = int(parts[1]) if parts[1] else None
        step = int(parts[2]) if len(parts) == 3 and parts[2] else 1
    except ValueError:
        raise OptionError(f"bad slice {text!r}; expected integers like 100:200:2") from None
    if lo < 0 or (hi is not None and hi < 0) or step < 1:
        raise OptionError(f"bad slice {text!r}; bounds must be >= 0 and the step >= 1")
    if max(lo, hi or 0, step) > sys.maxsize:
        raise OptionError(f"bad slice {text!r}; numbers must be at most {sys.maxsize}")
    if hi is not None and hi <= lo:
        raise OptionError(f"slice {text!r} selects nothing (HI must be greater than LO)")
    return lo, hi, step


def slice_samples(samples: Iterable[Sample], lo: int = 0, hi: int | None = None, step: int = 1) -> Iterator[Sample]:
    """Samples ``lo, lo+step, ...`` before ``hi``; stops reading once ``hi`` is reached."""
    return itertools.islice(samples, lo, hi, step)


# what tarcat -f and tarshow -f take of the field-spec grammar (tarproc/fieldspec.py)
SELECT_SPECS = Accepts("tarcat -f", rename=True, unique=False, legacy_rename=True)


def parse_fields(spec: str) -> list[tuple[str, list[str]]]:
    """Parse tarcat's and tarshow's field specs (the grammar: ``tarproc.fieldspec``): renames and
    alternatives, and the old ``NEW:OLD1,OLD2`` (see ``field_pairs``).

    >>> parse_fields("image=jpg;jpeg;png cls")
    [('image', ['jpg', 'jpeg', 'png']), ('cls', ['cls'])]
    """
    return field_pairs(parse_specs(spec, SELECT_SPECS))


def field_pairs(specs: Iterable[FieldSpec]) -> list[tuple[str, list[str]]]:
    """``(output name, alternatives)`` for ``select_fields``, names lower-cased; a name given twice
    is an error. (``legacy_note(specs)`` says when ``specs`` used the old ``NEW:OLD`` spelling.)"""
    out = [(s.name.lower() if s.renamed else s.fields[0], list(s.fields)) for s in specs]
    names = [name for name, _ in out]
    for name in names:
        if "/" in name:
            raise OptionError(f"bad field spec: output name {name!r} cannot contain '/'")
        if names.count(name) > 1:
            raise OptionError(f"bad field spec: {name!r} is named twice; rename one with NAME=FIELD")
    return out


def select_fields(
    samples: Iterable[Sample], fields: list[tuple[str, list[str]]], missing: str = "error"
) -> Iterator[Sample]:
    """Keep and rename fields as ``parse_fields`` describes.

    ``missing``: a sample that has none of an output's alternatives is an error (``"error"``),
    dropped (``"skip"``) or written without that field (``"keep"``).
    """
    if missing not in ("error", "skip", "keep"):
        raise OptionError(f"bad missing-field policy {missing!r}; use error, skip or keep")
    for sample in samples:
        out: Sample = {"__key__": sample["__key__"], "__url__": sample.get("__url__")}
        complete = True
        for name, alternatives in fields:
            for alt in alternatives:
                if alt in sample:
                    out[name] = sample[alt]
                    break
            else:
                complete = False
                if missing == "error":
                    have = ", ".join(field_names(sample))
                    raise SampleError(
                        f"sample {sample['__key__']!r} has none of {'/'.join(alternatives)} (it has: {have}); "
                        "use --missing skip or keep to go on",
                        sample.get("__url__"),
                        sample["__key__"],
                    )
        if complete or missing == "keep":
            yield out


def chunked(samples: Iterable[Sample], size: int) -> Iterator[list[Sample]]:
    """Lists of ``size`` samples (the last one may be shorter).

    >>> [len(c) for c in chunked(({"__key__": str(i)} for i in range(5)), 2)]
    [2, 2, 1]
    """
    chunk: list[Sample] = []
    for sample in samples:
        chunk.append(sample)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def shuffle(samples: Iterable[Sample], bufsize: int, seed: int | None = None) -> Iterator[Sample]:
    """Shuffle with a buffer of ``bufsize`` samples, filled completely before the first output.

    Filling first means the very first samples out are drawn from the whole buffer (no warm-up of
    correlated samples). With ``seed`` the order is reproducible.
    """
    if bufsize < 1:
        raise OptionError("shuffle buffer must hold at least 1 sample")
    return ShuffleBuffer(bufsize, seed).run(samples)


class ShuffleBuffer:
    """``shuffle``'s buffer and random state, which can be taken apart and put back: the choices
    depend on positions only, never on the samples, so a run over positions (``range(n)``) says which
    inputs a run over samples holds at any point, and ``resume`` continues it from there.

    >>> a = ShuffleBuffer(3, seed=1)
    >>> out = a.run(range(10))
    >>> head = [next(out) for _ in range(4)]
    >>> b = ShuffleBuffer.resume(3, a.state(), a.buffer, a.tail)
    >>> head + list(b.run(range(a.pulled, 10))) == list(ShuffleBuffer(3, seed=1).run(range(10)))
    True
    """

    def __init__(self, bufsize: int, seed: int | None = None) -> None:
        import random  # here, not at the top: tarcat starts without it

        self.bufsize = bufsize
        self.rng = random.Random(seed)
        self.buffer: list[Any] = []
        self.tail: list[Any] | None = None  # the last samples, shuffled once the input ran out
        self.pulled = 0  # inputs taken so far

    def state(self) -> Any:
        return self.rng.getstate()

    @classmethod
    def resume(cls, bufsize: int, state: Any, buffer: list[Any], tail: list[Any] | None) -> ShuffleBuffer:
        """A buffer that goes on where one with this random ``state``, ``buffer`` and ``tail`` stood."""
        out = cls(bufsize)
        out.rng.setstate(state)
        out.buffer, out.tail = list(buffer), None if tail is None else list(tail)
        return out

    def run(self, samples: Iterable[Any]) -> Iterator[Any]:
        buf, rng = self.buffer, self.rng
        if self.tail is None:
            it = iter(samples)
            if len(buf) < self.bufsize:
                for sample in it:
                    buf.append(sample)
                    self.pulled += 1
                    if len(buf) >= self.bufsize:
                        break
            for sample in it:
                self.pulled += 1
                i = rng.randrange(len(buf))
                out = buf[i]
                buf[i] = sample
                yield out
            rng.shuffle(buf)
            self.tail, self.buffer = buf[::-1], []
            # the tail's samples are held by the tail alone: each goes once handed out (a decoded
            # one holds its image, or its batch's array, which would live to the end of the input)
            buf.clear()
            out = sample = None
        while self.tail:
            yield self.tail.pop()


_MAX_KEY_WIDTH = 255  # widths and precisions in --key formats (a key is a file name)


def check_key_format(fmt: str) -> None:
    """Raise OptionError unless ``fmt % i`` gives distinct, writable keys."""
    # the numbers inside conversion specifications ("%-08.3d"), not digits of the literal text
    widths = [int(n) for spec in re.findall(r"%[^a-zA-Z%]*", fmt.replace("%%", "")) for n in re.findall(r"\d+", spec)]
    if any(n > _MAX_KEY_WIDTH for n in widths):
        raise OptionError(f"bad key format {fmt!r}: a width or precision over {_MAX_KEY_WIDTH}")
    try:
        first, second = fmt % 0, fmt % 1
        check_key(first)
    except (TypeError, ValueError, OverflowError):
        raise OptionError(f"bad key format {fmt!r}; expected a printf pattern like %09d") from None
    except SampleError as e:
        raise OptionError(f"bad key format {fmt!r}: {e.message}") from None
    if first == second:
        raise OptionError(f"bad key format {fmt!r}: it gives every sample the same key")


def rekey(samples: Iterable[Sample], fmt: str = "%09d", start: int = 0) -> Iterator[Sample]:
    """Replace each ``__key__`` with ``fmt % index`` (index from ``start``).

    >>> [s["__key__"] for s in rekey([{"__key__": "a"}, {"__key__": "b"}], "img-%03d")]
    ['img-000', 'img-001']
    """
    check_key_format(fmt)
    for i, sample in enumerate(samples, start):
        sample["__key__"] = fmt % i
        yield sample
