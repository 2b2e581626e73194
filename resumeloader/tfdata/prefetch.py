"""Eager prefetching for ``for batch in loader``: a Python thread ahead of the consumer.

In eager mode a ``for`` loop over the loader does not need tf.data: a background
thread runs the batch generator and converts each batch to tensors, at most `depth`
batches ahead. This skips ``from_generator``'s per-batch ``py_func`` round trip and
its iterator start-up (the first batch after a restore arrives in a few ms instead
of ~20 ms). What is produced never depends on timing: the thread only reads ahead of
the same deterministic stream, and the consumer advances the position.

`Started` begins a loop's batches before the loop asks for them
(``loader.start_prefetch()``): the first batch is made, and the producer runs ahead of
it, while the training script restores its model.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from resumeloader.core import board as board_lib
from resumeloader.core import buffers, exiting, handoff, waits

__all__ = ["PREFETCHED", "Started", "prefetched", "rows", "to_tensors"]

#: The gauge of the batches ready when the consumer asks for one.
PREFETCHED = "prefetched"
#: The meter of the conversion to tensors (the hand-off to TensorFlow).
_HAND_OFF = "hand-off"
# The queue's depth is sampled when the consumer asks for one batch in this many.
_GAUGE_EVERY = 8

_JOIN_SECONDS = 0.25


class _End:
    """Marks the end of the stream in the queue."""


class _Failure:
    """Carries an exception raised by the producer to the consumer."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


def to_tensors(batch: Any) -> Any:
    """The batch with every NumPy leaf converted to an eager tensor.

    An array, or a dict or tuple of arrays, takes the short way (`_tensor` on each
    array, without `tf.nest`: less than half the cost of `tf.nest.map_structure` with
    `tf.convert_to_tensor`, 8 us against 19 us for an int64[128] batch).
    """
    if type(batch) is np.ndarray:
        return _tensor(batch)
    if isinstance(batch, tf.Tensor):  # made a tensor already (decoded variable leaves)
        return batch
    if type(batch) is dict and all(type(leaf) is np.ndarray for leaf in batch.values()):
        return {key: _tensor(leaf) for key, leaf in batch.items()}
    if type(batch) is tuple and all(type(leaf) is np.ndarray for leaf in batch):
        return tuple(map(_tensor, batch))
    return tf.nest.map_structure(_to_tensor, batch, expand_composites=True)


def _tensor(array: np.ndarray) -> Any:
    """`array` as an eager tensor: a fresh numeric array the library made (a gathered
    batch, `core/handoff.py`) hands its memory over through DLPack, any
    other array is copied (a view of shared memory, an array a source may reuse): a
    small numeric one into fresh memory handed over (`handoff.small`), others by
    TensorFlow."""
    if array.dtype.kind in "iuf" and array.size:
        if array.flags.c_contiguous and array.flags.writeable and handoff.take(array):
            return tf.experimental.dlpack.from_dlpack(array.__dlpack__())
        if array.nbytes < buffers.MIN_BYTES:
            return tf.experimental.dlpack.from_dlpack(handoff.small(array).__dlpack__())
    return tf.constant(array)


def _to_tensor(leaf: Any) -> Any:
    return _tensor(leaf) if type(leaf) is np.ndarray else tf.convert_to_tensor(leaf)


def _converted(batches: Iterator[Any], board: board_lib.Board | None) -> Iterator[Any]:
    """The tensors of `batches`, each conversion timed as the hand-off in `board`."""
    if board is None:
        for batch in batches:
            yield to_tensors(batch)
        return
    place = board.here()
    meter = place[_HAND_OFF]
    # Each conversion counted here, without a call per untimed one (`Place.kind`).
    kind = place.kind(_HAND_OFF)
    for batch in batches:
        count = len(batch) if type(batch) is np.ndarray and batch.ndim else rows(batch)
        kind.laps += 1
        kind.records += count
        kind.batches += 1
        if kind.laps < kind.due:
            yield to_tensors(batch)
            continue
        lap = place.timing(kind, count)
        tensors = to_tensors(batch)
        lap.lap(meter, count)
        yield tensors


def rows(batch: Any) -> int:
    """The rows of a batch: the leading dimension of its first leaf (0 if it has none)."""
    if type(batch) is np.ndarray:
        return len(batch) if batch.ndim else 0
    leaf = batch
    while isinstance(leaf, (dict, tuple, list)) and leaf:
        leaf = next(iter(leaf.values())) if isinstance(leaf, dict) else leaf[0]
    shape = getattr(leaf, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) and shape[0] is not None else 0


