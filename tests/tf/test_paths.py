"""Delivery paths are units: a new one is one class and one entry in `PATHS`, chosen in
one place, and it resumes like every other path."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from resumeloader import ResumableLoader, testing
from resumeloader.handout import engine as engine_lib
from resumeloader.tfdata import delivery, paths

_DATA = np.arange(21 * 2, dtype=np.int64).reshape(21, 2)


class SlicesPath(delivery.DeliveryPath):
    """A path written as a new module would write it: each produced batch handed over
    by ``from_generator``, for int64 columns only."""

    name = "slices"

    @classmethod
    def accepts(cls, engine: engine_lib.Engine) -> bool:
        columns = engine.plan.pipeline.source.columns()
        return columns is not None and all(leaf.dtype == np.int64 for leaf in columns[0])

    def handover(self, begin, watch: Any):
        def make():
            position, layout = begin()
            return delivery.without_ends(self.engine.batches(position, layout=layout, watch=watch))

        return self.generated(make, self.batch_dim)

    def source_row(self) -> delivery.Row:
        return ("source", "int64 columns, sliced", "int64[2]", "re-read")

    def handover_rows(self) -> list[delivery.Row]:
        return [("from_generator", "slices path: each batch", self.batch_text(), "recomputed")]


@pytest.fixture
def slices(monkeypatch):
    """The new path, registered first (its one entry in PATHS)."""
    monkeypatch.setattr(paths, "PATHS", (SlicesPath, *paths.PATHS))


def _loader() -> ResumableLoader:
    return ResumableLoader(_DATA, batch_size=4, seed=2, num_epochs=2)


def _stream(loader: ResumableLoader) -> list[list[list[int]]]:
    return [batch.numpy().tolist() for batch in loader.dataset()]


def test_new_path_registered_is_chosen_and_named(slices):
    """A path placed first in PATHS is the one a loader it accepts takes."""
    loader = _loader()
    assert "slices path: each batch" in loader.describe()
    assert "graph path" not in loader.describe()
    float_loader = ResumableLoader(_DATA.astype(np.float32), batch_size=4, seed=2)
    assert "graph path" in float_loader.describe()  # not accepted: the next one


def test_new_path_gives_the_stream_of_the_path_it_replaces(slices, monkeypatch):
    """The new path's stream is the graph path's, batch for batch."""
    ours = _stream(_loader())
    monkeypatch.setattr(paths, "PATHS", paths.PATHS[1:])
    assert "graph path" in _loader().describe()
    assert ours == _stream(_loader())


def test_new_path_resumes_identically(slices):
    """Restores through both ways of consuming it, at every break point."""
    testing.assert_resumes_identically(_loader, num_steps=7, break_points=(0, 3, 6, 11))
