"""Turns a task into its batches: read, run the record stages, check, group, assemble, encode.

NumPy and optree only, no TensorFlow, so that worker processes stay light. Every
failure of user code is translated into a `RecordError` naming the record index,
the epoch and the position, with the original exception chained. A task of a plain
batch stage makes one batch, one of a windowed stage (bucketing, packing) the
window's batches (`Produced`). A batch leaves here as one numeric array per leaf of
the batch stage's output spec: variable leaves (strings, arrays of varying shape) in
the batch wire format (`resumeloader.core.wire`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import optree

from resumeloader import errors
from resumeloader.core import spec as spec_lib
from resumeloader.core import wire
from resumeloader.stages import base as stages_base
from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import skips

__all__ = ["BatchProducer", "Produced"]

_READ_ONLY_HINT = (
    " Records are read-only views of the source, so that a map_fn cannot change the "
    "data: copy before changing one in place (e.g. `record = record.copy()`)."
)


@dataclasses.dataclass(frozen=True)
class Produced:
    """A task's batches, in order.

    Attributes:
        batches: each a structure of arrays (of the batch stage's output spec).
        counts: the positions each batch counts (the records it holds).
        rows: per batch, the slot in the task of each row's (first) record (-1 for an
            empty row); None when each batch's rows are its task's records in order.
    """

    batches: list[Any]
    counts: list[int]
    rows: list[np.ndarray] | None = None

    def flatten(self, treespec: Any) -> tuple[list[np.ndarray], tuple[list[int], bool]]:
        """Every array of the batches (and rows), and what `unflatten` needs besides."""
        arrays = [a for batch in self.batches for a in treespec.flatten_up_to(batch)]
        if self.rows is not None:
            arrays += self.rows
        return arrays, (self.counts, self.rows is not None)

    @classmethod
    def unflatten(
        cls, treespec: Any, arrays: list[np.ndarray], header: tuple[list[int], bool]
    ) -> Produced:
        """The `Produced` whose `flatten` gave `arrays` and `header`."""
        counts, has_rows = header
        size = treespec.num_leaves
        batches = [
            optree.tree_unflatten(treespec, arrays[i * size : (i + 1) * size])
            for i in range(len(counts))
        ]
        rows = list(arrays[len(counts) * size :]) if has_rows else None
        return cls(batches, list(counts), rows)


class BatchProducer:
    """Produces the batches of a `Task` of a pipeline, with errors that name the record.

    Args:
        pipeline: the pipeline whose source, record stages and batch stage run (its
            tensor stages run in TensorFlow, not here).
        spec: the per-record spec batches are checked against. When None it is the
            pipeline's (`Pipeline.record_spec`), else the source's own
            (`Source.record_spec`) if there is no record stage, else that of record 0
            (epoch 0) read and run through the record stages.
    """

    def __init__(
        self, pipeline: pipeline_lib.Pipeline, spec: spec_lib.RecordSpec | None = None
    ) -> None:
        self.pipeline = pipeline.python_part()
        self._source = pipeline.source
        self._stages = pipeline.record_stages
        assert pipeline.batch_stage is not None
        self._batch_stage = pipeline.batch_stage
        # Without record stages a batched source returns whole batches in one call.
        self.reads_batches = not self._stages and self._source.batched
        policy = pipeline.error_policy
        self._policy = policy if policy.replaces else None
        #: The replacements in the batches made here, until the consumer side takes them.
        self.skips = skips.SkipLedger()
        if spec is None:
            spec = pipeline.record_spec
        if spec is None and not self._stages:
            spec = self._source.record_spec()
        self.spec = spec if spec is not None else spec_lib.RecordSpec.of(self._probe())
        #: The spec of one row of the batches (what the batch stage makes of records).
        self.output_spec = self._batch_stage.output_spec(self.spec)

    def record(self, index: int, *, epoch: int, position: int) -> Any:
        """Reads record `index` and runs the record stages; user errors become `RecordError`."""
        try:
            record = self._source.read(index)
        except Exception as err:
            raise _record_error("The source", err, index, epoch, position) from err
        return self._transform(record, index=index, epoch=epoch, position=position)

    def _transform(self, record: Any, *, index: int, epoch: int, position: int) -> Any:
        if not self._stages:
            return record
        if type(record) is np.ndarray:
            record = _read_only(record)
        else:
            record = optree.tree_map(_read_only, record, none_is_leaf=True)
        for stage in self._stages:
            try:
                record = stage.apply(record, epoch=epoch, index=index)
            except Exception as err:
                what = "`map_fn`" if stage.name == "map" else f"Stage `{stage.name}`"
                raise _record_error(what, err, index, epoch, position) from err
        return record

    def batch(self, task: plan_lib.Task) -> Produced:
        """The batches of `task`'s records, whose first record sits at ``task.position``;
        a failing record raises `RecordError` or is replaced, as the error policy says."""
        try:
            return self._batch(task)
        except errors.RecordError:
            if self._policy is None:
                raise
        return self._batch_replacing(task)

    def _batch(self, task: plan_lib.Task) -> Produced:
        indices, epoch, position = task.indices, task.epoch, task.position
        if self.reads_batches:
            return self._grouped(self._read_batch(indices, epoch=epoch, position=position), task)
        # A source that reads many records at once is read once per batch.
        read = None
        if self._source.reads_many:
            read = self._read_many(indices, epoch=epoch, position=position)
        columns: list[list[np.ndarray]] = [[] for _ in self.spec.leaves]
        single = columns[0] if len(columns) == 1 else None
        for offset, index in enumerate(indices.tolist()):
            at = position + offset
            if read is None:
                record = self.record(index, epoch=epoch, position=at)
            else:
                record = self._transform(read[offset], index=index, epoch=epoch, position=at)
            leaves = self._check(record, index=index, epoch=epoch, position=at)
            if single is not None:
                single.append(leaves[0])
            else:
                for column, leaf in zip(columns, leaves, strict=True):
                    column.append(leaf)
        return self._grouped(columns, task)

    # -- the batch stage's part ------------------------------------------------------
    def _grouped(self, columns: list[Any], task: plan_lib.Task) -> Produced:
        """The task's batches from its records' checked `columns`."""
        stage = self._batch_stage
        try:
            made = stage.batches(
                columns, self.spec, seed=self.pipeline.seed, epoch=task.epoch,
                window=task.window,
            )
        except stages_base.GroupError as err:
            index, position = int(task.indices[err.slot]), task.position + err.slot
            msg = (
                f"Record index {index} (epoch {task.epoch}, position {position}) does not fit "
                f"the batch stage `{stage.name}`: {err}"
            )
            raise errors.RecordSpecError(
                msg, record_index=index, epoch=task.epoch, position=position
            ) from err
        return Produced([self._encoded(leaves) for leaves in made.leaves], made.counts, made.rows)

    # -- the error policy's path: only for a batch in which a record failed --------
    def _batch_replacing(self, task: plan_lib.Task) -> Produced:
        """`task`'s batches made again record by record, each failing record replaced as
        the error policy says; the replacements are left in `skips`."""
        epoch = task.epoch
        columns: list[list[np.ndarray]] = [[] for _ in self.spec.leaves]
        skips = []
        for position, index in enumerate(task.indices.tolist(), start=task.position):
            read = functools.partial(self._checked, epoch=epoch, position=position)
            try:
                leaves = read(index)
            except errors.RecordError as err:
                check = functools.partial(self._check, index=index, epoch=epoch, position=position)
                leaves, skip = self._replaced(err, read, check)
                skips.append(skip)
            for column, leaf in zip(columns, leaves, strict=True):
                column.append(leaf)
        produced = self._grouped(columns, task)
        self.skips.put(task, skips)
        return produced

    def _checked(self, index: int, *, epoch: int, position: int) -> list[np.ndarray]:
        record = self.record(index, epoch=epoch, position=position)
        return self._check(record, index=index, epoch=epoch, position=position)

    def _replaced(
        self, err: errors.RecordError, read: Callable[[int], Any], check: Callable[[Any], Any]
    ) -> tuple[Any, dict[str, Any]]:
        assert self._policy is not None
        order = self.pipeline.index_stage
        return self._policy.replace(err, read, check, order=order, seed=self.pipeline.seed)

    def _probe(self) -> Any:
        """Record 0 of epoch 0, whose spec is the batches' (replaced if it fails)."""
        try:
            return self.record(0, epoch=0, position=0)
        except errors.RecordError as err:
            if self._policy is None:
                raise
            read = functools.partial(self.record, epoch=0, position=0)
            return self._replaced(err, read, lambda record: record)[0]

    def _encoded(self, leaves: list[Any]) -> Any:
        encoded = [
            wire.encode(leaf, spec) if spec.variable else leaf
            for leaf, spec in zip(leaves, self.output_spec.leaves, strict=True)
        ]
        return optree.tree_unflatten(self.output_spec.treespec, encoded)

    def _read_many(self, indices: np.ndarray, *, epoch: int, position: int) -> list[Any]:
        try:
            records = list(self._source.read_many(indices))
        except Exception as err:
            raise _batch_error("read", err, indices, epoch, position) from err
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

    def _check(self, record: Any, *, index: int, epoch: int, position: int) -> list[np.ndarray]:
        fixed = self.spec.one_array  # the thin path: one comparison
        if (
            fixed is not None
            and type(record) is np.ndarray
            and record.dtype == fixed[0]
            and record.shape == fixed[1]
        ):
            return [record]
        problem = None
        try:
            leaves, treespec = spec_lib.flatten(record)
        except TypeError as err:
            problem = str(err)
        else:
            if treespec != self.spec.treespec:
                problem = f"its structure differs ({treespec_text(treespec)})"
            else:
                for number, (leaf, want) in enumerate(zip(leaves, self.spec.leaves, strict=True)):
                    if not want.accepts(leaf):
                        path = self.spec.paths()[number]  # only on failure: it costs
                        got = spec_lib.describe_value(leaf)
                        problem = f"{path} is {got}, expected {want.describe()}"
                        problem += _shape_hint(want, leaf.shape, per_record=True)
                        break
        if problem is None:
            return leaves
        received = optree.tree_map(spec_lib.describe_value, record, none_is_leaf=True)
        msg = (
            f"Record index {index} (epoch {epoch}, position {position}) does not match the "
            f"element spec: {problem}. Expected: {self.spec.describe()}. "
            f"Received: {str(received).replace(chr(39), '')}."
        )
        raise errors.RecordSpecError(msg, record_index=index, epoch=epoch, position=position)

    def _read_batch(self, indices: np.ndarray, *, epoch: int, position: int) -> list[Any]:
        first, size = int(indices[0]), len(indices)
        try:
            batch = self._source.read_batch(indices)
        except Exception as err:
            raise _batch_error("read_batch", err, indices, epoch, position) from err
        problem = None
        try:
            columns = self.spec.treespec.flatten_up_to(batch)
        except (ValueError, TypeError) as err:
            problem = f"its structure differs: {err}"
            columns = []
        leaves: list[Any] = []
        for column, want, path in zip(columns, self.spec.leaves, self.spec.paths(), strict=False):
            leaf, problem = _batch_leaf(column, want, size)
            if problem is not None:
                problem = f"{path}: {problem}"
                break
            leaves.append(leaf)
        if problem is None:
            return leaves
        msg = (
            f"read_batch returned a batch that does not match the element spec for the "
            f"{size} records starting at record index {first} (epoch {epoch}, position "
            f"{position}): {problem}. Expected per record: {self.spec.describe()}."
        )
        raise errors.RecordSpecError(msg, record_index=first, epoch=epoch, position=position)


