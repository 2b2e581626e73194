"""A mark for the test modules that call `from_pipeline` with the keywords of 0.2 on purpose
(they must keep working): their DeprecationWarning is expected there, and checked by
tests/tf/test_loader_options.py."""

from __future__ import annotations

import pytest

KEYWORDS_OF_0_2 = pytest.mark.filterwarnings(
    "ignore:ResumableLoader.from_pipeline:DeprecationWarning"
)
