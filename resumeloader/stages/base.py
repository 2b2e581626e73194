"""The stage contract: every stage is a pure function of (seed, epoch, position).

A pipeline is a chain of stages, in three kinds:

* an **index stage** (exactly one) decides which record comes at each global offset
  of each epoch: `IndexStage.indices`;
* **record stages** (any number) transform one record at a time in Python, keyed by
  (seed, epoch, record index): `RecordStage.apply`;
* a **batch stage** (exactly one) groups the records of consecutive positions
  into batches: `BatchStage.assemble`;
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

from typing import Any, ClassVar

import numpy as np

from resumeloader.core import spec as spec_lib

__all__ = ["BatchStage", "IndexStage", "RecordStage", "Stage", "TensorStage"]

Fields = dict[str, int | str]


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


class BatchStage(Stage):
    """Groups the records of consecutive positions into batches."""

    kind = "batch"

    @property
    def batch_size(self) -> int:
        """Records per batch (the last batch of an epoch may be shorter)."""
        raise NotImplementedError

    @property
    def drop_remainder(self) -> bool:
        """Whether an epoch's short last batch is dropped."""
        raise NotImplementedError

    def assemble(self, columns: list[list[np.ndarray]], spec: spec_lib.RecordSpec) -> list[Any]:
        """One batch's leaves from the records' leaves, column by column."""
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
