"""`resumeloader.core.interrupts`: a Ctrl-C that C code loses in the loader's code, or
reports as unraisable, is raised again by the loader; one the loop's body catches is not;
a SIGINT handler of yours is never replaced; one lost while a ``dataset()`` iteration is
live is signalled to the main thread again by the iteration's generator (`forward`).

A press is `signal.raise_signal(SIGINT)`: the handler runs in it, in the main thread.
`swallowing` models TensorFlow's C++ (``tf.nest``): it calls Python that the press
interrupts and discards the error.
"""

from __future__ import annotations

import contextlib
import gc
import queue
import signal
import threading

import pytest

from resumeloader.core import interrupts, waits
from resumeloader.handout import loop


def swallowing() -> None:
    """A Ctrl-C lands in code that discards its KeyboardInterrupt (as TensorFlow's C++)."""
    with contextlib.suppress(BaseException):  # the point: the error is lost here
        signal.raise_signal(signal.SIGINT)


def ready(item: object) -> queue.Queue[object]:
    """A queue holding `item`: a wait that does not raise returns it at once."""
    slots: queue.Queue[object] = queue.Queue()
    slots.put(item)
    return slots


def iter_of(items: list[tuple[str, int]]):
    """A generator of `items` (the loop closes its batches)."""
    yield from items


@pytest.fixture(autouse=True)
def _no_loop_left():
    """Loops other tests abandoned are closed first (they hold the noting handler)."""
    gc.collect()


@pytest.fixture
def held():
    """A live loop's hold (the SIGINT handler noting presses), released after the test."""
    interrupts.hold()
    yield
    interrupts.release()


@interrupts.guarded
def loader_code_swallowing_then_waiting(slots: queue.Queue[object]) -> object:
    swallowing()
    return waits.get(slots)


def test_wait_after_ctrl_c_swallowed_in_loader_code_raises_keyboard_interrupt(held):
    """A press lost by code the loader calls: the wait after it raises KeyboardInterrupt
    instead of returning the item (it would wait for a stalled producer forever)."""
    with pytest.raises(KeyboardInterrupt):
        loader_code_swallowing_then_waiting(ready("batch"))
    assert waits.get(ready("next")) == "next"  # raised once


def test_loop_next_whose_batch_code_swallows_ctrl_c_raises_and_closes():
    """``next(loop)`` whose batch is made by code that loses a press raises
    KeyboardInterrupt, the batch not handed out and the loop closed."""
    ended = []

    def batches():
        swallowing()
        yield "a", 2

    live = loop.EagerLoop(batches(), 0, origin="test:1", on_close=ended.append)
    with pytest.raises(KeyboardInterrupt):
        next(live)
    assert ended == [live] and (live.position, live.handed_out) == (0, 0)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_loop_next_whose_code_turns_ctrl_c_into_another_error_raises_keyboard_interrupt():
    """A press its batch's code turns into another error (TensorFlow's SystemError)
    ends the loop with KeyboardInterrupt raised from that error."""

    def batches():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt as err:
            raise SystemError("returned a result with an exception set") from err
        yield "a", 2

    live = loop.EagerLoop(batches(), 0, origin="test:1", on_close=lambda _: None)
    with pytest.raises(KeyboardInterrupt) as raised:
        next(live)
    assert isinstance(raised.value.__cause__, SystemError) and not live.live


def _loop(*items: tuple[str, int]) -> loop.EagerLoop:
    return loop.EagerLoop(iter_of(list(items)), 0, origin="test:1", on_close=lambda _: None)


def test_ctrl_c_caught_by_loop_body_is_not_raised_again():
    """A KeyboardInterrupt the loop's body catches is the body's: the next batch comes."""
    live = _loop(("a", 2), ("b", 4))
    assert next(live) == "a"
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)  # in the body, caught there
    assert next(live) == "b"
    live.close()


def test_ctrl_c_leaving_loader_code_is_raised_once():
    """A press in the loader's code that leaves it as KeyboardInterrupt is delivered:
    the waits after it return."""
    live = loop.EagerLoop(_pressing(), 0, origin="test:1", on_close=lambda _: None)
    with pytest.raises(KeyboardInterrupt):
        next(live)
    assert waits.get(ready("item")) == "item"


def _pressing():
    signal.raise_signal(signal.SIGINT)
    yield "a", 2


class Collected:
    """Reports, when collected, a SystemError caused by a Ctrl-C (as TensorFlow's C++
    reports one raised in the Python it calls: unraisable)."""

    def __del__(self) -> None:
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt as err:
            raise SystemError("<built-in function __import__> returned a result") from err


def test_wait_after_error_caused_by_ctrl_c_reported_unraisable_raises_keyboard_interrupt():
    """An error carrying a KeyboardInterrupt as its cause, reported unraisable in the
    main thread: the next wait raises KeyboardInterrupt (once)."""
    interrupts.notice()
    Collected()
    with pytest.raises(KeyboardInterrupt):
        waits.get(ready("item"))
    assert waits.get(ready("item")) == "item"


def _forwarding_thread() -> threading.Thread:
    """A thread that calls `interrupts.forward` (as a ``dataset()`` generator's step)."""
    return threading.Thread(target=interrupts.forward)


def test_press_lost_during_a_dataset_iteration_is_signalled_to_the_main_thread_again():
    """A Ctrl-C reported unraisable in the main thread while a ``dataset()`` iteration is
    live: another thread's `forward` signals it again, and the main thread raises
    KeyboardInterrupt at its next bytecode (once: a wait after it returns)."""
    interrupts.notice()
    with interrupts.iterating():
        Collected()  # the press, lost
        thread = _forwarding_thread()
        with pytest.raises(KeyboardInterrupt):
            thread.start()
            thread.join()  # raises once the thread signalled it, at the latest after
            sum(range(3))
    thread.join()
    assert waits.get(ready("item")) == "item"


def test_press_lost_before_a_dataset_iteration_is_left_to_the_next_wait():
    """A press lost while no ``dataset()`` iteration is live is not that iteration's to
    signal again: `forward` does nothing, the main thread's next wait raises it."""
    interrupts.notice()
    Collected()  # the press, lost
    with interrupts.iterating():
        thread = _forwarding_thread()
        thread.start()
        thread.join()
        assert sum(range(3)) == 3  # not signalled again
    with pytest.raises(KeyboardInterrupt):
        waits.get(ready("item"))


def test_sigint_handler_of_yours_is_kept_while_a_loop_is_live():
    """A SIGINT handler other than Python's default is never replaced, nor restored."""

    def mine(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, mine)
    try:
        live = _loop(("a", 2))
        assert next(live) == "a"
        assert signal.getsignal(signal.SIGINT) is mine
        live.close()
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)


def test_default_sigint_handler_is_back_when_the_last_of_two_loops_ends():
    """Two live loops share the noting handler; the last to end puts the default back."""
    first = _loop(("a", 2))
    second = _loop(("b", 2))
    next(first), next(second)
    noting = signal.getsignal(signal.SIGINT)
    first.close()
    assert noting is not signal.default_int_handler
    assert signal.getsignal(signal.SIGINT) is noting
    second.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
