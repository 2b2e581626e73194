"""BatchProducer's record path over in-memory arrays: records are the rows of one batched
read, read-only, and the same as reading each record alone."""

from __future__ import annotations

import numpy as np
import optree
import pytest

from resumeloader import Pipeline, RecordError
from resumeloader.stages.plan import Plan
from resumeloader.workers import produce

_IMAGES = np.arange(40 * 3, dtype=np.float32).reshape(40, 3)
_LABELS = np.arange(40, dtype=np.int64) * 7


def _producer(source, map_fn) -> tuple[produce.BatchProducer, Plan]:
    pipeline = Pipeline(source, seed=3).shuffle().map(map_fn).batch(8)
    plan = Plan(pipeline, num_epochs=1)
    return produce.BatchProducer(pipeline), plan


def _seen(source) -> list:
    seen = []

    def record_and_copy(record, rng):
        seen.append(record)
        return record

    producer, plan = _producer(source, record_and_copy)
    for task in plan.tasks(0):
        producer.batch(task)
    return seen


@pytest.mark.parametrize(
    "source", [_IMAGES, {"image": _IMAGES, "label": _LABELS}, (_LABELS, (_IMAGES, _LABELS))],
    ids=["array", "dict", "nested-tuple"],
)
def test_producer_records_of_arrays_equal_reading_each_record(source):
    """Each record a map_fn gets is the source's record (structure, dtype, values)."""
    producer, plan = _producer(source, lambda record, rng: record)
    task = next(iter(plan.tasks(0)))
    records = [producer.pipeline.source.read(i) for i in task.indices.tolist()]
    mapped = _seen(source)[1 : len(records) + 1]  # after the probe of record 0
    for got, want in zip(mapped, records, strict=True):
        assert optree.tree_structure(got) == optree.tree_structure(want)
        for a, b in zip(optree.tree_leaves(got), optree.tree_leaves(want), strict=True):
            assert (type(a), a.dtype, a.shape) == (type(b), b.dtype, b.shape)
            assert a.tobytes() == b.tobytes()


def test_producer_records_of_arrays_are_read_only():
    """An in-place change to a record raises RecordError with the read-only hint."""
    def in_place(record, rng):
        record += 1
        return record

    with pytest.raises(RecordError) as excinfo:
        producer, plan = _producer(_IMAGES, in_place)
        producer.batch(next(iter(plan.tasks(0))))
    assert "read-only" in str(excinfo.value)
    assert _IMAGES[0, 0] == 0
