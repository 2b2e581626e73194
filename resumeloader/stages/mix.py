"""`MixStage`: a weighted mixture of named sources, each walked in its own seeded order.

The mixture is one endless stream of positions ``g = 0, 1, 2, ...``. The source at
``g`` comes from the quota sequence of the weights (`resumeloader.core.quota`): after
any ``n`` positions, each source has supplied ``weight * n`` records to within one,
exactly (rational arithmetic). The record a source supplies is the next one of its
own walk: its ``c``-th record (``c`` counted over the whole stream) is record
``permute(len, source_seed, c // len, c % len)`` (or ``c % len`` unshuffled), so each
source goes through a fresh seeded permutation of its records every time it runs
out (a small source repeats, a large one need not finish) and its walk does not
depend on the weights. ``source_seed`` is derived from the pipeline seed (which
`MixStage.indices` receives, like every stage: the stage holds none) and the source's
name.

An *epoch* of the mixture is a window of ``records_per_epoch`` consecutive positions
(``g = epoch * records_per_epoch + offset``): what Keras epochs, ``len``,
``num_epochs`` and sharding count. By default it ends where the first source has
supplied all its records once (``"first_exhausted"``); ``"all_exhausted"`` ends it
where the last one has; an integer fixes it. The next epoch continues every source
where it stopped.

A mixed record's index is its key in the `ConcatSource`: ``lap * total + start of
its source + record``, where ``lap`` is how many times its source was walked
through before; ``source.locate(index)`` decodes it. Per-record randomness
(``record_rng(seed, epoch, index)``) therefore differs between repeats of a record.

An *amended* mixture (`Pipeline.amend`) changes its weights at positions, adding
sources or removing them (`resumeloader.stages.mix_segments`): each source continues
its walk where it stood. A source added by an amendment has keys of its own, ``tag *
2**56 + lap * length + record`` (`concat.TAG_SHIFT`), so that the keys, and with
them the randomness, of every record before the amendment stay what they were.
``records_per_epoch`` stays the base mixture's number of positions (for
``"first_exhausted"``: where the first source had supplied all its records once
under the base weights), so that positions and epochs mean the same before and
after every amendment.
"""

from __future__ import annotations

import fractions
import functools
import hashlib
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from resumeloader.core import history as history_lib
from resumeloader.core import quota, sampler, validate
from resumeloader.sources import concat, registry
from resumeloader.stages import base, mix_segments

__all__ = ["ALGORITHM", "EPOCH_RULES", "MixStage", "build"]

# Changing the quota rule, the key layout or the source seeds changes every mixed
# stream: bump ALGORITHM with them.
ALGORITHM = "quota-jefferson-v1"
EPOCH_RULES = ("first_exhausted", "all_exhausted")
_MAX_INT64 = 2**63 - 1


@functools.lru_cache(maxsize=256)
def source_seed(seed: int, name: str) -> int:
    """The 64-bit seed of source `name`'s walk, derived from the pipeline seed."""
    text = f"{seed}:{name}".encode()
    digest = hashlib.blake2b(text, digest_size=8, person=b"resumeloader-mix").digest()
    return int.from_bytes(digest, "little")


