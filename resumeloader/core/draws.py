"""NumPy's conversions of raw Philox output into values, for whole arrays at once.

Each `Draw` says what `numpy.random.Generator` does for one element of a call: how
many bits it takes (a 64-bit word, or a 32-bit half-word, which NumPy's bit generator
buffers: the low half of a word first, the high half kept for the next 32-bit draw),
how it turns them into a value (`convert`), which raw values its first attempt
refuses (a bounded integer's rejection zone, a normal outside the ziggurat's fast
region: those elements are finished by a real generator, `finish`), and the same
element count drawn by a real generator (`finish(generator, count)`). Elements are
drawn in C order, one after the other, as NumPy fills an array.

The conversions, as NumPy 1.17+ makes them: doubles ``(word >> 11) * 2**-53``;
float32 ``(half >> 8) * 2**-24``; ``uniform`` ``low + (high - low) * double``;
``normal`` ``loc + scale * z`` with ``z`` from the ziggurat (`resumeloader.core.ziggurat`);
``integers`` by Lemire's multiply-and-reject on half-words for a range below 2**32,
on words above, the raw value when the range is all of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from resumeloader.core import philox, ziggurat

__all__ = ["Draw", "doubles", "floats", "integers", "normals", "uniforms"]

_DOUBLE = 2.0**-53
_FLOAT = np.float32(2.0**-24)
_LOW = np.uint64(0xFFFFFFFF)
_M32, _M64 = (1 << 32) - 1, (1 << 64) - 1
#: The dtypes whose bounded integers come from NumPy's 32- and 64-bit Lemire fills.
INTEGER_DTYPES = tuple(np.dtype(t) for t in ("int64", "int32", "uint64", "uint32"))


@dataclasses.dataclass(frozen=True)
class Draw:
    """One element kind of a `numpy.random.Generator` call (see the module docstring).

    Attributes:
        bits: what each element's first attempt takes: 64 (a word), 32 (a half-word)
            or 0 (nothing: NumPy draws no bits, e.g. an integer range of one value).
        convert: raw values ``[rows, count]`` (uint64) -> ``(values, refused or None)``.
        finish: ``finish(generator, count)``, the next `count` elements drawn by NumPy.
    """

    bits: int
    convert: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray | None]]
    finish: Callable[[np.random.Generator, int], np.ndarray]


def _doubles(words: np.ndarray) -> np.ndarray:
    return (words >> np.uint64(11)) * _DOUBLE


def doubles() -> Draw:
    """``Generator.random(count)``: float64 in [0, 1)."""
    return Draw(64, lambda words: (_doubles(words), None), lambda g, k: g.random(k))


def floats() -> Draw:
    """``Generator.random(count, dtype=np.float32)``."""
    def convert(halves: np.ndarray) -> tuple[np.ndarray, None]:
        return (halves >> np.uint64(8)).astype(np.float32) * _FLOAT, None

    return Draw(32, convert, lambda g, k: g.random(k, dtype=np.float32))


def uniforms(low: float, high: float) -> Draw:
    """``Generator.uniform(low, high, count)`` of scalar (checked) bounds."""
    width = high - low

    def convert(words: np.ndarray) -> tuple[np.ndarray, None]:
        values = _doubles(words)
        values *= width
        values += low
        return values, None

    return Draw(64, convert, lambda g, k: g.uniform(low, high, k))


def normals(loc: float, scale: float) -> Draw | None:
    """``Generator.normal(loc, scale, count)`` of scalar (checked) parameters, or None
    when NumPy's ziggurat could not be read (`ziggurat.tables`)."""
    found = ziggurat.tables()
    if found is None:
        return None

    def convert(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        values, refused = ziggurat.normals(words, found)
        values *= scale
        values += loc
        return values, refused

    return Draw(64, convert, lambda g, k: g.normal(loc, scale, k))


def integers(low: int, high: int, dtype: np.dtype[Any], *, endpoint: bool) -> Draw | None:
    """``Generator.integers(low, high, count, dtype, endpoint)`` of scalar (checked)
    bounds, or None for a dtype outside `INTEGER_DTYPES`."""
    if dtype not in INTEGER_DTYPES:
        return None
    top = high if endpoint else high - 1
    span = top - low  # NumPy's `rng`: values are low + [0, span]
    offset = np.uint64(low & _M64)

    def finish(generator: np.random.Generator, count: int) -> np.ndarray:
        return generator.integers(low, high, count, dtype=dtype, endpoint=endpoint)

    def typed(values: np.ndarray) -> np.ndarray:
        values += offset  # modulo 2**64, as NumPy adds its offset
        if dtype.itemsize == 4:
            return (values & _LOW).astype(np.uint32).view(dtype)
        return values.view(dtype)

    if span == 0:
        return Draw(0, lambda raw: (typed(raw), None), finish)
    half_words = span <= _M32
    bits = 32 if half_words else 64
    if span in (_M32, _M64):  # the whole range: the raw value itself
        return Draw(bits, lambda raw: (typed(raw.copy()), None), finish)
    excl = span + 1
    threshold = np.uint64((_M32 - span) % excl if half_words else (_M64 - span) % excl)
    scale = np.uint64(excl)

    def convert(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        product = raw * scale  # the low 64 bits: all of it for half-words
        if half_words:
            refused = (product & _LOW) < threshold
            product >>= np.uint64(32)
            return typed(product), refused
        refused = product < threshold
        return typed(philox.multiply_high(raw, scale)), refused

    return Draw(bits, convert, finish)
