"""Field specs, the one grammar every command and the Dataset use to name fields, and the one list
of media extensions.

A spec names an output (a tar field, a table column, a tuple element) and the fields that can fill
it, in order of preference: the first one a sample has wins. Several specs are separated by
whitespace::

    SPEC  := [NAME=]ALT[;ALT...]
    ALT   := FIELD[.JSONPATH][:MODIFIER]  |  __key__  |  __url__

- ``jpg;png`` is the first of ``jpg`` and ``png`` a sample has, named after the first (``jpg``);
  ``;`` as in webdataset's ``to_tuple("jpg;png", "cls")``, and ``,`` is the same (``jpg,png``).
- ``image=jpg;jpeg;png`` names the output ``image``.
- ``json.label`` is a path into a JSON field (the field is the name up to its first ``json``
  component: ``meta.json.boxes.0``); a dotted name without one is a field (``seg.png``).
- ``jpg:size``, ``:sha256``, ``:type`` give a binary field's size, digest or sniffed type; a modifier
  on the last alternative applies to all (``jpg;png:size``).
- Spaces around ``=``, ``;``, ``,`` and ``:`` are ignored; field names are lower-cased (the tar
  reader lower-cases them); names and JSON paths keep their case.

Each consumer takes the parts it supports (``Accepts``) and refuses the rest with an ``OptionError``
naming the bad part: ``tar2tsv -f`` takes all of it; ``tarcat -f`` and ``tarshow -f`` renames and
alternatives (and, for one release, the old ``NEW:OLD1,OLD2`` rename, flagged as ``legacy``);
``tarfirst -f`` (where several specs are alternatives too), the decode fields (``tardecode``/
``tarserve --field``, ``Dataset(image=...)``, the keys of ``Dataset(decode={...})``) and each
``Dataset(to_tuple=...)`` column alternatives only.

Where the consumers read specs differently before this grammar, each still does (``Accepts``):
empty alternatives are left out (``jpg;png;``) except in ``tar2tsv -f``, which refuses them; in
``tar2tsv -f`` a ``,`` is part of a field name (``a,b``); a ``to_tuple`` column and a decode field
are one spec each, a space inside a name being part of it; in ``tarcat -f`` and ``tarshow -f``
(which take no modifier) ``NEW:OLD`` is always the old rename (``x:type`` renames ``type``).

>>> [s.name for s in parse_specs("image=jpg;png cls", TAKE_ALL)]
['image', 'cls']
>>> parse_spec("jpg;png:size", TAKE_ALL).alternatives[1]
Alternative(field='png', path=(), modifier='size')
>>> parse_spec("jpg:size", Accepts("tarfirst -f"))
Traceback (most recent call last):
...
tarproc.errors.OptionError: bad field spec 'jpg:size': tarfirst -f takes no modifier (':size')

The media extensions (``IMAGE_EXTENSIONS``, ``AUDIO_EXTENSIONS``, ...) live here too, once: the
commands that look for "an image field" or route a field by its kind import them from here.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

from .errors import OptionError

# ---------------------------------------------------------------------------------------------
# media extensions

# image extension -> the format sniff_type names for it; the order is the order tarfirst tries them
IMAGE_FORMATS: dict[str, str] = {
    "jpg": "jpeg", "jpeg": "jpeg", "png": "png", "webp": "webp", "gif": "gif", "bmp": "bmp",
    "tif": "tiff", "tiff": "tiff", "ppm": "pnm", "pgm": "pnm", "pbm": "pnm", "pnm": "pnm",
    "jp2": "jpeg2000", "j2k": "jpeg2000", "avif": "avif", "heic": "heic", "heif": "heif",
}
IMAGE_EXTENSIONS: tuple[str, ...] = tuple(IMAGE_FORMATS)
# named subsets of the one list, for the commands whose defaults predate some of its entries (a
# default that took in a new extension would change what they pick: a sample with a heic and a jpg)
# - tarfirst's default fields, in the order tried: not j2k (a raw JPEG 2000 codestream) nor heic/heif
FIRST_IMAGE_FORMATS: frozenset[str] = frozenset({"jpeg", "png", "webp", "gif", "bmp", "tiff", "pnm", "jpeg2000", "avif"})
FIRST_IMAGE_EXTENSIONS: tuple[str, ...] = tuple(
    e for e, f in IMAGE_FORMATS.items() if f in FIRST_IMAGE_FORMATS and e != "j2k"
)
# - the image files tarcreate --classes-from-dirs takes from a class directory
CLASS_DIR_IMAGE_FORMATS: frozenset[str] = frozenset({"jpeg", "png", "webp", "gif", "bmp", "tiff"})
CLASS_DIR_IMAGE_EXTENSIONS: tuple[str, ...] = tuple(e for e, f in IMAGE_FORMATS.items() if f in CLASS_DIR_IMAGE_FORMATS)
# the formats the cpu decode backend reads (decode/cpu.py); DALI reads them too. Only these are
# decoded by default: a field in another format would fail every sample.
DECODABLE_IMAGE_FORMATS: frozenset[str] = frozenset({"jpeg", "png", "webp"})
DECODABLE_IMAGE_EXTENSIONS: tuple[str, ...] = tuple(e for e, f in IMAGE_FORMATS.items() if f in DECODABLE_IMAGE_FORMATS)
# the decode stage's default field spec: "jpg;jpeg;png;webp"
DEFAULT_IMAGE_SPEC = ";".join(DECODABLE_IMAGE_EXTENSIONS)
AUDIO_EXTENSIONS: frozenset[str] = frozenset({"wav", "flac", "ogg", "oga", "opus", "mp3", "m4a", "aac"})
VIDEO_EXTENSIONS: frozenset[str] = frozenset({"mp4", "m4v", "webm", "mkv", "mov", "avi"})
TEXT_EXTENSIONS: frozenset[str] = frozenset({"txt", "text", "caption", "transcript"})
JSON_EXTENSIONS: frozenset[str] = frozenset({"json", "jsn"})
LABEL_FIELDS: frozenset[str] = frozenset({"cls", "cls2", "label", "labels", "class", "target"})

# ---------------------------------------------------------------------------------------------
# the grammar

MODIFIERS = ("size", "sha256", "type")
META_FIELDS = frozenset({"__key__", "__url__"})

# the one help text for every command's field-spec option (click wraps it)
SPEC_HELP = ("Field specs: [NAME=]FIELD;FIELD... (the first FIELD a sample has; ',' works as ';'), "
             "separated by spaces; see 'Field specs' in the README.")


@dataclass(frozen=True)
class Alternative:
    """One field that can fill an output: ``field`` (or ``__key__``/``__url__``), a JSON ``path``
    into it, a ``modifier`` (``size``, ``sha256``, ``type``)."""

    field: str
    path: tuple[str, ...] = ()
    modifier: str | None = None

    def __str__(self) -> str:
        text = ".".join((self.field, *self.path))
        return f"{text}:{self.modifier}" if self.modifier else text


@dataclass(frozen=True)
class FieldSpec:
    """One output: its ``name`` and the ``alternatives`` that fill it, first present wins.

    ``renamed``: the spec gave the name (``NAME=``); ``legacy``: it did so in the old ``NEW:OLD``
    spelling (``tarcat -f``), which goes away in the next release.
    """

    name: str
    alternatives: tuple[Alternative, ...]
    renamed: bool = False
    legacy: bool = False

    @property
    def fields(self) -> tuple[str, ...]:
        """The alternatives' field names, in order."""
        return tuple(a.field for a in self.alternatives)

    def __str__(self) -> str:
        """The spec in today's spelling (``image=jpg;png``)."""
        body = ";".join(str(a) for a in self.alternatives)
        return f"{self.name}={body}" if self.renamed else body


