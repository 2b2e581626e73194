"""Shared test setup: quiet TensorFlow, two logical CPUs for tf.distribute tests, and
clean Keras/TensorFlow global state between tests (they share one process)."""

from __future__ import annotations

import contextlib
import gc
import os
import sys

import pytest
from _objstore_fixtures import gcs_store, s3_store, store  # noqa: F401 (session fixtures)

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


# Modules whose every test starts TensorFlow subprocesses; with the tests marked
# `slow`, they run first.
_SLOW_MODULES = {"test_kill.py", "test_notebook.py", "test_faults.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs the subprocess tests first (the order within each group kept): with two
    xdist workers stealing work, the suite then ends on short tests on both workers
    instead of one worker finishing a long kill test while the other idles."""

    def slow(item: pytest.Item) -> bool:
        return item.get_closest_marker("slow") is not None or item.path.name in _SLOW_MODULES

    items.sort(key=lambda item: not slow(item))
