"""Ordered parallel batch production: in the calling thread, or thread and process pools.

A task is one batch, or one window of a windowed batch stage (record indices, epoch,
position); workers run `BatchProducer.batch` on it and the results (the task's
batches, `produce.Produced`) are handed out strictly in task order,
with a bounded number of batches in flight. The stream is therefore the same for
any number and kind of workers, and restoring with another ``num_workers`` is exact.

Process workers (`resumeloader.workers.processes`) live as long as the loader: they
start once (``start``, or the first iteration) and serve every iteration and epoch
until ``close()``, garbage collection or interpreter exit. Thread workers are daemon
threads started per iteration: a thread stalled in user code never keeps the
interpreter from exiting (Ctrl-C), and is left behind by an iteration that ends.
With a ``timeout`` a batch that does not arrive in time raises a `WorkerError` naming it.
Like the batch producer it drives, this module imports no TensorFlow: keep it so.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import queue
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import cloudpickle

from resumeloader import errors
from resumeloader.core import exiting
from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import processes, produce

__all__ = ["WorkerSettings"]

WORKER_TYPES = ("thread", "process")
Task = plan_lib.Task
# Closing an iteration waits this long for thread workers stalled in user code.
_JOIN_SECONDS = 0.25


class _NullWriter:
    def write(self, data: bytes) -> int:
        return memoryview(data).nbytes


def _check_picklable(name: str, value: Any) -> None:
    try:
        cloudpickle.CloudPickler(_NullWriter(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except Exception as err:
        msg = (
            f"`{name}` cannot be pickled, but worker_type='process' sends it pickled to each "
            f"worker process: {type(err).__name__}: {err}. Received: {name} of type "
            f"{type(value).__name__}. Expected: a picklable object (functions, lambdas and "
            "classes are; open files, locks and connections are not), or worker_type='thread'."
        )
        raise TypeError(msg) from err


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        msg = (
            "`worker_timeout` must be None or a positive, finite number of seconds. "
            f"Received: worker_timeout={value!r}."
        )
        raise (ValueError if ok else TypeError)(msg)
    return float(value)


class WorkerSettings:
    """How batches are produced: in the calling thread, or by a thread or process pool.

    Args:
        num_workers: 0 produces batches in the calling thread.
        worker_type: "thread" or "process".
        pipeline: the pipeline whose batches the workers produce (sent pickled to
            process workers).
        timeout: seconds to wait for one batch from a worker before raising a
            `WorkerError` naming it (a stalled process worker is stopped; a process's
            start-up is not counted); None waits as long as the worker lives. Needs
            ``num_workers >= 1``.

    Raises:
        TypeError: process workers are requested and the pipeline's source or a
            record stage's function cannot be pickled.
        ValueError: an invalid argument.
    """

    def __init__(
        self,
        num_workers: int,
        worker_type: str,
        *,
        pipeline: pipeline_lib.Pipeline,
        timeout: float | None = None,
    ) -> None:
        if worker_type not in WORKER_TYPES:
            msg = (
                "`worker_type` must be 'thread' or 'process'. "
                f"Received: worker_type={worker_type!r}."
            )
            raise ValueError(msg)
        self.num_workers = num_workers
        self.worker_type = worker_type
        self.timeout = _timeout(timeout)
        if self.timeout is not None and not num_workers:
            msg = (
                "`worker_timeout` needs num_workers >= 1: without workers batches are "
                "made in the calling thread, which cannot be timed out. Received: "
                f"worker_timeout={timeout!r}, num_workers=0."
            )
            raise ValueError(msg)
        if num_workers and worker_type == "process":
            if sys.platform == "win32":
                msg = (
                    "worker_type='process' needs a POSIX system (Linux, macOS): it passes "
                    "shared memory between processes as file descriptors. Received: "
                    "worker_type='process' on Windows. Use worker_type='thread'."
                )
                raise ValueError(msg)
            _check_picklable("source", pipeline.source)
            for stage in pipeline.record_stages:
                name = "map_fn" if stage.name == "map" else f"stage {stage.name}"
                _check_picklable(name, getattr(stage, "fn", stage))
            if pipeline.error_policy.fn is not None:
                _check_picklable("on_error policy", pipeline.error_policy.fn)
        self._pool: processes.ProcessPool | None = None
        self._lock = threading.Lock()
        self._runs = 0  # iterations running on the process pool
        self._released = False  # the loader is gone: the pool lives only for those runs

    @property
    def in_flight(self) -> int:
        """The most batches being prepared or waiting at any time."""
        return self.num_workers * processes.SLOTS

    @property
    def pids(self) -> list[int]:
        """The process ids of the live process workers (empty before they start)."""
        pool = self._pool
        return [] if pool is None else pool.pids

    def start(self, producer: produce.BatchProducer) -> processes.ProcessPool | None:
        """Starts the process workers if they are not running; returns their pool.

        Starting them from the thread that builds the pipeline (usually the main
        one) lets the kernel stop them the instant that thread's process dies.
        """
        if not self.num_workers or self.worker_type != "process":
            return None
        with self._lock:
            if self._pool is None:
                payload = cloudpickle.dumps(
                    (producer.pipeline, producer.spec), protocol=pickle.HIGHEST_PROTOCOL
                )
                self._pool = processes.ProcessPool(
                    payload, producer.output_spec, self.num_workers, timeout=self.timeout,
                    on_skips=producer.skips.put,
                )
            return self._pool

    def close(self) -> None:
        """Stops the process workers; a later iteration starts new ones."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def release(self) -> None:
        """The loader is gone: stops the process workers now, or when the iterations still
        running on them end (then after every later iteration, e.g. of a dataset that
        outlived its loader)."""
        with self._lock:
            self._released = True
            idle = not self._runs
        if idle:
            self.close()

    def produce(
        self, producer: produce.BatchProducer, tasks: Iterator[Task]
    ) -> Iterator[tuple[Task, produce.Produced]]:
        """Yields ``(task, its batches)`` for each task, in task order."""
        if not self.num_workers:
            for task in tasks:
                yield task, producer.batch(task)
            return
        if self.worker_type == "process":
            with self._lock:
                self._runs += 1
            try:
                pool = self.start(producer)
                assert pool is not None
                yield from pool.run(tasks)
            finally:
                with self._lock:
                    self._runs -= 1
                    idle = self._released and not self._runs
                if idle:
                    self.close()
            return
        threads = _ThreadPool(producer, self.num_workers, self.timeout)
        pending: deque[tuple[Task, futures.Future[Any]]] = deque()
        try:
            for task in tasks:
                pending.append((task, threads.submit(task)))
                if len(pending) >= self.in_flight:
                    break
            while pending:
                task, future = pending.popleft()
                batch = threads.result(task, future)
                following = next(tasks, None)
                if following is not None:
                    pending.append((following, threads.submit(following)))
                yield task, batch
        finally:
            for _, future in pending:
                future.cancel()
            threads.close()


