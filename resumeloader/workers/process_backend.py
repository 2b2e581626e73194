"""`ProcessBackend`: the loader's worker processes (`processes.ProcessPool`).

The processes start once (`start`, or the first iteration) and serve every iteration
and epoch until `close`, garbage collection or interpreter exit; batches come back
through shared memory. No TensorFlow here.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from typing import ClassVar

import cloudpickle

from resumeloader.stages import plan as plan_lib
from resumeloader.workers import backend, long_lived, options, processes, produce

__all__ = ["ProcessBackend"]

Task = plan_lib.Task


class ProcessBackend(long_lived.LongLivedBackend):
    """``Workers(n, kind="process")``: `n` worker processes, at most `window` tasks ahead
    (arguments and errors: `LongLivedBackend`)."""

    kind: ClassVar[str] = "process"

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
        pool = self._current()
        return [] if pool is None else pool.pids

    def _open(self) -> processes.ProcessPool:
        producer = self._producer
        payload = cloudpickle.dumps(
            (producer.pipeline, producer.spec), protocol=pickle.HIGHEST_PROTOCOL
        )
        return processes.ProcessPool(
            payload, producer.output_spec, self._workers.num_workers,
            timeout=self._workers.timeout, on_skips=producer.skips.put, window=self.window,
            board=producer.board,
        )

    def _run(
        self, handle: processes.ProcessPool, tasks: Iterator[Task]
    ) -> Iterator[tuple[Task, produce.Produced]]:
        return handle.run(tasks)

    def _stop(self, handle: processes.ProcessPool) -> None:
        handle.close()

    def describe(self) -> str:
        count = self._workers.num_workers
        return (
            f"{count} process worker{'s' if count != 1 else ''}, <= {self.window} in flight, "
            "in order, shared memory"
        )
