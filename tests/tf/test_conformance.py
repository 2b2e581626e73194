"""The resume-conformance suite: every registered pipeline resumes identically, both ways."""

from __future__ import annotations

from typing import Any

import _conformance as conformance
import numpy as np
import pytest

from resumeloader import Pipeline, ResumableLoader, ResumeMismatchError, testing
from resumeloader.core import sampler
from resumeloader.handout import engine as engine_lib
from resumeloader.stages import IndexStage, RecordStage
from resumeloader.tfdata import paths
from resumeloader.workers import registry


@pytest.mark.parametrize("name", sorted(conformance.REGISTRY))
def test_registered_pipeline_resumes_identically(name, request):
    """Restored at every break point, through JSON state and tf.train.Checkpoint, twice."""
    case = conformance.REGISTRY[name]
    for fixture in case.needs:  # e.g. a storage server
        request.getfixturevalue(fixture)
    testing.assert_resumes_identically(
        case.make, num_steps=case.num_steps, break_points=case.break_points
    )


def _path(loader: ResumableLoader) -> str:
    """The name of the delivery path `loader` takes (chosen as the loader chooses it)."""
    engine = engine_lib.Engine(loader.plan, loader.workers, with_metadata=loader.with_metadata)
    return paths.path_class(engine).name


def test_registry_covers_every_delivery_path_and_feature(request):
    """The registry holds every delivery path of `PATHS`, workers, shards, metadata."""
    for fixture in {f for case in conformance.REGISTRY.values() for f in case.needs}:
        request.getfixturevalue(fixture)
    loaders = {name: case.make() for name, case in conformance.REGISTRY.items()}
    taken = {_path(loader) for loader in loaders.values()}
    assert taken >= {path.name for path in paths.PATHS}
    assert {loader.workers.kind for loader in loaders.values() if loader.workers.num_workers} == {
        "thread",
        "process",
    }
    assert any(loader.shard.count > 1 for loader in loaders.values())
    assert any(loader.with_metadata for loader in loaders.values())
    assert any(loader.num_epochs is None for loader in loaders.values())


def test_registry_covers_every_worker_backend(request):
    """Every kind of worker backend in the registry has an entry (and the 0.3 values do)."""
    for fixture in {f for case in conformance.REGISTRY.values() for f in case.needs}:
        request.getfixturevalue(fixture)  # e.g. a storage server, whatever ran before
    loaders = [case.make() for case in conformance.REGISTRY.values()]
    kinds = {loader.workers.kind for loader in loaders}
    assert kinds >= set(registry.BACKENDS)
    assert any(loader.workers.window is not None for loader in loaders)
    for loader in loaders:
        loader.close()


class _EpochCachingOrder(IndexStage):
    """Broken on purpose: keeps the permutation of the first epoch it is asked for."""

    name = "sampler"

    def __init__(self, num_records: int) -> None:
        self._num_records = num_records
        self._first_epoch: int | None = None

    @property
    def num_records(self) -> int:
        return self._num_records

    def indices(self, epoch: int, offsets: np.ndarray, *, seed: int) -> np.ndarray:
        if self._first_epoch is None:
            self._first_epoch = epoch
        return sampler.permute(self._num_records, seed, self._first_epoch, offsets)


class _CallCountingMap(RecordStage):
    """Broken on purpose: its randomness depends on how many records it has seen."""

    name = "noise"

    def __init__(self) -> None:
        self._calls = 0

    def apply(self, record: Any, *, seed: int, epoch: int, index: int) -> Any:
        self._calls += 1
        return record + np.float32(self._calls)


@pytest.mark.parametrize(
    "stage", [_EpochCachingOrder(37), _CallCountingMap()], ids=["index-stage", "record-stage"]
)
def test_history_dependent_stage_fails_the_conformance_check(stage):
    """A stage whose output depends on its history, not (seed, epoch, position), is caught."""
    images = np.arange(37 * 3, dtype=np.float32).reshape(37, 3)

    def make() -> ResumableLoader:
        pipeline = Pipeline(images, seed=0).shuffle().apply(type(stage)(*_args(stage)))
        return ResumableLoader.from_pipeline(pipeline.batch(5), num_epochs=2)

    with pytest.raises(ResumeMismatchError, match="differs from the uninterrupted run"):
        testing.assert_resumes_identically(make, num_steps=9)


def _args(stage: Any) -> tuple[Any, ...]:
    return (37,) if isinstance(stage, _EpochCachingOrder) else ()
