"""`resumeloader.core.waits`: the waits return what the stdlib's do, and a Ctrl-C whose
handler ran while the main thread was already blocked in one still raises there; `Slots`
hand items over in order, and a Ctrl-C raised anywhere in their consumer's wait leaves
no lock held (`_presses`: at each C call's return)."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent import futures

import _limits
import _presses
import pytest

from resumeloader.core import waits


def later(seconds: float, call, *args) -> threading.Thread:
    """`call(*args)` in a thread after `seconds` (past several of the waits' slices)."""
    thread = threading.Thread(target=lambda: (time.sleep(seconds), call(*args)), daemon=True)
    thread.start()
    return thread


def test_get_item_put_after_several_slices_is_returned():
    """`get` waits past its slices for the item and returns it."""
    slots: queue.Queue[str] = queue.Queue()
    later(3 * waits.SLICE_SECONDS, slots.put, "item")
    assert waits.get(slots) == "item"


def test_result_set_after_several_slices_is_returned():
    """`result` without a timeout waits past its slices for the result."""
    future: futures.Future[int] = futures.Future()
    later(3 * waits.SLICE_SECONDS, future.set_result, 7)
    assert waits.result(future) == 7


def test_result_task_raising_timeout_error_raises_it_at_once():
    """A task's own TimeoutError is raised as it is, not taken for the wait's timeout."""
    future: futures.Future[int] = futures.Future()
    error = TimeoutError("the task's own")
    future.set_exception(error)
    with pytest.raises(TimeoutError) as raised:
        waits.result(future)
    assert raised.value is error


def test_result_not_done_within_timeout_raises_timeout_error():
    """A result not there within `timeout` raises TimeoutError (a timeout of 0 included)."""
    future: futures.Future[int] = futures.Future()
    with pytest.raises(TimeoutError):
        waits.result(future, 0.0)
    with pytest.raises(TimeoutError):
        waits.result(future, 1.5 * waits.SLICE_SECONDS)
    assert not future.done()


def test_join_thread_ending_after_several_slices_returns():
    """`join` returns once the thread has ended."""
    thread = later(3 * waits.SLICE_SECONDS, lambda: None)
    waits.join(thread)
    assert not thread.is_alive()


# The main thread blocks in one of the waits for something that never comes; another
# thread, once the main thread is blocked (the same instruction of the same frame at 3
# looks 10 ms apart), sends SIGINT to itself: Python's C handler runs there, and only
# the main thread's own return to Python can raise KeyboardInterrupt. A wait blocking
# without a timeout (``slots.get()``) never returns: the process would hang.
SCRIPT = textwrap.dedent("""
    import queue, signal, sys, threading, time
    from concurrent import futures
    from resumeloader.core import waits

    def interrupt_when_main_thread_blocks():
        main = threading.main_thread().ident
        seen, same = None, 0
        while same < 3:
            time.sleep(0.01)
            frame = sys._current_frames()[main]
            where = (frame, frame.f_lasti)
            same = same + 1 if where == seen else 0
            seen = where
        del frame, seen, where
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    threading.Thread(target=interrupt_when_main_thread_blocks, daemon=True).start()
    wait = sys.argv[1]
    if wait == "get":
        waits.get(queue.Queue())
    elif wait == "result":
        waits.result(futures.Future())
    else:
        sleeper = threading.Thread(target=time.sleep, args=(3600,), daemon=True)
        sleeper.start()
        waits.join(sleeper)
""")


@pytest.mark.parametrize("wait", ["get", "result", "join"])
def test_wait_blocked_when_sigint_handled_in_another_thread_raises_keyboard_interrupt(wait):
    """A SIGINT handled while the main thread is blocked in the wait (in another
    thread, as when it lands just before the wait blocks): KeyboardInterrupt in the main
    thread, the process exits by SIGINT (bounded: `_limits.EXIT`)."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, wait], capture_output=True, text=True,
        timeout=_limits.EXIT,
    )
    assert done.returncode == -signal.SIGINT, done.stderr
    assert done.stderr.rstrip().endswith("KeyboardInterrupt")


# Ctrl-C during a garbage collector callback or a ``__del__`` of the main thread: its
# KeyboardInterrupt is raised there and only printed ("Exception ignored in"); the main
# thread then waits for something that never comes.
IGNORED = textwrap.dedent("""
    import queue, signal
    from resumeloader.core import waits

    ready = queue.Queue()
    ready.put(None)
    waits.get(ready)  # a loop's first batch

    class Collected:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # Ctrl-C while the collector runs this

    Collected()
    waits.get(queue.Queue())
""")


def test_wait_after_keyboard_interrupt_ignored_in_del_raises_keyboard_interrupt():
    """A KeyboardInterrupt raised and ignored in a ``__del__`` of the main thread is
    raised again, so the wait that follows ends (bounded: `_limits.EXIT`)."""
    done = subprocess.run(
        [sys.executable, "-c", IGNORED], capture_output=True, text=True, timeout=_limits.EXIT,
    )
    assert done.returncode == -signal.SIGINT, done.stderr
    assert "Exception ignored" not in done.stderr
    assert done.stderr.rstrip().endswith("KeyboardInterrupt")


def test_slots_hand_items_over_in_order_and_a_stopped_producer_leaves():
    """`Slots`: the items in the order put, `qsize` those waiting; a producer told to stop
    while every place is taken leaves without putting (put returns False)."""
    slots: waits.Slots[int] = waits.Slots(2)
    stop = threading.Event()
    assert slots.put(0, stop) and slots.put(1, stop)
    assert slots.qsize() == 2
    stop.set()
    assert slots.put(2, stop) is False
    assert [slots.get(), slots.get(), slots.qsize()] == [0, 1, 0]


def test_slots_producer_waits_for_a_free_place():
    """With `depth` items waiting, the producer's next put returns once the consumer took
    one (past several of its slices)."""
    slots: waits.Slots[int] = waits.Slots(1)
    stop = threading.Event()
    assert slots.put(0, stop)
    producer = threading.Thread(target=slots.put, args=(1, stop), daemon=True)
    producer.start()
    later(3 * waits.SLICE_SECONDS, lambda: None).join()
    assert slots.get() == 0
    assert slots.get() == 1
    waits.join(producer)


def _cleanup_ends(cleanup) -> bool:
    """Whether `cleanup` returns (in another thread, bounded: `_limits.EXIT`). A lock left
    held by the press would block it forever."""
    thread = threading.Thread(target=cleanup, daemon=True)
    thread.start()
    thread.join(_limits.EXIT)
    return not thread.is_alive()


def test_queue_get_ctrl_c_as_its_lock_is_taken_leaves_the_lock_held():
    """The premise: a KeyboardInterrupt raised as ``queue.Queue.get``'s first C call
    returns (the lock's acquire in ``Condition.__enter__``, before ``with`` holds it)
    leaves the queue's lock held: draining the queue (``get_nowait`` takes the lock,
    blocking) would wait for it forever."""
    slots: queue.Queue[str] = queue.Queue(maxsize=2)
    slots.put("item")
    assert _presses.pressed(1, lambda: slots.get(timeout=1))
    assert not slots.mutex.acquire(blocking=False)
    slots.mutex.release()


def test_slots_ctrl_c_anywhere_in_get_leaves_nothing_held():
    """A KeyboardInterrupt raised as any C call of `Slots.get` returns (the item waiting
    or not): the consumer's cleanup (`clear`) returns, and the producer, told to stop,
    leaves."""
    def make(waiting: bool):
        slots: waits.Slots[str] = waits.Slots(2)
        if waiting:
            slots.put("item", threading.Event())
        else:  # the item comes after a slice: the wait's loop pressed too
            later(1.5 * waits.SLICE_SECONDS, slots.put, "item", threading.Event())
        return slots, slots.get

    for waiting in (True, False):
        presses = 0
        for slots in _presses.everywhere(lambda: make(waiting)):  # noqa: B023
            presses += 1
            stop = threading.Event()
            stop.set()
            assert _cleanup_ends(slots.clear), presses
            assert slots.qsize() == 0 and slots.put("late", stop) is False
        assert presses >= 3  # the wait's own calls, the queue's get, the place given back
