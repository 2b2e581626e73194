"""`Position`: where a loader's position lives, who may move it, and the live eager loop.

The position is a `tf.Variable` (``MirroredStrategy`` mirrors it) plus a second one,
the batches advanced inside graphs since Python last wrote it: an ``advance()`` in a
``tf.function`` is one ``assign_add`` of that count (its checks, where one is needed,
a comparison with a bound computed when the position was written), and every reader
in Python (``position``, ``get_state``, a checkpoint save, an iteration starting)
adds it with the O(1) layout arithmetic. While a ``for batch in loader`` is live the
loop counts in Python and writes the variable once, when it ends — a variable write
per batch cost more than the rest of the loop (~290 us under a prefetch thread).
Every reader in Python sees the loop's count; graph code cannot run beside a live
loop (a ``dataset()`` iteration raises, an eager `advance` raises, and a graph
advance is dropped when the loop ends: the loop already counted its batches).

`Position` also keeps the loader's `resumeloader.handout.consumption.Ledger`, through
which every move is checked, and starts the live loop (`resumeloader.handout.loop`),
with the batches `start` began for it if the position is still theirs. With a
`resumeloader.core.board.Consumer` it tells it what the consumer waited for: each
step of a live loop, and each eager advance after a ``dataset()`` iteration's batches
(`watch`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from resumeloader import errors
from resumeloader.core import board as board_lib
from resumeloader.core import positions, validate
from resumeloader.handout import consumption, stream
from resumeloader.handout import loop as loop_lib
from resumeloader.tfdata import ordering, prefetch

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


# A constant count whose batches take at least 2**32 steps to pass the largest position
# needs no check in the step: the readers' arithmetic checks it (`Layout.advance`).
_UNCHECKED_RECORDS = positions.MAX_POSITION >> 32


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
        consumer: told what the consumer waited for (see the module docstring), or None.
    """

    def __init__(
        self, layout: positions.Layout, consumer: board_lib.Consumer | None = None
    ) -> None:
        self._layout = layout
        self._consumer = consumer
        self.ledger = consumption.Ledger(layout)
        # Batches of a known number of records: a graph advance is a count (see above).
        self._counted = layout.known_counts and not layout.skips
        self._lock = threading.Lock()  # a reader and a writer in Python, one at a time
        with tf.init_scope():
            self.variable = _variable("resumeloader_position")
            #: Batches advanced inside graphs since `variable` was last written.
            self.pending = _variable("resumeloader_pending_batches")
            # Batches that may be pending before an advance passes the end of a finite
            # stream (or comes near the largest position): written with `variable`.
            self._limit = _variable(
                "resumeloader_advance_limit", self._advance_limit(0) if self._counted else 0
            )
        # (position, batches) that `start` began for the next loop from that position.
        self._started: tuple[int, prefetch.Started] | None = None

    def _write(self, position: int) -> None:
        """Writes normalised `position`: the variable, no pending batches, their limit."""
        with self._lock:
            self.variable.assign(position, read_value=False)
            self.pending.assign(0, read_value=False)
            if self._counted:
                self._limit.assign(self._advance_limit(position), read_value=False)

    def _advance_limit(self, position: int) -> int:
        """The most batches a graph may advance from `position`: to the end of a finite
        stream; a safe bound below the largest position for an endless one."""
        layout = self._layout
        left = layout.batches_to_end(position)
        if left is not None:
            return left
        epochs = max(0, positions.MAX_POSITION // layout.records_per_epoch - position
                     // layout.records_per_epoch - 2)
        batches = layout.batches_left_in_epoch(position) + epochs * layout.batches_per_epoch
        return min(batches, positions.MAX_POSITION)

    def _stored(self) -> int:
        """The normalised position the variables hold (the graphs' advances added)."""
        with self._lock:
            position = self._layout.normalise(int(self.variable.numpy()))
            pending = int(self.pending.numpy())
        return self._layout.advance(position, pending) if pending else position

    def read(self) -> int:
        """The normalised position (before the batch in flight inside `excluding_in_flight`)."""
        live = self.ledger.loop()
        if live is not None:
            position = live.position
        else:
            eager_only("loader.position")
            position = self._stored()
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
        self._write(position)
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
                if self._counted:
                    self._advance_in_graph(num_batches)
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
        self._write(end)
        self.ledger.moved()
        self._moved_to(end)
        if self._consumer is not None and end != start:
            self._consumer.advanced(end)

    def _advance_in_graph(self, num_batches: Any) -> None:
        """``pending += num_batches`` in the graph being traced: one op for a constant
        count that cannot reach the largest position on an endless stream; otherwise
        first a check that the count is not negative and stays within the limit (the
        end of a finite stream): a failed check fails the step, the position unchanged."""
        constant = int(num_batches) if isinstance(num_batches, (int, np.integer)) else None
        if constant is not None:
            count = tf.constant(constant, tf.int64)
        else:
            count = tf.cast(num_batches, tf.int64)
        checks = []
        if not isinstance(constant, int) or constant < 0:
            checks.append(tf.debugging.assert_non_negative(
                count, message="`num_batches` of loader.advance() must be >= 0"))
        layout = self._layout
        small = isinstance(constant, int) and constant * layout.batch_size < _UNCHECKED_RECORDS
        if layout.end is not None or not small:
            finite = layout.end is not None
            what = (
                "loader.advance(num_batches) past the end of a finite loader: it counted "
                "batches that do not exist (StreamIntegrityError eagerly). Batches advanced "
                "since the position was last read, with num_batches:"
                if finite else
                "loader.advance(num_batches) would pass the largest position, 2**63 - 1. "
                "Batches advanced since the position was last read, with num_batches:"
            )
            total = self.pending.read_value() + count
            limit = self._limit.read_value()
            checks.append(tf.debugging.Assert(total <= limit, [what, total, "limit:", limit]))
        with tf.control_dependencies(checks):
            self.pending.assign_add(count, read_value=False)

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
        self.variable.assign(tf.reshape(end, ()), read_value=False)

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
        loop = loop_lib.EagerLoop(made, position, origin=origin, on_close=self._ended,
                                  consumer=self._consumer)
        try:
            self.ledger.open_loop(loop)
        except BaseException:
            loop.live = False  # never started: nothing to hand back
            raise
        return loop

    def watch(
        self, position: int, tasks: Iterator[Any], *, counter: stream.Counter | None = None
    ) -> tuple[Iterator[Any], Callable[[int], None]]:
        """The watch of a ``dataset()`` iteration (`consumption.Ledger.watch`), which also
        tells the consumer meter when the iteration starts and each batch is produced
        (not for batches made in a graph, which give a `counter` instead)."""
        tasks, produced = self.ledger.watch(position, tasks, counter=counter)
        consumer = self._consumer
        if consumer is None:
            return tasks, produced
        consumer.started()

        def observed(end: int) -> None:
            produced(end)
            consumer.produced(end)

        return tasks, observed

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
        self._write(loop.position)

    @contextlib.contextmanager
    def excluding_in_flight(self) -> Iterator[int]:
        """Within it, `read` gives the position before the batch in flight."""
        self.ledger.excluding += 1
        try:
            yield self.read()
        finally:
            self.ledger.excluding -= 1


def _variable(name: str, value: int = 0) -> tf.Variable:
    """An int64 scalar variable of the position (the first replica's under a strategy)."""
    return tf.Variable(
        value,
        dtype=tf.int64,
        trainable=False,
        name=name,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )
