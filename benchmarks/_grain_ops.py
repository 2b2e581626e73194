"""grain transforms for the benchmark: the same work as `_common`, as grain MapTransforms."""

from __future__ import annotations

import _common
import grain.python as grain
import numpy as np


class BurnPython(grain.MapTransform):
    def map(self, element: np.ndarray) -> np.ndarray:
        return _common.burn_python(element)


class NumpyWork(grain.MapTransform):
    def map(self, element: np.ndarray) -> np.ndarray:
        return _common.numpy_work(element)
