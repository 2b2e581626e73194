"""Ordered parallel batch production: thread and process worker pools.

A task is one batch (record indices, epoch, position); workers run
`BatchProducer.batch` on it and the results are handed out strictly in task order,
with a bounded number of batches in flight. The stream is therefore the same for
any number and kind of workers, and restoring with another ``num_workers`` is exact.

Process workers (``spawn`` context) receive the source, ``map_fn`` and spec once,
pickled at start, and return each batch through a shared-memory block that they
reuse (only small metadata is pickled). A pool lives as long as one iteration of
the loader (one generator): it starts with the first batch (for processes, about a
second) and is shut down when the iteration ends, fails or is garbage collected.
This module imports no TensorFlow, so the worker processes stay light: keep it so.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import secrets
import signal
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from concurrent import futures
from multiprocessing import connection, shared_memory
from typing import Any

import numpy as np
import optree

from resumeloader import _batching, _source, errors

__all__ = ["Task", "WorkerSettings"]

WORKER_TYPES = ("thread", "process")
# Batches in flight per worker: one being written, one waiting to be read.
_SLOTS = 2
_ALIGN = 64
_JOIN_SECONDS = 5.0


@dataclasses.dataclass(frozen=True)
class Task:
    """One batch to produce: its record indices, epoch, and the position of its first record."""

    indices: np.ndarray
    epoch: int
    position: int


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
        source: the user's source (sent to process workers).
        map_fn: the user's map function or None (sent to process workers).

    Raises:
        TypeError: process workers are requested and `source` or `map_fn` cannot be pickled.
    """

    def __init__(self, num_workers: int, worker_type: str, *, source: Any, map_fn: Any) -> None:
        if worker_type not in WORKER_TYPES:
            msg = (
                "`worker_type` must be 'thread' or 'process'. "
                f"Received: worker_type={worker_type!r}."
            )
            raise ValueError(msg)
        self.num_workers = num_workers
        self.worker_type = worker_type
        self._source = source
        self._map_fn = map_fn
        if num_workers and worker_type == "process":
            _check_picklable("source", source)
            _check_picklable("map_fn", map_fn)

    @property
    def in_flight(self) -> int:
        """The most batches being prepared or waiting at any time."""
        return self.num_workers * _SLOTS

    def produce(
        self, producer: _batching.BatchProducer, tasks: Iterator[Task]
    ) -> Iterator[tuple[Task, Any]]:
        """Yields ``(task, batch)`` for each task, in task order; closes its pool when closed."""
        if not self.num_workers:
            for task in tasks:
                yield task, producer.batch(task.indices, epoch=task.epoch, position=task.position)
            return
        pool: _ThreadPool | _ProcessPool
        if self.worker_type == "thread":
            pool = _ThreadPool(producer, self.num_workers)
        else:
            payload = pickle.dumps(
                (self._source, self._map_fn, producer.seed, producer.spec),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            pool = _ProcessPool(payload, producer.spec, self.num_workers)
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
    def __init__(self, producer: _batching.BatchProducer, num_workers: int) -> None:
        self._producer = producer
        self._executor = futures.ThreadPoolExecutor(num_workers, "resumeloader-worker")

    def submit(self, task: Task) -> futures.Future[Any]:
        return self._executor.submit(
            self._producer.batch, task.indices, epoch=task.epoch, position=task.position
        )

    def result(self, task: Task, handle: futures.Future[Any]) -> Any:
        return handle.result()

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


# -- process workers ---------------------------------------------------------------


class _RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a worker process."""


def _describe_failure(err: BaseException) -> dict[str, Any]:
    cause = err.__cause__ if isinstance(err, errors.RecordError) else err
    try:
        cause_bytes = pickle.dumps(cause) if cause is not None else None
    except Exception:
        cause_bytes = None
    return {
        "record_error": isinstance(err, errors.RecordError),
        "type": type(err).__name__,
        "message": str(err),
        "record_index": getattr(err, "record_index", None),
        "position": getattr(err, "position", None),
        "cause": cause_bytes,
        "cause_repr": repr(cause),
        "traceback": "".join(traceback.format_exception(cause)) if cause is not None else "",
    }


def _worker_main(conn: connection.Connection, payload: bytes, prefix: str) -> None:
    """Entry point of a worker process: produce the batches sent on `conn` until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    blocks: list[shared_memory.SharedMemory | None] = [None] * _SLOTS
    try:
        try:
            source, map_fn, seed, spec = pickle.loads(payload)
            adapter = _source.adapt(source)
            producer = _batching.BatchProducer(adapter, map_fn=map_fn, seed=seed, spec=spec)
        except Exception as err:
            conn.send(("setup_error", _describe_failure(err)))
            return
        count = 0
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):  # the parent is gone
                return
            if message is None:
                return
            indices, epoch, position = message
            slot, count = count % _SLOTS, count + 1
            try:
                batch = producer.batch(indices, epoch=epoch, position=position)
                flat = optree.tree_leaves(batch, none_is_leaf=True)
                leaves = [np.ascontiguousarray(a) for a in flat]
                reply: tuple[str, Any] = ("ok", _write(blocks, slot, f"{prefix}_{slot}", leaves))
            except Exception as err:
                reply = ("error", _describe_failure(err))
            try:
                conn.send(reply)
            except (BrokenPipeError, EOFError, OSError):
                return
    finally:
        for block in blocks:
            if block is not None:
                block.close()


