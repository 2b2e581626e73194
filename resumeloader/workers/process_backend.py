"""`ProcessBackend`: the loader's worker processes (`processes.ProcessPool`).

The processes start once (`start`, or the first iteration) and serve every iteration
and epoch until `close`, garbage collection or interpreter exit; batches come back
through shared memory. No TensorFlow here.
"""

from __future__ import annotations

import pickle
import sys
import threading
from collections.abc import Iterator
from typing import ClassVar

import cloudpickle

from resumeloader.stages import plan as plan_lib
from resumeloader.workers import backend, options, processes, produce

__all__ = ["ProcessBackend"]

Task = plan_lib.Task


class ProcessBackend:
    """``Workers(n, kind="process")``: `n` worker processes, at most `window` tasks ahead.

    Args:
        workers: its options.
        producer: what makes each task's batches (its pipeline and record spec are
            sent pickled to each process, once).

    Raises:
        TypeError: the pipeline's source, a record stage's function or the error
            policy's function cannot be pickled.
    """

    kind: ClassVar[str] = "process"
    option_fields: ClassVar[tuple[str, ...]] = ("timeout", "window")

    def __init__(self, workers: options.Workers, producer: produce.BatchProducer) -> None:
        backend.check_picklable(producer.pipeline, kind=self.kind)
        self._workers = workers
        self._producer = producer
        self._pool: processes.ProcessPool | None = None
        self._lock = threading.Lock()
        self._runs = 0  # iterations running on the pool
        self._released = False  # the loader is gone: the pool lives only for those runs

    @classmethod
    def check(cls, workers: options.Workers) -> None:
        backend.needs_workers(workers)
        if sys.platform == "win32":
            msg = (
                "kind='process' needs a POSIX system (Linux, macOS): it passes shared memory "
                "between processes as file descriptors. Received: kind='process' on "
                "Windows. Use kind='thread'."
            )
            raise ValueError(msg)

    @property
    def window(self) -> int:
        return self._workers.window or processes.SLOTS * self._workers.num_workers

    @property
    def pids(self) -> list[int]:
        """The process ids of the live workers (empty before they start)."""
        pool = self._pool
        return [] if pool is None else pool.pids

    def start(self) -> None:
        self._started()

    def _started(self) -> processes.ProcessPool:
        with self._lock:
            if self._pool is None:
                producer = self._producer
                payload = cloudpickle.dumps(
                    (producer.pipeline, producer.spec), protocol=pickle.HIGHEST_PROTOCOL
                )
                self._pool = processes.ProcessPool(
                    payload, producer.output_spec, self._workers.num_workers,
                    timeout=self._workers.timeout, on_skips=producer.skips.put,
                    window=self.window,
                )
            return self._pool

    def run(self, tasks: Iterator[Task]) -> Iterator[tuple[Task, produce.Produced]]:
        with self._lock:
            self._runs += 1
        try:
            yield from self._started().run(tasks)
        finally:
            with self._lock:
                self._runs -= 1
                idle = self._released and not self._runs
            if idle:
                self.close()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def release(self) -> None:
        """The loader is gone: stops the worker processes now, or when the iterations still
        running on them end (then after every later iteration, e.g. of a dataset that
        outlived its loader)."""
        with self._lock:
            self._released = True
            idle = not self._runs
        if idle:
            self.close()

    def describe(self) -> str:
        count = self._workers.num_workers
        return (
            f"{count} process worker{'s' if count != 1 else ''}, <= {self.window} in flight, "
            "in order, shared memory"
        )