@dataclass(frozen=True)
class Accepts:
    """What a consumer of specs takes; ``what`` names it in errors (``"tarcat -f"``).

    ``meta``: the ``__names__`` it takes (None: any, as ``to_tuple`` with ``__valid__``);
    ``several``: more than one spec; ``unique``: output names must differ; ``legacy_rename``:
    ``NEW:OLD1,OLD2`` still means ``NEW=OLD1;OLD2`` (where ``modifiers`` are not taken, any
    ``NEW:OLD``: ``x:type`` renames the field ``type``); ``noun``: what errors call the text (``bad
    field list 'img=jpg'`` where only alternatives are taken).

    As each consumer read its specs before the one grammar: ``drop_empty``: empty alternatives are
    left out (``jpg;png;``), else an error (tar2tsv); ``commas``: ``,`` separates alternatives as
    ``;`` does, else it is part of a field name (tar2tsv: ``a,b`` is the field ``a,b``);
    ``spaced_names``: the text is one spec and whitespace inside a name is part of it (``to_tuple``
    columns and the decode fields: ``"a b"`` is the field ``a b``), else whitespace separates specs.
    """

    what: str
    rename: bool = False
    modifiers: bool = False
    paths: bool = False
    meta: frozenset[str] | None = META_FIELDS
    several: bool = True
    unique: bool = True
    legacy_rename: bool = False
    noun: str = "field spec"
    drop_empty: bool = True
    commas: bool = True
    spaced_names: bool = False


