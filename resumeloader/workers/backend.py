"""The worker-backend seam: how batch tasks become batches, in task order.

A *backend* runs `BatchProducer.batch` on a plan's tasks somewhere — the calling
thread (`resumeloader.workers.inline`), daemon threads (`.threads`), the loader's
worker processes (`.process_backend`) — and hands back ``(task, its batches)``
strictly in task order, with at most `Backend.window` tasks in flight. The stream is therefore the
same for any backend and any number of workers, and restoring with others is exact.
`resumeloader.workers.options.Workers` chooses one through the registry
(`resumeloader.workers.registry`); ARCHITECTURE.md ("Where to add") says how to add
one. No TensorFlow here.

A backend gets everything a task needs from the producer: its pipeline (what a worker
elsewhere rebuilds; `check_picklable` says whether it travels), its record spec, and
its `SkipLedger` (``producer.skips.put(task, skips)``: the replaced records a remote
worker made travel back, so that the hand-out logs them as for the calling thread). A
task is a pure function of the pipeline and (epoch, position, indices): a key made of
the pipeline's order-field fingerprint and those is deterministic, and a task run twice
gives the same bytes (two pipelines that differ only in a function, e.g. ``map_fn``,
share their order fields: a key shared between them needs what tells them apart, such
as a digest of the pickled payload).
"""

from __future__ import annotations

import pickle
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Protocol, TypeVar

import cloudpickle

from resumeloader import errors
from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import produce

__all__ = [
    "IN_FLIGHT", "Backend", "check_picklable", "in_flight", "in_order", "needs_workers",
    "timed_out",
]

#: The gauge of the tasks in flight (submitted, not handed back) when one is handed back.
IN_FLIGHT = "in flight"

Task = plan_lib.Task
Produced = produce.Produced
F = TypeVar("F")


class Backend(Protocol):
    """What every worker backend is: a class ``Backend(workers, producer)`` of a
    `resumeloader.workers.options.Workers` and the `BatchProducer` whose batches it makes.

    Constructing one checks what it needs of the pipeline (e.g. that it pickles) and
    starts nothing; `run` starts what `start` did not.
    """

    #: The `Workers.kind` it is registered under.
    kind: ClassVar[str]
    #: The fields of `Workers` it takes besides `num_workers`, `kind` and `options`
    #: (``timeout``, ``window``); a `Workers` of its kind that sets another is refused.
    option_fields: ClassVar[tuple[str, ...]]
    #: The type of its own options value (`Workers.options`; e.g. `DaskOptions`), made
    #: with no arguments when none is given; None: it takes none.
    options_type: ClassVar[type | None]
    #: Whether the source is read in the process that hands batches out (so read-ahead
    #: hints reach the reads: `resumeloader.workers.readahead`).
    reads_in_this_process: bool
    #: Whether it makes several tasks at once (a delivery path that makes batches
    #: without the backend is then not chosen: the user asked for workers).
    parallel: bool

    @classmethod
    def check(cls, workers: Any) -> None:
        """Raises `ValueError` (or `TypeError`) naming the option of `workers` that this
        backend cannot take; called when a `Workers` of its kind is made."""
        ...

    @property
    def window(self) -> int:
        """The most tasks in flight (being made, or made and waiting) at any time."""
        ...

    def start(self) -> None:
        """Starts the workers if they are not running (idempotent). Called from the
        thread that builds a pipeline, so that long-lived workers follow its process."""
        ...

    def run(self, tasks: Iterator[Task]) -> Iterator[tuple[Task, Produced]]:
        """``(task, its batches)`` for each task, strictly in task order; closing it
        drops what is still in flight."""
        ...

    def close(self) -> None:
        """Stops the workers; a later `run` starts them again."""
        ...

    def release(self) -> None:
        """The loader is gone (nothing holds it): stops the workers now, or when the runs
        still going end; a run started later stops them again when it ends."""
        ...

    def describe(self) -> str:
        """Where batches are made, in a few words (a row of ``loader.describe()``)."""
        ...


