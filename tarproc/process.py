"""Per-sample jobs: run a shell command, or a Python function, on every sample, in parallel.

``shell_samples`` writes each sample's fields into a private temporary directory as
``sample.EXT``, runs ``bash -c COMMAND`` (or ``bash SCRIPT``) there, and makes the ``sample.*``
regular files present afterwards the output sample, under the same key. ``map_samples`` applies
a ``module:function`` to sample dicts in worker processes. Both keep the input order (a reorder
window bounds what is in flight or waiting), or emit in completion order with ``ordered=False``.

Safety: file names are always ``sample.`` + the field (which never contains ``/``): the key is
never used as a file name and nothing is interpolated into the command, which gets the key in
``$KEY`` instead (with ``$SAMPLE_DIR`` and ``$INDEX``). Symlinks and directories the command
leaves are not collected. Each command runs in its own session; when it exits, times out, or
the run stops (an error, Ctrl-C, SIGTERM), its whole process group is killed, and every
temporary directory is removed.

>>> from tarproc.process import shell_samples
>>> out = shell_samples([{"__key__": "a", "txt": b"hi"}], "tr a-z A-Z < sample.txt > sample.up; rm sample.txt")
>>> [(s["__key__"], s["up"]) for s in out]
[('a', b'HI')]
"""

from __future__ import annotations

import errno
import fnmatch
import importlib
import importlib.util
import os
import pickle
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_connections
from typing import Any

from .errors import DataWarning, JobError, OptionError, TarprocError, adopt_warnings_setup, warner, warnings_setup
from .procgroup import SIGNAL_CHECK, leave_signals_to_parent, signal_group, start_group
from .samples import Sample
from .tar import DEFAULT_MAX_MEMBER_SIZE

ON_JOB_ERROR = ("fail", "skip", "keep")
FILE_PREFIX = "sample."
_TAIL = 300  # characters of a failed command's output quoted in messages


@dataclass
class JobStats:
    """What happened to the samples: counted as results are emitted (``seconds`` at the end)."""

    inputs: int = 0
    outputs: int = 0
    failed: int = 0  # command exited non-zero / function raised
    timed_out: int = 0
    skipped: int = 0  # failed or timed out, dropped (on_error="skip")
    kept: int = 0  # failed or timed out, passed through unchanged (on_error="keep")
    dropped: int = 0  # the command left no sample.* file / the function returned None
    seconds: float = 0.0

    def summary(self) -> str:
        """One line for stderr.

        >>> JobStats(inputs=3, outputs=2, failed=1, skipped=1, seconds=2.0).summary()
        '3 samples in, 2 out in 2.0 s (1.5 samples/s); 1 failed, 0 timed out: 1 skipped, 0 kept; 0 dropped'
        """
        rate = self.inputs / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.inputs} samples in, {self.outputs} out in {self.seconds:.1f} s ({rate:.1f} samples/s); "
            f"{self.failed} failed, {self.timed_out} timed out: {self.skipped} skipped, {self.kept} kept; "
            f"{self.dropped} dropped"
        )


@dataclass
class _Outcome:
    """What a worker reports for one sample."""

    index: int
    sample: Sample | None = None  # the output sample (None: dropped)
    error: str | None = None  # why the job failed (then ``sample`` is unused)
    timed_out: bool = False
    log: bytes = b""  # the command's stdout and stderr, together
    log_in_field: bool = False  # the log went into a field of ``sample``
    warnings: list[str] = field(default_factory=list)
    fatal: BaseException | None = None  # not the job's fault (e.g. the temporary disk is full)


def _check_policy(on_error: str, workers: int, window: int | None, per_worker: int = 4) -> int:
    if on_error not in ON_JOB_ERROR:
        raise OptionError(f"bad error policy {on_error!r}; use one of {', '.join(ON_JOB_ERROR)}")
    if workers < 1:
        raise OptionError(f"the number of workers must be at least 1, not {workers}")
    if window is None:
        window = per_worker * workers
    if window < workers:
        raise OptionError(f"the window ({window}) must be at least the number of workers ({workers})")
    return window