TAKE_ALL = Accepts("a field spec", rename=True, modifiers=True, paths=True, drop_empty=False)
FIELD_LIST = Accepts("a field list", meta=frozenset(), several=False, unique=False, noun="field list", spaced_names=True)

_AROUND_SEPARATORS = re.compile(r"\s*([=;,:])\s*")
_AROUND_SEPARATORS_NO_COMMA = re.compile(r"\s*([=;:])\s*")


def parse_specs(text: str, accepts: Accepts = TAKE_ALL) -> tuple[FieldSpec, ...]:
    """The specs in ``text`` (whitespace-separated), or an ``OptionError`` naming the bad one.

    >>> [str(s) for s in parse_specs("img = JPG ; png  json.Label", TAKE_ALL)]
    ['img=jpg;png', 'json.Label']
    """
    spaced = (_AROUND_SEPARATORS if accepts.commas else _AROUND_SEPARATORS_NO_COMMA).sub(r"\1", text)
    if accepts.spaced_names:
        items = [spaced.strip()] if spaced.strip() else []
    else:
        items = spaced.split()
    if not items:
        raise OptionError(f"empty {accepts.noun} {text!r}; {accepts.what} needs at least one field")
    if len(items) > 1 and not accepts.several:
        raise _bad(accepts, text, f"{accepts.what} takes one spec; join alternatives with ';'")
    specs = tuple(_parse_item(item, accepts) for item in items)
    if accepts.unique:
        names = [s.name for s in specs]
        for name in names:
            if names.count(name) > 1:
                raise _bad(accepts, text, f"{name!r} is named twice; rename one with NAME=FIELD")
    return specs


def parse_spec(text: str, accepts: Accepts = FIELD_LIST) -> FieldSpec:
    """The one spec in ``text`` (alternatives only by default).

    >>> parse_spec("jpg;jpeg, PNG").fields
    ('jpg', 'jpeg', 'png')
    """
    return parse_specs(text, dataclasses.replace(accepts, several=False))[0]


def field_list(text: str, what: str = "a field list") -> list[str]:
    """The alternatives of one spec that takes nothing else: ``"jpg;jpeg,png"`` -> ``[...]``."""
    return list(parse_spec(text, dataclasses.replace(FIELD_LIST, what=what)).fields)


def legacy_note(specs: tuple[FieldSpec, ...] | list[FieldSpec], option: str = "-f") -> str | None:
    """The deprecation line for specs written as ``NEW:OLD``, with the spelling to use, or None.

    >>> legacy_note(parse_specs("image:jpg,png cls", Accepts("tarcat -f", rename=True, legacy_rename=True)))
    "-f 'image:...' renames in the old spelling, which goes away in the next release; write 'image=jpg;png cls'"
    """
    old = [s for s in specs if s.legacy]
    if not old:
        return None
    return (f"{option} '{old[0].name}:...' renames in the old spelling, which goes away in the next release; "
            f"write '{' '.join(str(s) for s in specs)}'")


def _bad(accepts: Accepts, item: str, reason: str) -> OptionError:
    return OptionError(f"bad {accepts.noun} {item!r}: {reason}")


