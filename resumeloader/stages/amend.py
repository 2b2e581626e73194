"""What `Pipeline.amend` and `Pipeline.skip` build: the amended source, index stage and history.

A mixture change at position ``at`` gives the weights of every source of the mixture
from there on (0 removes one; a source of `add` joins with its weight). The
mixture's `ConcatSource` gains the added parts (keys of their own, so the keys
before the change are unchanged) and its `MixStage` is rebuilt with every change of
the history, in position order; a skip is only recorded in the history (the `Plan`
cuts the layout around it). See `resumeloader.core.history` for the semantics.
"""

from __future__ import annotations

import decimal
import fractions
import hashlib
import json
import numbers
from collections.abc import Mapping
from typing import Any

from resumeloader.core import history as history_lib
from resumeloader.core import quota, validate
from resumeloader.sources import base as source_base
from resumeloader.sources import concat, registry
from resumeloader.stages import base, mix

__all__ = ["mixture_change", "skip"]


def _weight(name: str, value: Any) -> fractions.Fraction:
    """A weight of an amendment: positive, or 0 (the source supplies nothing)."""
    zero = (
        isinstance(value, (numbers.Real, decimal.Decimal))
        and not isinstance(value, bool)
        and value == 0
    ) or (isinstance(value, str) and value.strip() in ("0", "0.0", "0/1"))
    return fractions.Fraction(0) if zero else quota.to_fraction(name, value)


def _identity(part: source_base.Source) -> str:
    text = json.dumps(part.order_fields(), sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def mixture_change(
    source: source_base.Source,
    stage: base.IndexStage,
    history: history_lib.History,
    at: Any,
    weights: Any,
    add: Any,
) -> tuple[concat.ConcatSource, mix.MixStage, history_lib.History]:
    """The source, index stage and history of a mixture changed at `at` (`Pipeline.amend`).

    Raises:
        ValueError: the pipeline is no mixture, `weights` does not name exactly the
            mixture's sources and the added ones, an added name is taken, no weight
            is positive, another change is at `at`, or see `ConcatSource`.
        TypeError: `weights` or `add` is not a mapping, or a weight not a number.
    """
    if not isinstance(stage, mix.MixStage) or not isinstance(source, concat.ConcatSource):
        msg = (
            "`amend` changes the weights of a mixture, but this pipeline's order comes from "
            f"{stage.describe()!r}. Build it with `Pipeline.mix` (a single source is a "
            "mixture of one), or skip positions with `Pipeline.skip`."
        )
        raise ValueError(msg)
    add = {} if add is None else add
    for name, value in (("weights", weights), ("add", add)):
        if not isinstance(value, Mapping):
            msg = (
                f"`{name}` must be a mapping of source name -> value. "
                f"Received: {name}={value!r:.80} of type {type(value).__name__}."
            )
            raise TypeError(msg)
    known = set(stage.parts)
    taken = sorted(map(str, set(add) & known))
    if taken:
        msg = (
            f"`add` names sources already in the mixture: {taken}. Change their weights "
            "instead (a removed source comes back with a positive weight and continues "
            "its walk where it stood)."
        )
        raise ValueError(msg)
    expected = known | set(add)
    if set(weights) != expected:
        msg = (
            "`weights` must give the weight of every source of the mixture (0 removes one) "
            "and of each source in `add`. Received: missing "
            f"{sorted(map(str, expected - set(weights)))}, unknown "
            f"{sorted(map(str, set(weights) - expected))}."
        )
        raise ValueError(msg)
    position = validate.integer("at", at, low=0, high=2**63 - 1)
    adapted = {name: _adapt(name, part) for name, part in add.items()}
    change = history_lib.MixChange(
        position,
        tuple(sorted((str(n), _weight(f"weights[{n!r}]", w)) for n, w in weights.items())),
        tuple(sorted((str(n), _identity(p)) for n, p in adapted.items())),
    )
    amended = history.plus(change)
    parts = {**dict(source.added), **adapted}
    order = [name for c in amended.changes for name, _ in c.added]
    new_source = concat.ConcatSource(
        dict(zip(source.names, source.parts, strict=True)),
        added=[(name, parts[name]) for name in order],
    )
    new_stage = stage.amended(amended.changes, [(name, len(parts[name])) for name in order])
    return new_source, new_stage, amended


def skip(
    history: history_lib.History, start: Any, stop: Any, num_batches: Any, batch_size: int | None
) -> history_lib.History:
    """The history with the skip of positions ``[start, stop)`` (`Pipeline.skip`).

    Raises:
        ValueError: neither or both of `stop` and `num_batches`, an empty range, one
            overlapping another skip, or `num_batches` without a batch stage.
    """
    if (stop is None) == (num_batches is None):
        msg = (
            "Give a skip's end as `stop` (a position) or as `num_batches` (batches of the "
            f"pipeline's batch size), not both or neither. Received: stop={stop!r}, "
            f"num_batches={num_batches!r}."
        )
        raise ValueError(msg)
    first = validate.integer("start", start, low=0, high=2**63 - 1)
    if num_batches is not None:
        if batch_size is None:
            msg = (
                "`num_batches` counts batches of the pipeline's batch size, but it has no "
                "batch stage yet: add `.batch(batch_size)` first, or give `stop`."
            )
            raise ValueError(msg)
        stop = first + validate.integer("num_batches", num_batches, low=1) * batch_size
    return history.plus(history_lib.Skip(first, validate.integer("stop", stop, low=0)))


def _adapt(name: Any, part: Any) -> source_base.Source:
    try:
        return registry.adapt(part)
    except (TypeError, ValueError) as err:
        msg = f"Added mixture source {name!r}: {err}"
        raise type(err)(msg) from err
