"""The ``gather`` path: in-memory numeric columns without a record stage, gathered in tf.data.

For such sources Python only computes the record indices, CHUNK batches of one size
per ``from_generator`` element; tf.data gathers a chunk's records with one gather per
column in its own threads and splits the chunk into its batches (``unbatch`` of a
``[batches, batch_size, ...]`` tensor), which costs much less than converting a NumPy
batch per ``from_generator`` call. The stream is identical to the produced paths': the
same tasks, cut the same way (``for batch in loader`` gathers a chunk of batches at a time
with NumPy, in its own thread: `resumeloader.tfdata.eager_gather`).

Each column is read where it is, nothing copied before the first batch
(`resumeloader.tfdata.columns`). There is no size limit: nothing is embedded in a
graph, and tf.data's static optimisations, whose graph rewrite would copy every
captured tensor on each new iterator, are switched off for this dataset (its one map
is parallel and ordered already).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import optree
import tensorflow as tf

from resumeloader.handout import engine as engine_lib
from resumeloader.tfdata import columns as columns_lib
from resumeloader.tfdata import delivery, eager_gather, generator, graph

__all__ = ["GatherPath"]

_KINDS = "biuf"  # bool, signed, unsigned, float
# Batches whose index arrays travel through from_generator together.
CHUNK = 16


def _is_spec(x: Any) -> bool:
    return isinstance(x, tf.TensorSpec)


class GatherPath(delivery.DeliveryPath):
    """In-memory numeric columns read by one batched read per batch, fixed-shape rows
    stacked as read, no workers: gathered in tf.data (`columns.Column`)."""

    name = "gather"

    @classmethod
    def accepts(cls, engine: engine_lib.Engine) -> bool:
        pipeline, producer = engine.plan.pipeline, engine.producer
        stage = pipeline.batch_stage
        spec = producer.output_spec
        if not (
            producer.reads_batches
            and not engine.backend.parallel  # workers asked for: let them make the batches
            and stage is not None and stage.stacks
            and not spec.variable
            and not pipeline.batch_map_stages  # Python on every batch
        ):
            return False
        columns = pipeline.source.columns()
        if columns is None or columns[1] != spec.treespec:
            return False
        return all(
            leaf.dtype.kind in _KINDS and want.accepts(leaf[0])
            for leaf, want in zip(columns[0], spec.leaves, strict=True)
        )

    def __init__(self, engine: engine_lib.Engine, *, prefetch: int | None) -> None:
        super().__init__(engine, prefetch=prefetch)
        columns = engine.plan.pipeline.source.columns()
        assert columns is not None
        self._leaves, self._treespec = columns
        self._columns: list[columns_lib.Column] | None = None

    def handover(
        self, begin: Callable[[], tuple[int, Any]], watch: delivery.Watch | None
    ) -> tf.data.Dataset:
        def indices() -> Iterator[Any]:
            position, layout = begin()
            return self.engine.indices(position, layout=layout, watch=watch)

        seeded = self.finisher.seeded
        ds = self._gathered(
            indices, graph.element_spec(self.spec, self.batch_dim, seeded), with_metadata=seeded
        )
        return self.prefetched(self.finisher.map(ds, self.batch_dim))

    def eager(self, position: int) -> Iterator[tuple[Any, int]]:
        """As `DeliveryPath.eager`; without tensor stages, windows or a bad-record policy
        the loop gathers a chunk of batches at a time itself (`eager_gather`)."""
        engine = self.engine
        if (self.finisher.stages or engine.plan.layout.window is not None
                or engine.quarantine is not None):
            return super().eager(position)
        return eager_gather.batches(engine, self._leaves, self._treespec, position)

    def source_row(self) -> delivery.Row:
        pipeline = self.engine.plan.pipeline
        record = self.engine.producer.spec.describe()
        how = columns_lib.read_as(self._made_columns())
        return ("source", f"{pipeline.source.description}, {how}", record, "constant")

    def handover_rows(self) -> list[delivery.Row]:
        columns = self._made_columns()
        by_numpy = columns_lib.by_numpy(columns)
        gathered = (
            "tf.gather(source, indices)" if not by_numpy
            else "rows gathered by NumPy (numpy_function)" if by_numpy == len(columns)
            else "tf.gather(in-place columns, indices), the others by NumPy (numpy_function)"
        )
        return [
            ("from_generator", "gather path: index array of each batch", "int64[None]",
             "recomputed"),
            ("map", f"{gathered}, up to {CHUNK} batches at once", self.batch_text(),
             "recomputed"),
        ]

    def _made_columns(self) -> list[columns_lib.Column]:
        """The columns as `columns.Column` (made once: nothing is copied or read)."""
        if self._columns is None:
            self._columns = [columns_lib.Column(leaf) for leaf in self._leaves]
        return self._columns

    def _gathered(
        self,
        indices: Callable[[], Iterator[Any]],
        element_spec: Any,
        *,
        with_metadata: bool,
    ) -> tf.data.Dataset:
        """Batches gathered at the index arrays that `indices()` yields.

        Args:
            indices: a generator function yielding an int64 index array per batch, or
                ``(indices, metadata)`` when `with_metadata`.
            element_spec: the loader's element spec, which the batches are given.
            with_metadata: whether elements are ``(batch, metadata)``.
        """
        columns = self._made_columns()
        data_spec = element_spec[0] if with_metadata else element_spec
        specs = optree.tree_leaves(data_spec, is_leaf=_is_spec, none_is_leaf=True)
        index_spec = tf.TensorSpec(specs[0].shape[:1], tf.int64)
        signature = (index_spec, element_spec[1]) if with_metadata else index_spec
        treespec = self._treespec

        static = specs[0].shape[0]  # the batch size when every batch has it, else None

        def split(value: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
            """A chunk's rows [k * size, ...] as k batches [k, size, ...]."""
            rows = static if static is not None else size
            return tf.reshape(value, tf.concat([[-1, rows], tf.shape(value)[1:]], 0))

        def gather(index: tf.Tensor, size: tf.Tensor) -> Any:
            # One gather per column for the whole chunk: far less tf.data work per batch
            # than a gather per batch (a third less CPU, measured).
            batch = [split(column.gather(index), size) for column in columns]
            return optree.tree_unflatten(treespec, batch)

        chunk_spec = tf.nest.map_structure(
            lambda s: tf.TensorSpec((None, *s.shape[1:]), s.dtype), signature
        )
        ds = tf.data.Dataset.from_generator(
            lambda: generator.guarded(lambda: _chunks(indices(), with_metadata=with_metadata)),
            output_signature=(chunk_spec, tf.TensorSpec((), tf.int64)),
        )
        if with_metadata:
            ds = ds.map(
                lambda chunk, size: (
                    gather(chunk[0], size),
                    tf.nest.map_structure(lambda m: split(m, size), chunk[1]),
                ),
                **graph.parallel_map(),
            )
        else:
            ds = ds.map(gather, **graph.parallel_map())
        ds = ds.unbatch()
        return ds.with_options(_OPTIONS)


def _options() -> tf.data.Options:
    options = tf.data.Options()
    # Any static optimisation serialises the pipeline for a graph rewrite, which copies
    # the captured columns (the whole source) once per iterator.
    options.experimental_optimization.apply_default_optimizations = False
    return options


_OPTIONS = _options()


def _chunks(batches: Iterator[Any], *, with_metadata: bool) -> Iterator[Any]:
    """Groups up to CHUNK consecutive batches of one size (their index arrays and
    metadata) into one generator element with that size, so Python, from_generator
    and the gather run once per CHUNK batches."""
    group: list[Any] = []
    size = -1
    for item in batches:
        length = len(item[0] if with_metadata else item)
        if group and (length != size or len(group) == CHUNK):
            yield _pack(group, with_metadata), np.int64(size)
            group = []
        group.append(item)
        size = length
    if group:
        yield _pack(group, with_metadata), np.int64(size)


def _pack(group: list[Any], with_metadata: bool) -> Any:
    if with_metadata:
        index = np.concatenate([indices for indices, _ in group])
        meta = {key: np.concatenate([m[key] for _, m in group]) for key in group[0][1]}
        return index, meta
    return np.concatenate(group)