def field_filter(fields: Iterable[str] = (), exclude: Iterable[str] = ()) -> Callable[[str], bool]:
    """A predicate on field names: in ``fields`` (if any given) and not in ``exclude`` (globs).

    >>> keep = field_filter(["jpg", "c*"], ["cls"])
    >>> [f for f in ["jpg", "cls", "cap", "json"] if keep(f)]
    ['jpg', 'cap']
    """
    wanted = [f.lower() for f in fields]
    unwanted = [f.lower() for f in exclude]
    return lambda name: (not wanted or any(fnmatch.fnmatchcase(name, p) for p in wanted)) and not any(
        fnmatch.fnmatchcase(name, p) for p in unwanted
    )


def _tail(log: bytes) -> str:
    """The last line(s) of a command's output, shortened, for a one-line message."""
    text = log.decode("utf-8", "replace").strip()
    if not text:
        return ""
    text = " | ".join(line.strip() for line in text.splitlines()[-3:] if line.strip())
    return text if len(text) <= _TAIL else "..." + text[-_TAIL:]


# ---------------------------------------------------------------------------------------------
# the reorder window, common to both kinds of job


class _Pool:
    """Workers that take ``(index, sample)`` and report ``_Outcome``s, in any order."""

    def submit(self, index: int, sample: Sample) -> None:
        raise NotImplementedError

    def get(self) -> _Outcome:
        raise NotImplementedError

    def close(self, cancel: bool) -> None:
        raise NotImplementedError


def _run_pool(
    samples: Iterable[Sample],
    pool: _Pool,
    window: int,
    ordered: bool,
    on_error: str,
    stats: JobStats,
    on_log: Callable[[str, bytes], None] | None,
    warn: Callable[[str], None],
    what: str,
) -> Iterator[Sample]:
    """Feed ``pool`` at most ``window`` samples at a time; yield results in input order (or as done).

    The window counts samples being processed *and* results waiting for an earlier one, so memory
    stays bounded whatever the mix of fast and slow samples.
    """
    start = time.perf_counter()
    pending: dict[int, Sample] = {}  # submitted, not yet emitted
    done: dict[int, _Outcome] = {}  # finished, waiting for an earlier sample (ordered only)
    next_out = 0
    inputs = iter(samples)
    exhausted = False
    ok = False
    try:
        while True:
            while not exhausted and len(pending) < window:
                try:
                    sample = next(inputs)
                except StopIteration:
                    exhausted = True
                    break
                index = stats.inputs
                stats.inputs += 1
                pending[index] = sample
                pool.submit(index, sample)
            if not pending:
                break
            outcome = pool.get()
            if outcome.fatal is not None:
                raise outcome.fatal
            if not ordered:
                ready = [outcome]
            else:
                done[outcome.index] = outcome
                ready = []
                while next_out in done:
                    ready.append(done.pop(next_out))
                    next_out += 1
            for outcome in ready:
                sample = pending.pop(outcome.index)
                result = _settle(outcome, sample, on_error, stats, on_log, warn, what)
                if result is not None:
                    stats.outputs += 1
                    yield result
        ok = True
    finally:
        pool.close(cancel=not ok)
        stats.seconds = time.perf_counter() - start


