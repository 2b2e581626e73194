"""Shared test setup: quiet TensorFlow, two logical CPUs for tf.distribute tests."""

from __future__ import annotations

import contextlib
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # the environment above must be set first

_cpus = tf.config.list_physical_devices("CPU")
# Not list_logical_devices: it initialises the runtime, after which the split fails.
if _cpus and tf.config.get_logical_device_configuration(_cpus[0]) is None:
    # RuntimeError: the runtime was initialised already (e.g. by a plugin).
    with contextlib.suppress(RuntimeError):
        tf.config.set_logical_device_configuration(
            _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
