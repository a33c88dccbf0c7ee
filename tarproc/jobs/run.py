"""Running shard commands: one attempt, retries with backoff, and the loop over an engine.

An *engine* runs attempts somewhere (``LocalPool``: threads here, each waiting on a process;
``DaskEngine``: tasks on a Dask cluster) and hands back ``Attempt`` results. ``run_shards`` keeps
the engine busy, retries failed attempts after an exponential backoff, writes each attempt to the
journal (only this process writes it) and yields one ``ShardResult`` per finished shard.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import heapq
import itertools
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import TarprocError
from ..procgroup import signal_group, start_group
from .journal import Journal
from .spec import shard_argv

TAIL_BYTES = 2048
# What a stopped command (Ctrl-C, SIGTERM, scancel) gets: SIGTERM to its process group, then
# SIGKILL to what is left after this many seconds. A writer stopped so removes its temporary files
# (tarproc, tarsplit ...) instead of leaving them behind. Slurm's KillWait and Kubernetes' grace
# period are 30 s by default: well within them.
STOP_GRACE = 5.0


class JobsFailed(TarprocError):
    """Some shards failed after all their attempts (the message lists them)."""


@dataclass(frozen=True)
class Task:
    """One attempt to run: shard ``shard`` (number ``index`` of the SPEC), attempt 1, 2, ..."""

    shard: str
    index: int
    attempt: int
    argv: tuple[str, ...]


@dataclass
class Attempt:
    """What one attempt did (picklable: Dask workers send it back)."""

    status: str  # ok, failed, timeout, killed, error
    exit_code: int | None
    seconds: float
    host: str
    start: str
    output_tail: str

    def reason(self, timeout: float | None = None) -> str:
        if self.status == "timeout":
            return f"timed out after {timeout:g} s" if timeout else "timed out"
        if self.status == "killed" and self.exit_code is None:
            return "lost its Dask worker (it died)"
        if self.exit_code is not None and self.exit_code < 0:
            return f"was killed by signal {-self.exit_code}"
        if self.status == "error":
            return f"could not start: {self.output_tail.strip()}"
        return f"exited with status {self.exit_code}"


@dataclass
class ShardResult:
    shard: str
    index: int
    ok: bool
    attempts: int
    last: Attempt


@dataclass
class JobOptions:
    command: list[str]
    shell: bool = False
    retries: int = 0
    backoff: float = 5.0
    timeout: float | None = None
    log_dir: str | None = None

    @property
    def command_text(self) -> str:
        """The command as one line (the journal's ``command``: what makes a shard done)."""
        return shlex.join(self.command)

    def task(self, shard: str, index: int, attempt: int = 1) -> Task:
        return Task(shard, index, attempt, tuple(shard_argv(self.command, shard, self.shell)))

    def delay(self, attempt: int) -> float:
        """Seconds to wait before attempt ``attempt + 1``: backoff, 2 x backoff, 4 x ..."""
        return float(self.backoff * 2 ** (attempt - 1))


# ---------------------------------------------------------------------------------------------
# one attempt


def now_iso() -> str:
    """The time now in UTC, as the journal writes it (ISO 8601, microseconds, ``Z``)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _tail(f: Any, limit: int = TAIL_BYTES) -> str:
    size = os.fstat(f.fileno()).st_size
    f.seek(max(0, size - limit))
    data = f.read()
    return str(data.decode("utf-8", "replace"))


def _log_name(shard: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in shard).strip(".") or "shard"
    return safe + ".log"


def _die_with(parent: int) -> Callable[[], None]:
    """What the child runs between fork and exec: SIGTERM it (the keeper below) when the thread
    that started it dies (a Dask worker killed hard, or closed)."""
    try:  # looked up here: an import in the child could wait forever on a lock another thread held
        import ctypes

        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        prctl = None

    def arm() -> None:  # pragma: no cover - runs in the child
        if prctl is not None:
            prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the parent died before prctl: nobody would send the signal
            os._exit(128 + signal.SIGTERM)

    return arm


# The parent-death signal reaches one process only, not what the command started (a shell's
# children, tarproc's pool): so a keeper leads the process group, runs the command in it, and on
# that signal kills the whole group. It exits as the command did (re-raising a fatal signal).
_KEEPER = """\
import os, signal, sys
signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
try:
    pid = os.posix_spawnp(sys.argv[1], sys.argv[1:], os.environ)
except OSError as e:
    sys.stderr.write(f"{sys.argv[1]}: {e.strerror}\\n")
    sys.exit(127)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
if code < 0:
    try:
        signal.signal(-code, signal.SIG_DFL)
    except (OSError, ValueError):  # SIGKILL, SIGSTOP: no handler to reset
        pass
    os.kill(os.getpid(), -code)
    code = 128 - code
sys.exit(code)
"""


def _kept(argv: list[str] | tuple[str, ...]) -> list[str]:
    """``argv`` run under the keeper (a second Python process: only where workers may die)."""
    return [sys.executable, "-I", "-S", "-c", _KEEPER, *argv]


class LiveSet:
    """Process groups running now, so that a stop can kill them all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pids: set[int] = set()
        self.stopped = False

    def add(self, pid: int) -> bool:
        with self._lock:
            self._pids.add(pid)
            return not self.stopped

    def discard(self, pid: int) -> None:
        with self._lock:
            self._pids.discard(pid)

    def kill_all(self, grace: float = STOP_GRACE) -> None:
        """Stop them all: SIGTERM to each group, SIGKILL to what is left after ``grace`` seconds
        (a thread waiting on a command forgets it once it ended, see ``run_attempt``)."""
        with self._lock:
            self.stopped = True
            pids = set(self._pids)
        for pid in pids:
            signal_group(pid, signal.SIGTERM)
        try:
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                with self._lock:
                    if not pids & self._pids:
                        break
                time.sleep(0.02)
        finally:  # a second Ctrl-C cuts the wait short, not the kill
            with self._lock:
                for pid in pids & self._pids:
                    signal_group(pid)


def run_attempt(
    argv: list[str] | tuple[str, ...],
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    log_path: str | None = None,
    live: LiveSet | None = None,
    die_with_parent: bool = False,
) -> Attempt:
    """Run one command in its own process group; its stdout and stderr go to ``log_path`` (or a
    temporary file) and the last 2 KB of them into the result. On timeout (and always when it
    ends) the whole group is killed, so nothing it started outlives it."""
    start, t0 = now_iso(), time.monotonic()
    host = socket.gethostname()
    try:
        log = open(log_path, "w+b") if log_path else tempfile.TemporaryFile()  # noqa: SIM115
    except OSError as e:
        return Attempt("error", None, 0.0, host, start, f"cannot write the log {log_path}: {e.strerror}")
    with log:
        try:
            proc = start_group(
                _kept(argv) if die_with_parent else list(argv), stdin=subprocess.DEVNULL, stdout=log,
                stderr=log, env={**os.environ, **(env or {})},
                preexec_fn=_die_with(os.getpid()) if die_with_parent else None,
            )
        except OSError as e:
            detail = f"{argv[0]}: {e.strerror}"
            return Attempt("error", 127, time.monotonic() - t0, host, start, detail)
        if live is not None and not live.add(proc.pid):
            signal_group(proc.pid)
        timed_out = False
        try:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            signal_group(proc.pid)  # what it left running in the background
            code = proc.wait()
        finally:
            if proc.returncode is None:  # interrupted while waiting
                signal_group(proc.pid)
                proc.wait()
            if live is not None:
                live.discard(proc.pid)
        seconds = time.monotonic() - t0
        tail = _tail(log)
    if timed_out:
        status = "timeout"
    elif code == 0:
        status = "ok"
    elif code < 0:
        status = "killed"
    else:
        status = "failed"
    return Attempt(status, code, round(seconds, 4), host, start, tail)


def task_env(task: Task) -> dict[str, str]:
    """What the command finds in its environment about its shard."""
    return {"TARJOB_SHARD": task.shard, "TARJOB_INDEX": str(task.index), "TARJOB_ATTEMPT": str(task.attempt)}


def run_task(task: Task, options: JobOptions, live: LiveSet | None = None, die_with_parent: bool = False) -> Attempt:
    """One attempt of ``task`` as ``options`` say (the function Dask workers run)."""
    log_path = os.path.join(options.log_dir, _log_name(task.shard)) if options.log_dir else None
    return run_attempt(task.argv, task_env(task), options.timeout, log_path, live, die_with_parent)


# ---------------------------------------------------------------------------------------------
# engines


class Engine(Protocol):
    name: str
    capacity: int  # attempts in flight at once

    def submit(self, task: Task) -> None: ...

    def wait(self, timeout: float | None) -> list[tuple[Task, Attempt]]: ...

    def close(self, cancel: bool) -> None: ...


class LocalPool:
    """``workers`` commands at a time on this machine (threads, each waiting on its process)."""

    name = "local"

    def __init__(self, options: JobOptions, workers: int) -> None:
        self.options = options
        self.capacity = workers
        self._live = LiveSet()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tarjob")
        self._futures: dict[concurrent.futures.Future[Attempt], Task] = {}

    def submit(self, task: Task) -> None:
        self._futures[self._pool.submit(run_task, task, self.options, self._live)] = task

    def wait(self, timeout: float | None) -> list[tuple[Task, Attempt]]:
        done, _ = concurrent.futures.wait(list(self._futures), timeout, concurrent.futures.FIRST_COMPLETED)
        return [(self._futures.pop(f), f.result()) for f in done]

    def close(self, cancel: bool) -> None:
        if cancel:
            for f in self._futures:
                f.cancel()
            self._live.kill_all()
        self._pool.shutdown(wait=True)
        self._futures.clear()


# ---------------------------------------------------------------------------------------------
# the loop


@dataclass
class _Delayed:
    ready: float
    seq: int
    task: Task = field(compare=False)

    def __lt__(self, other: _Delayed) -> bool:
        return (self.ready, self.seq) < (other.ready, other.seq)


def record(task: Task, attempt: Attempt, engine: str, command: str) -> dict[str, Any]:
    """The journal record of an attempt ('shard' first: see journal.py)."""
    return {
        "shard": task.shard, "index": task.index, "status": attempt.status, "attempt": task.attempt,
        "seconds": attempt.seconds, "host": attempt.host, "exit_code": attempt.exit_code,
        "output_tail": attempt.output_tail, "start": attempt.start, "engine": engine, "command": command,
    }


def run_shards(
    todo: list[tuple[int, str]],
    options: JobOptions,
    engine: Engine,
    journal: Journal | None,
    on_retry: Callable[[Task, Attempt, float], None] | None = None,
) -> Iterator[ShardResult]:
    """Run ``(index, shard)`` pairs on ``engine``; yield each shard's result once it is final.

    A failed attempt is retried ``options.retries`` times, after ``options.delay(attempt)``
    seconds. Closing the generator early (Ctrl-C, SIGTERM) kills what is running and records
    nothing for it.
    """
    pending = deque(options.task(shard, index) for index, shard in todo)
    delayed: list[_Delayed] = []
    seq = itertools.count()
    running = 0
    finished = False
    try:
        while pending or delayed or running:
            now = time.monotonic()
            while delayed and delayed[0].ready <= now:
                pending.append(heapq.heappop(delayed).task)
            while pending and running < engine.capacity:
                engine.submit(pending.popleft())
                running += 1
            if not running:
                time.sleep(max(0.0, delayed[0].ready - time.monotonic()))
                continue
            wait = min(delayed[0].ready - now, 1.0) if delayed else None
            for task, attempt in engine.wait(None if wait is None else max(wait, 0.0)):
                running -= 1
                if journal is not None:
                    journal.append(record(task, attempt, engine.name, options.command_text))
                if attempt.status != "ok" and task.attempt <= options.retries:
                    pause = options.delay(task.attempt)
                    if on_retry is not None:
                        on_retry(task, attempt, pause)
                    nxt = Task(task.shard, task.index, task.attempt + 1, task.argv)
                    heapq.heappush(delayed, _Delayed(time.monotonic() + pause, next(seq), nxt))
                    continue
                yield ShardResult(task.shard, task.index, attempt.status == "ok", task.attempt, attempt)
        finished = True
    finally:
        engine.close(cancel=not finished)


def run_one(
    index: int, shard: str, options: JobOptions, journal: Journal | None,
    on_retry: Callable[[Task, Attempt, float], None] | None = None,
) -> ShardResult:
    """Run one shard here, with its retries (``tarjob --index``)."""
    engine = LocalPool(options, 1)
    engine.name = "index"
    (result,) = run_shards([(index, shard)], options, engine, journal, on_retry)
    return result


def describe_failure(result: ShardResult, options: JobOptions) -> str:
    tries = f" (after {result.attempts} attempts)" if result.attempts > 1 else ""
    return f"shard {result.shard} {result.last.reason(options.timeout)}{tries}"
