"""The unit tier: the layers below TensorFlow (core, sources, stages, workers, handout),
tested without it. Nothing here, and no test of this tier, imports TensorFlow or Keras:
when only this tier runs (``python -m pytest tests/unit``), a test after which either
is loaded fails, naming itself."""

from __future__ import annotations

import pathlib
import sys

import pytest

_HERE = pathlib.Path(__file__).parent
_FORBIDDEN = ("tensorflow", "keras")
_only_this_tier = False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Notes whether the session runs this tier alone (else TensorFlow is expected)."""
    global _only_this_tier
    _only_this_tier = bool(items) and all(_HERE in item.path.parents for item in items)


@pytest.fixture(autouse=True)
def _no_tensorflow():
    """Fails the test that loaded TensorFlow or Keras, when this tier runs alone."""
    yield
    loaded = [name for name in _FORBIDDEN if name in sys.modules]
    if _only_this_tier and loaded:
        pytest.fail(f"the unit tier must not import TensorFlow, but {loaded} got imported")
