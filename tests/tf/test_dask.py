"""The Dask backend against real clusters: exact through worker loss, rescaling, resume.

Two clusters, each shared by the session: a ``distributed.LocalCluster`` of 2 process
workers in this process (`_dask.local`), and a scheduler plus 2 workers started as
separate processes with the ``dask scheduler`` / ``dask worker`` commands (`_dask.cli`).
Every test runs on both and compares the stream, byte for byte, with the one made
without workers. Loopback only, ephemeral ports, bounded waits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import _dask
import _limits
import _worker_fns as fns
import numpy as np
import psutil
import pytest

import resumeloader
from resumeloader import DaskOptions, RecordError, WorkerError, Workers

NUM_RECORDS, BATCH, EPOCHS = 40, 4, 2
NUM_BATCHES = NUM_RECORDS // BATCH * EPOCHS
_DATA = np.arange(NUM_RECORDS * 3, dtype=np.float32).reshape(NUM_RECORDS, 3)
KINDS = ["local", "cli"]


def _loader(workers: Workers) -> resumeloader.ResumableLoader:
    # 20 ms per record: a batch task takes 80 ms, so tasks are in flight at any moment.
    return resumeloader.ResumableLoader(
        _DATA, batch_size=BATCH, seed=3, num_epochs=EPOCHS, map_fn=fns.slow_augment,
        workers=workers,
    )


def _bytes(batch) -> bytes:
    return np.asarray(batch).tobytes()


@pytest.fixture(scope="module")
def reference() -> list[bytes]:
    """The stream made in the calling thread (0 workers)."""
    return [_bytes(batch) for batch in _loader(Workers())]


class _Local:
    """The session's LocalCluster (in this process): scaled through its cluster object."""

    def __init__(self) -> None:
        self.client = _dask.local()

    def workers(self) -> Workers:
        return Workers(kind="dask", options=DaskOptions(client=self.client))

    def add_worker(self) -> None:
        self.client.cluster.scale(3)

    def remove_worker(self) -> None:
        self.client.cluster.scale(2)

    def settle(self, count: int = 2) -> None:
        _dask.wait_for(lambda: len(self.client.nthreads()) == count, f"{count} workers")


class _Cli:
    """``dask scheduler`` + ``dask worker`` processes, reached by address."""

    def __init__(self, cluster: _dask.CliCluster) -> None:
        self.cluster = cluster
        self.client = cluster.client()

    def workers(self) -> Workers:
        return Workers(kind="dask", options=DaskOptions(address=self.cluster.address))

    def add_worker(self) -> None:
        self.cluster.add_worker()

    def remove_worker(self) -> None:
        first = self.cluster.workers.pop(0)  # one of the original workers, gracefully
        first.send_signal(signal.SIGTERM)
        first.wait(_limits.EXIT)

    def settle(self, count: int = 2) -> None:
        _dask.wait_for(lambda: len(self.client.nthreads()) == count, f"{count} workers")

    def close(self) -> None:
        self.client.close()


@pytest.fixture
def cli_cluster():
    return _dask.cli()


@pytest.fixture(params=KINDS)
def cluster(request):
    """Each test on the LocalCluster and on the command-line cluster, 2 workers each."""
    local = request.param == "local"
    handle = _Local() if local else _Cli(request.getfixturevalue("cli_cluster"))
    handle.settle(2)
    yield handle
    handle.settle(2)
    if not local:
        handle.close()


def _kill_a_busy_worker(client) -> list[str]:
    """SIGKILLs a worker process while it makes a batch task; returns the keys it held."""
    busy: dict[str, list[str]] = {}

    def find() -> bool:
        processing = client.processing()
        busy.update({a: list(keys) for a, keys in processing.items() if keys})
        return bool(busy)

    _dask.wait_for(find, "a worker making a batch task", timeout=10)
    address, keys = next(iter(busy.items()))
    os.kill(_dask.worker_pids(client)[address], signal.SIGKILL)
    return keys


def test_dask_stream_equals_zero_workers_bit_for_bit(cluster, reference):
    """Two epochs made on the cluster are the bytes made in the calling thread."""
    loader = _loader(cluster.workers())
    assert [_bytes(batch) for batch in loader] == reference
    assert "dask" in loader.describe()
    loader.close()


def test_dask_worker_sigkilled_mid_epoch_changes_nothing(cluster, reference):
    """A worker SIGKILLed while it makes batches: Dask reruns its tasks, same stream."""
    loader = _loader(cluster.workers())
    batches = iter(loader)
    got = [_bytes(next(batches)) for _ in range(4)]
    keys = _kill_a_busy_worker(cluster.client)
    got += [_bytes(batch) for batch in batches]
    assert keys and all(key.startswith("resumeloader-batch-") for key in keys)
    assert got == reference
    loader.close()


