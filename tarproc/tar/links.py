"""Hard and symbolic links: what a link names, and the recent members a link is read from.

A stream can't go back, so the reader keeps the last few MiB of members (``RecentMembers``) and,
for an older target in a plain local file, reads the file again (``reader.MemberFinder``).
"""

from __future__ import annotations

import itertools
import posixpath
from collections import deque
from typing import Any, NamedTuple

from ..errors import DataWarning, warner
from .headers import BLOCK, cstr, decode_name
from .ranges import FileRange, with_data
from .stats import ReadStats

DEFAULT_LINK_CACHE = 4 << 20  # bytes of recent members kept for links (more slows reading: fresh memory)

class RecentMembers:
    """The regular members read lately (their names and data), about ``limit`` bytes of them (each
    member counted at least 512 bytes): a hard or symbolic link names an earlier member, and a
    stream can't go back to read it again. Links find their targets by name, exactly (a link to
    ``a.TXT`` is not ``a.txt``, whatever the sample readers make of the two): a name index is
    built by the first link and brought up to date by the next, one dictionary lookup each.

    The fast path's members are remembered as the buffer they were found in (``add_scanned``), not
    as the items handed out: holding on to the items themselves (a tuple, a name and a bytes object
    per member, megabytes of them) keeps their memory from being reused and slowed reading small
    members by about 5%. A link scans those buffers again, for names.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # [sequence number, (name, data, offset) items or a ScannedBuffer buffer, charged bytes]
        self.lists: deque[list[Any]] = deque()
        self.bytes = 0
        self.added = 0  # lists added so far
        self.indexed = 0  # lists before this sequence number are in the index
        self.index: dict[str, tuple[int, Any]] = {}  # name -> (sequence number, data)

    def add(self, items: list[tuple[str, Any, int]], nbytes: int) -> None:
        self._add(items, nbytes + BLOCK * len(items))

    def add_scanned(self, scanned: ScannedBuffer, count: int, nbytes: int) -> None:
        """The fast path's ``count`` members (``nbytes`` of data), which ``scanned`` gives again, by
        name, when a link asks."""
        self._add(scanned, nbytes + BLOCK * count)

    def _add(self, items: Any, charged: int) -> None:
        if self.limit <= 0:
            return
        self.lists.append([self.added, items, charged])
        self.added += 1
        self.bytes += charged
        while self.bytes > self.limit and self.lists:
            old_seq, old, size = self.lists.popleft()
            self.bytes -= size
            if old_seq < self.indexed:
                for item in old:
                    if self.index.get(item[0], (None,))[0] == old_seq:
                        del self.index[item[0]]

    def find(self, name: str) -> Any:
        new = list(itertools.takewhile(lambda entry: entry[0] >= self.indexed, reversed(self.lists)))
        for entry in reversed(new):  # what came since the last link, in order: indexed now
            seq, items, _ = entry
            if isinstance(items, ScannedBuffer):
                entry[1] = items = items.items()
            for item in items:
                self.index[item[0]] = (seq, item[-2])
        self.indexed = self.added
        found = self.index.get(name)
        return found[1] if found is not None else None


class ScannedBuffer:
    """Members the C scanner found in a buffer, to be found again: ``items()`` scans the same bytes
    from the same place with the same arguments, but for names (``(name, data, offset)`` items,
    whatever the reader hands out), so it gives the same members (equal, not the same objects)."""

    __slots__ = ("args", "fetch", "scan")

    def __init__(self, scan: Any, args: tuple[Any, ...], fetch: bool) -> None:
        self.scan, self.fetch = scan, fetch
        self.args = (*args[:4], False, *args[5:])  # keyed=False: names

    def items(self) -> list[Any]:
        items: list[Any] = self.scan(*self.args)[0]
        if self.fetch and items and type(items[-1][-2]) is FileRange:  # read then, as it is again now
            items[-1] = with_data(items[-1], items[-1][-2].read())
        return items


def link_warning(stats: ReadStats, message: str) -> None:
    """Say something of a link where the read's warnings go (``stats.warn``, else a ``DataWarning``)."""
    warner(stats.warn, DataWarning)(message)


def target_came(watched: dict[Any, tuple[str, str]], name: Any, offset: int, stats: ReadStats) -> None:
    """A member of a name a symbolic link before it named: say what that means (a stream can't look ahead)."""
    message = watched.pop(name, None)
    if message is not None:
        link_warning(stats, f"{message[0]}{offset}{message[1]}")


def link_name(long_link: str | None, pax: dict[str, str], block: bytes) -> str:
    """What a link entry names: its GNU long link name, else its pax linkpath, else the header's."""
    if long_link is not None:
        return long_link
    if pax and "linkpath" in pax:
        return pax["linkpath"]
    return decode_name(cstr(block[157:257]))


class LinkTo(NamedTuple):
    """A link found by a MemberFinder's scan: the member it names."""

    target: str


def link_target(typeflag: int, name: str, target: str) -> str | None:
    """The member a link refers to: a hard link names it; a symbolic link's target is relative to
    the link's directory. None when a symbolic link leaves the archive (absolute, or ``..`` past
    its root)."""
    if typeflag == ord("1"):
        return target
    if target.startswith("/"):
        return None
    joined = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if joined == ".." or joined.startswith("../"):
        return None
    # keep the './' that members of 'tar -C dir .' have
    return "./" + joined if name.startswith("./") and not joined.startswith("./") else joined
