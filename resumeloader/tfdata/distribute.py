"""tf.distribute input: the per-pipeline stream of a loader for an `InputContext`.

Under ``strategy.distribute_datasets_from_function`` every input pipeline ``j`` of
``n`` calls ``loader.dataset(input_context=ctx)``. The loader's `batch_size` is the
*global* batch of its shard layout (one training step, all replicas together), and
its position keeps counting that global stream: the training loop advances it by
one global step per step, exactly as a single-process run with the same batch would.

Pipeline ``j`` reads the sub-shard of the loader's shard whose local offsets are
``j, j + n, j + 2n, ...`` (global offsets ``shard_index + shard_count * j`` modulo
``shard_count * n``), ``batch_size // n`` records per step, cut into one per-replica
batch for each of its ``num_replicas_in_sync // n`` local replicas. Together the
pipelines' records of step ``t`` are, as a multiset, the records of batch ``t`` of
the single-process loader. That needs full global batches, so the loader must drop
each epoch's short last batch (or have none).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator
from typing import Any

import tensorflow as tf

from resumeloader import errors
from resumeloader.core import positions
from resumeloader.core import shard as shard_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.tfdata import delivery as delivery_lib

__all__ = ["InputPipeline", "dataset", "in_replica_context", "merge", "pipeline"]


@dataclasses.dataclass(frozen=True)
class InputPipeline:
    """The stream of one input pipeline: its sub-shard plan and how a step is split."""

    plan: plan_lib.Plan
    layout: positions.Layout
    num_pipelines: int
    replicas_per_pipeline: int
    per_replica_batch_size: int

    def start(self, position: int, records_per_epoch: int) -> int:
        """This pipeline's position for the loader's (normalised) position.

        Raises:
            ElasticResumeError: the position's offset in its epoch is not divisible
                by the number of input pipelines, so they cannot split it exactly.
        """
        epoch, offset = divmod(position, records_per_epoch)
        if offset % self.num_pipelines:
            msg = (
                "Cannot split the loader's position exactly among the input pipelines: its "
                f"offset in the epoch is not divisible by their number. Received: "
                f"offset={offset} (epoch {epoch}), num_input_pipelines={self.num_pipelines}."
            )
            raise errors.ElasticResumeError(msg)
        layout = self.layout
        return layout.normalise(epoch * layout.records_per_epoch + offset // self.num_pipelines)


def pipeline(plan: plan_lib.Plan, input_context: Any) -> InputPipeline:
    """The `InputPipeline` of `input_context` for a loader's plan (`batch_size` is global).

    Raises:
        TypeError: `input_context` is not a `tf.distribute.InputContext`.
        ValueError: the global batch does not split evenly among the replicas, an
            epoch would end in a short global batch (set ``drop_remainder=True``), or
            the batch stage is windowed (bucketing, packing, token budgets).
    """
    if not isinstance(input_context, tf.distribute.InputContext):
        msg = (
            "`input_context` must be a tf.distribute.InputContext or None. "
            f"Received: input_context={input_context!r}."
        )
        raise TypeError(msg)
    stage = plan.pipeline.batch_stage
    if plan.layout.window is not None and stage is not None:
        msg = (
            "`dataset(input_context=...)` splits each step's records among the input "
            "pipelines by position, but a windowed batch stage groups the records of a "
            "whole window into batches by their lengths, so the pipelines' batches would "
            "not be the single-process batches. Use `strategy.experimental_distribute_dataset("
            "loader.dataset())` (one pipeline, batches split across replicas) or "
            "`Pipeline.padded_batch`. Received: batch stage "
            f"{stage.describe()}."
        )
        raise ValueError(msg)
    batch_size = plan.batch_size
    replicas = input_context.num_replicas_in_sync
    pipelines = input_context.num_input_pipelines
    if batch_size % replicas or replicas % pipelines:
        msg = (
            "The loader's `batch_size` is the global batch of a step and must split evenly "
            f"among the replicas in sync. Received: batch_size={batch_size}, "
            f"num_replicas_in_sync={replicas}, num_input_pipelines={pipelines}."
        )
        raise ValueError(msg)
    per_epoch = plan.records_per_epoch
    if not plan.layout.drop_remainder and per_epoch % batch_size:
        msg = (
            "Distributed input needs full global batches, but an epoch of this loader ends "
            f"in a short batch. Received: records per epoch (per shard)={per_epoch}, "
            f"batch_size={batch_size}. Create the loader with drop_remainder=True."
        )
        raise ValueError(msg)
    mixing = [s for s in plan.pipeline.batch_map_stages if not s.rowwise]
    if mixing and pipelines > 1:
        msg = (
            f"The batch map stage `{mixing[0].name}` is not row-wise: its rows depend on the "
            "whole batch, which several input pipelines would each see a part of. "
            f"Received: num_input_pipelines={pipelines}. Use one input pipeline, or a "
            "row-wise function (`map_batch(fn, rowwise=True)`)."
        )
        raise ValueError(msg)
    shard = plan.shard
    sub_shard = shard_lib.Shard(
        shard.index + shard.count * input_context.input_pipeline_id, shard.count * pipelines
    )
    sub_plan = plan.sharded(sub_shard, batch_size=batch_size // pipelines)
    return InputPipeline(
        sub_plan,
        # Epochs end in full global batches, so every sub-plan batch is full too.
        dataclasses.replace(sub_plan.layout, drop_remainder=True),
        num_pipelines=pipelines,
        replicas_per_pipeline=replicas // pipelines,
        per_replica_batch_size=batch_size // replicas,
    )


def dataset(
    plan: plan_lib.Plan,
    delivery: delivery_lib.DeliveryPath,
    input_context: Any,
    position: Callable[[], int],
) -> tf.data.Dataset:
    """The per-replica batches of `plan` for `input_context`, from ``position()`` on.

    The position is read when iteration begins, as for the loader's own dataset. Each
    pipeline batch is cut into the replicas' batches, in replica order, inside tf.data
    (strings and ragged leaves included), before the tensor stages.
    """
    pipe = pipeline(plan, input_context)
    per_epoch = plan.records_per_epoch
    pipe.start(position(), per_epoch)  # fail now rather than inside tf.data

    def generate() -> Generator[Any, None, None]:
        start = pipe.start(position(), per_epoch)
        made = delivery.engine.batches(start, plan=pipe.plan, layout=pipe.layout)
        yield from delivery_lib.without_ends(made)

    size = pipe.per_replica_batch_size
    rebatch = size if pipe.replicas_per_pipeline > 1 else None
    return delivery.generated(generate, size, rebatch=rebatch)


def in_replica_context() -> bool:
    """True inside ``strategy.run`` of a non-default strategy."""
    return tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()


def merge(fn: Callable[[], None]) -> None:
    """Runs `fn` once for all replicas of the current replica context."""
    tf.distribute.get_replica_context().merge_call(lambda _strategy: fn())
