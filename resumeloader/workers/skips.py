"""`SkipLedger`: the replaced records of the batches a producer made, until they are handed out.

A producer that replaces a failing record (`resumeloader.stages.on_error`) leaves the
batch's *skips* here; a worker process sends them back with the batch and the backend
puts them in the parent producer's ledger. The hand-out layer takes them with the
batch (`resumeloader.handout.quarantine`). No TensorFlow.
"""

from __future__ import annotations

import threading
from typing import Any

from resumeloader.stages import plan as plan_lib

__all__ = ["SkipLedger", "Skips"]

Skips = list[dict[str, Any]]


def _key(task: plan_lib.Task) -> tuple[int, int, bytes]:
    return task.epoch, task.position, task.indices.tobytes()


class SkipLedger:
    """The skips of the batches a producer made, until the consumer side takes them.

    A task's batch may be made more than once (a new iteration from an earlier
    position, two iterations racing): every making puts, every hand-out takes, and
    the entry is forgotten when the hand-outs have caught up with the makings. A
    batch made and never handed out (an abandoned iteration's read-ahead) leaves
    its entry, which the next making of that batch reuses.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # task key -> [makings not yet handed out, skips (the same each time)]
        self._skips: dict[tuple[int, int, bytes], list[Any]] = {}

    def put(self, task: plan_lib.Task, skips: Skips) -> None:
        """Records that `task`'s batch was made with `skips` (nothing when empty)."""
        if skips:
            with self._lock:
                entry = self._skips.setdefault(_key(task), [0, list(skips)])
                entry[0] += 1

    def take(self, task: plan_lib.Task) -> Skips:
        """The skips of `task`'s batch, as it is handed out."""
        if not self._skips:  # the common case, without the lock or the key
            return []
        with self._lock:
            key = _key(task)
            entry = self._skips.get(key)
            if entry is None:
                return []
            entry[0] -= 1
            if entry[0] <= 0:
                del self._skips[key]
            return list(entry[1])
