"""`readahead.AutoBudget`: the read-ahead budget of ``readahead_bytes="auto"``."""

from __future__ import annotations

import logging

import pytest

from resumeloader.core import board as board_lib
from resumeloader.workers import readahead

MB = 1_000_000


def _budget(cache=100 * MB, memory=1_000 * MB):
    return readahead.AutoBudget(cache_bytes=cache, memory=memory, board=board_lib.Board())


def test_auto_budget_starts_at_half_the_cache_within_the_ram_budget():
    """Before any measurement: half the cache, never more than the RAM budget."""
    assert _budget().bytes == 50 * MB
    assert _budget(memory=10 * MB).bytes == 10 * MB


@pytest.mark.parametrize(
    ("rate", "seconds", "working", "expected"),
    [(100 * MB, 0.05, 15 * MB, 25 * MB), (100 * MB, 0.5, 15 * MB, 85 * MB),
     (100 * MB, 0.5, 70 * MB, 30 * MB), (1 * MB, 0.01, 1 * MB, 1_020_000)],
    ids=["working-plus-two-gets", "capped-by-cache-beside-working", "large-working-set",
         "slow-reader-shrinks"],
)
def test_auto_budget_is_the_next_working_set_and_two_gets_of_reading(
    rate, seconds, working, expected
):
    """working set + 2 x rate x GET time, within the cache beside one working set."""
    budget = _budget()
    budget.choose(rate, seconds, working)
    assert budget.bytes == expected


def test_auto_budget_is_capped_by_the_ram_budget():
    """A RAM budget below the cache bounds the choice."""
    budget = _budget(memory=20 * MB)
    budget.choose(100 * MB, 0.5, 15 * MB)
    assert budget.bytes == 20 * MB


def test_auto_budget_logs_each_change_and_keeps_it_on_the_board(caplog):
    """A change is one INFO line and a decision on the board; a small move is none."""
    budget = _budget()
    with caplog.at_level(logging.INFO, logger="resumeloader.workers"):
        budget.choose(100 * MB, 0.05, 15 * MB)  # 50 -> 25 MB
        budget.choose(100 * MB, 0.055, 15 * MB)  # 26 MB: within a quarter, no change
    assert [d["readahead_bytes"] for d in budget.decisions] == [25 * MB]
    assert budget.board.decisions == budget.decisions
    assert "ms per GET" in budget.decisions[0]["why"]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "readahead_bytes='auto'" in lines[0] and "25.0 MB" in lines[0]


@pytest.mark.parametrize(
    ("value", "error"), [("fast", ValueError), (1.5, TypeError), (-1, ValueError)],
    ids=["other-string", "float", "negative"],
)
def test_object_reads_takes_auto_or_a_byte_count_for_readahead(value, error):
    """`readahead_bytes` is "auto" (the default) or an integer >= 0; anything else is named."""
    from resumeloader.sources import ObjectReads

    assert ObjectReads().readahead_bytes == "auto"
    assert ObjectReads(readahead_bytes=0).readahead_bytes == 0
    with pytest.raises(error) as info:
        ObjectReads(readahead_bytes=value)
    assert "readahead_bytes" in str(info.value) and repr(value) in str(info.value)


def test_a_fixed_readahead_is_not_tuned():
    """A source whose read-ahead is a number gets no AutoBudget (its prefetch is asked
    without a budget)."""
    import numpy as np

    from resumeloader.stages import plan as plan_lib

    class Source:
        def __init__(self, limit):
            self.limit, self.calls = limit, []

        def prefetch(self, indices, *, budget=None):
            self.calls.append(budget)
            return True

        def readahead(self):
            return self.limit, 1000

    tasks = [plan_lib.Task(np.arange(2 * k, 2 * k + 2), 0, 2 * k) for k in range(3)]
    for limit, tuned in ((5, False), ("auto", True)):
        source = Source(limit)
        assert len(list(readahead.hinted(iter(tasks), source))) == 3
        assert all((budget is not None) == tuned for budget in source.calls)
        assert len(source.calls) == 3
