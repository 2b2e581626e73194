"""`AutoDepth`: ``Workers(..., window="auto")``, the tasks in flight chosen as the run goes.

A backend with an `AutoDepth` asks it for its window each time it takes a task (the
window it gives `backend.in_order` or the process pool is a function), and hands its
batches through `AutoDepth.timed`, which measures the consumer's wait for each batch
and its time between batches. Every `tuning.Depth.period` batches the policy
(`tuning.Depth`) may grow or shrink the window; each change is logged (one INFO line,
``resumeloader.workers``) and kept on the loader's board (``loader.stats().decisions``).
The window decides only how far ahead batches are made: they are handed out in task
order whatever it is, so the stream and the loader's state never depend on it. No
TensorFlow here.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from resumeloader.stages import plan as plan_lib
from resumeloader.workers import produce, timing, tuning

__all__ = ["AUTO", "AutoDepth"]

#: The `Workers.window` that asks for the window to be chosen from measurements.
AUTO = "auto"
LOGGER = logging.getLogger("resumeloader.workers")
Task = plan_lib.Task
_now = time.perf_counter_ns


class AutoDepth:
    """The window of one backend, chosen from measured batches (module docstring).

    Args:
        producer: the backend's producer (its board receives the decisions; its output
            spec sizes a batch).
        default: the kind's default window now (``SLOTS`` per worker or cluster thread);
            the window starts there, and never goes below one task per worker.
        kind, num_workers: the backend's (kept in each decision).
        where: the workers, in a few words, for the decisions (``"2 thread workers"``).
        memory: the RAM budget of the batches in flight, in bytes; None: the default
            budget (`tuning.memory_budget`).

    Attributes:
        decide: for tests and experiments: ``decide(batches) -> window`` or None, called
            after each batch handed out with the count so far; it replaces the measured
            decisions.
        on_decision: ``on_decision(decision)`` records a decision (default: logged and
            on the producer's board); a `Workers("auto")` backend takes its children's.
        frozen: while true, nothing is measured nor decided (a trial of its owner).
        memory: the RAM budget of the batches in flight, in bytes (a `Workers("auto")`
            backend sets its own `Tuning`'s before the run).
    """

    def __init__(self, producer: produce.BatchProducer, *, default: Callable[[], int],
                 kind: str, num_workers: int, where: str, memory: int | None = None) -> None:
        self._producer = producer
        self._default = default
        self._kind, self._num_workers, self._where = kind, num_workers, where
        self.memory = memory if memory is not None else tuning.memory_budget(tuning.Tuning())
        self._policy: tuning.Depth | None = None
        self._handed = 0
        self._skip = 0
        self._measure = tuning.Measure()
        self._longest = 0
        self.decide: Callable[[int], Any] | None = None
        self.on_decision: Callable[[dict[str, Any]], None] = self._record
        self.frozen = False
        #: Every decision of this backend: ``{"batch", "window", "kind", "num_workers", "why"}``.
        self.decisions: list[dict[str, Any]] = []

    @property
    def window(self) -> int:
        """The window now (the kind's default until a decision)."""
        return self._default() if self._policy is None else self._policy.window

    def _started(self) -> tuning.Depth:
        if self._policy is None:
            default = self._default()
            self._policy = tuning.Depth(default, floor=default // 2, memory=self.memory)
        return self._policy

    def timed(self, produced: Iterator[tuple[Task, produce.Produced]]
              ) -> Iterator[tuple[Task, produce.Produced]]:
        """`produced`, each batch's wait and hold measured (the first window's not: the
        workers' start-up and the window filling)."""
        self._skip = self.window
        asked = _now()
        try:
            for task, made in produced:
                got = _now()
                yield task, made
                held = _now()
                self._after(made, got - asked, held - got)
                asked = held
        finally:
            produced.close()  # type: ignore[attr-defined]

    def _after(self, made: produce.Produced, wait: int, hold: int) -> None:
        self._handed += 1
        if self.decide is not None:
            chosen = parse_window(self.decide(self._handed), "AutoDepth.decide")
            if chosen is not None:
                self.force(chosen, "decide")
            return
        if self.frozen:
            return
        if self._skip:
            self._skip -= 1
            return
        policy = self._started()
        m = self._measure
        m.batches += 1
        m.wait_ns += wait
        m.hold_ns += hold
        self._longest = max(self._longest, wait)
        if not m.batch_bytes and made.batches:
            spec = self._producer.output_spec.treespec
            m.batch_bytes = timing.nbytes(spec.flatten_up_to(made.batches[0]))
        if m.batches < policy.period():
            return
        changed = policy.next(m, self._longest)
        self._measure = tuning.Measure(batch_bytes=m.batch_bytes)
        self._longest = 0
        if changed is not None:
            self._skip = changed[0]  # the window filling (or draining) is not measured
            self._decided(*changed)

    def force(self, window: int, why: str) -> None:
        """Sets the window (a decision, logged like a measured one) if it changes it."""
        policy = self._started()
        if window != policy.window:
            policy.window = window
            self._decided(window, why)

    def _decided(self, window: int, why: str) -> None:
        self.on_decision({"batch": self._handed, "kind": self._kind,
                          "num_workers": self._num_workers, "window": window,
                          "where": self._where, "why": why})

    def _record(self, decision: dict[str, Any]) -> None:
        self.decisions.append(decision)
        board = self._producer.board
        if board is not None:
            board.decisions.append(decision)
        LOGGER.info("window='auto' at batch %d: %d in flight for %s (%s)", decision["batch"],
                    decision["window"], decision["where"], decision["why"])

    def describe(self) -> str:
        return f"<= {self.window} in flight (window='auto')"


def parse_window(value: Any, hook: str) -> int | None:
    """What a decide hook returned as a window (None: no change).

    Raises:
        ValueError: not None nor a positive integer.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"`{hook}` must return None or a window >= 1. Received: {value!r:.80}."
        raise ValueError(msg)
    return int(value)
