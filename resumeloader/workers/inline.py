"""`InlineBackend`: batches made one by one in the thread that iterates the loader."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar

from resumeloader.stages import plan as plan_lib
from resumeloader.workers import options, produce

__all__ = ["InlineBackend"]


class InlineBackend:
    """`Workers()` (no workers): each task made when the consumer asks for it.

    Args:
        workers: its options (``num_workers=0``).
        producer: what makes each task's batches.
    """

    kind: ClassVar[str] = "inline"
    option_fields: ClassVar[tuple[str, ...]] = ()
    options_type: ClassVar[type | None] = None
    reads_in_this_process: ClassVar[bool] = True
    parallel: ClassVar[bool] = False

    def __init__(self, workers: options.Workers, producer: produce.BatchProducer) -> None:
        self._producer = producer

    @classmethod
    def check(cls, workers: options.Workers) -> None:
        if workers.num_workers:
            msg = (
                "kind='inline' makes batches in the calling thread, without workers. "
                f"Received: num_workers={workers.num_workers}. Expected: num_workers=0, or "
                "kind='thread' or 'process'."
            )
            raise ValueError(msg)
        if workers.timeout is not None:
            msg = (
                "`timeout` needs num_workers >= 1: without workers batches are made in the "
                f"calling thread, which cannot be timed out. Received: timeout={workers.timeout},"
                " num_workers=0."
            )
            raise ValueError(msg)
        if workers.window is not None:
            msg = (
                "`window` needs num_workers >= 1: without workers one batch is made at a "
                f"time, when it is asked for. Received: window={workers.window!r}, num_workers=0."
            )
            raise ValueError(msg)

    @property
    def window(self) -> int:
        return 1

    def start(self) -> None:
        pass

    def run(
        self, tasks: Iterator[plan_lib.Task]
    ) -> Iterator[tuple[plan_lib.Task, produce.Produced]]:
        return self._producer.run(tasks)

    def close(self) -> None:
        pass

    def release(self) -> None:
        pass

    def describe(self) -> str:
        return "in the generator thread (num_workers=0)"
