"""`ProcessPool`: process workers that live as long as the loader; batches via shared memory.

`ProcessPool` starts its workers once (``resumeloader.workers.child``: a fresh
interpreter that never imports the user's ``__main__`` nor TensorFlow) and sends each
the pipeline and record spec pickled once. Every iteration of the loader is a
*session* of the pool: its tasks carry the session id, and a newer session makes the
tasks of older ones stale — a worker skips them and the pool drops their results —
so a new iteration never waits for, nor receives, the batches of an abandoned one.
An iteration that is resumed after another one started simply resubmits the tasks it
is still waiting for, under a new id: results are matched by task, never by arrival.

Batches come back in anonymous shared memory (`resumeloader.workers.shm`), copied out
as soon as their reply arrives. A worker that dies is reported as a `WorkerError`
naming the batch it held when the consumer reaches that batch (the batches before it
are delivered), and is replaced by a new process. With a ``timeout`` a batch that does
not arrive in time stops its worker and raises a `WorkerError` naming the batch. This
module imports no TensorFlow: keep it so.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from multiprocessing import connection
from typing import Any

import numpy as np

from resumeloader import errors
from resumeloader.core import board as board_lib
from resumeloader.core import exiting, handoff
from resumeloader.core import spec as spec_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import (
    backend,
    child,
    failures,
    messages,
    produce,
    timing,
    worker_process,
)

Task = plan_lib.Task

__all__ = ["SLOTS", "ProcessPool"]

SLOTS = child.SLOTS
_POLL_SECONDS = 0.05
_DIED = "died"  # a worker died holding the task (the pool's own kind)


@dataclasses.dataclass
class _Item:
    task: Task
    seq: int | None = None  # None: not sent (yet, or again after a new session)
    worker: worker_process.WorkerProcess | None = None


class ProcessPool:
    """Worker processes producing batch tasks in order; see the module docstring.

    Args:
        payload: the pipeline and record spec, pickled (cloudpickle).
        spec: the batches' spec (`BatchProducer.output_spec`: to rebuild their structure).
        num_workers: worker processes (>= 1).
        timeout: seconds the consumer waits for one batch before the worker is
            stopped and a `WorkerError` raised; None waits as long as the worker lives.
        on_skips: ``on_skips(task, skips)`` receives the replaced records of a
            batch (the error policy's), before the batch is yielded.
        board: where the workers' counts are merged and the copies out of shared
            memory timed (`resumeloader.core.board`), or None.
        window: the most tasks taken ahead of the consumer (at most `SLOTS` of them
            sent to each worker at a time); `SLOTS` per worker when None.
    """

    def __init__(
        self,
        payload: bytes,
        spec: spec_lib.RecordSpec,
        num_workers: int,
        *,
        timeout: float | None,
        on_skips: Callable[[Task, list[Any]], None] | None = None,
        window: int | None = None,
        board: board_lib.Board | None = None,
    ) -> None:
        self._payload = payload
        self._board = board
        self._window = window or SLOTS * num_workers
        self._on_skips = on_skips
        self._spec = spec
        self._timeout = timeout
        self._lock = threading.Lock()
        self._workers: list[worker_process.WorkerProcess] = []
        self._session = 0
        self._seqs = itertools.count()
        self._results: dict[int, tuple[str, Any]] = {}
        self._closed = False
        # Registered before any start, so that a failed start still stops the others; it
        # runs on close(), when the pool is garbage collected, and at interpreter exit.
        self._finalizer = weakref.finalize(self, worker_process.shutdown, self._workers)
        for index in range(num_workers):  # all started before any is waited for
            self._workers.append(worker_process.WorkerProcess(index))
        for worker in self._workers:
            worker.setup(payload)

    @property
    def pids(self) -> list[int]:
        """The process ids of the live workers."""
        return [w.pid for w in self._workers if not w.dead]

    def run(self, tasks: Iterator[Task]) -> Iterator[tuple[Task, produce.Produced]]:
        """Yields ``(task, its batches)`` for each task, in task order (one session)."""
        queue: deque[_Item] = deque()
        session = -1
        waiting_since: float | None = None
        gauge = None if self._board is None else self._board.gauge(backend.IN_FLIGHT, self._window)
        try:
            while True:
                exiting.check("batches of the worker processes")
                with self._lock:
                    if self._closed:
                        msg = "The loader's worker processes were shut down during an iteration."
                        raise RuntimeError(msg)
                    if session != self._session:  # first call, or another session ran since
                        session = self._open()
                        for item in queue:
                            item.seq = item.worker = None
                    while len(queue) < self._window:
                        task = next(tasks, None)
                        if task is None:
                            break
                        queue.append(_Item(task))
                    if not queue:
                        return
                    self._dispatch(queue, session)
                    head = queue[0]
                    outcome = self._take(head)
                    if outcome is None:
                        self._receive()
                        outcome = self._take(head)
                if outcome is None:
                    # A worker's start-up does not count: only a worker that is up can stall.
                    holder = [head.worker] if head.worker is not None else self._workers
                    if not all(w.ready for w in holder):
                        waiting_since = None
                        continue
                    now = time.monotonic()
                    waiting_since = now if waiting_since is None else waiting_since
                    if self._timeout is not None and now - waiting_since > self._timeout:
                        raise self._timed_out(head)
                    continue
                waiting_since = None
                if gauge is not None:
                    gauge.sample(len(queue))
                queue.popleft()
                yield head.task, self._unpack(head, *outcome)
        finally:
            with self._lock:
                self._end(session, queue)

    def close(self) -> None:
        """Stops the workers (idle ones exit at once; busy ones are killed after 0.1 s)."""
        with self._lock:
            self._closed = True
        self._finalizer()

    # -- the pieces of `run`, called with the lock held -------------------------------
    def _open(self) -> int:
        self._session += 1
        self._results.clear()  # every result held belongs to an older session
        for worker in self._workers:
            if not worker.dead and worker.popen.poll() is not None:
                self._bury(worker)
        self._notify()
        return self._session

    def _end(self, session: int, queue: deque[_Item]) -> None:
        if session != self._session or self._closed:
            return
        self._session += 1  # our tasks still queued in workers are now stale: skipped
        for item in queue:
            if item.seq is not None:
                self._results.pop(item.seq, None)
        self._notify()

    def _notify(self) -> None:
        for worker in self._workers:
            if not worker.dead and worker.outstanding:
                try:
                    worker.conn.send(messages.SessionMessage(self._session))
                except OSError:
                    self._bury(worker)

    def _dispatch(self, queue: deque[_Item], session: int) -> None:
        for item in queue:
            if item.seq is not None:
                continue
            while True:
                if any(w.dead for w in self._workers):
                    self._revive()
                ready = [w for w in self._workers if len(w.outstanding) < SLOTS]
                if not ready:
                    return
                worker = min(ready, key=lambda w: len(w.outstanding))
                seq = next(self._seqs)
                task = item.task
                try:
                    worker.conn.send(messages.TaskMessage(seq, session, task))
                except OSError:
                    self._bury(worker)
                    continue
                worker.outstanding.append(seq)
                item.seq, item.worker = seq, worker
                break

    def _revive(self) -> None:
        for index, worker in enumerate(self._workers):
            if worker.dead:
                self._workers[index] = worker_process.WorkerProcess(index)
                self._workers[index].setup(self._payload)

    def _receive(self) -> None:
        busy = {
            w.conn: w for w in self._workers if not w.dead and (w.outstanding or not w.ready)
        }
        ready = connection.wait(list(busy), timeout=_POLL_SECONDS)
        for conn in ready:
            worker = busy[conn]  # type: ignore[index]
            try:
                reply = worker.receive()
            except (EOFError, OSError):
                self._bury(worker)
                continue
            if reply.kind == messages.READY:
                worker.ready = True
                continue
            worker.outstanding.popleft()
            if reply.session == self._session and reply.kind != messages.SKIPPED:
                body = reply.body
                if reply.kind == messages.OK:
                    board = self._board
                    if board is not None and body.counts is not None:
                        delta, counts = body.counts
                        board.merge(delta, counts, name=f"process worker {worker.index}")
                    body = (self._copy(worker, body), body.skips)
                self._results[reply.seq] = (reply.kind, body)
        if not ready:  # a dead worker whose socket a grandchild keeps open
            for worker in busy.values():
                if worker.popen.poll() is not None:
                    self._bury(worker)

    def _bury(self, worker: worker_process.WorkerProcess) -> None:
        """Marks `worker` dead; its unanswered tasks fail when the consumer reaches them."""
        worker.stop()
        for seq in worker.outstanding:
            self._results[seq] = (_DIED, (worker.index, worker.pid, worker.how_it_died()))
        worker.outstanding.clear()

    def _copy(self, worker: worker_process.WorkerProcess, done: messages.Done) -> produce.Produced:
        buffer = worker.blocks[done.placement.slot].buf
        lap = None
        if self._board is not None:
            lap = self._board.here().lap(timing.TRANSFER, sum(done.header[0]))
        # Into recycled memory (`core/buffers.py`): the block is the worker's again as
        # soon as this returns, and a fresh batch-sized allocation per batch would
        # page-fault once TensorFlow has set malloc's mmap threshold.
        arrays = [
            handoff.copy(np.ndarray(shape, dtype=np.dtype(dtype), buffer=buffer, offset=offset))
            for dtype, shape, offset in done.placement.layout
        ]
        produced = produce.Produced.unflatten(self._spec.treespec, arrays, done.header)
        if lap is not None:
            records = sum(produced.counts)
            lap.lap(lap.place[timing.TRANSFER], records, timing.nbytes(arrays))
        return produced

    def _take(self, item: _Item) -> tuple[str, Any] | None:
        return None if item.seq is None else self._results.pop(item.seq, None)

    # -- outcomes ---------------------------------------------------------------------
    def _timed_out(self, item: _Item) -> errors.WorkerError:
        with self._lock:
            held = item.worker if item.worker is not None and not item.worker.dead else None
            # Not sent: every worker is still busy with something older that does not end.
            stuck = [held] if held is not None else [w for w in self._workers if w.outstanding]
            for worker in stuck:
                worker.stop(kill=True)
                self._bury(worker)
        names = ", ".join(f"{w.index} (pid {w.pid})" for w in stuck) or "-"
        assert self._timeout is not None
        what = (
            f"worker process {names} was alive but did not finish it (a stalled map_fn or "
            "source?) and was stopped; the next iteration starts a new worker and retries."
        )
        return backend.timed_out(item.task, self._timeout, what)

    def _unpack(self, item: _Item, kind: str, body: Any) -> Any:
        if kind == messages.OK:
            batch, skips = body
            if skips and self._on_skips is not None:
                self._on_skips(item.task, skips)
            return batch
        task = item.task
        first = int(task.indices[0])
        if kind == _DIED:
            index, pid, how = body
            msg = (
                f"Worker process {index} (pid {pid}) died with {how} while preparing the "
                f"batch of {len(task.indices)} records at position {task.position} (epoch "
                f"{task.epoch}, first record index {first}). No batch was lost: the position "
                "was not advanced, and the next iteration starts a new worker and retries it."
            )
            raise errors.WorkerError(
                msg, record_index=first, epoch=task.epoch, position=task.position
            )
        assert item.worker is not None
        raise failures.rebuild(task, item.worker.index, kind, body)
