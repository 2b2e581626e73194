"""User code shared by the benchmark pipelines: picklable and free of TensorFlow.

Worker processes (resumeloader's and grain's) import this module to unpickle these
functions, so it must stay light: NumPy only.
"""

from __future__ import annotations

import numpy as np

# Iterations of pure-Python arithmetic in `burn_python`; ~50 us on this machine
# (the suite measures and prints the real figure).
BURN_ITERATIONS = 700


def _burn() -> int:
    total = 0
    for i in range(BURN_ITERATIONS):
        total += i * i % 7
    return total


def burn_python(record: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """GIL-bound work: pure-Python arithmetic, then a tiny NumPy op."""
    return record + np.float32(_burn() % 3)


def numpy_work(record: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """GIL-releasing work: matrix products and a ufunc on a 64x64 float32 record."""
    product = np.tanh(record @ record.T)
    return (product @ record @ product.T).astype(np.float32)


class RangeSource:
    """`num_records` virtual records; record i is the int64 i. Has `read_batch`."""

    def __init__(self, num_records: int) -> None:
        self.num_records = num_records

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, index: int) -> np.ndarray:
        return np.int64(index)

    def read_batch(self, indices: np.ndarray) -> np.ndarray:
        return np.asarray(indices, dtype=np.int64)


class ArraySource:
    """A NumPy array behind ``__len__``/``__getitem__`` (what grain's DataLoader reads)."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.array[index]


def burn_for(count: int) -> float:
    """Runs `burn_python` `count` times; returns the wall time it took."""
    import time

    record = np.zeros(16, np.float32)
    start = time.perf_counter()
    for _ in range(count):
        burn_python(record)
    return time.perf_counter() - start
