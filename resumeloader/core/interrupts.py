"""Ctrl-C that other code loses, noticed: the loader raises its ``KeyboardInterrupt`` again.

Python's SIGINT handler raises ``KeyboardInterrupt`` in whatever Python the main thread
runs when it is called. Where that Python was called from C, the C code decides what
becomes of it, and some of it loses it:

- Code whose errors CPython can only report, "unraisable": a garbage collector callback
  (JAX registers one, and TensorFlow 2.21 imports JAX when it is installed), a
  ``__del__``, a weakref callback - and C code that reports an error that way.
  TensorFlow 2.21's C++ (``tf.nest`` on the main thread, ``_pywrap_utils.Flatten``)
  turns a KeyboardInterrupt raised in the Python it calls into ``SystemError: ...
  returned a result with an exception set`` and reports that. A ``sys.unraisablehook``
  (`notice`) notes a KeyboardInterrupt of the main thread reported so, alone or as the
  cause or context of the error reported, instead of printing it.
- C code that clears the error without a word (TensorFlow's C++ type checks, CPython's
  ``hasattr`` in C). While a loop over the loader is live (`hold` .. `release`), the
  SIGINT handler is this module's - only where it was Python's own
  (``signal.default_int_handler``), never a handler of yours, and from the main thread
  only; it is put back when the last loop ends. It raises KeyboardInterrupt as Python's
  does, and notes the press when it lands in the loader's own code: a function marked
  `guarded` is running (the loop's ``__next__``, and everything it calls). The loader's
  code never catches a KeyboardInterrupt, so one that does not leave it was lost (a
  source or ``map_fn`` that a loop without workers runs in the main thread runs inside
  it: a KeyboardInterrupt it catches is raised again).

`check` raises a noted KeyboardInterrupt in the main thread, once: the loader's waits
call it every slice, a loop's ``__next__`` before it hands a batch out. A press that lands
in your code (the loop's body) is not noted: a KeyboardInterrupt your code catches is
yours, never raised again - and one that C code your body calls clears silently is lost,
as without the loader (the next Ctrl-C ends the loop: a loop waiting for a batch checks
every `waits.SLICE_SECONDS`).

A ``dataset()`` iteration runs none of the loader's code in the main thread: TensorFlow's
threads run its generator while the main thread waits in TensorFlow's C++ or runs your
step. A SIGINT arriving while the main thread runs a garbage collection (C code) has its
KeyboardInterrupt raised in the first Python that runs next - a gc callback, JAX's when
TensorFlow imported it - which CPython only reports: the Ctrl-C was lost, and the loop
over the dataset ran on to its end. So the generator runs `iterating`, and each of its
steps calls `forward`: a press noted meanwhile is signalled to the main thread again
(``_thread.interrupt_main``), whose SIGINT handler then runs at its next bytecode, as
for the press itself. Pure Python: no TensorFlow.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["check", "forward", "guarded", "hold", "iterating", "notice", "passed", "release"]

F = TypeVar("F", bound=Callable[..., Any])

# The code of the functions in which a press is the loader's (`guarded`).
_GUARDED: set[types.CodeType] = set()
_lock = threading.RLock()  # `release` may run in a collection inside `hold`
_MARK = "_resumeloader_notes_ctrl_c"  # on the hook `notice` installs
_holds = 0  # live loops
# A KeyboardInterrupt of the main thread was reported unraisable since the last check.
_ignored = False
# ... while a ``dataset()`` iteration was live: `forward` signals it again.
_forwarding = False
_iterations = 0  # live ``dataset()`` iterations (`iterating`)
# The KeyboardInterrupt of the last press that landed in the loader's code, until it is
# seen leaving it (`passed`) or raised again (`check`).
_pressed: KeyboardInterrupt | None = None


def guarded(function: F) -> F:
    """Marks `function` as the loader's code: a press while it runs (in the main thread,
    itself or anything it calls) is noted, and raised again if it does not leave it."""
    _GUARDED.add(function.__code__)
    return function


def notice() -> None:
    """Installs the ``sys.unraisablehook`` that notes an ignored Ctrl-C, around the one
    installed (again if another replaced it; cheap when it is in place)."""
    if getattr(sys.unraisablehook, _MARK, False):
        return
    with _lock:
        previous = sys.unraisablehook
        if getattr(previous, _MARK, False):
            return

        def hook(unraisable: Any) -> None:
            global _ignored, _forwarding
            error = unraisable.exc_value
            if threading.current_thread() is threading.main_thread() and _carries_ctrl_c(
                unraisable.exc_type if error is None else error
            ):
                _forwarding = _forwarding or _iterations > 0
                _ignored = True  # raising here would be reported too
                return
            previous(unraisable)

        setattr(hook, _MARK, True)
        sys.unraisablehook = hook


def _carries_ctrl_c(error: Any) -> bool:
    """Whether `error` is a KeyboardInterrupt or has one in its causes or contexts."""
    return error is KeyboardInterrupt or _chained(
        error, lambda link: isinstance(link, KeyboardInterrupt)
    )


def _chained(error: Any, found: Callable[[BaseException], bool]) -> bool:
    """Whether `found` holds for `error` or an error in its causes or contexts."""
    links, seen = [error], set()
    while links:
        link = links.pop()
        if not isinstance(link, BaseException) or id(link) in seen:
            continue
        if found(link):
            return True
        seen.add(id(link))
        links += (link.__cause__, link.__context__)
    return False


def _handler(signum: int, frame: types.FrameType | None) -> None:
    """SIGINT while a loop is live: Python's KeyboardInterrupt, noted if the press landed
    in the loader's code."""
    global _pressed
    error = KeyboardInterrupt()
    while frame is not None:
        if frame.f_code in _GUARDED:
            _pressed = error
            break
        frame = frame.f_back
    del frame
    raise error


