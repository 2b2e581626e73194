"""The delivery-path seam: how a loader's batches reach TensorFlow, one class per path.

What the stream holds is decided by the plan (stages) and made by the engine
(`resumeloader.handout.engine`: the worker backend, the quarantine, the position after
each batch); a *delivery path* only decides how those batches become the elements of
``dataset()`` and of ``for batch in loader``, and never changes them. A path is a
subclass of `DeliveryPath` with a `name`, `accepts(engine)` (whether it can deliver
that engine's batches), `dataset`, `eager` and its `describe_rows`;
`resumeloader.tfdata.paths` chooses the first that accepts, in one place.

What every path shares lives here: the `Finisher` (ragged leaves assembled, tensor
stages run, inside tf.data), the prefetch, the ``from_generator`` hand-over of produced
batches (`generated`: variable leaves decoded by `graph.decode`), and the eager loop
(`eager`): a Python thread converting the engine's batches to tensors, or — with
tensor stages — the path's own tf.data pipeline, so that their ops run in the same
runtime as ``dataset()``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Any, ClassVar

import tensorflow as tf

from resumeloader.core import positions
from resumeloader.handout import engine as engine_lib
from resumeloader.handout import stream
from resumeloader.tfdata import generator, graph, prefetch, tf_map
from resumeloader.workers import timing

__all__ = ["AUTOTUNE", "TF_DATA", "DeliveryPath", "Row", "without_ends"]

AUTOTUNE = tf.data.AUTOTUNE
#: The place of the tensor stages: tf.data's parallel map (up to a call per core).
TF_DATA = "tf.data"
Watch = stream.Watch
#: A row of ``loader.describe()``: stage, what, element, state.
Row = tuple[str, str, str, str]


def without_ends(made: Generator[tuple[Any, int], None, None]) -> Generator[Any, None, None]:
    """The batches of ``Engine.batches`` without the position after each; closing it
    closes `made` (and so stops its workers' run)."""
    with contextlib.closing(made) as produced:
        for batch, _ in produced:
            yield batch


def _rows(spec: Any, item: Any, seeded: bool) -> int:
    """The rows of a decoded batch (`item`, with its metadata when `seeded`): those of
    the metadata, or of a leaf that is not ragged, or of the outer row partition of a
    ragged one (0 if none tells)."""
    if seeded:
        return len(item[1]["index"])
    leaves = spec.treespec.flatten_up_to(item)
    for value, leaf in zip(leaves, spec.leaves, strict=True):
        if not leaf.ragged:
            return len(value)
    outer = leaves[0][1][0]
    return len(outer) if getattr(outer, "ndim", 0) else 0


class DeliveryPath:
    """How an engine's batches are handed to TensorFlow (see the module docstring).

    Args:
        engine: makes the batches.
        prefetch: batches prepared ahead of the consumer; None or 0 for none.
    """

    #: The path's name (``describe()``, `resumeloader.tfdata.paths`).
    name: ClassVar[str]

    @classmethod
    def accepts(cls, engine: engine_lib.Engine) -> bool:
        """Whether this path can deliver `engine`'s batches."""
        raise NotImplementedError

    def __init__(self, engine: engine_lib.Engine, *, prefetch: int | None) -> None:
        self.engine = engine
        self.prefetch = prefetch
        pipeline = engine.plan.pipeline
        #: The spec of one row of the delivered batches (the batch stage's output).
        self.spec = engine.producer.output_spec
        timers = None
        if engine.board is not None and pipeline.tensor_stages:
            timers = tf_map.Timers(engine.producer.names.tensors)
            engine.board.watch_place(TF_DATA, timers.read, parallel=os.cpu_count() or 1)
        self.finisher = tf_map.Finisher(
            self.spec, pipeline.tensor_stages, engine.with_metadata, timers
        )
        assert pipeline.batch_stage is not None
        #: The static batch size of the loader's batches (None when it may vary).
        self.batch_dim = pipeline.batch_stage.batch_dim
        # The generators of this path's datasets (see resumeloader.tfdata.generator).
        self.generators: list[Any] = []
        self._eager_lock = threading.Lock()
        #: The eager loops' pipeline and the op-determinism state it was built under.
        self._eager_dataset: tuple[bool, tf.data.Dataset] | None = None
        self._eager_start = 0
        self._eager_ends: deque[int] = deque()

    # -- what each path gives ----------------------------------------------------------
    def dataset(
        self, start: Callable[[], int], *, rest_of_epoch: bool, watch: Watch | None = None
    ) -> tf.data.Dataset:
        """A dataset of the plan's batches from ``start()``, read when iteration begins.

        Args:
            start: returns the normalised position to start from.
            rest_of_epoch: end at the end of that position's epoch.
            watch: ``watch(position, tasks)`` is called when an iteration begins and
                its tasks pass through what it returns (the loader's ledger).
        """
        plan = self.engine.plan

        def begin() -> tuple[int, positions.Layout]:
            position = start()
            return position, (plan.rest_of_epoch(position) if rest_of_epoch else plan.layout)

        return self.handover(begin, watch)

    def handover(
        self, begin: Callable[[], tuple[int, positions.Layout]], watch: Watch | None
    ) -> tf.data.Dataset:
        """The path's dataset (`dataset`): ``begin()``, called when an iteration begins,
        gives its position and the layout cutting its stream."""
        raise NotImplementedError

    def source_row(self) -> Row:
        """The ``describe()`` row of the source: how this path reads it."""
        raise NotImplementedError

    def handover_rows(self) -> list[Row]:
        """The ``describe()`` rows from the source's records to the tf.data elements."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------------------
    def element_spec(self, batch_dim: int | None) -> Any:
        """The structure of `tf.TypeSpec` of one element with leading dimension `batch_dim`."""
        return self.finisher.element_spec(batch_dim)

    def prefetched(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """`ds` followed by the loader's prefetch."""
        return ds.prefetch(self.prefetch) if self.prefetch else ds

    def generated(
        self,
        make_batches: Callable[[], Generator[Any, None, None]],
        batch_dim: int | None,
        *,
        rebatch: int | None = None,
    ) -> tf.data.Dataset:
        """The finished elements of the produced batches of ``make_batches()``, prefetched.

        Args:
            make_batches: a generator function of batches as `without_ends` yields them.
            batch_dim: the static size of the finished batches, or None.
            rebatch: cut every produced batch into batches of this size (one per
                replica), after assembling and before the tensor stages.
        """
        produced = batch_dim if rebatch is None else None
        self.engine.backend.start()
        ds = generator.from_generator(
            lambda: self._decoded(make_batches()),
            self.finisher.input_spec(produced),
            keep=self.generators,
        )
        return self.prefetched(self.finisher.map(ds, batch_dim, rebatch=rebatch))

    def _decoded(self, batches: Generator[Any, None, None], *, counted: bool = True
                 ) -> Generator[Any, None, None]:
        """The generator's elements: `batches` with their variable leaves decoded, each
        decoding counted as the hand-off unless not `counted` (the eager loop counts its
        hand-off where it converts). Closing it closes `batches` at once (and so their
        worker pool)."""
        spec, seeded = self.spec, self.finisher.seeded
        seeds_only = self.finisher.seeds_only
        board = self.engine.board if counted else None
        try:
            if not spec.variable:
                if seeds_only:
                    for data, meta in batches:
                        yield data, meta["seed"]
                    return
                yield from batches
                return
            place = None if board is None else board.here()
            for item in batches:
                lap = None if place is None else place.lap(timing.HAND_OFF, 0)
                decoded = graph.decode(spec, item[0] if seeded else item)
                if place is not None:
                    count = _rows(spec, (decoded, item[1]) if seeded else decoded, seeded)
                    kind = place.kinds[timing.HAND_OFF]
                    kind.records += count
                    if lap is not None:
                        kind.timed_records += count
                        lap.lap(place[timing.HAND_OFF], count)
                if seeds_only:
                    yield decoded, item[1]["seed"]
                else:
                    yield (decoded, item[1]) if seeded else decoded
        finally:
            batches.close()

    def eager(self, position: int) -> Iterator[tuple[Any, int]]:
        """Tensors of the plan's batches from `position`, with the position after each,
        prepared by a Python thread (a path may hand them out its own way).

        Up to `prefetch` batches ahead (2 for ``AUTOTUNE``; none for None or 0),
        without tf.data: no per-batch ``py_func`` round trip, no iterator start-up.
        With tensor stages the batches come from the tf.data pipeline of `dataset`
        instead (their ops then run exactly as in ``dataset()``).
        """
        if self.finisher.stages:
            return self._eager_graph(position)
        depth = 2 if self.prefetch == AUTOTUNE else self.prefetch or 0
        ends: deque[int] = deque()
        watch: Watch = lambda _, tasks, counter=None: (tasks, ends.append)  # noqa: E731
        self.engine.backend.start()
        tensors = prefetch.prefetched(
            lambda: self._tensors(without_ends(self.engine.batches(position, watch=watch))),
            depth, self.engine.board,
        )
        return stream.EagerBatches(tensors, ends)

    def eager_pipeline(self, build: Callable[[], tf.data.Dataset]) -> tf.data.Dataset:
        """The one tf.data pipeline every eager loop reuses, built by `build` — again if op
        determinism was switched since (the tensor stages' timing depends on it)."""
        state = graph.op_determinism()
        if self._eager_dataset is None or self._eager_dataset[0] != state:
            self._eager_dataset = (state, build())
        return self._eager_dataset[1]

    def _eager_graph(self, position: int) -> stream.EagerBatches:
        # One tf.data pipeline serves every loop (building one costs ~50 ms); it reads
        # its start (and where to put the batches' ends) when its first batch is
        # produced, so both are set and the first batch taken under a lock: two loops
        # starting at once cannot mix up.
        with self._eager_lock:
            pipeline = self.eager_pipeline(lambda: self.dataset(
                lambda: self._eager_start,
                rest_of_epoch=False,
                watch=lambda _, tasks, counter=None: (tasks, self._eager_ends.append),
            ))
            self._eager_start = position
            ends = self._eager_ends = deque()
            iterator = iter(pipeline)
            first = next(iterator, None)

        def elements() -> Generator[Any, None, None]:
            if first is None:
                return
            yield first
            yield from iterator

        return stream.EagerBatches(elements(), ends)

    def eager_by_layout(self, position: int) -> stream.EagerBatches:
        """The batches of this path's own dataset from `position` (one pipeline every
        loop reuses, `eager_pipeline`), each with its end from the layout's arithmetic
        (a path whose batches are made in a graph reports none to Python); its start is
        set and the first batch taken under the lock, as in `_eager_graph`."""
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

    def _tensors(self, batches: Generator[Any, None, None]) -> Iterator[Any]:
        """Eager elements of produced `batches` (variable leaves decoded and assembled)."""
        if not self.spec.variable:
            yield from batches
            return
        # `prefetch.prefetched` counts this loop's hand-off (once per batch).
        with contextlib.closing(self._decoded(batches, counted=False)) as decoded:
            for item in decoded:
                tensors = tf.nest.map_structure(tf.convert_to_tensor, item)
                yield self.finisher.eager(tensors, self.batch_dim)

    def describe_rows(self) -> list[Row]:
        """The ``describe()`` rows of the delivery: the hand-over, the tensor stages and
        the prefetch."""
        rows = self.handover_rows()
        for stage in self.finisher.stages:
            what = f"{stage.describe()}, map(AUTOTUNE, deterministic)"
            rows.append((stage.name, what, "", "recomputed"))
        if self.finisher.stages:
            rows[-1] = (*rows[-1][:2], graph.spec_text(self.element_spec(None)), rows[-1][3])
        if self.prefetch:
            size = "AUTOTUNE" if self.prefetch == AUTOTUNE else str(self.prefetch)
            final = graph.spec_text(self.element_spec(None))
            rows.append(("prefetch", f"prefetch({size})", final, "recomputed"))
        return rows

    def batch_text(self) -> str:
        """The produced batch's structure as ``describe()`` shows it."""
        return graph.spec_text(graph.element_spec(self.spec, None, self.engine.with_metadata))
