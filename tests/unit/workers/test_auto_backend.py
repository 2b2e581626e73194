"""Workers("auto"): batches identical to the calling thread's whatever it decides and
whenever; each decision logged once and kept on the board. No TensorFlow."""

from __future__ import annotations

import itertools
import logging

import _streams
import _worker_fns as fns
import pytest

from resumeloader import Tuning, Workers
from resumeloader.core import board as board_lib
from resumeloader.core import stats as stats_lib
from resumeloader.stages.plan import Plan
from resumeloader.workers import produce
from resumeloader.workers.tuning import Choice


def _auto(plan: Plan, tuning: Tuning, board=None):
    return Workers("auto", options=tuning).backend(
        produce.BatchProducer(plan.pipeline, board=board))


@pytest.mark.parametrize("start", [0, 5, 21, 37], ids=["start", "mid-epoch", "epoch-2", "late"])
def test_auto_flipping_every_two_batches_equals_the_calling_thread(start):
    """Decisions flipping between kinds and counts mid-run, from any position, lose and
    repeat no batch: the batches are those of no workers."""
    plan = _streams.plan()
    reference = _streams.reference(plan)
    made = _auto(plan, Tuning(decide=fns.flip_workers))
    try:
        got = _streams.stream(made.run(plan.tasks(reference[start][0], plan.layout)))
    finally:
        made.close()
    assert got == reference[start:]
    assert len(made.decisions) >= len(reference[start:]) // 2 - 1


def test_auto_run_abandoned_mid_flip_then_resumed_in_a_fresh_backend_is_exact():
    """A run broken after a flip, resumed by another backend at the next batch's position
    (as a restore does), continues the same stream."""
    plan = _streams.plan()
    reference = _streams.reference(plan)
    first = _auto(plan, Tuning(decide=fns.flip_workers))
    run = first.run(plan.tasks(0, plan.layout))
    head = _streams.stream(itertools.islice(run, 7))
    run.close()
    first.close()
    second = _auto(plan, Tuning(decide=lambda n: fns.flip_workers(n + 1)))
    try:
        tail = _streams.stream(second.run(plan.tasks(reference[7][0], plan.layout)))
    finally:
        second.close()
    assert head + tail == reference
    assert first.decisions and second.decisions  # both runs did flip


def test_auto_workers_windows_keep_the_tunings_ram_budget():
    """The window of the workers `Workers("auto")` runs is budgeted by its `Tuning`'s
    RAM budget, not by the default share of the machine's memory."""
    plan = _streams.plan()
    made = _auto(plan, Tuning(memory_bytes=1 << 20))
    try:
        child = made._child(Choice("thread", 2))
        assert child.depth.memory == 1 << 20
    finally:
        made.close()


def test_auto_measured_decision_is_logged_once_and_on_the_board(caplog):
    """Measured trials end in a decision: one INFO line, the same on the board and in Stats;
    the batches are unchanged."""
    plan = _streams.plan(fns.slow, num_records=300)
    board = board_lib.Board()
    made = _auto(plan, Tuning(trial_batches=2, trial_seconds=0.02, cpus=2), board)
    try:
        with caplog.at_level(logging.INFO, logger="resumeloader.workers"):
            got = _streams.stream(made.run(plan.tasks(0, plan.layout)))
    finally:
        made.close()
    assert got == _streams.reference(plan)
    assert made.decisions and made.decisions == board.snapshot()["decisions"]
    lines = [r.getMessage() for r in caplog.records if r.name == "resumeloader.workers"]
    assert len(lines) == len(made.decisions) and "\n" not in lines[0]
    first = made.decisions[0]
    assert f"at batch {first['batch']}:" in lines[0] and "no workers: wait" in first["why"]
    stats = stats_lib.Stats.of(board.snapshot())
    assert stats.decisions[0] == first and "Workers('auto') after batch" in str(stats)
    assert stats.to_dict()["decisions"][0]["kind"] == first["kind"]
    assert "auto:" in made.describe() and f"since batch {made.decisions[-1]['batch']}" in (
        made.describe())


def test_auto_decide_returning_a_bad_choice_raises_naming_the_hook():
    """A decide hook returning what cannot run is a ValueError naming Tuning.decide."""
    plan = _streams.plan()
    made = _auto(plan, Tuning(decide=lambda n: ("thread", 0)))
    with pytest.raises(ValueError, match=r"Tuning\.decide"):
        list(made.run(plan.tasks(0, plan.layout)))


def test_auto_ram_budget_too_small_for_workers_keeps_none():
    """With a RAM budget smaller than two batches in flight, no workers are kept."""
    plan = _streams.plan(fns.slow, num_records=120)
    made = _auto(plan, Tuning(trial_batches=2, trial_seconds=0.02, cpus=2, memory_bytes=16))
    try:
        got = _streams.stream(made.run(plan.tasks(0, plan.layout)))
    finally:
        made.close()
    assert got == _streams.reference(plan)
    assert made.decisions[0]["kind"] == "inline"
    assert "over the RAM budget" in made.decisions[0]["why"]


@pytest.mark.parametrize("share", [1, 0.05])
def test_auto_rechecks_after_every_batches_once_its_trials_are_a_small_share(share):
    """Settled, it runs its trials again after `every` batches (another decision) once
    the trials that settled it are `trial_share` of the time since they began: with 1 at
    once; with 0.05 not before 19 times the trials' time (over 0.1 s here), which is past
    the stream's end (~1.2 s): one decision."""
    plan = _streams.plan(fns.slow, num_records=300)
    made = _auto(plan, Tuning(trial_batches=1, trial_seconds=0.02, cpus=1, every=4,
                              trial_share=share))
    try:
        got = _streams.stream(made.run(plan.tasks(0, plan.layout)))
    finally:
        made.close()
    assert got == _streams.reference(plan)
    batches = [d["batch"] for d in made.decisions if "window" not in d]  # not the windows'
    if share == 1:
        assert len(batches) >= 2 and batches[1] - batches[0] > 4, made.decisions
    else:
        # A re-check was due by count (more than `every` batches after the decision).
        assert len(batches) == 1 and len(got) - batches[0] > 4, made.decisions
