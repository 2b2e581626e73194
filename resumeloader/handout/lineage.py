"""`records_at`: the records in the batch of any step or position, without the steps before.

Positions are the ground truth: a batch is named by the position of its first
record (this shard's, as ``metadata["position"]`` reports it), and its records are a
pure function of the plan and that position. A *step* ``k`` is converted to the
position where the ``k``-th batch from position 0 starts with the batch size in
force (`Layout.advance`, O(number of skips)); skipped positions are no steps. That
holds for a run whose batch size never changed: across an elastic change, give the
lookup the batch size of that part of the run, or use positions.

A plain batch stage's batch at position ``p`` holds the positions ``[p,
layout.batch_end(p))``: O(batch) work (their indices and keys). A windowed stage's
batches are grouped from a whole window's records, so its lookup reads and groups
that window (O(window)); a stage whose batches count the records they hold
(`Pipeline.pack`, `Pipeline.batch_by_tokens`) answers positions only (a step's
position depends on every window before it). No TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from resumeloader.core import validate
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import produce

__all__ = ["BatchRecords", "number", "records_at"]


@dataclasses.dataclass(frozen=True)
class BatchRecords:
    """The records of one batch.

    Attributes:
        step: the batch's step (batches from position 0), when it was looked up by step.
        epoch: its epoch.
        start: the position (this shard's) of its first record.
        stop: the position after it: where the next batch starts.
        records: per record, in batch order: ``position``, ``index`` (the record
            index that keys its randomness, ``metadata["index"]``) and the source's
            key of the record (`Source.record_key`: ``source`` and ``lap`` in a
            mixture, ``record``; ``file`` and ``file_record`` for file sources).
    """

    step: int | None
    epoch: int
    start: int
    stop: int
    records: tuple[dict[str, Any], ...]

    def to_json(self) -> str:
        """One JSON line: the batch's fields."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))


def number(name: str, value: Any) -> int:
    """`value`, a non-negative integer of any type (Python or NumPy), as an int.

    Raises:
        TypeError: `value` is not an integer (a float, a str, a bool...), naming `name`.
        ValueError: `value` is negative.
    """
    if not validate.is_integer(value):
        msg = (
            f"`{name}` must be a non-negative integer (Python or NumPy). "
            f"Received: {name}={value!r:.80} of type {type(value).__name__}."
        )
        raise TypeError(msg)
    return validate.integer(name, value, low=0)


def _numbers(name: str, value: Any) -> list[int]:
    """`value` (an integer of any type, a range or an iterable of integers) as a list of
    non-negative ints; a `TypeError` naming `name` for anything else."""
    if isinstance(value, range):
        return list(value)
    accepts = (
        f"`{name}` must be a non-negative integer (Python or NumPy), a range or a sequence "
        "of them."
    )
    if validate.is_integer(value):
        items = [value]
    elif isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        msg = f"{accepts} Received: {name}={value!r:.80} of type {type(value).__name__}."
        raise TypeError(msg)
    else:
        items = list(value)
    for item in items:
        if not validate.is_integer(item):
            msg = (
                f"{accepts} Received: {name}={value!r:.80}, holding {item!r:.40} of type "
                f"{type(item).__name__}."
            )
            raise TypeError(msg)
        if item < 0:
            msg = f"{accepts} Received: {name}={value!r:.80}."
            raise ValueError(msg)
    return [int(item) for item in items]


def records_at(
    plan: plan_lib.Plan, producer: produce.BatchProducer, *, steps: Any, positions: Any
) -> list[BatchRecords]:
    """The `BatchRecords` of the batches at `steps`, or starting at `positions`.

    Args:
        plan: the loader's plan (with the batch size the lookup assumes).
        producer: reads and groups a window's records (windowed stages).
        steps: an int, a range or a sequence of them: batches from position 0.
        positions: an int or a sequence of them: the batch starting at each (a
            position inside a skip or a dropped remainder moves past it); a
            range: every batch from the one at ``range.start`` until ``range.stop``.

    Raises:
        TypeError: neither or both of `steps` and `positions`; a step or position
            that is not an integer (Python or NumPy); a step lookup of a stage whose
            batches count the records they hold.
        ValueError: a negative step or position, one past the end of a finite plan, or
            one that starts no batch of its window (windowed stages).
    """
    if (steps is None) == (positions is None):
        msg = (
            "Look batches up by `steps` or by `positions`, one of the two. Received: "
            f"steps={steps!r:.40}, positions={positions!r:.40}."
        )
        raise TypeError(msg)
    layout = plan.layout
    if steps is not None:
        if not layout.known_counts:
            stage = plan.pipeline.batch_stage
            msg = (
                "Steps cannot be converted to positions for this loader: its batches hold as "
                "many records as the data lets them (packing, token budgets), so where step "
                "k starts depends on every window before it. Look the batch up by its "
                "position (where loader.position stood before it, or a checkpoint's "
                f"position). Received: batch stage {stage.describe() if stage else None}."
            )
            raise TypeError(msg)
        numbers = _numbers("steps", steps)
        return [_one(plan, producer, layout.advance(0, k), k, f"step {k}") for k in numbers]
    if not isinstance(positions, range):
        return [
            _one(plan, producer, layout.normalise(p), None, f"position {p}")
            for p in _numbers("positions", positions)
        ]
    out: list[BatchRecords] = []
    at, end = layout.normalise(positions.start), layout.end
    while at < positions.stop and (end is None or at < end):
        out.append(_one(plan, producer, at, None, f"position {at}"))
        at = out[-1].stop
    return out


def _one(
    plan: plan_lib.Plan, producer: produce.BatchProducer, start: int, step: int | None, what: str
) -> BatchRecords:
    end = plan.layout.end
    if end is not None and start >= end:
        msg = (
            f"The {what} lies past the end of this finite loader "
            f"(num_epochs={plan.num_epochs}, {end:,} positions)."
        )
        raise ValueError(msg)
    if plan.layout.window is None:
        stop = plan.layout.batch_end(start)
        epoch, offset = divmod(start, plan.records_per_epoch)
        indices = plan.indices(epoch, offset, offset + stop - start).tolist()
        positions: Sequence[int] = range(start, stop)
        stop = plan.layout.normalise(stop)
    else:
        epoch, stop, positions, indices = _windowed(plan, producer, start)
    keys = plan.pipeline.source.record_keys(np.asarray(indices, dtype=np.int64))
    records = tuple(
        {"position": p, "index": i, **key}
        for p, i, key in zip(positions, indices, keys, strict=True)
    )
    return BatchRecords(step, epoch, start, stop, records)


def _windowed(
    plan: plan_lib.Plan, producer: produce.BatchProducer, start: int
) -> tuple[int, int, list[int], list[int]]:
    """The epoch, end, positions and indices of a windowed stage's batch at `start`."""
    task = next(plan.tasks(start))
    at, boundaries = task.position, []
    for group in producer.groups(task):
        first, at = at, at + group.count
        boundaries.append(first)
        if first == start:
            slots = group.slots.tolist()
            positions = [task.position + s for s in slots]
            return task.epoch, plan.layout.normalise(at), positions, task.indices[slots].tolist()
    shown = ", ".join(map(str, boundaries[:12])) + (", ..." if len(boundaries) > 12 else "")
    msg = (
        f"Position {start} starts no batch of its window: a windowed stage's batches start "
        f"at {shown} in the window of positions [{task.position}, {at}). Give one of them "
        "(where loader.position stood before the batch, or a checkpoint's position)."
    )
    raise ValueError(msg)
