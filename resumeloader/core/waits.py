"""Waits that Ctrl-C always interrupts: a queue's item, a future's result, a thread's end.

CPython runs a signal's Python handler (Ctrl-C's ``KeyboardInterrupt``) in the main
thread, between two bytecodes; a lock's blocking acquire returns to run it only when the
signal interrupts that very call. A signal whose C handler ran just before the acquire
blocked (after the interpreter's last check: more likely when the machine is loaded and
the thread is preempted there), or in another thread (the kernel may deliver a
process's signal to any thread), leaves the handler pending while the main thread
blocks on - and a wait without a timeout never returns when the thread it waits for is
stalled in user code: one SIGINT left a job with a source stalled for an hour and the
prefetch thread hung, with the main thread in ``Queue.get()``. These waits block for at
most `SLICE_SECONDS` at a time, so a pending handler runs (and raises) that late at
most.

A Ctrl-C lost in other code - its ``KeyboardInterrupt`` raised where C code reports it as
unraisable or clears it (`resumeloader.core.interrupts`) - is raised by the main thread's
next wait, or within a slice of the one it is in.

`Slots` hands items from a producer thread to the main thread through C queues only. A
``queue.Queue`` takes its lock in Python (``with self.not_empty``: the lock's
``__enter__`` is called from ``Condition.__enter__``), and a KeyboardInterrupt raised as
that call returns (CPython 3.11 checks for a pending signal there) leaves the lock held
by the main thread: its own cleanup (draining the queue) then blocks on it forever, with
one Ctrl-C spent. Nothing the main thread does with a `Slots` takes a lock in Python, so
a Ctrl-C raised anywhere in it leaves nothing held. Pure Python: no TensorFlow.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures
from typing import Generic, TypeVar

from resumeloader.core import interrupts

__all__ = ["SLICE_SECONDS", "Slots", "get", "join", "result"]

#: The longest one blocking call lasts: a pending signal handler runs this late at most.
SLICE_SECONDS = 0.1

T = TypeVar("T")


def get(slots: queue.SimpleQueue[T] | queue.Queue[T]) -> T:
    """The next item of `slots`, however long it takes (as ``slots.get()``). Only a
    ``queue.SimpleQueue`` holds no lock after a KeyboardInterrupt raised in it."""
    interrupts.notice()
    while True:
        interrupts.check()
        try:
            return slots.get(timeout=SLICE_SECONDS)
        except queue.Empty:
            continue


def result(future: futures.Future[T], timeout: float | None = None) -> T:
    """``future.result(timeout)``: its result, or its error raised.

    Raises:
        TimeoutError: not done after `timeout` seconds (`concurrent.futures.TimeoutError`).
    """
    interrupts.notice()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        interrupts.check()
        wait = SLICE_SECONDS
        if deadline is not None:
            wait = max(0.0, min(wait, deadline - time.monotonic()))
        try:
            # `exception` waits without raising the task's own error (a TimeoutError
            # the task raised must not read as this wait's).
            future.exception(wait)
        except futures.TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise
            continue
        return future.result()


def join(thread: threading.Thread) -> None:
    """Returns when `thread` has ended (as ``thread.join()``)."""
    interrupts.notice()
    while thread.is_alive():
        interrupts.check()
        thread.join(SLICE_SECONDS)


class Slots(Generic[T]):
    """At most `depth` items on their way from a producer thread to a consumer (the main
    thread), in order: a ``queue.Queue(maxsize=depth)`` whose consumer takes no lock in
    Python (see the module docstring), a KeyboardInterrupt raised anywhere in `get` or
    `clear` included. The items and the free places are two ``queue.SimpleQueue``: the
    producer takes a place before it puts an item, the consumer gives one back after it
    takes one (a KeyboardInterrupt between the two loses that place: the consumer is
    leaving).

    Args:
        depth: the most items put and not yet taken (at least 1).
    """

    def __init__(self, depth: int) -> None:
        self._items: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._free: queue.SimpleQueue[None] = queue.SimpleQueue()
        for _ in range(max(1, depth)):
            self._free.put(None)

    def put(self, item: T, stop: threading.Event) -> bool:
        """From the producer: puts `item` once a place is free; False (not put) if `stop`
        is set first (seen within `SLICE_SECONDS`)."""
        while not stop.is_set():
            try:
                self._free.get(timeout=SLICE_SECONDS)
            except queue.Empty:
                continue
            self._items.put(item)
            return True
        return False

    def get(self) -> T:
        """From the consumer: the next item, however long it takes (`get`: Ctrl-C
        interrupts it)."""
        item = get(self._items)
        self._free.put(None)
        return item

    def qsize(self) -> int:
        """The items put and not yet taken."""
        return self._items.qsize()

    def clear(self) -> None:
        """From the consumer: drops the items waiting (never blocks), freeing their places."""
        while True:
            try:
                self._items.get_nowait()
            except Exception:  # queue.Empty (at interpreter shutdown `queue` may be gone)
                return
            self._free.put(None)
