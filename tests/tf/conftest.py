"""The TensorFlow tier's setup: quiet TensorFlow, two logical CPUs for tf.distribute
tests, and clean Keras/TensorFlow global state between tests (they share one process)."""

from __future__ import annotations

import contextlib
import gc
import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

_cpus = tf.config.list_physical_devices("CPU")
# Not list_logical_devices: it initialises the runtime, after which the split fails.
if _cpus and tf.config.get_logical_device_configuration(_cpus[0]) is None:
    # RuntimeError: the runtime was initialised already (e.g. by a plugin).
    with contextlib.suppress(RuntimeError):
        tf.config.set_logical_device_configuration(
            _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )


@pytest.fixture(autouse=True)
def _no_strategy_left():
    """Every test leaves no tf.distribute strategy scope open (checked, it costs nothing)."""
    yield
    assert not tf.distribute.has_strategy(), "a test left a tf.distribute strategy scope open"


@pytest.fixture
def clean_keras():
    """Clears Keras' session (graph, name counters) and collects the garbage of strategies
    and iterators (they hold threads and devices) after the test. It costs ~0.15 s, so
    the modules that build models or strategies use it: ``pytestmark =
    pytest.mark.usefixtures("clean_keras")``."""
    yield
    if "keras" in sys.modules:
        import keras

        keras.backend.clear_session(free_memory=True)
    else:
        gc.collect()
