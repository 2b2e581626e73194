"""The hand-out layer without TensorFlow: the stream of batches with the position after
each, the consumption ledger's checks, the quarantine log and its budget."""

from __future__ import annotations

import json

import _worker_fns as fns
import numpy as np
import pytest

from resumeloader import ErrorBudgetError, Pipeline, StreamIntegrityError
from resumeloader.core import board as board_lib
from resumeloader.core import stats
from resumeloader.handout import consumption, loop, quarantine, stream
from resumeloader.stages.plan import Plan
from resumeloader.workers import produce


def _plan(pipeline: Pipeline, **kwargs) -> Plan:
    return Plan(pipeline, num_epochs=2, **kwargs)


def _produced(plan: Plan, position: int = 0):
    producer = produce.BatchProducer(plan.pipeline)
    return ((task, producer.batch(task)) for task in plan.tasks(position, plan.layout))


def _stream(plan: Plan, position: int):
    return stream.batches(
        _produced(plan, position), plan.layout, position, seed=plan.pipeline.seed,
        with_metadata=False,
    )


def test_stream_gives_each_batch_with_the_position_after_it():
    """Plain batches: the position after each is the next batch's start (normalised)."""
    plan = _plan(Pipeline(np.arange(10), seed=0).batch(4))
    ends = [end for _, end in _stream(plan, 0)]
    assert ends == [4, 8, 10, 14, 18, 20]


def test_stream_restored_inside_a_window_skips_the_batches_before_the_position():
    """A window's batches before the position restored are recomputed, not handed out."""
    data = [np.arange(n) for n in (5, 1, 4, 2, 3, 6, 1, 2)]
    plan = _plan(Pipeline(data, seed=0).batch_by_tokens(8, window=8))
    full = list(_stream(plan, 0))
    start = full[1][1]
    resumed = list(_stream(plan, start))
    assert [end for _, end in resumed] == [end for _, end in full[2:]]


def test_stream_refuses_a_position_inside_a_batch():
    """A position that is no batch boundary of its window is an edited state."""
    data = [np.arange(n) for n in (5, 1, 4, 2, 3, 6, 1, 2)]
    plan = _plan(Pipeline(data, seed=0).batch_by_tokens(8, window=8))
    with pytest.raises(Exception, match="inside a batch"):
        list(_stream(plan, 1))


class _Loop:
    """A stand-in for a live eager loop (what the ledger reads of one)."""

    live, in_flight, position, origin = True, None, 4, "test:1"

    def describe(self) -> str:
        return "a loop"


def test_ledger_refuses_a_second_loop_and_moves_under_a_live_one():
    """One live loop per loader; no advance or restore while it is live."""
    ledger = consumption.Ledger(_plan(Pipeline(np.arange(10), seed=0).batch(2)).layout)
    live = _Loop()
    ledger.open_loop(live)
    with pytest.raises(StreamIntegrityError, match="second live iterator"):
        ledger.check_no_loop("test:2")
    with pytest.raises(StreamIntegrityError, match="Cannot advance"):
        ledger.check_position_change("advance")
    ledger.close_loop(live)
    ledger.check_position_change("advance")


def test_ledger_refuses_an_advance_past_what_was_produced():
    """An advance past the last batch the current iteration produced counted foreign batches."""
    ledger = consumption.Ledger(_plan(Pipeline(np.arange(10), seed=0).batch(2)).layout)
    _, produced = ledger.watch(0, iter([]))
    produced(2)
    ledger.check_advance(0, 2)
    with pytest.raises(StreamIntegrityError, match="advanced past the last batch"):
        ledger.check_advance(2, 4)


def test_eager_loop_counts_each_batch_when_handed_out():
    """The loop's position is the end of the last batch handed out; the batch is in flight."""
    ended = []
    batches = (item for item in [("a", 2), ("b", 4)])
    live = loop.EagerLoop(batches, 0, origin="test:1", on_close=ended.append)
    assert next(live) == "a" and (live.position, live.in_flight) == (2, 0)
    assert next(live) == "b" and (live.position, live.in_flight) == (4, 2)
    with pytest.raises(StopIteration):
        next(live)
    assert ended == [live] and not live.live


def test_quarantine_logs_each_replacement_once_and_keeps_the_budget(tmp_path):
    """Each replaced record is one log line (again only once); past the budget: an error."""
    log = tmp_path / "quarantine.jsonl"
    source = fns.BadRecordSource(20, {3, 4, 11})
    pipeline = Pipeline(source, seed=0).on_error("skip", max_fraction=0.1, quarantine=log)
    plan = _plan(pipeline.batch(5))
    producer = produce.BatchProducer(plan.pipeline)
    keeper = quarantine.Quarantine(plan.pipeline.error_policy, plan.order_fields())
    tasks = plan.tasks(0, plan.layout)
    made = ((task, producer.batch(task)) for task in tasks)
    out = quarantine.handed_out(keeper, plan, producer, made)
    task, _ = next(out)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["record_index"] for line in lines] == [3, 4]
    assert all(task.indices[line["position"]] == line["replacement"] for line in lines)
    with pytest.raises(ErrorBudgetError, match="error budget is exceeded") as info:
        for _ in out:
            pass
    assert (info.value.record_index, info.value.position) == (11, 11)
    assert len(log.read_text().splitlines()) == 3  # logged before it raised


def _eager_loop(consumer: board_lib.Consumer, count: int) -> loop.EagerLoop:
    batches = ((index, index + 1) for index in range(count))
    return loop.EagerLoop(batches, 0, origin="here", on_close=lambda _: None, consumer=consumer)


def test_eager_loop_counts_every_step_and_times_the_first_two_then_one_in_every():
    """A live `for batch in loader` counts each step exactly (read while live, kept when
    it ends); it times steps 0 and 1, then each multiple of `every`, with the compute
    before it."""
    consumer = board_lib.Consumer(every=4)
    looped = _eager_loop(consumer, 10)
    assert [next(looped) for _ in range(6)] == list(range(6))
    assert consumer.totals() == (6, 5)
    assert list(looped) == list(range(6, 10))
    assert consumer.totals() == (10, 9) and consumer.steps == 10
    assert (consumer.timed_steps, consumer.compute_steps) == (4, 3)  # steps 0, 1, 4, 8
    _eager_loop(consumer, 3)  # a second loop, not iterated: no step, no interval
    assert consumer.totals() == (10, 9)


def test_stats_scale_an_eager_loops_timed_steps_to_all():
    """Stats of a sampled loop: steps exact, wait and compute scaled from the timed ones."""
    board = board_lib.Board(every=2)
    _ = list(_eager_loop(board.consumer, 20))
    snapshot = board.snapshot()
    consumer = snapshot["consumer"]
    assert (consumer["steps"], consumer["intervals"]) == (20, 19)
    assert consumer["timed_steps"] < 20
    value = stats.Stats.of(snapshot)
    assert value.steps == 20
    scale = consumer["steps"] / consumer["timed_steps"]
    assert value.wait_s == pytest.approx(consumer["wait_ns"] * scale / 1e9)
