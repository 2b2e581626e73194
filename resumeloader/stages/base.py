"""The stage kinds: index, record, batch (plain or windowed), batch map and tensor stages.

The contract every stage keeps — a pure function of (seed, epoch, position), its
order fields, no state, picklable — is written once, in ARCHITECTURE.md ("The stage
contract"), and checked for each registered pipeline by the resume-conformance suite
(``tests/_conformance.py``). The library's stages are frozen dataclasses whose fields
carry `resumeloader.stages.fields.meta`: checked on construction, order fields
declared once per field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from resumeloader.core import spec as spec_lib

__all__ = [
    "BatchMapStage",
    "BatchStage",
    "Batches",
    "Group",
    "GroupError",
    "IndexStage",
    "PlainBatchStage",
    "RecordStage",
    "Stage",
    "TensorStage",
    "WindowedBatchStage",
    "seed_refused",
]

Fields = dict[str, int | str]
#: One leaf of the records of a batch or window: a list of the records' arrays, or an
#: array whose first dimension is the record (what a source's ``read_batch`` returns).
Column = Sequence[Any]


class Stage:
    """Base of every stage (ARCHITECTURE.md, "The stage contract").

    A stage holds no seed: the pipeline's seed is the only one, and each stage receives
    it with the epoch on every call (`IndexStage.indices`, `RecordStage.apply`,
    `BatchStage.batches`, `BatchMapStage.apply_batch`). A stage that needs a stream of
    its own derives it from that seed and its own name or fields (as a mixture derives
    each source's walk, `resumeloader.stages.mix.source_seed`).
    """

    #: "index", "record", "batch" or "tensor".
    kind: ClassVar[str] = ""
    #: Prefix of the stage's fields in the state, e.g. "sampler".
    name: ClassVar[str] = ""
    #: The version of the stage's algorithm, an order field when set: bump it when the
    #: bytes it produces for a configuration change.
    algorithm: ClassVar[str] = ""

    def __new__(cls, *args: Any, **kwargs: Any) -> Stage:
        """Refuses a ``seed`` argument: a stage receives the pipeline's seed per call."""
        if "seed" in kwargs:
            raise TypeError(seed_refused(cls.__name__, kwargs["seed"]))
        return super().__new__(cls)

    def __post_init__(self) -> None:
        """Runs each declared field's check (dataclass stages), then `check`."""
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            check = item.metadata.get("check")
            if check is not None and item.init:
                object.__setattr__(self, item.name, check(item.name, getattr(self, item.name)))
        self.check()

    def check(self) -> None:
        """Checks that concern several fields (called once the fields are checked).

        Raises:
            ValueError: the fields do not fit together.
        """

    def order_fields(self) -> Fields:
        """Fields that define the order or content this stage produces (may be empty):
        its `algorithm` and every field declared with ``order``."""
        fields: Fields = {"algorithm": self.algorithm} if self.algorithm else {}
        if dataclasses.is_dataclass(self):
            for item in dataclasses.fields(self):
                encode = item.metadata.get("order")
                if encode is not None:
                    fields[item.name] = encode(getattr(self, item.name))
        return fields

    def describe(self) -> str:
        """One line for ``describe()``."""
        return self.name


class IndexStage(Stage):
    """Decides the record at each global offset of each epoch.

    Subclasses give ``num_records`` (records in one epoch of the global order) and
    `indices`.
    """

    kind = "index"
    num_records: int

    def indices(self, epoch: int, offsets: np.ndarray, *, seed: int) -> np.ndarray:
        """The record indices (int64) at global `offsets` (int64) of epoch `epoch`, for
        the pipeline's `seed`."""
        raise NotImplementedError


class RecordStage(Stage):
    """Transforms one record; randomness must come from (seed, epoch, record index)."""

    kind = "record"

    def apply(self, record: Any, *, seed: int, epoch: int, index: int) -> Any:
        """The transformed record `index` of `epoch`, for the pipeline's `seed`."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class Group:
    """The records of one batch of a window, as slots of the window (0 = its first position).

    Attributes:
        slots: int64, every slot of the batch, row after row.
        row_splits: for rows that hold several records (packing), int64 offsets into
            `slots`: row ``i`` is ``slots[row_splits[i]:row_splits[i + 1]]`` (an empty
            row has none); None when each row is one record.
    """

    slots: np.ndarray
    row_splits: np.ndarray | None = None

    @property
    def count(self) -> int:
        """The positions this batch counts: the records it holds."""
        return len(self.slots)

    def first_slots(self) -> np.ndarray:
        """The slot of each row's first record (-1 for an empty row)."""
        if self.row_splits is None:
            return self.slots
        starts, stops = self.row_splits[:-1], self.row_splits[1:]
        first = np.full(len(starts), -1, dtype=np.int64)
        filled = stops > starts
        first[filled] = self.slots[starts[filled]]
        return first


class GroupError(ValueError):
    """A record that a batch stage cannot put in a batch (e.g. longer than a packed row).

    The producer names the record (index, epoch, position) from `slot`, its place in
    the columns the stage was given.
    """

    def __init__(self, msg: str, *, slot: int) -> None:
        super().__init__(msg)
        self.slot = slot


class Batches(NamedTuple):
    """The batches a batch stage made of one task's records, in order."""

    #: Each batch's leaves (of the stage's `output_spec`).
    leaves: list[list[Any]]
    #: The positions each batch counts.
    counts: list[int]
    #: Per batch, the slot of each row's (first) record (-1: an empty row); None when
    #: each batch's rows are its task's records in order.
    rows: list[np.ndarray] | None


class BatchStage(Stage):
    """Groups records into batches; subclass `PlainBatchStage` or `WindowedBatchStage`.

    Subclasses give ``batch_size``: records per batch (an epoch's last batch may be
    shorter); for a stage without `known_counts`, the most records a batch holds.
    """

    kind = "batch"
    batch_size: int
    #: Whether an epoch's short last batch is dropped.
    drop_remainder: bool = False
    #: Positions per window of a windowed stage; None for a plain one.
    window: int | None = None
    #: Whether every batch counts `batch_size` positions (an epoch's last the rest).
    known_counts: ClassVar[bool] = True
    #: Whether a batch is just its records' leaves stacked (ragged ones as lists), so
    #: that a source's ``read_batch`` result is the batch as it is.
    stacks: ClassVar[bool] = False

    @property
    def batch_dim(self) -> int | None:
        """The size of every batch's first dimension, when it never varies."""
        return self.batch_size if self.drop_remainder else None

    def output_spec(self, spec: spec_lib.RecordSpec) -> spec_lib.RecordSpec:
        """The spec of one row of the batches, for records of `spec` (default: the same).

        Raises:
            ValueError: records of `spec` cannot be grouped by this stage.
        """
        return spec

    def batches(
        self, columns: list[Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> Batches:
        """The batches of one task's records (`columns`, in position order).

        Raises:
            GroupError: a record does not fit (its slot is its place in `columns`).
        """
        raise NotImplementedError

    def resized(self, batch_size: int) -> BatchStage:
        """The same stage with another batch size (elastic resume, distributed input)."""
        return dataclasses.replace(self, batch_size=batch_size)  # type: ignore[type-var]


class PlainBatchStage(BatchStage):
    """Each batch is `batch_size` consecutive positions, never across an epoch."""

    def assemble(self, columns: list[Column], spec: spec_lib.RecordSpec) -> list[Any]:
        """One batch's leaves (of `output_spec`) from its records' leaves, column by column.

        Raises:
            GroupError: a record does not fit (its slot is its place in `columns`).
        """
        raise NotImplementedError

    def batches(
        self, columns: list[Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> Batches:
        return Batches([self.assemble(columns, spec)], [len(columns[0])], None)


class WindowedBatchStage(BatchStage):
    """The records of each window of `window` consecutive positions, aligned to the
    epoch's start, grouped into batches that hold each of them once (`group`), in an
    order that is a pure function of the records, the seed, the epoch and the window."""

    window: int

    def group(
        self, columns: list[Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> list[Group]:
        """The batches of window number `window` of epoch `epoch`, in order.

        Raises:
            GroupError: a record does not fit.
        """
        raise NotImplementedError

    def assemble_group(
        self, columns: list[Column], spec: spec_lib.RecordSpec, group: Group
    ) -> list[Any]:
        """The leaves (of `output_spec`) of the batch `group` of the window's `columns`."""
        raise NotImplementedError

    def batches(
        self, columns: list[Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> Batches:
        groups = self.group(columns, spec, seed=seed, epoch=epoch, window=window)
        leaves = [self.assemble_group(columns, spec, group) for group in groups]
        return Batches(leaves, [g.count for g in groups], [g.first_slots() for g in groups])


class BatchMapStage(Stage):
    """Transforms each batch in Python, after the batch stage (in the producer: the
    calling thread or the workers); randomness only from each row's generator.

    Subclasses give `apply_batch` and, when a row changes, `output_spec`; `rowwise`
    says whether each output row depends only on its input row and its generator
    (then a batch-size change keeps every row's bytes: elastic resume is exact).
    """

    kind = "batch_map"
    #: Whether each output row is a function of its input row and its generator only.
    rowwise: bool = True

    def output_spec(self, spec: spec_lib.RecordSpec) -> spec_lib.RecordSpec:
        """The spec of one row of the batches this stage returns, for rows of `spec`."""
        return spec

    def apply_batch(
        self, batch: Any, *, seed: int, epoch: int, indices: np.ndarray, out: Any = None
    ) -> Any:
        """The transformed batch; row ``i`` holds record `indices[i]` of `epoch` (the
        pipeline's `seed` keys each row's generator). `out`: a batch of the output spec
        in fresh memory the result may be written into (only for a stage whose ``out``
        is true; None otherwise)."""
        raise NotImplementedError


class TensorStage(Stage):
    """Transforms each batch with TensorFlow ops, inside the loader's tf.data graph.

    Subclasses give ``fn(batch, seeds) -> batch`` of TensorFlow ops, which the
    TensorFlow layer calls on every batch (a structure of tensors, ``tf.string`` and
    ``tf.RaggedTensor`` included); ``seeds`` is an int64 tensor ``[batch, 2]``: each
    record's stateless seed pair, keyed by (seed, epoch, record index) like
    ``record_rng``. Randomness must come only from ``seeds``.
    """

    kind = "tensor"
    fn: Callable[[Any, Any], Any]


def seed_refused(stage: str, seed: Any) -> str:
    """The message refusing a stage that would hold a seed of its own."""
    return (
        f"A stage holds no seed: the pipeline's seed is the only one, and every stage "
        f"receives it with the epoch on each call (e.g. `indices(epoch, offsets, *, seed)`, "
        f"`apply(record, *, seed, epoch, index)`), so that the state, which records the "
        f"pipeline's seed, names every order a checkpoint restores into. Received: "
        f"{stage}(..., seed={seed!r:.40}). Pass the seed to `Pipeline(source, seed=...)`."
    )
