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
from collections.abc import Callable, Iterator
from typing import Any

import optree
import tensorflow as tf

from resumeloader import _graph, _position, _sampler, errors

__all__ = ["Pipeline", "generator", "in_replica_context", "merge", "pipeline"]


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """The stream of one input pipeline: a sub-shard sampler, its layout and the split."""

    sampler: _sampler.IndexSampler
    layout: _position.Layout
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
        return self.layout.normalise(
            epoch * self.layout.records_per_epoch + offset // self.num_pipelines
        )

    def split(self, batch: Any) -> Iterator[Any]:
        """The per-replica batches of one pipeline step, in replica order."""
        size = self.per_replica_batch_size
        for i in range(self.replicas_per_pipeline):
            yield optree.tree_map(lambda leaf, i=i: leaf[i * size : (i + 1) * size], batch)


def pipeline(
    *,
    sampler: _sampler.IndexSampler,
    batch_size: int,
    drop_remainder: bool,
    input_context: Any,
) -> Pipeline:
    """The `Pipeline` of `input_context` for a loader's sampler and global batch size.

    Raises:
        TypeError: `input_context` is not a `tf.distribute.InputContext`.
        ValueError: the global batch does not split evenly among the replicas, or
            an epoch would end in a short global batch (set ``drop_remainder=True``).
    """
    if not isinstance(input_context, tf.distribute.InputContext):
        msg = (
            "`input_context` must be a tf.distribute.InputContext or None. "
            f"Received: input_context={input_context!r}."
        )
        raise TypeError(msg)
    replicas = input_context.num_replicas_in_sync
    pipelines = input_context.num_input_pipelines
    if batch_size % replicas or replicas % pipelines:
        msg = (
            "The loader's `batch_size` is the global batch of a step and must split evenly "
            f"among the replicas in sync. Received: batch_size={batch_size}, "
            f"num_replicas_in_sync={replicas}, num_input_pipelines={pipelines}."
        )
        raise ValueError(msg)
    per_epoch = sampler.records_per_epoch
    if not drop_remainder and per_epoch % batch_size:
        msg = (
            "Distributed input needs full global batches, but an epoch of this loader ends "
            f"in a short batch. Received: records per epoch (per shard)={per_epoch}, "
            f"batch_size={batch_size}. Create the loader with drop_remainder=True."
        )
        raise ValueError(msg)
    sub_sampler = _sampler.IndexSampler(
        sampler.num_records,
        seed=sampler.seed,
        shuffle=sampler.shuffle,
        num_epochs=sampler.num_epochs,
        shard_index=sampler.shard_index + sampler.shard_count * input_context.input_pipeline_id,
        shard_count=sampler.shard_count * pipelines,
    )
    layout = _position.Layout(
        sub_sampler.records_per_epoch,
        batch_size // pipelines,
        drop_remainder=True,
        num_epochs=sampler.num_epochs,
    )
    return Pipeline(
        sub_sampler,
        layout,
        num_pipelines=pipelines,
        replicas_per_pipeline=replicas // pipelines,
        per_replica_batch_size=batch_size // replicas,
    )


def generator(loader: Any, input_context: Any) -> tuple[Callable[[], Iterator[Any]], Any]:
    """The generator function and element spec of `loader`'s pipeline for `input_context`.

    The generator reads the loader's position when it starts, like the loader's own.
    """
    pipe = pipeline(
        sampler=loader.sampler,
        batch_size=loader.batch_size,
        drop_remainder=loader.drop_remainder,
        input_context=input_context,
    )
    per_epoch = loader.sampler.records_per_epoch
    pipe.start(loader.position, per_epoch)  # fail now rather than inside tf.data

    def generate() -> Iterator[Any]:
        start = pipe.start(loader.position, per_epoch)
        for batch in loader._batches(pipe.sampler, pipe.layout, start):
            yield from pipe.split(batch)

    spec = _graph.element_spec(
        loader._producer.spec, pipe.per_replica_batch_size, loader.with_metadata
    )
    return generate, spec


def in_replica_context() -> bool:
    """True inside ``strategy.run`` of a non-default strategy."""
    return tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context()


def merge(fn: Callable[[], None]) -> None:
    """Runs `fn` once for all replicas of the current replica context."""
    tf.distribute.get_replica_context().merge_call(lambda _strategy: fn())
