"""`Position`: where a loader's position lives, who may move it, and the live eager loop.

The position is a `tf.Variable` (graph code reads and advances it, and
``MirroredStrategy`` mirrors it), except while a ``for batch in loader`` is live: the
loop counts in Python and writes the variable once, when it ends — a variable write
per batch cost more than the rest of the loop (~290 us under a prefetch thread).
Every reader in Python (``position``, ``get_state``, a checkpoint save) sees the
loop's count; graph code cannot run beside a live loop (a ``dataset()`` iteration
raises, an eager `advance` raises, and a graph advance is overwritten when the loop
ends: the loop already counted its batches).

`Position` also keeps the loader's `resumeloader.handout.consumption.Ledger`, through
which every move is checked, and starts the live loop (`resumeloader.handout.loop`),
with the batches `start` began for it if the position is still theirs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from resumeloader import errors
from resumeloader.core import positions, validate
from resumeloader.handout import consumption
from resumeloader.handout import loop as loop_lib
from resumeloader.tfdata import graph, ordering, prefetch

__all__ = ["Position", "eager_only"]


def eager_only(what: str) -> None:
    """Raises a TypeError naming `what` while a tf.function is being traced."""
    if tf.inside_function():
        msg = (
            f"`{what}` runs eagerly only: inside a tf.function the position is a symbolic "
            "value. Read it (or save a checkpoint) outside the function, between steps. "
            f"Received: {what} while tracing a tf.function."
        )
        raise TypeError(msg)


def _check_end(layout: positions.Layout, start: int, num_batches: int) -> None:
    """Raises if advancing by `num_batches` from `start` passes the end of a finite stream.

    Raises:
        StreamIntegrityError: fewer batches than `num_batches` are left.
    """
    left = layout.batches_to_end(start)
    if left is None or num_batches <= left:
        return
    msg = (
        "The consumer advanced past the end of this finite loader: it counted batches "
        "that do not exist (other data mixed in: `sample_from_datasets`, "
        "`choose_from_datasets`, `concatenate`; the wrong loader advanced; `advance()` "
        "called more than once per batch). Nothing was advanced. Received: advance by "
        f"{num_batches} from position {start}; {left} batch{'' if left == 1 else 'es'} "
        f"{'is' if left == 1 else 'are'} left (num_epochs={layout.num_epochs})."
    )
    raise errors.StreamIntegrityError(msg)


def _python_int(value: Any) -> Any:
    """An integer scalar tensor or NumPy value as an int (eagerly); anything else as is."""
    if isinstance(value, (tf.Tensor, np.ndarray, np.generic)):
        array = np.asarray(value)
        if array.shape == () and array.dtype.kind in "iu":
            return int(array)
    return value


class Position:
    """The position of one loader and the checks on every move (module docstring).

    Args:
        layout: the loader's batch arithmetic.
    """

    def __init__(self, layout: positions.Layout) -> None:
        self._layout = layout
        self.ledger = consumption.Ledger(layout)
        with tf.init_scope():
            self.variable = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="resumeloader_position",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )
        # (position, batches) that `start` began for the next loop from that position.
        self._started: tuple[int, prefetch.Started] | None = None

    def read(self) -> int:
        """The normalised position (before the batch in flight inside `excluding_in_flight`)."""
        live = self.ledger.loop()
        if live is not None:
            position = live.position
        else:
            eager_only("loader.position")
            position = self._layout.normalise(int(self.variable.numpy()))
        if self.ledger.excluding:
            before = self.ledger.in_flight_before(position)
            if before is not None:
                return before
        return position

    def set(self, position: int) -> None:
        """Restores normalised `position` (validated by the caller: `Engine.resume`).

        Raises:
            StreamIntegrityError: a ``for batch in loader`` is live.
        """
        self.ledger.check_position_change("set_state")
        self.variable.assign(position)
        self.ledger.restored()
        self.ledger.moved()
        self._moved_to(position)

    def advance(self, num_batches: Any) -> None:
        """Advances by `num_batches` batches, eagerly (checked) or in a graph (ordered).

        Raises:
            StreamIntegrityError: see `consumption.Ledger.check_position_change` and
                `consumption.Ledger.check_advance`.
        """
        self.ledger.check_position_change("advance")
        if tf.inside_function():
            with tf.control_dependencies(ordering.pending_get_next()):
                if self._layout.known_counts and not self._layout.skips:
                    graph.advance(self.variable, self._layout, num_batches)
                else:
                    self._advance_by_host(num_batches)
            return
        num_batches = validate.integer("num_batches", _python_int(num_batches), low=0)
        start = self.read()
        if self._layout.known_counts:
            _check_end(self._layout, start, num_batches)
            end = self._layout.advance(start, num_batches)
        else:
            end = self.ledger.advanced(start, num_batches) if num_batches else start
        self.ledger.check_advance(start, end)
        self.variable.assign(end, read_value=False)
        self.ledger.moved()
        self._moved_to(end)

    def _advance_by_host(self, num_batches: Any) -> None:
        """A graph advance for batches of varying size (a host callback reads where the
        batches end from the ledger: what the dataset() iteration produced) or around
        skips (the layout's arithmetic, in Python)."""

        def advanced(position: Any, count: Any) -> Any:
            start = self._layout.normalise(int(position))
            number = validate.integer("num_batches", int(count), low=0)
            if self._layout.known_counts:
                return np.int64(self._layout.advance(start, number))
            return np.int64(self.ledger.advanced(start, number) if number else start)

        count = tf.cast(num_batches, tf.int64)
        end = tf.py_function(advanced, [self.variable.read_value(), count], tf.int64)
        self.variable.assign(tf.reshape(end, ()))

    def loop(self, batches: Callable[[int], Iterator[Any]], origin: str) -> loop_lib.EagerLoop:
        """A new live loop over ``batches(position)`` (pairs of a batch and the position
        after it), started at `origin`.

        Raises:
            StreamIntegrityError: another loop is live.
        """
        self.ledger.check_no_loop(origin)
        position = self.read()
        started, self._started = self._started, None
        if started is not None and started[0] != position:  # moved since (a graph advance)
            started[1].close()
            started = None
        made = started[1] if started is not None else batches(position)
        loop = loop_lib.EagerLoop(made, position, origin=origin, on_close=self._ended)
        try:
            self.ledger.open_loop(loop)
        except BaseException:
            loop.live = False  # never started: nothing to hand back
            raise
        return loop

    def start(self, batches: Callable[[int], Iterator[Any]]) -> prefetch.Started:
        """Begins ``batches(position)`` now, for the next loop if it starts at this
        position (kept until then: a move or `drop_started` closes them).

        Raises:
            StreamIntegrityError: a loop is live.
        """
        live = self.ledger.loop()
        if live is not None:
            msg = (
                "`start_prefetch()` begins the batches of the next `for batch in loader`, "
                f"but a loop is live and producing already: {live.describe()}. Call it "
                "after restoring, before the loop starts. Received: start_prefetch() "
                "while the loop is live."
            )
            raise errors.StreamIntegrityError(msg)
        position = self.read()
        if self._started is not None and self._started[0] == position:
            return self._started[1]
        self.drop_started()
        started = prefetch.Started(lambda: batches(position))
        self._started = (position, started)
        return started

    def _moved_to(self, position: int) -> None:
        if self._started is not None and self._started[0] != position:
            self.drop_started()

    def drop_started(self) -> None:
        """Closes the batches `start` began, if any (not for a loop any more)."""
        started, self._started = self._started, None
        if started is not None:
            started[1].close()

    def _ended(self, loop: loop_lib.EagerLoop) -> None:
        self.ledger.close_loop(loop)
        self.variable.assign(loop.position, read_value=False)

    @contextlib.contextmanager
    def excluding_in_flight(self) -> Iterator[int]:
        """Within it, `read` gives the position before the batch in flight."""
        self.ledger.excluding += 1
        try:
            yield self.read()
        finally:
            self.ledger.excluding -= 1
