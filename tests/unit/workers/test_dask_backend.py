"""The Dask backend's options, task keys and import boundary, without a cluster (its batches
on real clusters: tests/tf/test_dask.py and the shared protocol tests). No TensorFlow."""

from __future__ import annotations

import subprocess
import sys

import _worker_fns as fns
import numpy as np
import pytest
from distributed import Client

from resumeloader import Pipeline, Shard, Workers
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


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [({"kind": "dask"}, ValueError, "needs a `client`, a scheduler `address`"),
     ({"kind": "dask", "address": "tcp://127.0.0.1:1", "client": "x"}, ValueError, "not both"),
     ({"kind": "dask", "client": "tcp://127.0.0.1:1"}, TypeError, "distributed.Client"),
     ({"kind": "dask", "address": 8786}, TypeError, "`address`"),
     ({"kind": "dask", "address": " "}, ValueError, "`address`"),
     ({"num_workers": 2, "kind": "dask", "address": "tcp://127.0.0.1:1"}, ValueError,
      "a running cluster has its own workers"),
     ({"num_workers": 2, "kind": "thread", "address": "tcp://127.0.0.1:1"}, ValueError,
      "`address` is not an option of kind='thread'"),
     ({"num_workers": 2, "kind": "process", "client": object()}, ValueError,
      "`client` is not an option of kind='process'")],
    ids=["nothing", "both", "client-not-a-client", "address-int", "address-blank",
         "address-and-num_workers", "address-for-threads", "client-for-processes"],
)
def test_dask_workers_invalid_raises_naming_field(kwargs, error, fragment):
    """What kind='dask' cannot take, and its fields given to another kind, are refused."""
    with pytest.raises(error) as info:
        Workers(**kwargs)
    assert fragment in str(info.value) and "Received:" in str(info.value)


def test_dask_workers_repr_shows_its_own_fields_only_when_set():
    """The repr of the other kinds is 0.2's; a Dask one names its address."""
    assert repr(Workers(2)) == "Workers(num_workers=2, kind='thread', timeout=None, window=None)"
    text = repr(Workers(kind="dask", address="tcp://127.0.0.1:8786", timeout=5))
    assert text == (
        "Workers(num_workers=0, kind='dask', timeout=5.0, window=None, "
        "address='tcp://127.0.0.1:8786')"
    )


def test_dask_workers_of_a_client_are_values():
    """A Workers of a client compares by value (the same client) and keeps it."""
    client = Client.__new__(Client)  # a Client object, never connected
    assert Workers(kind="dask", client=client) == Workers(kind="dask", client=client)
    assert Workers(kind="dask", client=client).client is client


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
    remote = Workers(kind="dask", address="tcp://127.0.0.1:8786", window=6).backend(producer)
    local = Workers(3, kind="dask").backend(producer)
    assert remote.describe() == (
        "dask: the Dask cluster at tcp://127.0.0.1:8786, <= 6 in flight, in order"
    )
    assert local.describe().startswith("dask: a local Dask cluster of 3 worker processes")
