"""The Dask workers' side of the Dask backend: the pipeline plugin and the batch task.

`PipelinePlugin` carries the pickled pipeline and record spec to every worker of the
cluster, those there when it is registered and those that join later (the scheduler
keeps its plugins and installs them on a worker before the worker takes any task);
each worker rebuilds one `BatchProducer` per pipeline from it, once. Nothing is
``scatter``ed: scattered data has no recipe, so the scheduler cannot recompute it when
the worker holding it dies.

`make_batches` is the batch task: a pure function of (the pipeline's digest, the
task), so Dask may run it twice or on another worker and get the same bytes. It never
raises for the user's code: it returns the batches with the records replaced by the
bad-record policy, or a picklable description of the failure, which the consumer's
side rebuilds as the `RecordError` the calling thread would raise (Dask's own retries
are for lost workers, not for a failing ``map_fn``).

Imported only where the Dask backend runs (by `resumeloader.workers.dask_backend`
when ``kind="dask"`` is chosen, and on the workers). No TensorFlow here.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import distributed

from resumeloader.core import board as board_lib
from resumeloader.core import meters
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import failures, produce, timing

__all__ = ["ERROR", "OK", "SETUP_ERROR", "PipelinePlugin", "make_batches"]

OK = "ok"  # (OK, Produced, (skips, counts or None))
ERROR = "error"  # (ERROR, worker name, failure description): making the batch raised
SETUP_ERROR = "setup_error"  # (SETUP_ERROR, worker name, description): no producer

_lock = threading.Lock()
# digest -> [plugins registered with it on this worker, its producer or setup failure]
_producers: dict[str, list[Any]] = {}
# What the storage layer had counted in this worker process at the last report.
_storage: dict[str, int] = {}


class PipelinePlugin(distributed.WorkerPlugin):
    """A worker plugin holding one loader's pickled pipeline and record spec.

    Args:
        payload: ``cloudpickle.dumps((pipeline, record spec))``.
        digest: a digest of `payload` (what the batch tasks name it by).
        name: the plugin's name on the cluster, unique to one loader's backend, so that
            closing one loader never removes another's pipeline (two loaders with the
            same pipeline, e.g. two shards of one job, share the worker's producer).
    """

    def __init__(self, payload: bytes, digest: str, name: str) -> None:
        self.payload = payload
        self.digest = digest
        self.name = name

    def setup(self, worker: Any) -> None:
        with _lock:
            entry = _producers.get(self.digest)
            if entry is not None:
                entry[0] += 1
                return
        made: Any
        try:
            pipeline, spec = pickle.loads(self.payload)
            board = board_lib.Board() if meters.enabled() else None
            made = produce.BatchProducer(pipeline, spec, hand_over=False, board=board)
        except Exception as err:  # reported by each task that needs it
            made = failures.describe(err)
        with _lock:
            entry = _producers.setdefault(self.digest, [0, made])
            entry[0] += 1

    def teardown(self, worker: Any) -> None:
        with _lock:
            entry = _producers.get(self.digest)
            if entry is not None:
                entry[0] -= 1
                if entry[0] <= 0:
                    del _producers[self.digest]


def make_batches(digest: str, task: plan_lib.Task) -> tuple[Any, Any, Any]:
    """The batch task: `task`'s batches made by the pipeline of `digest` on this worker.

    Returns:
        ``(OK, Produced, (skips, counts))`` (counts: what this worker's thread counted
        since its last task, `timing.Report`), or ``(ERROR | SETUP_ERROR, worker name,
        description)``.
    """
    address = distributed.get_worker().address
    name = f"Dask worker {address}"
    with _lock:
        entry = _producers.get(digest)
    if entry is None:
        missing = RuntimeError(
            f"the loader's pipeline (digest {digest}) is not registered on this worker: "
            "its loader was closed, or the plugin never reached the worker"
        )
        return SETUP_ERROR, name, failures.describe(missing)
    producer = entry[1]
    if not isinstance(producer, produce.BatchProducer):
        return SETUP_ERROR, name, producer
    try:
        produced = producer.batch(task)
    except Exception as err:
        return ERROR, name, failures.describe(err)
    report = None
    if producer.board is not None:
        _, alive, cpu, changed = producer.board.here().take()
        with _lock:
            storage = timing.storage_counts(_storage)
        report = (address, alive, cpu, changed), storage
    return OK, produced, (producer.skips.take(task), report)
