"""The engine without TensorFlow: a plan's batches from any position with any backend, its
state and restore; a new backend is one class and one registry entry."""

from __future__ import annotations

import dataclasses
import itertools
from typing import ClassVar

import _worker_fns as fns
import numpy as np
import pytest

from resumeloader import Pipeline, Workers
from resumeloader.handout import engine as engine_lib
from resumeloader.stages.plan import Plan
from resumeloader.workers import long_lived, registry


def _plan() -> Plan:
    data = np.repeat(np.arange(23, dtype=np.float32), 3).reshape(23, 3)
    return Plan(Pipeline(data, seed=5).shuffle().map(fns.augment).batch(4), num_epochs=2)


def _stream(engine: engine_lib.Engine, position: int = 0) -> list[tuple[bytes, int]]:
    return [(batch.tobytes(), end) for batch, end in engine.batches(position)]


@dataclasses.dataclass(frozen=True)
class SerialOptions:
    """The new kind's own options value."""

    label: str = "serial"


class SerialBackend(long_lived.LongLivedBackend):
    """A new kind of backend, written as a user would: its tasks made one by one by a
    long-lived "worker" (here a counter of the runs it served)."""

    kind = "serial"
    option_fields = ()
    options_type = SerialOptions
    opened: ClassVar[list[dict[str, int]]] = []

    @classmethod
    def check(cls, workers: Workers) -> None:
        pass

    @property
    def window(self) -> int:
        return 1

    def _open(self) -> dict[str, int]:
        handle = {"runs": 0}
        self.opened.append(handle)
        return handle

    def _run(self, handle, tasks):
        handle["runs"] += 1
        for task in tasks:
            yield task, self._producer.batch(task)

    def _stop(self, handle) -> None:
        handle["runs"] = -1

    def describe(self) -> str:
        return f"serially, as {self._workers.options.label}"


@pytest.fixture
def serial(monkeypatch):
    """The new kind, registered: its module and its one registry entry."""
    monkeypatch.setitem(registry.BACKENDS, "serial", f"{__name__}:SerialBackend")
    SerialBackend.opened = []
    return Workers(kind="serial", options=SerialOptions("tested"))


def test_engine_of_a_new_backend_gives_the_calling_thread_stream(serial):
    """A backend added by one class and one registry entry makes the same stream, from
    any position, and keeps the shared lifetime (started once, stopped on close)."""
    reference = engine_lib.Engine(_plan(), Workers(), with_metadata=False)
    engine = engine_lib.Engine(_plan(), serial, with_metadata=False)
    assert _stream(engine) == _stream(reference)
    assert _stream(engine, 8) == _stream(reference, 8)
    assert [handle["runs"] for handle in SerialBackend.opened] == [2]
    assert engine.backend.describe() == "serially, as tested"
    engine.close()
    assert SerialBackend.opened[0]["runs"] == -1


def test_engine_of_a_released_backend_stops_when_its_run_ends(serial):
    """The loader gone during a run: the long-lived workers stop when the run ends."""
    engine = engine_lib.Engine(_plan(), serial, with_metadata=False)
    batches = engine.batches(0)
    next(batches)
    engine.backend.release()
    assert SerialBackend.opened[0]["runs"] == 1
    batches.close()
    assert SerialBackend.opened[0]["runs"] == -1


def test_engine_state_of_and_resume_are_inverse():
    """The engine's state of a position restores to that position."""
    engine = engine_lib.Engine(_plan(), Workers(), with_metadata=False)
    assert [engine.resume(engine.state_of(p)) for p in (0, 4, 20, 23, 44)] == [0, 4, 20, 23, 44]


def test_engine_labelled_batches_carry_metadata_of_their_records():
    """With metadata, each batch travels with its records' indices and positions."""
    plan = _plan()
    engine = engine_lib.Engine(plan, Workers(), with_metadata=True)
    (batch, meta), end = next(engine.batches(4))
    assert end == 8 and len(batch) == 4 and meta["position"].tolist() == [4, 5, 6, 7]
    assert meta["index"].tolist() == plan.indices(0, 4, 8).tolist()


def test_engine_indices_are_those_of_the_batches():
    """The index-only stream (for paths that read the records themselves) names the same
    records, and reports the same ends to its watcher."""
    plan = Plan(Pipeline(np.arange(23), seed=5).shuffle().batch(4), num_epochs=1)
    engine = engine_lib.Engine(plan, Workers(), with_metadata=False)
    ends: list[int] = []
    indices = list(engine.indices(4, watch=lambda _, tasks: (tasks, ends.append)))
    batches = list(engine.batches(4))
    assert [i.tolist() for i in indices] == [b.tolist() for b, _ in batches]
    assert ends == [end for _, end in batches]


def test_engine_with_threads_equals_the_calling_thread():
    """Threads make the same bytes in the same order (the backend never changes the stream)."""
    reference = _stream(engine_lib.Engine(_plan(), Workers(), with_metadata=False), 4)
    threaded = engine_lib.Engine(_plan(), Workers(2, window=3), with_metadata=False)
    assert list(itertools.islice(_stream(threaded, 4), 100)) == reference
