"""Ctrl-C at every point of a call, deterministically: KeyboardInterrupt raised as the
n-th C call made in it returns, for n = 1, 2, ... until the call returns by itself.

CPython runs a pending SIGINT handler at its next check for one, and there is one right
after each call returns: a real Ctrl-C can raise KeyboardInterrupt as any C call
returns - a lock's acquire included, before the code that took the lock can release it.
A profile function (``sys.setprofile``: the calling thread only) that raises at a
``c_return`` event makes that call raise the same way. No TensorFlow here.

The garbage collector is off while a call is pressed: a collection it started would run
the finalizers of earlier tests' objects in the pressed thread, and a press landing in one
of them (a thread's join, a pool's stop) can leave a lock held that a later finalizer
waits for inside a later collection - after which no collection of the process runs
(CPython skips ``gc.collect()`` while one is under way), no loader is finalised, and
every later test that counts on it fails (a CI run's test worker did so).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

#: More C calls than any call pressed here makes (a bound on the loop, not a limit).
MOST_CALLS = 1000


def pressed(n: int, call: Callable[[], Any]) -> bool:
    """Runs `call` with KeyboardInterrupt raised as its `n`-th C call returns: whether it
    was raised (False: `call` made fewer C calls and returned)."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "c_return":
            count += 1
            if count == n:
                sys.setprofile(None)
                raise KeyboardInterrupt

    collecting = gc.isenabled()
    gc.collect()
    gc.disable()
    sys.setprofile(profile)
    try:
        call()
    except KeyboardInterrupt:
        return True
    finally:
        sys.setprofile(None)
        if collecting:
            gc.enable()
    return False


def everywhere(make: Callable[[], tuple[T, Callable[[], Any]]]) -> Iterator[T]:
    """For n = 1, 2, ...: ``subject, call = make()`` (fresh each time), `call` pressed as
    its n-th C call returns, then `subject` yielded (to check what the press left), until
    a `call` returns without a press. One call runs unpressed first, so that one-time
    set-up (the unraisable hook of `resumeloader.core.interrupts`) is not in the calls
    pressed: each n then presses the same call of the same sequence."""
    make()[1]()
    for n in range(1, MOST_CALLS):
        subject, call = make()
        if not pressed(n, call):
            return
        yield subject
    raise AssertionError(f"still pressed after {MOST_CALLS} C calls")
