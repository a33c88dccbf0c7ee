"""Other tools' index files: which one a file is, and megatron-energon's binary index.

Other tools' index files are told apart by content (``index_kind``): DALI's, wids', and
megatron-energon's binary ``SHARD.tar.idx`` (``EnergonIndex``: the name ours takes). Read as a
tarproc index, one is a ``ForeignIndexError``; found beside a shard, ``IndexedShard`` indexes the
shard in memory instead; ``check_index_file`` checks any of them against its shard.

Apart from tarproc's own index (``shard_index``) because tarproc only recognises, refuses or
checks these formats: it never reads samples through them. It sits under ``shard_index``, whose
``load_index`` asks it what a file is; ``tarproc.index`` re-exports every public name here.
"""

from __future__ import annotations

import array
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

from .errors import IndexFileError, SourceError
from .sources import Network, local_path, open_source, read_to_end
from .tar import BLOCK

# Offsets past this can't be in a file (off_t).
_MAX_OFFSET = (1 << 63) - 1

FOREIGN_KINDS = {
    "dali": "a DALI index (wds2idx)",
    "wids": "a wids descriptor",
    "energon": "an energon index (megatron-energon's energon prepare)",
}
"""The index formats of other tools that tarproc recognises, and how messages name them."""

SNIFF_BYTES = 1 << 16  # what index_kind looks at
_DALI_HEADER = re.compile(rb"v[0-9]+(\.[0-9]+)* [0-9]+")


class ForeignIndexError(IndexFileError):
    """Another tool's index file where a tarproc index was asked for, or where ``tarindex`` would
    write one. ``kind`` is its format, a key of ``FOREIGN_KINDS``."""

    def __init__(self, message: str, url: str | None, kind: str) -> None:
        super().__init__(message, url)
        self.kind = kind


def index_kind(head: bytes) -> str | None:
    """The index format a file begins with, from its first bytes (64 KiB, or the whole file):
    ``tarproc``, ``dali``, ``wids`` or ``energon``; None for anything else (empty, damaged, not an index).

    energon's ``.tar.idx`` is binary: little-endian uint64 offsets of tar headers. Each is a
    multiple of 512, so every 8-byte word begins with a zero byte, which no text index does.

    >>> index_kind((0).to_bytes(8, "little") + (2048).to_bytes(8, "little"))
    'energon'
    >>> index_kind(b"v1.2 3\\n"), index_kind(b'{"format": "tarproc-index", "version": 1}\\n'), index_kind(b"x")
    ('dali', 'tarproc', None)
    """
    if len(head) >= 8 and head[0] == 0:
        words = head[: min(len(head), 4096) // 8 * 8]
        if all(words[i] == 0 and not words[i + 1] & 1 for i in range(0, len(words), 8)):
            return "energon"
        return None
    text = head.lstrip()
    first = text.split(b"\n", 1)[0].rstrip()
    if first.startswith(b"{"):
        if b'"tarproc-index"' in first:
            return "tarproc"
        if b'"__kind__"' in text and b'"wids-shard-index-v1"' in text:
            return "wids"
        return None
    return "dali" if _DALI_HEADER.fullmatch(first) else None


def index_kind_at(url: str, network: Network | None = None) -> str | None:
    """The format of the file at ``url`` (see ``index_kind``); None when there is no such file,
    it can't be read, or it is no index tarproc knows."""
    path = local_path(url)
    if path is not None and not os.path.isfile(path):
        return None
    try:
        with open_source(url, network=network) as source:
            head = read_to_end(source, SNIFF_BYTES)
    except SourceError:
        return None
    return index_kind(head)


def foreign_index_error(url: str | None, kind: str) -> ForeignIndexError:
    """The error for another tool's index read as a tarproc index."""
    where = "byte 0" if kind == "energon" else "line 1"
    return ForeignIndexError(
        f"{where}: not a tarproc index but {FOREIGN_KINDS[kind]}, which has no sample keys; random access "
        "needs a tarproc index: leave the index out to index the shard in memory, or write one elsewhere "
        "(tarindex SHARD -o OTHER.idx)", url, kind,
    )


def refuse_foreign_index(target: str, fmt: str, network: Network | None = None) -> None:
    """Raise ``ForeignIndexError`` when ``target`` holds another tool's index that writing a
    ``fmt`` index there would replace: ``tarindex`` never destroys one unless told to."""
    if target == "-":
        return
    kind = index_kind_at(target, network)
    if kind is None or kind == "tarproc" or kind == fmt:
        return
    raise ForeignIndexError(
        f"{FOREIGN_KINDS[kind]} is there; tarindex doesn't replace another tool's index: write yours "
        "elsewhere with -o, or give --overwrite to replace it", target, kind,
    )



class EnergonIndex(NamedTuple):
    """megatron-energon's ``SHARD.tar.idx``, written by ``energon prepare`` beside each shard
    (``megatron/energon/flavors/webdataset/itar.py``): the byte where each sample's first regular
    member begins (its GNU or pax headers included), then the byte where the last sample ends.
    It has no keys or fields: it gives counts and starting points, not random access by key."""

    url: str | None
    offsets: Sequence[int]  # samples + 1 numbers, increasing

    @property
    def samples(self) -> int:
        return len(self.offsets) - 1

    @property
    def end(self) -> int:
        """Where the last sample ends (where the archive's end blocks begin, unless members that
        are not samples follow)."""
        return self.offsets[-1]


def parse_energon_index(data: bytes, url: str | None = None) -> EnergonIndex:
    """Read energon's binary index; ``IndexFileError`` names the file and the byte on any problem.

    >>> parse_energon_index(b"".join(n.to_bytes(8, "little") for n in (0, 2048, 4096))).samples
    2
    """
    if not data:
        raise IndexFileError("byte 0: empty file, not an energon index (one holds at least the end of its shard)", url)
    if len(data) % 8:
        whole = len(data) - len(data) % 8
        raise IndexFileError(f"byte {whole}: {len(data)} bytes, not a whole number of 8-byte offsets: "
                             "a truncated energon index", url)
    offsets = array.array("Q")
    offsets.frombytes(data)
    if sys.byteorder == "big":  # pragma: no cover - energon writes native order, little-endian where it runs
        offsets.byteswap()
    prev = -1
    for i, offset in enumerate(offsets):
        if offset % BLOCK:
            raise IndexFileError(f"byte {8 * i}: offset {offset} is not the start of a tar header "
                                 "(a multiple of 512): a damaged energon index", url)
        if offset > _MAX_OFFSET:
            raise IndexFileError(f"byte {8 * i}: offset {offset} is past any file's end: a damaged energon index", url)
        if offset <= prev:
            raise IndexFileError(f"byte {8 * i}: offset {offset} is not after the one before it ({prev}): "
                                 "a damaged energon index", url)
        prev = offset
    return EnergonIndex(url, array.array("q", offsets))


def read_energon_index(source: Any, url: str | None, head: bytes = b"") -> EnergonIndex:
    """Energon's index from an open ``source``, of which ``head`` was read already."""
    return parse_energon_index(read_to_end(source, None, head), url)


def load_energon_index(url: str, network: Network | None = None) -> EnergonIndex:
    """Read energon's index file at ``url`` (a path or any URL ``open_source`` takes)."""
    with open_source(url, network=network) as source:
        return read_energon_index(source, url)

