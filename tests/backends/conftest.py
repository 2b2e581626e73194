"""The Keras backend tier: tests of the Keras integration written once for every backend.

They run in the suite's own processes on the TensorFlow backend, and the whole tier
once more under ``KERAS_BACKEND=jax`` and once under ``KERAS_BACKEND=torch``, each in
one pytest process of its own (`tests/test_keras_backends.py` starts them; Keras fixes
its backend when it is imported). ``KERAS_BACKEND`` tells which one runs.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras


@pytest.fixture(autouse=True)
def _clean_keras():
    """Keras' global state (name counters, graphs) cleared after every test."""
    yield
    keras.backend.clear_session(free_memory=True)
