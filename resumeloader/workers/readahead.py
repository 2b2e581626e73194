"""Read-ahead of what is certain: the records of the next tasks, announced to the source.

The order is a pure function of the position, so the tasks after the one being made
are known exactly. `hinted` passes a plan's tasks through unchanged and, as each one
is handed on, asks the source to `prefetch` the records of the tasks after it (a
source in object storage starts their GETs in the background), in order, until the
source's read-ahead budget is full or `depth` tasks are announced. Nothing is
guessed and nothing read ahead changes a batch: a source's reads return the same
bytes with or without it.

It runs where the source is read: for in-process production (the calling thread,
worker threads). Worker processes read their own tasks, several at once.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

from resumeloader.sources import base as sources_base
from resumeloader.stages import plan as plan_lib

__all__ = ["DEPTH", "hinted"]

#: The most tasks announced ahead of the one handed on.
DEPTH = 32


def hinted(
    tasks: Iterator[plan_lib.Task], source: sources_base.Source, *, depth: int = DEPTH
) -> Iterator[plan_lib.Task]:
    """`tasks`, each announced to ``source.prefetch`` before the consumer reaches it
    (`tasks` themselves for a source without ``prefetch``)."""
    prefetch = sources_base.optional(source, "prefetch")
    if prefetch is None:
        return tasks
    return _hinted(tasks, prefetch, depth)


def _hinted(
    tasks: Iterator[plan_lib.Task], prefetch: Callable[[Any], bool], depth: int
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
                if not prefetch(entry[0].indices):  # type: ignore[attr-defined]
                    break  # the budget is full: announce more after the next task
                entry[1] = True
        if not pending:
            return
        yield pending.popleft()[0]  # type: ignore[misc]
