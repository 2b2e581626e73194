"""`GuardedDataset`, what ``loader.dataset()`` returns: tf.data minus the ops that lose records.

The consumer advances the position once per element it trains on. That counts the
loader's batches only if every element after ``dataset()`` is exactly one of them,
in order. `GuardedDataset` wraps the loader's dataset without adding an op (it
shares its variant tensor, like tf.data's own unchanged-structure datasets) and:

* refuses, when called, every transformation that drops, repeats, reorders or
  regroups batches (`UNSAFE`: what it would do and what to use instead);
* returns a `GuardedDataset` again from every transformation that keeps one
  element per batch in order (`SAFE`), so the guard follows the chain;
* knows its cardinality when the loader is finite (eagerly: the batches an
  iteration started now yields), so ``len()`` and Keras see it.

Static combinators (``Dataset.zip``, ``sample_from_datasets``, ...) do not call
methods of their inputs; the loader's ledger (`resumeloader.handout.consumption`)
catches their misuse at run time instead. So does the graph of a ``tf.function``
that receives the dataset as an argument (TensorFlow rebuilds a plain dataset
inside it): transform outside the function.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops

from resumeloader import errors

__all__ = ["SAFE", "UNSAFE", "GuardedDataset"]

_SELECT = "select the records before the loader (a source over the kept indices)"
_MIX = "`Pipeline.mix(sources, weights)` (docs/guides/mixing.md)"
_BATCH = "the loader's `batch_size` (`Pipeline.batch`)"

# name: (what it does to the stream after dataset(), what to use instead)
UNSAFE: dict[str, tuple[str, str]] = {
    "repeat": (
        "restarts the dataset of a finite loader from the position current at that moment "
        "while the consumer keeps advancing: batches come twice and are counted past the end",
        "`num_epochs=` on the loader (None: endless)",
    ),
    "shuffle": (
        "reorders batches, so the position no longer counts the batches trained on",
        "the loader's `shuffle=True`: a seeded permutation of the records per epoch",
    ),
    "filter": (
        "drops batches the consumer never advances for: the position falls behind what "
        "was trained",
        _SELECT,
    ),
    "ignore_errors": (
        "drops failing batches silently: the position falls behind what was trained",
        "`Pipeline.on_error('skip', quarantine=path)`: each failing record replaced by a "
        "seeded other record of its epoch (the same after a restore), logged, within an "
        "error budget (docs/guides/bad-records.md)",
    ),
    "unique": ("drops batches: the position falls behind", _SELECT),
    "skip": (
        "drops the first batches without an advance: the position falls behind",
        "`loader.advance(n)` before iterating (the position then records the skip)",
    ),
    "shard": (
        "keeps every n-th batch while the position counts all of them",
        "`shard=Shard(index, count)` on the loader, or `dataset(input_context=ctx)`",
    ),
    "unbatch": (
        "splits batches into records: one advance per element no longer counts a batch",
        f"{_BATCH}; per-record work in `map_fn`, or a `map` over the batch (e.g. with "
        "`tf.vectorized_map`)",
    ),
    "batch": (
        "groups several batches into one element: one advance counts only one of them",
        _BATCH,
    ),
    "padded_batch": (
        "groups several batches into one element: one advance counts only one of them",
        "`Pipeline.padded_batch(batch_size, pad_to=..., mask=...)`",
    ),
    "ragged_batch": (
        "groups several batches into one element: one advance counts only one of them",
        f"{_BATCH} (varying leaves become tf.RaggedTensor), or `Pipeline.padded_batch`",
    ),
    "sparse_batch": (
        "groups several batches into one element: one advance counts only one of them",
        _BATCH,
    ),
    "rebatch": (
        "cuts batches into elements of another size: one advance no longer counts a batch",
        f"{_BATCH}; for replicas `dataset(input_context=ctx)` or "
        "`strategy.experimental_distribute_dataset`",
    ),
    "window": ("regroups batches into windows", _BATCH),
    "group_by_window": (
        "regroups records of several batches by key",
        "`Pipeline.bucket_by_length`, `Pipeline.batch_by_tokens` or `Pipeline.pack`",
    ),
    "bucket_by_sequence_length": (
        "regroups records of several batches by length",
        "`Pipeline.bucket_by_length(batch_size, window=...)`, or `Pipeline.batch_by_tokens` "
        "with `boundaries=`",
    ),
    "rejection_resample": (
        "drops and repeats records to reach a target distribution",
        _MIX,
    ),
    "flat_map": (
        "turns each batch into any number of elements",
        f"per-record work in `map_fn` and {_BATCH}",
    ),
    "interleave": (
        "turns each batch into any number of elements, interleaved",
        f"per-record work in `map_fn`; to mix datasets, {_MIX}",
    ),
    "concatenate": (
        "appends other elements, and the consumer advances for them too",
        f"{_MIX}, or a second loader",
    ),
    "cache": (
        "replays the first iteration's batches on later ones, whatever the position",
        "nothing: the loader recomputes batches from the position (workers for an "
        "expensive `map_fn`)",
    ),
    "snapshot": (
        "replays stored batches, whatever the position",
        "nothing: the loader recomputes batches from the position (workers for an "
        "expensive `map_fn`)",
    ),
}

# Transformations that keep one element per batch, in order.
SAFE = ("apply", "enumerate", "map", "prefetch", "scan", "take", "take_while", "with_options")

Count = Callable[[], int]


def _refusal(name: str) -> str:
    effect, instead = UNSAFE[name]
    return (
        f"`{name}` after `loader.dataset()` {effect}, so a restored job would lose or repeat "
        f"records. Instead: {instead}. Safe after dataset(): {', '.join(SAFE)} and "
        "tf.distribute (docs/guides/safe-ops.md); if you count the "
        "consumed batches yourself, `.unguarded()` gives the plain dataset. "
        f"Received: loader.dataset().{name}(...)."
    )


class GuardedDataset(dataset_ops.UnaryUnchangedStructureDataset):
    """`dataset` (a loader's batches), with the guard described in the module docstring.

    Args:
        dataset: the dataset to guard; this one reads the same variant tensor.
        finite: whether the loader ends (``repeat`` is refused then).
        count: the number of elements an iteration started now yields (or
            ``tf.data.INFINITE_CARDINALITY``), or None when unknown.
    """

    #: The refused transformations (``repeat`` only on a finite loader).
    REFUSED = tuple(UNSAFE)

    def __init__(self, dataset: tf.data.Dataset, *, finite: bool, count: Count | None) -> None:
        self._guarded = dataset
        self._finite = finite
        self._count = count
        super().__init__(dataset, dataset._variant_tensor)

    def _guard(self, dataset: Any, count: Count | None = None) -> GuardedDataset:
        if isinstance(dataset, GuardedDataset):
            return dataset
        return GuardedDataset(dataset, finite=self._finite, count=count)

    def unguarded(self) -> tf.data.Dataset:
        """The same dataset without the guard, for code that counts consumed batches itself.

        Its transformations are not checked: the advances must still match the
        loader's batches one for one.
        """
        return self._guarded

    def cardinality(self) -> tf.Tensor:
        """Eagerly, the batches an iteration started now yields; in a graph, tf.data's."""
        if self._count is not None and tf.executing_eagerly():
            return tf.constant(self._count(), tf.int64)
        return super().cardinality()

    # -- safe: one element per batch, in order ------------------------------------------
    def map(self, *args: Any, **kwargs: Any) -> GuardedDataset:
        return self._guard(super().map(*args, **kwargs), self._count)

    def prefetch(self, *args: Any, **kwargs: Any) -> GuardedDataset:
        return self._guard(super().prefetch(*args, **kwargs), self._count)

    def with_options(self, *args: Any, **kwargs: Any) -> GuardedDataset:
        return self._guard(super().with_options(*args, **kwargs), self._count)

    def enumerate(self, *args: Any, **kwargs: Any) -> GuardedDataset:
        return self._guard(super().enumerate(*args, **kwargs), self._count)

    def scan(self, *args: Any, **kwargs: Any) -> GuardedDataset:
        return self._guard(super().scan(*args, **kwargs), self._count)

    def take(self, count: Any, name: str | None = None) -> GuardedDataset:
        parent = self._count
        taken: Count | None = None
        if parent is not None and isinstance(count, int) and count >= 0:
            # A negative parent count is tf.data's INFINITE_CARDINALITY.
            taken = lambda: count if parent() < 0 else min(count, parent())  # noqa: E731
        return self._guard(super().take(count, name=name), taken)

    def take_while(self, *args: Any, **kwargs: Any) -> GuardedDataset:
        return self._guard(super().take_while(*args, **kwargs))

    def apply(self, transformation_func: Callable[[Any], Any]) -> GuardedDataset:
        # The function calls this dataset's (guarded) methods; what it returns stays guarded.
        return self._guard(super().apply(transformation_func))

    # -- unsafe, or safe only in one case -----------------------------------------------
    def repeat(self, count: Any = None, name: str | None = None) -> GuardedDataset:
        if self._finite:
            raise errors.StreamIntegrityError(_refusal("repeat"))
        return self._guard(super().repeat(count, name=name))  # an endless loader never ends

    def rebatch(self, *args: Any, **kwargs: Any) -> tf.data.Dataset:
        # tf.distribute splits each global batch into per-replica batches and gathers
        # them back into one step: one advance per step still counts one batch.
        if sys._getframe(1).f_globals.get("__name__", "").startswith(
            "tensorflow.python.distribute"
        ):
            return super().rebatch(*args, **kwargs)
        raise errors.StreamIntegrityError(_refusal("rebatch"))


def _refuser(name: str) -> Callable[..., Any]:
    def refuse(self: GuardedDataset, *args: Any, **kwargs: Any) -> Any:
        raise errors.StreamIntegrityError(_refusal(name))

    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = f"Refused: {UNSAFE[name][0]}. Use {UNSAFE[name][1]}."
    return refuse


for _name in UNSAFE:
    if _name not in ("repeat", "rebatch"):
        setattr(GuardedDataset, _name, _refuser(_name))
