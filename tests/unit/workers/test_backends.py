"""Every registered worker backend keeps the protocol: batches in task order, a bounded
window, restartable, errors named as in the calling thread. No TensorFlow."""

from __future__ import annotations

import contextlib
import itertools

import _dask
import _worker_fns as fns
import numpy as np
import pytest

from resumeloader import DaskOptions, Pipeline, RecordError, Tuning, Workers
from resumeloader.stages.plan import Plan
from resumeloader.workers import backend, produce, registry

# One `Workers` per registered kind: a new backend adds its example here.
EXAMPLES = {
    "inline": Workers(),
    "thread": Workers(2, kind="thread", window=3),
    "process": Workers(2, kind="process"),
    "dask": None,  # the session's LocalCluster, started on first use: `_workers("dask")`
    # Every two batches another kind or count: the stream must not change.
    "auto": Workers("auto", options=Tuning(decide=fns.flip_workers)),
}
KINDS = sorted(registry.BACKENDS)


def _workers(kind: str) -> Workers:
    if kind == "dask":
        return Workers(kind="dask", options=DaskOptions(client=_dask.local()))
    return EXAMPLES[kind]


def _plan(map_fn=fns.augment) -> Plan:
    data = np.repeat(np.arange(23, dtype=np.float32), 3).reshape(23, 3)  # row i starts with i
    pipeline = Pipeline(data, seed=5).shuffle().map(map_fn).batch(4)
    return Plan(pipeline, num_epochs=2)


@contextlib.contextmanager
def _backend(kind: str, plan: Plan):
    made = _workers(kind).backend(produce.BatchProducer(plan.pipeline))
    try:
        yield made
    finally:
        made.close()


def _bytes(produced) -> list[tuple[int, bytes]]:
    return [(task.position, out.batches[0].tobytes()) for task, out in produced]


def test_every_registered_kind_has_an_example():
    """The protocol tests below run every backend in the registry."""
    assert set(EXAMPLES) == set(registry.BACKENDS)


@pytest.fixture(scope="module")
def reference() -> list[tuple[int, bytes]]:
    plan = _plan()
    producer = produce.BatchProducer(plan.pipeline)
    return _bytes((task, producer.batch(task)) for task in plan.tasks(0, plan.layout))


@pytest.mark.parametrize("kind", KINDS)
def test_backend_batches_equal_the_calling_thread_in_task_order(kind, reference):
    """Each task's batches, in task order, are those the producer makes in this thread."""
    plan = _plan()
    with _backend(kind, plan) as made:
        made.start()
        assert _bytes(made.run(plan.tasks(0, plan.layout))) == reference


@pytest.mark.parametrize("kind", KINDS)
def test_backend_keeps_at_most_its_window_in_flight(kind):
    """No more than `window` tasks are taken from the iterator ahead of the consumer."""
    plan = _plan()
    taken = itertools.count()
    pulled = 0

    def tasks():
        nonlocal pulled
        for task in plan.tasks(0, plan.layout):
            pulled = next(taken) + 1
            yield task

    with _backend(kind, plan) as made:
        ahead = [pulled - handed for handed, _ in enumerate(made.run(tasks()), start=1)]
    assert made.window >= 1 and max(ahead) <= made.window
    assert (EXAMPLES["thread"].window == 3 and kind != "thread") or made.window == 3


@pytest.mark.parametrize("kind", KINDS)
def test_backend_run_closed_early_then_run_again_gives_the_same_batches(kind, reference):
    """An abandoned run drops what was in flight; the next run (and one after close) starts
    from its own first task."""
    plan = _plan()
    with _backend(kind, plan) as made:
        first = made.run(plan.tasks(0, plan.layout))
        assert _bytes(itertools.islice(first, 2)) == reference[:2]
        first.close()
        start = reference[3][0]
        assert _bytes(made.run(plan.tasks(start, plan.layout))) == reference[3:]
        made.close()
        assert _bytes(itertools.islice(made.run(plan.tasks(0, plan.layout)), 1)) == reference[:1]


@pytest.mark.parametrize("kind", KINDS)
def test_backend_failing_record_raises_record_error_naming_it(kind):
    """A map_fn that raises in a worker is the RecordError the calling thread raises."""
    plan = _plan(fns.fail_at_index)
    with _backend(kind, plan) as made, pytest.raises(RecordError) as info:
        for _ in made.run(plan.tasks(0, plan.layout)):
            pass
    assert info.value.record_index == fns.FAILING_INDEX
    assert f"record index {fns.FAILING_INDEX}" in str(info.value)


@pytest.mark.parametrize("kind", KINDS)
def test_backend_describe_says_where_batches_are_made(kind):
    """describe() is one line naming the workers (or the calling thread)."""
    with _backend(kind, _plan()) as made:
        text = made.describe()
    assert "\n" not in text and (kind in text or "generator thread" in text)


def test_in_order_hands_back_in_task_order_within_the_window():
    """The in-order loop submits at most `window` ahead and cancels what it drops."""
    submitted, cancelled = [], []

    def submit(task):
        submitted.append(task)
        return task * 10

    loop = backend.in_order(
        iter(range(10)), submit=submit, result=lambda task, future: future,
        cancel=cancelled.append, window=3,
    )
    got = [next(loop) for _ in range(4)]
    assert got == [(0, 0), (1, 10), (2, 20), (3, 30)] and len(submitted) == 3 + 4
    loop.close()
    assert cancelled == [40, 50, 60]


@pytest.mark.parametrize("kind", KINDS)
def test_backend_released_during_a_run_stops_when_the_run_ends(kind, reference):
    """`release` (the loader is gone) lets a running iteration finish, then stops the
    workers; nothing is left running."""
    plan = _plan()
    made = _workers(kind).backend(produce.BatchProducer(plan.pipeline))
    run = made.run(plan.tasks(0, plan.layout))
    first = _bytes(itertools.islice(run, 1))
    made.release()
    assert first + _bytes(run) == reference
    assert getattr(made, "pids", []) == []