def _parse_item(item: str, accepts: Accepts) -> FieldSpec:
    name, sep, body = item.partition("=")
    renamed = bool(sep)
    legacy = False
    if not sep:
        name, body = "", item
        head, colon, tail = item.partition(":")
        if (colon and accepts.legacy_rename and not re.search("[;,]", head)
                and (not accepts.modifiers or re.split("[;,:]", tail)[0] not in MODIFIERS)):
            name, body, renamed, legacy = head, tail, True, True  # NEW:OLD1,OLD2
    if renamed:
        if not accepts.rename:
            raise _bad(accepts, item, f"{accepts.what} takes no NAME= (it names nothing)")
        if not name:
            raise _bad(accepts, item, "no name before '='" if not legacy else "no name before ':'")
        if "=" in body:
            raise _bad(accepts, item, "two '='")
    texts = re.split("[;,]" if accepts.commas else ";", body)
    if body and not accepts.drop_empty and any(not t for t in texts):
        raise _bad(accepts, item, "an empty alternative")
    texts = [t for t in texts if t]  # 'jpg;png;' is 'jpg;png', as it always was
    if not texts:
        raise _bad(accepts, item, "no field" + (f" after {name!r}" if name else ""))
    alternatives = [_parse_alternative(t, item, accepts) for t in texts]
    last = alternatives[-1].modifier
    if last is not None:  # 'jpg;png:size' means 'jpg:size;png:size'
        alternatives = [
            Alternative(a.field, (), last) if a.modifier is None and not a.path and a.field not in META_FIELDS else a
            for a in alternatives
        ]
    if not renamed:
        name = item
    return FieldSpec(name, tuple(alternatives), renamed, legacy)


def _parse_alternative(text: str, item: str, accepts: Accepts) -> Alternative:
    path: tuple[str, ...]
    body, sep, modifier = text.partition(":")
    if sep:
        if not accepts.modifiers:
            hint = " (to rename, write NAME=FIELD)" if accepts.rename and modifier not in MODIFIERS else ""
            raise _bad(accepts, item, f"{accepts.what} takes no modifier (':{modifier}'){hint}")
        if modifier not in MODIFIERS:
            raise _bad(accepts, item, f"unknown modifier {modifier!r}; use one of {', '.join(MODIFIERS)}")
    if not body:
        raise _bad(accepts, item, "no field name")
    if body.startswith("__"):
        if accepts.meta is not None and body not in accepts.meta:
            takes = f"takes only {' and '.join(sorted(accepts.meta))}" if accepts.meta else "takes no __names__"
            raise _bad(accepts, item, f"{body!r} is not a field ({accepts.what} {takes})")
        if sep:
            raise _bad(accepts, item, f"{body} takes no modifier")
        return Alternative(body)
    if "/" in body:
        raise _bad(accepts, item, f"{body!r} is not a field name (no '/' in field names)")
    parts = body.split(".")
    if any(not p for p in parts):
        raise _bad(accepts, item, f"an empty component in {body!r}")
    field, path = body.lower(), ()
    lower = [p.lower() for p in parts]
    if accepts.paths and "json" in lower[:-1]:  # 'x.json' is a field, 'json.x' a path into one
        i = lower.index("json")
        field, path = ".".join(lower[: i + 1]), tuple(parts[i + 1 :])
        if sep:
            raise _bad(accepts, item, "a JSON path takes no modifier")
    return Alternative(field, path, modifier or None)


__all__ = [
    "AUDIO_EXTENSIONS",
    "CLASS_DIR_IMAGE_EXTENSIONS",
    "CLASS_DIR_IMAGE_FORMATS",
    "DECODABLE_IMAGE_EXTENSIONS",
    "DECODABLE_IMAGE_FORMATS",
    "DEFAULT_IMAGE_SPEC",
    "FIELD_LIST",
    "FIRST_IMAGE_EXTENSIONS",
    "FIRST_IMAGE_FORMATS",
    "IMAGE_EXTENSIONS",
    "IMAGE_FORMATS",
    "JSON_EXTENSIONS",
    "LABEL_FIELDS",
    "META_FIELDS",
    "MODIFIERS",
    "SPEC_HELP",
    "TAKE_ALL",
    "TEXT_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "Accepts",
    "Alternative",
    "FieldSpec",
    "field_list",
    "legacy_note",
    "parse_spec",
    "parse_specs",
]
