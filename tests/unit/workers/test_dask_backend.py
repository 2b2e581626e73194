"""The Dask backend's options, task keys and import boundary, without a cluster (its batches
on real clusters: tests/tf/test_dask.py and the shared protocol tests). No TensorFlow."""

from __future__ import annotations

import subprocess
import sys

import _worker_fns as fns
import numpy as np
import pytest
from distributed import Client

from resumeloader import DaskOptions, Pipeline, Shard, Workers
from resumeloader.stages.plan import Plan
from resumeloader.workers import dask_backend, produce


def _keys(pipeline: Pipeline, batch_size: int = 4, **plan) -> list[str]:
    plan_ = Plan(pipeline.batch(batch_size), num_epochs=2, **plan)
    _, prefix = dask_backend.payload(produce.BatchProducer(plan_.pipeline))
    return [dask_backend.task_key(prefix, task) for task in plan_.tasks(0, plan_.layout)]


def _pipeline(map_fn=fns.augment, seed: int = 5) -> Pipeline:
    data = np.arange(23 * 3, dtype=np.float32).reshape(23, 3)
    return Pipeline(data, seed=seed).shuffle().map(map_fn)


def test_dask_task_keys_are_a_pure_function_of_pipeline_and_task():
    """Two equal pipelines give the same keys (Dask may run a task twice: same bytes)."""
    assert _keys(_pipeline()) == _keys(_pipeline())
    assert len(set(_keys(_pipeline()))) == len(_keys(_pipeline()))


@pytest.mark.parametrize(
    ("other", "plan"),
    [(_pipeline(seed=6), {}), (_pipeline(map_fn=fns.slow_augment), {}),
     (_pipeline(), {"shard": Shard(1, 2)})],
    ids=["seed", "map_fn-only", "shard"],
)
def test_dask_task_keys_differ_when_the_bytes_may_differ(other, plan):
    """Another seed, another map_fn (same order fields) or another shard: no key shared."""
    assert not set(_keys(_pipeline())) & set(_keys(other, **plan))


def test_dask_task_key_names_the_batch_size():
    """A restore with another batch size makes other tasks at the same positions: other keys."""
    assert not set(_keys(_pipeline(), 4)) & set(_keys(_pipeline(), 2))


_ADDRESS = "tcp://127.0.0.1:8786"


@pytest.mark.parametrize(
    ("make", "error", "fragment"),
    [(lambda: Workers(kind="dask"), ValueError, "needs a `client`, a scheduler `address`"),
     (lambda: DaskOptions(address=_ADDRESS, client="x"), ValueError, "not both"),
     (lambda: DaskOptions(client=_ADDRESS), TypeError, "distributed.Client"),
     (lambda: DaskOptions(address=8786), TypeError, "`address`"),
     (lambda: DaskOptions(address=" "), ValueError, "`address`"),
     (lambda: Workers(2, kind="dask", options=DaskOptions(address=_ADDRESS)), ValueError,
      "a running cluster has its own workers"),
     (lambda: Workers(kind="dask", options={"address": _ADDRESS}), TypeError,
      "`options` of kind='dask' must be a DaskOptions or None"),
     (lambda: Workers(2, kind="thread", options=DaskOptions(address=_ADDRESS)), TypeError,
      "`options` of kind='thread' must be None (it has no options)"),
     (lambda: Workers(kind="dask", address=_ADDRESS), TypeError,
      "Expected: Workers(kind='dask', options=DaskOptions(address=...))"),
     (lambda: Workers(kind="dask", client=object()), TypeError,
      "Expected: Workers(kind='dask', options=DaskOptions(client=...))")],
    ids=["nothing", "both", "client-not-a-client", "address-int", "address-blank",
         "address-and-num_workers", "options-not-dask-options", "options-for-threads",
         "removed-address-keyword", "removed-client-keyword"],
)
def test_dask_workers_invalid_raises_naming_field(make, error, fragment):
    """What kind='dask' cannot take, its options given to another kind, and the keywords
    of 0.3 are refused, naming the field (and the new spelling)."""
    with pytest.raises(error) as info:
        make()
    assert fragment in str(info.value) and "Received:" in str(info.value)


def test_dask_workers_repr_shows_its_options_only_when_given():
    """The repr of the other kinds is 0.2's; a Dask one names its address."""
    assert repr(Workers(2)) == "Workers(num_workers=2, kind='thread', timeout=None, window=None)"
    assert repr(Workers(2, kind="dask")) == (
        "Workers(num_workers=2, kind='dask', timeout=None, window=None)"
    )
    text = repr(Workers(kind="dask", options=DaskOptions(address=_ADDRESS), timeout=5))
    assert text == (
        "Workers(num_workers=0, kind='dask', timeout=5.0, window=None, "
        "options=DaskOptions(address='tcp://127.0.0.1:8786'))"
    )


def test_dask_workers_of_a_client_are_values():
    """A Workers of a client compares by value (the same client) and keeps it."""
    client = Client.__new__(Client)  # a Client object, never connected
    workers = Workers(kind="dask", options=DaskOptions(client=client))
    assert workers == Workers(kind="dask", options=DaskOptions(client=client))
    assert workers.options.client is client


def test_import_resumeloader_does_not_import_dask():
    """`import resumeloader` (and every kind but dask) loads neither dask nor distributed."""
    code = (
        "import sys, resumeloader\n"
        "resumeloader.Workers(2, kind='process'); resumeloader.Workers(2)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_dask_describe_names_the_cluster():
    """describe() says where: an address, or the local cluster and its size."""
    plan = Plan(_pipeline().batch(4), num_epochs=1)
    producer = produce.BatchProducer(plan.pipeline)
    remote = Workers(kind="dask", options=DaskOptions(address=_ADDRESS), window=6).backend(producer)
    local = Workers(3, kind="dask").backend(producer)
    assert remote.describe() == (
        "dask: the Dask cluster at tcp://127.0.0.1:8786, <= 6 in flight, in order"
    )
    assert local.describe().startswith("dask: a local Dask cluster of 3 worker processes")
