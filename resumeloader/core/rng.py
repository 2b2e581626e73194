"""Randomness keyed by a record, never by history: `record_rng`, `RecordRngs`, per-record TF seeds.

Every random choice made for a record comes from a generator keyed by (seed, epoch,
record index), so it is the same whatever order records are produced in, whatever
threads, workers or restores happened before.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, overload

import numpy as np

from resumeloader.core import draws, philox, sampler, streams

__all__ = ["BATCH_STREAM", "RecordRngs", "give_back", "lend", "metadata", "record_rng"]

_RNG_TAG = 0xA06_3E17_A71_0F_5EED
_METADATA_SEED_TAG = 0x7F5EED
_M64 = (1 << 64) - 1
#: XORed into the seed for the generators of a batch-level stage (`RecordRngs`): a
#: record's stream there is independent of the `rng` a ``map_fn`` gets for it.
BATCH_STREAM = 0x5EED_BA7C_0000_0001
# Checks arguments as NumPy does, by drawing one value NumPy's way (its errors, its words).
_CHECKS = np.random.Generator(np.random.Philox(0))


@functools.lru_cache(maxsize=64)
def _epoch_word(seed: int, epoch: int) -> int:
    return sampler.epoch_hash(seed ^ _RNG_TAG, epoch)


def record_rng(seed: int, epoch: int, record_index: int) -> np.random.Generator:
    """The generator handed to ``map_fn`` for one record: a pure function of its arguments.

    A Philox stream keyed by (seed, epoch, record index): independent of the order
    records are produced in, of threads, workers and restores. Its key is
    ``epoch_hash(seed ^ tag, epoch) << 64 | record_index``, the counter starts at 0.

    Examples:
        >>> a = record_rng(7, 0, 12).integers(1000, size=3)
        >>> b = record_rng(7, 0, 12).integers(1000, size=3)
        >>> bool((a == b).all())
        True
    """
    if not 0 <= record_index <= _M64:
        msg = f"`record_index` must be in [0, 2**64). Received: record_index={record_index!r}."
        raise ValueError(msg)
    return philox.generator(int(record_index), _epoch_word(seed, epoch))


# Per thread: (generator, its Philox, its Key) that `give_back` kept for the next `lend`.
_RETURNED = threading.local()
_ZEROS = (0, 0, 0, 0)


def lend(seed: int, epoch: int, record_index: int) -> np.random.Generator:
    """`record_rng(seed, epoch, record_index)` for one call of user code, then `give_back`.

    The generator is the same stream as `record_rng`'s, and a real
    `numpy.random.Generator` the user code may keep; it may be an object given back by
    an earlier call in this thread, restarted on the new key (a third of the cost of
    making one: the per-record ``map_fn`` path needs one per record).
    """
    kept = getattr(_RETURNED, "kept", None)
    if kept is None or not 0 <= record_index <= _M64:
        return record_rng(seed, epoch, record_index)
    _RETURNED.kept = None
    generator, bit_generator, key = kept
    words = (int(record_index), _epoch_word(seed, epoch))
    # At the start of the stream of the new key: what `philox.move(..., 0)` sets, inline.
    bit_generator.state = {
        "bit_generator": "Philox", "state": {"counter": _ZEROS, "key": words},
        "buffer": _ZEROS, "buffer_pos": philox.WORDS, "has_uint32": 0, "uinteger": 0,
    }
    key.words = words
    return generator


def give_back(generator: np.random.Generator) -> None:
    """Keeps `generator` (from `lend`) for this thread's next `lend`, unless something
    besides the caller's one variable still holds it or its bit generator: a generator
    the user code kept is never reused."""
    if sys.getrefcount(generator) == _UNSHARED[0]:
        bit_generator = generator.bit_generator
        if sys.getrefcount(bit_generator) == _UNSHARED[1]:
            _RETURNED.kept = (generator, bit_generator, bit_generator.seed_seq)


def _counts(generator: np.random.Generator) -> tuple[int, int]:
    # The references `give_back` sees when its caller holds one variable.
    count = sys.getrefcount(generator)
    bit_generator = generator.bit_generator
    return count, sys.getrefcount(bit_generator)


def _unshared() -> tuple[int, int]:
    generator = philox.generator(0, 0)
    return _counts(generator)


_UNSHARED = _unshared()


def metadata(seed: int, indices: np.ndarray, epoch: int, position: int) -> dict[str, np.ndarray]:
    """Per-record ``index``, ``epoch``, ``position`` and stateless TF ``seed`` pair of a batch.

    Args:
        seed: the pipeline's seed.
        indices: the batch's record indices (int64).
        epoch: the epoch of the batch.
        position: the position of the batch's first record.
    """
    count = len(indices)
    seeds = np.empty((count, 2), dtype=np.int64)
    seeds[:, 0] = np.int64(sampler.epoch_hash(seed ^ _METADATA_SEED_TAG, epoch) >> 1)
    seeds[:, 1] = indices
    return {
        "index": indices,
        "epoch": np.full(count, epoch, dtype=np.int64),
        "position": np.arange(position, position + count, dtype=np.int64),
        "seed": seeds,
    }


class RecordRngs(Sequence[np.random.Generator]):
    """One `numpy.random.Generator` stream per row of a batch, each keyed by (seed,
    epoch, the row's record index): what ``Pipeline.map_batch`` hands its function.

    Row ``i``'s stream is that of ``record_rng(seed ^ BATCH_STREAM, epoch, indices[i])``:
    a pure function of the record, so it is the same in any batch, any batch size,
    any worker and after any restore, and independent of the ``rng`` a ``map_fn``
    gets for the same record.

    ``random``, ``uniform``, ``normal`` and ``integers`` take NumPy's arguments (the
    shape as ``shape`` or NumPy's ``size``) and return ``[rows, *shape]``: row ``i`` is
    bit for bit what ``self[i].<method>(..., shape)`` returns at that point of row
    ``i``'s stream, and the streams advance exactly as NumPy's would, call after call
    (including NumPy's buffered 32-bit half-words and its rejection draws). They are
    computed for all rows at once with array operations (Philox is counter based:
    each row is a key; `resumeloader.core.philox`), for scalar parameters and
    ``random`` in float64/float32, ``integers`` in int64/int32/uint64/uint32; other
    arguments, and draws of more than `streams.LARGE` values per row, are made by
    NumPy row by row, with the same result.

    ``self[i]`` is row ``i``'s stream as a real `numpy.random.Generator`, made when
    first asked for, at the place the helpers left it; from then on that row's draws
    (through the helpers too) come from that generator.

    Args:
        seed: the pipeline's seed.
        epoch: the batch's epoch.
        indices: the record index of each row (int64, non-negative).
    """

    __slots__ = ("_streams", "epoch", "indices", "seed")

    def __init__(self, seed: int, epoch: int, indices: np.ndarray) -> None:
        self.seed, self.epoch = seed, epoch
        self.indices = np.asarray(indices, dtype=np.int64)
        if len(self.indices) and int(self.indices.min()) < 0:
            msg = (
                "Record indices must be in [0, 2**64). Received: indices containing "
                f"{int(self.indices.min())}."
            )
            raise ValueError(msg)
        high = _epoch_word(seed ^ BATCH_STREAM, epoch)
        self._streams = streams.RowStreams(self.indices.view(np.uint64), high)

    def __len__(self) -> int:
        return len(self.indices)

    @overload
    def __getitem__(self, row: int) -> np.random.Generator: ...

    @overload
    def __getitem__(self, row: slice) -> list[np.random.Generator]: ...

    def __getitem__(self, row: int | slice) -> Any:
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(len(self)))]
        return self._streams.generator(range(len(self))[row])

    def __iter__(self) -> Iterator[np.random.Generator]:
        return (self[i] for i in range(len(self)))

    def random(self, shape: Any = (), dtype: Any = np.float64, *, size: Any = None) -> np.ndarray:
        """Floats in [0, 1), ``[rows, *shape]``: row ``i`` is ``self[i].random(shape, dtype)``."""
        shape, kind = _shape(shape, size), np.dtype(dtype)
        draw = _checked("random", kind)
        return self._drawn(draw, shape, kind, lambda g: g.random(shape, dtype))

    def uniform(self, low: Any = 0.0, high: Any = 1.0, shape: Any = (), *,
                size: Any = None) -> np.ndarray:
        """``self[i].uniform(low, high, shape)`` for each row ``i``, stacked."""
        shape = _shape(shape, size)
        draw = _checked("uniform", low, high)
        return self._drawn(draw, shape, _FLOAT64,
                           lambda g: g.uniform(low, high, shape))

    def normal(self, loc: Any = 0.0, scale: Any = 1.0, shape: Any = (), *,
               size: Any = None) -> np.ndarray:
        """``self[i].normal(loc, scale, shape)`` for each row ``i``, stacked."""
        shape = _shape(shape, size)
        draw = _checked("normal", loc, scale)
        return self._drawn(draw, shape, _FLOAT64,
                           lambda g: g.normal(loc, scale, shape))

    def integers(self, low: Any, high: Any = None, shape: Any = (), dtype: Any = np.int64,
                 endpoint: bool = False, *, size: Any = None) -> np.ndarray:
        """``self[i].integers(low, high, shape, dtype, endpoint)`` for each row ``i``, stacked."""
        shape, kind = _shape(shape, size), np.dtype(dtype)
        draw = _checked("integers", low, high, kind, bool(endpoint))
        return self._drawn(draw, shape, kind,
                           lambda g: g.integers(low, high, shape, dtype, endpoint))

    def _drawn(self, draw: draws.Draw | None, shape: tuple[int, ...], dtype: np.dtype[Any],
               call: Callable[[np.random.Generator], Any]) -> np.ndarray:
        """`draw`'s values for every row, ``[rows, *shape]``, or each row's ``call`` stacked."""
        rows = len(self)
        if draw is None:
            out = np.empty((rows, *shape), dtype)
            for i, value in enumerate(self._streams.each(call)):
                out[i] = value
            return out
        count = math.prod(shape)
        if not rows or not count:
            return np.empty((rows, *shape), dtype)
        return self._streams.draw(draw, count).reshape(rows, *shape)

    def __repr__(self) -> str:
        return f"RecordRngs(seed={self.seed}, epoch={self.epoch}, rows={len(self)})"


_FLOAT64 = np.dtype(np.float64)
# (method, its scalar arguments and their types) -> its checked `draws.Draw` or None.
_DRAWS: dict[tuple[Any, ...], draws.Draw | None] = {}
_DRAWS_KEPT = 256
_SCALARS = (int, float, bool, np.integer, np.floating, np.bool_)
_FLOATS = (float, np.floating)


def _checked(method: str, *args: Any) -> draws.Draw | None:
    """The `draws.Draw` of ``RecordRngs.<method>(*args)`` (None: NumPy draws it row by
    row), its arguments checked once as NumPy checks them (NumPy's error raised). Kept
    per arguments of scalar types (with their types: ``1`` and ``1.0`` are not one),
    at most `_DRAWS_KEPT` of them, but a float zero's."""
    # Arguments met before: the key of a kept draw (one stored never holds a float
    # zero, so no -0.0 finds a 0.0's; an unhashable argument is not kept).
    try:
        key = (method, *args, *map(type, args))
        draw = _DRAWS.get(key, _MISSING)
    except TypeError:
        draw = _MISSING
    if draw is not _MISSING:
        return draw  # type: ignore[return-value]
    # A float zero is left out: 0.0 and -0.0 are one key but may give other sign bits.
    if all((isinstance(arg, _SCALARS) and not (isinstance(arg, _FLOATS) and arg == 0))
           or arg is None or isinstance(arg, np.dtype) for arg in args):
        draw = _made(method, *args)
        if len(_DRAWS) >= _DRAWS_KEPT:
            _DRAWS.clear()
        _DRAWS[key] = draw
        return draw
    return _made(method, *args)


_MISSING = object()


def _made(method: str, *args: Any) -> draws.Draw | None:
    """`_checked`'s draw, made and checked."""
    if method == "random":
        (kind,) = args
        draw = {_FLOAT64: draws.doubles, np.dtype(np.float32): draws.floats}.get(kind)
        if draw is None:
            _CHECKS.random(dtype=kind)  # NumPy's error for another dtype
        return draw() if draw else None
    if method == "integers":
        low, high, kind, endpoint = args
        if np.ndim(low) or np.ndim(high):
            return None
        _CHECKS.integers(low, high, dtype=kind, endpoint=endpoint)
        bounds = (0, low) if high is None else (low, high)
        first, last = (int(np.asarray(bound)) for bound in bounds)
        return draws.integers(first, last, kind, endpoint=endpoint)
    first, second = args
    if np.ndim(first) or np.ndim(second):
        return None
    if method == "uniform":
        _CHECKS.uniform(first, second)
        return draws.uniforms(float(first), float(second))
    _CHECKS.normal(first, second)
    return draws.normals(float(first), float(second))


def _shape(shape: Any, size: Any) -> tuple[int, ...]:
    """The per-row shape from `shape` or NumPy's spelling `size` (an int or a sequence)."""
    if size is None and type(shape) is tuple and not shape:
        return ()
    if size is not None:
        if shape not in ((), None):
            msg = (
                "Give the shape of a row's draw once, as `shape` or as NumPy's `size`. "
                f"Received: shape={shape!r}, size={size!r}."
            )
            raise TypeError(msg)
        shape = size
    if shape is None:
        return ()
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not all(isinstance(d, (int, np.integer)) and d >= 0 for d in dims):
        msg = (
            "A draw's shape must be non-negative integers. "
            f"Received: shape={shape!r}; expected e.g. 3 or (2, 3)."
        )
        raise ValueError(msg)
    return tuple(int(d) for d in dims)
