"""Whether this process's garbage collector still collects, and if not, why.

CPython skips ``gc.collect()`` while a collection is under way in any thread. A thread
stuck inside a collection (a finalizer waiting for a lock that nothing will release)
therefore stops every later collection of the process: no loader is finalised, no pool
stopped. Tests that count on collections say so with the stacks of every thread, the
stuck finalizer's among them, instead of failing on what the collection did not do.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import traceback
import warnings

#: How long a test waits for another thread's collection to end (a finalizer of an
#: earlier test's object that takes seconds, such as a client closing its connections).
WAIT_SECONDS = 60.0


def collects() -> bool:
    """Whether a ``gc.collect()`` now runs (its callbacks are called)."""
    ran: list[str] = []

    def callback(phase: str, info: dict) -> None:
        ran.append(phase)

    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
    return "stop" in ran


def threads_stacks() -> str:
    """Every thread's name and stack, innermost call last."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"--- thread {names.get(ident, '?')} ({ident})\n")
        parts.extend(traceback.format_stack(frame))
    return "".join(parts)


def assert_collects(seconds: float = WAIT_SECONDS) -> None:
    """Returns once a ``gc.collect()`` runs; fails, with every thread's stack, if none
    does within `seconds` (a collection stuck in some thread of this process)."""
    start = time.monotonic()
    deadline = start + seconds
    first = None
    while not collects():
        first = first or threads_stacks()
        if time.monotonic() > deadline:
            raise AssertionError(
                f"gc.collect() did not run for {seconds:.0f} s: a collection is stuck in "
                "some thread of this process (a finalizer waiting?); the threads' "
                "stacks:\n" + threads_stacks()
            )
        time.sleep(0.05)
    if first is not None:  # it ran again: who held it up shows in the run's warnings
        warnings.warn(
            f"gc.collect() was skipped for {time.monotonic() - start:.1f} s (a collection "
            f"under way in another thread); the threads' stacks then:\n{first}",
            stacklevel=2,
        )
