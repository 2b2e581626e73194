"""Turns record indices into one batch: read, map, check against the spec, stack.

NumPy and optree only, no TensorFlow, so that worker processes stay light. Every
failure of user code is translated into a `RecordError` naming the record index,
the epoch and the position, with the original exception chained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import optree

from resumeloader import _sampler, _source, errors

__all__ = ["BatchProducer", "LeafSpec", "RecordSpec", "record_rng"]

_RNG_TAG = 0xA06_3E17_A71_0F_5EED


def record_rng(seed: int, epoch: int, record_index: int) -> np.random.Generator:
    """The generator handed to ``map_fn`` for one record: a pure function of its arguments.

    A Philox stream keyed by (seed, epoch, record index): independent of the order
    records are produced in, of threads, workers and restores.
    """
    key = (_sampler.epoch_hash(seed ^ _RNG_TAG, epoch) << 64) | record_index
    return np.random.Generator(np.random.Philox(key=key))


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """Shape (without the batch dimension; None where it may vary) and dtype of a leaf."""

    shape: tuple[int | None, ...]
    dtype: np.dtype

    def accepts(self, array: np.ndarray) -> bool:
        if array.dtype != self.dtype or array.ndim != len(self.shape):
            return False
        pairs = zip(self.shape, array.shape, strict=True)
        return all(want is None or want == got for want, got in pairs)


@dataclasses.dataclass(frozen=True)
class RecordSpec:
    """The structure of one record and the spec of each of its leaves."""

    treespec: Any
    leaves: tuple[LeafSpec, ...]

    @classmethod
    def of(cls, record: Any) -> RecordSpec:
        leaves, treespec = _flatten(record)
        return cls(treespec, tuple(LeafSpec(a.shape, a.dtype) for a in leaves))

    def describe(self) -> str:
        parts = [f"{s.dtype.name}{list(s.shape)}" for s in self.leaves]
        return str(optree.tree_unflatten(self.treespec, parts)).replace("'", "")


def _flatten(record: Any) -> tuple[list[np.ndarray], Any]:
    leaves, treespec = optree.tree_flatten(record, none_is_leaf=True)
    arrays = [np.asarray(leaf) for leaf in leaves]
    for leaf, array in zip(leaves, arrays, strict=True):
        if array.dtype == object:
            msg = (
                "Record leaves must be arrays, numbers, strings or bytes. "
                f"Received a leaf of type {type(leaf).__name__}: {leaf!r:.80}."
            )
            raise TypeError(msg)
    return arrays, treespec


class BatchProducer:
    """Produces the batch of given record indices, with errors that name the record."""

    def __init__(
        self,
        adapter: _source.Adapter,
        *,
        map_fn: Callable[[Any, np.random.Generator], Any] | None,
        seed: int,
        spec: RecordSpec | None = None,
    ) -> None:
        self.adapter = adapter
        self.map_fn = map_fn
        self.seed = seed
        self.spec = spec if spec is not None else RecordSpec.of(self.record(0, epoch=0, position=0))

    def record(self, index: int, *, epoch: int, position: int) -> Any:
        """Reads record `index` and applies ``map_fn``; user errors become `RecordError`."""
        where = f"record index {index} (epoch {epoch}, position {position})"
        try:
            record = self.adapter.read(index)
        except Exception as err:
            msg = f"The source raised {type(err).__name__} on {where}: {err}"
            raise errors.RecordError(
                msg, record_index=index, epoch=epoch, position=position
            ) from err
        if self.map_fn is None:
            return record
        try:
            return self.map_fn(record, record_rng(self.seed, epoch, index))
        except Exception as err:
            msg = f"`map_fn` raised {type(err).__name__} on {where}: {err}"
            raise errors.RecordError(
                msg, record_index=index, epoch=epoch, position=position
            ) from err

    def batch(self, indices: np.ndarray, *, epoch: int, position: int) -> Any:
        """The stacked batch of `indices`, whose first record sits at `position`."""
        if self.map_fn is None and self.adapter.read_batch is not None:
            return self._read_batch(indices, epoch=epoch, position=position)
        columns: list[list[np.ndarray]] = [[] for _ in self.spec.leaves]
        for offset, index in enumerate(indices.tolist()):
            record = self.record(index, epoch=epoch, position=position + offset)
            leaves = self._check(record, index=index, epoch=epoch, position=position + offset)
            for column, leaf in zip(columns, leaves, strict=True):
                column.append(leaf)
        return optree.tree_unflatten(self.spec.treespec, [np.stack(c) for c in columns])

    def _check(self, record: Any, *, index: int, epoch: int, position: int) -> list[np.ndarray]:
        try:
            leaves, treespec = _flatten(record)
            problem = None
            if treespec != self.spec.treespec:
                problem = "its structure differs"
            else:
                for leaf, spec in zip(leaves, self.spec.leaves, strict=True):
                    if not spec.accepts(leaf):
                        problem = f"a leaf is {leaf.dtype.name}{list(leaf.shape)}"
                        break
        except TypeError as err:
            problem = str(err)
        if problem is None:
            return leaves
        got = optree.tree_map(
            lambda leaf: f"{np.asarray(leaf).dtype.name}{list(np.shape(leaf))}",
            record,
            none_is_leaf=True,
        )
        msg = (
            f"Record index {index} (epoch {epoch}, position {position}) does not match the "
            f"element spec: {problem}. Expected: {self.spec.describe()}. "
            f"Received: {str(got).replace(chr(39), '')}."
        )
        raise errors.RecordSpecError(msg, record_index=index, epoch=epoch, position=position)

    def _read_batch(self, indices: np.ndarray, *, epoch: int, position: int) -> Any:
        assert self.adapter.read_batch is not None
        first = int(indices[0])
        try:
            batch = self.adapter.read_batch(indices)
            leaves, treespec = optree.tree_flatten(batch, none_is_leaf=True)
            leaves = [np.asarray(leaf) for leaf in leaves]
        except Exception as err:
            msg = (
                f"The source's read_batch raised {type(err).__name__} on the batch starting at "
                f"record index {first} (epoch {epoch}, position {position}): {err}"
            )
            raise errors.RecordError(
                msg, record_index=first, epoch=epoch, position=position
            ) from err
        ok = treespec == self.spec.treespec and all(
            leaf.shape[:1] == (len(indices),) and spec.accepts(leaf[0])
            for leaf, spec in zip(leaves, self.spec.leaves, strict=False)
        )
        if not ok:
            got = [f"{a.dtype.name}{list(a.shape)}" for a in leaves]
            msg = (
                f"read_batch returned a batch that does not match the element spec for the "
                f"{len(indices)} records starting at record index {first} (epoch {epoch}, "
                f"position {position}). Expected per record: {self.spec.describe()}. "
                f"Received leaves: {got}."
            )
            raise errors.RecordSpecError(msg, record_index=first, epoch=epoch, position=position)
        return optree.tree_unflatten(self.spec.treespec, leaves)