def in_order(
    tasks: Iterator[Task],
    *,
    submit: Callable[[Task], F],
    result: Callable[[Task, F], Produced],
    cancel: Callable[[F], Any],
    window: int | Callable[[], int],
    gauge: Any = None,
) -> Iterator[tuple[Task, Produced]]:
    """``(task, its batches)`` in task order, at most `window` tasks submitted ahead.

    Args:
        tasks: the tasks, in order.
        submit: starts a task; returns its pending result (a future).
        result: waits for a task's pending result (raising what making it raised).
        cancel: drops a pending result that will not be waited for.
        window: the most tasks submitted and not yet handed back; or a function
            returning it, asked again after each task handed back (a window that
            follows a cluster growing or shrinking).
        gauge: a `resumeloader.core.board.Gauge` sampling the tasks in flight each
            time one is handed back, or None.
    """
    size = window if callable(window) else lambda: window
    pending: deque[tuple[Task, F]] = deque()
    exhausted = False

    def fill() -> None:
        nonlocal exhausted
        limit = max(1, size())
        while not exhausted and len(pending) < limit:
            task = next(tasks, None)
            if task is None:
                exhausted = True
                return
            pending.append((task, submit(task)))

    try:
        fill()
        while pending:
            task, future = pending.popleft()
            if gauge is not None:
                gauge.sample(len(pending) + 1)
            batches = result(task, future)
            del future
            fill()
            yield task, batches
    finally:
        for _, future in pending:
            cancel(future)


def in_flight(producer: produce.BatchProducer, window: int) -> Any:
    """The `IN_FLIGHT` gauge of `producer`'s board (capacity `window`), or None."""
    board = producer.board
    return None if board is None else board.gauge(IN_FLIGHT, window)


def needs_workers(workers: Any) -> None:
    """Raises a `ValueError` when `workers` of a kind that needs them have none."""
    if not workers.num_workers:
        msg = (
            f"kind={workers.kind!r} needs num_workers >= 1. Received: num_workers=0. "
            "Expected: a number of workers, or Workers() to make batches in the calling "
            "thread."
        )
        raise ValueError(msg)


def timed_out(task: Task, timeout: float, what: str) -> errors.WorkerError:
    """The `WorkerError` of `task`'s batch not arriving within `timeout` seconds;
    `what` says what became of the worker that held it."""
    first = int(task.indices[0])
    msg = (
        f"No batch arrived within timeout={timeout} s (Workers.timeout) for the batch of "
        f"{len(task.indices)} records at position {task.position} (epoch {task.epoch}, "
        f"first record index {first}): {what} The position was not advanced."
    )
    return errors.WorkerError(msg, record_index=first, epoch=task.epoch, position=task.position)


class _NullWriter:
    def write(self, data: bytes) -> int:
        return memoryview(data).nbytes


def check_picklable(pipeline: pipeline_lib.Pipeline, *, kind: str) -> None:
    """Raises a `TypeError` naming the first part of `pipeline` that a worker of `kind`
    elsewhere could not receive: its source, a record stage's function, the error
    policy's function (each pickled by cloudpickle, functions of ``__main__`` by value)."""
    parts: list[tuple[str, Any]] = [("source", pipeline.source)]
    for stage in pipeline.record_stages:
        name = "map_fn" if stage.name == "map" else f"stage {stage.name}"
        parts.append((name, getattr(stage, "fn", stage)))
    for batch_map in pipeline.batch_map_stages:
        parts.append((f"{batch_map.name} function", getattr(batch_map, "fn", batch_map)))
    if pipeline.error_policy.fn is not None:
        parts.append(("on_error policy", pipeline.error_policy.fn))
    for name, value in parts:
        try:
            cloudpickle.CloudPickler(_NullWriter(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        except Exception as err:
            msg = (
                f"`{name}` cannot be pickled, but kind={kind!r} workers receive it pickled: "
                f"{type(err).__name__}: {err}. Received: {name} of type "
                f"{type(value).__name__}. Expected: a picklable object (functions, lambdas "
                "and classes are; open files, locks and connections are not), or "
                "Workers(kind='thread')."
            )
            raise TypeError(msg) from err
