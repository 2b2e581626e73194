"""The stage contract: every stage is a pure function of (seed, epoch, position).

A pipeline is a chain of stages, in three kinds:

* an **index stage** (exactly one) decides which record comes at each global offset
  of each epoch: `IndexStage.indices`;
* **record stages** (any number) transform one record at a time in Python, keyed by
  (seed, epoch, record index): `RecordStage.apply`;
* a **batch stage** (exactly one) groups the records of consecutive positions
  into batches: `BatchStage.assemble`, or, for a *windowed* stage, the records of a
  window of consecutive positions: `BatchStage.group` and `BatchStage.assemble_group`;
* **tensor stages** (any number, after the batch stage) transform whole batches as
  tensors inside TensorFlow: `TensorStage.fn` (defined here, run by the TensorFlow
  layer).

Contract every stage keeps, checked for each registered pipeline by the
resume-conformance suite (``tests/test_conformance.py``):

1. Its output depends only on its configuration, the pipeline's seed, the epoch and
   the positions or records it is given, never on history, time, threads or workers.
2. `order_fields` returns every configuration value that changes which bytes land
   at which position; they enter the state as ``"<name>.<field>"`` and its
   fingerprint, so a state saved by a different pipeline is refused, naming them.
3. It holds no state that a restore would have to save: the position is the only
   state, advanced by the consumer.
4. It is picklable (process workers receive the pipeline pickled once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from resumeloader.core import spec as spec_lib

__all__ = [
    "BatchStage",
    "Group",
    "GroupError",
    "IndexStage",
    "RecordStage",
    "Stage",
    "TensorStage",
]

Fields = dict[str, int | str]
#: One leaf of the records of a batch or window: a list of the records' arrays, or an
#: array whose first dimension is the record (what a source's ``read_batch`` returns).
Column = Sequence[Any]


class Stage:
    """Base of every stage."""

    #: "index", "record", "batch" or "tensor".
    kind: ClassVar[str] = ""
    #: Prefix of the stage's fields in the state, e.g. "sampler".
    name: ClassVar[str] = ""

    def order_fields(self) -> Fields:
        """Fields that define the order or content this stage produces (may be empty)."""
        return {}

    def describe(self) -> str:
        """One line for ``describe()``."""
        return self.name


class IndexStage(Stage):
    """Decides the record at each global offset of each epoch."""

    kind = "index"

    @property
    def num_records(self) -> int:
        """Records in one epoch of the global order."""
        raise NotImplementedError

    def indices(self, epoch: int, offsets: np.ndarray) -> np.ndarray:
        """The record indices (int64) at global `offsets` (int64) of epoch `epoch`."""
        raise NotImplementedError


class RecordStage(Stage):
    """Transforms one record; randomness must come from (seed, epoch, record index)."""

    kind = "record"

    def apply(self, record: Any, *, epoch: int, index: int) -> Any:
        """The transformed record."""
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


class BatchStage(Stage):
    """Groups records into batches: consecutive positions, or windows of them.

    A plain stage (`window` None) makes one batch of each run of `batch_size`
    consecutive positions (`assemble`). A *windowed* stage groups the records of each
    window of `window` consecutive positions, aligned to the epoch's start, into
    batches (`group`, then `assemble_group` for each): the batches of a window hold
    each of its records exactly once, in an order that is a pure function of the
    records, the seed, the epoch and the window. With `known_counts` every batch but
    an epoch's last holds `batch_size` records, so position arithmetic stays O(1);
    without, the number of batches of a window depends on its records, and the
    consumer advances by the records each batch holds.
    """

    kind = "batch"

    @property
    def batch_size(self) -> int:
        """Records per batch (the last batch of an epoch may be shorter); for a stage
        without `known_counts`, the most records a batch holds."""
        raise NotImplementedError

    @property
    def drop_remainder(self) -> bool:
        """Whether an epoch's short last batch is dropped."""
        raise NotImplementedError

    @property
    def window(self) -> int | None:
        """Positions per window of a windowed stage, or None for a plain one."""
        return None

    @property
    def known_counts(self) -> bool:
        """Whether every batch counts `batch_size` positions (an epoch's last the rest)."""
        return True

    @property
    def stacks(self) -> bool:
        """Whether a batch is just its records' leaves stacked (ragged ones as lists), so
        that a source's ``read_batch`` result is the batch as it is."""
        return False

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

    def assemble(self, columns: list[Column], spec: spec_lib.RecordSpec) -> list[Any]:
        """One batch's leaves (of `output_spec`) from the records' leaves, column by column
        (plain stages).

        Raises:
            GroupError: a record does not fit (its slot is its place in `columns`).
        """
        raise NotImplementedError

    def group(
        self, columns: list[Column], spec: spec_lib.RecordSpec, *, seed: int, epoch: int,
        window: int,
    ) -> list[Group]:
        """The batches of window number `window` of epoch `epoch`, in order (windowed
        stages). `columns` hold the window's records in position order.

        Raises:
            GroupError: a record does not fit.
        """
        raise NotImplementedError

    def assemble_group(
        self, columns: list[Column], spec: spec_lib.RecordSpec, group: Group
    ) -> list[Any]:
        """The leaves (of `output_spec`) of the batch `group` of the window's `columns`."""
        raise NotImplementedError

    def resized(self, batch_size: int) -> BatchStage:
        """The same stage with another batch size (elastic resume, distributed input)."""
        raise NotImplementedError


class TensorStage(Stage):
    """Transforms each batch with TensorFlow ops, inside the loader's tf.data graph.

    The TensorFlow layer calls ``fn(batch, seeds)`` on every batch (a structure of
    tensors, ``tf.string`` and ``tf.RaggedTensor`` included); ``seeds`` is an int64
    tensor ``[batch, 2]``: each record's stateless seed pair, keyed by (seed, epoch,
    record index) like ``record_rng``, for ``tf.random.stateless_*`` and
    ``tf.image.stateless_random_*`` ops. Randomness must come only from ``seeds``.
    """

    kind = "tensor"

    @property
    def fn(self) -> Any:
        """``fn(batch, seeds) -> batch`` of TensorFlow ops."""
        raise NotImplementedError
