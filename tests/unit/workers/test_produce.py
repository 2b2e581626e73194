"""BatchProducer's record path over in-memory arrays: records are the rows of one batched
read, read-only, and the same as reading each record alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import optree
import pytest

from resumeloader import Pipeline, RecordError, RecordSpecError
from resumeloader.core.spec import RecordSpec
from resumeloader.stages import BatchMapStage
from resumeloader.stages.plan import Plan
from resumeloader.workers import checks, produce

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


# -- the batch map stages' part -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Doubling(BatchMapStage):
    """A batch map stage of one's own written before ``out``: no `out` parameter."""

    name = "doubling"

    def apply_batch(self, batch, *, seed, epoch, indices):
        return batch * 2


def test_batch_map_stage_without_out_parameter_is_called_without_it():
    """`out` goes only to a stage that takes it: a stage of one's own keeps its signature."""
    pipeline = Pipeline(_IMAGES, seed=3).batch(8).apply(_Doubling())
    producer = produce.BatchProducer(pipeline)
    task = next(iter(Plan(pipeline, num_epochs=1).tasks(0)))
    (got,) = producer.batch(task).batches
    np.testing.assert_array_equal(got, _IMAGES[task.indices] * 2)


def test_batch_check_takes_a_fitting_array_as_it_is():
    """A fixed-shape numeric leaf of the right dtype and shape is the array itself."""
    spec = RecordSpec.of((np.zeros((2, 3), np.float32), np.int64(0)))
    images, labels = np.ones((4, 2, 3), np.float32), np.arange(4)
    leaves = checks.batch(spec, (images, labels), np.arange(4), epoch=0, position=0)
    assert leaves[0] is images and leaves[1] is labels
    # Not an array of its own: converted as before.
    leaves = checks.batch(spec, (images, labels.tolist()), np.arange(4), epoch=0, position=0)
    assert leaves[0] is images and leaves[1].dtype == np.int64
    np.testing.assert_array_equal(leaves[1], labels)


@pytest.mark.parametrize(
    "bad",
    [np.ones((4, 2, 3), np.float64), np.ones((3, 2, 3), np.float32),
     np.ones((4, 3, 2), np.float32), np.ones((4, 6), np.float32)],
    ids=["dtype", "rows", "shape", "rank"],
)
def test_batch_check_refuses_a_leaf_of_another_dtype_or_shape(bad):
    spec = RecordSpec.of((np.zeros((2, 3), np.float32), np.int64(0)))
    with pytest.raises(RecordSpecError, match=r"record\[0\]: the batch is .*expected 4 records"):
        checks.batch(spec, (bad, np.arange(4)), np.arange(10, 14), epoch=1, position=8)
