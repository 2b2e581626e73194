"""``Dataset.from_generator`` without TensorFlow's eager-mode leak of the generator.

In eager mode TensorFlow (2.21 and earlier) keeps every ``from_generator`` callable
alive for the life of the process (``script_ops`` appends it to the global graph's
``_py_funcs_used_in_graph``), and with it everything it references: the loader, its
source and its worker processes would never be garbage collected. Here TensorFlow
gets a callable that holds the real one only weakly; the dataset object and the
loader's `keep` list hold it strongly. So a dataset works as long as it or its loader
lives (its iterators keep it; a dataset TensorFlow rebuilt from its graph, e.g. for
distribution, needs the loader), and once the user drops both, the loader is
collected and its workers stop.

Inside a ``tf.function`` the dataset object only lives while tracing, yet the traced
graph calls the generator later: there the callable is passed on as is.

Every step of the generator runs `exiting.busy` and ends its iteration once the
interpreter exits (`resumeloader.core.exiting`): TensorFlow's threads call it inside a
``py_func``, and one still in Python when CPython finalizes hangs the exit. Every step
also signals a Ctrl-C the main thread lost again (`interrupts.forward`: its
KeyboardInterrupt raised in a garbage-collector callback, say), so a loop over the
dataset ends with KeyboardInterrupt as it would without the loss.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from resumeloader.core import exiting, interrupts

__all__ = ["from_generator", "guarded"]

_ATTRIBUTE = "_resumeloader_generator"


def from_generator(
    make: Callable[[], Iterator[Any]], output_signature: Any, *, keep: list[Any]
) -> tf.data.Dataset:
    """``tf.data.Dataset.from_generator(make, output_signature=...)``, see the module docstring.

    Args:
        make: returns the generator of one iteration.
        output_signature: the element spec.
        keep: a list owned by the loader; `make` is appended to it.
    """
    exiting.install()
    if tf.inside_function():
        return tf.data.Dataset.from_generator(
            lambda: guarded(make), output_signature=output_signature
        )
    ref = weakref.ref(make)

    def generate() -> Iterator[Any]:
        target = ref()
        if target is None:  # only reachable through TensorFlow's leaked reference
            msg = "This dataset's loader was garbage collected; keep the dataset referenced."
            raise RuntimeError(msg)
        return guarded(target)

    ds = tf.data.Dataset.from_generator(generate, output_signature=output_signature)
    # Not a tracked attribute: the dataset must not gain checkpoint dependencies.
    object.__setattr__(ds, _ATTRIBUTE, make)
    keep.append(make)
    return ds


def guarded(make: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """The elements of ``make()``, each step `exiting.busy`; it raises once the
    interpreter exits (see the module docstring) and closes ``make()``'s generator.
    Each step, and its end, signal a Ctrl-C the main thread lost again."""
    exiting.install()
    exiting.check("dataset() batches")
    with interrupts.iterating():  # a press the main thread loses from now on is noted
        with exiting.busy():
            elements = make()
        try:
            while True:
                with exiting.busy():
                    interrupts.forward()
                    exiting.check("dataset() batches")
                    try:
                        element = next(elements)
                    except StopIteration:
                        return
                yield element
        finally:
            interrupts.forward()  # the consumer may still take the batches TensorFlow holds
            close = getattr(elements, "close", None)
            if close is not None:
                with exiting.busy():
                    close()

