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
import traceback


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


def assert_collects() -> None:
    """Fails, with every thread's stack, if this process's collections no longer run."""
    assert collects(), (
        "gc.collect() did not run: a collection is stuck in some thread of this process "
        "(a finalizer waiting forever?); the threads' stacks:\n" + threads_stacks()
    )