def _settle(
    outcome: _Outcome,
    sample: Sample,
    on_error: str,
    stats: JobStats,
    on_log: Callable[[str, bytes], None] | None,
    warn: Callable[[str], None],
    what: str,
) -> Sample | None:
    """Apply the error policy to one finished job: the sample to emit, None, or raise JobError."""
    key = str(sample.get("__key__"))
    for message in outcome.warnings:
        warn(f"sample {key!r}: {message}")
    # with --log the output stays out of stderr, unless the sample that would carry it is dropped or
    # kept unchanged; a failing run quotes its tail in the error message
    if outcome.log and on_log is not None and not (
        outcome.log_in_field and (outcome.sample is not None or (outcome.error is not None and on_error == "fail"))
    ):
        on_log(key, outcome.log)
    if outcome.error is None:
        if outcome.sample is None:
            stats.dropped += 1
        return outcome.sample
    if outcome.timed_out:
        stats.timed_out += 1
    else:
        stats.failed += 1
    tail = _tail(outcome.log)
    message = f"sample {key!r} (input #{outcome.index}): {what} {outcome.error}"
    if on_error == "fail":
        raise JobError(message + (f"; its output ends: {tail}" if tail else ""), sample.get("__url__"), key)
    if on_error == "skip":
        stats.skipped += 1
        warn(f"{message}; skipping it")
        return None
    stats.kept += 1
    warn(f"{message}; keeping it unchanged")
    return sample


# ---------------------------------------------------------------------------------------------
# shell jobs: threads, each running one bash at a time


@dataclass
class ShellJob:
    """How to run one sample through a shell command (see ``shell_samples``)."""

    argv: list[str]
    tmpdir: str | None = None
    timeout: float | None = None
    log_field: str | None = None
    keep_field: Callable[[str], bool] = field(default=lambda name: True)
    max_file_size: int = DEFAULT_MAX_MEMBER_SIZE