class MixStage(base.IndexStage):
    """The index stage of a mixture (see the module docstring).

    Guarantees: the key at a position is a pure function of the sources' names and
    lengths, the weights, `shuffle`, the pipeline's seed and the position, O(1) per position
    (plus O(1) per distinct source epoch in a call); after any prefix of ``n``
    positions each source's count is within one of ``weight * n`` (strictly); each
    source's records, in stream order, are consecutive permutations of its records.

    Args:
        names: the sources' names, in the order of the `ConcatSource`.
        lengths: their numbers of records.
        weights: one positive `fractions.Fraction` per source (normalised here).
        shuffle: False walks each source in its natural order.
        records_per_epoch: ``"first_exhausted"``, ``"all_exhausted"`` or a positive int.
        changes: the mixture changes of the pipeline's history, by position.
        added: ``(name, length)`` of each source added by a change (its tag is its
            place here, from 1).
    """

    name = "mix"
    algorithm = ALGORITHM

    def __init__(
        self,
        names: Sequence[str],
        lengths: Sequence[int],
        weights: Sequence[fractions.Fraction],
        *,
        shuffle: bool,
        records_per_epoch: validate.Int | str = "first_exhausted",
        changes: Sequence[history_lib.MixChange] = (),
        added: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.names = tuple(names)
        self.lengths = tuple(validate.integer("lengths[]", n, low=1) for n in lengths)
        if not len(self.names) == len(self.lengths) == len(weights) >= 1:
            msg = (
                "`names`, `lengths` and `weights` must give one entry per source. Received: "
                f"{len(self.names)} names, {len(self.lengths)} lengths, {len(weights)} weights."
            )
            raise ValueError(msg)
        #: Whether each source walks a new seeded permutation every time through.
        self.shuffle = validate.boolean("shuffle", shuffle)
        self._quota = quota.QuotaSequence(list(weights))
        self.weights = self._quota.weights
        self._total = sum(self.lengths)
        self._starts = tuple(int(s) for s in np.cumsum((0, *self.lengths[:-1])))
        self._rule = records_per_epoch if isinstance(records_per_epoch, str) else "fixed"
        #: Positions in one epoch of the mixture (`records_per_epoch`).
        self.num_records = self._epoch_length(records_per_epoch)
        self._records_per_epoch = records_per_epoch
        self.changes = tuple(changes)
        self.added = tuple((str(n), validate.integer("added length", k, low=1)) for n, k in added)
        self._parts = (*self.names, *(n for n, _ in self.added))
        self._part_lengths = (*self.lengths, *(k for _, k in self.added))
        self._segments: mix_segments.Segments | None = None
        if self.changes:
            number = {name: k for k, name in enumerate(self._parts)}
            self._segments = mix_segments.Segments(
                self._quota,
                len(self._parts),
                [
                    (c.at, tuple(number[n] for n, _ in c.active), tuple(w for _, w in c.active))
                    for c in self.changes
                ],
            )

    def amended(
        self, changes: Sequence[history_lib.MixChange], added: Sequence[tuple[str, int]]
    ) -> MixStage:
        """The same mixture with the changes `changes` and the added sources `added`."""
        return MixStage(
            self.names, self.lengths, self._quota.weights, shuffle=self.shuffle,
            records_per_epoch=self._records_per_epoch, changes=changes, added=added,
        )

    @property
    def parts(self) -> tuple[str, ...]:
        """Every source ever in the mixture: the base ones, then the added ones."""
        return self._parts

    def _epoch_length(self, rule: Any) -> int:
        if isinstance(rule, str):
            if rule not in EPOCH_RULES:
                msg = (
                    f"`records_per_epoch` must be one of {', '.join(map(repr, EPOCH_RULES))} "
                    f"or a positive integer. Received: records_per_epoch={rule!r:.80}."
                )
                raise ValueError(msg)
            ends = [
                self._quota.position_of(k, length - 1) + 1 for k, length in enumerate(self.lengths)
            ]
            length = min(ends) if rule == "first_exhausted" else max(ends)
            return validate.integer(
                f"records_per_epoch ({rule})", length, low=1, high=validate.MAX_COUNT
            )
        return validate.integer("records_per_epoch", rule, low=1, high=validate.MAX_COUNT)

    def counts(self, num_positions: int) -> dict[str, int]:
        """How many of the first `num_positions` positions each source supplies."""
        num_positions = validate.integer("num_positions", num_positions, low=0)
        if self._segments is not None:
            return dict(zip(self._parts, self._segments.counts(num_positions), strict=True))
        return dict(zip(self.names, self._quota.counts(num_positions), strict=True))

    def indices(self, epoch: int, offsets: np.ndarray, *, seed: int) -> np.ndarray:
        if epoch > (_MAX_INT64 - self.num_records) // self.num_records:
            msg = (
                f"Mixture epoch {epoch} of {self.num_records} positions lies past 2**63 positions."
            )
            raise ValueError(msg)
        positions = offsets + epoch * self.num_records
        if self._segments is None:
            source, count = self._quota.locate(positions)
        else:
            source, count = self._segments.locate(positions)
        keys = np.empty_like(positions)
        for part in np.unique(source).tolist():
            where = np.flatnonzero(source == part)
            keys[where] = self._keys(part, count[where], source_seed(seed, self._parts[part]))
        return keys

    def _keys(self, part: int, count: np.ndarray, seed: int) -> np.ndarray:
        """The keys of source `part`'s records number `count` of its walk (its `seed`)."""
        if part >= len(self.names):
            return self._added_keys(part, count, seed)
        length = self.lengths[part]
        lap, record = np.divmod(count, length)
        if self.shuffle and length > 1:
            order = np.argsort(lap, kind="stable")
            laps = lap[order]
            bounds = [0, *(np.flatnonzero(laps[1:] != laps[:-1]) + 1).tolist(), len(order)]
            for start, stop in itertools.pairwise(bounds):
                at = order[start:stop]
                record[at] = sampler.permute(length, seed, int(laps[start]), record[at])
        if int(lap.max()) > (_MAX_INT64 - self._total) // self._total:
            msg = (
                f"Mixture keys overflow int64: source {self.names[part]!r} ({length} records) "
                f"is on lap {int(lap.max())} of a {self._total}-record mixture."
            )
            raise ValueError(msg)
        keys = lap * self._total + (self._starts[part] + record)
        if self.added and int(keys.max()) >= 1 << concat.TAG_SHIFT:
            msg = (
                f"Mixture keys of source {self.names[part]!r} reach 2**{concat.TAG_SHIFT}, "
                "where the keys of sources added by amendments start."
            )
            raise ValueError(msg)
        return keys

    def _added_keys(self, part: int, count: np.ndarray, seed: int) -> np.ndarray:
        length = self._part_lengths[part]
        lap, record = np.divmod(count, length)
        if self.shuffle and length > 1:
            for value in np.unique(lap).tolist():
                at = np.flatnonzero(lap == value)
                record[at] = sampler.permute(length, seed, value, record[at])
        tag = part - len(self.names) + 1
        if int(count.max()) >= 1 << concat.TAG_SHIFT:
            msg = f"Mixture keys of added source {self._parts[part]!r} overflow their tag."
            raise ValueError(msg)
        return (tag << concat.TAG_SHIFT) + lap * length + record

    def order_fields(self) -> base.Fields:
        weights = ",".join(f"{n}:{w}" for n, w in zip(self.names, self.weights, strict=True))
        return {
            "algorithm": self.algorithm,
            "permutation": sampler.ALGORITHM,
            "weights": weights,
            "shuffle": int(self.shuffle),
            "records_per_epoch": self.num_records,
        }

    def describe(self) -> str:
        weights = ", ".join(f"{n} {w}" for n, w in zip(self.names, self.weights, strict=True))
        order = "shuffled" if self.shuffle else "in order"
        changes = f", {len(self.changes)} weight changes" if self.changes else ""
        return (
            f"mix({weights}; each source {order}), "
            f"{self.num_records:,} records per epoch ({self._rule}){changes}"
        )


def build(
    sources: Any,
    *,
    weights: Any,
    shuffle: bool,
    records_per_epoch: validate.Int | str,
) -> tuple[concat.ConcatSource, MixStage]:
    """The `ConcatSource` and `MixStage` of a mixture (what `Pipeline.mix` composes).

    Raises:
        TypeError: `sources` or `weights` is not a mapping, or a weight not a number.
        ValueError: their names differ, a weight is not positive, or see `MixStage`
            and `ConcatSource`.
    """
    for name, value in (("sources", sources), ("weights", weights)):
        if not isinstance(value, Mapping):
            msg = (
                f"`{name}` must be a mapping of source name -> {name[:-1]}. "
                f"Received: {name}={value!r:.80} of type {type(value).__name__}."
            )
            raise TypeError(msg)
    if set(sources) != set(weights):
        msg = (
            "`weights` must name exactly the sources. Received: sources without a weight: "
            f"{sorted(map(str, set(sources) - set(weights)))}; weights of no source: "
            f"{sorted(map(str, set(weights) - set(sources)))}."
        )
        raise ValueError(msg)
    source = concat.ConcatSource({name: _adapt(name, part) for name, part in sources.items()})
    fractions_ = [quota.to_fraction(f"weights[{n!r}]", weights[n]) for n in source.names]
    stage = MixStage(
        source.names,
        source.lengths,
        fractions_,
        shuffle=shuffle,
        records_per_epoch=records_per_epoch,
    )
    return source, stage


def _adapt(name: Any, part: Any) -> Any:
    try:
        return registry.adapt(part)
    except (TypeError, ValueError) as err:
        msg = f"Mixture source {name!r}: {err}"
        raise type(err)(msg) from err
