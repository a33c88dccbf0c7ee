"""Named exceptions and warnings of the tarproc core.

Every error carries enough context (URL, byte offset, member) to produce a one-line message; the
CLI boundary (``tarproc.cli.common``) turns them into ``COMMAND: error: MESSAGE`` and exit status 1.
Warnings go through the standard library (``warn``: ``warnings.warn`` with a ``TarprocWarning``
class), so a training script filters or routes them as any other; the commands print each as
``COMMAND: warning: MESSAGE``.
"""

from __future__ import annotations

import functools
import pickle
import sys
import warnings
from collections.abc import Callable
from typing import Any


class TarprocError(Exception):
    """Base class of all errors the core raises on bad data, bad input or a failed sink."""

    def __init__(self, message: str, url: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.url = url

    def __str__(self) -> str:
        return f"{self.url}: {self.message}" if self.url else self.message

    def __reduce__(self) -> tuple[object, ...]:
        # pickle with every attribute (a DataLoader worker sends errors to the main process);
        # the default would call __init__ with the message alone, which most subclasses don't take
        return _rebuild, (type(self), self.args, self.__dict__)


def _rebuild(cls: type[TarprocError], args: tuple[object, ...], state: dict[str, object]) -> TarprocError:
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error


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


class LinkError(TarFormatError):
    """A hard or symbolic link whose target member can't be had: not an earlier member of the
    shard, gone from the recent members on a stream that can't be read again, or outside the archive."""


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
    """A message received is not wire format v2: bad header, unknown version, frames that don't fit.

    ``url`` is the endpoint it arrived on; a receiver reports it and keeps running.
    """


class ShardCountError(TarprocError):
    """A shard holds another number of samples than its recorded count says (a manifest, an index
    file or a list given as ``lengths``): planning on it would hang ranks or drop samples."""

    def __init__(self, url: str, holds: int, count: int, source: str) -> None:
        self.holds, self.count, self.source = holds, count, source
        super().__init__(
            f"holds {holds} samples, but its count ({source}) says {count}: fix or rebuild the count "
            f"(tarindex {url}), or pass lengths='auto' to count the shards", url,
        )


class DatasetError(TarprocError):
    """An error in a training dataset's worker process, as the main process receives it.

    ``message`` is the original error's one line (shard URL, key, field, byte offset) and
    ``worker`` the DataLoader worker that hit it. torch's DataLoader re-raises a worker's exception
    by calling its class with a message that wraps the worker's traceback; this class takes the
    original line back out of that message, so the main process sees one clear line.
    """

    def __init__(self, message: str, url: str | None = None, worker: int | None = None, cause: str | None = None) -> None:
        if url is None and message.startswith("Caught ") and "\nOriginal Traceback" in message:
            message, worker = _unwrap_worker_message(message)
            url = None
        self.worker = worker
        self.cause = cause
        super().__init__(message, url)

    def __str__(self) -> str:
        text = super().__str__()
        return text if self.worker is None else f"{text} (DataLoader worker {self.worker})"


def _unwrap_worker_message(text: str) -> tuple[str, int | None]:
    """The original one-line message and worker id inside torch's wrapped worker exception text."""
    first = text.split("\n", 1)[0]
    worker = None
    if "worker process " in first:
        number = first.rsplit("worker process ", 1)[1].rstrip(".")
        worker = int(number) if number.isdigit() else None
    for line in reversed(text.rstrip().splitlines()):
        prefix = f"{__name__}.DatasetError: "
        if line.startswith(prefix):
            message = line[len(prefix):]
            # our own __str__ added the worker suffix in the worker: drop it, it is re-added here
            if worker is not None and message.endswith(f" (DataLoader worker {worker})"):
                message = message[: -len(f" (DataLoader worker {worker})")]
            return message, worker
    return first, worker


class OptionError(TarprocError):
    """An argument given to the core is malformed (a bad size, slice or field spec).

    The CLI boundary reports these as usage errors (exit status 2).
    """


class MediaError(TarprocError):
    """Data that should be audio or video could not be read: damaged, cut short, or not media at all."""


class ParameterError(OptionError, TypeError):
    """A keyword an object doesn't take, with where it belongs when it is another object's
    (``AugmentSpec(image=...)``: the Dataset's). A ``TypeError`` too, as Python's own is."""


class MissingDependencyError(OptionError):
    """An optional dependency a feature needs is not installed; the message says what to install."""


class TarprocWarning(UserWarning):
    """Base class of the warnings the core gives (through ``warnings.warn``, see ``warn``).

    A training script filters them as any other warning, by class::

        warnings.filterwarnings("ignore", category=tarproc.NetworkWarning)   # retries are expected here
        warnings.filterwarnings("error", category=tarproc.DataWarning)       # no damaged sample goes by
        logging.captureWarnings(True)                                        # or route them to logging
    """


class DataWarning(TarprocWarning):
    """Data damaged, duplicated, skipped or lost: a sample or shard skipped (``on_error="skip"``,
    ``"skip-shard"``), a duplicate field, a stale index, the samples an epoch left out."""


class NetworkWarning(TarprocWarning):
    """A remote read that is retried (a reset, a timeout, a 5xx answer, a read too slow), a server
    that ignores range requests, a sender or receiver that hung up."""


class CacheWarning(TarprocWarning):
    """The shard cache or the counts' cache: a copy changed on the server or failing its manifest's
    sha256, a cache that can't be written (the readers then read the store)."""


def warn(message: str, category: type[TarprocWarning] = TarprocWarning, stacklevel: int = 2) -> None:
    """Give a warning of the core: ``warnings.warn(message, category)``, shown every time it comes.

    The one way the library warns (only ``tarproc.cli`` prints): a script sees Python's usual
    ``FILE:LINE: DataWarning: MESSAGE`` on stderr and can filter or route it by class; the commands
    print ``COMMAND: warning: MESSAGE``. ``stacklevel`` as ``warnings.warn``'s, counted from the
    caller. Python's default action shows a message once per place; each of these says something
    that happened (a retry, a skipped shard), so each is shown, as the one line per warning the core
    printed before it used the ``warnings`` module: no registry of warnings already shown is kept
    (filters that ignore, raise, or show ``"once"`` work as they do for any warning).

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     for _ in range(2):
    ...         warn("s.tar: sample 'k1' skipped", DataWarning)
    >>> [(w.category.__name__, str(w.message)) for w in caught]
    [('DataWarning', "s.tar: sample 'k1' skipped"), ('DataWarning', "s.tar: sample 'k1' skipped")]
    """
    try:
        frame = sys._getframe(stacklevel)
    except ValueError:  # fewer frames than that: Python's own choice
        warnings.warn(message, category, stacklevel=1)
        return
    where = frame.f_globals
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=where.get("__name__", "<string>"), registry={}, module_globals=where)


