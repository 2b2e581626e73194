"""Turns a batch task into one batch: read, run the record stages, check, assemble.

NumPy and optree only, no TensorFlow, so that worker processes stay light. Every
failure of user code is translated into a `RecordError` naming the record index,
the epoch and the position, with the original exception chained.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optree

from resumeloader import errors
from resumeloader.core import spec as spec_lib
from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.stages import plan as plan_lib

__all__ = ["BatchProducer"]


class BatchProducer:
    """Produces the batch of a `Task` of a pipeline, with errors that name the record.

    Args:
        pipeline: the pipeline whose source, record stages and batch stage run.
        spec: the per-record spec batches are checked against; inferred from
            record 0 (epoch 0) when None.
    """

    def __init__(
        self, pipeline: pipeline_lib.Pipeline, spec: spec_lib.RecordSpec | None = None
    ) -> None:
        self.pipeline = pipeline
        self._source = pipeline.source
        self._stages = pipeline.record_stages
        assert pipeline.batch_stage is not None
        self._batch_stage = pipeline.batch_stage
        # Without record stages a batched source returns whole batches in one call.
        self.reads_batches = not self._stages and self._source.batched
        self.spec = spec if spec is not None else spec_lib.RecordSpec.of(
            self.record(0, epoch=0, position=0)
        )

    def record(self, index: int, *, epoch: int, position: int) -> Any:
        """Reads record `index` and runs the record stages; user errors become `RecordError`."""
        try:
            record = self._source.read(index)
        except Exception as err:
            raise _record_error("The source", err, index, epoch, position) from err
        for stage in self._stages:
            try:
                record = stage.apply(record, epoch=epoch, index=index)
            except Exception as err:
                what = "`map_fn`" if stage.name == "map" else f"Stage `{stage.name}`"
                raise _record_error(what, err, index, epoch, position) from err
        return record

    def batch(self, task: plan_lib.Task) -> Any:
        """The batch of `task`'s records, whose first record sits at ``task.position``."""
        indices, epoch, position = task.indices, task.epoch, task.position
        if self.reads_batches:
            return self._read_batch(indices, epoch=epoch, position=position)
        columns: list[list[np.ndarray]] = [[] for _ in self.spec.leaves]
        for offset, index in enumerate(indices.tolist()):
            record = self.record(index, epoch=epoch, position=position + offset)
            leaves = self._check(record, index=index, epoch=epoch, position=position + offset)
            for column, leaf in zip(columns, leaves, strict=True):
                column.append(leaf)
        return optree.tree_unflatten(
            self.spec.treespec, self._batch_stage.assemble(columns, self.spec)
        )

    def _check(self, record: Any, *, index: int, epoch: int, position: int) -> list[np.ndarray]:
        try:
            leaves, treespec = spec_lib.flatten(record)
            problem = None
            if treespec != self.spec.treespec:
                problem = "its structure differs"
            else:
                for leaf, spec in zip(leaves, self.spec.leaves, strict=True):
                    if not spec.accepts(leaf):
                        problem = f"a leaf is {leaf.dtype.name}{list(leaf.shape)}"
                        break
        except TypeError as err:
            problem = str(err)
        if problem is None:
            return leaves
        got = optree.tree_map(
            lambda leaf: f"{np.asarray(leaf).dtype.name}{list(np.shape(leaf))}",
            record,
            none_is_leaf=True,
        )
        msg = (
            f"Record index {index} (epoch {epoch}, position {position}) does not match the "
            f"element spec: {problem}. Expected: {self.spec.describe()}. "
            f"Received: {str(got).replace(chr(39), '')}."
        )
        raise errors.RecordSpecError(msg, record_index=index, epoch=epoch, position=position)

    def _read_batch(self, indices: np.ndarray, *, epoch: int, position: int) -> Any:
        first = int(indices[0])
        try:
            batch = self._source.read_batch(indices)
            leaves, treespec = optree.tree_flatten(batch, none_is_leaf=True)
            leaves = [np.asarray(leaf) for leaf in leaves]
        except Exception as err:
            msg = (
                f"The source's read_batch raised {type(err).__name__} on the batch starting at "
                f"record index {first} (epoch {epoch}, position {position}): {err}"
            )
            raise errors.RecordError(
                msg, record_index=first, epoch=epoch, position=position
            ) from err
        ok = treespec == self.spec.treespec and all(
            leaf.shape[:1] == (len(indices),) and spec.accepts(leaf[0])
            for leaf, spec in zip(leaves, self.spec.leaves, strict=False)
        )
        if not ok:
            got = [f"{a.dtype.name}{list(a.shape)}" for a in leaves]
            msg = (
                f"read_batch returned a batch that does not match the element spec for the "
                f"{len(indices)} records starting at record index {first} (epoch {epoch}, "
                f"position {position}). Expected per record: {self.spec.describe()}. "
                f"Received leaves: {got}."
            )
            raise errors.RecordSpecError(msg, record_index=first, epoch=epoch, position=position)
        return optree.tree_unflatten(self.spec.treespec, leaves)


def _record_error(
    what: str, err: Exception, index: int, epoch: int, position: int
) -> errors.RecordError:
    where = f"record index {index} (epoch {epoch}, position {position})"
    msg = f"{what} raised {type(err).__name__} on {where}: {err}"
    return errors.RecordError(msg, record_index=index, epoch=epoch, position=position)