def _batch_leaf(column: Any, want: spec_lib.LeafSpec, size: int) -> tuple[Any, str | None]:
    """A read_batch leaf as the producer needs it, or the problem with it in words."""
    try:
        if want.ragged or (want.is_string and not want.shape and isinstance(column, list)):
            if len(column) != size:
                return None, f"{len(column)} values for {size} records"
            if not want.ragged:
                bad = next((v for v in column if not _is_text(v)), None)
                if bad is not None:
                    return None, f"a record's value is {type(bad).__name__}, expected bytes or str"
                return column, None
            values = [spec_lib.leaf_array(value) for value in column]
            bad = next((v for v in values if not want.accepts(v)), None)
            if bad is not None:
                got = spec_lib.describe_value(bad)
                return None, f"a record's value is {got}, expected {want.describe()}"
            return values, None
        if want.is_string:  # not through np.asarray: it would drop trailing NUL bytes
            array = spec_lib.leaf_array(np.asarray(column, dtype=object))
        else:
            array = np.asarray(column)
    except TypeError as err:
        return None, str(err)
    shape = (size, *want.shape)
    if array.dtype != want.dtype or array.shape != shape:
        got = spec_lib.LeafSpec(array.shape, array.dtype).describe()
        hint = _shape_hint(want, array.shape, per_record=False)
        return None, f"the batch is {got}, expected {size} records of {want.describe()}{hint}"
    return array, None


