"""The journal: one JSON line per attempt of a shard's command, appended whole.

Several writers may share it (Kubernetes pods or Slurm array tasks on a shared file system, each
running ``tarjob --index``): every record is one ``write`` to a file opened with ``O_APPEND``, so
lines never interleave. A writer that crashed mid-line leaves a truncated record; reading tolerates
it with a warning (the next append starts on a new line), any other bad line is an error.

A record::

    {"shard": "0007", "index": 7, "status": "failed", "attempt": 1, "seconds": 0.52,
     "host": "node-3", "exit_code": 4, "output_tail": "...", "start": "2026-11-21T21:50:00Z",
     "engine": "local", "command": "tarproc -c ... in-{}.tar -o out-{}.tar"}

A shard is done when it has an ``ok`` record of the same ``command``: two jobs over the same ids
(``{0000..0999}``) that share a journal don't skip each other's shards.

``status`` is ok, failed (non-zero exit), timeout (killed after --command-timeout), killed (a signal, or
a Dask worker that died) or error (the command could not be started).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import TarprocError

DEFAULT_JOURNAL = "tarjob.jsonl"
STATUSES = ("ok", "failed", "timeout", "killed", "error")
_RECORD_START = '{"shard": '  # how every record we write begins: a line cut short still does


class JournalError(TarprocError):
    """The journal has a line that is not one of our records, or can't be read or written."""


class Journal:
    """Append-only attempt records in ``path`` (created on the first append)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._needs_newline = False

    def records(self, warn: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
        """The records read back; a truncated record is skipped with a warning."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as e:
            raise JournalError(f"cannot read the journal: {e.strerror}", self.path) from None
        self._needs_newline = bool(data) and not data.endswith(b"\n")
        lines = data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        for number, raw in enumerate(lines, 1):
            if not raw.strip():
                continue
            text = raw.decode("utf-8", "replace")
            try:
                record = json.loads(text)
            except ValueError:
                if text.startswith(_RECORD_START):
                    if warn is not None:
                        warn(f"{self.path}: line {number}: a truncated record (a writer stopped mid-line); ignoring it")
                    continue
                raise JournalError(f"line {number}: not a JSON record of tarjob", self.path) from None
            if not isinstance(record, dict) or not isinstance(record.get("shard"), str) \
                    or record.get("status") not in STATUSES:
                raise JournalError(f"line {number}: not a record of tarjob (needs 'shard' and 'status')", self.path)
            yield record

    def done(self, warn: Callable[[str], None] | None = None, command: str | None = None) -> set[str]:
        """Shard ids with an ``ok`` record (of ``command`` only, when given: the same ids done by
        another job that shares the journal don't count)."""
        return {r["shard"] for r in self.records(warn)
                if r["status"] == "ok" and (command is None or r.get("command") == command)}

    def open(self) -> int:
        """Open the journal for appending now (an unwritable journal fails before any work)."""
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
                size = os.fstat(self._fd).st_size
                if size:
                    with open(self.path, "rb") as f:
                        f.seek(size - 1)
                        self._needs_newline = f.read(1) != b"\n"
            except OSError as e:
                raise JournalError(f"cannot write the journal: {e.strerror}", self.path) from None
        return self._fd

    def append(self, record: dict[str, Any]) -> None:
        """Append one record as one write (whole line, flushed to the file)."""
        line = json.dumps(record, ensure_ascii=False) + "\n"
        fd = self.open()
        if self._needs_newline:  # after a truncated record: ours starts on a line of its own
            line = "\n" + line
            self._needs_newline = False
        data = line.encode("utf-8")
        try:
            written = os.write(fd, data)
        except OSError as e:
            raise JournalError(f"cannot write the journal: {e.strerror}", self.path) from None
        if written != len(data):
            raise JournalError(f"short write ({written} of {len(data)} bytes)", self.path)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
