"""`Ledger`: who consumes a loader's batches, checked: its live eager loop, its dataset() loops.

The position moves only when the consumer says it consumed a batch. Two consumers of
one loader, a position changed under a live loop, or an advance for batches the
loader never produced would silently lose or repeat records, so the `Ledger` of a
loader refuses them with a `StreamIntegrityError` at the first moment it can see them:

* ``for batch in loader`` is a `Loop`: one live loop per loader (a second one raises,
  naming the first); while it is live `set_state` or an eager `advance` raises.
* Every iteration of ``dataset()`` is a `Generation` that records how far it
  produced. A newer one supersedes the older ones: a superseded iteration that is
  still read raises (``zip(ds, ds)``, nested loops). An eager `advance` past what the
  current iteration produced raises (the consumer counted batches that did not come
  from this loader: ``sample_from_datasets``, ``concatenate``, ``repeat`` bypassing
  the guarded dataset, ``advance`` called twice per batch).

What cannot be seen here — a consumer that drops, reorders or regroups batches
without over-counting — is refused earlier, by the guarded dataset
(`resumeloader.tfdata.guard`).
"""

from __future__ import annotations

import sys
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Protocol

from resumeloader import errors
from resumeloader.core import positions
from resumeloader.handout import stream
from resumeloader.stages import plan as plan_lib

__all__ = ["MAX_BOUNDARIES", "Generation", "Ledger", "Loop", "caller"]

#: Batch ends a dataset() iteration of batches of varying size keeps for `advance`
#: (about 8 MB); a consumer that never advances loses the oldest.
MAX_BOUNDARIES = 1 << 20


def caller(depth: int = 2) -> str:
    """``file:line`` of the user's frame `depth` levels above this function's caller."""
    frame = sys._getframe(depth)
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"


class Loop(Protocol):
    """What the ledger needs of a live eager loop (`resumeloader.handout.loop.EagerLoop`)."""

    live: bool
    in_flight: int | None
    position: int
    origin: str

    def describe(self) -> str: ...


class Generation:
    """One iteration of ``dataset()``: where it started and how far it produced.

    For batches that count the records they hold (packing, token budgets) it also
    keeps the position after each batch produced and not yet advanced past: what an
    `advance` by a number of batches needs to know where it lands. An iteration made in
    a graph is told of no batch: its `stream.Counter` counts them (`reached`).
    """

    __slots__ = (
        "boundaries", "closed", "counter", "end", "finished", "serial", "start", "superseded"
    )

    def __init__(
        self,
        serial: int,
        start: int,
        *,
        keep_boundaries: bool,
        counter: stream.Counter | None = None,
    ) -> None:
        self.serial = serial
        self.start = start
        self.counter = counter
        self.end = start  # the position after the last batch produced (without a counter)
        self.superseded = False
        self.finished = False  # produced its last batch (read-ahead may still be queued)
        self.closed = False  # its iterator is gone: nothing more can be handed out
        # (tf.data may read ahead even without a `prefetch`: it injects one.)
        self.boundaries: deque[int] | None = deque([start]) if keep_boundaries else None

    def produced(self, end: int) -> None:
        """A batch ending at position `end` was produced."""
        self.end = end
        if self.boundaries is not None:
            if len(self.boundaries) >= MAX_BOUNDARIES:
                self.boundaries.popleft()  # an advance from there raises (see Ledger)
            self.boundaries.append(end)

    def reached(self, layout: positions.Layout) -> int:
        """The position after the last batch produced (`layout` cuts the stream)."""
        if self.counter is None:
            return self.end
        return layout.advance(self.start, self.counter.produced())


