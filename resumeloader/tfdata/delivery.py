"""How a loader's batches are made and handed over: the delivery path, chosen once, here.

What the stream holds is decided by the plan (stages); this module only decides how
it is produced and handed to TensorFlow, and never changes it:

* ``gather``: in-memory fixed-shape numeric columns, no record stage, no workers.
  Python yields only index arrays and ``tf.gather`` builds the batches inside tf.data
  (for ``dataset()``; the eager loop reads each batch with one fancy-index).
* ``read_batch``: a source with batched reads and no record stage: one call per batch.
* ``records``: each record read and run through the record stages, then assembled.

``read_batch`` and ``records`` run on the loader's worker backend (`Workers`: the
calling thread, threads, processes; `resumeloader.workers.backend`), in order. Their
batches hold variable leaves (strings, ragged arrays) in the batch wire format; the
generator decodes them (`graph.decode`) and a `Finisher` turns them into ``tf.string``
and ``tf.RaggedTensor`` leaves and runs the tensor stages (`Pipeline.tf_map`), inside
tf.data. ``for batch in loader`` takes the same steps eagerly in its prefetch thread,
or iterates the tf.data pipeline when there are tensor stages, so that their ops run
in the same runtime as ``dataset()``.
Every path hands over the batches of `resumeloader.handout.stream` (a window's batches
one by one, each with the position after it).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import Any

import tensorflow as tf

from resumeloader.core import positions
from resumeloader.handout import quarantine, stream
from resumeloader.stages import plan as plan_lib
from resumeloader.tfdata import gather, generator, graph, prefetch, tf_map
from resumeloader.workers import options, produce, readahead

__all__ = ["Delivery"]

AUTOTUNE = tf.data.AUTOTUNE
Watch = stream.Watch


class Delivery:
    """The production and hand-over of a plan's batches (see the module docstring).

    Args:
        plan: the plan whose batches are delivered (its pipeline's `record_spec`, or
            record 0's, is the per-record spec).
        workers: where batches are made.
        prefetch: batches prepared ahead of the consumer; None or 0 for none.
        with_metadata: deliver ``(batch, metadata)``.
    """

    def __init__(
        self,
        plan: plan_lib.Plan,
        *,
        workers: options.Workers,
        prefetch: int | None,
        with_metadata: bool,
    ) -> None:
        self.plan = plan
        self.prefetch = prefetch
        self.with_metadata = with_metadata
        self.workers = workers
        self.producer = produce.BatchProducer(plan.pipeline)
        #: The worker backend making the batches (`resumeloader.workers.backend`).
        self.backend = workers.backend(self.producer)
        policy = plan.pipeline.error_policy
        #: Logs the bad-record policy's replacements as batches are handed out.
        self.quarantine = (
            quarantine.Quarantine(policy, plan.order_fields()) if policy.replaces else None
        )
        # The generators of this delivery's datasets (see resumeloader.tfdata.generator).
        self.generators: list[Any] = []
        #: The spec of one row of the delivered batches (the batch stage's output).
        self.spec = self.producer.output_spec
        self.finisher = tf_map.Finisher(self.spec, plan.pipeline.tensor_stages, with_metadata)
        stage = plan.pipeline.batch_stage
        assert stage is not None
        #: The static batch size of the loader's batches (None when it may vary).
        self.batch_dim = stage.batch_dim
        columns = plan.pipeline.source.columns()
        self.gatherer: gather.Gatherer | None = None
        # Batch map stages run in Python on every batch: not on the graph's gather path.
        fixed = not self.spec.variable and stage.stacks and not plan.pipeline.batch_map_stages
        inline = workers.kind == "inline"  # the gather path has no workers
        if self.producer.reads_batches and inline and columns is not None and fixed:
            leaves, treespec = columns
            if gather.Gatherer.supports(leaves, treespec, self.spec):
                self.gatherer = gather.Gatherer(leaves, treespec)
        self._eager_lock = threading.Lock()
        self._eager_dataset: tf.data.Dataset | None = None
        self._eager_start = 0
        self._eager_ends: deque[int] = deque()
        if self.gatherer is not None:
            self.path = "gather"
        elif self.producer.reads_batches:
            self.path = "read_batch"
        else:
            self.path = "records"

    # -- what is delivered ------------------------------------------------------------
    def element_spec(self, batch_dim: int | None) -> Any:
        """The structure of `tf.TypeSpec` of one element with leading dimension `batch_dim`."""
        return self.finisher.element_spec(batch_dim)

    def batches(
        self,
        plan: plan_lib.Plan,
        layout: positions.Layout,
        position: int,
        watch: Watch | None = None,
    ) -> Generator[Any, None, None]:
        """NumPy batches of `plan`'s stream cut by `layout`, from normalised `position` on.

        `watch(position, tasks)`, when given, sees the tasks before they are produced
        and is told the position after each batch as it is produced.
        """
        with contextlib.closing(self._stream(plan, layout, position, watch)) as produced:
            for batch, _ in produced:
                yield batch

    def _stream(
        self, plan: plan_lib.Plan, layout: positions.Layout, position: int, watch: Watch | None
    ) -> Generator[tuple[Any, int], None, None]:
        tasks = plan.tasks(position, layout)
        in_process = self.workers.kind in ("inline", "thread")  # where the source is read
        if in_process and plan.pipeline.source.prefetches:
            tasks = readahead.hinted(tasks, plan.pipeline.source)
        on_batch = None
        if watch is not None:
            tasks, on_batch = watch(position, tasks)
        produced = self.backend.run(tasks)
        if self.quarantine is not None:
            produced = quarantine.handed_out(self.quarantine, plan, self.producer, produced)
        return stream.batches(
            produced, layout, position, seed=plan.pipeline.seed,
            with_metadata=self.finisher.seeded, on_batch=on_batch,
        )

    def _index_arrays(
        self, layout: positions.Layout, position: int, watch: Watch | None = None
    ) -> Iterator[Any]:
        tasks = self.plan.tasks(position, layout)
        produced: Callable[[int], None] | None = None
        if watch is not None:
            tasks, produced = watch(position, tasks)
        for task in tasks:
            if produced is not None:
                produced(layout.normalise(task.position + len(task.indices)))
            yield stream.labelled(
                task.indices, task, None, seed=self.plan.pipeline.seed,
                with_metadata=self.finisher.seeded,
            )

    # -- how -----------------------------------------------------------------------
    def prefetched(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """`ds` followed by the loader's prefetch."""
        return ds.prefetch(self.prefetch) if self.prefetch else ds

    def _decoded(self, batches: Generator[Any, None, None]) -> Generator[Any, None, None]:
        """The generator's elements: `batches` with their variable leaves decoded. Closing
        it closes `batches` at once (and so their worker pool)."""
        spec, seeded = self.spec, self.finisher.seeded
        try:
            if not spec.variable:
                yield from batches
                return
            for item in batches:
                if seeded:
                    yield graph.decode(spec, item[0]), item[1]
                else:
                    yield graph.decode(spec, item)
        finally:
            batches.close()

    def generated(
        self,
        make_batches: Callable[[], Generator[Any, None, None]],
        batch_dim: int | None,
        *,
        rebatch: int | None = None,
    ) -> tf.data.Dataset:
        """The finished elements of the produced batches of ``make_batches()``, prefetched.

        Args:
            make_batches: a generator function of batches as `batches` yields them.
            batch_dim: the static size of the finished batches, or None.
            rebatch: cut every produced batch into batches of this size (one per
                replica), after assembling and before the tensor stages.
        """
        produced = batch_dim if rebatch is None else None
        self.backend.start()
        ds = generator.from_generator(
            lambda: self._decoded(make_batches()),
            self.finisher.input_spec(produced),
            keep=self.generators,
        )
        return self.prefetched(self.finisher.map(ds, batch_dim, rebatch=rebatch))

    def dataset(
        self,
        start: Callable[[], int],
        *,
        rest_of_epoch: bool,
        element_spec: Any,
        watch: Watch | None = None,
    ) -> tf.data.Dataset:
        """A dataset of the plan's batches from ``start()``, read when iteration begins.

        Args:
            start: returns the normalised position to start from.
            rest_of_epoch: end at the end of that position's epoch.
            element_spec: the element spec of the batches, ``element_spec(batch_dim)``
                (checked: the batches' static size is the delivery's `batch_dim`).
            watch: ``watch(position, tasks)`` is called when an iteration begins and
                its tasks pass through what it returns (the loader's ledger).
        """
        plan = self.plan
        if element_spec != self.element_spec(self.batch_dim):
            msg = (
                f"`element_spec` must be the delivery's own. Received: {element_spec}, "
                f"expected: {self.element_spec(self.batch_dim)}."
            )
            raise ValueError(msg)

        def layout_and_start() -> tuple[positions.Layout, int]:
            position = start()
            return (plan.rest_of_epoch(position) if rest_of_epoch else plan.layout), position

        if self.gatherer is None:
            return self.generated(
                lambda: self.batches(plan, *layout_and_start(), watch), self.batch_dim
            )
        seeded = self.finisher.seeded
        ds = self.gatherer.dataset(
            lambda: self._index_arrays(*layout_and_start(), watch),
            graph.element_spec(self.spec, self.batch_dim, seeded),
            with_metadata=seeded,
        )
        return self.prefetched(self.finisher.map(ds, self.batch_dim))

    def eager(self, position: int) -> stream.EagerBatches:
        """Tensors of the plan's batches from `position`, with the position after each,
        prepared by a Python thread.

        Up to `prefetch` batches ahead (2 for ``AUTOTUNE``; none for None or 0),
        without tf.data: no per-batch ``py_func`` round trip, no iterator start-up.
        With tensor stages the batches come from the tf.data pipeline of `dataset`
        instead (their ops then run exactly as in ``dataset()``).
        """
        if self.finisher.stages:
            return self._eager_graph(position)
        depth = 2 if self.prefetch == AUTOTUNE else self.prefetch or 0
        plan = self.plan
        ends: deque[int] = deque()
        watch: Watch = lambda _, tasks: (tasks, ends.append)  # noqa: E731
        self.backend.start()
        tensors = prefetch.prefetched(
            lambda: self._tensors(self.batches(plan, plan.layout, position, watch)), depth
        )
        return stream.EagerBatches(tensors, ends)

    def _eager_graph(self, position: int) -> stream.EagerBatches:
        # One tf.data pipeline serves every loop (building one costs ~50 ms); it reads
        # its start (and where to put the batches' ends) when its first batch is
        # produced, so both are set and the first batch taken under a lock: two loops
        # starting at once cannot mix up.
        with self._eager_lock:
            if self._eager_dataset is None:
                self._eager_dataset = self.dataset(
                    lambda: self._eager_start,
                    rest_of_epoch=False,
                    element_spec=self.element_spec(self.batch_dim),
                    watch=lambda _, tasks: (tasks, self._eager_ends.append),
                )
            self._eager_start = position
            ends = self._eager_ends = deque()
            iterator = iter(self._eager_dataset)
            first = next(iterator, None)

        def elements() -> Generator[Any, None, None]:
            if first is None:
                return
            yield first
            yield from iterator

        return stream.EagerBatches(elements(), ends)

    def _tensors(self, batches: Generator[Any, None, None]) -> Iterator[Any]:
        """Eager elements of produced `batches` (variable leaves decoded and assembled)."""
        if not self.spec.variable:
            yield from batches
            return
        with contextlib.closing(self._decoded(batches)) as decoded:
            for item in decoded:
                tensors = tf.nest.map_structure(tf.convert_to_tensor, item)
                yield self.finisher.eager(tensors, self.batch_dim)

    def check_restore(self, position: int) -> None:
        """Raises unless normalised `position` ends a batch of its window, for a batch stage
        whose batches count the records they hold: only the window's data tells, so the
        window is made (in the calling thread) before a restore changes anything.

        Raises:
            ElasticResumeError: `position` lies inside a batch of its window.
        """
        layout = self.plan.layout
        if layout.known_counts or (layout.end is not None and position >= layout.end):
            return
        if layout.window_bounds(position)[0] == position:
            return
        task = next(self.plan.tasks(position))
        made = self.producer.batch(task)
        self.producer.skips.take(task)  # made for this check only, never handed out
        ends = stream.batches(
            iter([(task, made)]), layout, position, seed=self.plan.pipeline.seed,
            with_metadata=False,
        )
        next(ends, None)

    def sync(self) -> None:
        """Makes the quarantine log's lines durable (see `Quarantine.sync`), if any."""
        if self.quarantine is not None:
            self.quarantine.sync()

    def close(self) -> None:
        """Stops the process workers (a later iteration starts new ones); syncs the log."""
        self.backend.close()
        self.sync()

    def describe(self) -> list[tuple[str, str, str, str]]:
        """Rows (stage, what, element, state) of the delivery, for ``describe()``."""
        batch = graph.spec_text(graph.element_spec(self.spec, None, self.with_metadata))
        rows = []
        if self.gatherer is not None:
            rows.append(
                ("from_generator", "index array of each batch", "int64[None]", "recomputed")
            )
            rows.append(("map", "tf.gather(source, indices)", batch, "recomputed"))
        else:
            plan = self.backend.describe()
            rows.append(("workers", plan, batch, "recomputed"))
            rows.append(("from_generator", "Dataset.from_generator", batch, "recomputed"))
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

