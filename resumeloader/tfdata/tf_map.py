"""`Finisher`: the last step of every delivery path, produced batches become loader elements.

A `Finisher` builds each ragged leaf from its parts (`graph.assemble`), runs the
pipeline's tensor stages (`Pipeline.tf_map`: ``fn(batch, seeds)`` with each record's
stateless seed pair) and drops the metadata the stages needed unless the loader
yields it. It runs inside tf.data, as a ``map(num_parallel_calls=AUTOTUNE,
deterministic=True)`` (batches in parallel, handed out in order), for ``dataset()``,
distributed input and — when there are tensor stages — ``for batch in loader``: the
same function in the same runtime in every path, so the same bytes. Each finishing
function is a `tf.function` traced once per batch shape and shared by every dataset
of the loader, so a new iteration does not trace the user's function again.

With `timed`, each tensor stage's calls, records and wall time (``tf.timestamp`` before
and after it, inside the graph) are added to variables per call (`Timers`), which
``loader.stats()`` reads: a few microseconds per batch, only for pipelines with
tensor stages.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from resumeloader.core import spec as spec_lib
from resumeloader.stages import base
from resumeloader.tfdata import graph

__all__ = ["Finisher", "Timers"]


class Timers:
    """Per tensor stage: calls, records and wall seconds, as variables the graph adds to."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        with tf.init_scope():
            self._calls = tf.Variable([0] * len(names), dtype=tf.int64, trainable=False)
            self._records = tf.Variable([0] * len(names), dtype=tf.int64, trainable=False)
            self._wall = tf.Variable([0.0] * len(names), dtype=tf.float64, trainable=False)

    def timed(self, number: int, fn: Any, data: Any, seeds: tf.Tensor) -> Any:
        """``fn(data, seeds)``, its calls, records and wall time added to stage `number`.

        Under op determinism (``tf.config.experimental.enable_op_determinism()``, as it
        is when the function is traced: `Finisher` traces one function per state)
        TensorFlow refuses ``tf.timestamp``: the calls and records are still counted,
        the wall time is not (it stays 0).
        """
        clocked = not graph.op_determinism()
        one = tf.one_hot(number, len(self.names), dtype=tf.int64)
        start = tf.timestamp() if clocked else None
        with tf.control_dependencies([] if start is None else [start]):
            data = fn(data, seeds)
        with tf.control_dependencies(tf.nest.flatten(data, expand_composites=True)):
            counts = [
                self._calls.assign_add(one),
                self._records.assign_add(one * tf.cast(tf.shape(seeds)[0], tf.int64)),
            ]
            if start is not None:
                seconds = tf.timestamp() - start
                counts.append(self._wall.assign_add(tf.cast(one, tf.float64) * seconds))
            added = tf.group(*counts)
        with tf.control_dependencies([added]):
            return tf.nest.map_structure(tf.identity, data, expand_composites=True)

    def read(self) -> dict[str, tuple[int, ...]]:
        """Each stage's counts as a `resumeloader.core.meters.Meter` holds them."""
        calls, records = self._calls.numpy(), self._records.numpy()
        wall = self._wall.numpy()
        return {
            name: (int(calls[i]), int(records[i]), int(records[i]), 0, int(wall[i] * 1e9), 0, 0)
            for i, name in enumerate(self.names)
        }


