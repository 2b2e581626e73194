"""``window="auto"``: the tasks in flight chosen from measurements, the stream of no workers
whatever the window and whenever it changes; the policy on synthetic measurements; each
decision logged once and kept on the board. No TensorFlow."""

from __future__ import annotations

import itertools
import logging
import time

import _dask
import _streams
import _worker_fns as fns
import pytest

from resumeloader import DaskOptions, Tuning, Workers
from resumeloader.core import board as board_lib
from resumeloader.core import stats as stats_lib
from resumeloader.stages.plan import Plan
from resumeloader.workers import produce, tuning

MS = 1_000_000
#: What `_flip` cycles through, two batches each: a window of 1, then larger, then smaller.
WINDOWS = (1, 7, 2, 12, 3)


def _flip(batches: int) -> int:
    return WINDOWS[batches // 2 % len(WINDOWS)]


def _workers(kind: str) -> Workers:
    if kind == "dask":
        return Workers(kind="dask", options=DaskOptions(client=_dask.local()), window="auto")
    return Workers(2, kind=kind, window="auto")


def _backend(plan: Plan, workers: Workers, board=None, decide=_flip):
    made = workers.backend(produce.BatchProducer(plan.pipeline, board=board))
    made.depth.decide = decide
    return made


# -- the stream whatever the window ------------------------------------------------------
@pytest.mark.parametrize("kind", ["thread", "process", "dask"])
@pytest.mark.parametrize("start", [0, 23], ids=["start", "epoch-2"])
def test_window_changing_every_two_batches_equals_the_calling_thread(kind, start, caplog):
    """A window of 1, 7, 2, 12, 3 tasks in turn, two batches each, from any position: the
    batches of no workers; each change one INFO line and one decision on the board."""
    plan = _streams.plan()
    reference = _streams.reference(plan)
    board = board_lib.Board()
    made = _backend(plan, _workers(kind), board)
    try:
        with caplog.at_level(logging.INFO, logger="resumeloader.workers"):
            got = _streams.stream(made.run(plan.tasks(reference[start][0], plan.layout)))
    finally:
        made.close()
    assert got == reference[start:]
    decisions = made.depth.decisions
    assert len(decisions) >= len(got) // 2 - 1
    assert {d["window"] for d in decisions} == set(WINDOWS)
    assert decisions == board.snapshot()["decisions"]
    lines = [r.getMessage() for r in caplog.records if r.name == "resumeloader.workers"]
    assert len(lines) == len(decisions) and f"window='auto' at batch {decisions[0]['batch']}:" \
        in lines[0]
    assert decisions[-1]["kind"] == kind and "window='auto'" in made.describe()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_window_run_abandoned_mid_change_then_resumed_in_a_fresh_backend_is_exact(kind):
    """A run broken after a change of window, resumed by another backend at the next
    batch's position (as a restore does), continues the same stream."""
    plan = _streams.plan()
    reference = _streams.reference(plan)
    first = _backend(plan, _workers(kind))
    run = first.run(plan.tasks(0, plan.layout))
    head = _streams.stream(itertools.islice(run, 9))
    run.close()
    first.close()
    assert first.depth.decisions
    second = _backend(plan, _workers(kind), decide=lambda n: _flip(n + 1))
    try:
        tail = _streams.stream(second.run(plan.tasks(reference[9][0], plan.layout)))
    finally:
        second.close()
    assert head + tail == reference


def test_window_decide_returning_a_bad_window_raises_naming_the_hook():
    """A decide hook returning 0 is a ValueError naming it."""
    plan = _streams.plan()
    made = _backend(plan, _workers("thread"), decide=lambda n: 0)
    with pytest.raises(ValueError, match=r"AutoDepth\.decide must return|window >= 1"):
        list(made.run(plan.tasks(0, plan.layout)))


# -- measured decisions ------------------------------------------------------------------
def test_window_measured_grows_while_the_consumer_waits_and_undoes_what_did_not_help():
    """Workers slower than the consumer: it waits nearly all its step, the window grows by
    one per worker; a larger window cannot make slow workers faster: undone."""
    plan = _streams.plan(fns.slow, num_records=120)
    board = board_lib.Board()
    made = _backend(plan, _workers("thread"), board, decide=None)
    try:
        got = _streams.stream(made.run(plan.tasks(0, plan.layout)))
    finally:
        made.close()
    assert got == _streams.reference(plan)
    first, second = made.depth.decisions[:2]
    assert (first["window"], second["window"]) == (6, 4)
    assert "the consumer waited" in first["why"] and "did not help" in second["why"]
    stats = stats_lib.Stats.of(board.snapshot())
    assert f"window='auto' after batch {second['batch']}: window 4 for 2 thread" in str(stats)


def test_window_measured_shrinks_when_the_consumer_never_waits():
    """A consumer slower than its workers never waits: the window shrinks by one, down to
    one task per worker. ("Never" is under 1% of a step: a step of 40 ms, so that the
    ~0.1-0.3 ms a batch ready in the queue takes to hand out on a loaded machine is not
    a wait.)"""
    plan = _streams.plan(num_records=90)
    made = _backend(plan, _workers("thread"), decide=None)
    got = []
    try:
        for task, out in made.run(plan.tasks(0, plan.layout)):
            got.append((task.position, out.batches[0].tobytes()))
            time.sleep(0.04)  # the consumer's step
    finally:
        made.close()
    assert got == _streams.reference(plan)
    shrunk = [d for d in made.depth.decisions if d["why"] == "the consumer never waited"]
    assert shrunk
    assert all(d["window"] >= 2 for d in made.depth.decisions)  # one per worker, at least


# -- the policy on synthetic measurements ------------------------------------------------
def _measure(wait_ms: float, hold_ms: float, batch_bytes: int = 1000) -> tuning.Measure:
    return tuning.Measure(batches=8, wait_ns=int(8 * wait_ms * MS), hold_ns=int(8 * hold_ms * MS),
                          batch_bytes=batch_bytes)


def test_depth_grows_one_per_worker_while_it_helps_and_the_ram_budget_allows():
    """Waits over 5% of the step grow the window by one per worker; kept when the wait
    falls; at the RAM budget (batch bytes x window) it stops."""
    policy = tuning.Depth(4, floor=2, memory=9000)
    assert policy.next(_measure(2.0, 8.0), 2 * MS)[0] == 6
    assert policy.next(_measure(1.0, 8.0), 1 * MS)[0] == 8  # it helped: still waits, grows
    assert policy.next(_measure(0.5, 8.0), 1 * MS)[0] == 9  # 9 x 1000 bytes: the budget
    assert policy.next(_measure(0.1, 8.0), 1 * MS) is None
    assert policy.next(_measure(2.0, 8.0), 2 * MS) is None and policy.window == 9


def test_depth_undoes_a_growth_that_did_not_help_and_waits_longer_each_time():
    """A wait share that does not fall after a growth: back to the window before; the next
    growth waits one period, then two."""
    policy = tuning.Depth(4, floor=2, memory=1 << 30)
    assert policy.next(_measure(9.0, 1.0), 9 * MS)[0] == 6
    window, why = policy.next(_measure(9.0, 1.0), 9 * MS)
    assert window == 4 and "did not help" in why
    assert policy.next(_measure(9.0, 1.0), 9 * MS) is None  # resting one period
    assert policy.next(_measure(9.0, 1.0), 9 * MS)[0] == 6
    assert policy.next(_measure(9.0, 1.0), 9 * MS)[0] == 4
    assert [policy.next(_measure(9.0, 1.0), 9 * MS) for _ in range(2)] == [None, None]


def test_depth_shrinks_when_the_consumer_never_waits_down_to_one_per_worker():
    """No wait in a period: one task fewer, never below one per worker; a wait keeps it."""
    policy = tuning.Depth(4, floor=2, memory=1 << 30)
    assert policy.next(_measure(0.001, 10.0), 10_000) == (3, "the consumer never waited")
    assert policy.next(_measure(0.02, 10.0), 1 * MS) is None  # waited once: kept
    assert policy.next(_measure(0.001, 10.0), 10_000)[0] == 2
    assert policy.next(_measure(0.001, 10.0), 10_000) is None and policy.window == 2


def test_depth_over_the_ram_budget_shrinks_to_it():
    """Batches larger than the budget allows for the window: the window the budget holds."""
    policy = tuning.Depth(8, floor=4, memory=5 << 20)
    window, why = policy.next(_measure(0.0, 1.0, batch_bytes=1 << 20), 0)
    assert window == 5 and "over the RAM budget" in why


def test_auto_workers_tune_their_window_only_when_settled_and_decide_can_set_it():
    """Under Workers('auto'), a decide hook's (kind, n, window) sets the window: the stream
    of no workers, the window decisions among the worker decisions."""
    plan = _streams.plan()
    reference = _streams.reference(plan)
    pairs = itertools.cycle([("thread", 2, 5), ("process", 2, 1), ("thread", 2, 2)])
    steps = {}

    def decide(n: int):
        if n // 2 not in steps:
            steps[n // 2] = next(pairs)
        return steps[n // 2]

    made = Workers("auto", options=Tuning(decide=decide)).backend(
        produce.BatchProducer(plan.pipeline))
    try:
        got = _streams.stream(made.run(plan.tasks(0, plan.layout)))
    finally:
        made.close()
    assert got == reference
    windows = [d["window"] for d in made.decisions if "window" in d]
    assert {5, 1, 2} <= set(windows)
