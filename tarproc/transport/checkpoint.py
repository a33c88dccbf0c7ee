"""tarserve's checkpoint file: where each sender's stream is, as its receivers acknowledged it.

A restarted tarserve given the same file (``--checkpoint``) goes on where the last one was:
the same group and ranks (so receivers take it for the same senders), each rank from the first
batch not acknowledged, leaving out the later ones that were. The stream is regenerated exactly
(shard order, shuffles and batches come from the seed), so the batches keep their numbers, and
a receiver drops any it had already taken. The file says which options made the stream: a
restart with other options is refused.

The file is JSON, replaced atomically (written aside, then renamed) as acknowledgements come in::

    {"format": "tarserve-checkpoint", "version": 1, "group": "…", "done": false,
     "stream": {options that shape the stream},
     "ranks": {"0": {"next": 17, "above": [[19, {position after 19}]], "resend": 33,
                     "pos": {"epoch": 0, "batch": 17, "sample": 1088, "sent": 1088, "shard": "a.tar", "index": 63}}}}

``next``: every batch before it is acknowledged; ``above``: later ones that are too, with the
positions after them; ``pos``: where the stream is after batch ``next - 1`` (``null``: at the
start); ``resend``: the sender had sent nothing from this batch on (it saves before it does),
so after a restart the batches before it go out marked as sent again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import OptionError, TarprocError
from ..sinks import write_atomically
from .delivery import Progress as RankState  # where a rank's sender resumes: what it last reported

FORMAT = "tarserve-checkpoint"
VERSION = 1


class CheckpointError(TarprocError):
    """A checkpoint file that can't be read, or doesn't belong to this stream."""


@dataclass
class Checkpoint:
    path: str
    group: str
    stream: dict[str, Any]
    ranks: dict[int, RankState] = field(default_factory=dict)
    done: bool = False

    def save(self) -> None:
        """Replace the file atomically: a reader (or a restart) sees the old one or the new one."""
        data = {"format": FORMAT, "version": VERSION, "group": self.group, "done": self.done,
                "stream": self.stream, "ranks": {str(r): s.as_json() for r, s in sorted(self.ranks.items())}}
        write_atomically(self.path, json.dumps(data, indent=1) + "\n")


def saved_seed(path: str) -> int | None:
    """The seed of the stream saved in ``path``, if it can be read (else None: ``load`` says why)."""
    try:
        with open(path) as f:
            seed = json.load(f)["stream"]["seed"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    return seed if type(seed) is int else None


def load(path: str, stream: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint in ``path`` (None when there is no file), checked against this ``stream``."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise CheckpointError(f"cannot read the checkpoint: {e.strerror}", path) from None
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError("not a tarserve checkpoint")
        if data.get("version") != VERSION:
            raise ValueError(f"checkpoint version {data.get('version')!r} (this tarserve reads version {VERSION})")
        group = data["group"]
        if not isinstance(group, str) or not group or len(group) > 200 or not group.isprintable():
            raise ValueError("bad group id")
        ranks: dict[int, RankState] = {}
        if not isinstance(data["ranks"], dict):
            raise ValueError("bad ranks")
        for rank, state in data["ranks"].items():
            if not (rank.isdigit() and len(rank) <= 6) or not isinstance(state, dict):
                raise ValueError(f"bad rank {rank[:20]!r}")
            above, pos, resend = state["above"], state["pos"], state["resend"]
            if (not _count(state["next"]) or not _count(resend) or not isinstance(above, list)
                    or not all(isinstance(a, list) and len(a) == 2 and _count(a[0]) and _position(a[1]) for a in above)
                    or not _position(pos)):
                raise ValueError(f"bad state of rank {rank}")
            ranks[int(rank)] = RankState(state["next"], {seq: p for seq, p in above}, pos, resend)
        saved_stream = data["stream"]
        if not isinstance(saved_stream, dict):
            raise ValueError("bad stream")
        done = data["done"] is True
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        if isinstance(e, json.JSONDecodeError):
            detail = f"not JSON at line {e.lineno}, column {e.colno}"
        elif isinstance(e, RecursionError):
            detail = "nested too deep"
        else:
            detail = str(e) if isinstance(e, ValueError) else "malformed"
        raise CheckpointError(f"not a usable tarserve checkpoint ({detail}); remove it to start over", path) from None
    if saved_stream != stream:
        changed = sorted(k for k in set(saved_stream) | set(stream) if saved_stream.get(k) != stream.get(k))
        raise OptionError(f"{path}: the checkpoint is of a stream made with other options ({', '.join(changed)}); "
                          "give the same inputs and options, or remove it to start over")
    return Checkpoint(path, group, stream, ranks, done)


_POSITION = {"epoch": int, "batch": int, "sample": int, "sent": int, "shard": str, "index": int}


def _position(value: Any) -> bool:
    """None, or a position as serve.py writes them: these fields, counts where numbers."""
    if value is None:
        return True
    return (isinstance(value, dict) and set(value) == set(_POSITION)
            and all(isinstance(value[k], kind) and (kind is str or _count(value[k])) for k, kind in _POSITION.items()))


def _count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 1 << 63