class Finisher:
    """Turns batches as the generator yields them into the loader's elements.

    Args:
        spec: the per-record spec.
        stages: the pipeline's tensor stages, in order.
        with_metadata: whether the loader's elements are ``(batch, metadata)``.
        timers: counts and times the stages (named in order), or None.
    """

    def __init__(
        self, spec: spec_lib.RecordSpec, stages: tuple[base.TensorStage, ...], with_metadata: bool,
        timers: Timers | None = None,
    ) -> None:
        self.spec = spec
        self.stages = stages
        self.timers = timers if stages else None
        self.with_metadata = with_metadata
        #: Whether the generator pairs batches with metadata (the stages need the seeds).
        self.seeded = with_metadata or bool(stages)
        #: Whether the generator hands over only the records' seeds, not the whole
        #: metadata (the stages need the seeds; the loader does not yield the rest):
        #: one array per batch instead of four, each a conversion and a leaf tf.data
        #: checks in Python.
        self.seeds_only = self.seeded and not with_metadata
        self._functions: dict[tuple[int | None, bool, bool, bool], Any] = {}
        self._specs: dict[int | None, Any] = {}

    def input_spec(self, batch_dim: int | None) -> Any:
        """The spec of the generator's elements (variable leaves as `graph.wire_spec`)."""
        data = graph.wire_spec(self.spec, batch_dim)
        if self.seeds_only:
            return data, graph.metadata_spec(batch_dim)["seed"]
        return (data, graph.metadata_spec(batch_dim)) if self.seeded else data

    def element_spec(self, batch_dim: int | None) -> Any:
        """The spec of the finished elements (traced through the stages when there are any)."""
        if not self.stages:
            return graph.element_spec(self.spec, batch_dim, self.with_metadata)
        if batch_dim not in self._specs:
            empty = tf.data.Dataset.from_generator(
                lambda: iter(()), output_signature=self.input_spec(batch_dim)
            )
            self._specs[batch_dim] = self.map(empty, batch_dim).element_spec
        return self._specs[batch_dim]

    def map(
        self, ds: tf.data.Dataset, batch_dim: int | None, *, rebatch: int | None = None
    ) -> tf.data.Dataset:
        """`ds` (elements as `input_spec` describes) mapped to the loader's elements.

        Args:
            ds: the generator's dataset.
            batch_dim: the static batch size of the finished elements, or None.
            rebatch: cut each batch into batches of this size (distributed input: one per
                replica) after assembling, before the tensor stages.
        """
        if rebatch is not None:
            ds = self._map(ds, batch_dim=None, assemble=True, stages=False)
            ds = ds.rebatch(rebatch, drop_remainder=True)
            return self._map(ds, batch_dim, assemble=False, stages=True)
        return self._map(ds, batch_dim, assemble=True, stages=True)

    def _map(
        self, ds: tf.data.Dataset, batch_dim: int | None, *, assemble: bool, stages: bool
    ) -> tf.data.Dataset:
        needed = (assemble and self.spec.variable) or (
            stages and (bool(self.stages) or self.seeded != self.with_metadata)
        )
        if not needed:
            return ds
        # Traced once per op-determinism state too: timed tensor stages read it (`Timers`).
        key = (batch_dim, assemble, stages, graph.op_determinism())
        function = self._functions.get(key)
        if function is None:
            function = self._functions[key] = tf.function(
                lambda element: self._finish(element, batch_dim, assemble=assemble, stages=stages)
            )
        # tf.data passes the items of a tuple element as separate arguments.
        is_tuple = isinstance(ds.element_spec, tuple)

        def finish(*args: Any) -> Any:
            return function(args if is_tuple else args[0])

        if stages and self.stages:
            return ds.map(finish, **graph.parallel_map())
        return ds.map(finish)

    def eager(self, element: Any, batch_dim: int | None) -> Any:
        """One element (tensors) finished eagerly; only without tensor stages (those run
        in tf.data, see the module docstring)."""
        assert not self.stages
        return self._finish(element, batch_dim, assemble=True, stages=True)

    def _finish(self, element: Any, batch_dim: int | None, *, assemble: bool, stages: bool) -> Any:
        data, meta = element if self.seeded else (element, None)
        # The metadata, or only its seeds (`seeds_only`: the generator's elements).
        seeds = meta["seed"] if isinstance(meta, dict) else meta
        if assemble:
            data = graph.assemble(self.spec, data, batch_dim)
        if not stages:
            return (data, meta) if self.seeded else data
        for number, stage in enumerate(self.stages):
            assert seeds is not None  # the stages make the generator pair batches with seeds
            if self.timers is None:
                data = stage.fn(data, seeds)
            else:
                data = self.timers.timed(number, stage.fn, data, seeds)
        return (data, meta) if self.with_metadata else data
