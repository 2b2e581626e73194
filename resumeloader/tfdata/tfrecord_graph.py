"""The ``tfrecord_graph`` path: local TFRecord files in the block order, read by TensorFlow.

A pipeline of nothing but a `TFRecordSource` of local files (the records' bytes), the
block order (`resumeloader.core.blocks`), fixed-size batches (tensor stages after the
batch allowed), no workers, the bad-record policy "raise" and checked checksums reads
each *window* of the order — the records of its few chunks, consecutive records of the
files — with TensorFlow's TFRecord reader (``TFRecordDatasetV2`` started at each run's
byte offset, ``take`` its count; CRC32C checked in C++) into one string tensor, and
hands out each batch as a ``tf.gather`` of the window's records in a parallel, ordered
``map`` (AUTOTUNE): no ``from_generator``, no Python per record or per batch.

Python runs once per window, in two ``numpy_function`` calls: before it is read, to
place it (`TFRecordGraphPath.window_at`: its runs of records, the positions of the
iteration it holds, the rows of its records in the plan's NumPy order, `Plan.indices`,
so the batches are the other paths' by construction, and where they cut it), and after,
to check that the reader found every record and that no file changed since the source
was built (one ``stat`` per file of the window). A window that fails either is read
again by the source (`TFRecordSource.read_batch`), which raises the error the other
paths raise, naming the file, the record and its byte offset (TensorFlow's
``DataLossError`` says only "corrupted record at <offset>": the reader's errors are
ignored, ``ignore_errors``, and found by the count instead). A batch that straddles two
windows (batches are cut from the epoch's start, windows from theirs) starts with the
rows kept from the window before, a ``scan`` carrying them; windows are read two at a
time, ahead of the batches (`READ_AHEAD`).

The ledger sees an iteration as it sees the ``graph`` path's (`stream.Counter`): once
per window the graph checks that the iteration was not superseded and adds the window's
batches to the count. ``for batch in loader`` keeps the produced batches of the
``read_batch`` path (a Python thread), or — with tensor stages — reads this dataset.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import optree
import tensorflow as tf

from resumeloader.core import exiting
from resumeloader.handout import engine as engine_lib
from resumeloader.handout import stream
from resumeloader.sources import tfrecord
from resumeloader.stages import blocks as block_stage
from resumeloader.tfdata import columns as columns_lib
from resumeloader.tfdata import delivery, graph, graph_batches, graph_order, graph_path
from resumeloader.workers import checks

__all__ = ["READ_AHEAD", "TFRecordGraphPath"]

#: Windows read at once (in parallel, in order): the one being batched and the next.
READ_AHEAD = 2
#: The TFRecord reader's buffer per run of records.
BUFFER_BYTES = 1 << 20
_RECORD = tf.TensorSpec([], tf.string)
_no_autograph = tf.autograph.experimental.do_not_convert
# The int64 arrays `window_at` returns, in order.
_FIELDS = ("files", "offsets", "counts", "rows", "edges", "indices", "where")


class TFRecordGraphPath(delivery.DeliveryPath):
    """Local TFRecord files in the block order: each window read by TensorFlow's reader,
    each batch a gather of its window's records (see the module docstring)."""

    name = "tfrecord_graph"

    @classmethod
    def accepts(cls, engine: engine_lib.Engine) -> bool:
        plan = engine.plan
        pipeline = plan.pipeline
        source, stage = pipeline.source, pipeline.index_stage
        if not (
            isinstance(source, tfrecord.TFRecordSource)
            and isinstance(stage, block_stage.BlockStage)
            and stage.algorithm in graph_order.ALGORITHMS
            # strings read as one packed column: a plain fixed-size batch stage, no record
            # or batch map stages
            and engine.producer.reads_packed
            and not engine.backend.parallel  # workers asked for: let them make the batches
            and engine.quarantine is None  # the bad-record policy "raise"
            and plan.shard.count == 1  # a shard would read every window for a few records
            and graph_batches.GraphLayout.supports(plan.layout)
        ):
            return False
        files = source.local_files()
        if files is None:  # objects, or checksums off (TensorFlow's reader checks them)
            return False
        # Windows read ahead are held whole: at most what the source holds read by blocks.
        mean = source.mean_record_bytes() or 0.0
        return (READ_AHEAD + 1) * stage.chunk_records * stage.window_chunks * mean <= (
            tfrecord.HELD_BYTES)

    def __init__(self, engine: engine_lib.Engine, *, prefetch: int | None) -> None:
        super().__init__(engine, prefetch=prefetch)
        plan = engine.plan
        source = plan.pipeline.source
        assert isinstance(source, tfrecord.TFRecordSource)
        self._source = source
        files = source.local_files()
        assert files is not None
        self._files = files
        stage = plan.pipeline.index_stage
        assert isinstance(stage, block_stage.BlockStage)
        self._order = stage.order(plan.pipeline.seed)
        layout = plan.layout
        per, size = layout.records_per_epoch, layout.batch_size
        #: Positions of an epoch that batches hold (a dropped remainder left out).
        self._usable = per - per % size if layout.drop_remainder else per
        self._windows_per_epoch = -(-self._usable // self._order.window_records)
        self._metadata = (graph_batches.GraphBatches(plan).metadata
                          if self.finisher.seeded else None)
        with tf.init_scope():
            # As the graph path's: the iteration whose windows may be made (-1: none) and
            # the batches of its windows made so far (`stream.Counter`).
            self._serial = tf.Variable(-1, dtype=tf.int64, trainable=False)
            self._produced = tf.Variable(0, dtype=tf.int64, trainable=False)
        self._serials = itertools.count()

    # -- stream.Counter ------------------------------------------------------------------
    def produced(self) -> int:
        """Batches in the windows the current iteration made so far."""
        return int(self._produced.numpy())

    def supersede(self) -> None:
        """Makes the current iteration fail at its next window."""
        self._serial.assign(-1, read_value=False)

    def begin(self, position: int, watch: delivery.Watch | None) -> int:
        """Starts an iteration at `position` (told to `watch`); returns its serial."""
        if watch is not None:
            watch(position, iter(()), counter=self)  # supersedes the previous one
        serial = next(self._serials)
        self._produced.assign(0, read_value=False)
        self._serial.assign(serial, read_value=False)
        return serial

    # -- Python, once per window -----------------------------------------------------------
    def chunks(self, position: int, *, rest_of_epoch: bool) -> int:
        """The windows of the iteration from normalised `position` (`_Begin` asks)."""
        layout = self.engine.plan.layout
        if layout.end is not None and position >= layout.end:
            return 0
        first = self._first_windows(position)
        if rest_of_epoch:
            return first
        if layout.num_epochs is None:
            return graph_batches.ENDLESS
        later = layout.num_epochs - position // layout.records_per_epoch - 1
        return first + max(0, later) * self._windows_per_epoch

    def _first_windows(self, position: int) -> int:
        """The windows of `position`'s epoch from the one holding it."""
        offset = position % self.engine.plan.layout.records_per_epoch
        if offset >= self._usable:
            return 0
        return self._windows_per_epoch - offset // self._order.window_records

    def window_place(self, position: int, number: int) -> tuple[int, int, int, int]:
        """Window `number` of the iteration from normalised `position`: its epoch, its
        number in the epoch and the positions ``[low, high)`` of the epoch it gives."""
        per = self.engine.plan.layout.records_per_epoch
        size = self._order.window_records
        epoch, offset = divmod(position, per)
        first = self._first_windows(position)
        if number < first:
            window = offset // size + number
            low = max(window * size, offset)
        else:
            later, window = divmod(number - first, self._windows_per_epoch)
            epoch += 1 + later
            low = window * size
        return epoch, window, low, min((window + 1) * size, self._usable)

    def window_at(self, position: int, number: int, serial: int) -> list[np.ndarray]:
        """What the graph needs of window `number` of the iteration from `position`
        (int64 arrays, `_FIELDS`):

        * ``files``, ``offsets``, ``counts``: its runs of records (its chunks in record
          order, neighbours merged, cut at file ends): file, byte offset, records;
        * ``rows``: for each position of the window in the iteration, its record's row
          in the window's records (read run after run);
        * ``edges``: where the batches made in this window start and end in ``rows``
          (the first one may start with the rows carried from the window before);
        * ``indices``: the record indices of those batches, carried rows included (for
          the metadata; empty when no metadata is needed);
        * ``where``: its epoch, the position of its first batch's first record, whether
          that batch starts with carried rows, its batches, its records, its number in
          the epoch and `serial`.
        """
        plan = self.engine.plan
        layout, order, files = plan.layout, self._order, self._files
        size = layout.batch_size
        epoch, window, low, high = self.window_place(position, number)
        chunk = order.chunk_records
        chunks = np.sort(np.asarray(order.window_chunk_ids(epoch, window), np.int64))
        firsts = chunks * chunk
        lasts = np.minimum(firsts + chunk, order.num_records)
        before = np.concatenate([[0], np.cumsum(lasts - firsts)])
        runs_files, runs_offsets, runs_counts = _runs(files, firsts, lasts)
        indices = plan.indices(epoch, low, high)
        at = np.searchsorted(chunks, indices // chunk)
        rows = before[at] + indices - firsts[at]
        carried = low % size  # rows of an unfinished batch carried from the window before
        head = min((size - carried) % size, high - low)
        epoch_end = high == self._usable
        if carried and (carried + head == size or epoch_end):
            cuts = [0, head, *range(head + size, high - low + 1, size)]
        elif carried:  # the window ends before the batch does: all of it carried on
            cuts = [0]
        else:
            cuts = list(range(0, high - low + 1, size))
        if epoch_end and cuts[-1] != high - low:
            cuts.append(high - low)  # the epoch's last, short batch
        edges = np.array(cuts, np.int64)
        uses_carry = bool(carried) and len(cuts) > 1
        first = low - carried if uses_carry else low
        if self._metadata is not None and len(cuts) > 1:
            batch_indices = plan.indices(epoch, first, low + cuts[-1])
        else:
            batch_indices = np.empty(0, np.int64)
        where = np.array([epoch, epoch * layout.records_per_epoch + first, uses_carry,
                          len(cuts) - 1, int(before[-1]), window, serial], np.int64)
        return [runs_files, runs_offsets, runs_counts, rows, edges, batch_indices, where]

    def read_again(self, epoch: int, window: int, found: int, expected: int) -> np.ndarray:
        """The window's records read by the source (after TensorFlow's reader found
        `found` of its `expected` records, or a file of it changed): raises the
        source's error, naming the file, record and byte offset, unless every record
        reads well now."""
        order = self._order
        chunks = np.sort(np.asarray(order.window_chunk_ids(epoch, window), np.int64))
        firsts = chunks * order.chunk_records
        lasts = np.minimum(firsts + order.chunk_records, order.num_records)
        indices = np.concatenate([np.arange(a, b, dtype=np.int64)
                                  for a, b in zip(firsts.tolist(), lasts.tolist(), strict=True)])
        try:
            records = self._source.read_batch(indices)
        except Exception as err:
            raise checks.batch_error(
                "read_batch", err, indices, epoch,
                epoch * self.engine.plan.layout.records_per_epoch
                + window * order.window_records,
            ) from err
        out = np.empty(len(records), dtype=object)
        out[:] = records
        return out

    def window_ok(self, found: int, expected: int, files: np.ndarray) -> bool:
        """Whether TensorFlow's reader found all the window's records and none of its
        files changed since the source was built."""
        return found == expected and not self._files.changed(files)

    # -- the dataset ---------------------------------------------------------------------
    def dataset(
        self,
        start: Callable[[], int],
        *,
        rest_of_epoch: bool,
        watch: delivery.Watch | None = None,
    ) -> tf.data.Dataset:
        begin = graph_path.Begin(start, watch, self, rest_of_epoch=rest_of_epoch)
        # Without a watch (the eager loop's pipeline, which the ledger follows by the
        # batches' ends) no iteration is counted or checked: the loop supersedes the
        # dataset() iterations once it has started its own.
        checked = watch is not None
        produced, current = self._produced, self._serial
        names = tf.constant(self._files.paths, tf.string)
        metadata, seeded = self._metadata, self.finisher.seeded
        treespec = self.spec.treespec
        size = self.engine.plan.layout.batch_size
        drop = self.engine.plan.layout.drop_remainder
        exiting.install()
        place = columns_lib.weakly(self, _window_at)
        ok = columns_lib.weakly(self, _window_ok)
        again = columns_lib.weakly(self, _read_again)

        @_no_autograph
        def planned(position: tf.Tensor, number: tf.Tensor, serial: tf.Tensor) -> dict[str, Any]:
            made = tf.numpy_function(place, [position, number, serial], [tf.int64] * 7,
                                     stateful=False)
            for value in made:
                value.set_shape([None])
            return dict(zip(_FIELDS, made, strict=True))

        @_no_autograph
        def run(name: tf.Tensor, offset: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
            variant = tf.raw_ops.TFRecordDatasetV2(
                filenames=tf.reshape(name, [1]), compression_type="",
                buffer_size=tf.constant(BUFFER_BYTES, tf.int64),
                byte_offsets=tf.reshape(offset, [1]))
            # A corrupt or missing record ends the run: the count finds it (`window_ok`).
            return tf.data.experimental.from_variant(variant, _RECORD).take(count).ignore_errors()

        @_no_autograph
        def read(window: dict[str, Any]) -> dict[str, Any]:
            where = window["where"]
            expected = where[4]
            runs = tf.data.Dataset.from_tensor_slices(
                (tf.gather(names, window["files"]), window["offsets"], window["counts"]))
            records = runs.flat_map(run).batch(tf.maximum(expected, 1)).concatenate(
                tf.data.Dataset.from_tensors(tf.constant([], tf.string))).take(1)
            records = records.get_single_element()
            found = tf.size(records, out_type=tf.int64)
            good = tf.numpy_function(ok, [found, expected, window["files"]], tf.bool,
                                     stateful=True)
            records = tf.cond(
                tf.reshape(good, []), lambda: records,
                lambda: tf.numpy_function(again, [where[0], where[5], found, expected],
                                          tf.string, stateful=True))
            records.set_shape([None])
            return {**window, "records": records}

        @_no_autograph
        def carry(kept: tf.Tensor, window: dict[str, Any]) -> tuple[tf.Tensor, Any]:
            where, edges, rows = window["where"], window["edges"], window["rows"]
            batches = where[3]
            counted = []
            if checked:
                valid = tf.debugging.Assert(
                    tf.equal(current.read_value(), where[6]), [graph_path.SUPERSEDED])
                with tf.control_dependencies([valid]):
                    counted = [produced.assign_add(batches, read_value=False)]
            tail = tf.gather(window["records"], rows[edges[-1]:])
            # Rows of a batch the window does not finish go on to the next window.
            kept_next = tf.cond(batches > 0, lambda: tail,
                                lambda: tf.concat([kept, tail], 0))
            with tf.control_dependencies(counted):
                batches = tf.identity(batches)
            return kept_next, {**window, "kept": kept, "batches": batches}

        @_no_autograph
        def refs(window: dict[str, Any]) -> tf.data.Dataset:
            batches = window.pop("batches")
            return tf.data.Dataset.zip((tf.data.Dataset.from_tensors(window).repeat(batches),
                                        tf.data.Dataset.range(batches)))

        @_no_autograph
        def gathered(window: dict[str, Any], k: tf.Tensor) -> Any:
            where, edges = window["where"], window["edges"]
            low, high = edges[k], edges[k + 1]
            rows = tf.gather(window["records"], window["rows"][low:high])
            first = tf.logical_and(tf.equal(k, 0), tf.equal(where[2], 1))
            kept = window["kept"]
            rows = tf.cond(first, lambda: tf.concat([kept, rows], 0), lambda: rows)
            if drop:
                rows = tf.ensure_shape(rows, [size])
            data = optree.tree_unflatten(treespec, [rows])
            if not seeded:
                return data
            assert metadata is not None
            shift = tf.where(k > 0, where[2] * tf.size(kept, out_type=tf.int64),
                             tf.zeros([], tf.int64))
            start, stop = low + shift, high + where[2] * tf.size(kept, out_type=tf.int64)
            indices = window["indices"][start:stop]
            if drop:
                indices = tf.ensure_shape(indices, [size])
            batch = graph_batches.BatchIndices(indices, where[0], where[1] + start)
            return data, metadata(batch)

        @_no_autograph
        def iteration(_: tf.Tensor) -> tf.data.Dataset:
            position, serial, windows = (
                tf.reshape(value, ()) for value in tf.py_function(begin, [], [tf.int64] * 3))
            planned_windows = tf.data.Dataset.range(windows).map(
                lambda j: planned(position, j, serial))
            parallel = {} if graph.op_determinism() else {
                "num_parallel_calls": READ_AHEAD, "deterministic": True}
            return planned_windows.map(read, **parallel)

        ds = tf.data.Dataset.range(1).flat_map(iteration)
        ds = ds.scan(tf.constant([], tf.string), carry).flat_map(refs)
        ds = ds.map(gathered, **graph.parallel_map())  # sequential under op determinism
        return self.prefetched(self.finisher.map(ds, self.batch_dim)).with_options(
            graph_path.OPTIONS)

    # -- for batch in loader ------------------------------------------------------------
    def eager(self, position: int) -> Iterator[tuple[Any, int]]:
        """The batches of ``for batch in loader`` from `position`, each with the position
        after it: the produced batches (`DeliveryPath.eager`, a Python thread); with tensor
        stages the batches of this path's dataset, each batch's end from the layout."""
        if not self.finisher.stages:
            return super().eager(position)
        with self._eager_lock:
            pipeline = self.eager_pipeline(
                lambda: self.dataset(lambda: self._eager_start, rest_of_epoch=False))
            self._eager_start = position
            iterator = iter(pipeline)
            first = next(iterator, None)
        ends: deque[int] = deque()
        layout = self.engine.plan.layout

        def elements() -> Iterator[Any]:
            at = position
            for batch in itertools.chain([] if first is None else [first], iterator):
                at = layout.advance(at, 1)
                ends.append(at)
                yield batch

        return stream.EagerBatches(elements(), ends)

    # -- describe() ------------------------------------------------------------------
    def source_row(self) -> delivery.Row:
        pipeline = self.engine.plan.pipeline
        record = self.engine.producer.spec.describe()
        how = ("each window's chunks read by TensorFlow's TFRecord reader from their byte "
               "offsets (TFRecordDatasetV2, CRC32C checked)")
        return ("source", f"{pipeline.source.description}: {how}", record, "re-read")

    def handover_rows(self) -> list[delivery.Row]:
        mapped = "map(AUTOTUNE, deterministic)"
        return [
            ("order", "tfrecord_graph path: each window's runs, rows and batch edges by "
             f"NumPy (the plan's order, one numpy_function per window), {READ_AHEAD} windows "
             "read at once", "string[None]", "recomputed"),
            ("map", f"tf.gather(window records, rows), {mapped}", self.batch_text(),
             "recomputed"),
        ]


def _runs(files: tfrecord.LocalFiles, firsts: np.ndarray, lasts: np.ndarray
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The runs of records ``[firsts[k], lasts[k])`` (sorted, disjoint): neighbours merged,
    cut at file ends, as (file, byte offset of the first record, records)."""
    joined = np.flatnonzero(firsts[1:] != lasts[:-1]) + 1
    lows = firsts[np.concatenate([[0], joined])]
    highs = lasts[np.concatenate([joined - 1, [len(lasts) - 1]])]
    out_files, out_offsets, out_counts = [], [], []
    for low, high in zip(lows.tolist(), highs.tolist(), strict=True):
        file = int(np.searchsorted(files.ends, low, side="right"))
        while low < high:
            stop = min(high, int(files.ends[file]))
            if stop > low:
                out_files.append(file)
                out_offsets.append(int(files.offsets[low]))
                out_counts.append(stop - low)
            low = stop
            file += 1
    return (np.array(out_files, np.int64), np.array(out_offsets, np.int64),
            np.array(out_counts, np.int64))


def _window_at(path: TFRecordGraphPath, position: Any, number: Any, serial: Any
               ) -> list[np.ndarray]:
    return path.window_at(int(position), int(number), int(serial))


def _window_ok(path: TFRecordGraphPath, found: Any, expected: Any, files: Any) -> np.ndarray:
    return np.array(path.window_ok(int(found), int(expected), files))


def _read_again(path: TFRecordGraphPath, epoch: Any, window: Any, found: Any, expected: Any
                ) -> np.ndarray:
    return path.read_again(int(epoch), int(window), int(found), int(expected))
