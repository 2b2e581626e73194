"""`ErrorPolicy`: what a failing record becomes (``Pipeline.on_error``).

A record *fails* when reading it, one of the record stages (``map_fn``) or its check
against the element spec raises. The policy decides what the stream holds instead:

* ``"raise"`` (the default): nothing; the stream ends with a `RecordError` naming
  the record index, the epoch and the position.
* ``"skip"``: another record of the same epoch, so that batch shapes and counts do
  not change. The candidates are a seeded sequence of `MAX_TRIES` offsets of the
  epoch's order keyed by (seed, epoch, failing record index); the first candidate
  that does not fail replaces it, read and transformed exactly as that record is
  elsewhere in the epoch (its ``rng`` is keyed by its own index). If all fail, the
  stream ends with a `RecordError` naming them.
* a callable ``fn(record_index, epoch, error) -> record``: its return value (a
  finished record: it does not go through the record stages), checked against
  the element spec. To end the stream instead, it raises.

The replacement is a pure function of (seed, epoch, failing index) and of which
records fail, so the stream after a restore is the uninterrupted one, provided a
record that fails always fails (a transient error, e.g. a network timeout, would
make the stream depend on when it happened: retry those inside the source).

What is replaced is counted and logged by the process that hands batches out
(`resumeloader.handout.quarantine`): every replacement is a line of the JSON-lines
quarantine log, and more than ``max_fraction`` of an epoch's records replaced raises
`ErrorBudgetError`. Pure Python and NumPy.
"""

from __future__ import annotations

import fractions
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from resumeloader import errors
from resumeloader.core import sampler, validate
from resumeloader.stages import base

__all__ = ["ALGORITHM", "MAX_TRIES", "ErrorPolicy"]

# Changing how candidates are drawn changes every stream with a failing record:
# bump ALGORITHM with it.
ALGORITHM = "epoch-draw-philox-v1"
MAX_TRIES = 16
MODES = ("raise", "skip")
_TAG = 0x0BAD_2EC0_2D5_5EED


