"""``tarshow --serve --summary``: the summary of every sample, run beside the viewer.

``BackgroundSummary`` reads the shards once, in order, on one thread of its own (the page handlers
never wait for it), as ``tarshow --summary`` does (``tarproc.show.Summary``, with ``--decode`` its
decode check in ``-p`` processes), and keeps what the viewer's problems panel shows: each kind of
problem with its count, a few examples (where each is, why, and the ``tarfirst`` command that
pulls it out), and how far it has got. ``snapshot()`` is that as a JSON-ready document, for
``/api/problems``.

Problems are listed as they are found (``Summary``'s observer). Two kinds can only be decided at
the end: a field most samples have, and labels that are not integers where most are. They are
listed while running as *tentative*; at the end every kind is replaced by the summary's own
totals, the same as ``tarshow --summary`` prints. A shard that can't be read is a problem, listed
at once; the summary goes on with the next. ``stop()`` ends it between two members and stops its
decode processes. Memory is the summary's own (``tarproc.show``) plus ``EXAMPLES`` examples per
kind and ``MAX_SHARD_ERRORS`` unreadable shards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..content import DECODE_SHOWN, PROBLEMS, plural, tarfirst_command
from ..errors import OptionError, TarprocError
from ..show import EXAMPLES, NO_SAMPLES, Summary, no_samples
from ..tar import ReadPolicy

STOP_WAIT = 30.0  # seconds a stop waits for the summary's thread (a member being read, decodes in flight)
MAX_SHARD_ERRORS = 100  # unreadable shards listed one by one; the rest are counted
SUMMARY_NOTE = "only the samples viewed are checked: tarshow SHARDS --serve --summary checks every sample"
TENTATIVE = frozenset({"missing", "non_integer_labels"})  # decided by the whole stream, at the end


@dataclass(frozen=True)
class SummaryOptions:
    """How the background summary reads: as ``tarshow --summary`` with these options.

    Args:
        decode: also decode every image, audio and video field, in this many processes
            (``--decode -p N``); None: headers only.
        content: what the fields hold too (False: sizes and names only, ``--bytes-only``).
        policy: how the shards are read (``ReadPolicy``); a shard that can't be read is listed
            as a problem whatever its ``on_error``.
    """

    decode: int | None = None
    content: bool = True
    policy: ReadPolicy = field(default_factory=ReadPolicy)

    def __post_init__(self) -> None:
        if self.decode is not None and (isinstance(self.decode, bool) or not isinstance(self.decode, int)
                                        or self.decode < 1):
            raise OptionError(f"decode={self.decode!r}: the number of decoding processes, at least 1 (or None)")
        if self.decode is not None and not self.content:
            raise OptionError("decoding the fields needs the content statistics: content=True")


class _Stopped(Exception):
    """Raised between two members once a stop is asked for: it ends the read of the shard."""


class BackgroundSummary:
    """The summary of ``urls`` on a thread of its own; ``snapshot()`` says what it has found so far.

    Args:
        urls: the shards, in the viewer's order (an example's ``shard`` is a number in this list).
        options: how to read them (``SummaryOptions``).
        log: where one line goes when the summary itself fails (a bug: it is listed too).
    """

    def __init__(self, urls: list[str], options: SummaryOptions | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.urls = list(urls)
        self.options = options if options is not None else SummaryOptions()
        self.log = log
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.shard_numbers: dict[str, int] = {}
        for i, url in enumerate(self.urls):
            self.shard_numbers.setdefault(url, i)
        # what the panel shows, under lock
        self.state = "waiting"  # running, done, stopped, failed
        self.shards_checked = 0
        self.samples = 0  # exact at the end of each shard, counted by key changes in between
        self.current: int | None = None  # the shard being read
        self.live: dict[tuple[str, str | None], dict[str, Any]] = {}  # (kind, field) -> kind, while running
        self.missing_seen: dict[str, list[dict[str, Any]]] = {}  # field -> samples without it (with their shard)
        self.shard_errors: list[dict[str, Any]] = []
        self.shard_error_count = 0
        self.final: list[dict[str, Any]] | None = None
        self.lines: list[str] = []  # the summary's problems, one line per kind (as --strict names them)
        self.note: str | None = None  # why audio and video were not decoded
        self.failure: str | None = None  # why the summary itself stopped (a bug), listed last
        self._base = 0  # samples before the shard being read

    # -- running --

    def start(self) -> None:
        """Start the thread (once)."""
        if self.thread is not None:
            return
        with self.lock:
            self.state = "running"
        self.thread = threading.Thread(target=self._run, daemon=True, name="tarshow-summary")
        self.thread.start()

    def stop(self, wait: float | None = STOP_WAIT) -> bool:
        """Ask the summary to stop and wait up to ``wait`` seconds for its thread (and its decode
        processes) to end; whether it has."""
        self.stopping.set()
        thread = self.thread
        if thread is None:
            return True
        thread.join(wait)
        return not thread.is_alive()

    def _run(self) -> None:
        summary: Summary | None = None
        try:
            opts = self.options
            summary = Summary(content=opts.content, decode=opts.decode, observer=self._observe)
            for i, url in enumerate(self.urls):
                if self.stopping.is_set():
                    raise _Stopped
                with self.lock:
                    self.current = i
                self._base = summary.samples
                try:
                    summary.add_shard(url, policy=opts.policy, wrap=self._members)
                except TarprocError as e:  # recorded by the summary too: listed now, and on with the next
                    self._shard_failed(i, str(e))
                with self.lock:
                    self.shards_checked = i + 1
                    self.samples = summary.samples
            summary.finish()  # waits for the decode checks
            doc = summary.as_dict()
            decode = summary.content.decode if summary.content is not None else None
            final = self._kinds_of(doc)
            with self.lock:
                self.final, self.lines = final, list(doc["problems"])
                self.samples, self.current, self.state = doc["samples"], None, "done"
                self.note = decode.note if decode is not None else None
        except _Stopped:
            with self.lock:
                self.state, self.current = "stopped", None
        except Exception as e:  # noqa: BLE001 -- the viewer goes on: the failure is listed, not raised
            detail = str(e).splitlines()[0] if str(e) else ""
            message = f"the summary stopped: {type(e).__name__}" + (f": {detail}" if detail else "")
            if self.log is not None:
                self.log(f"tarshow: error: {message}")
            with self.lock:
                self.state, self.current, self.failure = "failed", None, message
        finally:
            if summary is not None:
                summary.close()  # the decode processes, if any are left (a stop, an error)

    def _members(self, members: Iterator[Any]) -> Iterable[Any]:
        """The members of one shard, passed on: samples counted (by key change) for the progress
        line, and a stop asked for ends the read here."""
        stopping = self.stopping
        last: str | None = None
        n = self._base
        for member in members:
            if stopping.is_set():
                raise _Stopped
            key = member[0]
            if key != last:
                last = key
                if key is not None:
                    n += 1
                    self.samples = n  # an int written whole: read without the lock
            yield member

    def _example(self, url: str | None, key: str | None, field: str | None, reason: str,
                 command: str | None) -> dict[str, Any]:
        return {"shard": None if url is None else self.shard_numbers.get(url), "url": url, "key": key,
                "field": field, "reason": reason, "command": command}

    def _observe(self, kind: str, url: str | None, key: str, field: str, reason: str, data: Any) -> None:
        """``Summary``'s observer: one problem of one sample, as it is found (``data`` is not kept)."""
        if kind == "missing":
            example = self._example(url, key, None, reason, tarfirst_command(url, key, None))
            title = f"samples without a {field} field, which most samples have"
        else:
            example = self._example(url, key, field, reason, tarfirst_command(url, key, field))
            title = PROBLEMS.get(kind, kind)
        where = (kind, field if kind == "missing" else None)
        with self.lock:
            entry = self.live.get(where)
            if entry is None:
                entry = self.live[where] = {"kind": kind, "field": where[1], "title": title, "count": 0,
                                            "tentative": kind in TENTATIVE, "command": None, "examples": []}
            entry["count"] += 1
            if len(entry["examples"]) < EXAMPLES:
                entry["examples"].append(example)
            if kind == "missing":
                seen = self.missing_seen.setdefault(field, [])
                if len(seen) < EXAMPLES:
                    seen.append(example)

    def _shard_failed(self, shard: int, message: str) -> None:
        with self.lock:
            self.shard_error_count += 1
            if len(self.shard_errors) < MAX_SHARD_ERRORS:
                self.shard_errors.append(self._example(self.urls[shard], None, None, message, None))

    # -- what the panel shows --

    def _errors_kind(self) -> dict[str, Any] | None:
        if not self.shard_error_count:
            return None
        return {"kind": "unreadable_shards", "field": None, "title": "damaged or unreadable shards",
                "count": self.shard_error_count, "tentative": False, "command": None,
                "examples": list(self.shard_errors)}

    def _kinds_of(self, doc: dict[str, Any]) -> list[dict[str, Any]]:
        """Every kind of problem of a finished summary's document (``Summary.as_dict``), in the
        order ``tarshow --summary`` prints them, each with its examples."""
        kinds: list[dict[str, Any]] = []

        def add(kind: str, title: str, count: int | None, examples: list[dict[str, Any]],
                field_name: str | None = None, command: str | None = None) -> None:
            kinds.append({"kind": kind, "field": field_name, "title": title, "count": count, "tentative": False,
                          "command": command, "examples": examples})

        if no_samples(doc):
            add("no_samples", NO_SAMPLES, None, [])
        for name, m in doc["missing"].items():
            with self.lock:
                seen = list(self.missing_seen.get(name, []))
            # the samples the observer heard of (their shard known), else the summary's keys
            examples = seen or [self._example(None, key, None, f"no {name} field", None) for key in m["examples"]]
            add("missing", f"samples without a {name} field, which most samples have", m["count"], examples,
                name, m["command"])
        if doc["rare_fields"]:
            add("rare_fields", "fields in under 10% of samples", sum(doc["rare_fields"].values()),
                [self._example(None, None, name, plural(n, "sample"), None) for name, n in doc["rare_fields"].items()])
        na = doc["non_adjacent_keys"]
        if na["count"]:
            add("non_adjacent_keys", "keys that reappear after other keys (tar made without --sort=name?)",
                na["count"], [self._example(
                    e["url"], e["key"], None, f"again at byte {e['offset']}"
                    + ("" if e["first_offset"] is None else f", first at byte {e['first_offset']}"),
                    tarfirst_command(e["url"], e["key"], None)) for e in na["examples"]])
        dup = doc["duplicate_fields"]
        if dup["count"]:
            add("duplicate_fields", "fields twice in one sample", dup["count"], [self._example(
                e["url"], e["key"], e["field"], f"at bytes {e['first_offset']} and {e['offset']}",
                tarfirst_command(e["url"], e["key"], e["field"])) for e in dup["examples"]])
        nk = doc["names_without_key"]
        if nk["count"]:
            add("names_without_key", "names without a key (no dot in the basename, or a leading dot)", nk["count"],
                [self._example(None, None, None, f"member {name!r}", None) for name in nk["examples"]])
        for s in doc["surprising_names"]:
            if not s["count"]:
                continue
            # the examples are KEY.FIELD names; the summary keeps the shard of the first only
            examples = [self._example(None, name[: -len(s["field"]) - 1], s["field"], s["reason"], None)
                        for name in s["examples"]]
            add("surprising_names", f"dotted names that split surprisingly: field {s['field']!r}", s["count"],
                examples, s["field"], s["command"])
        errors = self._errors_kind()
        if errors is not None:
            kinds.append(errors)
        content: dict[str, Any] = doc.get("content") or {}
        for name, p in content.get("problems", {}).items():
            listed = p["examples"]
            if name == "decode_failures" and content.get("decode"):  # every one, up to a bound
                listed = content["decode"]["failures"][:DECODE_SHOWN]
            add(name, PROBLEMS[name], p["count"], [
                self._example(e["url"], e["key"], e["field"], e["reason"], e["command"]) for e in listed])
        return kinds

    def snapshot(self) -> dict[str, Any]:
        """What the panel shows, JSON-ready: the state, the progress line, and the kinds of problem
        (``kinds``: title, count, ``tentative``, examples with ``shard``, ``key``, ``field``,
        ``reason`` and ``command``); once done, ``problems`` (one line per kind, as ``--strict``
        names them) and ``message``."""
        with self.lock:
            state, samples, checked, current = self.state, self.samples, self.shards_checked, self.current
            if self.final is not None:
                kinds = [dict(k, examples=list(k["examples"])) for k in self.final]
            else:
                kinds = [dict(k, examples=list(k["examples"])) for k in self.live.values()]
                errors = self._errors_kind()
                if errors is not None:
                    kinds.append(errors)
            lines, note, failure = list(self.lines), self.note, self.failure
        if failure is not None:  # what was found before it, and the failure
            kinds.append({"kind": "summary_failed", "field": None, "title": failure, "count": None,
                          "tentative": False, "command": None, "examples": []})
        total = len(self.urls)
        progress = f"checked {checked:,} of {plural(total, 'shard')}, {plural(samples, 'sample')}"
        message = None
        if state == "done":
            message = "no problems found" if not lines else f"{plural(len(lines), 'kind')} of problem found"
        elif state == "stopped":
            message = "stopped"
        elif state == "failed":
            message = failure
        return {
            "enabled": True, "state": state, "done": state in ("done", "stopped", "failed"),
            "decode": self.options.decode is not None, "shards": total, "shards_checked": checked,
            "samples": samples, "shard": current, "progress": progress, "kinds": kinds,
            "problems": lines, "message": message, "note": note,
        }


def disabled_snapshot() -> dict[str, Any]:
    """``/api/problems`` of a viewer started without ``--summary``."""
    return {"enabled": False, "note": SUMMARY_NOTE}


__all__ = ["SUMMARY_NOTE", "BackgroundSummary", "SummaryOptions", "disabled_snapshot"]
