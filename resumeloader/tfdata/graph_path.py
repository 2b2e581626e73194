"""The ``graph`` path: in-memory columns whose order and gather both run in TensorFlow.

When nothing between the source and the batch needs Python — in-memory numeric
columns, a batch stage that only stacks fixed-size batches, the sampler's or the block
order, no workers — the whole stream is a function of the start position that
TensorFlow can compute: the record indices of each chunk of batches with the order's
integer ops (`resumeloader.tfdata.graph_batches`, bit-identical to the plan's tasks),
each batch gathered from the columns (`resumeloader.tfdata.columns`: ``tf.gather`` of
the array in place) in a parallel, ordered ``map`` (AUTOTUNE). No ``from_generator``,
no Python per batch: Python runs once per iteration, when it begins, to read the
position and tell the loader's ledger (a ``py_function``, as the generator of the
other paths does). A column TensorFlow cannot address in place (large NumPy arrays, and
``np.load``'s, sit 16 bytes off 64-byte alignment) is gathered by NumPy once per chunk
of batches instead (`columns.Column.take`), each batch a slice of it (no copy): Python
then runs once per chunk, not per batch, and nothing is copied before the first batch.
That one call also places the chunk (the layout's arithmetic, in Python) and computes
its record indices with the plan's NumPy order (`Plan.indices`, which the graph order
equals bit for bit), the same chunks and batches: TensorFlow traces the dataset's
functions when it is built and instantiates them again for every iterator (grappler
and oneDNN's layout pass, about half a millisecond per op), and the order's and the
arithmetic's few hundred ops cost each iteration ~100 ms before its first batch.

The ledger's checks (`resumeloader.handout.consumption`) see such an iteration through
its count (`stream.Counter`): once per chunk the graph checks that the iteration was not
superseded (a newer iteration, a restore, a ``for batch in loader``) — failing the
step with the ledger's message otherwise — and adds the chunk's batches to the count an
eager ``advance()`` is checked against. ``for batch in loader`` reads the same batches
in its own thread, a chunk of batches per NumPy gather (`eager_gather`); with tensor
stages through this dataset, each batch's end from the layout's arithmetic.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import optree
import tensorflow as tf

from resumeloader.core import exiting, positions
from resumeloader.handout import engine as engine_lib
from resumeloader.tfdata import columns as columns_lib
from resumeloader.tfdata import delivery, eager_gather, gather, graph, graph_batches

__all__ = ["OPTIONS", "SUPERSEDED", "Begin", "GraphCount", "GraphPath"]

SUPERSEDED = (
    "StreamIntegrityError: Two iterations of this loader's dataset() are read at once "
    "(e.g. `zip(ds, ds)`, nested loops over one dataset, an iterator kept from before the "
    "position was restored or from before a `for batch in loader`): each would hand out "
    "the same batches, counted once. Read one iteration at a time; create the iterator "
    "after restoring. Received: batches requested from an iteration after a newer one "
    "started (checked once per chunk of batches)."
)


def _options() -> tf.data.Options:
    options = tf.data.Options()
    # A static optimisation serialises the pipeline for a graph rewrite, which copies
    # the captured columns (the whole source) once per iterator.
    options.experimental_optimization.apply_default_optimizations = False
    return options


#: The options of a graph path's dataset (no static optimisation).
OPTIONS = _options()
# Plain ops and Python control flow on Python values: autograph would only re-parse and
# wrap them each time a dataset is built.
_no_autograph = tf.autograph.experimental.do_not_convert
#: The most bytes of rows a chunk gathered by NumPy holds (whole batches, at least one):
#: the eager loop's chunk bound.
CHUNK_BYTES = eager_gather.CHUNK_BYTES


class GraphCount:
    """The `stream.Counter` of a path whose batches are made in a graph: the iteration
    whose chunks may be made (`serial`, -1: none) and the batches its chunks made so far
    (`made`), TensorFlow variables the graph checks and adds to once per chunk (of
    batches, or a window's); Python reads them when the ledger checks."""

    def __init__(self) -> None:
        with tf.init_scope():
            self.serial = tf.Variable(-1, dtype=tf.int64, trainable=False)
            self.made = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._serials = itertools.count()

    def produced(self) -> int:
        """Batches the current iteration made so far."""
        return int(self.made.numpy())

    def supersede(self) -> None:
        """Makes the current iteration fail at its next chunk."""
        self.serial.assign(-1, read_value=False)

    def counted(self, serial: tf.Tensor, count: tf.Tensor) -> list[Any]:
        """The ops (in a graph) that check that iteration `serial` is still the current
        one (failing the step with `SUPERSEDED` otherwise), then add `count` batches."""
        valid = tf.debugging.Assert(tf.equal(self.serial.read_value(), serial), [SUPERSEDED])
        with tf.control_dependencies([valid]):
            return [self.made.assign_add(count, read_value=False)]

    def begin(self, position: int, watch: delivery.Watch | None) -> int:
        """Starts an iteration at `position` (told to `watch`, which supersedes the one
        before); returns its serial."""
        if watch is not None:
            watch(position, iter(()), counter=self)
        serial = next(self._serials)
        self.made.assign(0, read_value=False)
        self.serial.assign(serial, read_value=False)
        return serial


class GraphPath(delivery.DeliveryPath):
    """In-memory numeric columns in a graph order: indices and gathers in TensorFlow."""

    name = "graph"

    @classmethod
    def accepts(cls, engine: engine_lib.Engine) -> bool:
        return (
            gather.GatherPath.accepts(engine)
            and engine.quarantine is None
            and graph_batches.GraphBatches.supports(engine.plan)
        )

    def __init__(self, engine: engine_lib.Engine, *, prefetch: int | None) -> None:
        super().__init__(engine, prefetch=prefetch)
        found = engine.plan.pipeline.source.columns()
        assert found is not None
        self._leaves, self._treespec = found
        # Made here (nothing is copied or read): which columns NumPy gathers, per chunk.
        self._columns = [columns_lib.Column(leaf) for leaf in self._leaves]
        self._by_numpy = [n for n, column in enumerate(self._columns) if not column.in_place]
        chunk = graph_batches.CHUNK_RECORDS
        if self._by_numpy:
            record = sum(self._leaves[n][:1].nbytes for n in self._by_numpy)
            chunk = min(chunk, CHUNK_BYTES // max(1, record))
        #: The plan's batches as TensorFlow ops.
        self.batches = graph_batches.GraphBatches(engine.plan, chunk_records=chunk)
        self._count = GraphCount()

    # -- the dataset ---------------------------------------------------------------------
    def dataset(
        self,
        start: Callable[[], int],
        *,
        rest_of_epoch: bool,
        watch: delivery.Watch | None = None,
    ) -> tf.data.Dataset:
        batches, produced, current = self.batches, self._count.made, self._count.serial
        columns, by_numpy = self._columns, self._by_numpy
        labelled = self.finisher.seeded
        begin = Begin(start, watch, self, rest_of_epoch=rest_of_epoch)
        # Without a watch (the eager loop's pipeline, which the ledger follows by the
        # batches' ends) no iteration is counted or checked: the loop supersedes the
        # dataset() iterations once it has started its own, and would fail it at its
        # second chunk.
        checked = watch is not None

        def counted(serial: tf.Tensor, count: tf.Tensor) -> list[Any]:
            """The chunk's check and count (none unless `checked`)."""
            return self._count.counted(serial, count) if checked else []

        @_no_autograph
        def refs(position: tf.Tensor, serial: tf.Tensor) -> tf.data.Dataset:
            return batches.refs(position, rest_of_epoch=rest_of_epoch,
                                on_chunk=lambda count: counted(serial, count))

        @_no_autograph
        def gathered(chunk: graph_batches.Chunk, k: tf.Tensor) -> Any:
            # The batch's indices only where they are read (fewer ops to instantiate).
            sliced = dict(zip(by_numpy, batches.batch_rows(chunk, k), strict=True))
            if not labelled and len(sliced) == len(columns):
                return optree.tree_unflatten(self._treespec, [sliced[n] for n in by_numpy])
            batch = batches.batch_in(chunk, k)
            leaves = [sliced[n] if n in sliced else column.gather(batch.indices)
                      for n, column in enumerate(columns)]
            data = optree.tree_unflatten(self._treespec, leaves)
            return (data, batches.metadata(batch)) if labelled else data

        @_no_autograph
        def by_numpy_refs(position: tf.Tensor, serial: tf.Tensor, j: tf.Tensor
                          ) -> tf.data.Dataset:
            valid = ([tf.debugging.Assert(tf.equal(current.read_value(), serial), [SUPERSEDED])]
                     if checked else [])
            with tf.control_dependencies(valid):
                chunk, count = self._take_chunk(position, j)
            with tf.control_dependencies(
                    [produced.assign_add(count, read_value=False)] if checked else []):
                count = tf.identity(count)
            return tf.data.Dataset.zip(
                (tf.data.Dataset.from_tensors(chunk).repeat(count), tf.data.Dataset.range(count)))

        @_no_autograph
        def iteration(_: tf.Tensor) -> tf.data.Dataset:
            position, serial, chunks = (
                tf.reshape(value, ()) for value in tf.py_function(begin, [], [tf.int64] * 3))
            if not by_numpy:
                return refs(position, serial)
            # Python places each chunk (`chunk_place`): no position arithmetic in the graph.
            return tf.data.Dataset.range(chunks).flat_map(
                _no_autograph(lambda j: by_numpy_refs(position, serial, j)))

        ds = tf.data.Dataset.range(1).flat_map(iteration)
        ds = ds.map(gathered, **graph.parallel_map())  # sequential under op determinism
        return self.prefetched(self.finisher.map(ds, self.batch_dim)).with_options(OPTIONS)

    def _take_chunk(self, position: tf.Tensor, number: tf.Tensor
                    ) -> tuple[graph_batches.Chunk, tf.Tensor]:
        """Chunk `number` of the iteration from normalised `position` when NumPy gathers
        columns, and its number of batches, from one ``numpy_function`` call
        (`chunk_at`): where the chunk is, its record indices from the plan's NumPy order
        (`Plan.indices`, what the graph order computes bit for bit) and the rows.

        One graph op instead of the order's and the position arithmetic's hundreds:
        TensorFlow instantiates each dataset function again for every iterator (grappler
        and oneDNN's layout pass, ~0.5 ms per op), so they would cost every iteration
        ~100 ms before its first batch; in NumPy they cost tens of microseconds per chunk,
        while Python runs once per chunk for the gather anyway.
        """
        exiting.install()
        leaves = [self._leaves[n] for n in self._by_numpy]
        dtypes = [tf.as_dtype(leaf.dtype.newbyteorder("=")) for leaf in leaves]
        made = tf.numpy_function(columns_lib.weakly(self, _chunk_at), [position, number],
                                 [tf.int64] * 4 + dtypes, stateful=False)
        epoch, first, count, indices, rows = made[0], made[1], made[2], made[3], made[4:]
        for scalar in (epoch, first, count):
            scalar.set_shape(())
        indices.set_shape([None])
        for part, leaf in zip(rows, leaves, strict=True):
            part.set_shape((None, *leaf.shape[1:]))
        return graph_batches.Chunk(epoch, first, indices, tuple(rows)), count

    def chunk_place(self, position: int, number: int) -> tuple[int, int, int]:
        """Chunk `number` of the iteration from `position` (as
        `graph_batches.GraphBatches.refs` cuts them: up to `chunk_batches` batches, within
        an epoch): its epoch, its first record's offset in the epoch, its batches."""
        layout = self.engine.plan.layout
        per, size, most = layout.records_per_epoch, layout.batch_size, self.batches.chunk_batches
        position = layout.normalise(position)
        epoch, offset = divmod(position, per)
        first = layout.batches_left_in_epoch(position)
        chunks = -(-first // most)
        if number < chunks:
            return epoch, offset + number * most * size, min(first - number * most, most)
        full = _full_epoch_batches(layout)
        later, k = divmod(number - chunks, max(1, -(-full // most)))
        return epoch + 1 + later, k * most * size, min(full - k * most, most)

    def chunks(self, position: int, *, rest_of_epoch: bool) -> int:
        """The chunks of the iteration from `position` (`chunk_place`)."""
        layout = self.engine.plan.layout
        most = self.batches.chunk_batches
        position = layout.normalise(position)
        chunks = -(-layout.batches_left_in_epoch(position) // most)
        if rest_of_epoch:
            return chunks
        if layout.num_epochs is None:
            return graph_batches.ENDLESS
        epochs_after = max(0, layout.num_epochs - position // layout.records_per_epoch - 1)
        return chunks + epochs_after * -(-_full_epoch_batches(layout) // most)

    def chunk_at(self, position: int, number: int) -> list[np.ndarray]:
        """`_take_chunk`'s values: the epoch, first position and batches of chunk `number`
        from `position`, its record indices and each NumPy-gathered column's rows."""
        epoch, offset, count = self.chunk_place(position, number)
        layout = self.engine.plan.layout
        records = min(count * layout.batch_size, layout.records_per_epoch - offset)
        indices = self.engine.plan.indices(epoch, offset, offset + records)
        where = np.array([epoch, epoch * layout.records_per_epoch + offset, count], np.int64)
        return [*where, indices, *(self._columns[n].take(indices) for n in self._by_numpy)]

    def begin(self, position: int, watch: delivery.Watch | None) -> int:
        """Starts an iteration at `position` (told to `watch`); returns its serial."""
        return self._count.begin(position, watch)

    # -- for batch in loader ------------------------------------------------------------
    def eager(self, position: int) -> Iterator[tuple[Any, int]]:
        """The batches of ``for batch in loader`` from `position`, each with the position
        after it: gathered by NumPy a chunk at a time in the loop's thread
        (`resumeloader.tfdata.eager_gather`); with tensor stages the batches of this
        path's dataset, each batch's end from the layout (no batch is reported to Python).
        """
        if not self.finisher.stages:
            return eager_gather.batches(self.engine, self._leaves, self._treespec, position)
        return self.eager_by_layout(position)

    # -- describe() ------------------------------------------------------------------
    def source_row(self) -> delivery.Row:
        pipeline = self.engine.plan.pipeline
        record = self.engine.producer.spec.describe()
        how = columns_lib.read_as(self._columns)
        return ("source", f"{pipeline.source.description}, {how}", record, "constant")

    def handover_rows(self) -> list[delivery.Row]:
        chunk = self.batches.chunk_batches
        mapped = "map(AUTOTUNE, deterministic)"
        if not self._by_numpy:
            return [
                ("order", f"graph path: record indices in TensorFlow ops, up to {chunk} "
                 "batches at once", "int64[None]", "recomputed"),
                ("map", f"tf.gather(source, indices), {mapped}", self.batch_text(),
                 "recomputed"),
            ]
        gathered = ("each batch a slice of its chunk" if len(self._by_numpy) == len(self._columns)
                    else "tf.gather(in-place columns, indices), the others a slice of the chunk")
        return [
            ("order", f"graph path: record indices and rows of up to {chunk} batches at once "
             "by NumPy (the plan's order, one numpy_function per chunk)", "int64[None]",
             "recomputed"),
            ("map", f"{gathered}, {mapped}", self.batch_text(), "recomputed"),
        ]


def _full_epoch_batches(layout: positions.Layout) -> int:
    """The batches of an epoch read from its start (0 when its records make none)."""
    full, rest = divmod(layout.records_per_epoch, layout.batch_size)
    return full + (1 if rest and not layout.drop_remainder else 0)


def _chunk_at(path: GraphPath, position: Any, number: Any) -> list[np.ndarray]:
    return path.chunk_at(int(position), int(number))


class Begin:
    """What an iteration runs once, when it begins (in a ``py_function``): reads the
    position, starts the iteration (`GraphPath.begin`), returns it, its serial and its
    number of chunks (`GraphPath.chunks`) as int64 tensors. `path` is any path with
    those two methods (the ``tfrecord_graph`` path's chunks are windows)."""

    def __init__(self, start: Callable[[], int], watch: delivery.Watch | None,
                 path: GraphPath | Any, *, rest_of_epoch: bool) -> None:
        self.start, self.watch, self.path = start, watch, path
        self.rest_of_epoch = rest_of_epoch
        exiting.install()

    def __call__(self) -> list[tf.Tensor]:
        with exiting.busy():
            exiting.check("dataset() batches")
            position = self.start()
            serial = self.path.begin(position, self.watch)
            chunks = self.path.chunks(position, rest_of_epoch=self.rest_of_epoch)
        return [tf.constant(value, tf.int64) for value in (position, serial, chunks)]