def _write(
    blocks: list[shared_memory.SharedMemory | None], slot: int, name: str, leaves: list[np.ndarray]
) -> tuple[str, int, list[tuple[str, tuple[int, ...], int]]]:
    layout = []
    size = 0
    for leaf in leaves:
        layout.append((leaf.dtype.str, leaf.shape, size))
        size += -(-leaf.nbytes // _ALIGN) * _ALIGN
    block = blocks[slot]
    if block is None or block.size < size:
        if block is not None:
            block.close()
            block.unlink()
        # Grow geometrically so that a few larger batches do not recreate the block each time.
        capacity = max(size, _ALIGN, 0 if block is None else 2 * block.size)
        block = blocks[slot] = shared_memory.SharedMemory(name=name, create=True, size=capacity)
    for leaf, (_, shape, offset) in zip(leaves, layout, strict=True):
        target = np.ndarray(shape, dtype=leaf.dtype, buffer=block.buf, offset=offset)
        target[...] = leaf
        del target
    return name, block.size, layout


def _shutdown(
    processes: list[Any], conns: list[connection.Connection], names: list[str]
) -> None:
    for conn in conns:
        with contextlib.suppress(OSError, ValueError):
            conn.send(None)
    for conn in conns:
        conn.close()
    for process in processes:
        if process.pid is None:  # never started
            continue
        process.join(_JOIN_SECONDS)
        if process.is_alive():
            process.kill()
            process.join()
    # Only now that no worker can create a block again is unlinking final.
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            block = shared_memory.SharedMemory(name=name)
            block.close()
            block.unlink()


class _ProcessPool:
    def __init__(self, payload: bytes, spec: _batching.RecordSpec, num_workers: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._spec = spec
        prefix = f"rl{os.getpid()}_{secrets.token_hex(4)}"
        self._processes: list[Any] = []
        self._conns: list[connection.Connection] = []
        names = []
        for worker in range(num_workers):
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_worker_main,
                args=(child_end, payload, f"{prefix}_{worker}"),
                name=f"resumeloader-worker-{worker}",
                daemon=True,
            )
            self._conns.append(parent_end)
            self._processes.append(process)
            names += [f"{prefix}_{worker}_{slot}" for slot in range(_SLOTS)]
            # Registered before start, so that a failed start still cleans up.
            if worker == 0:
                self._finalizer = weakref.finalize(
                    self, _shutdown, self._processes, self._conns, names
                )
            process.start()
            child_end.close()
        self._attached: dict[str, shared_memory.SharedMemory] = {}
        self._sent = 0

    def submit(self, task: Task) -> int:
        worker = self._sent % len(self._processes)
        self._sent += 1
        # A dead worker is reported by result(), naming the batch it was given.
        with contextlib.suppress(BrokenPipeError, OSError):
            self._conns[worker].send((task.indices, task.epoch, task.position))
        return worker

    def result(self, task: Task, worker: int) -> Any:
        conn, process = self._conns[worker], self._processes[worker]
        try:
            connection.wait([conn, process.sentinel])
            kind, body = conn.recv()
        except (EOFError, OSError) as err:
            process.join(_JOIN_SECONDS)
            raise self._died(task, worker) from err
        if kind == "ok":
            return self._read(*body)
        raise _failure(task, worker, kind, body)

    def _died(self, task: Task, worker: int) -> errors.WorkerError:
        process = self._processes[worker]
        code = process.exitcode
        how = f"exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how = f"signal {signal.Signals(-code).name}"
        first = int(task.indices[0])
        msg = (
            f"Worker process {worker} (pid {process.pid}) died with {how} while preparing the "
            f"batch of {len(task.indices)} records at position {task.position} (epoch "
            f"{task.epoch}, first record index {first}). No batch was lost: the position was "
            "not advanced, so restarting the iteration reproduces it."
        )
        return errors.WorkerError(
            msg, record_index=first, epoch=task.epoch, position=task.position
        )

    def _read(self, name: str, size: int, layout: list[tuple[str, tuple[int, ...], int]]) -> Any:
        block = self._attached.get(name)
        if block is None or block.size != size:
            if block is not None:
                block.close()
            block = self._attached[name] = shared_memory.SharedMemory(name=name)
        leaves = [
            np.ndarray(shape, dtype=np.dtype(dtype), buffer=block.buf, offset=offset).copy()
            for dtype, shape, offset in layout
        ]
        return optree.tree_unflatten(self._spec.treespec, leaves)

    def close(self) -> None:
        for block in self._attached.values():
            block.close()
        self._attached.clear()
        self._finalizer()


def _failure(task: Task, worker: int, kind: str, body: dict[str, Any]) -> errors.RecordError:
    cause: BaseException | None = None
    if body["cause"] is not None:
        with contextlib.suppress(Exception):
            cause = pickle.loads(body["cause"])
    if cause is None:
        cause = RuntimeError(body["cause_repr"])
    cause.__cause__ = _RemoteTraceback("\n" + body["traceback"])
    index = body["record_index"]
    first = int(task.indices[0])
    if kind == "error" and body["record_error"]:
        make: Callable[..., errors.RecordError] = getattr(errors, body["type"], errors.RecordError)
        error = make(
            body["message"], record_index=index, epoch=task.epoch, position=body["position"]
        )
    else:
        stage = (
            "could not rebuild the source and map_fn it was sent, so could not prepare"
            if kind == "setup_error"
            else "failed preparing"
        )
        msg = (
            f"Worker process {worker} {stage} the batch at position {task.position} "
            f"(epoch {task.epoch}, first record index {first}): {body['type']}: {body['message']}"
        )
        error = errors.WorkerError(
            msg, record_index=first, epoch=task.epoch, position=task.position
        )
    error.__cause__ = cause
    return error
