"""The Dask backend's connection to its cluster, and the local cluster a loader owns.

`Connection` holds the client (given, connected to an address, or of a local cluster
the loader started), registers the loader's pipeline on the workers, submits batch
tasks and waits for them, naming what a cluster can lose: the scheduler (a
`WorkerError` naming the position), workers (retried by Dask until one task killed
``allowed-failures + 1`` of them), a task that never reached resumeloader's code.

Without a client nor an address, the loader starts a ``distributed.SpecCluster``: the
scheduler runs in the loader's process (in distributed's event-loop thread), each
worker is a ``dask spec`` process (a nanny and its worker process, one thread) started
as a fresh interpreter with the parent's ``sys.path``. Not `distributed.LocalCluster`'s
process workers: those are started by `multiprocessing`'s spawn, which runs the user's
``__main__`` again in every worker, so a training script without an ``if __name__ ==
"__main__":`` guard fails to start its cluster (each worker re-runs the script and
refuses to start processes while it is being imported). On Linux a worker is killed by
the kernel when the thread that started it ends (``PR_SET_PDEATHSIG``), so a killed
training job leaves no worker behind; a worker also closes itself when its scheduler
is gone.

Imported only by `resumeloader.workers.dask_backend` once ``kind="dask"`` is chosen.
No TensorFlow here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import subprocess
import sys
import threading
import uuid
from concurrent import futures
from typing import Any

import distributed
import psutil
from distributed.deploy import spec as spec_lib

from resumeloader import errors
from resumeloader.core import exiting
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import backend, dask_tasks, options

__all__ = ["START_SECONDS", "Connection", "release", "start"]

Task = plan_lib.Task

#: How long the workers of a new local cluster may take to join it.
START_SECONDS = 60.0
_POLL_SECONDS = 0.05  # how often a wait for a batch checks for interpreter exit
_CLOSE_SECONDS = 10.0
_BOOT = (
    "import sys; sys.path[:] = {path!r}\n"
    "if sys.platform.startswith('linux'):\n"
    "    import ctypes, signal\n"
    "    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG\n"
    "from distributed.cli.dask_spec import main\n"
    "main(prog_name='dask spec')\n"
)


class _WorkerProcess(spec_lib.ProcessInterface):
    """One worker of the local cluster: a ``dask spec`` interpreter running a nanny."""

    def __init__(self, scheduler: str, name: Any = None) -> None:
        super().__init__()
        self.scheduler = scheduler
        self.name = name
        self.process: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        options = {
            "nthreads": 1, "host": "127.0.0.1", "name": self.name, "dashboard": False,
            "dashboard_address": "127.0.0.1:0",
            "silence_logs": logging.WARNING,
        }
        spec = json.dumps({"cls": "distributed.Nanny", "opts": options})
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _BOOT.format(path=list(sys.path)), self.scheduler,
            "--spec", spec, stdin=subprocess.DEVNULL,
        )
        await super().start()

    async def close(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            try:
                children = psutil.Process(process.pid).children(recursive=True)
            except psutil.Error:
                children = []
            for child in [*children, process]:
                with contextlib.suppress(ProcessLookupError, psutil.Error):
                    child.kill()
            await process.wait()
        await super().close()


def start(num_workers: int) -> tuple[Any, Any]:
    """A new local cluster of `num_workers` worker processes and a client of it, once
    every worker has joined.

    Raises:
        TimeoutError: the workers did not all join within `START_SECONDS`.
    """
    scheduler = {
        "cls": distributed.Scheduler,
        "options": {
            "host": "127.0.0.1", "port": 0, "dashboard": False,
            "dashboard_address": "127.0.0.1:0",  # its HTTP server runs even so
        },
    }
    workers = {i: {"cls": _WorkerProcess, "options": {}} for i in range(num_workers)}
    cluster = spec_lib.SpecCluster(
        workers=workers, scheduler=scheduler, worker={"cls": _WorkerProcess, "options": {}},
        silence_logs=logging.WARNING, name="resumeloader",
    )
    try:
        client = distributed.Client(cluster, set_as_default=False)
        try:
            client.wait_for_workers(num_workers, timeout=START_SECONDS)
        except BaseException:
            client.close()
            raise
    except BaseException as err:
        cluster.close()
        if isinstance(err, TimeoutError):
            msg = (
                f"The local Dask cluster's {num_workers} worker processes did not all start "
                f"within {START_SECONDS:.0f} s (see their output above). Received: "
                f"Workers({num_workers}, kind='dask'). Expected: workers that can start on "
                "this machine, or a `client` / `address` of a running cluster."
            )
            raise TimeoutError(msg) from err
        raise
    return cluster, client


def release(pending: Any) -> None:
    """Drops a pending task that will not be waited for: released, never cancelled (another
    iteration of the same loader may hold the same key)."""
    release = getattr(pending, "release", None)
    if release is not None:
        release()


class _Failed:
    """A task that could not be submitted: its error is raised when it is waited for."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