class _ShellPool(_Pool):
    """``workers`` threads, each preparing a directory and waiting for one bash at a time.

    Threads suffice: the expensive parts (bash, the command) are separate processes, and
    spawning, waiting and file I/O release the GIL. Every child runs in its own session, so its
    whole process group can be killed: when it exits (leftover background jobs), on timeout, and
    on cancel. Killing a group and registering a new child are serialised by ``_lock``.
    """

    def __init__(self, job: ShellJob, workers: int) -> None:
        self.job = job
        self._tasks: queue.SimpleQueue[tuple[int, Sample] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[_Outcome] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._cancelled = False
        self._live: set[subprocess.Popen[bytes]] = set()
        self._dirs: set[str] = set()
        self._env = dict(os.environ)
        self._threads = [
            threading.Thread(target=self._work, name=f"tarproc-job-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def submit(self, index: int, sample: Sample) -> None:
        self._tasks.put((index, sample))

    def get(self) -> _Outcome:
        while True:  # in turns, so that a signal a job thread was handed is seen (SIGNAL_CHECK)
            try:
                return self._results.get(timeout=SIGNAL_CHECK)
            except queue.Empty:
                continue

    def close(self, cancel: bool) -> None:
        if cancel:
            with self._lock:
                self._cancelled = True
                live = list(self._live)
            for proc in live:
                signal_group(proc.pid)
        for _ in self._threads:
            self._tasks.put(None)
        try:
            for t in self._threads:
                t.join()
        finally:
            # the workers remove their own directories; this is for a second Ctrl-C during the join
            for d in list(self._dirs):
                shutil.rmtree(d, ignore_errors=True)

    def _work(self) -> None:
        log = None  # stdout+stderr of each command: one unlinked file, reused
        try:
            while True:
                task = self._tasks.get()
                if task is None or self._cancelled:
                    return
                index, sample = task
                try:
                    if log is None:
                        log = tempfile.TemporaryFile(dir=self.job.tmpdir)
                    outcome = self._run(index, sample, log)
                except OSError as e:  # not the command's fault: stop everything
                    where = self.job.tmpdir or tempfile.gettempdir()
                    outcome = _Outcome(index, fatal=TarprocError(f"cannot run a job in {where}: {e}"))
                except BaseException as e:
                    outcome = _Outcome(index, fatal=e)
                self._results.put(outcome)
        finally:
            if log is not None:
                log.close()

    def _run(self, index: int, sample: Sample, log: Any) -> _Outcome:
        job = self.job
        key = str(sample["__key__"])
        d = tempfile.mkdtemp(prefix="tarproc-", dir=job.tmpdir)
        self._dirs.add(d)
        try:
            for name, value in sample.items():
                if name.startswith("__"):
                    continue
                if "/" in name or "\0" in name or not name:
                    return _Outcome(index, error=f"has a field name that can't be a file name: {name!r}")
                try:
                    _write_file(os.path.join(d, FILE_PREFIX + name), value)
                except OSError as e:
                    if e.errno in _FULL_ERRNOS:  # the run's problem: every sample would fail the same way
                        raise TarprocError(f"cannot run jobs in {os.path.dirname(d)}: {e.strerror}") from None
                    # this sample's problem (a name too long, say)
                    return _Outcome(index, error=f"cannot write field {name!r} as a file: {e.strerror}")
            log.seek(0)
            log.truncate()
            env = self._env.copy()
            env["KEY"] = key
            env["SAMPLE_DIR"] = d
            env["INDEX"] = str(index)
            status, timed_out = self._spawn_and_wait(d, env, log)
            output = _read_output(log, job.max_file_size if job.log_field is not None else None)
            if status and not timed_out:
                # on a full file system the command's own 'No space left on device' went into the
                # log, in that same directory, and was lost: say it, and stop, as every job would fail
                parent = os.path.dirname(d)
                free = _space_left(parent)
                if free is not None and free < _NEARLY_FULL:
                    tail = _tail(output or b"")
                    return _Outcome(index, fatal=TarprocError(
                        f"cannot run jobs in {parent}: {os.strerror(errno.ENOSPC)} ({free} bytes "
                        f"free): the command of sample {key!r} (input #{index}) {_exit_reason(status)}, and its output, "
                        f"logged there, may be cut short" + (f"; it ends: {tail}" if tail else "")
                    ))
            if output is None:
                return _Outcome(index, error=f"wrote more than {job.max_file_size} bytes of output for --log")
            try:
                outcome = self._outcome(index, sample, d, status, timed_out, output)
            except OSError as e:  # e.g. the command removed its own directory
                return _Outcome(index, error=f"cannot collect its files: {e.strerror}", log=output)
            outcome.log_in_field = job.log_field is not None
            return outcome
        finally:
            shutil.rmtree(d, ignore_errors=True)
            self._dirs.discard(d)

    def _outcome(self, index: int, sample: Sample, d: str, status: int | None, timed_out: bool,
                 output: bytes) -> _Outcome:
        """The outcome of a finished command: an error, or the sample it left."""
        if status is None:  # cancelled before it could start
            return _Outcome(index, error="was cancelled")
        if timed_out:
            return _Outcome(index, error=f"timed out after {self.job.timeout:g} s", timed_out=True, log=output)
        if status != 0:
            return _Outcome(index, error=_exit_reason(status), log=output)
        return self._collect(index, sample, d, output)

    def _spawn_and_wait(self, cwd: str, env: dict[str, str], log: Any) -> tuple[int | None, bool]:
        """Run the command; ``(status, timed_out)``; status None if the run was cancelled first."""
        with self._lock:
            if self._cancelled:
                return None, False
        proc = start_group(  # OSError (no bash?) stops the run, see _work
            self.job.argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
        )
        with self._lock:
            self._live.add(proc)
            cancelled = self._cancelled
        if cancelled:
            signal_group(proc.pid)
        timed_out = False
        try:
            timed_out = not _wait_exit(proc, self.job.timeout)
            # kill what the command left running (its group: background jobs, or all of it on timeout)
            # while the leader is unreaped, so that its pid, the group id, can't have been reused
            signal_group(proc.pid)
            status = proc.wait()
        finally:
            with self._lock:
                self._live.discard(proc)
            if proc.returncode is None:
                signal_group(proc.pid)
                proc.wait()
        return status, timed_out

    def _collect(self, index: int, sample: Sample, d: str, output: bytes) -> _Outcome:
        job = self.job
        out: Sample = {"__key__": sample["__key__"], "__url__": sample.get("__url__")}
        warnings = []
        left = False  # any sample.* file at all: none means the command dropped the sample
        with os.scandir(d) as entries:
            for entry in entries:
                name = entry.name
                if not name.startswith(FILE_PREFIX) or len(name) == len(FILE_PREFIX):
                    continue
                left = True
                field_name = name[len(FILE_PREFIX):].lower()
                if field_name.startswith("__") or not job.keep_field(field_name):
                    continue
                if not entry.is_file(follow_symlinks=False):
                    warnings.append(f"not collecting {name!r}: not a regular file")
                    continue
                if field_name in out:
                    return _Outcome(index, error=f"left two files for field {field_name!r}", log=output)
                data = _read_file(entry.path, job.max_file_size)
                if data is None:
                    return _Outcome(index, error=f"left {name!r} larger than {job.max_file_size} bytes", log=output)
                out[field_name] = data
        if left and job.log_field is not None:
            if job.log_field in out:
                return _Outcome(index, error=f"left a file for field {job.log_field!r}, which --log also names",
                                log=output)
            out[job.log_field] = output
        if len(out) == 2:  # no fields left
            return _Outcome(index, None, log=output, warnings=warnings)
        return _Outcome(index, out, log=output, warnings=warnings)


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NEARLY_FULL = 64 << 10  # bytes free under which a file system counts as full (a log write would fail)


def _exit_reason(status: int) -> str:
    """How a process ended, from its status (negative: the signal that killed it)."""
    return f"was killed by signal {-status}" if status < 0 else f"exited with status {status}"


def _space_left(directory: str) -> int | None:
    """Bytes an unprivileged process may still write on the file system of ``directory`` (None: unknown)."""
    try:
        st = os.statvfs(directory)
    except (OSError, AttributeError):  # no statvfs here
        return None
    return st.f_bavail * st.f_frsize


_SHOWN_OUTPUT = 256 << 10  # of a longer output, this much of its start and of its end reach stderr


def _read_output(log: Any, limit: int | None) -> bytes | None:
    """The command's output from its log file, with bounded memory.

    For ``--log`` (``limit`` given) all of it, or None when it is larger than ``limit``. For
    stderr, an output longer than twice ``_SHOWN_OUTPUT`` keeps its start and its end, with a
    line saying how much was left out between them.
    """
    size = os.fstat(log.fileno()).st_size
    log.seek(0)
    if limit is not None:
        return log.read() if size <= limit else None
    if size <= 2 * _SHOWN_OUTPUT:
        return log.read()  # type: ignore[no-any-return]
    head = log.read(_SHOWN_OUTPUT)
    log.seek(size - _SHOWN_OUTPUT)
    tail = log.read(_SHOWN_OUTPUT)
    skipped = size - 2 * _SHOWN_OUTPUT
    return head + f"\n[... {skipped} bytes of output left out ...]\n".encode() + tail  # type: ignore[no-any-return]


def _write_file(path: str, value: Any) -> None:
    data = value if isinstance(value, (bytes, bytearray, memoryview)) else str(value).encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        view = memoryview(data).cast("B")
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)


def _read_file(path: str, limit: int) -> bytes | None:
    """A regular file's bytes (never through a symlink); None if larger than ``limit``."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            return None
        chunks = []
        while True:
            chunk = os.read(fd, max(size, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _wait_exit(proc: subprocess.Popen[bytes], timeout: float | None) -> bool:
    """Wait until ``proc`` has exited, without reaping it; False on timeout.

    A pidfd (Linux >= 5.3) waits exactly, with no polling; elsewhere Popen.wait reaps it.
    """
    try:
        fd = os.pidfd_open(proc.pid)  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ms = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)
            if poller.poll(ms):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
    finally:
        os.close(fd)


def shell_samples(
    samples: Iterable[Sample],
    command: str | None = None,
    *,
    script: str | None = None,
    workers: int = 1,
    window: int | None = None,
    ordered: bool = True,
    timeout: float | None = None,
    on_error: str = "fail",
    log_field: str | None = None,
    fields: Iterable[str] = (),
    exclude: Iterable[str] = (),
    tmpdir: str | None = None,
    max_file_size: int = DEFAULT_MAX_MEMBER_SIZE,
    stats: JobStats | None = None,
    on_log: Callable[[str, bytes], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> Iterator[Sample]:
    """Run ``bash -c command`` (or ``bash script``) once per sample, ``workers`` at a time.

    Each sample's fields are written to a fresh directory (under ``tmpdir`` or ``$TMPDIR``) as
    ``sample.FIELD``; the command runs there with ``$KEY``, ``$SAMPLE_DIR`` and ``$INDEX`` (the
    input position, from 0) set and stdin from /dev/null. The ``sample.*`` regular files present
    afterwards (filtered by ``fields``/``exclude``, glob patterns) are the output sample, same key;
    none left drops the sample. The command's stdout and stderr go to ``on_log(key, bytes)`` (or
    into field ``log_field``). A non-zero exit or ``timeout`` (seconds; the whole process group is
    killed) follows ``on_error``: ``fail`` raises ``JobError``, ``skip`` drops the sample, ``keep``
    passes it through unchanged. Order is kept unless ``ordered=False``; at most ``window``
    (default 4 x workers) samples are in flight or waiting. A full file system under ``tmpdir``
    (no space to write a sample's fields, or a command failing with under 64 KiB left there, where
    its own output is logged too) stops the run with a ``TarprocError`` naming the directory and
    the cause, whatever ``on_error``.
    """
    if (command is None) == (script is None):
        raise OptionError("give either a command or a script")
    window = _check_policy(on_error, workers, window)
    if timeout is not None and timeout <= 0:
        raise OptionError(f"the timeout must be positive, not {timeout}")
    if log_field is not None and (not log_field or "/" in log_field or log_field.startswith("__")):
        raise OptionError(f"bad log field {log_field!r}")
    argv = ["bash", "-c", command] if command is not None else ["bash", os.path.abspath(str(script))]
    job = ShellJob(argv, tmpdir, timeout, log_field and log_field.lower(), field_filter(fields, exclude),
                   max_file_size)
    return _shell(samples, job, workers, window, ordered, on_error, stats or JobStats(), on_log, warn)


def _shell(
    samples: Iterable[Sample],
    job: ShellJob,
    workers: int,
    window: int,
    ordered: bool,
    on_error: str,
    stats: JobStats,
    on_log: Callable[[str, bytes], None] | None,
    warn: Callable[[str], None] | None,
) -> Iterator[Sample]:
    pool = _ShellPool(job, workers)
    yield from _run_pool(samples, pool, window, ordered, on_error, stats, on_log, warner(warn, DataWarning), "command")




# ---------------------------------------------------------------------------------------------
# Python functions: worker processes


def load_function(spec: str) -> Callable[[Sample], Any]:
    """The function named by ``module:function`` or ``path/to/file.py:function``.

    A module is looked up on ``sys.path`` and then in the current directory. Raises
    ``OptionError`` when it can't be imported or isn't callable.

    >>> load_function("os.path:basename")("a/b.txt")
    'b.txt'
    """
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise OptionError(f"bad function {spec!r}; expected module:function or file.py:function")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            path = os.path.abspath(module_name)
            if not os.path.isfile(path):
                raise OptionError(f"bad function {spec!r}: no file {module_name!r}")
            name = "_tarproc_map_" + os.path.splitext(os.path.basename(path))[0]
            module = sys.modules.get(name)
            if module is None or getattr(module, "__file__", None) != path:
                file_spec = importlib.util.spec_from_file_location(name, path)
                if file_spec is None or file_spec.loader is None:
                    raise OptionError(f"bad function {spec!r}: can't load {module_name!r}")
                module = importlib.util.module_from_spec(file_spec)
                sys.modules[name] = module
                file_spec.loader.exec_module(module)
        else:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                if e.name != module_name.split(".")[0] or os.getcwd() in sys.path:
                    raise
                sys.path.append(os.getcwd())  # like 'python -m', find the user's module where they are
                module = importlib.import_module(module_name)
    except OptionError:
        raise
    except Exception as e:
        raise OptionError(f"bad function {spec!r}: cannot import {module_name!r}: {type(e).__name__}: {e}") from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)  # type: ignore[assignment]
        if fn is None:
            raise OptionError(f"bad function {spec!r}: {module_name!r} has no {attr!r}")
    if not callable(fn):
        raise OptionError(f"bad function {spec!r}: {attr!r} is not callable")
    return fn  # type: ignore[return-value]


def end_with_parent(parent: int) -> None:
    """Have the kernel send SIGKILL to this worker when its parent dies (Linux), however it dies.

    Without it a parent killed with SIGKILL (or by the OOM killer) leaves workers blocked for
    ever on a result pipe that other workers, which inherited its read end, keep open.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # pragma: no cover - no prctl: the parent's own cleanup remains
        return
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def _map_worker(
    spec: str, sys_path: list[str], slot: int, current: Any, tasks: Any, results: Connection, parent: int,
    shown: Any = None,
) -> None:
    """A worker process: take chunks of ``(index, sample)``, reply with pickled outcome lists.
    ``shown``: how the parent shows warnings (``errors.warnings_setup``), for a spawned worker."""
    adopt_warnings_setup(shown)
    leave_signals_to_parent()  # Ctrl-C reaches the whole terminal group: the parent decides
    end_with_parent(parent)
    sys.path[:] = sys_path
    fn = load_function(spec)
    while True:
        chunk = tasks.get()
        if chunk is None:
            return
        replies = []
        for index, sample in chunk:
            current[slot] = index
            try:
                out = fn(sample)
            except Exception as e:
                detail = str(e).splitlines()[0] if str(e) else ""
                where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
                at = f" (at {os.path.basename(where.filename)}:{where.lineno})" if where else ""
                replies.append(pickle.dumps(_Outcome(index, error=f"raised {type(e).__name__}: {detail}{at}")))
                continue
            if out is not None and not isinstance(out, dict):
                replies.append(pickle.dumps(_Outcome(index, error=f"returned a {type(out).__name__}, not a dict")))
                continue
            if out is not None and "__key__" not in out:
                out["__key__"] = sample["__key__"]
            try:
                data = pickle.dumps(_Outcome(index, out), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as e:
                data = pickle.dumps(_Outcome(index, error=f"returned a sample that can't be pickled: {e}"))
            replies.append(data)
        results.send_bytes(pickle.dumps(replies, protocol=pickle.HIGHEST_PROTOCOL))


class _MapPool(_Pool):
    """``workers`` processes sharing one task queue; each replies on its own pipe.

    Fork start (where available) is the fastest and the pool starts before any input is read, so
    no reader thread is copied half-way; workers re-resolve the function from its spec, so spawn
    works too. Tasks go through a ``multiprocessing.Queue`` (its feeder thread never blocks us)
    in chunks, results come back per worker, so the death of a worker is noticed (its sentinel)
    and the sample it held is named (``current``, shared memory).
    """

    def __init__(self, spec: str, workers: int, chunk: int) -> None:
        import multiprocessing as mp

        method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
        ctx: Any = mp.get_context(method)
        shown = warnings_setup() if method != "fork" else None  # a forked worker has the parent's
        self._chunk = chunk
        self._buffer: list[tuple[int, Sample]] = []
        self._tasks = ctx.Queue()
        self._current = ctx.RawArray("q", workers)
        self._ready: list[_Outcome] = []
        self._keys: dict[int, str] = {}
        self._conns: list[Connection] = []
        self._procs = []
        for i in range(workers):
            self._current[i] = -1
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_map_worker, args=(spec, list(sys.path), i, self._current, self._tasks, writer, os.getpid(), shown),
                name=f"tarproc-map-{i}", daemon=True,
            )
            proc.start()
            writer.close()
            self._conns.append(reader)
            self._procs.append(proc)

    def submit(self, index: int, sample: Sample) -> None:
        self._keys[index] = str(sample.get("__key__"))
        self._buffer.append((index, sample))
        if len(self._buffer) >= self._chunk:
            self._flush()

    def _flush(self) -> None:
        if self._buffer:
            self._tasks.put(self._buffer)
            self._buffer = []

    def get(self) -> _Outcome:
        # the window is full or the input ended: what is buffered must go now, or nothing comes back
        self._flush()
        while not self._ready:
            sentinels = {p.sentinel: p for p in self._procs}
            for ready in wait_connections(self._conns + list(sentinels)):
                if isinstance(ready, Connection):
                    try:
                        replies = pickle.loads(ready.recv_bytes())
                    except EOFError:
                        continue  # the worker died; its sentinel tells
                    self._ready.extend(pickle.loads(r) for r in replies)
                elif not self._ready:
                    proc = sentinels[ready]  # type: ignore[index]
                    proc.join()
                    index = self._current[self._procs.index(proc)]
                    key = self._keys.get(index, "?")
                    raise JobError(f"a worker process {_exit_reason(proc.exitcode or 0)} while processing sample {key!r} (input #{index})", key=key)
        outcome = self._ready.pop(0)
        self._keys.pop(outcome.index, None)
        return outcome

    def close(self, cancel: bool) -> None:
        if not cancel:
            for _ in self._procs:
                self._tasks.put(None)
            for proc in self._procs:
                proc.join(5)
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            proc.join()
        self._tasks.cancel_join_thread()  # items left for dead workers must not hold up our exit
        self._tasks.close()
        for conn in self._conns:
            conn.close()


def map_samples(
    samples: Iterable[Sample],
    function: str,
    *,
    workers: int = 1,
    window: int | None = None,
    ordered: bool = True,
    on_error: str = "fail",
    fields: Iterable[str] = (),
    exclude: Iterable[str] = (),
    chunk: int | None = None,
    stats: JobStats | None = None,
    warn: Callable[[str], None] | None = None,
) -> Iterator[Sample]:
    """Apply ``function`` (``module:function`` or ``file.py:function``) to samples in worker processes.

    The function takes a sample dict (``__key__``, ``__url__``, fields as bytes) and returns a
    sample dict (its key defaults to the input's) or None to drop it. An exception follows
    ``on_error`` as for ``shell_samples``; so do ordering and the window (default 64 x workers:
    a function call is cheap next to a shell's). Samples travel in chunks (default: window /
    (2 x workers), at most 64) to spread the cost of each message.
    """
    window = _check_policy(on_error, workers, window, per_worker=64)
    load_function(function)  # a bad spec is a usage error, before any worker starts
    if chunk is None:
        chunk = max(1, min(64, window // (2 * workers)))
    keep = field_filter(fields, exclude)
    filtering = bool(tuple(fields) or tuple(exclude))
    return _map(samples, function, workers, window, chunk, ordered, on_error, stats or JobStats(), warn,
                keep if filtering else None)


def _map(
    samples: Iterable[Sample],
    function: str,
    workers: int,
    window: int,
    chunk: int,
    ordered: bool,
    on_error: str,
    stats: JobStats,
    warn: Callable[[str], None] | None,
    keep: Callable[[str], bool] | None,
) -> Iterator[Sample]:
    pool = _MapPool(function, workers, chunk)
    for sample in _run_pool(samples, pool, window, ordered, on_error, stats, None, warner(warn, DataWarning),
                            f"function {function}"):
        if keep is not None:
            sample = {k: v for k, v in sample.items() if k.startswith("__") or keep(k)}
        yield sample


__all__ = ["JobError", "JobStats", "ON_JOB_ERROR", "field_filter", "load_function", "map_samples", "shell_samples"]
