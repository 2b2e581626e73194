"""A Ctrl-C that TensorFlow's C++ loses while a ``for batch in loader`` makes a batch in
the main thread: the loop raises KeyboardInterrupt all the same, hands out nothing more,
and puts Python's SIGINT handler back (`resumeloader.core.interrupts`). And a Ctrl-C
whose KeyboardInterrupt a garbage-collector callback of the main thread loses while a
``dataset()`` iteration runs: the iteration's generator signals it to the main thread
again, and the loop over the dataset ends with KeyboardInterrupt.

The press is ``signal.raise_signal(SIGINT)`` in Python that ``tf.nest.flatten``'s C++
calls: its type checks ask a new class for ``__attrs_attrs__`` and clear any error; or
in a garbage-collector callback, where CPython only reports an error.
"""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import _collector
import _limits
import _presses
import numpy as np
import pytest
import tensorflow as tf

from resumeloader import ResumableLoader, Workers
from resumeloader.tfdata import prefetch


class _PressedWhenAsked(type):
    """A class that asked for ``__attrs_attrs__`` gets a Ctrl-C there."""

    def __getattr__(cls, name: str):
        if name == "__attrs_attrs__":
            signal.raise_signal(signal.SIGINT)
        raise AttributeError(name)


def _flatten_pressed() -> list:
    """``tf.nest.flatten`` of a leaf of a new class (TensorFlow caches its checks per class):
    Ctrl-C lands in its C++ type check."""
    leaf = _PressedWhenAsked("Leaf", (), {})()
    return tf.nest.flatten([leaf, 1])


def test_tf_nest_flatten_loses_ctrl_c_landing_in_its_type_check():
    """The premise, TensorFlow 2.21: ``tf.nest.flatten`` returns normally, its
    KeyboardInterrupt lost (under Python's own SIGINT handler)."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert len(_flatten_pressed()) == 2


def test_loop_raises_ctrl_c_tf_nest_lost_while_its_batch_was_made():
    """0 workers, no prefetch: the map_fn of record 20 (the third batch) runs in the main
    thread and TensorFlow loses a Ctrl-C there; the loop raises KeyboardInterrupt instead
    of handing that batch out, and resumes at it."""

    pressed = []

    def map_fn(record, rng):
        if int(record) == 20 and not pressed:  # once: not again when resumed
            pressed.append(_flatten_pressed())
        return np.float32(record)

    data = np.arange(64, dtype=np.int64)
    options = dict(batch_size=8, seed=0, shuffle=False, map_fn=map_fn, prefetch=0)
    loader = ResumableLoader(data, workers=Workers(0), **options)
    handed = []
    with pytest.raises(KeyboardInterrupt):
        for batch in loader:
            handed.append(batch.numpy())
    assert len(handed) == 2 and len(pressed) == 1
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    resumed = ResumableLoader(data, workers=Workers(0), **options)
    resumed.set_state(loader.get_state())
    assert next(iter(resumed)).numpy().tolist() == list(range(16, 24))


def _press_in_gc_callback(phase: str, info: dict) -> None:
    """A gc callback that, armed, gets a Ctrl-C at the end of the next collection: as a
    SIGINT arriving while the main thread collects, whose KeyboardInterrupt is raised in
    the first Python that runs next, a callback (JAX registers one; TensorFlow 2.21
    imports JAX when it is installed). CPython reports it "ignored" and goes on."""
    if phase == "stop" and _ARMED:
        _ARMED.clear()
        signal.raise_signal(signal.SIGINT)


_ARMED: list[bool] = []


def test_gc_callback_loses_ctrl_c(monkeypatch):
    """The premise: a KeyboardInterrupt raised in a gc callback does not leave
    ``gc.collect()`` (under Python's own SIGINT handler): it is only reported."""
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    _collector.assert_collects()
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda r: reported.append(r.exc_type))
    gc.callbacks.append(_press_in_gc_callback)
    try:
        _ARMED.append(True)
        gc.collect()
    finally:
        gc.callbacks.remove(_press_in_gc_callback)
    assert not _ARMED  # pressed, and lost: gc.collect() returned
    assert reported == [KeyboardInterrupt]


