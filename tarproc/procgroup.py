"""Process groups: start a child as the leader of a group of its own, and signal all of it at once.

A command run through a shell (``pipe:CMD``, ``tarproc -c``, ``tarjob``) starts children of its
own; a signal to the shell alone would leave them running. A child started in a new session
leads a new process group, which holds everything it starts: one ``killpg`` reaches them all.
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported where used: the commands that start no child start without it
    import subprocess


# Seconds a main thread waits on its helper threads (or on the processes they watch) between looks
# at signals. The kernel hands a process's Ctrl-C or SIGTERM to any of its threads that doesn't
# block it, and Python then only sets a flag, which the main thread acts on when it next runs
# Python code: an untimed wait on threads that wait on something that never ends (a command, a
# stalled pipe) would never see it, and Ctrl-C would not stop the run (seen on a loaded machine).
SIGNAL_CHECK = 0.25


def wait_set(event: Any) -> None:
    """``event.wait()`` (a ``threading.Event``) in turns of ``SIGNAL_CHECK``."""
    while not event.wait(SIGNAL_CHECK):
        pass


def start_group(args: Any, **popen: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, **popen)``, the child in a session (and process group) of its own."""
    import subprocess

    return subprocess.Popen(args, start_new_session=True, **popen)


def signal_group(pid: int, sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to the process group that ``pid`` leads; False where that group is gone (or
    no longer ours to signal), which is no error: it ended by itself."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def stop_group(proc: subprocess.Popen[Any], grace: float = 5.0) -> None:
    """End a child started by ``start_group``, and all it started, then reap it: SIGTERM first,
    SIGKILL after ``grace`` seconds. No zombie is left either way."""
    import subprocess

    if proc.poll() is None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not signal_group(proc.pid, sig):
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
    proc.wait()


def leave_signals_to_parent() -> None:
    """In a worker process of a pool: Ctrl-C (which the terminal sends to the whole process group)
    is ignored, and SIGTERM and SIGHUP do what they do by default, not what the command's handlers,
    inherited through fork, would. The parent decides, and stops its workers. A forked worker that
    raised on Ctrl-C could do so while holding its pool's result queue lock: the parent then waited
    on the pool for ever (``tarshow --summary --decode -p 2``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)


def worker_pool(processes: int, initializer: Any = None, initargs: tuple[Any, ...] = ()) -> Any:
    """A ``ProcessPoolExecutor`` of ``processes`` workers that leave signals to the parent
    (``leave_signals_to_parent``) and show warnings as it does, then run ``initializer(*initargs)``.
    Forked on Linux (workers start in milliseconds and need no importable ``__main__``), the
    platform's default elsewhere (a spawned worker is told how the parent shows warnings)."""
    import concurrent.futures
    import multiprocessing
    import sys

    from .errors import warnings_setup

    method = "fork" if sys.platform.startswith("linux") else None
    shown = warnings_setup() if method != "fork" else None
    return concurrent.futures.ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context(method),
                                                  initializer=_start_worker, initargs=(shown, initializer, initargs))


def _start_worker(shown: Any, initializer: Any, initargs: tuple[Any, ...]) -> None:
    from .errors import adopt_warnings_setup

    adopt_warnings_setup(shown)
    leave_signals_to_parent()
    if initializer is not None:
        initializer(*initargs)


__all__ = ["leave_signals_to_parent", "signal_group", "start_group", "stop_group", "worker_pool"]
