"""The loops that run once per batch count their laps themselves (`meters.Place.kind`):
the sampler in `Plan.tasks`, the producer in `BatchProducer.run` (no workers). Their
counts are those of one `Place.lap` per batch, exactly, from any position; the tasks and
batches are the same with counting on and off. No TensorFlow."""

from __future__ import annotations

import _streams
import numpy as np
import pytest

from resumeloader.core import board as board_lib
from resumeloader.core import meters
from resumeloader.core import stats as stats_lib
from resumeloader.workers import produce, timing


def _kind(board: board_lib.Board, name: str) -> tuple[int, ...]:
    return board.here().kinds[name].values()


@pytest.mark.parametrize("every", [1, 4], ids=["all", "one-in-4"])
@pytest.mark.parametrize("start", [0, 30, 61 + 9], ids=["start", "mid-epoch", "epoch-2"])
def test_sampler_counted_in_tasks_is_exact_from_any_position(every, start):
    """`Plan.tasks` with a place: the same tasks as without; each counted as a sampler lap
    with its records, timed laps as `Place.lap` times them (one in `every`, the second on)."""
    plan = _streams.plan(num_records=61)
    board = board_lib.Board([timing.SAMPLER], every=every)
    plain = list(plan.tasks(start, plan.layout))
    counted = list(plan.tasks(start, plan.layout, place=board.here, stage=timing.SAMPLER))
    assert [(t.position, t.epoch, t.indices.tolist()) for t in counted] == [
        (t.position, t.epoch, t.indices.tolist()) for t in plain]
    reference = meters.Place("reference", every=every)
    for task in plain:
        reference.lap(timing.SAMPLER, len(task.indices))
    assert _kind(board, timing.SAMPLER) == reference.kinds[timing.SAMPLER].values()
    records = sum(len(t.indices) for t in plain)
    stage = stats_lib.Stats.of(board.snapshot()).stage(timing.SAMPLER)
    assert stage is not None and (stage.batches, stage.records_in) == (len(plain), records)


def test_sampler_counts_what_was_taken_when_a_loop_stops_early():
    """A loop that takes 5 tasks and closes the generator has counted exactly 5 laps."""
    plan = _streams.plan()
    board = board_lib.Board([timing.SAMPLER], every=4)
    tasks = plan.tasks(3 * 7, plan.layout, place=board.here, stage=timing.SAMPLER)
    taken = [next(tasks) for _ in range(5)]
    tasks.close()
    laps, timed, records = _kind(board, timing.SAMPLER)[:3]
    assert (laps, records) == (5, sum(len(t.indices) for t in taken))
    assert timed == 1  # the second lap


@pytest.mark.parametrize("every", [1, 3], ids=["all", "one-in-3"])
def test_producer_run_counts_each_batch_as_batch_does(every):
    """`BatchProducer.run` (the inline backend's loop): the batches of `batch` one task at
    a time, and the same produce laps, records and timed laps on the board, restored
    mid-epoch too."""
    plan = _streams.plan()
    start = 3 * 11  # a restore inside the first epoch
    board, reference = (board_lib.Board(every=every) for _ in range(2))
    made = produce.BatchProducer(plan.pipeline, board=board)
    by_batch = produce.BatchProducer(plan.pipeline, board=reference)
    ran = [(task.position, out.batches[0].tobytes())
           for task, out in made.run(plan.tasks(start, plan.layout))]
    one_by_one = [(task.position, by_batch.batch(task).batches[0].tobytes())
                  for task in plan.tasks(start, plan.layout)]
    assert ran == one_by_one == [item for item in _streams.reference(plan) if item[0] >= start]
    assert _kind(board, timing.PRODUCE) == _kind(reference, timing.PRODUCE)
    got = stats_lib.Stats.of(board.snapshot())
    want = stats_lib.Stats.of(reference.snapshot())
    for name in ("read", "map_fn", "check", "batch"):
        stage, expected = got.stage(name), want.stage(name)
        assert stage is not None and expected is not None
        assert (stage.batches, stage.records_in) == (expected.batches, expected.records_in)
        assert stage.batches == len(ran)


def test_producer_run_without_a_board_makes_the_same_batches():
    """Counting off (no board): `run` makes the same batches."""
    plan = _streams.plan()
    counted = produce.BatchProducer(plan.pipeline, board=board_lib.Board())
    plain = produce.BatchProducer(plan.pipeline)
    a = [out.batches[0] for _, out in counted.run(plan.tasks(0, plan.layout))]
    b = [out.batches[0] for _, out in plain.run(plan.tasks(0, plan.layout))]
    assert len(a) == len(b) > 0 and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
