"""The Keras backend tier (tests/backends/) under JAX and PyTorch, each in a pytest
process of its own (Keras fixes its backend when it is imported; the suite's own
processes run the tier on TensorFlow).

JAX (CPU) is in the ``test`` extra. PyTorch is not: the package index's ``torch``
brings several GB of CUDA libraries, so it has its own extra
(``pip install -e ".[torch]"``) and its run is skipped, saying so, when torch is
not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_keras_backend_tier_passes_under(backend):
    """Every test of tests/backends/ passes with ``KERAS_BACKEND=<backend>``."""
    if importlib.util.find_spec(backend) is None:
        extra = "torch" if backend == "torch" else "test"
        pytest.skip(f"{backend} is not installed (pip install -e '.[{extra}]')")
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
    command = [sys.executable, "-m", "pytest", "tests/backends", "-n", "0", "-q",
               "-p", "no:cacheprovider", "-W", "ignore::DeprecationWarning"]

    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=2300, check=False)

    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-8000:]
    assert " passed" in output.splitlines()[-1] and "skipped" not in output.splitlines()[-1], (
        output[-3000:]
    )
