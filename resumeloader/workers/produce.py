"""`BatchProducer`: a task into its batches: read, run the record stages, check, group, encode.

NumPy and optree only, no TensorFlow, so that worker processes stay light. Every
failure of user code is translated into a `RecordError` naming the record index,
the epoch and the position, with the original exception chained. A task of a plain
batch stage makes one batch, one of a windowed stage (bucketing, packing) the
window's batches (`Produced`). A batch leaves here as one numeric array per leaf of
the batch stage's output spec: variable leaves (strings, arrays of varying shape) in
the batch wire format (`resumeloader.core.wire`).
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import itertools
import sys
import weakref
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np
import optree

from resumeloader import errors
from resumeloader.core import board as board_lib
from resumeloader.core import buffers, handoff, meters, wire
from resumeloader.core import spec as spec_lib
from resumeloader.sources import base as sources_base
from resumeloader.stages import base as stages_base
from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.stages.batching import fixed
from resumeloader.workers import checks, records, skips, timing

__all__ = ["BatchProducer", "Produced"]

#: A record that is one string (bytes): what a source of serialized records holds.
_STRINGS = spec_lib.RecordSpec.of(b"")


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
        hand_over: the batches go to TensorFlow in this process: a large numeric leaf
            made by user code or NumPy (a ``map_batch`` result, stacked records) is
            copied into recycled aligned memory that TensorFlow takes over
            (`core/handoff.py`). Converting it as it is costs TensorFlow a fresh
            allocation, whose pages fault in once its malloc patch is on: 0.79 ms
            against 0.05 ms for a 1.5 MB batch, measured. False in worker processes,
            whose batches are copied out anyway.
        board: where each batch's stages are counted and timed (`core/board.py`,
            per batch, in the calling thread's place); None counts nothing.
    """

    def __init__(
        self, pipeline: pipeline_lib.Pipeline, spec: spec_lib.RecordSpec | None = None,
        *, hand_over: bool = True, board: board_lib.Board | None = None,
    ) -> None:
        self.pipeline = pipeline.python_part()
        self._hand_over = hand_over
        #: Where batches are counted (None: not counted).
        self.board = board
        #: The meter names of the stages run here.
        self.names = timing.Names.of(pipeline)
        #: The pipeline's seed: the one every stage receives with the epoch.
        self._seed = pipeline.seed
        self._source = pipeline.source
        self._stages = pipeline.record_stages
        assert pipeline.batch_stage is not None
        self._batch_stage = pipeline.batch_stage
        # Without record stages a source with `read_batch` returns whole batches in one call.
        self._read_batch_of = sources_base.optional(self._source, "read_batch")
        self.reads_batches = not self._stages and self._read_batch_of is not None
        self._records = records.Records(self._source, self._stages, seed=self._seed)
        policy = pipeline.error_policy
        self._policy = policy if policy.replaces else None
        #: The replacements in the batches made here, until the consumer side takes them.
        self.skips = skips.SkipLedger()
        if spec is None:
            spec = pipeline.record_spec
        if spec is None and not self._stages:
            spec = self._source.record_spec()
        self.spec = spec if spec is not None else spec_lib.RecordSpec.of(self._probe())
        # A source whose batches are its spec's by construction, read with that spec:
        # its batches need no check (the cost of one per batch, for in-memory arrays).
        self._exact = (self.reads_batches and self._source.exact_batches
                       and self.spec == self._source.record_spec())
        self._maps = pipeline.batch_map_stages
        # A source of strings that reads a batch as one packed wire column, batched by the
        # plain batch stage and nothing else: its column goes to TensorFlow as it is read.
        self._read_packed_of = None
        if (self.reads_batches and not self._maps and self.spec == _STRINGS
                and type(self._batch_stage) is fixed.FixedBatchStage
                and self._source.record_spec() == _STRINGS):
            self._read_packed_of = sources_base.optional(self._source, "read_packed")
        #: Whether a batch is read as one packed column (``read_packed``), not by
        #: ``read_batch``.
        self.reads_packed = self._read_packed_of is not None
        # The spec of a row as the batch stage makes it, then after each batch map stage.
        self._map_specs = [self._batch_stage.output_spec(self.spec)]
        for stage in self._maps:
            self._map_specs.append(stage.output_spec(self._map_specs[-1]))
        # Per batch map stage: the (row shape, dtype) of each leaf of the batch its
        # function writes into (``out``), or None.
        self._outs = [_out_leaves(stage, spec)
                      for stage, spec in zip(self._maps, self._map_specs[1:], strict=True)]
        #: The spec of one row of the batches (what the batch stage and the batch map
        #: stages make of records).
        self.output_spec = self._map_specs[-1]
        self._encodes = self.output_spec.variable

    def record(self, index: int, *, epoch: int, position: int) -> Any:
        """Reads record `index` and runs the record stages; user errors become `RecordError`."""
        return self._records.read(index, epoch=epoch, position=position)

    def batch(self, task: plan_lib.Task) -> Produced:
        """The batches of `task`'s records, whose first record sits at ``task.position``;
        a failing record raises `RecordError` or is replaced, as the error policy says."""
        lap = None
        if self.board is not None:
            lap = self.board.here().lap(timing.PRODUCE, len(task.indices))
        return self._made(task, lap)

    def run(self, tasks: Iterator[plan_lib.Task]
            ) -> Generator[tuple[plan_lib.Task, Produced], None, None]:
        """``(task, batch(task))`` for each of `tasks`, made in the thread that iterates:
        each counted as `batch` counts it, in this loop, without a call per untimed
        batch (`meters.Place.kind`)."""
        if self.board is None:
            for task in tasks:
                yield task, self._made(task, None)
            return
        place = self.board.here()
        kind = place.kind(timing.PRODUCE)
        for task in tasks:
            count = len(task.indices)
            kind.laps += 1
            kind.records += count
            kind.batches += 1
            lap = None if kind.laps < kind.due else place.timing(kind, count)
            yield task, self._made(task, lap)

    def _made(self, task: plan_lib.Task, lap: meters.Lap | None) -> Produced:
        """`task`'s batches (`batch`), timed by `lap` if it is not None."""
        try:
            return self._batch(task, lap)
        except errors.RecordError:
            if self._policy is None:
                raise
        return self._batch_replacing(task, lap)

    def _batch(self, task: plan_lib.Task, lap: meters.Lap | None = None) -> Produced:
        if self._read_packed_of is not None:
            return self._packed(task, lap)
        return self._grouped(self._columns(task, lap), task, lap)

    def _packed(self, task: plan_lib.Task, lap: meters.Lap | None = None) -> Produced:
        """The batch of `task` read as one packed column (``read_packed``; timed by `lap`
        as the read, the batch stage taking no time of its own)."""
        indices = task.indices
        try:
            column = self._read_packed_of(indices)  # type: ignore[misc]
        except Exception as err:
            raise checks.batch_error("read_batch", err, indices, task.epoch,
                                     task.position) from err
        if lap is not None:
            lap.lap(lap.place[timing.READ], len(indices))
            meter = lap.place[self.names.batch]
            lap.lap(meter, len(indices), out=len(indices))
            meter.bytes_out += column.nbytes
        batch = optree.tree_unflatten(self.output_spec.treespec, [column])
        return Produced([batch], [len(indices)], None)

    def groups(self, task: plan_lib.Task, *, replacing: bool = False) -> list[stages_base.Group]:
        """The batches of a windowed stage's window `task` as groups of its slots (which
        records each batch holds: what lineage and a restore's check need), without
        assembling them; `replacing`, a failing record is replaced as the error policy
        says (the groups are then the stream's; which records replaced which is not
        returned)."""
        stage = self._batch_stage
        assert isinstance(stage, stages_base.WindowedBatchStage)
        try:
            columns = self._columns(task)
        except errors.RecordError:
            if self._policy is None or not replacing:
                raise
            columns = self._columns_replacing(task)[0]
        with self._naming_group_errors(task):
            return stage.group(
                columns, self.spec, seed=self._seed, epoch=task.epoch,
                window=task.window,
            )

    def _columns(self, task: plan_lib.Task, lap: meters.Lap | None = None) -> list[Any]:
        """The checked leaves of `task`'s records, column by column (timed by `lap`)."""
        indices, epoch, position = task.indices, task.epoch, task.position
        if self.reads_batches:
            columns = self._read_batch(indices, epoch=epoch, position=position)
            if lap is not None:
                lap.lap(lap.place[timing.READ], len(indices))
            return columns
        if lap is None:
            return self._record_columns(task)
        return timing.split(
            lap, self.names, len(indices), lambda: self._record_columns(task),
            lambda spent: functools.partial(self._timed(spent)._record_columns, task),
        )

    def _timed(self, spent: collections.Counter[str]) -> BatchProducer:
        """A copy whose source and record stages add their time to ``spent[name]``."""
        twin = copy.copy(self)
        source: Any = timing.Timed(self._source, timing.READ, spent)  # a Source's face
        stages: Any = tuple(timing.Timed(stage, name, spent)
                            for stage, name in zip(self._stages, self.names.records, strict=True))
        twin._records = records.Records(source, stages, seed=self._seed)
        return twin

    def _record_columns(self, task: plan_lib.Task) -> list[Any]:
        """The checked leaves of `task`'s records read and staged record by record."""
        return self._records.columns(self.spec, task.indices, epoch=task.epoch,
                                     position=task.position)

    # -- the batch stage's part ------------------------------------------------------
    def _grouped(
        self, columns: list[Any], task: plan_lib.Task, lap: meters.Lap | None = None
    ) -> Produced:
        """The task's batches from its records' checked `columns` (timed by `lap`)."""
        with self._naming_group_errors(task):
            made = self._batch_stage.batches(
                columns, self.spec, seed=self._seed, epoch=task.epoch,
                window=task.window,
            )
        if lap is not None:
            lap.lap(lap.place[self.names.batch], len(task.indices), out=sum(made.counts))
        batches = made.leaves
        if self._maps:
            starts = [0, *itertools.accumulate(made.counts[:-1])]
            batches = [
                self._mapped(leaves, task, start, count, lap)
                for leaves, start, count in zip(batches, starts, made.counts, strict=True)
            ]
        produced = Produced([self._encoded(leaves) for leaves in batches], made.counts,
                            made.rows)
        if lap is not None:
            meter = lap.place[self.names.batch]
            if self._encodes:
                lap.more(meter)  # the wire encoding of variable leaves
            meter.bytes_out += sum([timing.nbytes(leaves) for leaves in batches])
        return produced

    @contextlib.contextmanager
    def _naming_group_errors(self, task: plan_lib.Task) -> Iterator[None]:
        """A record that does not fit the batch stage raises `RecordSpecError` naming it."""
        try:
            yield
        except stages_base.GroupError as err:
            index, position = int(task.indices[err.slot]), task.position + err.slot
            msg = (
                f"Record index {index} (epoch {task.epoch}, position {position}) does not fit "
                f"the batch stage `{self._batch_stage.name}`: {err}"
            )
            raise errors.RecordSpecError(
                msg, record_index=index, epoch=task.epoch, position=position
            ) from err

    def _mapped(
        self, leaves: list[Any], task: plan_lib.Task, start: int, count: int,
        lap: meters.Lap | None = None,
    ) -> list[Any]:
        """A batch's leaves run through the batch map stages (a plain stage's batch: its
        rows are the task's records from `start` on), each result checked (and timed)."""
        indices, position = task.indices[start : start + count], task.position + start
        epoch, last = task.epoch, len(self._maps) - 1
        batch: Any = optree.tree_unflatten(self._map_specs[0].treespec, leaves)
        given: list[np.ndarray] = []  # the last stage's `out` arrays
        for number, (stage, spec, out_leaves) in enumerate(
            zip(self._maps, self._map_specs[1:], self._outs, strict=True)
        ):
            # `out` only for a stage that takes it: a stage without keeps its signature.
            out: dict[str, Any] = {}
            given = []
            if out_leaves is not None:
                given = [buffers.empty((count, *shape), dtype) for shape, dtype in out_leaves]
                out["out"] = optree.tree_unflatten(spec.treespec, given)
            try:
                batch = stage.apply_batch(batch, seed=self._seed, epoch=epoch,
                                          indices=indices, **out)
            except Exception as err:
                who = f"The `{stage.name}` function"
                raise checks.batch_error(stage.name, err, indices, epoch, position,
                                         who=who) from err
            leaves = checks.batch(spec, batch, indices, epoch=epoch, position=position,
                                  what=f"The `{stage.name}` function")
            # The checked leaves go on as the next stage's batch (the last's as leaves).
            batch = optree.tree_unflatten(spec.treespec, leaves) if number < last else None
            if lap is not None:
                lap.lap(lap.place[self.names.maps[number]], count)
        if given and self._hand_over:
            del batch, out
            _adopt(leaves, given)
        return leaves

    # -- the error policy's path: only for a batch in which a record failed --------
    def _batch_replacing(self, task: plan_lib.Task, lap: meters.Lap | None = None) -> Produced:
        """`task`'s batches made again record by record, each failing record replaced as
        the error policy says; the replacements are left in `skips`."""
        columns, skips = self._columns_replacing(task)
        if lap is not None:  # the failed try and the records read again
            lap.lap(lap.place[timing.READ], len(task.indices))
        produced = self._grouped(columns, task, lap)
        self.skips.put(task, skips)
        return produced

    def _columns_replacing(self, task: plan_lib.Task) -> tuple[list[Any], list[dict[str, Any]]]:
        """The checked leaves of `task`'s records read one by one, each failing record
        replaced, and the replacements."""
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
        return columns, skips

    def _checked(self, index: int, *, epoch: int, position: int) -> list[np.ndarray]:
        record = self.record(index, epoch=epoch, position=position)
        return self._check(record, index=index, epoch=epoch, position=position)

    def _replaced(
        self, err: errors.RecordError, read: Callable[[int], Any], check: Callable[[Any], Any]
    ) -> tuple[Any, dict[str, Any]]:
        assert self._policy is not None
        order = self.pipeline.index_stage
        return self._policy.replace(err, read, check, order=order, seed=self._seed)

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
            wire.encode(leaf, spec) if spec.variable else self._handed(leaf)
            for leaf, spec in zip(leaves, self.output_spec.leaves, strict=True)
        ]
        return optree.tree_unflatten(self.output_spec.treespec, encoded)

    def _handed(self, leaf: Any) -> Any:
        """`leaf`, or its copy in memory TensorFlow takes over (see `hand_over`)."""
        if (self._hand_over and type(leaf) is np.ndarray and leaf.dtype.kind in "iuf"
                and leaf.nbytes >= buffers.MIN_BYTES and not handoff.fresh(leaf)):
            return handoff.copy(leaf)
        return leaf

    def _check(self, record: Any, *, index: int, epoch: int, position: int) -> list[np.ndarray]:
        return checks.record(self.spec, record, index=index, epoch=epoch, position=position)

    def _read_batch(self, indices: np.ndarray, *, epoch: int, position: int) -> list[Any]:
        try:
            assert self._read_batch_of is not None
            batch = self._read_batch_of(indices)
        except Exception as err:
            raise checks.batch_error("read_batch", err, indices, epoch, position) from err
        if self._exact:
            return self.spec.treespec.flatten_up_to(batch)
        return checks.batch(self.spec, batch, indices, epoch=epoch, position=position)



