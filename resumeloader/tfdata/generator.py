"""``Dataset.from_generator`` without TensorFlow's eager-mode leak of the generator.

In eager mode TensorFlow (2.21 and earlier) keeps every ``from_generator`` callable
alive for the life of the process (``script_ops`` appends it to the global graph's
``_py_funcs_used_in_graph``), and with it everything it references: the loader, its
source and its worker processes would never be garbage collected. Here TensorFlow
gets a callable that holds the real one only weakly, and the dataset object holds it
strongly: a dataset and its iterators (which keep their dataset) work as before, and
once the user drops them and the loader, the loader is collected and its workers stop.

Inside a ``tf.function`` the dataset object only lives while tracing, yet the traced
graph calls the generator later: there the callable is passed on as is.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

__all__ = ["from_generator"]

_ATTRIBUTE = "_resumeloader_generator"


def from_generator(make: Callable[[], Iterator[Any]], output_signature: Any) -> tf.data.Dataset:
    """``tf.data.Dataset.from_generator(make, output_signature=...)``, see the module docstring."""
    if tf.inside_function():
        return tf.data.Dataset.from_generator(make, output_signature=output_signature)
    ref = weakref.ref(make)

    def generate() -> Iterator[Any]:
        target = ref()
        if target is None:  # only reachable through TensorFlow's leaked reference
            msg = "This dataset's loader was garbage collected; keep the dataset referenced."
            raise RuntimeError(msg)
        return target()

    ds = tf.data.Dataset.from_generator(generate, output_signature=output_signature)
    # Not a tracked attribute: the dataset must not gain checkpoint dependencies.
    object.__setattr__(ds, _ATTRIBUTE, make)
    return ds
