"""Real Dask clusters for the tests, on 127.0.0.1 and ephemeral ports only.

* `local()`: a ``distributed.LocalCluster`` of 2 process workers (one thread each) in
  the test process, started on first use and shared by the session (each xdist worker
  has its own); the root conftest's session fixture stops it.
* `CliCluster`: a scheduler and workers started as separate processes with the
  ``dask scheduler`` / ``dask worker`` commands (the shape of a real deployment), which
  a test can SIGKILL, add to and remove from; `cli()` is the session's, of 2 workers
  (a test that changes its workers restores them).

Every wait is bounded (`_limits.START`) and ends as soon as the cluster is ready. The
workers see the tests' folder on their ``sys.path`` (the pipelines' functions live in
``_worker_fns``). No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import _limits
import psutil

START_SECONDS = _limits.START
_TESTS = str(Path(__file__).resolve().parent)
_local: list[Any] = []  # [cluster, client] once started
_cli: list[CliCluster] = []  # the session's command-line cluster, once started


def local() -> Any:
    """The session's LocalCluster client (2 process workers), started on first use."""
    if not _local:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
            scheduler_port=0, dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR,
        )
        client = Client(cluster, set_as_default=False)
        client.wait_for_workers(2, timeout=START_SECONDS)
        _local.extend([cluster, client])
    return _local[1]


def cli() -> CliCluster:
    """The session's command-line cluster (a scheduler and 2 workers), started on first use."""
    if not _cli:
        _cli.append(CliCluster(2))
    return _cli[0]


def stop() -> None:
    """Stops the session's clusters that were started."""
    if _local:
        cluster, client = _local
        _local.clear()
        client.close(timeout=10)
        cluster.close(timeout=10)
    if _cli:
        _cli.pop().close()


def worker_pids(client: Any) -> dict[str, int]:
    """Each worker's address -> the pid of its worker process."""
    return client.run(os.getpid)


def wait_for(condition: Any, what: str, timeout: float = START_SECONDS) -> None:
    """Polls `condition()` until true; fails naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout} s")
        time.sleep(0.05)


def env() -> dict[str, str]:
    path = os.pathsep.join([_TESTS, *sys.path])
    return dict(os.environ, PYTHONPATH=path)


class CliCluster:
    """``dask scheduler`` plus `num_workers` ``dask worker`` processes (1 thread each),
    each a nanny and its worker process, or (``nanny=False``) the worker process alone,
    which nothing restarts when it is killed."""

    def __init__(self, num_workers: int = 2, *, nanny: bool = True) -> None:
        self._nanny = nanny
        self._folder = tempfile.mkdtemp(prefix="resumeloader-dask-")
        scheduler_file = os.path.join(self._folder, "scheduler.json")
        self.workers: list[subprocess.Popen] = []
        self.scheduler = self._spawn(
            "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
            # Its HTTP server (health, metrics) runs even without the dashboard.
            "--dashboard-address", "127.0.0.1:0",
            "--scheduler-file", scheduler_file,
        )
        try:
            wait_for(lambda: _readable(scheduler_file), "the dask scheduler's start")
            with open(scheduler_file) as f:
                self.address: str = json.load(f)["address"]
            for _ in range(num_workers):
                self.add_worker()
            self.wait_for_workers(num_workers)
        except BaseException:
            self.close()
            raise

    def _spawn(self, command: str, *args: str) -> subprocess.Popen:
        log = open(os.path.join(self._folder, f"{command}-{time.monotonic_ns()}.log"), "w")  # noqa: SIM115
        with log:
            return subprocess.Popen(
                [sys.executable, "-m", "dask", command, *args], env=env(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )

    def add_worker(self) -> subprocess.Popen:
        """Starts one more ``dask worker`` (it joins within a second or two)."""
        worker = self._spawn(
            "worker", self.address, "--nthreads", "1", "--host", "127.0.0.1",
            "--no-dashboard", "--dashboard-address", "127.0.0.1:0", "--death-timeout", "30",
            *(() if self._nanny else ("--no-nanny",)),
        )
        self.workers.append(worker)
        return worker

    def client(self) -> Any:
        from distributed import Client

        return Client(self.address, set_as_default=False, timeout=START_SECONDS)

    def num_workers(self) -> int:
        with contextlib.closing(self.client()) as client:
            return len(client.scheduler_info(n_workers=-1)["workers"])

    def wait_for_workers(self, count: int) -> None:
        with contextlib.closing(self.client()) as client:
            client.wait_for_workers(count, timeout=START_SECONDS)

    def kill_scheduler(self) -> None:
        """SIGKILL of the scheduler process."""
        self.scheduler.send_signal(signal.SIGKILL)
        self.scheduler.wait(10)

    def close(self) -> None:
        """Kills every process of the cluster (workers' nannies and their children)."""
        for proc in [*self.workers, self.scheduler]:
            kill_tree(proc)


def _readable(path: str) -> bool:
    try:
        with open(path) as f:
            return "address" in json.load(f)
    except (OSError, ValueError):
        return False


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILLs `proc` and every process under it, and reaps `proc`."""
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    with contextlib.suppress(OSError):
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)