def hold() -> None:
    """A loop began: until its `release`, presses in the loader's code are noted (from
    the main thread, if the SIGINT handler is Python's default one)."""
    global _holds
    notice()
    with _lock:
        _holds += 1
        if threading.current_thread() is threading.main_thread():
            try:
                if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                    signal.signal(signal.SIGINT, _handler)
            except ValueError:  # not the main interpreter
                pass


def release() -> None:
    """A loop ended: the last one puts Python's default SIGINT handler back (if the
    handler is still this module's, and from the main thread; otherwise this module's
    stays, and acts as the default one outside the loader's code)."""
    global _holds, _pressed
    with _lock:
        _holds = max(0, _holds - 1)
        if _holds:
            return
        _pressed = None
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGINT) is _handler:
                signal.signal(signal.SIGINT, signal.default_int_handler)
        except (ValueError, TypeError):  # not the main interpreter; at shutdown
            pass


def passed(error: BaseException) -> bool:
    """`error` leaves the loader's code: whether a noted press was lost into it (it is not
    a KeyboardInterrupt: TensorFlow raised a SystemError from the press's, or the press's
    was cleared and `error` came later), so the caller raises KeyboardInterrupt from it."""
    global _pressed
    if _pressed is None or threading.current_thread() is not threading.main_thread():
        return False
    _pressed = None
    return not isinstance(error, KeyboardInterrupt)


def check() -> None:
    """Raises KeyboardInterrupt in the main thread if a Ctrl-C was lost since the last
    check (reported unraisable, or pressed in the loader's code and not seen leaving it)."""
    global _ignored, _forwarding, _pressed
    if not (_ignored or _pressed is not None):
        return
    if threading.current_thread() is not threading.main_thread():
        return
    pressed = _pressed
    leaving = sys.exc_info()[1]
    with _lock:  # not also signalled again by `forward`
        ignored = _ignored
        if not ignored and _chained(leaving, lambda link: link is pressed):
            return  # leaving now (this check runs in a `finally` or an `except` it passes)
        _ignored, _forwarding, _pressed = False, False, None
    if ignored or pressed is not None:
        raise KeyboardInterrupt


@contextlib.contextmanager
def iterating() -> Iterator[None]:
    """A ``dataset()`` iteration is live (its generator, in a TensorFlow thread): a
    Ctrl-C the main thread loses meanwhile is noted for `forward` (one lost before is
    left to `check`: it is not this iteration's)."""
    global _iterations
    notice()
    with _lock:
        _iterations += 1
    try:
        yield
    finally:
        with _lock:
            _iterations -= 1


def forward() -> None:
    """From a thread other than the main one: a Ctrl-C lost while a ``dataset()``
    iteration was live (its KeyboardInterrupt reported unraisable in the main thread) is
    signalled to the main thread again, once; its SIGINT handler runs at its next
    bytecode. A ``dataset()`` generator's steps call it (the main thread runs none of
    the loader's code there)."""
    global _ignored, _forwarding
    if not _forwarding or threading.current_thread() is threading.main_thread():
        return
    with _lock:
        if not (_forwarding and _ignored):
            return
        _ignored = _forwarding = False
    _thread.interrupt_main()
