"""`DaskBackend`: batch tasks made on a Dask cluster, handed back in task order.

``Workers(kind="dask", client=...)`` (a ``distributed.Client``), ``Workers(kind="dask",
address="tcp://...")`` (a scheduler to connect to) or ``Workers(n, kind="dask")`` (a
local cluster of `n` worker processes that the loader starts and closes,
`resumeloader.workers.dask_cluster`). The engine keeps the rules a cluster needs:

* a task's key is a pure function of the pipeline's order fingerprint, a digest of its
  pickled payload (two pipelines that differ only in ``map_fn`` share their order
  fields), the epoch, the position and the task's records, submitted ``pure=True``: a
  task Dask runs twice, or again on another worker, gives the same bytes;
* results are taken strictly in task order (never in completion order), with a
  bounded window of tasks in flight, one more submitted as each is taken; a task
  dropped from the window is released, never cancelled (another iteration of the
  same loader may hold the same key);
* the pipeline travels once per worker, in a worker plugin that the scheduler also
  gives to workers that join later (`resumeloader.workers.dask_tasks`); the workers
  read the records themselves;
* a lost worker's tasks are rerun by Dask elsewhere; a failing record is the same
  `RecordError`, and the bad-record policy's replacements travel back with their batch
  (its quarantine log is written where batches are handed out); a lost scheduler is a
  `WorkerError` naming the position, which was not advanced.

Imports distributed only when it is used (``import resumeloader`` does not import
dask). No TensorFlow here.
"""

from __future__ import annotations

import hashlib
import importlib
import pickle
import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import cloudpickle

from resumeloader.core import exiting
from resumeloader.core import state as state_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import backend, failures, options, produce

__all__ = ["SLOTS", "WINDOW_SECONDS", "DaskBackend", "payload", "task_key"]

Task = plan_lib.Task
#: Tasks in flight per thread of the cluster by default: one being made, one waiting.
SLOTS = 2
#: How often the default window asks the cluster for its thread count.
WINDOW_SECONDS = 1.0


def _modules() -> tuple[Any, Any]:
    """distributed, and the backend's module that imports it (`dask_cluster`)."""
    try:
        distributed = importlib.import_module("distributed")
    except ImportError as err:
        msg = (
            "kind='dask' needs the `dask` and `distributed` packages: pip install "
            f"'resumeloader[dask]'. Received: {type(err).__name__}: {err}."
        )
        raise ImportError(msg) from err
    from resumeloader.workers import dask_cluster

    return distributed, dask_cluster


