"""`Pipeline`: the public way to compose stages into the record order of a loader."""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from resumeloader import sources
from resumeloader.core import history as history_lib
from resumeloader.core import spec as spec_lib
from resumeloader.core import validate
from resumeloader.sources import base as sources_base
from resumeloader.stages import amend as amend_lib
from resumeloader.stages import base, blocks, map_batch, mix, on_error, sampler, tf_map
from resumeloader.stages import map as map_stage
from resumeloader.stages.batching import bucket, fixed, pack, padded, tokens

__all__ = ["Pipeline"]

_KINDS = ("index", "record", "batch", "batch_map", "tensor")


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Pipeline:
    """A frozen chain of stages that defines which bytes land in which batch.

    A pipeline reads a source in an index order (natural, or shuffled per epoch),
    runs record stages on each record, groups records into batches (`batch`, or for
    records of varying length `padded_batch`, `bucket_by_length`, `pack`,
    `batch_by_tokens`) and runs tensor stages (TensorFlow ops) on each batch. Each
    method returns a new pipeline; each stage checks its own arguments (a stage of
    your own is added with `apply`). How the batches are delivered (workers, prefetch,
    the tf.data graph, distribution) is not part of it: pass the pipeline to
    `ResumableLoader.from_pipeline` with those options.

    Guarantees: the batch at a position is a pure function of the pipeline, its
    seed, the epoch and the position; the state a loader saves names every stage
    field that defines it (`order_fields`), so a checkpoint of another pipeline is
    refused.

    A pipeline is a frozen value: its fields are its stages, and each builder method
    returns a new pipeline (``dataclasses.replace``); make one from a source and a
    seed, and its stages with the builder methods (or `apply`), which check them.

    Args:
        source: a NumPy array or tensor, a dict or tuple of equal-length columns
            (arrays, lists, tensors), a Hugging Face ``datasets.Dataset``, a `Source`
            (e.g. `TFRecordSource`), or any object with ``len()`` and
            ``__getitem__(int)`` (a list is a sequence of records).
        seed: integer in [0, 2**64); the pipeline's one seed: every stage receives it
            (it keys the shuffle and every record's ``rng``).
        output_signature: the structure of `tf.TensorSpec` of one source record (no
            batch dimension; ``None`` for a dimension that varies, ``tf.string`` for
            bytes or str); read from the source, or from record 0, when None. After a
            record stage, give it to `map` instead.

    Attributes:
        source: the `Source` records are read from.
        seed: the seed every stage receives.
        index_stage: the index stage (the natural order unless one is applied).
        record_stages: the record stages, in order.
        batch_stage: the batch stage, or None.
        batch_map_stages: the batch map stages, in order.
        tensor_stages: the tensor stages, in order.
        error_policy: the bad-record `ErrorPolicy`.
        history: the amendments (`History`).
        record_spec: the records' `RecordSpec` (as the batch stage receives them), or
            None when it is read from the source or record 0.

    Examples:
        >>> import numpy as np
        >>> pipeline = Pipeline(np.arange(10), seed=0).shuffle().batch(4)
        >>> [stage.name for stage in pipeline.stages]
        ['sampler', 'batch']
        >>> sorted(pipeline.order_fields())
        ['pipeline.seed', 'sampler.algorithm', 'sampler.shuffle', 'source.identity',
         'source.num_records']
    """

    source: Any
    _: dataclasses.KW_ONLY
    seed: int
    output_signature: dataclasses.InitVar[Any] = None
    # The natural order of the source when None (set on construction).
    index_stage: base.IndexStage = None  # type: ignore[assignment]
    record_stages: tuple[base.RecordStage, ...] = ()
    batch_stage: base.BatchStage | None = None
    batch_map_stages: tuple[base.BatchMapStage, ...] = ()
    tensor_stages: tuple[base.TensorStage, ...] = ()
    error_policy: on_error.ErrorPolicy = dataclasses.field(default_factory=on_error.ErrorPolicy)
    history: history_lib.History = dataclasses.field(default_factory=history_lib.History)
    record_spec: spec_lib.RecordSpec | None = None

    def __post_init__(self, output_signature: Any) -> None:
        if not isinstance(self.source, sources_base.Source):
            object.__setattr__(self, "source", sources.adapt(self.source))
        object.__setattr__(self, "seed", validate.seed(self.seed))
        if self.index_stage is None:
            natural = sampler.SamplerStage(len(self.source), shuffle=False)
            object.__setattr__(self, "index_stage", natural)
        if output_signature is not None:
            object.__setattr__(self, "record_spec", _spec(output_signature))

    @classmethod
    @validate.typechecked
    def mix(
        cls,
        sources: Mapping[str, Any],
        *,
        weights: Mapping[str, Any],
        seed: validate.Int,
        shuffle: bool = True,
        records_per_epoch: validate.Int | str = "first_exhausted",
    ) -> Pipeline:
        """A pipeline reading a weighted mixture of named sources (docs/guides/mixing.md).

        The source at every position is exact: after any ``n`` records each source
        has supplied ``weight * n`` of them to within one. Each source walks its own
        seeded permutation and starts a new one whenever it runs out. An epoch is
        `records_per_epoch` consecutive records of the endless mixed stream (see
        `resumeloader.stages.mix` for the details and the record index).

        Args:
            sources: source name -> a source (anything `Pipeline` accepts); records
                of every source must have one structure.
            weights: source name -> a positive weight (int, float read as its
                decimal, Fraction, Decimal or a string like ``"7/10"``), normalised.
            seed: integer in [0, 2**64); keys every source's walk and record ``rng``.
            shuffle: False walks every source in its natural order.
            records_per_epoch: ``"first_exhausted"`` (an epoch ends where the first
                source has supplied all its records once), ``"all_exhausted"`` (the
                last one), or a number of records.

        Examples:
            >>> import numpy as np
            >>> pipeline = Pipeline.mix(
            ...     {"web": np.arange(100), "code": np.arange(1000, 1030)},
            ...     weights={"web": 0.7, "code": 0.3}, seed=0, shuffle=False)
            >>> pipeline.index_stage.num_records   # "code" has given its 30 records once
            99
        """
        source, stage = mix.build(
            sources, weights=weights, shuffle=shuffle, records_per_epoch=records_per_epoch
        )
        return cls(source, seed=validate.seed(seed)).apply(stage)

    # -- composing ------------------------------------------------------------------
    def apply(self, stage: base.Stage) -> Pipeline:
        """The pipeline with `stage` added: an index stage replaces the order, a record
        stage runs after the others, a batch stage groups the records, a batch map stage
        and a tensor stage (after the batch stage) run after the others of their kind
        (every batch map stage, in Python, before any tensor stage).

        The methods below are shorthands for it; a stage of your own (the contract is in
        ARCHITECTURE.md, "The stage contract") is added the same way. A stage holds no
        seed: it receives this pipeline's with every call.

        Raises:
            TypeError: `stage` is no stage, or holds a ``seed`` of its own.
            ValueError: `stage` does not fit where it would go.
        """
        if not isinstance(stage, base.Stage) or stage.kind not in _KINDS:
            msg = (
                "`stage` must be an IndexStage, RecordStage or BatchStage. "
                f"Received: stage={stage!r:.80} of type {type(stage).__name__}."
            )
            raise TypeError(msg)
        seed = getattr(stage, "seed", None)  # e.g. a stage of your own written for 0.3
        if seed is not None:
            raise TypeError(base.seed_refused(type(stage).__name__, seed))
        part: Any = stage  # of the kind its `kind` names
        if stage.kind == "index":
            return dataclasses.replace(self, index_stage=part)
        if stage.kind == "batch_map":
            assert isinstance(stage, base.BatchMapStage)
            map_batch.check_placement(stage, self.batch_stage, self.tensor_stages, repr(self))
            return dataclasses.replace(self, batch_map_stages=(*self.batch_map_stages, stage))
        if stage.kind == "tensor":
            if self.batch_stage is None:
                msg = (
                    f"The tensor stage `{stage.name}` runs on batches and must come after the "
                    f"batch stage: add `.batch(batch_size)` first. Received: {self!r}."
                )
                raise ValueError(msg)
            return dataclasses.replace(self, tensor_stages=(*self.tensor_stages, part))
        self._check_unbatched(f"{stage.kind} stage `{stage.name}`")
        if stage.kind == "record":  # what it returns is described anew (or inferred)
            records = (*self.record_stages, part)
            return dataclasses.replace(self, record_stages=records, record_spec=None)
        return dataclasses.replace(self, batch_stage=part)

    @validate.typechecked
    def shuffle(
        self,
        enabled: bool = True,
        *,
        block: validate.Int | str | None = None,
        window_chunks: validate.Int = 4,
        chunk_records: validate.Int | None = None,
    ) -> Pipeline:
        """Reads every epoch in a seeded pseudo-random order (a new one each epoch).

        By default the shuffle is global: any record may come at any position. For data
        read by ranges (object storage), pass `block`: the **block order** cuts the
        records into chunks of consecutive records of about `block` bytes, shuffles
        the chunks every epoch and the records within each window of `window_chunks`
        chunks, so that a window's records come from exactly its chunks: one ranged
        GET per chunk, fetched ahead while the previous window trains
        (``docs/guides/object-storage.md``). A record then moves anywhere at chunk
        granularity, and within its window of ``window_chunks * chunk_records``
        positions (like a shuffle buffer of that many records; the global shuffle
        mixes any two records).

        Args:
            enabled: False keeps the natural order (for a flag passed through).
            block: the chunk size in bytes (an int, or e.g. ``"4MiB"``), resolved into
                a number of records from the source's mean record size (and lined up
                with its files where they hold equal counts).
            window_chunks: chunks per window of the block order (records move within
                a window).
            chunk_records: the chunk size in records instead of `block`.

        Raises:
            ValueError: the order comes from another index stage (a mixture: pass
                ``shuffle=`` to `Pipeline.mix`), which this would replace; `block` for
                a source that does not know its record sizes (pass `chunk_records`).
        """
        if not isinstance(self.index_stage, (sampler.SamplerStage, blocks.BlockStage)):
            msg = (
                "`shuffle()` orders a single source, and would replace this pipeline's index "
                f"stage ({self.index_stage.describe()}). Received: {self!r}. Choose the order "
                "where the stage is made (e.g. `Pipeline.mix(..., shuffle=False)`)."
            )
            raise ValueError(msg)
        source = self.source
        if block is None and chunk_records is None:
            stage = sampler.SamplerStage(len(source), shuffle=enabled)
            return dataclasses.replace(self.apply(stage), source=source.blocked(None))
        ordered = blocks.build(
            source, enabled=enabled, block=block,
            window_chunks=window_chunks, chunk_records=chunk_records,
        )
        chunk = ordered.chunk_records
        return dataclasses.replace(self.apply(ordered),
                                   source=_blocked(source, chunk, ordered.window_chunks))

    def map(
        self, fn: Callable[[Any, np.random.Generator], Any], *, output_signature: Any = None
    ) -> Pipeline:
        """Runs ``fn(record, rng)`` on every record, in Python, before batching.

        ``rng`` is a `numpy.random.Generator` keyed by (seed, epoch, record index):
        the same for a record however, wherever and after whatever restore it runs.
        `output_signature` describes what ``fn`` returns (see `Pipeline`); inferred
        from record 0 when None.
        """
        stage = map_stage.MapStage(fn)
        return dataclasses.replace(self.apply(stage), record_spec=_spec(output_signature))

    def with_output_signature(self, output_signature: Any) -> Pipeline:
        """The same pipeline, its records (as the batch stage receives them) described
        by `output_signature` (see `Pipeline`; None: inferred from record 0)."""
        return dataclasses.replace(self, record_spec=_spec(output_signature))

    def batch(self, batch_size: int, *, drop_remainder: bool = False) -> Pipeline:
        """Groups `batch_size` records of consecutive positions into each batch
        (`FixedBatchStage`: never across an epoch; an epoch's short last batch dropped
        when `drop_remainder`)."""
        return self.apply(fixed.FixedBatchStage(batch_size, drop_remainder=drop_remainder))

    def padded_batch(
        self, batch_size: int, *, pad_to: Any = None, pad_value: Any = 0, mask: bool = False,
        truncate: bool = False, drop_remainder: bool = False,
    ) -> Pipeline:
        """Like `batch`, every numeric leaf whose length varies padded into a dense array
        (`PaddedBatchStage`: the arguments and an example)."""
        stage = padded.PaddedBatchStage(
            batch_size, pad_to=pad_to, pad_value=pad_value, mask=mask, truncate=truncate,
            drop_remainder=drop_remainder,
        )
        return self.apply(stage)

    def bucket_by_length(
        self, batch_size: int, *, window: int, pad_to: Any = None, pad_value: Any = 0,
        mask: bool = False, truncate: bool = False, drop_remainder: bool = False,
    ) -> Pipeline:
        """Batches of records of similar length, each counting `batch_size` positions,
        cut from windows of `window` positions and padded (`BucketStage`)."""
        stage = bucket.BucketStage(
            batch_size, window=window, pad_to=pad_to, pad_value=pad_value, mask=mask,
            truncate=truncate, drop_remainder=drop_remainder,
        )
        return self.apply(stage)

    def pack(self, length: Any, *, window: int, batch_size: int, pad_value: Any = 0) -> Pipeline:
        """Packs the sequences of each window of `window` positions into rows of `length`
        tokens, `batch_size` rows per batch (`PackStage`)."""
        stage = pack.PackStage(length, window=window, batch_size=batch_size, pad_value=pad_value)
        return self.apply(stage)

    def batch_by_tokens(
        self, max_tokens: int, *, window: int,
        boundaries: tuple[int, ...] | list[int] | None = None, max_batch_size: int | None = None,
        pad_value: Any = 0, mask: bool = False,
    ) -> Pipeline:
        """Batches of as many records of each window of `window` positions as fit
        `max_tokens` padded tokens (`TokenBudgetStage`)."""
        stage = tokens.TokenBudgetStage(
            max_tokens, window=window, boundaries=boundaries, max_batch_size=max_batch_size,
            pad_value=pad_value, mask=mask,
        )
        return self.apply(stage)

    def map_batch(
        self, fn: Callable[..., Any], *, output_signature: Any = None,
        rowwise: bool = True, out: bool = False,
    ) -> Pipeline:
        """Runs ``fn(batch, rngs)`` on every batch, in Python (the calling thread or the
        workers), after the batch stage: vectorised NumPy augmentation once per batch.

        ``rngs[i]`` is row ``i``'s `numpy.random.Generator`, keyed by (seed, epoch, the
        row's record index) (`MapBatchStage`: the generators, the checks, and what
        `rowwise` guarantees on a batch-size change). `output_signature` describes a row
        of what ``fn`` returns (the input's when None). Must follow a plain batch stage
        (`batch`, `padded_batch`). With `out`, ``fn(batch, rngs, out)`` may write its
        result into ``out`` (a batch of that signature in recycled aligned memory) and
        return it: it then reaches TensorFlow without a copy.
        """
        stage = map_batch.MapBatchStage(
            fn, rowwise=rowwise, output_signature=output_signature, out=out,
            batch_size=None if rowwise or self.batch_stage is None else self.batch_stage.batch_size,
        )
        return self.apply(stage)

    def tf_map(self, fn: Callable[[Any, Any], Any]) -> Pipeline:
        """Runs ``fn(batch, seeds)``, a function of TensorFlow ops, on every batch, inside
        the loader's tf.data graph (`TFMapStage`: seeds, bytes, errors). Must follow the
        batch stage."""
        return self.apply(tf_map.TFMapStage(fn))

    def on_error(
        self, policy: str | Callable[[int, int, Exception], Any] = "raise", *,
        max_fraction: float = 0.01, quarantine: str | os.PathLike[str] | None = None,
    ) -> Pipeline:
        """What a failing record becomes: an error (``"raise"``, the default), a seeded
        replacement (``"skip"``) or ``fn(record_index, epoch, error)``'s record; every
        replacement logged to `quarantine`, within the error budget `max_fraction`
        (`ErrorPolicy`: each policy, the log and the budget)."""
        policy_ = on_error.ErrorPolicy(policy, max_fraction=max_fraction, quarantine=quarantine)
        return dataclasses.replace(self, error_policy=policy_)

    # -- the run's data history (docs/guides/changing-data.md) -------------------------
    def amend(self, at: int, *, weights: Mapping[str, Any], add: Mapping[str, Any] | None = None
              ) -> Pipeline:
        """From position `at` of the global order on, the mixture has the weights `weights`.

        `at` counts records of the global order (``epoch * records_per_epoch +
        offset`` of a state; with one shard, ``loader.position``). Before it the
        stream is unchanged (every past batch recomputable); from it on each source
        continues its own walk where it stood, so nothing supplied is repeated or
        skipped, and every prefix of the new segment holds the new weights to within
        one record. Epochs keep their length (the base mixture's
        ``records_per_epoch``). A checkpoint saved before `at` restores into the
        amended pipeline; one saved after it restores only into a pipeline with the
        same amendment (`StateMismatchError` names it otherwise).

        Args:
            at: the position where the change takes effect.
            weights: source name -> weight of every source of the mixture and of each
                source in `add`; 0 removes a source (a positive weight later brings it
                back where it stood).
            add: new source name -> source (anything `Pipeline.mix` accepts, whose
                records fit the mixture's).
        """
        source, stage, history = amend_lib.mixture_change(
            self.source, self.index_stage, self.history, at, weights, add
        )
        return dataclasses.replace(self, source=source, index_stage=stage, history=history)

    def skip(self, start: int, stop: int | None = None, *, num_batches: int | None = None
             ) -> Pipeline:
        """The positions ``[start, stop)`` of the global order are never handed out.

        The loader jumps from `start` to `stop`: the position counts the skipped
        records (so a checkpoint's position means the same with and without the
        skip), batch numbers (steps) do not; a batch never crosses a skip (the one
        before it ends short when `start` is not a batch boundary, and is dropped with
        ``drop_remainder``). A windowed batch stage skips whole windows: `start` and
        `stop` must be window boundaries. Robust to restarts from before or after the
        skip and to another batch size: it is absolute, in positions.

        Args:
            start: the first position skipped (e.g. a checkpoint's position).
            stop: the first position after the skip.
            num_batches: instead of `stop`: ``stop = start + num_batches *
                batch_size``, with this pipeline's batch size (one shard's batch; with
                several shards give `stop`).
        """
        size = None if self.batch_stage is None else self.batch_stage.batch_size
        history = amend_lib.skip(self.history, start, stop, num_batches, size)
        return dataclasses.replace(self, history=history)

    def with_batch_size(self, batch_size: int) -> Pipeline:
        """The same pipeline with another batch size (the record order is unchanged)."""
        if self.batch_stage is None:
            return self.batch(batch_size)
        maps = tuple(map_batch.resized(stage, batch_size) for stage in self.batch_map_stages)
        # the batch stage checks it
        batch = self.batch_stage.resized(batch_size)
        return dataclasses.replace(self, batch_stage=batch, batch_map_stages=maps)

    def _check_unbatched(self, what: str) -> None:
        if self.batch_stage is not None:
            msg = (
                f"The {what} must come before the batch stage, but this pipeline is batched "
                f"already ({self.batch_stage.describe()}). Received: {self!r}."
            )
            raise ValueError(msg)

    # -- reading it -----------------------------------------------------------------
    @property
    def stages(self) -> tuple[base.Stage, ...]:
        """Every stage, in order: index, records, batch, batch map, tensor stages."""
        tail = () if self.batch_stage is None else (self.batch_stage,)
        return (
            self.index_stage, *self.record_stages, *tail, *self.batch_map_stages,
            *self.tensor_stages,
        )

    def python_part(self) -> Pipeline:
        """The pipeline without its tensor stages: what runs in Python (and is sent to
        process workers)."""
        return dataclasses.replace(self, tensor_stages=()) if self.tensor_stages else self

    def order_fields(self) -> dict[str, int | str]:
        """Every field that defines the order, as ``"<stage>.<field>"``."""
        fields: dict[str, int | str] = {"pipeline.seed": self.seed}
        fields.update({f"source.{k}": v for k, v in self.source.order_fields().items()})
        for stage in self.stages:
            fields.update({f"{stage.name}.{k}": v for k, v in stage.order_fields().items()})
        fields.update({f"on_error.{k}": v for k, v in self.error_policy.order_fields().items()})
        fields.update(self.history.order_fields())
        return fields

    def explain_field(self, key: str, saved: int | str) -> str | None:
        """Why order field `key` (``"source.versions"``...) was `saved` in a checkpoint and
        differs now, in words, when the source can tell; else None."""
        if key.startswith("source."):
            return self.source.explain_field(key.removeprefix("source."), saved)
        return None

    def __repr__(self) -> str:
        stages = " -> ".join(stage.describe() for stage in self.stages)
        if self.error_policy.replaces:
            stages += f", {self.error_policy.describe()}"
        return f"Pipeline({self.source.description}: {stages}, seed={self.seed})"


def _spec(output_signature: Any) -> spec_lib.RecordSpec | None:
    if output_signature is None or isinstance(output_signature, spec_lib.RecordSpec):
        return output_signature
    return spec_lib.RecordSpec.from_signature(output_signature)


def _blocked(source: sources_base.Source, chunk: int, window_chunks: int) -> sources_base.Source:
    """``source.blocked(chunk, window_chunks=...)``; a source of its own that overrides
    `blocked` with the older signature (no `window_chunks`) is called without it."""
    try:
        parameters: Mapping[str, inspect.Parameter] = inspect.signature(source.blocked).parameters
    except (TypeError, ValueError):  # no signature to read: the older call is the safe one
        parameters = {}
    accepts = "window_chunks" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    if accepts:
        return source.blocked(chunk, window_chunks=window_chunks)
    return source.blocked(chunk)
