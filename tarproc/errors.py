"""Named exceptions of the tarproc core.

Every error carries enough context (URL, byte offset, member) to produce a one-line message; the
CLI boundary (``tarproc.cli.common``) turns them into ``COMMAND: error: MESSAGE`` and exit status 1.
"""

from __future__ import annotations


class TarprocError(Exception):
    """Base class of all errors the core raises on bad data, bad input or a failed sink."""

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.url = url

    def __str__(self) -> str:
        return f"{self.url}: {self.message}" if self.url else self.message


class TarFormatError(TarprocError):
    """The stream is not a valid tar archive: truncated, bad checksum, garbage, too large a member.

    ``offset`` is the byte offset (in the uncompressed stream) where the problem was found and
    ``member`` the name of the member being read (or the last one read, before a header problem).
    """

    def __init__(self, url: str | None, offset: int, reason: str, member: str | None = None) -> None:
        self.offset = offset
        self.reason = reason
        self.member = member
        text = f"{reason} at byte {offset}"
        if member is not None:
            text += f" (member {member!r})"
        super().__init__(text, url)


class CompressionError(TarprocError):
    """A compressed stream is damaged: bad CRC, bad data, or missing its end (trailer)."""


class SourceError(TarprocError):
    """An input could not be opened or read: missing file, failed command, dropped connection."""


class SinkError(TarprocError):
    """An output could not be written, renamed or uploaded, or would be written to a terminal."""


class SampleError(TarprocError):
    """A problem with the samples of a shard: duplicate field, a key that reappears, missing field."""

    def __init__(self, message: str, url: str | None = None, key: str | None = None) -> None:
        super().__init__(message, url)
        self.key = key


class DuplicateError(SampleError):
    """A field occurs twice in one sample, or a key reappears non-adjacently in a shard."""


class DecodeError(SampleError):
    """An image could not be decoded (corrupt, truncated, not an image) or has no image field."""

    def __init__(self, reason: str, url: str | None = None, key: str | None = None, field: str | None = None) -> None:
        self.reason = reason
        self.field = field
        what = f"field {field!r} of sample {key!r}" if field else f"sample {key!r}"
        super().__init__(f"cannot decode {what}: {reason}", url, key)


class JobError(SampleError):
    """A sample's command or function failed (or timed out) and the policy is ``fail``."""


class PlanError(TarprocError):
    """A plan row is malformed or names a file that can't be read; ``row`` is its line number."""

    def __init__(self, message: str, url: str | None, row: int | None = None, column: str | None = None) -> None:
        self.row = row
        self.column = column
        where = []
        if row is not None:
            where.append(f"row {row}")
        if column is not None:
            where.append(f"column {column}")
        super().__init__(", ".join(where) + ": " + message if where else message, url)




class NoMatchError(TarprocError):
    """No member (or fewer than asked for) matches (tarfirst)."""



class ImageDecodeError(TarprocError):
    """Data that should be an image could not be decoded (tarshow's previews and contact sheets)."""


class CompressedShardError(TarprocError):
    """A shard is compressed: offsets into it can't be read at random (index it as a plain tar)."""


class IndexFileError(TarprocError):
    """An index file is malformed, of an unknown version, or stale (made for another shard)."""


class TransportError(TarprocError):
    """A ZMQ endpoint could not be bound or connected, a send timed out, or a sender went silent."""


class WireError(TarprocError):
    """A message received is not wire format v1: bad header, unknown version, frames that don't fit.

    ``url`` is the endpoint it arrived on; a receiver reports it and keeps running.
    """


class OptionError(TarprocError):
    """An argument given to the core is malformed (a bad size, slice or field spec).

    The CLI boundary reports these as usage errors (exit status 2).
    """
