"""Attempts as tasks on a Dask distributed cluster (``tarjob --dask``).

Each task runs the shard's command with ``subprocess`` on a worker and returns an ``Attempt``
(exit code, seconds, host, output tail) to the client, which alone writes the journal. Keys are
unique per attempt (``pure=False``), so a retry is a real resubmission. A worker that dies
mid-task is Dask's to handle first: the scheduler reschedules the task on another worker, up to
``distributed.scheduler.allowed-failures`` times; when it gives up (``KilledWorker``) the attempt
counts as ``killed`` and ``--retries`` applies. Commands die with their worker (PR_SET_PDEATHSIG
on a keeper process that kills the command's whole process group), and a stop of the client
(Ctrl-C, SIGTERM) kills them on every worker.

``distributed`` is imported only here, only when ``--dask`` is used (pip install 'tarproc[dask]').
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import uuid
import warnings
from typing import Any

from ..errors import OptionError, TarprocError
from .run import Attempt, JobOptions, LiveSet, Task, now_iso, run_task


class DaskError(TarprocError):
    """The Dask scheduler can't be reached, or the cluster failed outside of a task."""


# On a worker: the commands running for each client's run, so that a stop (Ctrl-C on the client)
# kills them there too. Cancelling a Dask future does not stop a task that has started.
_RUNS: dict[str, LiveSet] = {}
_RUNS_LOCK = threading.Lock()


def _live_set(run_id: str) -> LiveSet:
    with _RUNS_LOCK:
        return _RUNS.setdefault(run_id, LiveSet())


def _remote_attempt(task: Task, options: JobOptions, run_id: str) -> Attempt:
    return run_task(task, options, _live_set(run_id), die_with_parent=True)


def _stop_run(run_id: str) -> None:
    """Kill this run's commands on this worker, and refuse those that would start after."""
    _live_set(run_id).kill_all()


class DaskEngine:
    """Submit every attempt at once; Dask places them on its workers."""

    name = "dask"
    capacity = 1 << 30

    def __init__(self, options: JobOptions, address: str, workers: int) -> None:
        try:
            import distributed
        except ImportError:
            raise OptionError("--dask needs the distributed package: pip install 'tarproc[dask]'") from None
        self._distributed = distributed
        self.options = options
        self.cluster: Any = None
        try:
            if address == "local":
                with warnings.catch_warnings():
                    # without a dashboard the scheduler still serves HTTP, on 8787 or, when that is
                    # taken (another cluster), a random port, with a UserWarning: not worth a word
                    warnings.filterwarnings("ignore", "Port .* is already in use", UserWarning)
                    self.cluster = distributed.LocalCluster(
                        n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                        dashboard_address=None, worker_dashboard_address=None, silence_logs=logging.ERROR,
                    )
                self.client = distributed.Client(self.cluster)
            else:
                self.client = distributed.Client(address, timeout="20s")
        except (OSError, ValueError) as e:  # ValueError: an address like 'host' without a port
            self._close_cluster()
            raise DaskError(f"cannot connect to the Dask scheduler: {e}", address) from None
        self._futures: dict[Any, Task] = {}
        self._finished: queue.Queue[Any] = queue.Queue()
        self._run_id = uuid.uuid4().hex

    @property
    def dashboard(self) -> str | None:
        return getattr(self.client, "dashboard_link", None)

    def submit(self, task: Task) -> None:
        key = f"tarjob-{task.index}-{task.attempt}-{uuid.uuid4().hex}"
        future = self.client.submit(_remote_attempt, task, self.options, self._run_id, key=key, pure=False,
                                    retries=0)
        self._futures[future] = task
        future.add_done_callback(self._finished.put)  # called in a thread of the client

    def wait(self, timeout: float | None) -> list[tuple[Task, Attempt]]:
        """What finished: the first within ``timeout`` seconds, then all that are there already."""
        try:
            done = [self._finished.get(timeout=timeout)]
        except queue.Empty:
            return []
        try:
            while True:
                done.append(self._finished.get_nowait())
        except queue.Empty:
            pass
        return [(self._futures.pop(f), self._outcome(f)) for f in done if f in self._futures]

    def _outcome(self, future: Any) -> Attempt:
        if future.status == "finished":
            return future.result()  # type: ignore[no-any-return]
        if future.status == "cancelled":
            raise DaskError("a task was cancelled by the cluster (did the scheduler restart?)")
        error = future.exception()
        status = "killed" if type(error).__name__ == "KilledWorker" else "error"
        return Attempt(status, None, 0.0, socket.gethostname(), now_iso(), f"{type(error).__name__}: {error}")

    def close(self, cancel: bool) -> None:
        try:
            if cancel and self._futures:
                self.client.cancel(list(self._futures))
                try:
                    self.client.run(_stop_run, self._run_id)
                except Exception:  # noqa: BLE001 - best effort while stopping: a lost worker took its commands along
                    pass
            self._futures.clear()
            self.client.close()
        finally:
            self._close_cluster()

    def _close_cluster(self) -> None:
        if self.cluster is not None:
            self.cluster.close()
            self.cluster = None
