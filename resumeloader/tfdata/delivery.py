"""How a loader's batches are made and handed over: the delivery path, chosen once, here.

What the stream holds is decided by the plan (stages); this module only decides how
it is produced and handed to TensorFlow, and never changes it:

* ``gather``: in-memory numeric columns, no record stage, no workers. Python yields
  only index arrays and ``tf.gather`` builds the batches inside tf.data (for
  ``dataset()``; the eager loop reads each batch with one fancy-index).
* ``read_batch``: a source with batched reads and no record stage: one call per batch.
* ``records``: each record read and run through the record stages, then assembled.

``read_batch`` and ``records`` run in the calling thread or in thread or process
workers (`WorkerSettings`), in order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import tensorflow as tf

from resumeloader.core import positions, rng
from resumeloader.core import spec as spec_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.tfdata import gather, generator, graph, prefetch
from resumeloader.workers import ordered, produce

__all__ = ["Delivery"]

AUTOTUNE = tf.data.AUTOTUNE
# (start position, tasks) -> the same tasks, observed.
Watch = Callable[[int, Iterator[plan_lib.Task]], Iterator[plan_lib.Task]]


class Delivery:
    """The production and hand-over of a plan's batches (see the module docstring).

    Args:
        plan: the plan whose batches are delivered.
        spec: the per-record spec, or None to infer it from record 0.
        prefetch: batches prepared ahead of the consumer; None or 0 for none.
        with_metadata: deliver ``(batch, metadata)``.
        num_workers: workers preparing batches in parallel (0: none).
        worker_type: "thread" or "process".
        worker_timeout: seconds to wait for one batch from a worker, or None.
    """

    def __init__(
        self,
        plan: plan_lib.Plan,
        *,
        spec: spec_lib.RecordSpec | None,
        prefetch: int | None,
        with_metadata: bool,
        num_workers: int,
        worker_type: str,
        worker_timeout: float | None = None,
    ) -> None:
        self.plan = plan
        self.prefetch = prefetch
        self.with_metadata = with_metadata
        self.workers = ordered.WorkerSettings(
            num_workers, worker_type, pipeline=plan.pipeline, timeout=worker_timeout
        )
        self.producer = produce.BatchProducer(plan.pipeline, spec)
        # The generators of this delivery's datasets (see resumeloader.tfdata.generator).
        self.generators: list[Any] = []
        self.spec = self.producer.spec
        columns = plan.pipeline.source.columns()
        self.gatherer: gather.Gatherer | None = None
        if self.producer.reads_batches and not num_workers and columns is not None:
            leaves, treespec = columns
            if gather.Gatherer.supports(leaves, treespec, self.spec):
                self.gatherer = gather.Gatherer(leaves, treespec)
        if self.gatherer is not None:
            self.path = "gather"
        elif self.producer.reads_batches:
            self.path = "read_batch"
        else:
            self.path = "records"

    # -- what is delivered ------------------------------------------------------------
    def element_spec(self, batch_dim: int | None) -> Any:
        """The structure of `tf.TensorSpec` of one batch with leading dimension `batch_dim`."""
        return graph.element_spec(self.spec, batch_dim, self.with_metadata)

    def _labelled(self, value: Any, task: plan_lib.Task) -> Any:
        """`value`, paired with the task's per-record metadata when asked for."""
        if not self.with_metadata:
            return value
        seed = self.plan.pipeline.seed
        return value, rng.metadata(seed, task.indices, task.epoch, task.position)

    def batches(
        self,
        plan: plan_lib.Plan,
        layout: positions.Layout,
        position: int,
        watch: Watch | None = None,
    ) -> Iterator[Any]:
        """NumPy batches of `plan`'s stream cut by `layout`, from normalised `position` on.

        `watch(position, tasks)`, when given, sees the tasks before they are produced.
        """
        tasks = plan.tasks(position, layout)
        if watch is not None:
            tasks = watch(position, tasks)
        for task, batch in self.workers.produce(self.producer, tasks):
            yield self._labelled(batch, task)

    def _index_arrays(
        self, layout: positions.Layout, position: int, watch: Watch | None = None
    ) -> Iterator[Any]:
        tasks = self.plan.tasks(position, layout)
        if watch is not None:
            tasks = watch(position, tasks)
        for task in tasks:
            yield self._labelled(task.indices, task)

    # -- how -----------------------------------------------------------------------
    def prefetched(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        """`ds` followed by the loader's prefetch."""
        return ds.prefetch(self.prefetch) if self.prefetch else ds

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
            element_spec: the element spec the batches are given.
            watch: ``watch(position, tasks)`` is called when an iteration begins and
                its tasks pass through what it returns (the loader's ledger).
        """
        plan = self.plan
        self.workers.start(self.producer)

        def layout_and_start() -> tuple[positions.Layout, int]:
            position = start()
            return (plan.rest_of_epoch(position) if rest_of_epoch else plan.layout), position

        if self.gatherer is not None:
            ds = self.gatherer.dataset(
                lambda: self._index_arrays(*layout_and_start(), watch),
                element_spec,
                with_metadata=self.with_metadata,
            )
        else:
            ds = generator.from_generator(
                lambda: self.batches(plan, *layout_and_start(), watch),
                element_spec,
                keep=self.generators,
            )
        return self.prefetched(ds)

    def eager(self, position: int) -> Iterator[Any]:
        """Tensors of the plan's batches from `position`, prepared by a Python thread.

        Up to `prefetch` batches ahead (2 for ``AUTOTUNE``; none for None or 0),
        without tf.data: no per-batch ``py_func`` round trip, no iterator start-up.
        """
        depth = 2 if self.prefetch == AUTOTUNE else self.prefetch or 0
        plan = self.plan
        self.workers.start(self.producer)
        return prefetch.prefetched(lambda: self.batches(plan, plan.layout, position), depth)

    def close(self) -> None:
        """Stops the process workers (a later iteration starts new ones)."""
        self.workers.close()

    def describe(self) -> list[tuple[str, str, str, str]]:
        """Rows (stage, what, element, state) of the delivery, for ``describe()``."""
        batch = graph.spec_text(self.element_spec(None))
        rows = []
        if self.gatherer is not None:
            rows.append(
                ("from_generator", "index array of each batch", "int64[None]", "recomputed")
            )
            rows.append(("map", "tf.gather(source, indices)", batch, "recomputed"))
        else:
            workers = self.workers.num_workers
            if workers:
                kind = self.workers.worker_type
                plan = f"{workers} {kind} worker{'s' if workers != 1 else ''}, "
                plan += f"<= {self.workers.in_flight} in flight, in order"
                plan += ", shared memory" if kind == "process" else ""
            else:
                plan = "in the generator thread (num_workers=0)"
            rows.append(("workers", plan, batch, "recomputed"))
            rows.append(("from_generator", "Dataset.from_generator", batch, "recomputed"))
        if self.prefetch:
            size = "AUTOTUNE" if self.prefetch == AUTOTUNE else str(self.prefetch)
            rows.append(("prefetch", f"prefetch({size})", batch, "recomputed"))
        return rows
