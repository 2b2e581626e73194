"""Read-ahead of what is certain: the records of the next tasks, announced to the source.

The order is a pure function of the position, so the tasks after the one being made
are known exactly. `hinted` passes a plan's tasks through unchanged and, as each one
is handed on, asks the source to `prefetch` the records of the tasks after it (a
source in object storage starts their GETs in the background), in order, until the
source's read-ahead budget is full or `DEPTH` tasks are announced. Nothing is
guessed and nothing read ahead changes a batch: a source's reads return the same
bytes with or without it, however far ahead it reads.

The budget is the source's (``ObjectReads.readahead_bytes``), or, when it says
``"auto"`` (its ``readahead()`` capability says so), chosen here as the run goes
(`AutoBudget`): the bytes one read holds at once (its working set: for the block
order, a window's blocks), so that the next window's GETs start a window earlier,
plus the bytes the loader reads during two GETs (the bytes it read per second times
the mean GET's seconds), all measured by the storage layer; at most the span cache
beside one working set, and the RAM budget (`tuning.memory_budget`). It starts at
half the cache. Each change is logged (one INFO line,
``resumeloader.workers``) and kept on the loader's board (``loader.stats().decisions``);
none enters the state.

It runs where the source is read: for in-process production (the calling thread,
worker threads). Worker processes read their own tasks, several at once.
"""

from __future__ import annotations

import collections
import inspect
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from resumeloader.core import board as board_lib
from resumeloader.sources import base as sources_base
from resumeloader.sources.storage import fetch
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import timing

__all__ = ["AUTO", "DEPTH", "AutoBudget", "hinted"]

#: The most tasks announced ahead of the one handed on (the byte budget binds first
#: unless a window of the block order holds more tasks). Measured over S3 (+20 ms):
#: 32 announced the next window too late (a window held 39 tasks); 512 let GETs of
#: windows far ahead share the transfers of the next one (stalls of 100 ms).
DEPTH = 64
#: The `ObjectReads.readahead_bytes` that asks for the budget to be chosen here.
AUTO = "auto"
LOGGER = logging.getLogger("resumeloader.workers")
#: Tasks, and seconds, between two looks at the measurements.
_PERIOD_TASKS, _PERIOD_NS = 8, 200_000_000
#: A new budget within this share of the current one is no change.
_SLACK = 0.25


def hinted(
    tasks: Iterator[plan_lib.Task], source: sources_base.Source, *, depth: int = DEPTH,
    memory: int | None = None, board: board_lib.Board | None = None,
) -> Iterator[plan_lib.Task]:
    """`tasks`, each announced to ``source.prefetch`` before the consumer reaches it
    (`tasks` themselves for a source without ``prefetch``). A source whose
    ``readahead()`` is ``"auto"`` is given the budget an `AutoBudget` chooses
    (``prefetch(indices, budget=...)``), within `memory` bytes (the RAM budget); its
    decisions go to `board`."""
    prefetch = sources_base.optional(source, "prefetch")
    if prefetch is None:
        return tasks
    asked = sources_base.optional(source, "readahead")
    limit, cache = asked() if asked is not None else (None, None)
    if limit != AUTO or "budget" not in inspect.signature(prefetch).parameters:
        return _hinted(tasks, prefetch, depth, None)
    return _hinted(tasks, prefetch, depth, AutoBudget(cache_bytes=cache, memory=memory,
                                                      board=board))


def _hinted(
    tasks: Iterator[plan_lib.Task], prefetch: Callable[..., bool], depth: int,
    budget: AutoBudget | None,
) -> Iterator[plan_lib.Task]:
    pending: collections.deque[list[object]] = collections.deque()  # [task, announced]
    exhausted = False
    while True:
        for at in range(depth):
            if at == len(pending):
                if exhausted:
                    break
                task = next(tasks, None)
                if task is None:
                    exhausted = True
                    break
                pending.append([task, False])
            entry = pending[at]
            if not entry[1]:
                indices = entry[0].indices  # type: ignore[attr-defined]
                done = prefetch(indices) if budget is None else prefetch(
                    indices, budget=budget.bytes)
                if not done:
                    break  # the budget is full: announce more after the next task
                entry[1] = True
        if not pending:
            return
        yield pending.popleft()[0]  # type: ignore[misc]
        if budget is not None:
            budget.after_task()


class AutoBudget:
    """The read-ahead budget of ``readahead_bytes="auto"``, from measurements (module
    docstring).

    Args:
        cache_bytes: the source's span cache (`ObjectReads.cache_bytes`): what a read
            holds (its working set, measured) stays cached beside what is read ahead.
        memory: the RAM budget in bytes; None: the default (`tuning.memory_budget`).
        board: where the decisions are kept (``stats().decisions``).

    Attributes:
        bytes: the budget now.
        decisions: every change: ``{"batch", "readahead_bytes", "why"}``.
    """

    def __init__(self, *, cache_bytes: int | None, memory: int | None,
                 board: board_lib.Board | None) -> None:
        from resumeloader.workers import tuning

        self.ram = memory if memory is not None else tuning.memory_budget(tuning.Tuning())
        self.cache = cache_bytes if cache_bytes is not None else self.ram
        self.bytes = max(1, min(self.ram, self.cache // 2))
        self.board = board
        self.decisions: list[dict[str, Any]] = []
        self._tasks = self._since = 0
        self._last = timing.storage_stats()
        self._at = time.perf_counter_ns()
        fetch.widest(reset=True)

    def after_task(self) -> None:
        """One task handed on: every few, the budget is chosen again."""
        self._tasks += 1
        self._since += 1
        now = time.perf_counter_ns()
        if self._since < _PERIOD_TASKS or now - self._at < _PERIOD_NS:
            return
        stats = timing.storage_stats()
        gets = stats["gets"] - self._last["gets"]
        if gets:
            got = stats["bytes"] - self._last["bytes"]
            per_get_s = (stats["get_ns"] - self._last["get_ns"]) / gets / 1e9
            rate = got / ((now - self._at) / 1e9)
            self.choose(rate, per_get_s, fetch.widest(reset=True))
        self._last, self._at, self._since = stats, now, 0

    def choose(self, rate: float, get_seconds: float, working: int) -> None:
        """The budget for `rate` bytes read per second, GETs of `get_seconds` on
        average and reads that hold `working` bytes of spans at once: the next working
        set and what is read during two GETs, within the cache beside the working set
        and the RAM budget (a decision if it moves by more than a quarter)."""
        cap = max(1, min(self.ram, self.cache - working))
        want = min(cap, int(working + 2 * rate * get_seconds))
        if abs(want - self.bytes) <= _SLACK * self.bytes:
            return
        why = (f"{rate / 1e6:,.1f} MB/s read, {get_seconds * 1e3:,.0f} ms per GET, "
               f"{working / 1e6:,.1f} MB read at once; at most {cap / 1e6:,.0f} MB")
        self.bytes = want
        decision = {"batch": self._tasks, "readahead_bytes": want, "why": why}
        self.decisions.append(decision)
        if self.board is not None:
            self.board.decisions.append(decision)
        LOGGER.info("readahead_bytes='auto' after task %d: %s MB ahead (%s)",
                    self._tasks, f"{want / 1e6:,.1f}", why)
