"""Ordering a graph ``advance()`` after the batches its ``tf.function`` pulled.

Inside a ``tf.function``, TensorFlow orders stateful ops only when they touch the
same resource: an iterator's get-next and the position variable's assignment may run
in either order. A loader's dataset reads the position when an iterator produces its
first batch, so an advance that ran first would make that iterator start one batch
late (a batch lost on every new iterator). `pending_get_next` lists the get-next ops
built so far in the function and the functions around it; the advance waits for them
(a ``FuncGraph`` turns ops of an outer graph into control captures).
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["GET_NEXT_OPS", "pending_get_next"]

GET_NEXT_OPS = frozenset(
    {
        "IteratorGetNext",
        "IteratorGetNextSync",
        "IteratorGetNextAsOptional",
        "MultiDeviceIteratorGetNextFromShard",
    }
)


def pending_get_next() -> list[tf.Operation]:
    """The iterator get-next ops in the current function graph and the ones enclosing it."""
    found = []
    graph = tf.compat.v1.get_default_graph()
    while hasattr(graph, "outer_graph"):  # function graphs only, not a global graph
        found += [op for op in graph.get_operations() if op.type in GET_NEXT_OPS]
        graph = graph.outer_graph
    return found