class _ThreadPool:
    """Daemon threads running `BatchProducer.batch` on submitted tasks."""

    def __init__(
        self, producer: produce.BatchProducer, num_workers: int, timeout: float | None
    ) -> None:
        self._producer = producer
        self._timeout = timeout
        self._inbox: queue.SimpleQueue[tuple[futures.Future[Any], Task] | None] = (
            queue.SimpleQueue()
        )
        self._threads = [
            threading.Thread(target=self._serve, name=f"resumeloader-worker-{i}", daemon=True)
            for i in range(num_workers)
        ]
        self._submitted: weakref.WeakSet[futures.Future[Any]] = weakref.WeakSet()
        exiting.on_exit(self._exit)
        for thread in self._threads:
            thread.start()

    def _serve(self) -> None:
        # Busy in the pool's own code (where it holds a future's lock), not in user code:
        # at interpreter exit the threads leave the pool's code before CPython finalizes,
        # and one stalled in a map_fn does not hold up the exit (`resumeloader.core.exiting`).
        while True:
            item = self._inbox.get()
            with exiting.busy():
                if item is None:
                    return
                future, task = item
                if exiting.EXITING.is_set() or not future.set_running_or_notify_cancel():
                    continue
            error: BaseException | None = None
            try:
                batch = self._producer.batch(task)
            except BaseException as err:  # handed to the consumer
                error = err
            with exiting.busy(), contextlib.suppress(futures.InvalidStateError):
                # (failed by `_exit` meanwhile: the interpreter is exiting)
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(batch)

    def _exit(self) -> None:
        """At interpreter exit: the batches not made fail (the consumer waiting for one
        leaves), and the threads stop."""
        error = RuntimeError("The interpreter is exiting: no more batches are made.")
        for future in list(self._submitted):
            with contextlib.suppress(futures.InvalidStateError):
                if not future.cancel():
                    future.set_exception(error)
        self.close()

    def submit(self, task: Task) -> futures.Future[Any]:
        future: futures.Future[Any] = futures.Future()
        self._submitted.add(future)
        self._inbox.put((future, task))
        return future

    def result(self, task: Task, future: futures.Future[Any]) -> Any:
        try:
            return future.result(self._timeout)
        except futures.TimeoutError:
            first = int(task.indices[0])
            msg = (
                f"No batch arrived within worker_timeout={self._timeout} s for the batch of "
                f"{len(task.indices)} records at position {task.position} (epoch "
                f"{task.epoch}, first record index {first}): a worker thread is still "
                "running it (a stalled map_fn or source?). Threads cannot be stopped: it is "
                "left running as a daemon thread. The position was not advanced."
            )
            raise errors.WorkerError(
                msg, record_index=first, epoch=task.epoch, position=task.position
            ) from None

    def close(self) -> None:
        """Stops the threads, waiting at most 0.25 s for those stalled in user code."""
        for _ in self._threads:
            self._inbox.put(None)
        deadline = time.monotonic() + _JOIN_SECONDS
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
