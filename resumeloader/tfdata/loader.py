"""`ResumableLoader`: a tf.data pipeline of Python records whose state is one position.

The loader is a trackable object: ``tf.train.Checkpoint(loader=loader)`` stores its
state (a short JSON string: version, order fields and fingerprint, epoch and global
offset) and restores it, validating before anything changes. On every iteration the
loader derives the record order from the position, so what tf.data read ahead
(prefetch, parallel map) is simply recomputed after a restore: the position is
advanced by the consumer, never by the producer.

What the stream holds comes from a `Pipeline` of stages bound to a `Plan`; how it is
delivered comes from a `Delivery`. The loader only keeps the position and connects
the two.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from resumeloader import errors
from resumeloader.core import sampler as sampler_lib
from resumeloader.core import shard as shard_lib
from resumeloader.core import state as state_lib
from resumeloader.core import stats as stats_lib
from resumeloader.core import validate
from resumeloader.handout import consumption, lineage
from resumeloader.handout import engine as engine_lib
from resumeloader.stages import pipeline as pipeline_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.tfdata import describe as describe_lib
from resumeloader.tfdata import distribute, graph, guard, observe, paths
from resumeloader.tfdata import position as position_lib
from resumeloader.workers import options

__all__ = ["AUTOTUNE", "ResumableLoader"]

AUTOTUNE = tf.data.AUTOTUNE
# The keywords of 0.2, never released: each refused, naming its spelling now.
_REMOVED = {
    "shard_index": "shard=Shard(index, count)",
    "shard_count": "shard=Shard(index, count)",
    "num_workers": "workers=Workers(num_workers, kind=..., timeout=...)",
    "worker_type": "workers=Workers(num_workers, kind=..., timeout=...)",
    "worker_timeout": "workers=Workers(num_workers, kind=..., timeout=...)",
}


class ResumableLoader(tf.train.experimental.PythonState):
    """Batches of a random-access source in a seeded order, resumable at the exact record.

    Guarantees: the batches after a restore are exactly those an uninterrupted run
    would have produced from the same point: same records, same order, same
    ``map_fn`` randomness (``rng`` is keyed by seed, epoch and record index), in any
    process, with any prefetch or parallel map downstream. A batch never mixes
    epochs; an epoch's last batch is short unless `drop_remainder`.

    Two ways to consume it, both of which advance the position:

    * ``for batch in loader:`` — advances by one batch as each batch is handed out.
    * ``for batch in loader.dataset():`` (e.g. inside a ``tf.function``) — call
      ``loader.advance()`` once per batch, after the step that consumed it.

    What would silently lose or repeat records raises `StreamIntegrityError` instead:
    tf.data ops after ``dataset()`` that drop, repeat, reorder or regroup batches, a
    second live iterator, a position change during a live loop, an advance past what
    the loader produced.

    This constructor is the short form of ``ResumableLoader.from_pipeline(
    Pipeline(source, seed=seed).shuffle(shuffle).map(map_fn).batch(batch_size,
    drop_remainder=drop_remainder), ...)``; compose a `Pipeline` for more stages.

    Args:
        source: a NumPy array, a dict or tuple of equal-length arrays, or any object
            with ``len()`` and ``__getitem__(int)`` (see `RandomAccessSource`).
        batch_size: records per batch (per shard), >= 1.
        seed: integer in [0, 2**64); keys the order and the ``map_fn`` generators.
        shuffle: False reads every epoch in the natural order.
        num_epochs: epochs to produce, or None for an endless stream.
        map_fn: ``map_fn(record, rng) -> element``, run in Python for every record;
            ``rng`` is a `numpy.random.Generator` keyed by (seed, epoch, record index).
        drop_remainder: drop each epoch's last batch when it is short.
        prefetch: batches prepared ahead of the consumer (by `dataset`'s
            ``prefetch``, or a thread for ``for batch in loader``, except over in-memory
            numeric arrays, which the loop gathers a chunk at a time); None or 0 for none;
            ``"auto"`` (the default, `tf.data.AUTOTUNE`) lets tf.data tune it.
        output_signature: the per-record structure of `tf.TensorSpec` (no batch
            dimension); inferred from record 0 when None.
        with_metadata: yield ``(batch, metadata)`` where metadata holds, per record,
            ``index``, ``epoch``, ``position`` and a stateless TF ``seed`` pair.
        shard: the `Shard` of each epoch's global order this loader reads (strided;
            the whole order by default).
        workers: the `Workers` that make the batches (the calling thread by
            default). Batches are handed out strictly in order whatever the workers,
            so the stream does not depend on them.

    Raises:
        TypeError: an argument has the wrong type, or is a keyword of 0.2
            (``shard_index``, ``num_workers``, ...): the message names its spelling
            now (``shard=Shard(index, count)``, ``workers=Workers(...)``).

    Examples:
        >>> import numpy as np
        >>> loader = ResumableLoader(np.arange(10), batch_size=4, seed=0, shuffle=False,
        ...                          num_epochs=1)
        >>> [b.numpy().tolist() for b in loader]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        >>> loader.set_state(dict(loader.get_state(), epoch=0, offset=4))
        >>> [b.numpy().tolist() for b in loader]
        [[4, 5, 6, 7], [8, 9]]
    """

    @validate.removed("ResumableLoader()", **_REMOVED)
    def __init__(
        self,
        source: Any,
        *,
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        num_epochs: int | None = None,
        map_fn: Callable[[Any, np.random.Generator], Any] | None = None,
        drop_remainder: bool = False,
        prefetch: int | str | None = AUTOTUNE,
        output_signature: Any = None,
        with_metadata: bool = False,
        shard: shard_lib.Shard | None = None,
        workers: options.Workers | None = None,
    ) -> None:
        if map_fn is not None and not callable(map_fn):
            msg = f"`map_fn` must be callable or None. Received: map_fn={map_fn!r}."
            raise TypeError(msg)
        described = {"output_signature": output_signature}
        pipeline = pipeline_lib.Pipeline(source, seed=seed, **({} if map_fn else described))
        pipeline = pipeline.shuffle(validate.boolean("shuffle", shuffle))
        if map_fn is not None:
            pipeline = pipeline.map(map_fn, **described)
        pipeline = pipeline.batch(batch_size, drop_remainder=drop_remainder)
        self._setup(
            pipeline, num_epochs=num_epochs, shard=shard, workers=workers, prefetch=prefetch,
            with_metadata=with_metadata,
        )

    @classmethod
    @validate.removed("ResumableLoader.from_pipeline()", **_REMOVED, output_signature=(
        "Pipeline(source, seed=..., output_signature=...) or "
        ".map(fn, output_signature=...) (or pipeline.with_output_signature(...))"
    ))
    def from_pipeline(
        cls,
        pipeline: pipeline_lib.Pipeline,
        *,
        num_epochs: int | None = None,
        shard: shard_lib.Shard | None = None,
        workers: options.Workers | None = None,
        prefetch: int | str | None = AUTOTUNE,
        with_metadata: bool = False,
    ) -> ResumableLoader:
        """A loader delivering the batches of `pipeline` (which must end in a batch stage).

        The pipeline defines the stream (the record spec included: `Pipeline`'s and
        `Pipeline.map`'s ``output_signature``); the other arguments (see the class)
        define how many epochs there are, which `Shard` this loader reads and how
        batches are delivered (`Workers`, prefetch, metadata) — none of which changes
        which records a batch holds.

        Examples:
            >>> import numpy as np
            >>> from resumeloader import Pipeline, Shard, Workers
            >>> pipeline = Pipeline(np.arange(6), seed=0).batch(2)
            >>> loader = ResumableLoader.from_pipeline(
            ...     pipeline, num_epochs=1, shard=Shard(1, 2), workers=Workers(2))
            >>> [b.numpy().tolist() for b in loader]
            [[1, 3], [5]]
        """
        if not isinstance(pipeline, pipeline_lib.Pipeline):
            msg = (
                "`pipeline` must be a resumeloader.Pipeline. "
                f"Received: pipeline={pipeline!r:.80} of type {type(pipeline).__name__}."
            )
            raise TypeError(msg)
        loader = cls.__new__(cls)
        loader._setup(
            pipeline, num_epochs=num_epochs, shard=shard, workers=workers, prefetch=prefetch,
            with_metadata=with_metadata,
        )
        return loader

    def _setup(
        self,
        pipeline: pipeline_lib.Pipeline,
        *,
        num_epochs: int | None,
        shard: shard_lib.Shard | None,
        workers: options.Workers | None,
        prefetch: int | str | None,
        with_metadata: bool,
    ) -> None:
        if isinstance(prefetch, str):
            if prefetch != "auto":
                msg = ("`prefetch` must be an integer >= 0, None or 'auto'. "
                       f"Received: prefetch={prefetch!r:.80}.")
                raise ValueError(msg)
            prefetch = AUTOTUNE
        if prefetch is not None and prefetch != AUTOTUNE:
            validate.integer("prefetch", prefetch, low=0)
        if workers is not None and not isinstance(workers, options.Workers):
            msg = (
                "`workers` must be a resumeloader.Workers or None, e.g. workers=Workers(2). "
                f"Received: workers={workers!r:.80} of type {type(workers).__name__}."
            )
            raise TypeError(msg)
        self._plan = plan_lib.Plan(pipeline, num_epochs=num_epochs, shard=shard)
        self._engine = engine_lib.Engine(
            self._plan,
            options.Workers() if workers is None else workers,
            with_metadata=validate.boolean("with_metadata", with_metadata),
        )
        self._delivery = paths.choose(self._engine, prefetch=prefetch)
        self._layout = self._plan.layout
        board = self._engine.board
        self._position = position_lib.Position(
            self._layout, None if board is None else board.consumer
        )
        self._observer = observe.Observer(board)
        #: The reused eager dataset and the op-determinism state it was built under.
        self._dataset: tuple[bool, Any] | None = None
        # Gone (nothing holds it: it is in no cycle), the loader releases its worker
        # processes; an iteration still running keeps them until it ends.
        weakref.finalize(self, self._engine.backend.release)

    def close(self) -> None:
        """Stops the loader's worker processes, if any; iterating again restarts them.

        Also done when the loader is garbage collected or the interpreter exits; a
        ``with`` block closes it on leaving.
        """
        self._position.drop_started()
        self._engine.close()

    def __enter__(self) -> ResumableLoader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- description -------------------------------------------------------------------
    @property
    def plan(self) -> plan_lib.Plan:
        """The `Plan`: the pipeline bound to epochs and a shard."""
        return self._plan

    @property
    def pipeline(self) -> pipeline_lib.Pipeline:
        """The `Pipeline` of stages."""
        return self._plan.pipeline

    @property
    def sampler(self) -> sampler_lib.IndexSampler:
        """The `IndexSampler` equal to this loader's order (see `Plan.sampler`)."""
        return self._plan.sampler

    @property
    def batch_size(self) -> int:
        """Records per batch."""
        return self._layout.batch_size

    @property
    def num_records(self) -> int:
        """Records in an epoch of the global order."""
        return self._plan.num_records

    @property
    def seed(self) -> int:
        """The pipeline's seed (the one every stage receives)."""
        return self._plan.pipeline.seed

    @property
    def num_epochs(self) -> int | None:
        """Epochs, or None for an endless stream."""
        return self._plan.num_epochs

    @property
    def drop_remainder(self) -> bool:
        """Whether each epoch's short last batch is dropped."""
        return self._layout.drop_remainder

    @property
    def with_metadata(self) -> bool:
        """Whether batches are (data, per-record metadata)."""
        return self._engine.with_metadata

    @property
    def workers(self) -> options.Workers:
        """The `Workers` that make the batches."""
        return self._engine.workers

    @property
    def shard(self) -> shard_lib.Shard:
        """The `Shard` of each epoch this loader reads."""
        return self._plan.shard

    @property
    def batches_per_epoch(self) -> int:
        """Batches in a whole epoch of this shard.

        Raises:
            TypeError: the batch stage's batches count the records they hold
                (`Pipeline.pack`, `Pipeline.batch_by_tokens`): the number depends on the
                data and is not known in advance.
        """
        self._check_counts("loader.batches_per_epoch")
        return self._layout.batches_left_in_epoch(0)

    @property
    def batches_left_in_epoch(self) -> int:
        """Batches from the position to the end of its epoch (0 once exhausted).

        Raises:
            TypeError: see `batches_per_epoch`.
        """
        self._check_counts("loader.batches_left_in_epoch")
        return self._layout.batches_left_in_epoch(self.position)

    def _check_counts(self, what: str) -> None:
        if not self._layout.known_counts:
            stage = self._plan.pipeline.batch_stage
            msg = (
                f"`{what}` is not known in advance for this loader: its batches hold as many "
                "records as the data lets them (packing, token budgets), so how many there "
                "are depends on the records. Iterate an epoch with "
                "`loader.dataset(rest_of_epoch=True)` (Keras: `epoch_dataset(loader)` without "
                "`steps_per_epoch`); progress is `loader.position` of "
                f"`loader.plan.records_per_epoch` records. Received: batch stage "
                f"{stage.describe() if stage is not None else None}."
            )
            raise TypeError(msg)

    @property
    def position(self) -> int:
        """Records of this shard consumed, counted across epochs (normalised).

        Inside `excluding_in_flight`, the position before the batch in flight.
        """
        return self._position.read()

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.position // self._layout.records_per_epoch

    @property
    def step(self) -> int:
        """Batches consumed in the current epoch.

        Raises:
            TypeError: see `batches_per_epoch`.
        """
        self._check_counts("loader.step")
        return self._layout.epoch_step(self.position)

    @property
    def exhausted(self) -> bool:
        """True once every batch of a finite loader was consumed."""
        end = self._layout.end
        return end is not None and self.position >= end

    def __len__(self) -> int:
        """Batches left to the end of a finite loader: what ``for batch in loader`` yields now.

        Raises:
            TypeError: the loader is endless (``num_epochs=None``), or its number of
                batches is not known in advance (see `batches_per_epoch`).
        """
        self._check_counts("len(loader)")
        end = self._layout.end
        if end is None:
            msg = (
                "`len()` of an endless loader is undefined: it never ends. Use "
                "`loader.batches_per_epoch`, or give the loader `num_epochs`. "
                "Received: num_epochs=None."
            )
            raise TypeError(msg)
        left = self._layout.batches_to_end(self.position)
        assert left is not None
        return left

    def __bool__(self) -> bool:
        # With __len__ defined, `if loader:` would be False once exhausted and raise for
        # an endless loader.
        return True

    def __repr__(self) -> str:
        # Inside a tf.function the position is symbolic, and repr must not raise
        # (TensorFlow's own warnings format bound methods of the loader).
        if tf.executing_eagerly() and not tf.inside_function():
            where = f"epoch={self.epoch}, position={self.position}"
        else:
            where = "position=<symbolic>"
        plan = self._plan
        return (
            f"ResumableLoader(num_records={self.num_records}, batch_size={self.batch_size}, "
            f"seed={self.seed}, stages=[{', '.join(s.name for s in plan.pipeline.stages)}], "
            f"num_epochs={self.num_epochs}, shard={plan.shard.index}/{plan.shard.count}, "
            f"{where})"
        )

    def describe(self, console: Any = None) -> str:
        """The pipeline as an execution plan: stages, signatures, what is checkpointed.

        Args:
            console: a `rich.console.Console` to print the plan to, or None.

        Returns:
            The plan as plain text (92 columns, no colours); before the first batch it
            depends only on the configuration and the position (an example is in
            `resumeloader.tfdata.describe.describe`); once batches were made, the
            measured figures follow it (`stats`: each stage's time per record and the
            records/s it allows), the bottleneck named.
        """
        if self._layout.known_counts:
            title = (
                f"ResumableLoader: epoch {self.epoch}, step {self.step}, position "
                f"{self.position} ({self.num_records} records, batch {self.batch_size}, "
                f"{self.batches_per_epoch} batches per epoch)"
            )
        else:
            title = (
                f"ResumableLoader: epoch {self.epoch}, position {self.position} "
                f"({self.num_records} records; batches per epoch depend on the data)"
            )
        return describe_lib.describe(
            title, self._plan, self._delivery, console=console, live=self.stats()
        )

    # -- what it measured ------------------------------------------------------------
    def stats(self) -> stats_lib.Stats:
        """What each stage did since the loader was made: a `Stats` value.

        Per stage (sampler, read, each record stage, the check, the batch stage, each
        batch map stage, the copy out of worker processes, the hand-off to TensorFlow,
        each tensor stage): batches, records in and out, bytes out, wall time and CPU
        time (sampled), summed over the threads, worker processes and Dask workers that
        ran it, and the records per second it allows; the bottleneck (the stage that
        allows the fewest); the consumer's data wait per step (``for batch in loader``
        exactly; ``dataset()`` with an eager `advance`, e.g. `ResumeCallback`: how long
        after the previous advance each batch left the Python producer); queue depths;
        how busy each worker was; the storage layer's GETs, retries, bytes and latency.

        Counted once per batch, never per record, in every process: the stream never
        depends on it. The environment variable ``RESUMELOADER_STATS=0`` switches
        counting off (then every figure is empty). ``str(stats)`` is a table,
        ``stats.to_dict()`` plain JSON data.

        Examples:
            >>> import numpy as np
            >>> loader = ResumableLoader(np.arange(64), batch_size=8, seed=0, num_epochs=1)
            >>> _ = [b for b in loader]
            >>> stats = loader.stats()
            >>> [(s.name, s.batches, s.records_in) for s in stats.stages][:2]
            [('sampler', 8, 64), ('read', 8, 64)]
        """
        return self._observer.stats()

    def write_summaries(self, step: Any, writer: tf.summary.SummaryWriter | None = None) -> None:
        """Writes the figures since the last call as ``tf.summary`` scalars at `step`.

        For TensorBoard beside the loss: ``resumeloader/data_wait_ms`` (the consumer's
        mean data wait per step) and ``data_wait_share``, ``records_per_s`` and, per
        stage, ``<stage>/ms_per_batch`` and ``<stage>/allows_records_per_s``; the
        bottleneck's name as a text summary. Call it eagerly every few hundred steps of
        a custom loop (Keras: ``ResumeCallback(summaries=...)``).

        Args:
            step: the step the scalars are written at (an int or an int64 tensor).
            writer: a `tf.summary.SummaryWriter`; None writes to the default writer.
        """
        self._observer.write_summaries(step, writer)

    def log_stats(self, every: float | None = 60.0, *, logger: logging.Logger | None = None,
                  level: int = logging.INFO) -> None:
        """Logs a one-line summary of the stage figures every `every` seconds (a daemon
        thread); None stops it.

        The line: records and records/s delivered in the interval, the bottleneck stage
        and the records/s it allows, the data wait per step. To `logger` (default: the
        ``resumeloader.stats`` logger) at `level`.
        """
        self._observer.log_every(every, logger or observe.LOGGER, level)

    # -- the pipeline ----------------------------------------------------------------
    @property
    def element_spec(self) -> Any:
        """The structure of `tf.TensorSpec` of one batch."""
        return self._delivery.element_spec(self._delivery.batch_dim)

    def dataset(
        self,
        input_context: tf.distribute.InputContext | None = None,
        *,
        rest_of_epoch: bool = False,
    ) -> tf.data.Dataset:
        """A `tf.data.Dataset` of batches that starts at the position current when iterated.

        It does not advance the position: call `advance` once per consumed batch, or
        iterate the loader itself. Create the iterator after restoring a checkpoint.
        Inside a ``tf.function``, `advance` waits for the batches the function pulled
        before it (the generator reads the position when it produces its first batch).

        The dataset is a `GuardedDataset`: tf.data ops that keep one element per batch
        in order (``map``, ``prefetch``, ``take``, ``with_options``, ...) return a
        guarded dataset again, ops that would drop, repeat, reorder or regroup batches
        (``repeat`` on a finite loader, ``shuffle``, ``filter``, ``batch``, ``unbatch``,
        ``skip``, ...) raise `StreamIntegrityError` naming the in-loader alternative.
        For a finite loader its ``cardinality()`` (eagerly) is ``len(loader)`` (unknown
        when the number of batches depends on the data: `Pipeline.pack`,
        `Pipeline.batch_by_tokens`).

        Args:
            input_context: for ``strategy.distribute_datasets_from_function``: this
                input pipeline's per-replica batches (`batch_size` is the global batch
                of a step). The records of each step, across all replicas, are those
                of the single-process batch; advance by one batch per step.
            rest_of_epoch: end each iteration at the end of the epoch of the position
                it starts from (what Keras' one-epoch datasets need).
        """
        validate.boolean("rest_of_epoch", rest_of_epoch)
        if input_context is not None:
            ds = distribute.dataset(
                self._plan, self._delivery, input_context,
                functools.partial(_start_distributed, self._position),
            )
            return guard.GuardedDataset(ds, finite=self.num_epochs is not None, count=None)
        # Building a from_generator dataset costs ~15 ms; it reads the position only when
        # iterated, so one eager dataset serves every iteration (restore -> first batch).
        # Built again if op determinism was switched since (tensor stages are timed
        # only without it: TensorFlow refuses tf.timestamp under it).
        reusable = not rest_of_epoch and tf.executing_eagerly()
        if reusable and self._dataset is not None and self._dataset[0] == graph.op_determinism():
            return self._dataset[1]
        # What the dataset calls holds the position, not the loader: the loader keeps the
        # dataset, and a dataset holding it back would make a cycle that only the cyclic
        # garbage collector frees, its worker processes with it.
        ds = self._delivery.dataset(
            self._position.read, rest_of_epoch=rest_of_epoch, watch=self._position.watch
        )
        # Keras fixes an epoch's length from the cardinality at fit start, so the
        # one-epoch dataset (whose first epoch may be short after a resume) keeps it
        # unknown.
        count: Callable[[], int] | None = None
        if not rest_of_epoch and self._layout.known_counts:
            count = (
                functools.partial(_batches_to_end, self._layout, self._position)
                if self.num_epochs is not None
                else _infinite
            )
        finite = rest_of_epoch or self.num_epochs is not None
        guarded = guard.GuardedDataset(ds, finite=finite, count=count)
        if reusable:
            self._dataset = (graph.op_determinism(), guarded)
        return guarded

    def __iter__(self) -> Iterator[Any]:
        """Yields batches from the current position, advancing it as each is handed out.

        A Python thread prepares up to `prefetch` batches ahead (2 for ``AUTOTUNE``,
        none for None or 0) and the batches are handed out as tensors without tf.data:
        no per-batch ``py_func`` round trip and no iterator start-up, the same stream as
        `dataset`. In-memory numeric arrays without Python or tensor stages need no
        thread: the loop gathers a chunk of batches at a time with NumPy and hands each
        out as a view of it (``prefetch`` does not apply). Leaving the loop early stops
        the thread before it returns. Eager only: inside a ``tf.function`` iterate
        `dataset` and call `advance`.

        A batch counts as consumed when it is handed out, so a checkpoint saved in the
        loop body (after the training step) resumes with the next batch; until the
        loop asks for the next one it is *in flight* (see `excluding_in_flight`). One
        loop per loader may be live at a time, and the position may not be changed
        (`advance`, `set_state`) while it is: both raise `StreamIntegrityError`.
        """
        if not tf.executing_eagerly():
            msg = (
                "`for batch in loader` runs eagerly only. Inside a tf.function iterate "
                "`loader.dataset()` and call `loader.advance()` per step."
            )
            raise TypeError(msg)
        return self._position.loop(self._delivery.eager, consumption.caller())

    def start_prefetch(self) -> None:
        """Starts making the batches of the next ``for batch in loader`` now.

        Call it once the position is known (after `set_state`, or restoring the
        loader's checkpoint) and before the slow rest of a restore (the model's
        weights, the optimizer): the worker backend starts and the first batches are
        made meanwhile, so the loop's first batch is waiting for it. What is made is
        what the loop would make from that position: the loop takes these batches only
        if it starts where they start; `set_state` or `advance` to another position,
        or `close`, drops them. Until a loop takes them, a few batches wait made (the
        first, and as many as ``prefetch`` keeps ahead) and the worker backend stays
        started. For ``for batch in loader`` only: a `dataset` iteration makes
        its batches when it is iterated. Calling it again at the same position does
        nothing. Eager only.

        Raises:
            StreamIntegrityError: a ``for batch in loader`` is live.
        """
        position_lib.eager_only("loader.start_prefetch()")
        self._position.start(self._delivery.eager)

    @contextlib.contextmanager
    def excluding_in_flight(self) -> Iterator[int]:
        """Within it, the position (and a checkpoint saved) excludes the batch in flight.

        For an emergency save when the step of the batch that ``for batch in loader``
        handed out last did not finish — in an ``except`` block around the loop, or a
        SIGTERM handler that runs during the step: the restored job then trains that
        batch again, so nothing is lost. The batch in flight is the one handed out by
        the live loop, or by the last loop if it ended with that batch's step (by an
        exception, or ``break``) and the position did not change since. Without one
        (or with `dataset` and `advance`, which count a batch only when told) the
        position is unchanged. Nothing is changed when the block ends.

        Yields:
            The position a checkpoint saved inside records.

        Examples:
            >>> import numpy as np
            >>> loader = ResumableLoader(np.arange(8), batch_size=2, seed=0, num_epochs=1)
            >>> try:
            ...     for batch in loader:
            ...         if loader.position == 4:
            ...             raise RuntimeError("the training step failed")
            ... except RuntimeError:
            ...     with loader.excluding_in_flight() as saved_position:
            ...         state = loader.get_state()   # e.g. manager.save()
            >>> saved_position, state["offset"], loader.position
            (2, 2, 4)
        """
        with self._position.excluding_in_flight() as position:
            yield position

    # -- advancing ---------------------------------------------------------------------
    @tf.autograph.experimental.do_not_convert  # plain Python branching on Python values
    def advance(self, num_batches: Any = 1, *, after: Any = None) -> None:
        """Marks `num_batches` batches as consumed; works eagerly and in a `tf.function`.

        Call it after the training step that consumed the batch, so that a checkpoint
        saved afterwards resumes with the next batch. Inside a ``tf.function`` it waits
        for every batch the function pulled from an iterator before it, so it cannot
        race an iterator's first batch (which reads the position).

        Eagerly it checks what it counts: advancing past the last batch the current
        ``dataset()`` iteration produced (batches counted that did not come from this
        loader), or during a live ``for batch in loader`` (which advances by itself),
        raises `StreamIntegrityError`. Advancing before iterating skips batches.

        Args:
            num_batches: batches consumed since the last call: an integer, or an
                integer scalar tensor.
            after: tensors the advance must also wait for (inside a ``tf.function``).
        """
        if after is not None and tf.inside_function():
            with tf.control_dependencies(tf.nest.flatten(after)):
                self.advance(num_batches)
            return
        if distribute.in_replica_context():
            # Each replica calls it for the same step: advance once for all of them.
            distribute.merge(lambda: self.advance(num_batches))
            return
        self._position.advance(num_batches)

    # -- lineage (docs/guides/which-data.md) ---------------------------------------
    def records_at(
        self, steps: Any = None, *, positions: Any = None, batch_size: int | None = None
    ) -> list[lineage.BatchRecords]:
        """The keys of the records of the batches at `steps` or `positions`, past or future.

        Computed from the position alone, without the batches before it: O(batch) per
        batch (a windowed stage reads and groups the batch's window, O(window)). The
        same records, positions and indices as ``with_metadata=True`` reports.

        Args:
            steps: an int, range or sequence: the batches numbered from position 0,
                with `batch_size` (default: this loader's) as if the whole run had
                had it; skipped positions are no steps. Refused for stages whose
                batches count the records they hold (`Pipeline.pack`,
                `Pipeline.batch_by_tokens`): look those up by position.
            positions: an int or sequence: the batch starting at each position (this
                shard's, ``metadata["position"][0]``); a range: every batch from the
                one at its start until its stop. Positions are the ground truth: they
                hold across batch-size changes and elastic resumes.
            batch_size: the batch size in force for the lookup (another part of an
                elastic run).

        Returns:
            One `BatchRecords` per batch (``step``, ``epoch``, ``start``, ``stop``,
            ``records``: each record's ``position``, ``index`` and source key).

        Raises:
            TypeError: a step or position that is not an integer (any integer type,
                NumPy's included, is one), named with what the argument accepts.
            ValueError: a negative step or position, or one past the end.
        """
        plan = self._plan_with(batch_size)
        return lineage.records_at(plan, self._engine.producer, steps=steps, positions=positions)

    def batch_at(
        self, step: int | None = None, *, position: int | None = None,
        batch_size: int | None = None,
    ) -> Any:
        """The batch of `step` (or the one starting at `position`), rebuilt on its own.

        The same bytes as the loader hands out there (same records, same ``map_fn``
        and tensor-stage randomness; with metadata when the loader has it), made by a
        fresh loader of the same pipeline in the calling thread, without the batches
        before it and without moving this loader. Arguments as `records_at`.
        """
        steps = None if step is None else [lineage.number("step", step)]
        positions = None if position is None else [lineage.number("position", position)]
        [found] = self.records_at(steps, positions=positions, batch_size=batch_size)
        plan = self._plan_with(batch_size)
        rebuilt = ResumableLoader.from_pipeline(
            plan.pipeline, num_epochs=plan.num_epochs, shard=plan.shard, prefetch=None,
            with_metadata=self.with_metadata,
        )
        rebuilt._position.set(found.start)
        with rebuilt:
            return next(iter(rebuilt))

    def _plan_with(self, batch_size: int | None) -> plan_lib.Plan:
        if batch_size is None or batch_size == self.batch_size:
            return self._plan
        return self._plan.sharded(self._plan.shard, batch_size=batch_size)

    # -- state -----------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """The loader state: a flat JSON-serialisable dict of ints and strs (< 1 KB).

        It holds a version, every stage's order fields (``"<stage>.<field>"``) with
        their fingerprint, and the position as (``epoch``, global ``offset``,
        ``row``). The fingerprint covers the order fields only. Eager only.

        With a bad-record policy that replaces, the quarantine log's lines written so
        far are made durable first (fsync), so no checkpoint outlives them.
        """
        position_lib.eager_only("loader.get_state()")
        return self._engine.state_of(self.position)

    def set_state(self, state: dict[str, Any] | str | bytes) -> None:
        """Restores a state from `get_state` (or its JSON text); validates before changing anything.

        States written by resumeloader 0.1 (version 1) are read too.

        Raises:
            StateError: the state is malformed or corrupted, or not a loader's JSON at
                all (binary data, a pickle, truncated JSON), named as such.
            StateMismatchError: it was saved by a pipeline with another record order;
                the message names each differing ``stage.field``.
            ElasticResumeError: the new shard count cannot continue it exactly, or the
                position lies inside a batch of a windowed stage (an edited state).
            StreamIntegrityError: a ``for batch in loader`` is live.
        """
        self._position.set(self._engine.resume(state))

    def serialize(self) -> str:
        """`tf.train.experimental.PythonState` hook: the state as JSON text."""
        return state_lib.to_json(self.get_state())

    def deserialize(self, string_value: Any) -> None:
        """`tf.train.experimental.PythonState` hook: restores the JSON text of a state."""
        if isinstance(string_value, tf.Tensor):
            string_value = string_value.numpy()
        if isinstance(string_value, (np.ndarray, np.generic)) and string_value.dtype.kind != "O":
            # A string tensor reads back as bytes (an object scalar): anything else
            # was saved from a variable or tensor, not from a loader.
            msg = (
                "The checkpoint holds a number under the loader's key, not a loader state: "
                "it was saved from a tf.Variable or tensor (e.g. tf.train.Checkpoint("
                "loader=<a variable>)), not from a ResumableLoader. Save the loader itself "
                "under that key. Received: a value of dtype "
                f"{string_value.dtype.name} and shape {string_value.shape}: "
                f"{string_value!r:.80}."
            )
            raise errors.StateError(msg)
        self.set_state(string_value)  # bytes that are not UTF-8 JSON: a StateError


def _start_distributed(position: position_lib.Position) -> int:
    """The position an input pipeline starts from (no eager loop may be live)."""
    start = position.read()
    what = "an iteration of dataset(input_context=...)"
    position.ledger.check_no_loop_under(what, start)
    return start


def _batches_to_end(layout: Any, position: position_lib.Position) -> int:
    """`len(loader)` of a finite loader whose batches count `batch_size` positions."""
    left = layout.batches_to_end(position.read())
    assert left is not None
    return left


def _infinite() -> int:
    return int(tf.data.INFINITE_CARDINALITY)
