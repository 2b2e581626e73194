"""A worker-backend stream and its reference, shared by the backend tests (no TensorFlow).

A plan of float rows (row i holds i) through a shuffle, a `map_fn` and batches of 3; a
stream is ``[(task position, batch bytes), ...]``, the reference the one the producer
makes in the calling thread.
"""

from __future__ import annotations

from typing import Any

import _worker_fns as fns
import numpy as np

from resumeloader import Pipeline
from resumeloader.stages.plan import Plan
from resumeloader.workers import produce


def plan(map_fn: Any = fns.augment, *, num_records: int = 61) -> Plan:
    """2 epochs of `num_records` rows through `map_fn`, batches of 3."""
    data = np.repeat(np.arange(num_records, dtype=np.float32), 3).reshape(num_records, 3)
    return Plan(Pipeline(data, seed=11).shuffle().map(map_fn).batch(3), num_epochs=2)


def stream(produced: Any) -> list[tuple[int, bytes]]:
    """``(task, output)`` pairs as ``(position, first leaf's bytes)``."""
    return [(task.position, out.batches[0].tobytes()) for task, out in produced]


def reference(made: Plan) -> list[tuple[int, bytes]]:
    """The stream the producer makes in the calling thread, from position 0."""
    producer = produce.BatchProducer(made.pipeline)
    return stream((task, producer.batch(task)) for task in made.tasks(0, made.layout))
