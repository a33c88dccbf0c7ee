"""Where a job stands, from its journal: which shards of the SPEC are done, failed or missing.

A shard is *done* when the journal has an ``ok`` record of it (of the job's command, when given),
*failed* when it has only records that are not ``ok`` (every retry spent, or the run stopped
between two attempts), and *missing* when it has none: never run, running now, or stopped before
its attempt ended (Ctrl-C, ``scancel``, a deleted pod record nothing). The shards to run again
are the failed and the missing ones, given as shard numbers of the SPEC: what ``--only`` takes.

Shards are matched by id, not by the records' ``index`` (a job of ``--only`` some shards numbers
them its own way on Kubernetes).

>>> records = [{"shard": "a", "status": "failed", "exit_code": 3}, {"shard": "b", "status": "ok"},
...            {"shard": "a", "status": "failed", "exit_code": 3}]
>>> status = job_status(["a", "b", "c"], records)
>>> [(s.shard, s.state, s.attempts) for s in status.shards]
[('a', 'failed', 2), ('b', 'done', 1), ('c', 'missing', 0)]
>>> status.rerun
[0, 2]
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .run import Attempt

STATES = ("done", "failed", "missing")


@dataclass
class ShardStatus:
    """One shard of the SPEC (number ``index``): its state, its attempts, its last record."""

    index: int
    shard: str
    state: str  # done, failed, missing
    attempts: int = 0
    last: dict[str, Any] | None = None


@dataclass
class JobStatus:
    shards: list[ShardStatus]
    commands: set[str] = field(default_factory=set)  # the commands of the records counted

    def indexes(self, state: str) -> list[int]:
        return [s.index for s in self.shards if s.state == state]

    def count(self, state: str) -> int:
        return sum(1 for s in self.shards if s.state == state)

    @property
    def rerun(self) -> list[int]:
        """The shard numbers to run again: failed and missing."""
        return [s.index for s in self.shards if s.state != "done"]


def job_status(ids: list[str], records: Iterable[dict[str, Any]], command: str | None = None,
               numbers: list[int] | None = None) -> JobStatus:
    """The state of each shard ``ids[i]`` for ``i`` in ``numbers`` (default: all), from journal
    ``records`` (those of ``command`` only, when given)."""
    wanted = range(len(ids)) if numbers is None else numbers
    by_id = {ids[i]: ShardStatus(i, ids[i], "missing") for i in wanted}
    commands: set[str] = set()
    for record in records:
        shard = by_id.get(record["shard"])
        if shard is None or (command is not None and record.get("command") != command):
            continue
        commands.add(str(record.get("command")))
        shard.attempts += 1
        if shard.state != "done":  # the last record, or the first ok one
            shard.last = record
            shard.state = "done" if record["status"] == "ok" else "failed"
    return JobStatus(sorted(by_id.values(), key=lambda s: s.index), commands)


def describe(shard: ShardStatus) -> str:
    """What became of a failed shard's last attempt: ``exited with status 3 (2 attempts, last on
    node-1 at 2026-11-21T02:31:07Z)``."""
    last = shard.last or {}
    attempt = Attempt(str(last.get("status")), last.get("exit_code"), 0.0, "", "", str(last.get("output_tail") or ""))
    where = [f"{shard.attempts} attempt{'s' if shard.attempts != 1 else ''}"]
    if last.get("host"):
        where.append(f"last on {last['host']}" + (f" at {last['start']}" if last.get("start") else ""))
    return f"{attempt.reason()} ({', '.join(where)})"
