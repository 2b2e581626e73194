"""The messages between the process pool and its worker processes (pickled, on a socket).

Parent -> worker: the payload (the pickled pipeline and record spec) once, then
`TaskMessage` (one batch task of a session), `SessionMessage` (every task of an older
session is stale) and ``None`` (stop). Worker -> parent: one `Reply` per task (and one
of kind `READY` once set up), whose body is a `Done` for an `OK` reply, a failure
description (`resumeloader.workers.failures.describe`) for `ERROR` and `SETUP_ERROR`,
None for `SKIPPED` (a stale task) and `READY`. No TensorFlow here.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from resumeloader.stages import plan as plan_lib

__all__ = [
    "ERROR",
    "OK",
    "READY",
    "SETUP_ERROR",
    "SKIPPED",
    "Done",
    "Placement",
    "Reply",
    "SessionMessage",
    "TaskMessage",
]

READY = "ready"  # set up: from now on its batches can be timed
OK = "ok"  # the task's batches are in shared memory
ERROR = "error"  # producing the task raised
SETUP_ERROR = "setup_error"  # the payload could not be rebuilt
SKIPPED = "skipped"  # the task belonged to an older session


class TaskMessage(NamedTuple):
    """A batch task to produce, number `seq`, of session `session`."""

    seq: int
    session: int
    task: plan_lib.Task


class SessionMessage(NamedTuple):
    """The newest session: a worker skips the queued tasks of older ones."""

    session: int


class Placement(NamedTuple):
    """Where a task's arrays are in a worker's shared memory."""

    slot: int  # the block (one of the worker's `child.SLOTS`)
    size: int  # the block's size in bytes
    layout: list[tuple[str, tuple[int, ...], int]]  # per array: dtype, shape, offset
    new_block: bool  # the block is new: its file descriptor follows on the socket


class Done(NamedTuple):
    """The body of an `OK` reply."""

    placement: Placement
    header: tuple[list[int], bool]  # what `produce.Produced.unflatten` needs besides arrays
    skips: list[dict[str, Any]]  # the task's replaced records (the parent logs them)
    counts: Any = None  # what the worker counted since its last reply (`timing.Report`)


class Reply(NamedTuple):
    """A worker's answer to task `seq` of session `session` (-1 and 0 for `READY`)."""

    seq: int
    session: int
    kind: str
    body: Any
