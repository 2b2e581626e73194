"""`DaskBackend`: batch tasks made on a Dask cluster, handed back in task order.

``Workers(kind="dask", options=DaskOptions(client=...))`` (a ``distributed.Client``),
``Workers(kind="dask", options=DaskOptions(address="tcp://..."))`` (a scheduler to
connect to) or ``Workers(n, kind="dask")`` (a local cluster of `n` worker processes
that the loader starts and closes, `resumeloader.workers.dask_cluster`). The engine
keeps the rules a cluster needs:

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

import dataclasses
import hashlib
import importlib
import pickle
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import cloudpickle

from resumeloader.core import exiting
from resumeloader.core import state as state_lib
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import backend, failures, long_lived, options, produce

__all__ = ["SLOTS", "WINDOW_SECONDS", "DaskBackend", "DaskOptions", "payload", "task_key"]

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
            "kind='dask' needs the `dask` and `distributed` packages: pip install dask "
            'distributed (the `dask` extra: pip install -e ".[dask]" in a checkout of '
            f"resumeloader). Received: {type(err).__name__}: {err}."
        )
        raise ImportError(msg) from err
    from resumeloader.workers import dask_cluster

    return distributed, dask_cluster


@dataclasses.dataclass(frozen=True)
class DaskOptions:
    """Which Dask cluster makes a loader's batches: ``Workers(kind="dask", options=...)``.

    Without a client nor an address, ``Workers(n, kind="dask")`` starts a local cluster
    of `n` worker processes that the loader owns and closes. The cluster never changes
    the stream: a state saved with one restores exactly with another.

    Args:
        client: a ``distributed.Client`` of the cluster that makes the batches (the
            loader neither starts nor closes it).
        address: the address of a Dask scheduler to connect to (e.g.
            ``"tcp://10.0.0.5:8786"``); the loader's client closes with the loader.

    Raises:
        TypeError, ValueError: a field is invalid, or both are given.
    """

    client: Any = None
    address: str | None = None

    def __repr__(self) -> str:
        given = [f"{name}={value!r}" for name, value in
                 (("client", self.client), ("address", self.address)) if value is not None]
        return f"DaskOptions({', '.join(given)})"

    def __post_init__(self) -> None:
        client, address = self.client, self.address
        if client is not None and address is not None:
            msg = (
                "Give a Dask `client` or a scheduler `address`, not both. Received: "
                f"client={client!r:.80}, address={address!r:.80}."
            )
            raise ValueError(msg)
        if client is not None and not isinstance(client, _modules()[0].Client):
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

    @property
    def remote(self) -> bool:
        """Whether the cluster is given (a client or an address), not started locally."""
        return self.client is not None or self.address is not None


class DaskBackend(long_lived.LongLivedBackend):
    """``Workers(kind="dask", ...)``: batch tasks on a Dask cluster, at most `window` ahead
    (its options: `DaskOptions`, or `num_workers` for a local cluster; arguments and
    errors: `LongLivedBackend`)."""

    kind: ClassVar[str] = "dask"
    options_type: ClassVar[type | None] = DaskOptions

    def __init__(self, workers: options.Workers, producer: produce.BatchProducer) -> None:
        super().__init__(workers, producer)
        self._options: DaskOptions = workers.options
        self._window: tuple[int, float] | None = None  # (the default window, when)
        self._payload: bytes | None = None
        self._prefix = ""

    @classmethod
    def check(cls, workers: options.Workers) -> None:
        _modules()
        remote, num = workers.options.remote, workers.num_workers
        if remote and num:
            msg = (
                "`num_workers` is the size of the local cluster kind='dask' starts without "
                "a `client` or `address`; a running cluster has its own workers. Received: "
                f"num_workers={num} with "
                f"{'a client' if workers.options.client is not None else 'an address'}. "
                "Expected: num_workers=0."
            )
            raise ValueError(msg)
        if not remote and not num:
            msg = (
                "kind='dask' needs a `client`, a scheduler `address` (options=DaskOptions(...)"
                "), or num_workers >= 1 (the local cluster it then starts). Received: "
                "num_workers=0 and neither."
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
            threads = sum(self._started().client.nthreads().values())
            self._window = (SLOTS * max(1, threads), now)
        return self._window[0]

    @property
    def client(self) -> Any:
        """The ``distributed.Client`` the batches are made through (connecting first)."""
        return self._started().client

    def _open(self) -> Any:
        # Closed at exit: a generator thread still running must not start another cluster.
        exiting.check("batches on the Dask cluster")
        if self._payload is None:
            self._payload, self._prefix = payload(self._producer)
        connection = _modules()[1].Connection
        cluster = connection(self._workers, self._payload, self._prefix)
        exiting.on_exit(self.close)
        return cluster

    def _run(self, cluster: Any, tasks: Iterator[Task]) -> Iterator[tuple[Task, produce.Produced]]:
        prefix = self._prefix
        return backend.in_order(
            tasks, submit=lambda task: cluster.submit(task, task_key(prefix, task)),
            result=self._result, cancel=_modules()[1].release, window=lambda: self.window,
            gauge=backend.in_flight(self._producer, self.window),
        )

    def _result(self, task: Task, pending: Any) -> produce.Produced:
        cluster = self._current()
        if cluster is None:
            msg = "The loader's Dask backend was closed during an iteration."
            raise RuntimeError(msg)
        board = self._producer.board
        kind, body, extra = cluster.result(task, pending, self._workers.timeout)
        if kind != "ok":
            raise failures.rebuild(task, body, kind, extra)
        skips, report = extra
        if skips:
            self._producer.skips.put(task, skips)
        if report is not None and board is not None:
            delta, counts = report
            board.merge(delta, counts, name=f"Dask worker {delta[0]}")
        produced: produce.Produced = body
        return produced

    def _stop(self, cluster: Any) -> None:
        self._window = None
        cluster.close()

    def describe(self) -> str:
        workers, where = self._workers, self._options
        if where.remote:
            place = f"the Dask cluster at {where.address or 'the given client'}"
        else:
            count = workers.num_workers
            place = f"a local Dask cluster of {count} worker process{'es' if count != 1 else ''}"
        window = workers.window if workers.window is not None else "2 per thread"
        return f"dask: {place}, <= {window} in flight, in order"


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
