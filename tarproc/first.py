"""Find members in a stream of samples: the N-th one matching fields, a key or a name pattern (tarfirst).

A sample's candidates are its members ``KEY.FIELD`` (fields as the reader gives them: lower
case). With field alternatives, each sample offers at most one: the first alternative it has.
Without them (only ``regex``), every member of the sample whose name matches, in member order.
Conditions combine: ``key`` must equal the sample's key, ``regex`` must match the member name
(``re.search``). Reading stops at the match.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from .errors import NoMatchError, OptionError
from .fieldspec import FIRST_IMAGE_EXTENSIONS, Accepts, parse_specs
from .samples import Sample

# common image fields, in the order a sample's alternatives are tried (fieldspec's subset for
# tarfirst: the list it always had, so a sample with a heic and a jpg still gives its jpg)
IMAGE_FIELDS = FIRST_IMAGE_EXTENSIONS
# what tarfirst -f takes of the field-spec grammar (tarproc/fieldspec.py): alternatives; several
# specs are alternatives too, in order ('jpg;png tif')
MATCH_SPECS = Accepts("tarfirst -f", meta=frozenset(), unique=False, noun="field list")


def parse_alternatives(spec: str) -> tuple[str, ...]:
    """Field alternatives separated by ``;``, ``,`` or spaces, in order of preference.

    >>> parse_alternatives("jpg;jpeg, png")
    ('jpg', 'jpeg', 'png')
    """
    return tuple(field for s in parse_specs(spec, MATCH_SPECS) for field in s.fields)


@dataclass(frozen=True)
class MemberMatcher:
    """Which members match; build it with ``make_matcher``."""

    fields: tuple[str, ...] | None
    key: str | None = None
    regex: re.Pattern[str] | None = None

    def matches(self, sample: Sample) -> Iterator[str]:
        """The matching fields of ``sample``, in order."""
        key = sample["__key__"]
        if self.key is not None and key != self.key:
            return
        regex = self.regex
        if self.fields is not None:
            for field in self.fields:
                if field in sample and (regex is None or regex.search(f"{key}.{field}")):
                    yield field
                    return
            return
        for field in sample:
            if not field.startswith("__") and (regex is None or regex.search(f"{key}.{field}")):
                yield field

    def describe(self) -> str:
        parts = []
        if self.fields is not None:
            parts.append("fields " + ";".join(self.fields))
        if self.key is not None:
            parts.append(f"key {self.key!r}")
        if self.regex is not None:
            parts.append(f"names matching {self.regex.pattern!r}")
        return " and ".join(parts)


def make_matcher(fields: str | None = None, key: str | None = None, regex: str | None = None) -> MemberMatcher:
    """A matcher; without ``fields`` or ``regex`` it looks for image fields (``IMAGE_FIELDS``).

    >>> m = make_matcher(regex=r"\\.cls$")
    >>> list(m.matches({"__key__": "a", "cls": b"1", "jpg": b""}))
    ['cls']
    >>> list(make_matcher().matches({"__key__": "a", "cls": b"1", "png": b"", "jpg": b""}))
    ['jpg']
    """
    field_list = parse_alternatives(fields) if fields is not None else None
    if field_list is None and regex is None:
        field_list = IMAGE_FIELDS
    pattern = None
    if regex is not None:
        try:
            pattern = re.compile(regex)
        except re.error as e:
            raise OptionError(f"bad --regex {regex!r}: {e}") from None
    if key is not None and not key:
        raise OptionError("empty --key")
    return MemberMatcher(field_list, key, pattern)


def find_member(samples: Iterable[Sample], matcher: MemberMatcher, n: int = 1) -> tuple[Sample, str] | int:
    """The ``n``-th (1-based) matching ``(sample, field)``; stops reading there.

    Returns the number of matches found when there are fewer than ``n``.

    >>> samples = [{"__key__": "a", "cls": b"1"}, {"__key__": "b", "png": b"P"}, {"__key__": "c", "jpg": b"J"}]
    >>> sample, field = find_member(samples, make_matcher(), n=2)
    >>> sample["__key__"], field
    ('c', 'jpg')
    >>> find_member(samples, make_matcher(), n=3)
    2
    """
    if n < 1:
        raise OptionError(f"bad match number {n}; counting starts at 1")
    found = 0
    for sample in samples:
        for field in matcher.matches(sample):
            found += 1
            if found == n:
                return sample, field
    return found


__all__ = ["IMAGE_FIELDS", "MemberMatcher", "NoMatchError", "find_member", "make_matcher", "parse_alternatives"]
