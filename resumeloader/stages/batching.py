"""The `Pipeline` methods that batch records of varying length: padding, bucketing, packing.

A mixin of `resumeloader.stages.pipeline.Pipeline` (kept apart so that each module
stays short); each method checks its arguments and `apply` s one batch stage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from resumeloader.core import validate
from resumeloader.stages import base, bucket, pack, padded, tokens

__all__ = ["BatchingMethods"]

P = TypeVar("P", bound="BatchingMethods")


def _lengths(name: str, value: Any, *, optional: bool) -> Any:
    """A length, or a mapping of keys to lengths (None allowed when `optional`)."""
    if isinstance(value, Mapping):
        return {k: _lengths(f"{name}[{k!r}]", v, optional=optional) for k, v in value.items()}
    if value is None and optional:
        return None
    return validate.integer(name, value, low=1, high=validate.MAX_COUNT)


def _window(window: Any) -> int:
    return validate.integer("window", window, low=1, high=validate.MAX_COUNT)


class BatchingMethods:
    """`Pipeline.padded_batch`, `bucket_by_length`, `pack` and `batch_by_tokens`."""

    def apply(self: P, stage: base.Stage) -> P:
        raise NotImplementedError

    @validate.typechecked
    def padded_batch(
        self: P,
        batch_size: validate.Int,
        *,
        pad_to: Any = None,
        pad_value: Any = 0,
        mask: bool = False,
        truncate: bool = False,
        drop_remainder: bool = False,
    ) -> P:
        """Like `batch`, with every numeric leaf whose length varies padded into a dense array.

        The batches are those of ``batch(batch_size)`` — consecutive positions, never
        across an epoch — and each varying dimension is padded to the batch's longest
        record, or to `pad_to`. Strings are not padded. Resuming with another batch
        size is allowed, as for `batch`.

        Args:
            batch_size: records per batch.
            pad_to: None (the longest record of each batch), a length, or a mapping of
                a dict record's keys to either.
            pad_value: the fill value, or a mapping of a dict record's keys to one.
            mask: add a boolean mask per padded leaf, True where a record has data:
                ``"<key>_mask"`` beside it in a dict record; a record that is one
                array becomes ``(values, mask)``.
            truncate: cut records longer than `pad_to` (else they raise
                `RecordSpecError` naming the record).
            drop_remainder: drop each epoch's short last batch.

        Examples:
            >>> import numpy as np
            >>> from resumeloader import Pipeline, ResumableLoader
            >>> data = {"tokens": [np.arange(1, n + 1) for n in (3, 1, 4, 2)]}
            >>> pipeline = Pipeline(data, seed=0).padded_batch(2, mask=True)
            >>> batch = next(iter(ResumableLoader.from_pipeline(pipeline)))
            >>> batch["tokens"].numpy().tolist(), batch["tokens_mask"].numpy().tolist()
            ([[1, 2, 3], [1, 0, 0]], [[True, True, True], [True, False, False]])
        """
        stage = padded.PaddedBatchStage(
            validate.integer("batch_size", batch_size, low=1, high=validate.MAX_COUNT),
            drop_remainder=drop_remainder,
            pad_to=_lengths("pad_to", pad_to, optional=True),
            pad_value=pad_value,
            mask=mask,
            truncate=truncate,
        )
        return self.apply(stage)

    @validate.typechecked
    def bucket_by_length(
        self: P,
        batch_size: validate.Int,
        *,
        window: validate.Int,
        pad_to: Any = None,
        pad_value: Any = 0,
        mask: bool = False,
        truncate: bool = False,
        drop_remainder: bool = False,
    ) -> P:
        """Batches of records of similar length, each counting `batch_size` positions.

        Within each window of `window` consecutive positions (a multiple of
        `batch_size`, aligned to the epoch's start) records are sorted by length and
        cut into batches of `batch_size`; the window's batches come in a seeded order
        (a pure function of the seed, epoch and window), an epoch's short batch last.
        Each batch is padded as by `padded_batch`. Batches per epoch, ``len``, Keras'
        ``steps_per_epoch`` and graph advances are those of ``batch(batch_size)``.
        `window` and `batch_size` are order fields; a restore inside a window
        recomputes that window and continues after the batch the position names.

        Examples:
            >>> import numpy as np
            >>> from resumeloader import Pipeline, ResumableLoader
            >>> data = [np.arange(n) for n in (5, 1, 4, 2, 3, 6, 1, 2)]
            >>> pipeline = Pipeline(data, seed=0).bucket_by_length(2, window=8)
            >>> loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
            >>> [b.shape.as_list() for b in loader]   # [records, padded length]
            [[2, 2], [2, 6], [2, 1], [2, 4]]
        """
        batch_size = validate.integer("batch_size", batch_size, low=1, high=validate.MAX_COUNT)
        stage = bucket.BucketStage(
            batch_size,
            window=_window(window),
            drop_remainder=drop_remainder,
            pad_to=_lengths("pad_to", pad_to, optional=True),
            pad_value=pad_value,
            mask=mask,
            truncate=truncate,
        )
        return self.apply(stage)

    @validate.typechecked
    def pack(
        self: P, length: Any, *, window: validate.Int, batch_size: validate.Int, pad_value: Any = 0
    ) -> P:
        """Packs sequences into rows of `length` tokens (first-fit decreasing per window).

        The records of each window of `window` consecutive positions are packed into
        rows, longest first, each into the first row where it fits; rows come in a
        seeded order, `batch_size` rows per batch, the window's last batch filled
        with empty rows. A leaf ``k`` becomes ``k`` (the tokens), ``k_segment_ids``
        (1, 2, ... per record of the row, 0 for padding) and ``k_positions`` (0, 1,
        ... within each record); a record that is one array becomes ``tokens``,
        ``segment_ids`` and ``positions``. A batch counts the records it holds:
        ``len(loader)`` and ``batches_per_epoch`` raise, Keras needs
        ``epoch_dataset(loader)`` without ``steps_per_epoch``.

        Args:
            length: tokens per row: an int, or a mapping of a dict record's keys to ints.
            window: positions per window (more: fuller rows, more to recompute on a
                restore inside a window).
            batch_size: rows per batch.
            pad_value: the fill value of the tokens, or a mapping per key.

        Examples:
            >>> import numpy as np
            >>> from resumeloader import Pipeline, ResumableLoader
            >>> data = [np.arange(1, n + 1) for n in (3, 2, 4, 1)]
            >>> pipeline = Pipeline(data, seed=0).pack(5, window=4, batch_size=2)
            >>> batch = next(iter(ResumableLoader.from_pipeline(pipeline)))
            >>> batch["tokens"].numpy().tolist()
            [[1, 2, 3, 1, 2], [1, 2, 3, 4, 1]]
            >>> batch["segment_ids"].numpy().tolist()
            [[1, 1, 1, 2, 2], [1, 1, 1, 1, 2]]
            >>> batch["positions"].numpy().tolist()
            [[0, 1, 2, 0, 1], [0, 1, 2, 3, 0]]
        """
        stage = pack.PackStage(
            _lengths("length", length, optional=False),
            window=_window(window),
            batch_size=validate.integer("batch_size", batch_size, low=1, high=validate.MAX_COUNT),
            pad_value=pad_value,
        )
        return self.apply(stage)

    @validate.typechecked
    def batch_by_tokens(
        self: P,
        max_tokens: validate.Int,
        *,
        window: validate.Int,
        boundaries: list[int] | tuple[int, ...] | None = None,
        max_batch_size: validate.Int | None = None,
        pad_value: Any = 0,
        mask: bool = False,
    ) -> P:
        """Batches of as many records as fit `max_tokens` padded tokens (records x longest).

        Within each window of `window` consecutive positions records are sorted by
        length (inside each length bucket of `boundaries`, if given) and cut
        greedily under the budget (and `max_batch_size`); the window's batches come
        in a seeded order. Each batch is padded to its longest record. A batch counts
        the records it holds: ``len(loader)`` and ``batches_per_epoch`` raise. A
        record longer than `max_tokens` raises `RecordSpecError` naming it.

        Examples:
            >>> import numpy as np
            >>> from resumeloader import Pipeline, ResumableLoader
            >>> data = [np.arange(n) for n in (5, 1, 4, 2, 3, 6, 1, 2)]
            >>> pipeline = Pipeline(data, seed=0).batch_by_tokens(8, window=8)
            >>> loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
            >>> [(b.shape.as_list(), loader.position) for b in loader]   # position: records
            [([2, 4], 2), ([1, 6], 3), ([4, 2], 7), ([1, 5], 8)]
        """
        if boundaries is not None:
            boundaries = tuple(
                validate.integer("boundaries[]", b, low=1, high=validate.MAX_COUNT)
                for b in boundaries
            )
        stage = tokens.TokenBudgetStage(
            validate.integer("max_tokens", max_tokens, low=1, high=validate.MAX_COUNT),
            window=_window(window),
            boundaries=boundaries,
            max_batch_size=None
            if max_batch_size is None
            else validate.integer("max_batch_size", max_batch_size, low=1),
            pad_value=pad_value,
            mask=mask,
        )
        return self.apply(stage)