def _is_text(value: Any) -> bool:
    """Whether the wire format takes `value` as one string (bytes, str, or a 0-d array of one)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    return isinstance(value, (bytes, str))


def _shape_hint(want: spec_lib.LeafSpec, got: tuple[int, ...], *, per_record: bool) -> str:
    """Advice when the expected shape includes the batch dimension, or is fixed where a
    record's shape varies."""
    fits = want.shape[1:] == got if per_record else want.shape == got
    if want.shape and fits:
        return (
            " (`output_signature` describes one record, without the batch dimension: "
            f"it looks like yours includes it; try {want.shape[1:]})"
        )
    if not per_record or len(got) != len(want.shape) or not want.shape:
        return ""
    dims = tuple(w if w == g else None for w, g in zip(want.shape, got, strict=True))
    dtype = "tf.string" if want.is_string else f"tf.{want.dtype.name}"
    return (
        " (records whose arrays vary in shape need None for the dimensions that vary in "
        f"`output_signature`, e.g. tf.TensorSpec({dims}, {dtype}): their batches become "
        "tf.RaggedTensor)"
    )


def treespec_text(treespec: Any) -> str:
    """A structure in words, e.g. ``{image: *, label: *}``."""
    text = str(treespec).removeprefix("PyTreeSpec(").removesuffix(")")
    return text.removesuffix(", NoneIsLeaf").replace("'", "")


def _read_only(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def _record_error(
    what: str, err: Exception, index: int, epoch: int, position: int
) -> errors.RecordError:
    where = f"record index {index} (epoch {epoch}, position {position})"
    msg = f"{what} raised {type(err).__name__} on {where}: {err}"
    if isinstance(err, ValueError) and "read-only" in str(err):
        msg += _READ_ONLY_HINT
    return errors.RecordError(msg, record_index=index, epoch=epoch, position=position)


def _batch_error(
    call: str, err: Exception, indices: np.ndarray, epoch: int, position: int
) -> errors.RecordError:
    first = int(indices[0])
    msg = (
        f"The source's {call} raised {type(err).__name__} on the batch starting at record "
        f"index {first} (epoch {epoch}, position {position}): {err}"
    )
    # A source that knows which record failed (e.g. a checksum) says so: point at it.
    index = getattr(err, "record_index", None)
    if isinstance(index, int) and index in indices:
        position += int(np.flatnonzero(indices == index)[0])
        return errors.RecordError(msg, record_index=index, epoch=epoch, position=position)
    return errors.RecordError(msg, record_index=first, epoch=epoch, position=position)
