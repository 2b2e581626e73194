"""`EagerLoop`: a live ``for batch in loader``, counting in Python what it hands out."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

from resumeloader.core import board as board_lib
from resumeloader.core import interrupts

__all__ = ["EagerLoop"]

_now = time.perf_counter_ns


class EagerLoop:
    """A live ``for batch in loader``: hands out batches and counts each as consumed.

    A batch counts as consumed when it is handed out (a checkpoint saved in the loop
    body, after the training step, resumes with the next batch). Until the loop asks
    for the next batch it is also *in flight* (`in_flight` is the position before it),
    for an emergency save during the step that consumed it.

    Args:
        batches: ``(batch, position after it)`` from `position` on (closed with the loop).
        position: the normalised position the loop starts at.
        origin: where the loop was started (``file:line``), for error messages.
        on_close: called once with the loop when it ends, however it ends.
        consumer: told the loop's steps and times one step's wait for its batch, and
            the compute before it, in ``consumer.every`` (`board_lib.Consumer.sampled`;
            a step that is neither timed nor before a timed one reads no clock), or None.
    """

    __slots__ = (
        "__weakref__",
        "_batches",
        "_clock_at",
        "_consumer",
        "_got",
        "_held",
        "_on_close",
        "handed_out",
        "in_flight",
        "live",
        "origin",
        "position",
    )

    def __init__(
        self,
        batches: Iterator[tuple[Any, int]],
        position: int,
        *,
        origin: str,
        on_close: Callable[[EagerLoop], None],
        consumer: board_lib.Consumer | None = None,
    ) -> None:
        self._batches = batches
        self._on_close = on_close
        self._consumer = consumer
        self.position = position
        self.in_flight: int | None = None  # the position before the batch in flight
        self.handed_out = 0
        # The next step that reads a clock (never without a consumer), and the step
        # that read one last with when it had its batch.
        self._clock_at = 0 if consumer is not None else -1
        self._got = (-2, 0)
        self._held = False  # `interrupts.hold` taken (by the first `__next__`)
        if consumer is not None:
            consumer.begun(self)
        self.origin = origin
        self.live = True

    def __iter__(self) -> EagerLoop:
        return self

    def __next__(self) -> Any:
        # Asking for the next batch means the step of the previous one is over.
        self.in_flight = None
        if not self.live:
            raise StopIteration
        if self.handed_out == self._clock_at:
            return self._clocked()
        batch, end = self._take()
        start = self.position
        # Both stores together, no call between: a signal handler sees either state.
        self.position, self.in_flight = end, start
        self.handed_out += 1
        return batch

    @interrupts.guarded
    def _take(self) -> tuple[Any, int]:
        """The next ``(batch, end)``; the loop is closed if that raises. A Ctrl-C pressed
        while it is made that does not come out of it (C code of TensorFlow's lost it) is
        raised here all the same (`resumeloader.core.interrupts`)."""
        if not self._held:
            self._held = True
            interrupts.hold()
        try:
            item = next(self._batches)
            interrupts.check()
        except BaseException as err:
            lost = interrupts.passed(err)
            self.close()
            if lost:
                raise KeyboardInterrupt from err
            raise
        return item

    def _clocked(self) -> Any:
        """`__next__` of a step that reads the clock: a timed step (its wait, and the
        compute since the step before it) or the step before a timed one. Timed:
        steps 0 and 1 and then each multiple of ``consumer.every``."""
        consumer = self._consumer
        assert consumer is not None
        step, every = self.handed_out, consumer.every
        timed = step % every == 0 or step == 1
        asked = _now() if timed else 0
        batch, end = self._take()
        got = _now()
        if timed:
            before, handed = self._got
            consumer.sampled(got - asked, asked - handed if before == step - 1 else -1)
        self._got = (step, got)
        # Then: the step after the first; a timed one after the step before it; the
        # step before the next multiple of `every`.
        self._clock_at = (step + 1 if step == 0 or not timed
                          else max(step + 1, (step // every + 1) * every - 1))
        start = self.position
        self.position, self.in_flight = end, start
        self.handed_out += 1
        return batch

    def close(self) -> None:
        """Ends the loop: stops its producer and hands the position back to the loader.

        A batch in flight stays recorded in `in_flight` (the loop may end because its
        step raised).
        """
        if not self.live:
            return
        self.live = False
        if self._consumer is not None:
            self._consumer.ended(self)
        try:
            self._batches.close()  # type: ignore[attr-defined]
        finally:
            if self._held:
                self._held = False
                interrupts.release()
            self._on_close(self)

    def describe(self) -> str:
        return (
            f"`for batch in loader` started at {self.origin}, {self.handed_out} batches "
            f"handed out, position {self.position}"
        )

    def __del__(self, suppress: Any = contextlib.suppress) -> None:
        # An abandoned loop (dropped without finishing) ends when it is collected; at
        # interpreter shutdown there may be nothing left to hand the position to (nor
        # module globals: `suppress` is bound when the class is made).
        with suppress(Exception):
            self.close()
