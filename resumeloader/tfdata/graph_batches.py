"""`GraphBatches`, `GraphLayout`: a plan's batches as TensorFlow ops, batch k after any position.

The graph form of what `resumeloader.stages.plan.Plan.tasks` yields for fixed-size
batches: the position arithmetic of `resumeloader.core.positions.Layout`
(`GraphLayout`: normalising, advancing by k batches in O(1), a batch's end, the
batches left), the shard stride (shard ``s`` of ``S`` reads global offsets ``s, s +
S, ...``) and the index stage's order (`graph_order.GraphOrder`), all as integer
tensor ops. Batch ``k`` is a pure function of the start position and ``k``
(`GraphBatches.batch`). A dataset of batches computes the order's keys once per epoch
and the indices of a chunk of batches at once (a few hundred microseconds of kernel
launches per call, whatever its size), hands out each batch as a reference to its
chunk (`GraphBatches.refs`) and slices and gathers it in one parallel, ordered map
(`GraphBatches.batch_in`): no Python, no ``from_generator``. `GraphBatches.dataset`
builds its index part, reading the start position when an iteration begins; the
``graph`` delivery path (`resumeloader.tfdata.graph_path`) gathers in the same map.

Bit-identical to the plan: the same record indices, epoch, position and metadata for
every batch (``tests/tf/test_graph_order.py`` compares them over random plans).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import tensorflow as tf

from resumeloader.core import positions
from resumeloader.stages import plan as plan_lib
from resumeloader.tfdata import graph, graph_order

__all__ = ["CHUNK_RECORDS", "ENDLESS", "BatchIndices", "Chunk", "GraphBatches", "GraphLayout"]

#: Record indices computed at once by default: the order's ops run once per chunk of
#: batches, not once per batch (a few hundred microseconds of kernel launches each).
CHUNK_RECORDS = 4096

# core/rng.metadata's seed tag: the stateless seed pair of each record.
_METADATA_SEED_TAG = 0x7F5EED
# Plain ops and Python control flow on Python values: nothing for autograph to convert.
_no_autograph = tf.autograph.experimental.do_not_convert
#: The epochs (or chunks) of an endless stream: more than any run reaches.
ENDLESS = (1 << 63) - 1


def _int64(value: Any) -> tf.Tensor:
    return tf.convert_to_tensor(value, tf.int64)


class GraphLayout:
    """`Layout`'s arithmetic for fixed-size batches (no window, no skips) as int64 tensor
    ops; each method is the `Layout` method of the same name, value for value.

    Positions past the largest one (2**63 - 1 records) are not checked for.

    Raises:
        TypeError: the layout has windows or skips (`supports`).
    """

    def __init__(self, layout: positions.Layout) -> None:
        if not self.supports(layout):
            msg = (
                "Only a layout of fixed-size batches without skipped ranges has a "
                f"TensorFlow form. Received: {layout!r}."
            )
            raise TypeError(msg)
        self.layout = layout
        self.records_per_epoch = layout.records_per_epoch
        self.batch_size = layout.batch_size
        self.end = layout.end

    @staticmethod
    def supports(layout: positions.Layout) -> bool:
        """Whether `layout` is of fixed-size batches: no window, known counts, no skips."""
        return layout.window is None and layout.known_counts and not layout.skips

    @_no_autograph
    def normalise(self, position: Any) -> tf.Tensor:
        """`Layout.normalise`: a position in a dropped remainder moves to the next epoch."""
        position = _int64(position)
        if self.layout.drop_remainder:
            offset = position % self.records_per_epoch
            left = self.records_per_epoch - offset
            moved = (offset > 0) & (left < self.batch_size)
            position += tf.where(moved, left, tf.zeros_like(left))
        return position if self.end is None else tf.minimum(position, self.end)

    @_no_autograph
    def batch_end(self, position: Any) -> tf.Tensor:
        """`Layout.batch_end` of normalised `position`."""
        position = _int64(position)
        left = self.records_per_epoch - position % self.records_per_epoch
        return position + tf.minimum(left, self.batch_size)

    @_no_autograph
    def batches_left_in_epoch(self, position: Any) -> tf.Tensor:
        """`Layout.batches_left_in_epoch` of normalised `position` (0 past the end)."""
        position = _int64(position)
        left = self.records_per_epoch - position % self.records_per_epoch
        batches = left // self.batch_size
        if not self.layout.drop_remainder:
            batches += tf.cast(left % self.batch_size > 0, tf.int64)
        if self.end is not None:
            batches = tf.where(position >= self.end, tf.zeros_like(batches), batches)
        return batches

    @_no_autograph
    def batches_to_end(self, position: Any) -> tf.Tensor:
        """`Layout.batches_to_end` of normalised `position` of a finite stream.

        Raises:
            ValueError: the stream is endless.
        """
        num_epochs = self.layout.num_epochs
        if num_epochs is None:
            msg = "An endless stream has no number of batches to its end."
            raise ValueError(msg)
        position = _int64(position)
        epochs_after = tf.maximum(num_epochs - position // self.records_per_epoch - 1, 0)
        return self.batches_left_in_epoch(position) + epochs_after * self.layout.batches_per_epoch

    @_no_autograph
    def advance(self, position: Any, num_batches: Any) -> tf.Tensor:
        """`Layout.advance`: the normalised position `num_batches` batches after
        `position`, in O(1) (at most the end of a finite stream)."""
        position = self.normalise(position)
        count = _int64(num_batches)
        per_epoch, size = self.records_per_epoch, self.batch_size
        num_epochs, per_batch_epoch = self.layout.num_epochs, self.layout.batches_per_epoch
        left = tf.maximum(self.batches_left_in_epoch(position), 1)
        within = position + tf.minimum(count, left) * size
        over = tf.maximum(count - left, 0)
        epochs, batches = over // per_batch_epoch, over % per_batch_epoch
        epoch = position // per_epoch + 1
        if num_epochs is not None:
            epochs = tf.minimum(epochs, num_epochs)  # clamped: no count can overflow
        beyond = (epoch + epochs) * per_epoch + batches * size
        stays = count <= 0
        if self.end is not None:
            beyond = tf.where(epoch + epochs >= num_epochs, _int64(self.end), beyond)
            stays |= position >= self.end
        return tf.where(stays, position, tf.where(count < left, within, beyond))


class BatchIndices(NamedTuple):
    """One batch of the stream as `Plan.tasks` gives it: its record indices (int64
    ``[batch]``), its epoch and the position of its first record (int64 scalars)."""

    indices: tf.Tensor
    epoch: tf.Tensor
    position: tf.Tensor


class Chunk(NamedTuple):
    """Consecutive batches of one epoch (`GraphBatches.refs`): their epoch, the position
    of their first record, the record indices of all of them in order, and what the
    consumer made of them once for the whole chunk (rows gathered by NumPy)."""

    epoch: tf.Tensor
    position: tf.Tensor
    indices: tf.Tensor
    rows: tuple[tf.Tensor, ...] = ()


class GraphBatches:
    """The fixed-size batches of a `Plan` from any position, as TensorFlow ops.

    Every method takes int64 tensors or Python ints and runs eagerly, inside a
    `tf.function` or inside a `tf.data` function; positions count this shard's records
    across epochs, as everywhere in the library.

    Args:
        plan: a plan that `supports` accepts.
        chunk_records: about how many record indices `refs` computes at once (whole
            batches, at least one).

    Raises:
        TypeError: the plan's batches have no graph form (see `supports`).

    Examples:
        >>> import numpy as np
        >>> import resumeloader as rl
        >>> from resumeloader.stages import plan as plan_lib
        >>> plan = plan_lib.Plan(rl.Pipeline(np.arange(10), seed=0).shuffle().batch(4),
        ...                      num_epochs=2)
        >>> batch = GraphBatches(plan).batch(start=0, k=2)  # the short last batch of epoch 0
        >>> batch.indices.numpy().tolist(), int(batch.epoch), int(batch.position)
        ([9, 6], 0, 8)
        >>> [task.indices.tolist() for task in plan.tasks(0)][2]
        [9, 6]
    """

    def __init__(self, plan: plan_lib.Plan, *, chunk_records: int = CHUNK_RECORDS) -> None:
        if not self.supports(plan):
            msg = (
                "This plan's batches have no TensorFlow form: it needs batches of a fixed "
                "size (no windows, no skipped ranges) and an index stage with a graph "
                f"order (the sampler or the block order). Received: {plan!r}."
            )
            raise TypeError(msg)
        self.plan = plan
        #: The plan's position arithmetic.
        self.layout = GraphLayout(plan.layout)
        #: The plan's index stage's order.
        self.order = graph_order.GraphOrder(plan.pipeline.index_stage, seed=plan.pipeline.seed)
        #: Batches whose indices `refs` computes at once.
        self.chunk_batches = max(1, chunk_records // plan.layout.batch_size)

    @staticmethod
    def supports(plan: plan_lib.Plan) -> bool:
        """Whether `plan`'s batches can be computed in the graph: a layout `GraphLayout`
        supports and an index stage `graph_order.GraphOrder` supports."""
        return GraphLayout.supports(plan.layout) and graph_order.GraphOrder.supports(
            plan.pipeline.index_stage
        )

    @_no_autograph
    def batch(self, start: Any, k: Any) -> BatchIndices:
        """Batch `k` (from 0) of the stream that starts at `start`: what the k-th task
        of ``Plan.tasks(layout.normalise(start))`` holds.

        O(1) in `k` (random access); `dataset` derives the order's epoch keys once per
        epoch instead. Past the end of a finite stream (`k` >= ``layout.batches_to_end``)
        the batch is empty; with ``drop_remainder`` the indices have the static shape
        ``[batch_size]``.
        """
        layout = self.layout
        position = layout.advance(start, k)
        if layout.end is not None:
            position = tf.minimum(position, layout.end)
        epoch = position // layout.records_per_epoch
        offset = position - epoch * layout.records_per_epoch
        stop = layout.batch_end(position)
        if layout.end is not None:
            stop = tf.minimum(stop, layout.end)
        return self._indices(epoch, offset, stop - position, self.order.epoch_keys(epoch))

    def _indices(self, epoch: tf.Tensor, offset: tf.Tensor, count: tf.Tensor,
                 keys: tf.Tensor, *, exact: bool = True) -> BatchIndices:
        """The `count` records from this shard's `offset` of `epoch` (one batch when
        `exact`)."""
        layout, plan = self.layout, self.plan
        offsets = offset + tf.range(count)
        shard = plan.shard
        if shard.count != 1:  # the shard stride: global offsets s, s + S, ...
            offsets = offsets * shard.count + shard.index
        indices = self.order.indices(epoch, offsets, keys)
        if exact and layout.layout.drop_remainder:
            indices = tf.ensure_shape(indices, [layout.batch_size])
        return BatchIndices(indices, epoch, epoch * layout.records_per_epoch + offset)

    @_no_autograph
    def metadata(self, batch: BatchIndices) -> dict[str, tf.Tensor]:
        """`resumeloader.core.rng.metadata` of `batch` (the plan's pipeline seed): each
        record's ``index``, ``epoch``, ``position`` and stateless TF ``seed`` pair."""
        count = tf.size(batch.indices, out_type=tf.int64)
        word = graph_order.epoch_hash(self.plan.pipeline.seed ^ _METADATA_SEED_TAG, batch.epoch)
        first = tf.bitcast(tf.bitwise.right_shift(word, tf.constant(1, tf.uint64)), tf.int64)
        return {
            "index": batch.indices,
            "epoch": tf.fill([count], batch.epoch),
            "position": batch.position + tf.range(count),
            "seed": tf.stack([tf.fill([count], first), batch.indices], axis=1),
        }

    # -- datasets: the order once per epoch and once per chunk of batches -------------
    def dataset(self, start: Any, *, rest_of_epoch: bool = False) -> tf.data.Dataset:
        """A dataset of `BatchIndices`, one per batch from `start` to the end of the
        stream (of `start`'s epoch when `rest_of_epoch`; endless for an endless stream).

        Args:
            start: the position to start from: an int, an int64 tensor, a `tf.Variable`
                or a function returning an int64 scalar tensor, read once when an
                iteration begins (each iteration starts at its value at that moment).
            rest_of_epoch: end at the end of the start position's epoch.

        The batches are `refs` (no function runs per batch) mapped by `batch_in`, in
        one parallel, ordered ``map`` (AUTOTUNE); a consumer gathers in the same map.
        """

        @_no_autograph
        def first(_: tf.Tensor) -> tf.Tensor:
            if callable(start) and not isinstance(start, tf.Variable):
                return tf.cast(start(), tf.int64)
            value = start.read_value() if isinstance(start, tf.Variable) else start
            return tf.cast(value, tf.int64)

        positions = tf.data.Dataset.range(1).map(first)
        refs = positions.flat_map(lambda p: self.refs(p, rest_of_epoch=rest_of_epoch))
        return refs.map(self.batch_in, **graph.parallel_map())  # sequential under op determinism

    def refs(
        self,
        start: tf.Tensor,
        *,
        rest_of_epoch: bool,
        on_chunk: Callable[[tf.Tensor], list[Any]] | None = None,
    ) -> tf.data.Dataset:
        """The batches from position `start` (an int64 scalar tensor, e.g. inside a
        ``flat_map``) as ``(chunk, k)``: a `Chunk` and a batch's number in it.

        The order derives its epoch keys once per epoch (a dataset of epochs) and its
        indices once per chunk of up to `chunk_batches` batches, vectorised; a batch is
        then a reference to its chunk (`batch_in` slices it), with no function run per
        batch here. ``on_chunk(batches)``, if given, returns ops each chunk's indices
        wait for (checks, counts), run once per chunk with the number of its batches.
        """
        layout, order = self.layout, self.order
        per_epoch, size = layout.records_per_epoch, layout.batch_size
        num_epochs = layout.layout.num_epochs
        chunk = self.chunk_batches
        position = layout.normalise(start)
        epoch = position // per_epoch
        if rest_of_epoch:
            last = epoch + 1 if num_epochs is None else tf.minimum(epoch + 1, num_epochs)
            numbers = tf.data.Dataset.range(epoch, last)
        elif num_epochs is None:
            # Not `Dataset.counter`: a ``scan``, whose function each iterator instantiates
            # (grappler and the oneDNN layout pass over it) before the first batch.
            numbers = tf.data.Dataset.range(epoch, ENDLESS)
        else:
            numbers = tf.data.Dataset.range(epoch, num_epochs)

        # Two dataset functions in all (each one costs every iterator a few milliseconds
        # to instantiate before its first element): the epochs', and the chunks' that
        # computes a chunk and hands out its batches' references.
        @_no_autograph
        def epochs(e: tf.Tensor) -> tf.data.Dataset:
            offset = tf.where(e == epoch, position % per_epoch, tf.zeros_like(position))
            count = layout.batches_left_in_epoch(e * per_epoch + offset)
            keys = order.epoch_keys(e)
            return tf.data.Dataset.zip((
                tf.data.Dataset.from_tensors((e, offset, count, keys)).repeat(),
                tf.data.Dataset.range(0, count, chunk),
            ))

        @_no_autograph
        def batches(part: tuple[tf.Tensor, ...], b: tf.Tensor) -> tf.data.Dataset:
            e, offset, count, keys = part
            made, n = self._chunk(e, offset + b * size, tf.minimum(count - b, chunk), keys,
                                  on_chunk)
            return tf.data.Dataset.zip(
                (tf.data.Dataset.from_tensors(made).repeat(n), tf.data.Dataset.range(n)))

        return numbers.flat_map(epochs).flat_map(batches)

    def _chunk(self, epoch: tf.Tensor, offset: tf.Tensor, count: tf.Tensor, keys: tf.Tensor,
               on_chunk: Callable[[tf.Tensor], list[Any]] | None) -> tuple[Chunk, tf.Tensor]:
        """The `Chunk` of `count` batches from this shard's `offset` of `epoch` (a batch
        start), and `count`."""
        layout = self.layout
        records = tf.minimum(count * layout.batch_size, layout.records_per_epoch - offset)
        with tf.control_dependencies([] if on_chunk is None else on_chunk(count)):
            batch = self._indices(epoch, offset, records, keys, exact=False)
        return Chunk(epoch, batch.position, batch.indices), count

    @_no_autograph
    def batch_rows(self, chunk: Chunk, k: Any) -> tuple[tf.Tensor, ...]:
        """Batch `k`'s part of each of `chunk`'s rows (a slice of the first dimension:
        no copy)."""
        size = self.layout.batch_size
        low = _int64(k) * size
        sliced = tuple(rows[low : low + size] for rows in chunk.rows)
        if self.layout.layout.drop_remainder:
            sliced = tuple(tf.ensure_shape(r, [size, *r.shape[1:]]) for r in sliced)
        return sliced

    @_no_autograph
    def batch_in(self, chunk: Chunk, k: Any) -> BatchIndices:
        """Batch `k` of `chunk` (`refs`): its slice of the chunk's indices."""
        size = self.layout.batch_size
        low = _int64(k) * size
        indices = chunk.indices[low : low + size]
        if self.layout.layout.drop_remainder:
            indices = tf.ensure_shape(indices, [size])
        return BatchIndices(indices, chunk.epoch, chunk.position + low)
