"""Where a saved loader state resumes a `Plan`: its position, checked before anything moves.

`position_of` is what ``ResumableLoader.set_state`` does before it moves the
position, and what ``resumeloader show`` does to look records up from a checkpoint
without building a loader (no TensorFlow): the state's order fields must be the
plan's, its offset must continue this shard layout exactly, its data history must
agree with the pipeline's in the past, and a windowed stage must be able to continue
where it stands.
"""

from __future__ import annotations

from typing import Any

from resumeloader import errors
from resumeloader.core import state as state_lib
from resumeloader.stages import plan as plan_lib

__all__ = ["position_of"]

_MAX_POSITION = 2**63 - 1


def position_of(plan: plan_lib.Plan, state: dict[str, Any] | str | bytes) -> int:
    """The position (this shard's records, across epochs) `state` names in `plan`.

    Args:
        plan: the plan to resume.
        state: a loader state (``get_state()``) or its JSON text (str or bytes).

    Raises:
        StateError: the state is malformed, corrupted or past 2**63 records.
        StateMismatchError: it was saved by a pipeline with another record order
            (each differing ``stage.field`` named) or another data history.
        ElasticResumeError: this shard layout cannot continue it exactly.
    """
    saved = state_lib.parse(state)
    state_lib.check_order(saved, plan.order_fields(), explain=plan.pipeline.explain_field)
    epoch, offset = state_lib.local_offset(
        saved, shard_count=plan.shard.count, num_records=plan.num_records
    )
    position = epoch * plan.layout.records_per_epoch + offset
    if position > _MAX_POSITION:
        msg = (
            f"Loader state position is out of range: epoch {epoch} of "
            f"{plan.layout.records_per_epoch} records per shard is past 2**63 records."
        )
        raise errors.StateError(msg)
    normalised = plan.layout.normalise(position)
    plan.check_history(saved, normalised)
    plan.check_restore(normalised, same_layout=saved["shard_count"] == plan.shard.count)
    return position
