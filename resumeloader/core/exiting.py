"""Interpreter exit without hangs: the library's threads leave Python before it finalizes.

At exit CPython runs the ``atexit`` handlers, then marks itself finalizing; from then on
a thread that takes the GIL (entering Python from C, or returning from a blocking call)
is terminated on the spot (CPython 3.11-3.13; 3.14 blocks it forever). TensorFlow runs a
``from_generator`` generator in its own threads, inside a ``py_func`` kernel. A kernel
whose generator is in Python at that moment loses its thread and never completes, so
the prefetch thread waiting for it never ends, and the main thread - destroying the
iterator as finalization clears ``__main__``'s globals - waits for that thread forever
(``PrefetchDatasetOp::Iterator::~Iterator``): 1 exit in 8-12 of a script that iterated
``dataset()`` hung in resumeloader 0.2.0. A Python thread of the library killed the
same way while it holds a lock (a queue's, a future's) would hang the main thread that
takes the lock during finalization.

So the library's code that runs in such threads marks itself `busy`, and the handler
this module registers with ``atexit`` - run before finalization, while every thread
can still take the GIL - sets `EXITING`, calls the registered stoppers (`on_exit`), and
waits until no thread has been busy for `QUIET_SECONDS` (at most `EXIT_SECONDS`, for a
thread stalled in user code). A generator that sees `EXITING` raises instead of making
another batch (nothing reads it any more; a batch it would have made must not look
like an end of data), so TensorFlow stops calling it.

Last, the handler freezes the garbage collector's heap (``gc.freeze``): finalization
then skips its collection over every object alive at exit. With TensorFlow loaded
(about 450,000 tracked objects) that collection was most of an exit's work: 1.6 s of
CPU time, 8 s of wall time at load 16 on 2 cores; 0.14 s and under 1 s with the heap
frozen (a collection run here instead, while Python still runs, cost as much). Objects
are still freed by reference counting as finalization clears the modules; garbage in
reference cycles is left to the operating system, uncollected (CPython never promised
to collect it at exit). An iterator in such a cycle (a Keras fit's) is therefore never
destroyed after Python stopped running, where its finalizer could not run and
TensorFlow would log "Error occurred when finalizing GeneratorDataset iterator:
FAILED_PRECONDITION". Pure Python: no TensorFlow.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["EXITING", "EXIT_SECONDS", "QUIET_SECONDS", "busy", "check", "install", "on_exit"]

#: Set by the exit handler: the interpreter is exiting.
EXITING = threading.Event()
#: How long the exit handler waits at most for busy threads. Only a ``from_generator``
#: generator making a batch without workers is busy in user code; stalled there, its
#: TensorFlow iterator cannot be destroyed anyway (TensorFlow waits for the thread).
EXIT_SECONDS = 10.0
#: How long no thread must have been busy before the interpreter may finalize: a
#: TensorFlow thread that just handed a batch on calls the generator again at once.
QUIET_SECONDS = 0.1
_POLL_SECONDS = 0.01

_lock = threading.Lock()
_busy = 0
_last = 0.0  # time.monotonic() when a thread last entered or left `busy`
_stoppers: list[Callable[[], Callable[[], Any] | None]] = []
_installed = False


def install() -> None:
    """Registers the exit handler once (it then runs before the ``atexit`` handlers
    registered earlier, TensorFlow's among them)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    atexit.register(_at_exit)


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Marks the calling thread as running library code the exit handler must wait for."""
    global _busy, _last
    with _lock:
        _busy += 1
        _last = time.monotonic()
    try:
        yield
    finally:
        with _lock:
            _busy -= 1
            _last = time.monotonic()


def check(what: str) -> None:
    """Raises if the interpreter is exiting: `what` (a batch) is not made any more.

    Raises:
        RuntimeError: `EXITING` is set.
    """
    if EXITING.is_set():
        msg = (
            f"The interpreter is exiting: resumeloader stopped making {what} (a thread "
            "still running Python when CPython finalizes would hang the exit). "
            "Received: a request after the exit handlers started."
        )
        raise RuntimeError(msg)


def on_exit(stop: Callable[[], Any]) -> None:
    """Calls `stop` when the interpreter exits, before waiting for busy threads. A bound
    method is held weakly (its object may be collected first); a function strongly."""
    install()
    ref: Callable[[], Callable[[], Any] | None]
    if hasattr(stop, "__self__") and hasattr(stop, "__func__"):
        ref = weakref.WeakMethod(stop)
    else:
        ref = lambda: stop  # noqa: E731
    with _lock:
        _stoppers[:] = [r for r in _stoppers if r() is not None]
        _stoppers.append(ref)


def _at_exit() -> None:
    EXITING.set()
    with _lock:
        stoppers = [r() for r in _stoppers]
    for stop in stoppers:
        if stop is not None:
            with contextlib.suppress(Exception):
                stop()
    deadline = time.monotonic() + EXIT_SECONDS
    while time.monotonic() < deadline:
        with _lock:
            if _busy == 0 and time.monotonic() - _last >= QUIET_SECONDS:
                break
        time.sleep(_POLL_SECONDS)
    gc.freeze()  # finalization's last collection would walk the whole heap
