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
next wait, or within a slice of the one it is in. Pure Python: no TensorFlow.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures
from typing import TypeVar

from resumeloader.core import interrupts

__all__ = ["SLICE_SECONDS", "get", "join", "result"]

#: The longest one blocking call lasts: a pending signal handler runs this late at most.
SLICE_SECONDS = 0.1

T = TypeVar("T")


def get(slots: queue.Queue[T]) -> T:
    """The next item of `slots`, however long it takes (as ``slots.get()``)."""
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
