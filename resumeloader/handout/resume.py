"""The one restore path: a state's position for a plan, checked once, and a position's state.

`resume` turns a saved state (`resumeloader.core.state`) into this plan's position,
refusing — before anything changes, each rule checked once, with one message — what
would not continue the saved stream exactly:

* a malformed or corrupted state (`StateError`, `state.parse`);
* another record order (`StateMismatchError` naming every differing ``stage.field``,
  `state.check_order`) or another data history before the state's position
  (`resumeloader.core.history.check_past`);
* an offset that the shard count does not divide, or past its epoch
  (`state.local_offset`), or a position past 2**63 records;
* for a windowed batch stage (bucketing, packing, token budgets), a position inside a
  window restored with another shard count (that shard's windows hold other records),
  or one that ends no batch of its window (an edited state): the batches of a stage
  whose batches count the records they hold are known only from the window's data,
  so the window's records are read and grouped (not assembled) to tell.

`state_of` is the inverse: the state of a position (the order fields, their
fingerprint, the global offset). Whatever delivers the batches (a tf.data graph, a
Python loop, any worker backend) restores through these two functions. No TensorFlow.
"""

from __future__ import annotations

from typing import Any

from resumeloader import errors
from resumeloader.core import history as history_lib
from resumeloader.core import positions
from resumeloader.core import state as state_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import produce

__all__ = ["MAX_POSITION", "inside_a_batch", "resume", "state_of"]

#: The largest position a loader counts (an int64 variable).
MAX_POSITION = 2**63 - 1


def state_of(plan: plan_lib.Plan, position: int) -> dict[str, Any]:
    """The state of normalised `position` of `plan` (see `resumeloader.core.state`)."""
    epoch, offset = divmod(position, plan.records_per_epoch)
    return state_lib.make(
        plan.order_fields(),
        epoch=epoch,
        offset=offset * plan.shard.count,
        shard_count=plan.shard.count,
        batch_size=plan.batch_size,
    )


def resume(plan: plan_lib.Plan, producer: produce.BatchProducer, state: Any) -> int:
    """The normalised position of `plan` at which `state` continues, validated.

    Args:
        plan: the plan restoring the state.
        producer: makes `plan`'s batches (reads a window when only its data tells
            where its batches end).
        state: a state dict, or its JSON text.

    Raises:
        StateError: the state is malformed, corrupted, or its position is out of range.
        StateMismatchError: it was saved by a pipeline with another record order, or
            another data history before its position.
        ElasticResumeError: this shard count cannot continue it exactly, or its
            position lies inside a batch of a windowed stage.
    """
    saved = state_lib.parse(state)
    state_lib.check_order(saved, plan.order_fields(), explain=plan.pipeline.explain_field)
    epoch, offset = state_lib.local_offset(
        saved, shard_count=plan.shard.count, num_records=plan.num_records
    )
    per_epoch = plan.records_per_epoch
    if epoch * per_epoch + offset > MAX_POSITION:
        msg = (
            f"Loader state position is out of range: epoch {epoch} of {per_epoch} records "
            "per shard is past 2**63 records."
        )
        raise errors.StateError(msg)
    position = plan.layout.normalise(epoch * per_epoch + offset)
    _check_history(plan, saved, position)
    _check_window(plan, producer, position, same_shards=saved["shard_count"] == plan.shard.count)
    return position


def _inside_window(layout: positions.Layout, position: int) -> tuple[int, int] | None:
    """The bounds of the window `position` lies strictly inside, if any."""
    if layout.window is None or (layout.end is not None and position >= layout.end):
        return None
    start, stop = layout.window_bounds(position)
    return None if start == position else (start, stop)


def _check_history(plan: plan_lib.Plan, saved: dict[str, Any], position: int) -> None:
    """Raises unless the state's data history agrees with the pipeline's in its past: up
    to its position (restored inside a window, up to that window's end: the window is
    made again whole)."""
    text = saved.get(history_lib.FIELD)
    if not plan.pipeline.history and text is None:
        return
    past = saved["epoch"] * plan.num_records + saved["offset"]
    window = _inside_window(plan.layout, position)
    if window is not None:
        past = max(past, plan.global_position(window[1]))
    history_lib.check_past(None if text is None else str(text), plan.pipeline.history,
                           past_end=past)


def _check_window(
    plan: plan_lib.Plan, producer: produce.BatchProducer, position: int, *, same_shards: bool
) -> None:
    """Raises unless a windowed stream can continue exactly from normalised `position`."""
    layout = plan.layout
    window = _inside_window(layout, position)
    if window is None:
        return
    start, stop = window
    if not same_shards:
        epoch, offset = divmod(position, layout.records_per_epoch)
        msg = (
            "Cannot resume inside a window with another shard count: each shard groups "
            f"the records of windows of {layout.window} of its own positions, which now "
            "hold other records, so the rest of the window would repeat or lose some. "
            f"Received: a state saved at offset {offset} of epoch {epoch} (this shard), "
            f"{position - start} into its window. Resume with the shard count it was "
            "saved with, or from a checkpoint at a window boundary."
        )
        raise errors.ElasticResumeError(msg)
    if layout.known_counts:
        first = start + (position - start) // layout.batch_size * layout.batch_size
        if first != position:
            raise inside_a_batch(layout, position, first, min(first + layout.batch_size, stop))
        return
    task = next(plan.tasks(position))
    at = task.position
    for group in producer.groups(task, replacing=True):
        first, at = at, at + group.count
        if first < position < at:
            raise inside_a_batch(layout, position, first, at)


def inside_a_batch(
    layout: positions.Layout, position: int, start: int, stop: int
) -> errors.ElasticResumeError:
    """The error of a stream asked to start at `position`, inside the batch of a window
    that holds the positions ``[start, stop)``."""
    epoch, offset = divmod(position, layout.records_per_epoch)
    msg = (
        "Cannot resume between two batches of a window: the position restored lies "
        f"inside a batch, which holds the window's positions [{start}, {stop}). A windowed "
        "stage resumes only at the end of one of its batches (where its checkpoints are "
        "saved); this state was edited, or saved by another configuration of the "
        f"pipeline. Received: position {position} (epoch {epoch}, offset {offset} of "
        "this shard)."
    )
    return errors.ElasticResumeError(msg)
