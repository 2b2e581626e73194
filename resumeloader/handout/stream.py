"""A plan's batches one by one, each with the position after it (and its metadata).

Workers produce one `produce.Produced` per task: the batch of a plain stage, or the
batches of a window. `batches` flattens them in order, gives each the position after
it (the task's position plus the records of the batches before, normalised), drops
the batches of a window that come before the position a stream starts at (a restore
inside a window recomputes the whole window), and pairs each batch with its
per-record metadata when the loader needs it. No TensorFlow here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Any, Protocol

import numpy as np

from resumeloader.core import positions, rng
from resumeloader.handout import resume
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import produce

__all__ = ["Counter", "EagerBatches", "Watch", "batches", "labelled"]


class Counter(Protocol):
    """The count of a dataset() iteration whose batches are made outside Python (in a
    TensorFlow graph): what the consumption checks need of it."""

    def produced(self) -> int:
        """Batches the iteration produced so far."""
        ...

    def supersede(self) -> None:
        """Makes the iteration fail at its next batch (a newer consumer took over)."""
        ...


class Watch(Protocol):
    """``watch(position, tasks)``: sees a dataset() iteration begin at `position`.

    Returns the tasks, observed, and what to call with the position after each batch
    as it is produced. An iteration that makes its batches in a graph passes no tasks
    and its `Counter` instead (the position after its batches is then its count's).
    """

    def __call__(
        self, position: int, tasks: Iterator[plan_lib.Task], *, counter: Counter | None = None
    ) -> tuple[Iterator[plan_lib.Task], Callable[[int], None]]: ...


def labelled(
    value: Any, task: plan_lib.Task, rows: np.ndarray | None, *, seed: int, with_metadata: bool
) -> Any:
    """`value`, paired `with_metadata` with the per-record metadata of its rows (keyed by
    the pipeline's `seed`): the task's records in order, or those at the task's slots
    `rows` (-1: an empty row, keyed as record -1)."""
    if not with_metadata:
        return value
    if rows is None:
        return value, rng.metadata(seed, task.indices, task.epoch, task.position)
    filled = rows >= 0
    indices = np.where(filled, task.indices[np.maximum(rows, 0)], -1)
    meta = rng.metadata(seed, indices, task.epoch, 0)
    meta["position"] = np.where(filled, task.position + rows, -1)
    return value, meta


def batches(
    produced: Iterator[tuple[plan_lib.Task, produce.Produced]],
    layout: positions.Layout,
    position: int,
    *,
    seed: int,
    with_metadata: bool,
    on_batch: Callable[[int], None] | None = None,
) -> Generator[tuple[Any, int], None, None]:
    """(batch, the position after it) of the tasks' batches from normalised `position` on.

    Args:
        produced: ``(task, its batches)`` in task order, the first task holding `position`.
        layout: the layout the tasks were cut by.
        position: where the stream starts.
        seed: the pipeline's seed (keys the metadata's per-record seeds).
        with_metadata: whether each batch is paired with its per-record metadata.
        on_batch: called with the position after each batch, as it is produced.

    Raises:
        ElasticResumeError: `position` lies inside a batch of its window (which
            `resume.resume` refuses first).
    """
    for task, out in produced:
        at = task.position
        for number, (batch, count) in enumerate(zip(out.batches, out.counts, strict=True)):
            start, at = at, at + count
            if at <= position:  # a window's batches before the position restored
                continue
            if start < position:  # never after `resume.resume` checked the position
                raise resume.inside_a_batch(layout, position, start, at)
            end = layout.normalise(at)
            if on_batch is not None:
                on_batch(end)
            rows = None if out.rows is None else out.rows[number]
            yield labelled(batch, task, rows, seed=seed, with_metadata=with_metadata), end


class EagerBatches:
    """The batches of ``for batch in loader``, each with the position after it.

    The ends travel beside the batches (not through the prefetch thread or tf.data):
    the producer appends a batch's end before the batch leaves it, so it is there
    when the batch arrives.
    """

    def __init__(self, batches: Iterator[Any], ends: deque[int]) -> None:
        self._batches = batches
        self._ends = ends

    def __iter__(self) -> EagerBatches:
        return self

    def __next__(self) -> tuple[Any, int]:
        batch = next(self._batches)
        return batch, self._ends.popleft()

    def close(self) -> None:
        """Stops the producer."""
        self._batches.close()  # type: ignore[attr-defined]
