"""The Dask backend's bounded waits, on real clusters: with `Workers(timeout=)`, a batch
that cannot arrive (every worker gone, a worker stalled holding the result) is a
`WorkerError` naming the cluster's state, and the stream then continues exactly.

Clusters: ``dask scheduler`` + ``dask worker --no-nanny`` processes started per test
(their workers are killed: nothing restarts a worker without a nanny), and the
session's ``distributed.LocalCluster`` (`_dask.local`), scaled to 0 and back. Ctrl-C
and interpreter exit with a Dask backend: tests/tf/test_faults.py, test_exits.py.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import _dask
import _worker_fns as fns
import numpy as np
import pytest

import resumeloader
from resumeloader import DaskOptions, WorkerError, Workers

NUM_RECORDS, BATCH, EPOCHS = 40, 4, 1
# Far above a batch's time on a loaded machine (80 ms idle, ~1 s at load 20); each test
# waits it out once, so it is most of the test's time.
TIMEOUT = 8.0
HEAD = 3  # batches taken before the fault
_DATA = np.arange(NUM_RECORDS * 3, dtype=np.float32).reshape(NUM_RECORDS, 3)


def _loader(workers: Workers) -> resumeloader.ResumableLoader:
    # No read-ahead thread: the batch after the fault is the one waited for.
    return resumeloader.ResumableLoader(
        _DATA, batch_size=BATCH, seed=3, num_epochs=EPOCHS, map_fn=fns.slow_augment,
        workers=workers, prefetch=0,
    )


def _bytes(batch) -> bytes:
    return np.asarray(batch).tobytes()


@pytest.fixture(scope="module")
def reference() -> list[bytes]:
    """The stream made in the calling thread (0 workers)."""
    return [_bytes(batch) for batch in _loader(Workers())]


@pytest.fixture
def bare_cluster():
    """A scheduler and 2 workers without nannies, for this test alone."""
    cluster = _dask.CliCluster(2, nanny=False)
    yield cluster
    for worker in cluster.workers:  # a stopped worker must take its SIGKILL
        worker.send_signal(signal.SIGCONT)
    cluster.close()


def _head_then_error(loader: resumeloader.ResumableLoader, fault) -> tuple[list[bytes], Any]:
    """`HEAD` batches, then `fault()`, then the WorkerError of the next batch."""
    batches = iter(loader)
    head = [_bytes(next(batches)) for _ in range(HEAD)]
    fault()
    with pytest.raises(WorkerError) as info:
        next(batches)
    return head, info.value


def test_dask_every_worker_killed_raises_worker_error_naming_no_worker(
    bare_cluster, reference
):
    """Every worker SIGKILLed (no nanny restarts them): the next batch is a WorkerError of
    the timeout saying the cluster has no worker; a worker that joins then continues the
    stream exactly."""
    address = bare_cluster.address
    loader = _loader(Workers(kind="dask", options=DaskOptions(address=address), timeout=TIMEOUT))

    def kill_every_worker() -> None:
        for worker in bare_cluster.workers:
            worker.send_signal(signal.SIGKILL)
        _dask.wait_for(lambda: bare_cluster.num_workers() == 0, "the workers' removal")

    head, error = _head_then_error(loader, kill_every_worker)
    bare_cluster.add_worker()
    bare_cluster.wait_for_workers(1)
    rest = [_bytes(batch) for batch in loader]
    loader.close()
    text = str(error)
    assert f"No batch arrived within timeout={TIMEOUT} s" in text
    assert f"the Dask cluster at {address} has no running worker (every worker is gone" in text
    assert error.position == HEAD * BATCH
    assert head + rest == reference


def test_dask_local_cluster_scaled_to_zero_raises_worker_error_naming_no_worker(reference):
    """A LocalCluster scaled to 0 workers mid-epoch: a WorkerError of the timeout saying
    the cluster has no worker; scaled back up, the stream continues exactly."""
    client = _dask.local()
    loader = _loader(Workers(kind="dask", options=DaskOptions(client=client), timeout=TIMEOUT))

    def scale_to_zero() -> None:
        client.cluster.scale(0)
        _dask.wait_for(lambda: not client.nthreads(), "the workers' removal")

    try:
        head, error = _head_then_error(loader, scale_to_zero)
    finally:
        client.cluster.scale(2)
        _dask.wait_for(lambda: len(client.nthreads()) == 2, "2 workers again")
    rest = [_bytes(batch) for batch in loader]
    loader.close()
    text = str(error)
    assert f"No batch arrived within timeout={TIMEOUT} s" in text
    assert "has no running worker (every worker is gone" in text
    assert error.position == HEAD * BATCH
    assert head + rest == reference


def test_dask_worker_stalled_holding_result_raises_worker_error_naming_the_transfer(
    bare_cluster,
):
    """The workers stopped (SIGSTOP) once they made the batches in flight: the transfer
    of the next batch's result never ends, and the timeout bounds it (a WorkerError
    naming the task as made, in memory, on a running worker)."""
    where = DaskOptions(address=bare_cluster.address)
    loader = _loader(Workers(kind="dask", options=where, timeout=TIMEOUT))
    client = bare_cluster.client()

    def stop_workers_holding_results() -> None:
        def made() -> bool:
            processing = client.processing()
            held = client.has_what()
            return not any(processing.values()) and any(held.values())

        _dask.wait_for(made, "the batches in flight made")
        for worker in bare_cluster.workers:
            os.kill(worker.pid, signal.SIGSTOP)

    try:
        _, error = _head_then_error(loader, stop_workers_holding_results)
    finally:
        for worker in bare_cluster.workers:
            os.kill(worker.pid, signal.SIGCONT)
        client.close()
    loader.close()
    text = str(error)
    assert f"No batch arrived within timeout={TIMEOUT} s" in text
    assert "has 2 running workers (2 threads) processing 0 tasks" in text
    assert "the task is 'memory' on its scheduler: made, but its result did not" in text
    assert error.position == HEAD * BATCH
