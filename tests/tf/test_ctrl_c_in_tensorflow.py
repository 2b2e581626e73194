"""A Ctrl-C that TensorFlow's C++ loses while a ``for batch in loader`` makes a batch in
the main thread: the loop raises KeyboardInterrupt all the same, hands out nothing more,
and puts Python's SIGINT handler back (`resumeloader.core.interrupts`).

The press is ``signal.raise_signal(SIGINT)`` in Python that ``tf.nest.flatten``'s C++
calls: its type checks ask a new class for ``__attrs_attrs__`` and clear any error.
"""

from __future__ import annotations

import signal

import numpy as np
import pytest
import tensorflow as tf

from resumeloader import ResumableLoader, Workers


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
