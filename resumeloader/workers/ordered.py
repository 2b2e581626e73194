"""Ordered parallel batch production: in the calling thread, or thread and process pools.

A task is one batch (record indices, epoch, position); workers run
`BatchProducer.batch` on it and the results are handed out strictly in task order,
with a bounded number of batches in flight. The stream is therefore the same for
any number and kind of workers, and restoring with another ``num_workers`` is exact.

Process workers live in `resumeloader.workers.processes`. A pool lives as long as one
iteration of the loader (one generator): it starts with the first batch (for processes, about a
second) and is shut down when the iteration ends, fails or is garbage collected.
Like the batch producer it drives, this module imports no TensorFlow: keep it so.
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Iterator
from concurrent import futures
from typing import Any

from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import processes, produce

__all__ = ["WorkerSettings"]

WORKER_TYPES = ("thread", "process")
Task = plan_lib.Task


class _NullWriter:
    def write(self, data: bytes) -> int:
        return memoryview(data).nbytes


def _check_picklable(name: str, value: Any) -> None:
    try:
        pickle.Pickler(_NullWriter(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    except Exception as err:
        msg = (
            f"`{name}` cannot be pickled, but worker_type='process' sends it pickled to each "
            f"worker process: {type(err).__name__}: {err}. Received: {name} of type "
            f"{type(value).__name__}. Expected: a picklable object (a module-level function or "
            "class, not a lambda or a closure), or worker_type='thread'."
        )
        raise TypeError(msg) from err


class WorkerSettings:
    """How batches are produced: in the calling thread, or by a thread or process pool.

    Args:
        num_workers: 0 produces batches in the calling thread.
        worker_type: "thread" or "process".
        pipeline: the pipeline whose batches the workers produce (sent pickled to
            process workers).

    Raises:
        TypeError: process workers are requested and the pipeline's source or a
            record stage's function cannot be pickled.
    """

    def __init__(
        self, num_workers: int, worker_type: str, *, pipeline: pipeline_lib.Pipeline
    ) -> None:
        if worker_type not in WORKER_TYPES:
            msg = (
                "`worker_type` must be 'thread' or 'process'. "
                f"Received: worker_type={worker_type!r}."
            )
            raise ValueError(msg)
        self.num_workers = num_workers
        self.worker_type = worker_type
        if num_workers and worker_type == "process":
            _check_picklable("source", pipeline.source)
            for stage in pipeline.record_stages:
                name = "map_fn" if stage.name == "map" else f"stage {stage.name}"
                _check_picklable(name, getattr(stage, "fn", stage))

    @property
    def in_flight(self) -> int:
        """The most batches being prepared or waiting at any time."""
        return self.num_workers * processes.SLOTS

    def produce(
        self, producer: produce.BatchProducer, tasks: Iterator[Task]
    ) -> Iterator[tuple[Task, Any]]:
        """Yields ``(task, batch)`` for each task, in task order; closes its pool when closed."""
        if not self.num_workers:
            for task in tasks:
                yield task, producer.batch(task)
            return
        pool: _ThreadPool | processes.ProcessPool
        if self.worker_type == "thread":
            pool = _ThreadPool(producer, self.num_workers)
        else:
            payload = pickle.dumps(
                (producer.pipeline, producer.spec), protocol=pickle.HIGHEST_PROTOCOL
            )
            pool = processes.ProcessPool(payload, producer.spec, self.num_workers)
        try:
            yield from _ordered(pool, tasks, self.in_flight)
        finally:
            pool.close()


def _ordered(pool: Any, tasks: Iterator[Task], in_flight: int) -> Iterator[tuple[Task, Any]]:
    pending: deque[tuple[Task, Any]] = deque()
    for task in tasks:
        pending.append((task, pool.submit(task)))
        if len(pending) >= in_flight:
            break
    while pending:
        task, handle = pending.popleft()
        batch = pool.result(task, handle)
        following = next(tasks, None)
        if following is not None:
            pending.append((following, pool.submit(following)))
        yield task, batch


class _ThreadPool:
    def __init__(self, producer: produce.BatchProducer, num_workers: int) -> None:
        self._producer = producer
        self._executor = futures.ThreadPoolExecutor(num_workers, "resumeloader-worker")

    def submit(self, task: Task) -> futures.Future[Any]:
        return self._executor.submit(self._producer.batch, task)

    def result(self, task: Task, handle: futures.Future[Any]) -> Any:
        return handle.result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
