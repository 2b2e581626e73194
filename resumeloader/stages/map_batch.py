"""`MapBatchStage`: a batch map stage, the user's vectorised ``fn(batch, rngs)`` in Python."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from resumeloader.core import rng
from resumeloader.core import spec as spec_lib
from resumeloader.stages import base, fields
from resumeloader.stages import map as map_stage

__all__ = ["MapBatchStage", "check_placement", "resized"]


def _spec(name: str, value: Any) -> Any:
    if value is None or isinstance(value, spec_lib.RecordSpec):
        return value
    return spec_lib.RecordSpec.from_signature(value)


@dataclasses.dataclass(frozen=True)
class MapBatchStage(base.BatchMapStage):
    """Applies ``fn(batch, rngs)`` to every batch (`Pipeline.map_batch`).

    ``batch`` is the batch as the batch stage made it (NumPy arrays, a list per
    variable leaf); ``rngs`` is a `resumeloader.core.rng.RecordRngs`: row ``i``'s
    generator keyed by (seed, epoch, the row's record index). ``fn`` returns a batch
    of the same rows, of `output_signature` per row (the input's when None); it is
    checked on every batch.

    With `rowwise` (the default) ``fn`` promises that each output row depends only on
    its input row and ``rngs[i]``: every record's bytes are then the same at any batch
    size, so a checkpoint restores with another batch size exactly. A function that
    mixes rows (mixup, batch statistics) must say ``rowwise=False``: its output
    depends on which records share a batch, so the batch size becomes an order field
    (``map_batch.batch_size``) and a state saved with another one is refused.

    With `out`, ``fn(batch, rngs, out)`` also receives ``out``: a batch of the output
    spec (every leaf a fixed-shape numeric array) in uninitialised memory the loader
    recycles, 64-byte aligned. A leaf ``fn`` returns as the very array it was given,
    and keeps no reference to (nor a view of), goes to TensorFlow without a copy; any
    other leaf is copied as usual. It changes no value of the stream.

    Raises:
        TypeError: `fn` is not callable, `rowwise` not a bool.
        ValueError: `batch_size` is given for a row-wise stage, or missing for another.
    """

    name = "map_batch"

    fn: Callable[..., Any] = dataclasses.field(
        metadata=fields.meta(check=map_stage.function)
    )
    rowwise: bool = dataclasses.field(
        default=True, kw_only=True, metadata=fields.meta(check=fields.flag)
    )
    output_signature: Any = dataclasses.field(
        default=None, kw_only=True, compare=False, metadata=fields.meta(check=_spec)
    )
    #: Whether ``fn`` takes a third argument, the batch to write its output into.
    out: bool = dataclasses.field(
        default=False, kw_only=True, metadata=fields.meta(check=fields.flag)
    )
    #: The batch size the stage's output depends on (``rowwise=False`` only).
    batch_size: int | None = dataclasses.field(
        default=None, kw_only=True,
        metadata=fields.meta(check=fields.optional(fields.count), order=True),
    )

    def check(self) -> None:
        if self.rowwise != (self.batch_size is None):
            msg = (
                "A row-wise `map_batch` depends on no batch size; one that is not depends on "
                "exactly one. Received: "
                f"rowwise={self.rowwise!r}, batch_size={self.batch_size!r}."
            )
            raise ValueError(msg)

    def order_fields(self) -> base.Fields:
        # A row-wise stage has none: its rows do not depend on the batch size.
        return {} if self.rowwise else super().order_fields()

    def output_spec(self, spec: spec_lib.RecordSpec) -> spec_lib.RecordSpec:
        return spec if self.output_signature is None else self.output_signature

    def apply_batch(
        self, batch: Any, *, seed: int, epoch: int, indices: np.ndarray, out: Any = None
    ) -> Any:
        if self.out:
            return self.fn(batch, rng.RecordRngs(seed, epoch, indices), out)
        return self.fn(batch, rng.RecordRngs(seed, epoch, indices))

    def resized(self, batch_size: int) -> MapBatchStage:
        """The stage for batches of `batch_size` (only a non-row-wise one records it)."""
        if self.rowwise:
            return self
        return dataclasses.replace(self, batch_size=batch_size)

    def describe(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        rows = "" if self.rowwise else f", rowwise=False, batch_size={self.batch_size}"
        out = ", out" if self.out else ""
        return f"map_batch({name}(batch, rngs{out}){rows})"


def check_placement(
    stage: base.BatchMapStage, batch: base.BatchStage | None,
    tensors: tuple[base.TensorStage, ...], pipeline: str,
) -> None:
    """Raises `ValueError` unless `stage` may follow batch stage `batch` (a plain one)
    and the tensor stages `tensors` (none) of `pipeline` (its repr)."""
    if batch is None or tensors:
        where = "add `.batch(batch_size)` first" if batch is None else (
            "put it before the `tf_map` stages")
        msg = (
            f"The batch map stage `{stage.name}` runs in Python on the batch stage's "
            f"batches, before the tensor stages: {where}. Received: {pipeline}."
        )
        raise ValueError(msg)
    if not isinstance(batch, base.PlainBatchStage):
        msg = (
            f"The batch map stage `{stage.name}` needs a plain batch stage (`batch`, "
            f"`padded_batch`), whose rows are one record each. Received: {pipeline}; "
            "with bucketing, token budgets or packing, augment per record with `map`."
        )
        raise ValueError(msg)
    size = getattr(stage, "batch_size", None)
    if not stage.rowwise and size != batch.batch_size:
        msg = (
            f"The batch map stage `{stage.name}` is not row-wise, so it must name the "
            f"batch size it runs on. Received: batch_size={size!r}, the pipeline's "
            f"batch stage has {batch.batch_size}."
        )
        raise ValueError(msg)


def resized(stage: base.BatchMapStage, batch_size: int) -> base.BatchMapStage:
    """`stage` for batches of `batch_size`: a row-wise one as it is."""
    if stage.rowwise or not isinstance(stage, MapBatchStage):
        return stage
    return stage.resized(batch_size)
