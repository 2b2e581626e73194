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
refuses to start processes while it is being imported). Each worker runs in a session
of its own, out of the terminal's process group: a Ctrl-C reaches the training process
alone, which closes the cluster. On Linux a worker is killed by the kernel when the
thread that started it ends (``PR_SET_PDEATHSIG``), so a killed training job leaves no
worker behind; a worker also closes itself when its scheduler is gone.

A wait for a batch (`Connection.result`) is one gather of its result, bounded as a
whole by ``Workers.timeout``; before the deadline it asks the scheduler what became of
the task, and the `WorkerError` of a timeout says it.

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
import time
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
_ASK_SECONDS = 2.0  # how long before its deadline a wait asks what became of its task
_CLOSE_SECONDS = 10.0
#: A client that has not been "running" for this long (it lost its scheduler and is
#: reconnecting) has lost the scheduler: distributed itself retries for
#: ``distributed.comm.timeouts.connect`` (30 s by default) before failing the futures.
_LOST_SECONDS = 5.0
_STEP_SECONDS = 0.5  # how often a start checks for interpreter exit
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
            # Not in the terminal's process group: Ctrl-C is the training process's to
            # handle (it closes the cluster); the workers die with it (PDEATHSIG).
            start_new_session=True,
        )
        await super().start()

    async def close(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.returncode is None:
            try:
                children = psutil.Process(process.pid).children(recursive=True)
            except psutil.Error:
                children = []
            # The nanny first: killed after its children, it would relaunch them.
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            for child in children:
                with contextlib.suppress(psutil.Error):
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
            _wait_for_workers(client, num_workers)
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


def _wait_for_workers(client: Any, num_workers: int) -> None:
    """Waits until `num_workers` workers joined (TimeoutError after `START_SECONDS`),
    checking for interpreter exit twice a second (an exit must not wait for a start)."""
    deadline = time.monotonic() + START_SECONDS
    while True:
        exiting.check("a local Dask cluster")
        try:
            client.wait_for_workers(num_workers, timeout=_STEP_SECONDS)
            return
        except TimeoutError:
            if time.monotonic() > deadline:
                raise


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
        if self.local is not None and not threading.main_thread().is_alive():
            # The interpreter is exiting: the scheduler in this process can no longer
            # take a task (its thread pool is shut down; it would log an error).
            msg = "The interpreter is exiting: no more tasks for the local Dask cluster."
            return _Failed(RuntimeError(msg))
        try:
            if self.client.status != "running":
                raise ConnectionError(f"the client's status is {self.client.status!r}")
            return self.client.submit(
                dask_tasks.make_batches, self._digest, task, key=key, pure=True
            )
        except Exception as err:
            return _Failed(self.lost(task, err))

    def result(self, task: Task, pending: Any, timeout: float | None) -> tuple[Any, Any, Any]:
        """The task's reply, made and transferred within `timeout` seconds, raising
        `WorkerError` for what Dask could not make and for a timeout (naming the
        cluster's workers and the task's state, asked of the scheduler before the
        deadline). None waits as long as it takes: with every worker gone, until one
        joins; with a worker stalled in the transfer, until the scheduler drops it. A
        client that lost its scheduler (not "running" for `_LOST_SECONDS`) raises the
        lost scheduler's `WorkerError` then, not after distributed's reconnect timeout."""
        if isinstance(pending, _Failed):
            raise pending.error
        deadline = ask_at = None
        if timeout is not None:
            deadline = time.monotonic() + timeout
            ask_at = deadline - min(_ASK_SECONDS, timeout / 4)
        waiting = self._gathering(task, pending)
        question: futures.Future | None = None
        asked = 0.0
        down_since: float | None = None  # when the client was last seen not running
        try:
            while not futures.wait([waiting], _POLL_SECONDS).done:
                exiting.check("batches on the Dask cluster")
                now = time.monotonic()
                status = self.client.status
                if status == "running":
                    down_since = None
                elif down_since is None:
                    down_since = now
                elif now - down_since > _LOST_SECONDS:
                    raise self.lost(task, ConnectionError(
                        f"the client has been {status!r} for {now - down_since:.1f} s "
                        "(reconnecting to a scheduler it lost)."))
                if question is None and ask_at is not None and now >= ask_at:
                    question, asked = self._asking(task, pending.key), now
                if deadline is not None and now > deadline:
                    assert timeout is not None and question is not None
                    # A tiny timeout gives the question a moment more.
                    what = self._stalled(question, asked, max(deadline, asked + 0.1))
                    raise backend.timed_out(task, timeout, what)
            return self._reply(task, waiting, pending)
        finally:
            waiting.cancel()  # a wait given up stops its gather
            if question is not None:
                question.cancel()

    def _asking(self, task: Task, key: str) -> futures.Future:
        """The scheduler's answer to `_ask` about `key`, on its way."""
        try:
            return self._in_loop(self._ask(key))
        except RuntimeError as err:
            raise self.lost(task, err) from err

    def _in_loop(self, coroutine: Any) -> futures.Future:
        """`coroutine` running in the client's event loop."""
        try:
            return asyncio.run_coroutine_threadsafe(coroutine, self.client.loop.asyncio_loop)
        except RuntimeError:  # the client's event loop is closed
            coroutine.close()
            raise

    def _gathering(self, task: Task, pending: Any) -> futures.Future:
        """The gather of `pending`'s result in the client's event loop: one wait for the
        task and its result's transfer (a finished task whose worker died before the
        transfer is made again, and the same gather waits for it). A failed task is
        skipped instead of raised (`_reply` asks its future for the error): a raising
        gather given up would log "Task exception was never retrieved"."""
        try:
            return self._in_loop(self.client.gather([pending], errors="skip", asynchronous=True))
        except RuntimeError as err:
            raise self.lost(task, err) from err

    def _reply(self, task: Task, waiting: futures.Future, pending: Any) -> tuple[Any, Any, Any]:
        """The finished gather's reply; what Dask could not make as a `WorkerError`."""
        try:
            gathered = waiting.result()
            # Skipped: the task failed or was cancelled; its future raises at once.
            reply: tuple[Any, Any, Any] = (
                gathered[0] if gathered else pending.result(timeout=_ASK_SECONDS)
            )
        except distributed.KilledWorker as err:
            raise self._killed(task, err) from err
        except (asyncio.CancelledError, futures.CancelledError, OSError) as err:
            # Pending futures are cancelled when the scheduler goes; a finished one's
            # result can no longer be fetched (distributed's CommClosedError is an OSError).
            raise self.lost(task, err) from err
        except Exception as err:  # the task itself failed: it never reached our code
            raise self._failed(task, err) from err
        return reply

    async def _ask(self, key: str) -> tuple[int, dict[str, int], str, int]:
        """The cluster's workers, its running workers' threads, the task's state and
        the number of tasks being run, from the scheduler (bounded by `_ASK_SECONDS`)."""

        async def ask() -> tuple[int, dict[str, int], str, int]:
            scheduler = self.client.scheduler
            workers = await scheduler.ncores()
            running = await scheduler.ncores_running()
            status = await scheduler.get_task_status(keys=[key])
            processing = await scheduler.processing()
            state = status.get(key) or "forgotten"
            return len(workers), running, state, sum(len(keys) for keys in processing.values())

        return await asyncio.wait_for(ask(), _ASK_SECONDS)

    def _stalled(self, question: futures.Future, asked: float, until: float) -> str:
        """What the scheduler, asked at `asked` (`time.monotonic()`), said by `until` about
        a task that did not arrive in time."""
        released = " The task was released; the next iteration submits it again."
        try:
            answer = question.result(timeout=max(0.0, until - time.monotonic()))
            workers, running, state, processing = answer
        except Exception as err:  # a scheduler that does not answer is the answer
            what = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            return (
                f"the Dask scheduler at {self.address} did not say what became of the "
                f"task within {until - asked:.2g} s ({what})." + released
            )
        if not running:
            gone = "every worker is gone" if not workers else (
                f"its {workers} worker{'s are' if workers != 1 else ' is'} paused or closing"
            )
            return (
                f"the Dask cluster at {self.address} has no running worker ({gone}: "
                f"nothing is made until one joins or resumes); the task is {state!r} on "
                "its scheduler." + released
            )
        why = {
            "memory": "made, but its result did not arrive from the worker holding it (a "
            "stalled or unreachable worker?)",
            "processing": "being made (a stalled map_fn or source?)",
        }.get(state, "waiting for a worker (workers busy with other work?)")
        return (
            f"the Dask cluster at {self.address} has {len(running)} running "
            f"worker{'s' if len(running) != 1 else ''} ({sum(running.values())} threads) "
            f"processing {processing} task{'s' if processing != 1 else ''}; the task is "
            f"{state!r} on its scheduler: {why}." + released
        )

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
