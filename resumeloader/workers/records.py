"""A task's records read, run through the record stages and checked, column by column.

The per-record part of `resumeloader.workers.produce.BatchProducer`, the hot loop of a
``map_fn`` pipeline: every record is read-only when a stage gets it (a ``map_fn``
cannot change the source's data), every user error becomes a `RecordError` naming
the record, and every result is checked against the record spec. Records are read
in bulk when the source can: in-memory arrays (`Source.exact_batches`) with one
gather per batch whose read-only rows are the records, a source with ``read_many``
with one call; then one loop runs the stages and checks each record. NumPy and
optree only (no TensorFlow).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import optree

from resumeloader import errors
from resumeloader.core import spec as spec_lib
from resumeloader.sources import base as sources_base
from resumeloader.stages import base as stages_base
from resumeloader.workers import checks

__all__ = ["Records"]


class Records:
    """The records of `source` at given indices, through the record stages `stages`."""

    def __init__(self, source: sources_base.Source,
                 stages: tuple[stages_base.RecordStage, ...], *, seed: int) -> None:
        self._source = source
        #: The pipeline's seed: the one every stage receives with the epoch.
        self._seed = seed
        self._stages = stages
        # In-memory arrays are read a batch at a time, their records the rows of it.
        source_spec = source.record_spec() if stages else None
        self._read_batch_of = sources_base.optional(source, "read_batch")
        self._read_many_of = sources_base.optional(source, "read_many")
        self._split = (source_spec.treespec if source_spec is not None
                       and self._read_batch_of is not None and source.exact_batches else None)

    def read(self, index: int, *, epoch: int, position: int) -> Any:
        """Record `index` read and run through the record stages."""
        try:
            record = self._source.read(index)
        except Exception as err:
            raise checks.record_error("The source", err, index, epoch, position) from err
        return self.transform(record, index=index, epoch=epoch, position=position)

    def transform(self, record: Any, *, index: int, epoch: int, position: int) -> Any:
        """`record` (of `index`) run through the record stages, read-only when they get it."""
        if not self._stages:
            return record
        if type(record) is np.ndarray:
            record = _read_only(record)
        else:
            record = optree.tree_map(_read_only, record, none_is_leaf=True)
        return self._staged(record, index, epoch, position)

    def _staged(self, record: Any, index: int, epoch: int, position: int) -> Any:
        for stage in self._stages:
            try:
                record = stage.apply(record, seed=self._seed, epoch=epoch, index=index)
            except Exception as err:
                what = "`map_fn`" if stage.name == "map" else f"Stage `{stage.name}`"
                raise checks.record_error(what, err, index, epoch, position) from err
        return record

    def columns(self, spec: spec_lib.RecordSpec, indices: np.ndarray, *, epoch: int,
                position: int) -> list[list[Any]]:
        """The leaves of the records at `indices` (the first at `position`), through the
        stages and checked against `spec`, column by column."""
        columns: list[list[Any]] = [[] for _ in spec.leaves]
        single = columns[0] if len(columns) == 1 else None
        fixed = spec.one_array  # one array of fixed dtype and shape: checked inline
        records, protected = self._bulk(indices, epoch=epoch, position=position)
        for offset, index in enumerate(indices.tolist()):
            at = position + offset
            if records is None:
                record = self.read(index, epoch=epoch, position=at)
            elif protected:
                record = self._staged(records[offset], index, epoch, at)
            else:
                record = self.transform(records[offset], index=index, epoch=epoch, position=at)
            if (fixed is not None and type(record) is np.ndarray
                    and record.dtype == fixed[0] and record.shape == fixed[1]):
                columns[0].append(record)  # what `checks.record` accepts at once
                continue
            leaves = checks.record(spec, record, index=index, epoch=epoch, position=at)
            if single is not None:
                single.append(leaves[0])
            else:
                for column, leaf in zip(columns, leaves, strict=True):
                    column.append(leaf)
        return columns

    def _bulk(self, indices: np.ndarray, *, epoch: int,
              position: int) -> tuple[list[Any] | None, bool]:
        """The records at `indices` read at once when the source can (else None), and
        whether they are read-only already."""
        if self._split is not None:
            return self._rows(indices, epoch=epoch, position=position), True
        if self._read_many_of is not None:
            return self._read_many(indices, epoch=epoch, position=position), False
        return None, False

    def _rows(self, indices: np.ndarray, *, epoch: int, position: int) -> list[Any]:
        """The records at `indices` as the read-only rows of one `read_batch`."""
        treespec = self._split
        assert treespec is not None
        try:
            assert self._read_batch_of is not None
            batch = self._read_batch_of(indices)
        except Exception as err:
            raise checks.batch_error("read_batch", err, indices, epoch, position) from err
        columns = treespec.flatten_up_to(batch)
        for column in columns:
            column.flags.writeable = False  # and so its rows, the records
        if treespec.is_leaf():
            return list(columns[0])
        return [optree.tree_unflatten(treespec, leaves)
                for leaves in zip(*(list(column) for column in columns), strict=True)]

    def _read_many(self, indices: np.ndarray, *, epoch: int, position: int) -> list[Any]:
        try:
            assert self._read_many_of is not None
            records = list(self._read_many_of(indices))
        except Exception as err:
            raise checks.batch_error("read", err, indices, epoch, position) from err
        if len(records) != len(indices):
            msg = (
                f"The source's read_many returned {len(records)} records for the "
                f"{len(indices)} records starting at record index {int(indices[0])} "
                f"(epoch {epoch}, position {position}). Expected: one per index."
            )
            raise errors.RecordError(
                msg, record_index=int(indices[0]), epoch=epoch, position=position
            )
        return records


def _read_only(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value