@pytest.mark.parametrize(
    "workers", [Workers(0), Workers(2, kind="thread")], ids=["0-workers", "2-threads"]
)
def test_dataset_iteration_raises_ctrl_c_lost_in_a_gc_callback(workers):
    """A ``dataset()`` iteration (``from_generator``: TensorFlow's threads run the
    generator) with a Ctrl-C lost in a gc callback of the main thread after the second
    batch: the loop over the dataset ends with KeyboardInterrupt, not at the end of the
    stream (64 batches), and resumes at the first batch not advanced."""

    def map_fn(record, rng):
        return np.float32(record)

    data = np.arange(512, dtype=np.int64)
    options = dict(
        batch_size=8, seed=0, shuffle=False, num_epochs=1, map_fn=map_fn, workers=workers
    )
    loader = ResumableLoader(data, **options)
    handed = []
    _collector.assert_collects()
    gc.callbacks.append(_press_in_gc_callback)
    try:
        with pytest.raises(KeyboardInterrupt):
            for batch in loader.dataset():
                loader.advance()
                handed.append(batch.numpy())
                if len(handed) == 2:
                    _ARMED.append(True)
                    gc.collect()
                    assert not _ARMED  # pressed, and lost in the callback
    finally:
        _ARMED.clear()
        gc.callbacks.remove(_press_in_gc_callback)
    assert 2 <= len(handed) < 64
    assert np.concatenate(handed).tolist() == list(range(8 * len(handed)))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    resumed = ResumableLoader(data, **options)
    resumed.set_state(loader.get_state())
    start = loader.position  # the batches advanced for (the interrupt may land in between)
    assert 16 <= start <= 8 * len(handed) + 8
    assert next(iter(resumed.dataset())).numpy().tolist() == list(range(start, start + 8))


def test_prefetch_ctrl_c_anywhere_in_the_wait_for_a_batch_leaves_its_cleanup_unblocked():
    """A KeyboardInterrupt raised as any C call of the prefetch's wait for its next batch
    returns (`_presses`): the KeyboardInterrupt leaves the prefetch, whose cleanup returns
    and stops its producer thread. With a ``queue.Queue`` the press as its lock was taken
    left the lock held, and the cleanup's drain waited for it forever: the job hung after
    one Ctrl-C. In a process of its own: a press can land in a finalizer that a garbage
    collection runs during the pressed call, and what that leaves (in the CI run where it
    ran in the suite's process, every later ``gc.collect()`` of that process did nothing)
    must not reach the other tests."""
    here = Path(__file__).resolve().parent
    code = (f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]; "
            "import test_ctrl_c_in_tensorflow as t; t.press_the_prefetch_everywhere()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=_limits.PROCESS, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert result.stdout.strip().splitlines()[-1] == "pressed and stopped"


def press_the_prefetch_everywhere() -> None:
    """The test above, in its own process: prints "pressed and stopped" when every press
    left the prefetch's cleanup unblocked and its producer thread stopped."""
    producers: list[threading.Thread] = []

    def make():
        def batches():
            producers.append(threading.current_thread())
            yield from (np.full(4, i, np.int64) for i in range(3))

        made = prefetch.prefetched(batches, depth=2)
        assert next(made).numpy().tolist() == [0] * 4
        return made, lambda: next(made)

    pressed: list[Any] = []
    presser = threading.Thread(
        target=lambda: pressed.extend(_presses.everywhere(make)), daemon=True
    )
    presser.start()
    presser.join(_limits.EXIT)
    assert not presser.is_alive()
    assert len(pressed) >= 3  # the wait's own calls, the queue's get, the place given back
    for producer in producers:
        producer.join(_limits.EXIT)
        assert not producer.is_alive()
    print("pressed and stopped", flush=True)
