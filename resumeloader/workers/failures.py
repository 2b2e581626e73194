"""Failures in worker processes: described there (picklable), rebuilt here as errors.

A user error on a record becomes the same `RecordError` (or subclass) the calling thread
would raise, with the original exception chained and the worker's traceback attached;
anything else becomes a `WorkerError` naming the batch. No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import pickle
import traceback
from collections.abc import Callable
from typing import Any

from resumeloader import errors
from resumeloader.stages import plan as plan_lib

__all__ = ["describe", "rebuild"]


class _RemoteTraceback(Exception):
    """The formatted traceback of an exception raised in a worker process."""


def describe(err: BaseException) -> dict[str, Any]:
    """A picklable description of an exception raised while producing a batch."""
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


def rebuild(
    task: plan_lib.Task, worker: int | str, kind: str, body: dict[str, Any]
) -> errors.RecordError:
    """The error for `task` from worker `worker`'s description `body` of kind `kind`.

    `worker` is a process worker's number, or a remote worker's name (e.g. ``"Dask
    worker tcp://10.0.0.7:40331"``)."""
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
            f"{_name(worker)} {stage} the batch at position {task.position} "
            f"(epoch {task.epoch}, first record index {first}): {body['type']}: {body['message']}"
        )
        error = errors.WorkerError(
            msg, record_index=first, epoch=task.epoch, position=task.position
        )
    error.__cause__ = cause
    return error


def _name(worker: int | str) -> str:
    return f"Worker process {worker}" if isinstance(worker, int) else worker
