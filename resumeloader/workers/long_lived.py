"""`LongLivedBackend`: the lifetime of workers that outlive an iteration (processes, Dask).

Such workers start once — from the thread that builds a pipeline (`start`), or the
first iteration — and serve every iteration and epoch until `close`, or until the
loader is gone (`release`: they stop as soon as no iteration is running on them; an
iteration started later, e.g. of a dataset that outlived its loader, starts them
again and stops them when it ends). A subclass says only what its workers are:
`_open` starts them (once; returns a handle), `_run` makes a run's tasks with them,
`_stop` stops them. No TensorFlow here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, ClassVar

from resumeloader.stages import plan as plan_lib
from resumeloader.workers import backend, depth, options, produce

__all__ = ["LongLivedBackend"]

Task = plan_lib.Task


class LongLivedBackend:
    """A worker backend whose workers live as long as the loader (module docstring).

    Args:
        workers: its options.
        producer: what makes each task's batches (its pipeline and record spec travel
            pickled to workers in other processes, once).

    Raises:
        TypeError: the workers are in other processes (not `reads_in_this_process`) and
            the pipeline's source, a record stage's function or the error policy's
            function cannot be pickled.
    """

    kind: ClassVar[str]
    option_fields: ClassVar[tuple[str, ...]] = ("timeout", "window")
    options_type: ClassVar[type | None] = None
    reads_in_this_process: ClassVar[bool] = False
    parallel: ClassVar[bool] = True

    def __init__(self, workers: options.Workers, producer: produce.BatchProducer) -> None:
        if not self.reads_in_this_process:
            backend.check_picklable(producer.pipeline, kind=self.kind)
        self._workers = workers
        self._producer = producer
        self._lock = threading.Lock()
        self._handle: Any = None  # what `_open` returned, until `close`
        self._runs = 0  # iterations running on the workers
        self._released = False  # the loader is gone: the workers live only for those runs
        #: The window chosen from measurements (``window="auto"``; a subclass makes it), or None.
        self.depth: depth.AutoDepth | None = None

    # -- what a subclass says --------------------------------------------------------
    def _open(self) -> Any:
        """Starts the workers (called once per lifetime, under the lock); their handle."""
        raise NotImplementedError

    def _run(self, handle: Any, tasks: Iterator[Task]) -> Iterator[tuple[Task, produce.Produced]]:
        """``(task, its batches)`` in task order, made by the workers of `handle`."""
        raise NotImplementedError

    def _stop(self, handle: Any) -> None:
        """Stops the workers of `handle` (not under the lock)."""
        raise NotImplementedError

    # -- the lifetime ----------------------------------------------------------------
    def start(self) -> None:
        self._started()

    def _started(self) -> Any:
        with self._lock:
            if self._handle is None:
                self._handle = self._open()
            return self._handle

    def _current(self) -> Any:
        """The handle of the running workers, or None once closed."""
        with self._lock:
            return self._handle

    def run(self, tasks: Iterator[Task]) -> Iterator[tuple[Task, produce.Produced]]:
        with self._lock:
            self._runs += 1
        try:
            produced = self._run(self._started(), tasks)
            yield from produced if self.depth is None else self.depth.timed(produced)
        finally:
            with self._lock:
                self._runs -= 1
                idle = self._released and not self._runs
            if idle:
                self.close()

    def close(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
        if handle is not None:
            self._stop(handle)

    def release(self) -> None:
        """The loader is gone: stops the workers now, or when the iterations still running
        on them end (then after every later iteration, e.g. of a dataset that outlived
        its loader)."""
        with self._lock:
            self._released = True
            idle = not self._runs
        if idle:
            self.close()