class Ledger:
    """The live eager loop and the dataset() iterations of one loader, and their checks.

    Args:
        layout: the loader's batch arithmetic.
    """

    def __init__(self, layout: positions.Layout) -> None:
        self._layout = layout
        self._loop: weakref.ref[Loop] | None = None
        self._current: Generation | None = None
        self._serial = 0
        # A dataset() iteration that was live when the position was restored.
        self._stale: Generation | None = None
        # (before, after) the batch in flight when the last loop ended, until the
        # position next changes; and the depth of loader.excluding_in_flight().
        self._ended_in_flight: tuple[int, int] | None = None
        self.excluding = 0

    # -- the eager loop ----------------------------------------------------------------
    def loop(self) -> Loop | None:
        """The live ``for batch in loader``, if any."""
        loop = None if self._loop is None else self._loop()
        return loop if loop is not None and loop.live else None

    def check_no_loop(self, origin: str) -> None:
        """Raises if a loop is live (before a new loop starting at `origin` is built).

        Raises:
            StreamIntegrityError: another loop is live.
        """
        live = self.loop()
        if live is not None:
            msg = (
                "A second live iterator on one loader would hand out every batch twice and "
                f"count it twice. The live one: {live.describe()}. Finish or close it first "
                "(leave its loop, or call .close() on the iterator), or use a second loader "
                f"for a second stream. Received: a new `for batch in loader` at {origin}."
            )
            raise errors.StreamIntegrityError(msg)

    def open_loop(self, loop: Loop) -> None:
        """Registers `loop` as the live loop; every dataset() iteration is superseded."""
        self.check_no_loop(loop.origin)
        self._supersede()
        self._ended_in_flight = None
        self._loop = weakref.ref(loop)

    def close_loop(self, loop: Loop) -> None:
        """Forgets `loop` (now ended), remembering its batch in flight, if any."""
        if self._loop is not None and self._loop() is loop:
            self._loop = None
        if loop.in_flight is not None:
            self._ended_in_flight = (loop.in_flight, loop.position)

    def in_flight_before(self, position: int) -> int | None:
        """The position before the batch in flight at `position`, if one is.

        It is the live loop's batch in flight, or the one of the last loop if that loop
        ended with a batch in flight (its step raised, or a `break`) and the position
        did not change since.
        """
        live = self.loop()
        if live is not None:
            return live.in_flight
        ended = self._ended_in_flight
        return ended[0] if ended is not None and ended[1] == position else None

    def moved(self) -> None:
        """The position was changed by an advance or a restore."""
        self._ended_in_flight = None

    def check_position_change(self, what: str) -> None:
        """Raises if `what` (``set_state``, ``advance``) would move a live loop's position.

        Raises:
            StreamIntegrityError: an eager loop is live.
        """
        live = self.loop()
        if live is None:
            return
        if what == "advance":
            why = (
                "`for batch in loader` already advances by one batch as it hands each one "
                "out, so this advance would count a batch twice (skipping one on restore)"
            )
        else:
            why = (
                "the loop's producer keeps going from the old position, so the batches that "
                "follow would not be those of the new position"
            )
        msg = (
            f"Cannot {what} during a live `for batch in loader`: {why}. The live loop: "
            f"{live.describe()}. Leave the loop first, or consume `loader.dataset()` and "
            f"call `advance()` yourself. Received: {what} while the loop is live."
        )
        raise errors.StreamIntegrityError(msg)

    # -- dataset() iterations ----------------------------------------------------------
    def check_no_loop_under(self, what: str, position: int) -> None:
        """Raises if `what`, a dataset() iteration starting at `position`, would run
        beside a live eager loop.

        Raises:
            StreamIntegrityError: a ``for batch in loader`` is live.
        """
        live = self.loop()
        if live is not None:
            msg = (
                "Iterating `loader.dataset()` while a `for batch in loader` is live would "
                f"hand out the same batches twice. The live loop: {live.describe()}. Use "
                "one way of consuming the loader at a time. "
                f"Received: {what} starting at position {position}."
            )
            raise errors.StreamIntegrityError(msg)

    def watch(
        self,
        position: int,
        tasks: Iterator[plan_lib.Task],
        *,
        counter: stream.Counter | None = None,
    ) -> tuple[Iterator[plan_lib.Task], Callable[[int], None]]:
        """Starts a dataset() iteration at `position`; its tasks pass through the first
        result, the second is called with the position after each batch produced.

        An iteration whose batches are made in a graph gives its `counter` instead of
        reporting each batch (batches of a known number of records only); superseding
        it tells its counter.

        Raises:
            StreamIntegrityError: a ``for batch in loader`` is live (raised here, when
                the iteration starts).
        """
        self.check_no_loop_under("a dataset() iteration", position)
        self._supersede()
        self._serial += 1
        keep = not self._layout.known_counts
        assert counter is None or not keep, "a counter counts batches of a known size"
        generation = Generation(self._serial, position, keep_boundaries=keep, counter=counter)
        self._current, self._stale = generation, None
        return self._observed(generation, tasks), generation.produced

    def _observed(
        self, generation: Generation, tasks: Iterator[plan_lib.Task]
    ) -> Iterator[plan_lib.Task]:
        try:
            for task in tasks:
                if generation.superseded:
                    msg = (
                        "Two iterations of this loader's dataset() are read at once (e.g. "
                        "`zip(ds, ds)`, nested loops over one dataset, an iterator kept "
                        "from before the position was restored): each would hand out the "
                        "same batches, counted once. Read one iteration at a time. "
                        f"Received: batches requested from iteration {generation.serial} "
                        f"(started at position {generation.start}) after a newer one "
                        "started."
                    )
                    raise errors.StreamIntegrityError(msg)
                yield task
            generation.finished = True
        except GeneratorExit:
            # Its iterator is gone. After any other error, batches produced before it
            # may still be handed out, so the iteration is not closed.
            generation.closed = True
            raise

    def _supersede(self) -> None:
        current = self._current
        if current is not None:
            current.superseded = True
            if current.counter is not None:
                current.counter.supersede()

    def restored(self) -> None:
        """The position was set: every earlier dataset() iteration is out of date."""
        current = self._current
        if current is not None and not (current.finished or current.closed):
            self._stale = current
        self._supersede()
        self._current = None

    def check_advance(self, start: int, end: int) -> None:
        """Raises if an eager advance from `start` to `end` does not match what was produced.

        Raises:
            StreamIntegrityError: the advance goes past the last batch the current
                dataset() iteration produced, or the position was restored while a
                dataset() iteration was live and no new one started since.
        """
        stale = self._stale
        if stale is not None and not stale.closed and self._current is None:
            msg = (
                "The position was restored (set_state, or a checkpoint restore) while an "
                f"iterator over loader.dataset() was live (started at position "
                f"{stale.start}): its batches come from the old position, so this advance "
                "would count batches of another part of the stream. Create the iterator "
                f"after restoring. Received: advance from position {start}."
            )
            raise errors.StreamIntegrityError(msg)
        generation = self._current
        if generation is None or generation.closed:
            return
        reached = generation.reached(self._layout)
        if end <= reached:
            return
        msg = (
            "The consumer advanced past the last batch the loader produced: it counted "
            "batches that did not come from this loader. Likely causes: `repeat`, "
            "`concatenate`, `sample_from_datasets` or `choose_from_datasets` around "
            "`dataset()` (other data, or the same batches again), or `advance()` called "
            "more than once per batch. To skip batches on purpose, advance before "
            "iterating. Received: advance from position "
            f"{start} to {end}; dataset() iteration {generation.serial} (started at "
            f"{generation.start}) produced up to position {reached}."
        )
        raise errors.StreamIntegrityError(msg)

    def advanced(self, start: int, num_batches: int) -> int:
        """The position `num_batches` batches after `start`, for batches that count the
        records they hold: read from what the current dataset() iteration produced.

        Raises:
            StreamIntegrityError: no dataset() iteration produced the batch at `start`
                (an advance before iterating, or after a restore) or the batches after
                it (an advance past what was produced).
        """
        self.check_advance(start, start)  # a restore under a live iteration
        generation = self._current
        boundaries = None if generation is None else generation.boundaries
        if generation is None or boundaries is None or start not in boundaries:
            msg = (
                "This loader's batches count the records they hold (a packing or token-budget "
                "stage), so an advance needs the batches the current dataset() iteration "
                "produced, and none produced a batch at this position. Iterate "
                "`loader.dataset()` (or `for batch in loader`) and advance once per batch "
                "consumed; to skip ahead, consume the batches or restore a checkpoint. "
                f"Received: advance by {num_batches} from position {start}."
            )
            raise errors.StreamIntegrityError(msg)
        while boundaries[0] != start:  # the batches already advanced past
            boundaries.popleft()
        if num_batches >= len(boundaries):
            msg = (
                "The consumer advanced past the last batch the loader produced: it counted "
                "batches that did not come from this loader (see docs/guides/safe-ops.md). "
                f"Received: advance by {num_batches} from position "
                f"{start}; dataset() iteration {generation.serial} (started at "
                f"{generation.start}) produced {len(boundaries) - 1} batches after it."
            )
            raise errors.StreamIntegrityError(msg)
        return boundaries[num_batches]
