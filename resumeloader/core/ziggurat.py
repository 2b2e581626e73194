"""NumPy's normal draws from raw 64-bit words, its ziggurat tables read from NumPy itself.

`numpy.random.Generator.standard_normal` turns one 64-bit word into a normal with
its 256-layer ziggurat: the low 8 bits pick the layer ``i``, bit 8 the sign and the
next 52 bits an integer ``rabs``; ``x = rabs * w[i]`` is returned at once when
``rabs < k[i]`` (about 99% of words) and otherwise goes on to a rejection test that
draws more words. `normals` does the first step for whole arrays and marks the words
it cannot finish, which the caller finishes with a real generator.

The tables ``w`` and ``k`` are not copied from NumPy's sources: `tables` reads them
from the installed NumPy, once per process (a few milliseconds), by handing its
Philox chosen words: ``w[i]`` is the normal of ``rabs = 1``, and ``k[i]`` is bracketed
by the ratio of neighbouring layers and confirmed by a draw at the bound. A check
against a real generator follows; if NumPy ever draws normals another way, `tables`
returns None and every normal is drawn by NumPy row by row.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["normals", "tables"]

_LAYERS = 256
_RABS_BITS = 52
# Word layout: layer in bits 0-7, sign in bit 8, rabs in bits 9-60.
_SIGN_SHIFT, _RABS_SHIFT = 8, 9
_RABS_MASK = np.uint64((1 << _RABS_BITS) - 1)
# A word NumPy turns into +0.0 on its fast path: layer 2, rabs 0.
_ZERO_WORD = 2
# A word whose normal is far from 0 (layer 3, rabs 2**51).
_FAR_WORD = 3 | (1 << (_RABS_BITS - 1)) << _RABS_SHIFT


class _Probe:
    """A real generator fed chosen words: `draw(word)` is (the normal NumPy makes of
    `word`, whether its fast path took it)."""

    def __init__(self) -> None:
        self.bit_generator = np.random.Philox(0)
        self.generator = np.random.Generator(self.bit_generator)
        self.state = self.bit_generator.state

    def draw(self, word: int) -> tuple[float, bool]:
        # The word after the probe is a zero: if the fast path took the probe, the
        # second normal is that +0.0; if not, the rejection test consumed it.
        state: dict[str, Any] = dict(self.state)
        state["buffer"] = np.array([word, _ZERO_WORD, _FAR_WORD, _FAR_WORD], np.uint64)
        state["buffer_pos"] = 0
        self.bit_generator.state = state  # type: ignore[assignment]
        first, second = self.generator.standard_normal(2).tolist()
        return first, second == 0.0 and not np.signbit(second)


def _word(layer: int, rabs: int) -> int:
    return layer | rabs << _RABS_SHIFT


def _bound(probe: _Probe, layer: int, low: int, high: int) -> int:
    """The least `rabs` in (low, high] that the fast path of `layer` refuses, knowing it
    takes `low` (-1: nothing known) and refuses `high` (2**52: nothing known)."""
    while high - low > 1:
        middle = (low + high) // 2
        if probe.draw(_word(layer, middle))[1]:
            low = middle
        else:
            high = middle
    return high


@functools.lru_cache(maxsize=1)
def tables() -> tuple[np.ndarray, np.ndarray] | None:
    """NumPy's ziggurat tables ``(w, k)`` (float64 and uint64, 256 layers each), read from
    NumPy, or None when NumPy's normals do not follow the layout above."""
    probe = _Probe()
    scale = np.array([probe.draw(_word(layer, 1))[0] for layer in range(_LAYERS)])
    bounds = np.zeros(_LAYERS, np.uint64)
    for layer in range(_LAYERS):
        # Layer i's fast region ends where layer i - 1 ends: rabs * w[i] < x[i - 1], so
        # k[i] is within a unit of 2**52 w[i-1] / w[i]; both ends of the guess are checked.
        low = -1 if layer < 2 else int(scale[layer - 1] / scale[layer] * 2.0**_RABS_BITS) - 2
        high = low + 4
        if low < 0 or not probe.draw(_word(layer, low))[1] or probe.draw(_word(layer, high))[1]:
            low, high = -1, 1 << _RABS_BITS
        bound = _bound(probe, layer, low, high)
        bounds[layer] = bound
    found = (scale, bounds)
    return found if _agrees(found) else None


def normals(
    words: np.ndarray, found: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """``(x, refused)``: NumPy's standard normal of each word where its fast path takes
    the word, and where it does not (``x`` is then meaningless)."""
    scale, bounds = found
    layer = (words & np.uint64(_LAYERS - 1)).astype(np.intp)
    rabs = (words >> np.uint64(_RABS_SHIFT)) & _RABS_MASK
    x = rabs * scale[layer]  # rabs < 2**52 converts exactly, as in C
    negative = (words >> np.uint64(_SIGN_SHIFT)) & np.uint64(1)
    np.negative(x, out=x, where=negative.astype(bool))
    return x, rabs >= bounds[layer]


def _agrees(found: tuple[np.ndarray, np.ndarray]) -> bool:
    """Whether `normals` gives a real generator's normals, up to its first refused word."""
    bit_generator = np.random.Philox(20240601)
    words = np.random.Philox(20240601).random_raw(4096)
    want = np.random.Generator(bit_generator).standard_normal(4096)
    x, refused = normals(words, found)
    first = int(np.argmax(refused)) if refused.any() else len(words)
    return first >= 64 and bool(np.array_equal(x[:first], want[:first]))
