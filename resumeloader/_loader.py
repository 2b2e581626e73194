"""ResumableLoader: a tf.data pipeline of Python records whose state is one position.

The loader is a trackable object: ``tf.train.Checkpoint(loader=loader)`` stores its
state (a short JSON string: version, order fingerprint, epoch and global offset) and
restores it, validating before anything changes. On every iteration the loader
derives the record order from the position, so what tf.data read ahead (prefetch,
parallel map) is simply recomputed after a restore: the position is advanced by the
consumer, never by the producer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from resumeloader import (
    _batching,
    _describe,
    _distribute,
    _gather,
    _graph,
    _position,
    _prefetch,
    _sampler,
    _source,
    _state,
    _stream,
    _validate,
    _workers,
)

__all__ = ["AUTOTUNE", "ResumableLoader"]

AUTOTUNE = tf.data.AUTOTUNE


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
        shard_index: this shard, in [0, shard_count).
        shard_count: shards splitting each epoch's global order (strided).
        prefetch: batches prepared ahead of the consumer (by `dataset`'s
            ``prefetch``, or a thread for ``for batch in loader``); None or 0 for none.
        output_signature: the per-record structure of `tf.TensorSpec` (no batch
            dimension); inferred from record 0 when None.
        with_metadata: yield ``(batch, metadata)`` where metadata holds, per record,
            ``index``, ``epoch``, ``position`` and a stateless TF ``seed`` pair.
        num_workers: workers preparing batches in parallel (0: in the generator's
            thread). Batches are handed out strictly in order whatever the workers, so
            the stream does not depend on `num_workers` or `worker_type`.
        worker_type: "thread", or "process" (spawned processes that receive the source
            and ``map_fn`` pickled once and return batches through shared memory; use
            it for GIL-bound ``map_fn``). A dead worker raises `WorkerError`. The
            pool lives for one iteration (process start-up costs about a second), so
            prefer one long iteration (``num_epochs=None``) to a loop per epoch.

    Example:
        >>> import numpy as np
        >>> loader = ResumableLoader(np.arange(10), batch_size=4, seed=0, shuffle=False,
        ...                          num_epochs=1)
        >>> [b.numpy().tolist() for b in loader]
        [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
        >>> loader.set_state(dict(loader.get_state(), epoch=0, offset=4))
        >>> [b.numpy().tolist() for b in loader]
        [[4, 5, 6, 7], [8, 9]]
    """

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
        shard_index: int = 0,
        shard_count: int = 1,
        prefetch: int | None = AUTOTUNE,
        output_signature: Any = None,
        with_metadata: bool = False,
        num_workers: int = 0,
        worker_type: str = "thread",
    ) -> None:
        batch_size = _validate.integer("batch_size", batch_size, low=1, high=_validate.MAX_COUNT)
        if map_fn is not None and not callable(map_fn):
            msg = f"`map_fn` must be callable or None. Received: map_fn={map_fn!r}."
            raise TypeError(msg)
        self._drop_remainder = _validate.boolean("drop_remainder", drop_remainder)
        self._with_metadata = _validate.boolean("with_metadata", with_metadata)
        if prefetch is not None and prefetch != AUTOTUNE:
            _validate.integer("prefetch", prefetch, low=0)
        self._prefetch = prefetch
        self._adapter = _source.adapt(source)
        self._sampler = _sampler.IndexSampler(
            self._adapter.num_records,
            seed=seed,
            shuffle=shuffle,
            num_epochs=num_epochs,
            shard_index=shard_index,
            shard_count=shard_count,
        )
        per_epoch = self._sampler.records_per_epoch
        if self._drop_remainder and batch_size > per_epoch:
            msg = (
                "`batch_size` exceeds the records of an epoch with drop_remainder=True, so "
                f"no batch would ever be produced. Received: batch_size={batch_size}, "
                f"records per epoch (per shard)={per_epoch}."
            )
            raise ValueError(msg)
        self._layout = _position.Layout(per_epoch, batch_size, self._drop_remainder, num_epochs)
        self._producer = _batching.BatchProducer(
            self._adapter,
            map_fn=map_fn,
            seed=self._sampler.seed,
            spec=None if output_signature is None else _graph.record_spec(output_signature),
        )
        self._workers = _workers.WorkerSettings(
            _validate.integer("num_workers", num_workers, low=0, high=1024),
            worker_type,
            source=source,
            map_fn=map_fn,
        )
        self._gatherer = _gather.Gatherer.create(
            source, map_fn=map_fn, num_workers=self.num_workers, spec=self._producer.spec
        )
        self._dataset: tf.data.Dataset | None = None
        with tf.init_scope():
            self._position = tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name="resumeloader_position",
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )

    # -- description -------------------------------------------------------------------
    sampler = property(lambda self: self._sampler, doc="The `IndexSampler` of this loader.")
    batch_size = property(lambda self: self._layout.batch_size, doc="Records per batch.")
    num_records = property(lambda self: self._sampler.num_records, doc="Records in the source.")
    seed = property(lambda self: self._sampler.seed, doc="The seed.")
    num_epochs = property(lambda self: self._sampler.num_epochs, doc="Epochs, or None.")
    drop_remainder = property(lambda self: self._drop_remainder, doc="Drops short batches.")
    with_metadata = property(
        lambda self: self._with_metadata, doc="Batches are (data, per-record metadata)."
    )

    @property
    def batches_per_epoch(self) -> int:
        """Batches in a whole epoch of this shard."""
        return self._layout.batches_left_in_epoch(0)

    @property
    def position(self) -> int:
        """Records of this shard consumed, counted across epochs (normalised)."""
        return self._layout.normalise(int(self._position.numpy()))

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.position // self._layout.records_per_epoch

    @property
    def step(self) -> int:
        """Batches consumed in the current epoch."""
        offset = self.position % self._layout.records_per_epoch
        return -(-offset // self._layout.batch_size)

    @property
    def exhausted(self) -> bool:
        """True once every batch of a finite loader was consumed."""
        end = self._layout.end
        return end is not None and self.position >= end

    def __repr__(self) -> str:
        # Inside a tf.function the position is symbolic, and repr must not raise
        # (TensorFlow's own warnings format bound methods of the loader).
        if tf.executing_eagerly():
            where = f"epoch={self.epoch}, position={self.position}"
        else:
            where = "position=<symbolic>"
        return (
            f"ResumableLoader(num_records={self.num_records}, batch_size={self.batch_size}, "
            f"seed={self.seed}, shuffle={self._sampler.shuffle}, num_epochs={self.num_epochs}, "
            f"shard={self._sampler.shard_index}/{self._sampler.shard_count}, {where})"
        )

    @property
    def num_workers(self) -> int:
        """Workers preparing batches in parallel (0: none)."""
        return self._workers.num_workers

    @property
    def worker_type(self) -> str:
        """"thread" or "process"."""
        return self._workers.worker_type

    def describe(self, console: Any = None) -> str:
        """The pipeline as an execution plan: stages, signatures, what is checkpointed.

        Args:
            console: a `rich.console.Console` to print the plan to, or None.

        Returns:
            The plan as plain text (92 columns, no colours); it depends only on the
            configuration and the position.
        """
        return _describe.describe(self, console=console)

    # -- the pipeline ----------------------------------------------------------------
    @property
    def element_spec(self) -> Any:
        """The structure of `tf.TensorSpec` of one batch."""
        batch_dim = self.batch_size if self._drop_remainder else None
        return _graph.element_spec(self._producer.spec, batch_dim, self._with_metadata)

    def dataset(self, input_context: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
        """A `tf.data.Dataset` of batches that starts at the position current when iterated.

        It does not advance the position: call `advance` once per consumed batch, or
        iterate the loader itself. Create the iterator after restoring a checkpoint.
        The generator reads the position when the first batch is produced: in a
        ``tf.function`` that pulls a batch and calls `advance`, pass the batch as
        ``advance(after=batch)``, or the two may race on an iterator's first step.

        Args:
            input_context: for ``strategy.distribute_datasets_from_function``: this
                input pipeline's per-replica batches (`batch_size` is the global batch
                of a step). The records of each step, across all replicas, are those
                of the single-process batch; advance by one batch per step.
        """
        # Building a from_generator dataset costs ~15 ms; it reads the position only when
        # iterated, so one eager dataset serves every iteration (restore -> first batch).
        reusable = input_context is None and tf.executing_eagerly()
        if reusable and self._dataset is not None:
            return self._dataset
        if input_context is not None:
            generate, spec = _distribute.generator(self, input_context)
            ds = self._prefetched(tf.data.Dataset.from_generator(generate, output_signature=spec))
        else:
            ds = self._build_dataset(rest_of_epoch=False)
        if reusable:
            self._dataset = ds
        return ds

    def _build_dataset(self, *, rest_of_epoch: bool) -> tf.data.Dataset:
        """The pipeline from the position current when iterated; with `rest_of_epoch`,
        only up to the end of that position's epoch (for Keras' one-epoch datasets)."""
        if self._gatherer is not None:
            ds = self._gatherer.dataset(
                lambda: self._indices(rest_of_epoch), self.element_spec,
                with_metadata=self._with_metadata,
            )
        else:
            ds = tf.data.Dataset.from_generator(
                lambda: self._generate(rest_of_epoch), output_signature=self.element_spec
            )
        return self._prefetched(ds)

    def _prefetched(self, ds: tf.data.Dataset) -> tf.data.Dataset:
        return ds.prefetch(self._prefetch) if self._prefetch else ds

    def _stream_layout(self, rest_of_epoch: bool) -> _position.Layout:
        if not rest_of_epoch:
            return self._layout
        last = self.epoch + 1 if self.num_epochs is None else min(self.epoch + 1, self.num_epochs)
        return dataclasses.replace(self._layout, num_epochs=last)

    def _generate(self, rest_of_epoch: bool = False) -> Iterator[Any]:
        layout = self._stream_layout(rest_of_epoch)
        yield from self._batches(self._sampler, layout, self.position)

    def _indices(self, rest_of_epoch: bool = False) -> Iterator[Any]:
        """The index array of each batch (with its metadata), for `_gather`."""
        layout = self._stream_layout(rest_of_epoch)
        for task in _stream.tasks(self._sampler, layout, self.position):
            yield self._labelled(task.indices, task)

    def _labelled(self, value: Any, task: _workers.Task) -> Any:
        """`value`, paired with the task's per-record metadata when asked for."""
        return (value, _stream.metadata(self.seed, task)) if self._with_metadata else value

    def _batches(
        self, sampler: _sampler.IndexSampler, layout: _position.Layout, position: int
    ) -> Iterator[Any]:
        """Batches of `sampler`'s stream cut by `layout`, from normalised `position` on."""
        tasks = _stream.tasks(sampler, layout, position)
        for task, batch in self._workers.produce(self._producer, tasks):
            yield self._labelled(batch, task)

    def __iter__(self) -> Iterator[Any]:
        """Yields batches from the current position, advancing it as each is handed out.

        A Python thread prepares up to `prefetch` batches ahead (2 for ``AUTOTUNE``,
        none for None or 0) and the batches are handed out as tensors without tf.data:
        no per-batch ``py_func`` round trip and no iterator start-up, the same stream as
        `dataset`. Leaving the loop early stops the thread before it returns. Eager
        only: inside a ``tf.function`` iterate `dataset` and call `advance`.
        """
        if not tf.executing_eagerly():
            msg = (
                "`for batch in loader` runs eagerly only. Inside a tf.function iterate "
                "`loader.dataset()` and call `loader.advance(after=batch)` per step."
            )
            raise TypeError(msg)
        # The stream starts here and moves one batch per batch, so the position is
        # tracked in Python and only written (a read + assign per batch cost ~3x more).
        start = position = self.position
        depth = 2 if self._prefetch == AUTOTUNE else self._prefetch or 0
        for batch in _prefetch.prefetched(
            lambda: self._batches(self._sampler, self._layout, start), depth
        ):
            position = self._layout.advance(position, 1)
            self._position.assign(position, read_value=False)
            yield batch

    # -- advancing ---------------------------------------------------------------------
    @tf.autograph.experimental.do_not_convert  # plain Python branching on Python values
    def advance(self, num_batches: int = 1, *, after: Any = None) -> None:
        """Marks `num_batches` batches as consumed; works eagerly and in a `tf.function`.

        Call it after the training step that consumed the batch, so that a checkpoint
        saved afterwards resumes with the next batch.

        Args:
            num_batches: batches consumed since the last call.
            after: tensors (typically the batch) the advance must wait for. Inside a
                ``tf.function`` that pulls a batch from an iterator and advances in
                the same call, TensorFlow does not order the two: pass the batch so
                the position moves only once the batch exists (the generator reads
                the position when it produces an iterator's first batch).
        """
        if after is not None and tf.inside_function():
            with tf.control_dependencies(tf.nest.flatten(after)):
                self.advance(num_batches)
            return
        if _distribute.in_replica_context():
            # Each replica calls it for the same step: advance once for all of them.
            _distribute.merge(lambda: self.advance(num_batches))
            return
        if tf.inside_function():
            _graph.advance(self._position, self._layout, num_batches)
            return
        num_batches = _validate.integer("num_batches", num_batches, low=0)
        position = self._layout.advance(int(self._position.numpy()), num_batches)
        self._position.assign(position, read_value=False)

    # -- state -----------------------------------------------------------------------
    def _order(self) -> dict[str, Any]:
        return _state.order(
            num_records=self.num_records, seed=self.seed, shuffle=self._sampler.shuffle
        )

    def get_state(self) -> dict[str, Any]:
        """The loader state: a flat JSON-serialisable dict of ints and strs (< 1 KB)."""
        epoch, offset = divmod(self.position, self._layout.records_per_epoch)
        return _state.make(
            self._order(),
            epoch=epoch,
            offset=offset * self._sampler.shard_count,
            shard_count=self._sampler.shard_count,
            batch_size=self.batch_size,
        )

    def set_state(self, state: dict[str, Any] | str) -> None:
        """Restores a state from `get_state` (or its JSON text); validates before changing anything.

        Raises:
            StateError: the state is malformed or corrupted.
            StateMismatchError: it was saved by a loader with another record order.
            ElasticResumeError: the new shard count cannot continue it exactly.
        """
        saved = _state.parse(state)
        _state.check_order(saved, self._order())
        epoch, offset = _state.local_offset(
            saved, shard_count=self._sampler.shard_count, num_records=self.num_records
        )
        position = self._layout.normalise(epoch * self._layout.records_per_epoch + offset)
        self._position.assign(position)

    def serialize(self) -> str:
        """`tf.train.experimental.PythonState` hook: the state as JSON text."""
        return _state.to_json(self.get_state())

    def deserialize(self, string_value: Any) -> None:
        """`tf.train.experimental.PythonState` hook: restores the JSON text of a state."""
        if isinstance(string_value, tf.Tensor):
            string_value = string_value.numpy()
        if isinstance(string_value, bytes):
            string_value = string_value.decode()
        self.set_state(string_value)
