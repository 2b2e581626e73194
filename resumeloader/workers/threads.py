"""`ThreadBackend`: daemon threads making batch tasks, handed back in task order.

The threads are started per iteration (`run`) and are daemons: a thread stalled in
user code never keeps the interpreter from exiting (Ctrl-C), and is left behind by an
iteration that ends (closing waits at most 0.25 s for it). With a ``timeout`` a batch
that does not arrive in time raises a `WorkerError` naming it. No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from concurrent import futures
from typing import Any, ClassVar

from resumeloader.core import exiting, waits
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import backend, depth, options, produce

__all__ = ["SLOTS", "ThreadBackend"]

Task = plan_lib.Task
#: Tasks in flight per thread by default: one being made, one waiting.
SLOTS = 2
# Closing an iteration waits this long for threads stalled in user code.
_JOIN_SECONDS = 0.25


class ThreadBackend:
    """``Workers(n, kind="thread")``: `n` daemon threads, at most `window` tasks ahead.

    Args:
        workers: its options.
        producer: what makes each task's batches (shared by the threads).
    """

    kind: ClassVar[str] = "thread"
    option_fields: ClassVar[tuple[str, ...]] = ("timeout", "window")
    options_type: ClassVar[type | None] = None
    reads_in_this_process: ClassVar[bool] = True
    parallel: ClassVar[bool] = True

    def __init__(self, workers: options.Workers, producer: produce.BatchProducer) -> None:
        self._workers = workers
        self._producer = producer
        count = workers.num_workers
        #: The window chosen from measurements (``window="auto"``), or None.
        self.depth = None if workers.window != depth.AUTO else depth.AutoDepth(
            producer, default=lambda: SLOTS * count, kind="thread", num_workers=count,
            where=f"{count} thread worker{'s' if count != 1 else ''}",
        )

    @classmethod
    def check(cls, workers: options.Workers) -> None:
        backend.needs_workers(workers)

    @property
    def window(self) -> int:
        if self.depth is not None:
            return self.depth.window
        return self._workers.window or SLOTS * self._workers.num_workers  # type: ignore[return-value]

    def start(self) -> None:
        pass  # threads start with each iteration

    def run(self, tasks: Iterator[Task]) -> Iterator[tuple[Task, produce.Produced]]:
        threads = _ThreadPool(self._producer, self._workers.num_workers, self._workers.timeout)
        try:
            produced = backend.in_order(
                tasks, submit=threads.submit, result=threads.result,
                cancel=lambda future: future.cancel(), window=lambda: self.window,
                gauge=backend.in_flight(self._producer, self.window),
            )
            yield from produced if self.depth is None else self.depth.timed(produced)
        finally:
            threads.close()

    def close(self) -> None:
        pass

    def release(self) -> None:
        pass  # the threads end with their iteration

    def describe(self) -> str:
        count = self._workers.num_workers
        window = f"{self.window}" if self.depth is None else f"{self.window} (window='auto')"
        return f"{count} thread worker{'s' if count != 1 else ''}, <= {window} in flight, in order"


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
            return waits.result(future, self._timeout)  # Ctrl-C interrupts it
        except futures.TimeoutError:
            if future.done():  # the task's own error, not this wait's
                raise
            assert self._timeout is not None
            what = (
                "a worker thread is still running it (a stalled map_fn or source?). Threads "
                "cannot be stopped: it is left running as a daemon thread."
            )
            raise backend.timed_out(task, self._timeout, what) from None

    def close(self) -> None:
        """Stops the threads, waiting at most 0.25 s for those stalled in user code."""
        for _ in self._threads:
            self._inbox.put(None)
        deadline = time.monotonic() + _JOIN_SECONDS
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
