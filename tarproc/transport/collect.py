"""Received batches written as a tar (tarrecv -o), each acknowledged once it is written.

A batch is acknowledged only after its samples have gone to the output (written to the file
descriptor: a receiver SIGKILLed afterwards has not lost them). To a local, uncompressed tar
file the output is resumable: it grows as ``NAME.part``, and after each batch a small state
file, ``NAME.part.json``, records how many bytes of it are whole and which batches they hold.
A receiver that is killed and started again with the same output cuts the ``.part`` back to
what the state says, and goes on appending: the batches it had not acknowledged come again
(marked as redelivered) and are written once; those it had are dropped. At the end of the
stream ``NAME.part`` is renamed ``NAME``. Stopping early any other way (an error, Ctrl-C)
also keeps both files, and says so: the senders have forgotten what was acknowledged.

Other outputs (stdout, a remote URL, a compressed file) are written as one stream and are not
resumable; their batches are acknowledged once written all the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import SinkError
from ..samples import Sample
from ..sinks import local_path, open_sink, write_atomically
from ..tar import TarWriter, ends_at_member
from .receiver import Receiver
from .wire import Batch

STATE_FORMAT = "tarrecv-part"
_SENDER = re.compile(r".+/\d{1,18}")  # a state's ``taken`` keys: GROUP/RANK
TAKEN_KEPT = 1024  # batch numbers per sender kept in the state: more than can wait unacknowledged


def resumable(output: str) -> bool:
    """Whether ``output`` can be resumed: a local file whose name says plain tar."""
    return output != "-" and local_path(output) is not None and output.endswith(".tar")


def check_output(output: str) -> None:
    """Refuse, before anything is received, a resumable output whose ``.part`` state is unusable."""
    path = local_path(output)
    if resumable(output) and path is not None:
        _load_state(f"{path}.part.json", f"{path}.part")


def write_received(
    receiver: Receiver,
    batches: Iterable[Batch],
    output: str,
    samples_of: Callable[[Batch], Iterator[Sample]],
    *,
    tar: dict[str, Any],
    force: bool = False,
    say: Callable[[str], None],
    check: Callable[[], None] = lambda: None,
) -> TarWriter:
    """Write the samples of ``batches`` (``samples_of(batch)``) to ``output``, acknowledging each
    batch once written; ``check`` runs after the last one (it raises to refuse the whole)."""
    if resumable(output):
        return _write_resumable(receiver, batches, output, samples_of, tar, say, check)
    with open_sink(output, force=force) as sink:
        writer = TarWriter(sink, **tar)
        for batch in batches:
            for sample in samples_of(batch):
                writer.write_sample(sample)
            writer.flush()
            receiver.ack(batch)
        check()
        writer.close()
    receiver.ack_end()  # the output is complete: the senders may go
    return writer


def _write_resumable(
    receiver: Receiver, batches: Iterable[Batch], output: str, samples_of: Callable[[Batch], Iterator[Sample]],
    tar: dict[str, Any], say: Callable[[str], None], check: Callable[[], None],
) -> TarWriter:
    path = local_path(output)
    assert path is not None
    part, state_path = f"{path}.part", f"{path}.part.json"
    state = _load_state(state_path, part)
    try:
        # buffered: its write writes everything or raises (a raw file's may write less)
        fh = open(part, "r+b" if state is not None else "wb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise SinkError(f"cannot write there: {e.strerror}", part) from None
    writer = TarWriter(fh, **tar)
    taken: dict[str, list[int]] = {}
    if state is not None:
        fh.truncate(state["offset"])
        fh.seek(state["offset"])
        writer.offset, writer.members, writer.samples = state["offset"], state["members"], state["samples"]
        writer.last_key = state["last_key"]
        taken = state["taken"]
        for sender, seqs in taken.items():
            group, rank = sender.rsplit("/", 1)
            receiver.taken(group, int(rank), seqs)
        say(f"resuming {part}: {writer.samples} samples ({writer.offset} bytes) were received before")
    finished = False
    try:
        for batch in batches:
            for sample in samples_of(batch):
                writer.write_sample(sample)
            writer.flush()
            fh.flush()  # in the file (the kernel's) before the state says so
            key = f"{batch.group}/{batch.rank}"
            seqs = taken.setdefault(key, [])
            seqs.append(batch.seq)
            del seqs[:-TAKEN_KEPT]
            write_atomically(state_path, json.dumps({
                "format": STATE_FORMAT, "offset": writer.offset, "members": writer.members,
                "samples": writer.samples, "last_key": writer.last_key, "taken": taken}))
            receiver.ack(batch)
        check()
        writer.close()
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        os.replace(part, path)
        with contextlib.suppress(FileNotFoundError):  # none written: a stream of no batch
            os.unlink(state_path)
        finished = True
        receiver.ack_end()  # only now: killed before, a restarted receiver is told the end again
        return writer
    finally:
        if not finished:
            fh.close()
            if writer.samples:
                say(f"stopped before the end of the stream: the {writer.samples} samples received are kept in "
                    f"{part}; run the same command to receive the rest, or remove {part} and {state_path}")
            else:
                for name in (part, state_path):
                    try:
                        os.unlink(name)
                    except OSError:
                        pass


def _load_state(state_path: str, part: str) -> dict[str, Any] | None:
    """The state of a ``.part`` left by an earlier receiver (None: start afresh)."""
    try:
        with open(state_path) as f:
            state = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        detail = (f"not JSON at line {e.lineno}, column {e.colno}" if isinstance(e, json.JSONDecodeError)
                  else "nested too deep" if isinstance(e, RecursionError) else str(e))
        raise SinkError(f"cannot read the state of {part} ({detail}); remove it and {part} to start afresh",
                        state_path) from None
    try:
        size = os.path.getsize(part)
    except OSError:
        whole = part[: -len(".part")]
        if os.path.exists(whole):
            raise SinkError(f"{whole} was received whole by an earlier run, stopped as it finished; this state is "
                            "left over from it: remove it", state_path) from None
        raise SinkError(f"{part} is missing: remove {state_path} to start afresh", state_path) from None
    ok = (isinstance(state, dict) and state.get("format") == STATE_FORMAT
          and all(type(state.get(k)) is int and state[k] >= 0 for k in ("offset", "members", "samples"))
          and isinstance(state.get("taken"), dict)
          and all(_SENDER.fullmatch(k) for k in state["taken"])
          and all(isinstance(v, list) and all(type(s) is int and 0 <= s < 1 << 63 for s in v)
                  for v in state["taken"].values())
          and (state.get("last_key") is None or isinstance(state["last_key"], str)))
    if not ok:
        raise SinkError(f"not a tarrecv state file; remove it and {part} to start afresh", state_path)
    if state["offset"] > size or state["offset"] % 512:
        raise SinkError(f"{part} is {size} bytes, shorter than the {state['offset']} its state says are received; "
                        f"remove both to start afresh", state_path)
    with open(part, "rb") as f:
        if not ends_at_member(f, state["offset"]):
            raise SinkError(f"byte {state['offset']}, where the state says the samples received end, is not the end "
                            f"of a member of {part}: remove both to start afresh", state_path)
    return state  # type: ignore[no-any-return]

