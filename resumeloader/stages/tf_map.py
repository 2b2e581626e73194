"""`TFMapStage`: a tensor stage running the user's ``fn(batch, seeds)`` of TensorFlow ops.

The definition only (no TensorFlow here): `resumeloader.tfdata.tf_map` runs it in
the loader's tf.data graph (``map(..., num_parallel_calls=AUTOTUNE,
deterministic=True)``) and, for ``for batch in loader``, as a ``tf.function`` on the
same batches, with the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from resumeloader.stages import base, fields
from resumeloader.stages import map as map_stage

__all__ = ["TFMapStage"]


@dataclasses.dataclass(frozen=True)
class TFMapStage(base.TensorStage):
    """Applies ``fn(batch, seeds)`` to each batch (`Pipeline.tf_map`); see `TensorStage`
    for the seeds.

    It runs inside the loader's tf.data graph (``map(num_parallel_calls=AUTOTUNE,
    deterministic=True)``: batches in parallel, in order) for ``dataset()``, and as a
    ``tf.function`` on the same batches for ``for batch in loader``, with the same
    bytes. ``batch`` is the batch as tensors (``tf.string``, ``tf.RaggedTensor``
    included); ``seeds`` is an int64 ``[batch, 2]`` tensor of per-record stateless
    seeds keyed by (seed, epoch, record index): random ops seeded from it
    (``tf.random.stateless_*``, ``tf.image.stateless_random_*``) give the same result
    after any restore. With ``dataset(input_context=...)`` it runs on each replica's
    batch. An error of the source or a ``map_fn`` of such a pipeline reaches ``for
    batch in loader`` as tf.data raises it (a ``tf.errors.OpError`` carrying the
    `RecordError` message), as it reaches ``dataset()``.
    """

    name = "tf_map"

    fn: Callable[[Any, Any], Any] = dataclasses.field(
        metadata=fields.meta(check=map_stage.function)
    )

    def describe(self) -> str:
        name = getattr(self.fn, "__qualname__", type(self.fn).__name__)
        return f"{name}(batch, seeds)"
