"""The Keras backend tier: tests of the Keras integration written once for every backend.

They run in the suite's own processes on the TensorFlow backend, and each under
``KERAS_BACKEND=jax`` and ``KERAS_BACKEND=torch`` in a pytest process of its own
(`test_suite_under_other_backends.py` starts them; the backend is fixed when Keras
is imported). ``KERAS_BACKEND`` tells which one runs.
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
