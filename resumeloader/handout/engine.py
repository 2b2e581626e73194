"""`Engine`: a loader without TensorFlow — a plan's batches from any position, and its state.

The engine connects what the layers below decide: the plan's tasks from a position
(`resumeloader.stages.plan`), made into batches by a worker backend
(`resumeloader.workers`), each task's replaced records logged by the quarantine as it
is handed out (`quarantine`), flattened into batches each with the position after it
(`stream`); and a position's state and a state's position (`resume`). Its `board`
counts and times every stage per batch (`resumeloader.core.board`). A delivery
path of the TensorFlow layer (`resumeloader.tfdata.delivery`) hands these batches to
tf.data or to an eager loop and keeps the position in a ``tf.Variable``; the engine
keeps no position itself. No TensorFlow here.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from typing import Any

from resumeloader.core import board as board_lib
from resumeloader.core import meters, positions
from resumeloader.handout import quarantine as quarantine_lib
from resumeloader.handout import resume, stream
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import options, produce, readahead, timing, tuning

__all__ = ["Engine"]

SAMPLER, TRANSFER, HAND_OFF = timing.SAMPLER, timing.TRANSFER, timing.HAND_OFF

Watch = stream.Watch


class Engine:
    """The batches of a plan, made by the backend of `workers`, from any position.

    Args:
        plan: the plan whose batches are made (its pipeline's `record_spec`, or
            record 0's, is the per-record spec).
        workers: where batches are made.
        with_metadata: the loader yields ``(batch, metadata)``.
    """

    def __init__(
        self, plan: plan_lib.Plan, workers: options.Workers, *, with_metadata: bool
    ) -> None:
        self.plan = plan
        self.workers = workers
        self.with_metadata = with_metadata
        #: Whether batches travel with their per-record metadata (yielded, or the seeds
        #: the tensor stages need).
        self.labelled = with_metadata or bool(plan.pipeline.tensor_stages)
        #: Where the stages are counted and timed (None: ``RESUMELOADER_STATS=0``).
        self.board: board_lib.Board | None = board_lib.Board() if meters.enabled() else None
        self.producer = produce.BatchProducer(plan.pipeline, board=self.board)
        #: The worker backend making the batches (`resumeloader.workers.backend`).
        self.backend = workers.backend(self.producer)
        if self.board is not None:
            names = self.producer.names
            self.board.chain = [SAMPLER, *names.produced, TRANSFER, HAND_OFF, *names.tensors]
            self.board.watch_counts(timing.storage_stats, "storage")
        policy = plan.pipeline.error_policy
        #: Logs the bad-record policy's replacements as batches are handed out.
        self.quarantine = (
            quarantine_lib.Quarantine(policy, plan.order_fields()) if policy.replaces else None
        )

    # -- batches ---------------------------------------------------------------------
    def batches(
        self,
        position: int,
        *,
        plan: plan_lib.Plan | None = None,
        layout: positions.Layout | None = None,
        watch: Watch | None = None,
    ) -> Generator[tuple[Any, int], None, None]:
        """``(batch, the position after it)`` from normalised `position` on: NumPy batches
        (variable leaves wire-encoded), labelled with metadata when `labelled`.

        Args:
            position: where the stream starts.
            plan: another plan of the same pipeline (a sub-shard for distributed input);
                default: the engine's.
            layout: how the stream is cut (e.g. the rest of an epoch); default: the plan's.
            watch: ``watch(position, tasks)`` sees the tasks before they are made and is
                told the position after each batch as it is produced.
        """
        plan = self.plan if plan is None else plan
        layout = plan.layout if layout is None else layout
        tasks = plan.tasks(position, layout, place=self._sampler(), stage=SAMPLER)
        if self.backend.reads_in_this_process:  # a source with `prefetch` reads ahead
            tasks = readahead.hinted(tasks, plan.pipeline.source, memory=self._memory(),
                                     board=self.board)
        on_batch = None
        if watch is not None:
            tasks, on_batch = watch(position, tasks)
        produced = self.backend.run(tasks)
        if self.quarantine is not None:
            produced = quarantine_lib.handed_out(self.quarantine, plan, self.producer, produced)
        return stream.batches(
            produced, layout, position, seed=plan.pipeline.seed, with_metadata=self.labelled,
            on_batch=on_batch,
        )

    def _memory(self) -> int:
        """The RAM budget of read-ahead: the `Tuning`'s of ``Workers("auto")``, else the
        default (`tuning.memory_budget`)."""
        given = self.workers.options
        return tuning.memory_budget(given if isinstance(given, tuning.Tuning) else tuning.Tuning())

    def indices(
        self, position: int, *, layout: positions.Layout | None = None, watch: Watch | None = None
    ) -> Iterator[Any]:
        """The record indices of each batch from normalised `position` on, labelled like
        `batches` (for a path that reads the records itself: a plain batch stage with
        batched reads and no bad-record policy)."""
        plan = self.plan
        layout = plan.layout if layout is None else layout
        tasks = plan.tasks(position, layout, place=self._sampler(), stage=SAMPLER)
        on_batch = None
        if watch is not None:
            tasks, on_batch = watch(position, tasks)
        for task in tasks:
            if on_batch is not None:
                on_batch(layout.normalise(task.position + len(task.indices)))
            yield stream.labelled(
                task.indices, task, None, seed=plan.pipeline.seed, with_metadata=self.labelled
            )

    def _sampler(self) -> Any:
        """Where the computing of each task's record indices is counted and timed as the
        sampler's (`plan_lib.Plan.tasks`): the iterating thread's place, or None."""
        return None if self.board is None else self.board.here

    # -- state -----------------------------------------------------------------------
    def state_of(self, position: int) -> dict[str, Any]:
        """The state of normalised `position`, once the quarantine log's lines written
        so far are durable (no checkpoint outlives them)."""
        self.sync()
        return resume.state_of(self.plan, position)

    def resume(self, state: Any) -> int:
        """The normalised position at which `state` continues (`resume.resume`: every
        check made, nothing changed)."""
        return resume.resume(self.plan, self.producer, state)

    # -- lifetime --------------------------------------------------------------------
    def sync(self) -> None:
        """Makes the quarantine log's lines durable (see `Quarantine.sync`), if any."""
        if self.quarantine is not None:
            self.quarantine.sync()

    def close(self) -> None:
        """Stops the backend's workers (a later iteration starts new ones); syncs the log."""
        self.backend.close()
        self.sync()
