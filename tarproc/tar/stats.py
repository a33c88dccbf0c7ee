"""``ReadStats``: the counters a read fills in, shared by the member reader and the sample grouper."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ReadStats:
    """Counters filled in while reading; shared by the members reader and the sample grouper."""

    def __init__(self) -> None:
        self.shards = 0
        self.shards_failed = 0
        self.members = 0  # regular-file members read
        self.bytes = 0  # member data bytes read
        self.samples = 0
        self.skipped_entries: dict[str, int] = {}  # non-regular entries by type
        self.metadata = 0  # __name__ members skipped
        self.no_key: list[str] = []  # first few names without a key
        self.no_key_count = 0
        self.duplicates = 0  # duplicate fields and reappearing keys (warn/skip modes)
        self.errors: list[str] = []  # messages of shards skipped with on_error="skip-shard"
        self.warn: Callable[[str], None] | None = None  # a callback for the reader's warnings (None: DataWarning)

    def skip_entry(self, kind: str) -> None:
        self.skipped_entries[kind] = self.skipped_entries.get(kind, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "shards": self.shards,
            "shards_failed": self.shards_failed,
            "samples": self.samples,
            "members": self.members,
            "bytes": self.bytes,
            "skipped_entries": dict(self.skipped_entries),
            "metadata_members": self.metadata,
            "names_without_key": self.no_key_count,
            "duplicates": self.duplicates,
        }