def warner(callback: Callable[[str], None] | None,
           category: type[TarprocWarning] = TarprocWarning) -> Callable[[str], None]:
    """Where the warnings of a function with a public ``warn=`` parameter go: the caller's
    ``callback`` where one is given (it counts them, shows them, collects them for a report), else
    ``warn(message, category)``. The result pickles (a worker process may be handed it).

    >>> said = []
    >>> warner(said.append, DataWarning)("s.tar: sample 'k1' skipped"); said
    ["s.tar: sample 'k1' skipped"]
    """
    if callback is not None:
        return callback
    return functools.partial(warn, category=category, stacklevel=1)  # stacklevel 1: the line that says it


def warnings_setup() -> tuple[list[Any], Any] | None:
    """How this process shows warnings (its filters and ``warnings.showwarning``), for a worker
    process it starts: ``adopt_warnings_setup(it)`` in the worker shows them alike. A forked
    worker has them already; a spawned one starts with Python's defaults, and a command's warnings
    would come out in Python's two-line format. None where the setup doesn't pickle."""
    setup = (list(warnings.filters), warnings.showwarning)
    try:
        pickle.dumps(setup)
    except Exception:  # noqa: BLE001 - a hook of the caller's that can't travel: the worker keeps its own
        return None
    return setup


def adopt_warnings_setup(setup: tuple[list[Any], Any] | None) -> None:
    """In a worker process: show warnings as the process that started it does (``warnings_setup``)."""
    if setup is None:
        return
    filters, show = setup
    warnings.filters[:] = filters  # type: ignore[index]  # a list (typeshed says Sequence)
    mutated = getattr(warnings, "_filters_mutated", None)  # resets the caches of warnings already seen
    if mutated is not None:
        mutated()
    warnings.showwarning = show


def warn_stderr(message: str) -> None:
    """The readers' old default ``warn`` callback (kept under its old name): a ``DataWarning``."""
    warn(message, DataWarning)
