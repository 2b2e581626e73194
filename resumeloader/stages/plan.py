"""`Plan`: a pipeline bound to a stream layout, and the batch tasks it yields from a position.

A plan fixes what the pipeline leaves open: the number of epochs and this shard's
part of each epoch's global order (shard ``s`` of ``S`` takes global offsets ``s, s
+ S, ...``; each epoch drops its ``num_records % S`` tail). A *position* counts this
shard's records across epochs; `tasks` yields, from any position, what to produce:
for a plain batch stage one task per batch (its record indices, epoch and position),
for a windowed one (bucketing, packing) one task per window of this shard's stream,
whose batches the producer groups (the first task holds the whole window the
position lies in). Pure Python and NumPy: which records each batch or window holds is
decided here, before any worker, thread or tf.data stage touches them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np

from resumeloader.core import history as history_lib
from resumeloader.core import meters, positions, sampler, validate
from resumeloader.core import shard as shard_lib
from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.stages import sampler as sampler_stage

__all__ = ["SHARD_LAYOUT", "Plan", "Task"]

SHARD_LAYOUT = "strided-v1"

# Indices computed per index-stage call: amortises its per-call cost (~0.15 ms) over
# many batches instead of paying it for each one.
_INDEX_CHUNK = 8192


@dataclasses.dataclass(frozen=True)
class Task:
    """One batch (or window, for a windowed batch stage) to produce: its record indices,
    epoch, and the position of its first record."""

    indices: np.ndarray
    epoch: int
    position: int
    #: The window's number in its epoch (windowed stages; 0 otherwise).
    window: int = 0


class Plan:
    """A `Pipeline` bound to a number of epochs and one shard of each epoch.

    Args:
        pipeline: a pipeline with a batch stage.
        num_epochs: epochs to produce, or None for an endless stream.
        shard: the `Shard` of each epoch's global order this plan reads (strided); None:
            the whole order.
    """

    def __init__(
        self,
        pipeline: pipeline_lib.Pipeline,
        *,
        num_epochs: int | None,
        shard: shard_lib.Shard | None = None,
    ) -> None:
        if pipeline.batch_stage is None:
            msg = (
                "The pipeline has no batch stage: add `.batch(batch_size)` before building a "
                f"loader. Received: {pipeline!r}."
            )
            raise ValueError(msg)
        self.pipeline = pipeline
        self.num_epochs = (
            None if num_epochs is None else validate.integer("num_epochs", num_epochs, low=1)
        )
        #: This plan's `Shard` of each epoch.
        self.shard = shard_lib.Shard() if shard is None else shard_lib.checked(shard)
        self.num_records = pipeline.index_stage.num_records
        self.records_per_epoch = self.shard.records_per_epoch(self.num_records)
        stage = pipeline.batch_stage
        if stage.drop_remainder and stage.batch_size > self.records_per_epoch:
            msg = (
                "`batch_size` exceeds the records of an epoch with drop_remainder=True, so "
                f"no batch would ever be produced. Received: batch_size={stage.batch_size}, "
                f"records per epoch (per shard)={self.records_per_epoch}."
            )
            raise ValueError(msg)
        self.layout = positions.Layout(
            self.records_per_epoch,
            stage.batch_size,
            stage.drop_remainder,
            self.num_epochs,
            window=stage.window,
            known_counts=stage.known_counts,
            skips=self._local_skips(pipeline.history.skips, stage.window),
        )

    def _local(self, position: int, what: str) -> int:
        """This shard's position for `position` of the global order (a skip's bound)."""
        epoch, offset = divmod(position, self.num_records)
        count = self.shard.count
        if offset % count:
            msg = (
                f"A skip's {what} must lie between two steps of all {count} "
                "shards: its offset in the epoch must be a multiple of the shard count. "
                f"Received: {what}={position:,} (offset {offset:,} of epoch {epoch})."
            )
            raise ValueError(msg)
        return epoch * self.records_per_epoch + min(offset // count, self.records_per_epoch)

    def _local_skips(
        self, skips: tuple[history_lib.Skip, ...], window: int | None
    ) -> tuple[tuple[int, int], ...]:
        """The history's skips in this shard's positions (a windowed stage's aligned)."""
        local = history_lib.merged(
            (self._local(s.start, "start"), self._local(s.stop, "stop")) for s in skips
        )
        for start, stop in local:
            for bound in (start, stop):
                if window is not None and bound % self.records_per_epoch % window:
                    msg = (
                        "A windowed batch stage groups whole windows, so a skip of its stream "
                        f"must start and stop at window boundaries (multiples of window="
                        f"{window} from an epoch's start). Received: skip of this shard's "
                        f"positions [{start:,}, {stop:,})."
                    )
                    raise ValueError(msg)
        return local

    def global_position(self, position: int) -> int:
        """`position` of this shard as a position of the global order."""
        epoch, offset = divmod(position, self.records_per_epoch)
        return epoch * self.num_records + offset * self.shard.count

    @property
    def batch_size(self) -> int:
        """Records per batch."""
        return self.layout.batch_size

    @property
    def sampler(self) -> sampler.IndexSampler:
        """The `IndexSampler` equal to this plan's order (pipelines read through a sampler):
        the index stage's own fields, the pipeline's seed, the epochs and the shard.

        Raises:
            TypeError: the pipeline's index stage is not a sampler.
        """
        stage = self.pipeline.index_stage
        if not isinstance(stage, sampler_stage.SamplerStage):
            msg = (
                "This pipeline's order does not come from an IndexSampler. "
                f"Received: index stage {stage.describe()!r}; use `Plan.indices`."
            )
            raise TypeError(msg)
        return sampler.IndexSampler(
            stage.num_records,
            seed=self.pipeline.seed,
            shuffle=stage.shuffle,
            num_epochs=self.num_epochs,
            shard=self.shard,
        )

    def order_fields(self) -> dict[str, int | str]:
        """The pipeline's order fields and the shard layout's."""
        return {**self.pipeline.order_fields(), "shards.layout": SHARD_LAYOUT}

    def sharded(self, shard: shard_lib.Shard, *, batch_size: int) -> Plan:
        """The same pipeline and epochs on another `shard` and batch size."""
        return Plan(
            self.pipeline.with_batch_size(batch_size), num_epochs=self.num_epochs, shard=shard
        )

    def indices(self, epoch: int, start: int, stop: int) -> np.ndarray:
        """Record indices (int64) at this shard's offsets ``[start, stop)`` of epoch `epoch`."""
        offsets = np.arange(start, stop, dtype=np.int64)
        if self.shard.count != 1:
            offsets *= self.shard.count
            offsets += self.shard.index
        return self.pipeline.index_stage.indices(epoch, offsets, seed=self.pipeline.seed)

    def rest_of_epoch(self, position: int) -> positions.Layout:
        """The layout that ends at the end of `position`'s epoch."""
        epoch = position // self.records_per_epoch
        last = epoch + 1 if self.num_epochs is None else min(epoch + 1, self.num_epochs)
        return dataclasses.replace(self.layout, num_epochs=last)

    def tasks(
        self, position: int, layout: positions.Layout | None = None, *,
        place: Callable[[], meters.Place] | None = None, stage: str = "sampler",
    ) -> Iterator[Task]:
        """One task per batch (per window for a windowed stage) from normalised `position`
        on, cut by `layout` (default: the plan's own). With `place` (which returns the
        iterating thread's `meters.Place`, asked at the first task) each task is counted
        as a lap of kind `stage` there, and the computing of one task in
        `meters.Place.every` is timed into its meter: in this loop, without a call or a
        wrapping generator per batch (`meters.Place.kind`)."""
        layout = self.layout if layout is None else layout
        where = None if place is None else place()
        kind = None if where is None else where.kind(stage)
        made = self._windows(position, layout) if layout.window is not None else None
        end = layout.end
        per_epoch = layout.records_per_epoch
        chunk, chunk_epoch, chunk_start = np.empty(0, np.int64), -1, 0
        while made is not None or end is None or position < end:
            start = 0 if kind is None or kind.laps + 1 < kind.due else meters.now()
            if made is not None:
                task = next(made, None)
                if task is None:
                    return
            else:
                stop = layout.batch_end(position)
                epoch, offset = divmod(position, per_epoch)
                first, last = offset - chunk_start, offset - chunk_start + stop - position
                if epoch != chunk_epoch or first < 0 or last > len(chunk):
                    chunk_stop = min(per_epoch, offset + max(stop - position, _INDEX_CHUNK))
                    chunk = self.indices(epoch, offset, chunk_stop)
                    chunk_epoch, chunk_start, first, last = epoch, offset, 0, stop - position
                task = Task(chunk[first:last], epoch, position)
                position = layout.normalise(stop)
            if kind is not None:
                count = len(task.indices)
                kind.laps += 1
                kind.records += count
                kind.batches += 1
                if start:
                    where.timed(kind, count, meters.now() - start)  # type: ignore[union-attr]
            yield task

    def _windows(self, position: int, layout: positions.Layout) -> Iterator[Task]:
        """One task per window from the one holding normalised `position` (whole windows:
        the consumer skips the batches before `position`)."""
        end = layout.end
        per_epoch = layout.records_per_epoch
        while end is None or position < end:
            start, stop = layout.window_bounds(position)
            epoch = start // per_epoch
            base = epoch * per_epoch
            assert layout.window is not None
            offset = start - base
            yield Task(
                self.indices(epoch, offset, stop - base), epoch, start, offset // layout.window
            )
            position = layout.normalise(stop)

    def __repr__(self) -> str:
        epochs = "endless" if self.num_epochs is None else f"{self.num_epochs} epochs"
        return (
            f"Plan({self.pipeline!r}, {epochs}, shard {self.shard.index}/{self.shard.count})"
        )