class Connection:
    """A connection to a Dask cluster with the loader's pipeline registered on it."""

    def __init__(self, workers: options.Workers, payload: bytes, prefix: str) -> None:
        self.local: Any = None
        where = workers.options  # a DaskOptions
        if where.client is not None:
            self.client, self._owns_client = where.client, False
        elif where.address is not None:
            self.client = _connect(where.address)
            self._owns_client = True
        else:
            self.local, self.client = start(workers.num_workers)
            self._owns_client = True
        self.address = self.client.scheduler.address
        self._prefix = prefix
        self._digest = prefix.rsplit("-", 1)[-1]
        self._plugin = f"resumeloader-{self._digest}-{uuid.uuid4().hex[:8]}"
        try:
            plugin = dask_tasks.PipelinePlugin(payload, self._digest, self._plugin)
            self.client.register_plugin(plugin, name=self._plugin)
        except BaseException:
            self.close()
            raise

    def submit(self, task: Task, key: str) -> Any:
        """Submits `task` under `key`; a task that cannot be submitted fails when its
        result is asked for (in task order)."""
        try:
            if self.client.status != "running":
                raise ConnectionError(f"the client's status is {self.client.status!r}")
            return self.client.submit(
                dask_tasks.make_batches, self._digest, task, key=key, pure=True
            )
        except Exception as err:
            return _Failed(self.lost(task, err))

    def result(self, task: Task, pending: Any, timeout: float | None) -> tuple[Any, Any, Any]:
        """The task's reply, waiting at most `timeout` seconds (None: as long as the
        cluster lives), raising `WorkerError` for what Dask could not make."""
        if isinstance(pending, _Failed):
            raise pending.error
        done = threading.Event()
        pending.add_done_callback(lambda _: done.set())
        waited = 0.0
        while not done.wait(_POLL_SECONDS):
            exiting.check("batches on the Dask cluster")
            waited += _POLL_SECONDS
            if timeout is not None and waited > timeout:
                what = (
                    "the Dask cluster has not made it (no worker free, or a stalled map_fn "
                    "or source?); the task was released and the next iteration submits it "
                    "again."
                )
                raise backend.timed_out(task, timeout, what)
        try:
            reply: tuple[Any, Any, Any] = pending.result()
        except distributed.KilledWorker as err:
            raise self._killed(task, err) from err
        except (asyncio.CancelledError, futures.CancelledError, OSError) as err:
            # Pending futures are cancelled when the scheduler goes; a finished one's
            # result can no longer be fetched (distributed's CommClosedError is an OSError).
            raise self.lost(task, err) from err
        except Exception as err:  # the task itself failed: it never reached our code
            raise self._failed(task, err) from err
        return reply

    def lost(self, task: Task, err: BaseException) -> errors.WorkerError:
        return _error(
            task,
            f"Lost the Dask scheduler at {self.address} while waiting for the batch of "
            f"{len(task.indices)} records at position {task.position} (epoch {task.epoch}, "
            f"first record index {int(task.indices[0])}): {type(err).__name__}: {err} No "
            "batch was lost: the position was not advanced. Restore the last checkpoint "
            "and resume, on this cluster once its scheduler is back or on any other.",
        )

    def _failed(self, task: Task, err: BaseException) -> errors.WorkerError:
        return _error(
            task,
            f"The Dask cluster at {self.address} failed the batch of {len(task.indices)} "
            f"records at position {task.position} (epoch {task.epoch}, first record index "
            f"{int(task.indices[0])}) before resumeloader's task ran: {type(err).__name__}: "
            f"{err} Is resumeloader (and every module the pipeline's functions import) "
            "installed on the workers, in the same versions? The position was not advanced.",
        )

    def _killed(self, task: Task, err: Any) -> errors.WorkerError:
        return _error(
            task,
            f"The batch of {len(task.indices)} records at position {task.position} (epoch "
            f"{task.epoch}, first record index {int(task.indices[0])}) was lost with "
            f"{err.allowed_failures + 1} Dask workers that died while making it "
            f"(distributed.scheduler.allowed-failures={err.allowed_failures}; last on "
            f"{err.last_worker.address}): a record that kills its worker (out of memory, a "
            "crash in native code)? The position was not advanced.",
        )

    def close(self) -> None:
        """Unregisters the pipeline; closes the client and the cluster the loader owns."""
        client = self.client
        if client.status == "running" and self.local is None:
            # Bounded: a scheduler that stopped answering must not hold up the close.
            thread = threading.Thread(
                target=_quietly, args=(client.unregister_worker_plugin, self._plugin),
                name="resumeloader-dask-close", daemon=True,
            )
            thread.start()
            thread.join(_CLOSE_SECONDS)
        if self._owns_client:
            with contextlib.suppress(Exception):  # a lost scheduler: nothing to tell it
                client.close(timeout=_CLOSE_SECONDS)
        if self.local is not None:
            self.local.close(timeout=_CLOSE_SECONDS)


def _quietly(call: Any, *args: Any) -> None:
    with contextlib.suppress(Exception):  # the cluster is going away, or forgot it already
        call(*args)


def _connect(address: str) -> Any:
    try:
        return distributed.Client(address, set_as_default=False)
    except (OSError, TimeoutError) as err:
        msg = (
            f"Could not connect to the Dask scheduler at {address}: {type(err).__name__}: "
            f"{err}. Received: DaskOptions(address={address!r}). Expected: the "
            "address of a running scheduler this machine can reach."
        )
        raise ConnectionError(msg) from err


def _error(task: Task, msg: str) -> errors.WorkerError:
    """A `WorkerError` for `task`'s batch, naming its position, epoch and first record."""
    return errors.WorkerError(
        msg, record_index=int(task.indices[0]), epoch=task.epoch, position=task.position
    )
