"""Process workers: spawned once per iteration, batches back through shared memory.

Each worker receives the pipeline and record spec pickled once, then
produces the batches it is sent, in order, writing each into one of `SLOTS`
shared-memory blocks of its own that it reuses; only small metadata crosses the
pipe. The parent copies a batch out before it sends that worker the task that
reuses the block. Workers ignore Ctrl-C (the parent stops them) and exit when
the parent's end of their pipe closes, so they never outlive it. A worker that
dies is reported as a `WorkerError` naming the batch it held. This module imports
no TensorFlow, so the worker processes stay light: keep it so.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import secrets
import signal
import traceback
import weakref
from collections.abc import Callable
from multiprocessing import connection, shared_memory
from typing import Any

import numpy as np
import optree

from resumeloader import errors
from resumeloader.core import spec as spec_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import produce

Task = plan_lib.Task

__all__ = ["SLOTS", "ProcessPool"]

# Batches in flight per worker: one being written, one waiting to be read.
SLOTS = 2
_ALIGN = 64
_JOIN_SECONDS = 5.0



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
    blocks: list[shared_memory.SharedMemory | None] = [None] * SLOTS
    try:
        try:
            pipeline, spec = pickle.loads(payload)
            producer = produce.BatchProducer(pipeline, spec)
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
            slot, count = count % SLOTS, count + 1
            try:
                batch = producer.batch(Task(indices, epoch, position))
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


class ProcessPool:
    def __init__(self, payload: bytes, spec: spec_lib.RecordSpec, num_workers: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._spec = spec
        prefix = f"rl{os.getpid()}_{secrets.token_hex(4)}"
        self._processes: list[Any] = []
        self._conns: list[connection.Connection] = []
        names: list[str] = []
        # Registered before any start, so that a failed start still cleans up; the
        # lists are filled in place below.
        self._finalizer = weakref.finalize(self, _shutdown, self._processes, self._conns, names)
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
            names += [f"{prefix}_{worker}_{slot}" for slot in range(SLOTS)]
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