def test_dask_workers_added_and_removed_mid_run_change_nothing(cluster, reference):
    """A third worker joins mid-epoch (gets the pipeline, makes batches), then one of the
    first two leaves: the same stream."""
    loader = _loader(cluster.workers())
    batches = iter(loader)
    got = [_bytes(next(batches)) for _ in range(3)]
    before = set(cluster.client.nthreads())
    cluster.add_worker()
    cluster.settle(3)
    (new,) = set(cluster.client.nthreads()) - before
    made = 0
    while not made and len(got) < NUM_BATCHES - 3:  # until the new worker made a batch
        got.append(_bytes(next(batches)))
        made = cluster.client.run(_batch_tasks_made, workers=[new])[new]
    cluster.remove_worker()
    cluster.settle(2)
    got += [_bytes(batch) for batch in batches]
    assert made >= 1
    assert got == reference
    loader.close()


def _batch_tasks_made(dask_worker) -> int:
    return dask_worker.state.executed_count


def test_dask_checkpoint_resumes_on_a_fresh_cluster_of_another_size(cluster, reference):
    """A state saved mid-epoch 0 on 2 workers continues exactly on a new 3-worker cluster."""
    loader = _loader(cluster.workers())
    batches = iter(loader)
    head = [_bytes(next(batches)) for _ in range(7)]
    state = loader.get_state()
    batches.close()
    loader.close()
    fresh = _loader(Workers(3, kind="dask"))  # a local cluster the loader owns
    fresh.set_state(state)
    try:
        assert head + [_bytes(batch) for batch in fresh] == reference
    finally:
        fresh.close()


@pytest.mark.parametrize("kind", KINDS)
def test_dask_scheduler_killed_mid_epoch_raises_worker_error_then_resumes(
    kind, reference, tmp_path
):
    """SIGKILL of the scheduler: a WorkerError naming the position; resumed exactly."""
    if kind == "cli":
        doomed = _dask.CliCluster(1)
        address, kill = doomed.address, doomed.kill_scheduler
    else:
        doomed = _LocalClusterProcess(tmp_path)
        address, kill = doomed.address, doomed.kill
    try:
        loader = _loader(Workers(kind="dask", options=DaskOptions(address=address)))
        batches = iter(loader)
        head = [_bytes(next(batches)) for _ in range(5)]
        kill()
        # A batch that had already arrived (the loop keeps one in flight; on a loaded
        # machine the kill takes a while) is handed out; the first one the scheduler
        # had to deliver raises.
        with pytest.raises(WorkerError) as info:
            while len(head) < NUM_BATCHES:
                head.append(_bytes(next(batches)))
        state = loader.get_state()
        loader.close()
    finally:
        doomed.close()
    assert f"Lost the Dask scheduler at {address}" in str(info.value)
    assert 5 <= len(head) < NUM_BATCHES
    assert info.value.position == len(head) * BATCH == state["offset"]
    fresh = _loader(Workers(kind="dask", options=DaskOptions(client=_dask.local())))
    fresh.set_state(state)
    assert head + [_bytes(batch) for batch in fresh] == reference
    fresh.close()


def test_dask_failing_map_fn_raises_the_record_error_of_the_calling_thread(cluster):
    """A map_fn raising on a worker is the RecordError (type, message, position) of 0 workers."""
    errors = []
    indexed = np.repeat(np.arange(NUM_RECORDS, dtype=np.float32)[:, None], 3, axis=1)
    for workers in (Workers(), cluster.workers()):  # record[0] is the record's index
        pipeline = resumeloader.Pipeline(indexed, seed=3).shuffle().map(fns.fail_at_index)
        loader = resumeloader.ResumableLoader.from_pipeline(
            pipeline.batch(BATCH), num_epochs=1, workers=workers
        )
        with pytest.raises(RecordError) as info:
            list(loader)
        errors.append((type(info.value), str(info.value), info.value.position, loader.position))
        loader.close()
    assert errors[0] == errors[1]
    assert errors[0][0] is RecordError and "raised ValueError" in errors[0][1]


def test_dask_on_error_skip_gives_the_replacements_and_log_lines_of_0_workers(cluster, tmp_path):
    """The bad-record policy on the cluster: the same batches and quarantine-log lines."""
    streams, logs = [], []
    for name, workers in (("serial", Workers()), ("dask", cluster.workers())):
        log = tmp_path / f"{name}.jsonl"
        pipeline = (
            resumeloader.Pipeline(fns.BadRecordSource(30, {2, 7, 11}), seed=0).shuffle()
            .on_error("skip", max_fraction=1.0, quarantine=str(log)).batch(4)
        )
        loader = resumeloader.ResumableLoader.from_pipeline(
            pipeline, num_epochs=2, workers=workers
        )
        streams.append([_bytes(batch) for batch in loader])
        loader.close()
        logs.append(log.read_text().splitlines())
    assert streams[0] == streams[1]
    assert logs[0] == logs[1] and len(logs[0]) == 6