class ErrorPolicy:
    """A pipeline's bad-record policy (`Pipeline.on_error`; see the module docstring).

    A record fails when reading it, a record stage (``map_fn``) or its check against
    the element spec raises (README, "Bad records"). ``"raise"``: the stream ends with
    a `RecordError` naming the record index, epoch and position. ``"skip"``: the record
    is replaced by the first of a seeded sequence of other records of its epoch, keyed
    by (seed, epoch, record index), that does not fail (16 tries, then `RecordError`);
    batch shapes and counts do not change, and the stream after a restore is the
    uninterrupted one, provided a record that fails always fails. A callable's return
    value replaces the record as it is (no record stage runs on it); raising ends the
    stream.

    Every replacement is appended to the JSON-lines `quarantine` log by the process
    that hands batches out (whatever the workers), once per position. The error
    budget: when the replacements in an epoch exceed ``max_fraction`` of its records
    (of this shard; counted over the stream's positions up to the failing one, the
    log's earlier lines included, so a restore counts the same), `ErrorBudgetError`
    names the budget, the count and the log.

    Args:
        policy: ``"raise"``, ``"skip"`` or ``fn(record_index, epoch, error) -> record``.
        max_fraction: the error budget: the most records of an epoch (of this
            shard) that may be replaced, as a fraction of the epoch's records, in [0, 1].
        quarantine: path of the JSON-lines quarantine log (appended to; its folder
            must exist). Required unless the policy is ``"raise"``.

    Raises:
        TypeError: `policy` is neither a mode nor callable, or `max_fraction` is not
            a number.
        ValueError: an unknown mode, `max_fraction` outside [0, 1], no `quarantine`
            for a policy that replaces, or a `quarantine` whose folder does not exist.
    """

    name = "on_error"

    def __init__(
        self,
        policy: str | Callable[[int, int, Exception], Any] = "raise",
        *,
        max_fraction: float = 0.01,
        quarantine: str | os.PathLike[str] | None = None,
    ) -> None:
        if isinstance(policy, str):
            if policy not in MODES:
                msg = (
                    "`policy` must be 'raise', 'skip' or a callable "
                    f"fn(record_index, epoch, error) -> record. Received: policy={policy!r:.80}."
                )
                raise ValueError(msg)
            self.mode, self.fn = policy, None
        elif callable(policy):
            self.mode, self.fn = "callable", policy
        else:
            msg = (
                "`policy` must be 'raise', 'skip' or a callable fn(record_index, epoch, "
                f"error) -> record. Received: policy={policy!r:.80} of type "
                f"{type(policy).__name__}."
            )
            raise TypeError(msg)
        self.max_fraction = validate.number("max_fraction", max_fraction, low=0, high=1)
        self._budget = _exact(max_fraction)
        self.quarantine = None if quarantine is None else _log_path(quarantine)
        if self.replaces and self.quarantine is None:
            msg = (
                f"`quarantine` is required with policy {self.describe_mode()}: every replaced "
                "record is logged there (a JSON-lines file). Received: quarantine=None. "
                "Expected: a path, e.g. quarantine='quarantine.jsonl'."
            )
            raise ValueError(msg)

    @property
    def replaces(self) -> bool:
        """Whether a failing record is replaced (any policy but ``"raise"``)."""
        return self.mode != "raise"

    def describe_mode(self) -> str:
        """The policy in a few words: ``'skip'`` or the callable's name."""
        if self.fn is None:
            return repr(self.mode)
        return getattr(self.fn, "__qualname__", type(self.fn).__name__)

    def describe(self) -> str:
        """One line for ``repr`` and ``describe()``."""
        if not self.replaces:
            return "on_error('raise')"
        return (
            f"on_error({self.describe_mode()}, max_fraction={self.max_fraction}, "
            f"quarantine={self.quarantine!r})"
        )

    def allowed(self, num_records: int) -> int:
        """The most replacements an epoch of `num_records` records allows: the floor of
        `max_fraction` times `num_records`, computed exactly for the decimal or fraction
        written (0.29 of 100 allows 29, although ``0.29 * 100`` is 28.999... in
        floating point)."""
        return min(num_records, math.floor(self._budget * num_records))

    def order_fields(self) -> base.Fields:
        """The fields that define what replaces a failing record; none for ``"raise"``.

        The budget and the log are not among them: they change when the stream
        raises, never what it holds.
        """
        if not self.replaces:
            return {}
        if self.fn is not None:
            return {"policy": "callable"}
        return {"policy": "skip", "algorithm": ALGORITHM, "max_tries": MAX_TRIES}

    @staticmethod
    def candidates(order: base.IndexStage, *, seed: int, epoch: int, index: int) -> np.ndarray:
        """The `MAX_TRIES` record indices that may replace record `index` of `epoch`, in
        order: the records at seeded offsets of the epoch's order (any shard's)."""
        key = (sampler.epoch_hash(seed ^ _TAG, epoch) << 64) | (index & (2**64 - 1))
        # Raw Philox output is stable across NumPy versions (Generator methods are not).
        draws = np.random.Philox(key=key).random_raw(MAX_TRIES)
        offsets = (draws % np.uint64(order.num_records)).astype(np.int64)
        return order.indices(epoch, offsets, seed=seed)

    def replace(
        self,
        error: errors.RecordError,
        read: Callable[[int], Any],
        check: Callable[[Any], Any],
        *,
        order: base.IndexStage,
        seed: int,
    ) -> tuple[Any, dict[str, Any]]:
        """What replaces the record `error` names, and the skip to log.

        Args:
            error: the failure (its ``__cause__`` is what user code raised, if any).
            read: ``read(index)``: record `index` read, transformed and checked, or a
                `RecordError`.
            check: ``check(record)``: a callable policy's record checked, or a
                `RecordSpecError`.
            order: the pipeline's index stage (candidates are records of its epoch).
            seed: the pipeline's seed.

        Raises:
            RecordError: every candidate fails, or the callable raised (chained).
        """
        index, epoch, position = error.record_index, error.epoch, error.position
        cause = error.__cause__ if isinstance(error.__cause__, Exception) else error
        skip: dict[str, Any] = {
            "epoch": epoch,
            "position": position,
            "record_index": index,
            "replacement": None,
            "policy": self.mode,
            "error": type(cause).__name__,
            "message": str(cause),
        }
        where = f"record index {index} (epoch {epoch}, position {position})"
        if self.fn is not None:
            try:
                record = self.fn(index, epoch, cause)
            except Exception as err:
                if err is cause:
                    raise error from cause
                msg = (
                    f"The on_error policy {self.describe_mode()} raised {type(err).__name__} "
                    f"on {where}, which failed with {type(cause).__name__}: {cause}"
                )
                raise errors.RecordError(
                    msg, record_index=index, epoch=epoch, position=position
                ) from err
            try:
                return check(record), skip
            except errors.RecordSpecError as err:
                msg = f"The on_error policy {self.describe_mode()}'s replacement of {err}"
                raise errors.RecordSpecError(
                    msg, record_index=index, epoch=epoch, position=position
                ) from err
        rejected: list[int] = []
        tries = self.candidates(order, seed=seed, epoch=epoch, index=index)
        for candidate in tries.tolist():
            try:
                value = read(candidate)
            except errors.RecordError:
                rejected.append(candidate)
                continue
            skip["replacement"] = candidate
            if rejected:
                skip["rejected"] = rejected
            return value, skip
        msg = (
            f"{error} -- and on_error('skip') found no replacement: the {MAX_TRIES} "
            f"candidate records {rejected} of epoch {epoch} fail too."
        )
        raise type(error)(msg, record_index=index, epoch=epoch, position=position) from cause


def _exact(value: Any) -> fractions.Fraction:
    """The upper end of the values a `max_fraction` may stand for, as an exact fraction.

    A float stands for every number that rounds to it (``0.29`` for 0.28999999999999998):
    the upper end of its rounding interval lets the floor of a product reach the
    integer the written decimal gives. Integers, fractions and decimals are exact.
    """
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return fractions.Fraction(value) + fractions.Fraction(math.ulp(value)) / 2
    try:
        return fractions.Fraction(value)  # int, Fraction, Decimal
    except TypeError:  # another Real: as the float it converts to
        return _exact(float(value))


def _log_path(value: Any) -> str:
    if not isinstance(value, (str, os.PathLike)):
        msg = (
            "`quarantine` must be a path (str or os.PathLike). "
            f"Received: quarantine={value!r:.80} of type {type(value).__name__}."
        )
        raise TypeError(msg)
    path = os.path.abspath(os.fspath(value))
    if not os.path.isdir(os.path.dirname(path)):
        msg = (
            "`quarantine`'s folder must exist (the log is created in it). "
            f"Received: quarantine={os.fspath(value)!r} (folder {os.path.dirname(path)!r})."
        )
        raise ValueError(msg)
    return path