def _out_leaves(stage: stages_base.BatchMapStage, spec: spec_lib.RecordSpec
                ) -> list[tuple[tuple[int, ...], np.dtype]] | None:
    """The (row shape, dtype) of each leaf of the batch `stage`'s function writes into
    (of `spec`, its output's), or None for a stage without ``out``.

    Raises:
        ValueError: the stage has ``out`` and a leaf of `spec` is not a fixed-shape
            numeric array.
    """
    if not getattr(stage, "out", False):
        return None
    bad = [path for path, leaf in zip(spec.paths(), spec.leaves, strict=True)
           if leaf.is_string or None in leaf.shape or leaf.dtype.kind not in "biufc"]
    if bad:
        msg = (
            f"`{stage.name}(..., out=True)` writes into a batch of fixed-shape numeric "
            f"arrays, but its output has leaves that are not: {', '.join(bad)} (the "
            f"output per record: {spec.describe()}). Leave `out` off for this stage."
        )
        raise ValueError(msg)
    return [(tuple(int(dim) for dim in leaf.shape if dim is not None), leaf.dtype)
            for leaf in spec.leaves]


def _adopt(leaves: list[Any], given: list[np.ndarray]) -> None:
    """Marks fresh (`handoff.mark`: handed to TensorFlow without a copy) each of
    `leaves` that is one of the recycled arrays `given` to the user's function that
    nothing else references: neither the array (a reference kept, in a structure or a
    view of another type, or a weak one, which could be made strong again) nor its
    memory's owner (a view, which references that owner, not the array), in native
    byte order (DLPack takes no other). `given` is emptied.

    An array the function made itself is never adopted, even aligned (NumPy's are, half
    the time, under glibc's dynamic malloc threshold) and unreferenced: it then lives
    until TensorFlow frees the tensor instead of going back to malloc at once, and the
    producer's next batch maps its memory afresh - measured, ``for batch in loader``
    over bench_augment's ``map_batch``: 0.1 -> 1119 page faults and 32.7 -> 40.5 CPU us
    per record; the copy into recycled memory is the cheaper way."""
    ids = {id(array) for array in given}
    given.clear()
    for leaf in leaves:
        # References: `leaves`, `leaf` and the call's argument; the owner's: the array
        # and the argument.
        if (id(leaf) in ids and leaf.base is not None and leaf.dtype.isnative
                and sys.getrefcount(leaf) == 3 and sys.getrefcount(leaf.base) == 2
                and not weakref.getweakrefcount(leaf)):
            handoff.mark(leaf)