def test_dask_worker_missing_a_module_raises_worker_error_naming_it(
    cluster, tmp_path, monkeypatch
):
    """A map_fn from a module the workers cannot import (here: only on this process's
    sys.path): a WorkerError naming the worker and the module, not a hang or a retry loop."""
    (tmp_path / "only_here_fns.py").write_text(
        "def double(record, rng):\n    return record * 2\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # after the cluster's workers started
    import only_here_fns

    pipeline = resumeloader.Pipeline(_DATA, seed=3).map(only_here_fns.double).batch(BATCH)
    loader = resumeloader.ResumableLoader.from_pipeline(
        pipeline, num_epochs=1, workers=cluster.workers()
    )
    with pytest.raises(WorkerError) as info:
        next(iter(loader))
    loader.close()
    monkeypatch.delitem(sys.modules, "only_here_fns")
    text = str(info.value)
    assert "Dask worker tcp://127.0.0.1:" in text and "could not rebuild" in text
    assert "only_here_fns" in text and info.value.position == 0


class _LocalClusterProcess:
    """A LocalCluster (2 process workers) in a process of its own, so that its scheduler
    can be SIGKILLed."""

    def __init__(self, folder: Path) -> None:
        script = Path(__file__).resolve().parents[1] / "scripts" / "dask_local_cluster.py"
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=open(folder / "cluster.log", "w"), text=True, env=_dask.env(),  # noqa: SIM115
            start_new_session=True,
        )
        line = self.proc.stdout.readline()  # bounded by the test's timeout
        self.address = line.split()[-1]

    def kill(self) -> None:
        self.children = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.kill()
        self.proc.wait(10)

    def close(self) -> None:
        for child in getattr(self, "children", []):
            with contextlib.suppress(psutil.Error):
                child.kill()
        _dask.kill_tree(self.proc)


@pytest.mark.slow
def test_dask_verify_keras_fit_killed_twice_reports_identical(cli_cluster, tmp_path, monkeypatch):
    """`resumeloader verify` on a Keras fit whose batches come from the cluster, SIGKILLed
    mid-epoch 0 and mid-epoch 1, reports IDENTICAL (batches and final weights).

    On the command-line cluster only (the session's, already running): the job sees only a
    scheduler address, so a LocalCluster behind the address (``_LocalClusterProcess``, a
    run of 4 processes, ~22 s on 2 cores, which this test also ran until 0.4) exercised the
    same code of the job; loaders reaching a LocalCluster by address are tested by
    ``test_dask_scheduler_killed_mid_epoch_raises_worker_error_then_resumes[local]``."""
    from resumeloader import cli
    from resumeloader.tools import harness as _harness

    script = Path(__file__).resolve().parents[1] / "scripts" / "keras_dask.py"
    monkeypatch.setenv("RESUMELOADER_TEST_DASK_ADDRESS", cli_cluster.address)
    reports = []
    harness = _harness.kill_and_restart

    def spy(command, **kwargs):
        reports.append(harness(command, **kwargs))
        return reports[-1]

    monkeypatch.setattr(_harness, "kill_and_restart", spy)
    argv = ["verify", "--workdir", str(tmp_path / "verify"), "--kill-at=step:4",
            "--kill-at=step:10", "--timeout", str(_limits.PROCESS), "--",
            sys.executable, str(script)]
    status = cli.main(argv)
    (report,) = reports
    assert status == 0, str(report)
    assert report.identical, str(report)
    assert (report.reference_steps, report.resumed_steps, report.processes) == (21, 21, 3)
    assert report.weights_identical is True


def test_dask_workers_counts_reach_the_loaders_stats():
    """Each Dask worker's stage counts travel back with its batches and add up exactly."""
    loader = _loader(_Local().workers())
    _ = [batch for batch in loader]
    stats = loader.stats()
    mapped = stats.stage("map_fn")
    assert mapped is not None and (mapped.batches, mapped.records_in) == (NUM_BATCHES,
                                                                          NUM_RECORDS * EPOCHS)
    assert all(w.name.startswith("Dask worker tcp://127.0.0.1:") for w in stats.workers)
    assert mapped.where.endswith("Dask workers") or mapped.where.startswith("Dask worker")