def prefetched(
    make_batches: Callable[[], Iterator[Any]], depth: int, board: board_lib.Board | None = None
) -> Iterator[Any]:
    """Yields the tensors of ``make_batches()``'s batches, produced up to `depth` ahead.

    With `depth` 0 the batches are produced in the caller's thread. An exception of
    the producer is raised in the consumer, unchanged (its ``__cause__`` kept), after
    the batches before it. Closing the returned generator (a ``break``, an exception,
    Ctrl-C) stops the producer: it waits up to 0.25 s for it to close the batch
    generator, and leaves a producer stalled in user code behind as a daemon thread
    that stops after its current batch. With a `board` each conversion to tensors is
    timed (the hand-off) and the batches ready when the consumer asks are sampled
    (`PREFETCHED`).
    """
    if depth <= 0:
        batches = make_batches()
        try:
            yield from _converted(batches, board)
        finally:
            batches.close()  # type: ignore[attr-defined]
        return
    # No lock the main thread takes in Python: a Ctrl-C raised anywhere in its wait or
    # its cleanup leaves none held (a queue.Queue's could be, and the drain below then
    # waited for it forever: `waits.Slots`).
    slots: waits.Slots[Any] = waits.Slots(depth)
    gauge = None if board is None else board.gauge(PREFETCHED, depth)
    stop = threading.Event()
    join_seconds = _JOIN_SECONDS  # a local: the finally below may run at interpreter exit

    def produce() -> None:
        # Busy while handing a batch over: at interpreter exit it is stopped and waited
        # for before CPython finalizes (a daemon thread killed in the middle of it must
        # not leave the hand-off half done). Not while the batch is made: a source
        # stalled in user code must not hold up the exit.
        batches = make_batches()
        try:
            for tensors in _converted(batches, board):
                with exiting.busy():
                    if not slots.put(tensors, stop) or stop.is_set():
                        return
            with exiting.busy():
                slots.put(_End(), stop)
        except BaseException as err:  # handed to the consumer, never swallowed
            with exiting.busy():
                slots.put(_Failure(err), stop)
        finally:
            batches.close()  # type: ignore[attr-defined]

    exiting.on_exit(stop.set)
    thread = threading.Thread(target=produce, name="resumeloader-prefetch", daemon=True)
    thread.start()
    try:
        asked = 0
        while True:
            asked += 1
            if gauge is not None and asked % _GAUGE_EVERY == 1:
                gauge.sample(slots.qsize())
            item = slots.get()  # Ctrl-C interrupts it, however it lands
            if isinstance(item, _End):
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        # Stopped early, failed, interrupted or done: free a blocked producer and give it
        # a moment to close the batch generator. A producer stalled in user code is left
        # behind (a daemon thread, it stops at its next batch): Ctrl-C must not wait for it.
        stop.set()
        slots.clear()  # never blocks
        thread.join(join_seconds)


class Started:
    """A loop's batches, begun before the loop asks for them.

    A thread calls `make` (which starts the producer: the prefetch thread, the worker
    backend) and takes the first item, which waits for the loop; the producer behind it
    runs ahead as far as it does in any loop. The items are those `make`'s iterator
    yields, in order: nothing here touches what they are. An error of `make` or of the
    first item is raised by the first `__next__`, an empty stream ends it.

    Args:
        make: returns the iterator of the loop's items (closed by `close`).
    """

    def __init__(self, make: Callable[[], Iterator[Any]]) -> None:
        self._lock = threading.Lock()
        self._items: Iterator[Any] | None = None
        self._first: tuple[Any, ...] = ()  # (item,) once taken; () for an empty stream
        self._error: BaseException | None = None
        self._done = self._closed = self._handed = False
        self._thread = threading.Thread(
            target=self._begin, args=(make,), name="resumeloader-start", daemon=True
        )
        self._thread.start()

    @property
    def ready(self) -> bool:
        """Whether the first item is made (or the stream failed or is empty)."""
        return self._done

    def _begin(self, make: Callable[[], Iterator[Any]]) -> None:
        items = None
        try:
            items = make()
            self._first = (next(items),)
        except StopIteration:
            pass
        except BaseException as err:  # raised in the loop, never swallowed
            self._error = err
        finally:
            with self._lock:
                self._items, self._done, closed = items, True, self._closed
            if closed and items is not None:  # closed while the first item was made
                items.close()  # type: ignore[attr-defined]

    def __iter__(self) -> Started:
        return self

    def __next__(self) -> Any:
        if not self._handed:
            waits.join(self._thread)  # the first item, if the loop asks before it is made
            self._handed = True
            if self._error is not None:
                error, self._error = self._error, None
                raise error
            if not self._first:
                raise StopIteration
            first, self._first = self._first[0], ()
            return first
        if self._items is None:
            raise StopIteration
        return next(self._items)

    def close(self) -> None:
        """Stops the producer: at once when the first item is made, else when it is
        (waiting up to 0.25 s for it; a producer stalled in user code is left behind,
        a daemon thread that stops after its current batch)."""
        with self._lock:
            self._closed = True
            done, items = self._done, self._items
        if not done:
            self._thread.join(_JOIN_SECONDS)  # the thread closes them when it is done
            return
        self._first = ()
        if items is not None:
            items.close()  # type: ignore[attr-defined]
