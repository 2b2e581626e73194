"""The Keras backend a fit runs on, and Keras variables as NumPy arrays on any backend.

Keras 3 trains on TensorFlow, JAX or PyTorch (``KERAS_BACKEND``) and takes a
``tf.data.Dataset`` on each, so the loader feeds every one of them. What differs is
where a model's state lives: TensorFlow variables, which ``tf.train.Checkpoint``
tracks, or JAX / PyTorch arrays, which it cannot. Everything the integration saves
besides a ``tf.train.Checkpoint`` goes through the arrays of this module: exact
copies (bytes and dtype) of the variables' values, assigned back as they were.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
import numpy as np

__all__ = ["assign", "is_tensorflow", "name", "values"]


def name() -> str:
    """The Keras backend: ``"tensorflow"``, ``"jax"``, ``"torch"`` (or ``"numpy"``)."""
    return str(keras.backend.backend())


def is_tensorflow() -> bool:
    """True when Keras runs on TensorFlow (its variables are ``tf.Variable``s)."""
    return name() == "tensorflow"


def values(variables: Sequence[Any]) -> list[np.ndarray]:
    """The current values of Keras `variables` as NumPy arrays (copies).

    On JAX read them through a callback's ``self.model``, which writes the training
    state back into the variables first (Keras keeps it apart during an epoch).
    """
    # The variable's own conversion (it also reads a tf.distribute variable, whose
    # value is per replica), called directly: NumPy 2 warns through np.array(variable).
    return [np.array(v.__array__()) for v in variables]


def assign(variables: Sequence[Any], arrays: Sequence[np.ndarray]) -> None:
    """Assigns `arrays` (as `values` returned them) to `variables`, in order."""
    for variable, array in zip(variables, arrays, strict=True):
        variable.assign(np.asarray(array, dtype=np.dtype(variable.dtype)))