class DaskBackend:
    """``Workers(kind="dask", ...)``: batch tasks on a Dask cluster, at most `window` ahead.

    Args:
        workers: its options (`client`, `address`, or `num_workers` for a local cluster).
        producer: what makes each task's batches (its pipeline and record spec travel to
            each worker once).

    Raises:
        TypeError: the pipeline's source, a record stage's function or the error
            policy's function cannot be pickled.
    """

    kind: ClassVar[str] = "dask"
    option_fields: ClassVar[tuple[str, ...]] = ("client", "address", "timeout", "window")

    def __init__(self, workers: options.Workers, producer: produce.BatchProducer) -> None:
        backend.check_picklable(producer.pipeline, kind=self.kind)
        self._workers = workers
        self._producer = producer
        self._lock = threading.Lock()
        self._cluster: Any = None  # a dask_cluster.Connection once connected
        self._window: tuple[int, float] | None = None  # (the default window, when)
        self._runs = 0  # iterations running on the cluster
        self._released = False  # the loader is gone: the cluster lives only for those runs
        self._payload: bytes | None = None
        self._prefix = ""

    @classmethod
    def check(cls, workers: options.Workers) -> None:
        distributed = _modules()[0]
        client, address = workers.client, workers.address
        if client is not None and address is not None:
            msg = (
                "Give a Dask `client` or a scheduler `address`, not both. Received: "
                f"client={client!r:.80}, address={address!r:.80}."
            )
            raise ValueError(msg)
        if client is not None and not isinstance(client, distributed.Client):
            msg = (
                "`client` must be a distributed.Client. Received: "
                f"client={client!r:.80} of type {type(client).__name__}."
            )
            raise TypeError(msg)
        if address is not None and (not isinstance(address, str) or not address.strip()):
            msg = (
                "`address` must be a Dask scheduler's address, e.g. 'tcp://10.0.0.5:8786'. "
                f"Received: address={address!r:.80}."
            )
            raise (ValueError if isinstance(address, str) else TypeError)(msg)
        remote = client is not None or address is not None
        if remote and workers.num_workers:
            msg = (
                "`num_workers` is the size of the local cluster kind='dask' starts without "
                "a `client` or `address`; a running cluster has its own workers. Received: "
                f"num_workers={workers.num_workers} with a {'client' if client else 'address'}"
                ". Expected: num_workers=0."
            )
            raise ValueError(msg)
        if not remote and not workers.num_workers:
            msg = (
                "kind='dask' needs a `client`, a scheduler `address`, or num_workers >= 1 "
                "(the local cluster it then starts). Received: num_workers=0 and neither."
            )
            raise ValueError(msg)

    @property
    def window(self) -> int:
        """`Workers.window`, or `SLOTS` per thread of the cluster now (asked at most once
        per `WINDOW_SECONDS`: the window follows workers joining and leaving)."""
        if self._workers.window is not None:
            return self._workers.window
        now = time.monotonic()
        if self._window is None or now - self._window[1] > WINDOW_SECONDS:
            threads = sum(self._connected().client.nthreads().values())
            self._window = (SLOTS * max(1, threads), now)
        return self._window[0]

    @property
    def client(self) -> Any:
        """The ``distributed.Client`` the batches are made through (connecting first)."""
        return self._connected().client

    def start(self) -> None:
        self._connected()

    def _connected(self) -> Any:
        with self._lock:
            if self._cluster is None:
                # Closed at exit: a generator thread still running must not start another.
                exiting.check("batches on the Dask cluster")
                if self._payload is None:
                    self._payload, self._prefix = payload(self._producer)
                connection = _modules()[1].Connection
                self._cluster = connection(self._workers, self._payload, self._prefix)
                exiting.on_exit(self.close)
            return self._cluster

    def run(self, tasks: Iterator[Task]) -> Iterator[tuple[Task, produce.Produced]]:
        with self._lock:
            self._runs += 1
        try:
            cluster = self._connected()
            prefix = self._prefix
            yield from backend.in_order(
                tasks, submit=lambda task: cluster.submit(task, task_key(prefix, task)),
                result=self._result, cancel=_modules()[1].release, window=lambda: self.window,
            )
        finally:
            with self._lock:
                self._runs -= 1
                idle = self._released and not self._runs
            if idle:
                self.close()

    def _result(self, task: Task, pending: Any) -> produce.Produced:
        with self._lock:
            cluster = self._cluster
        if cluster is None:
            msg = "The loader's Dask backend was closed during an iteration."
            raise RuntimeError(msg)
        kind, body, extra = cluster.result(task, pending, self._workers.timeout)
        if kind != "ok":
            raise failures.rebuild(task, body, kind, extra)
        if extra:
            self._producer.skips.put(task, extra)
        produced: produce.Produced = body
        return produced

    def close(self) -> None:
        with self._lock:
            cluster, self._cluster, self._window = self._cluster, None, None
        if cluster is not None:
            cluster.close()

    def release(self) -> None:
        """The loader is gone: closes now, or when the iterations still running end."""
        with self._lock:
            self._released = True
            idle = not self._runs
        if idle:
            self.close()

    def describe(self) -> str:
        workers = self._workers
        if workers.client is not None or workers.address is not None:
            where = f"the Dask cluster at {workers.address or 'the given client'}"
        else:
            count = workers.num_workers
            where = f"a local Dask cluster of {count} worker process{'es' if count != 1 else ''}"
        window = workers.window if workers.window is not None else "2 per thread"
        return f"dask: {where}, <= {window} in flight, in order"


def payload(producer: produce.BatchProducer) -> tuple[bytes, str]:
    """The pickled pipeline and record spec that travel to the workers, and the prefix of
    its tasks' keys: the pipeline's order fingerprint and a digest of the payload."""
    pickled = cloudpickle.dumps(
        (producer.pipeline, producer.spec), protocol=pickle.HIGHEST_PROTOCOL
    )
    digest = hashlib.blake2b(pickled, digest_size=8).hexdigest()
    order = state_lib.fingerprint(producer.pipeline.order_fields())
    return pickled, f"resumeloader-batch-{order}-{digest}"


def task_key(prefix: str, task: Task) -> str:
    """The key of `task` on the cluster: a pure function of the pipeline (`prefix`), the
    epoch, the position and the task's records (which a shard and a batch size decide)."""
    records = hashlib.blake2b(task.indices.tobytes(), digest_size=4)
    records.update(task.window.to_bytes(8, "little", signed=True))
    return f"{prefix}-{task.epoch}-{task.position}-{records.hexdigest()}"
