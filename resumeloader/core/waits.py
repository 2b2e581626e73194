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

A Ctrl-C is lost a second way: its ``KeyboardInterrupt`` raised in code whose errors
CPython can only print - a garbage collector callback (JAX registers one, and TensorFlow
2.21 imports JAX when it is installed), a ``__del__``, a weakref callback - is "ignored"
there, and the main thread goes back to its wait. The first wait installs a
``sys.unraisablehook`` that notes a ``KeyboardInterrupt`` ignored in the main thread;
the main thread's next wait (or the one it is in, within a slice) raises it. Other
unraisable errors go to the hook installed before. Pure Python: no TensorFlow.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from concurrent import futures
from typing import Any, TypeVar

__all__ = ["SLICE_SECONDS", "get", "join", "result"]

#: The longest one blocking call lasts: a pending signal handler runs this late at most.
SLICE_SECONDS = 0.1

T = TypeVar("T")

_installed = False
# A KeyboardInterrupt of the main thread was ignored since its last wait.
_ignored = False


def _install() -> None:
    """Installs the hook that notes an ignored Ctrl-C (once; cheap after that)."""
    global _installed
    if _installed:
        return
    _installed = True
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        global _ignored
        if (
            unraisable.exc_type is KeyboardInterrupt
            and threading.current_thread() is threading.main_thread()
        ):
            _ignored = True  # raising here would be ignored too
            return
        previous(unraisable)

    sys.unraisablehook = hook


def _check() -> None:
    """Raises the main thread's ignored KeyboardInterrupt, if any."""
    global _ignored
    if _ignored and threading.current_thread() is threading.main_thread():
        _ignored = False
        raise KeyboardInterrupt


def get(slots: queue.Queue[T]) -> T:
    """The next item of `slots`, however long it takes (as ``slots.get()``)."""
    _install()
    while True:
        _check()
        try:
            return slots.get(timeout=SLICE_SECONDS)
        except queue.Empty:
            continue


def result(future: futures.Future[T], timeout: float | None = None) -> T:
    """``future.result(timeout)``: its result, or its error raised.

    Raises:
        TimeoutError: not done after `timeout` seconds (`concurrent.futures.TimeoutError`).
    """
    _install()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        _check()
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
    _install()
    while thread.is_alive():
        _check()
        thread.join(SLICE_SECONDS)
