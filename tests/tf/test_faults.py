"""Faults from outside, in real subprocesses: kills, Ctrl-C on a stalled job, a script
without a ``__main__`` guard. The job (scripts/fault_job.py) imports TensorFlow at the
top, has no guard, and defines its map_fn and source in ``__main__``.

Each test is bounded: a job that hangs fails the test (the bounds, tests/_limits.py, are
far above the expected times, which benchmarks/faults.py measures).
"""

from __future__ import annotations

import os
import signal

import _faults
import _limits
import pytest

pytestmark = pytest.mark.slow

CTRL_C_CASES = [
    ("--workers", "0", "--prefetch", "2", "--stall", "source"),
    ("--workers", "2", "--worker-type", "thread", "--stall", "map"),
    ("--workers", "2", "--worker-type", "process", "--stall", "map"),
    # A local Dask cluster (2 worker processes, each a nanny and its worker).
    ("--workers", "2", "--worker-type", "dask", "--stall", "map"),
]
CTRL_C_IDS = [
    "0-workers-prefetch-thread-source-stall", "2-threads-map-stall", "2-processes-map-stall",
    "dask-map-stall",
]


def test_process_group_sigkill_leaves_nothing_and_resumes_exactly(tmp_path):
    """SIGKILL of the whole job (parent and workers): no process, no /dev/shm entry left;
    the restarted job consumes exactly the uninterrupted stream."""
    options = ("--record-floats", "65536")  # 2 MiB batches through shared memory
    job = _faults.Job(tmp_path, *options, "--step-seconds", "0.05")
    job.wait_for("batch 5")
    pids = job.pids()
    job.signal_group(signal.SIGKILL)
    outcome = job.finish(pids)
    resumed = _faults.resume(tmp_path, *options)
    assert len(pids) == 3
    assert (outcome.processes_left, outcome.shm_left) == ([], {}), outcome.where
    assert resumed.returncode == 0
    assert _faults.records(tmp_path) == _faults.reference()


@pytest.mark.parametrize("options", CTRL_C_CASES, ids=CTRL_C_IDS)
def test_ctrl_c_on_stalled_job_exits(tmp_path, options):
    """One SIGINT to the job's process group while the map_fn or source stalls for an
    hour: every process of the job exits (bounded wait: `_limits.EXIT`)."""
    job = _faults.Job(tmp_path, *options)
    job.wait_for("stalling")
    job.stuck()
    pids = job.pids()
    job.signal_group(signal.SIGINT)
    outcome = job.finish(pids)
    assert outcome.processes_left == [], outcome.where
    assert outcome.returncode == -signal.SIGINT  # KeyboardInterrupt, not a hang or a crash
    assert outcome.shm_left == {}


@pytest.mark.parametrize(
    "options",
    [
        ("--workers", "0", "--prefetch", "2", "--stall", "source"),
        ("--workers", "2", "--worker-type", "thread", "--prefetch", "0", "--stall", "map"),
    ],
    ids=["main-thread-waits-for-prefetch-thread", "main-thread-waits-for-worker-thread"],
)
def test_ctrl_c_handled_while_main_thread_blocks_in_its_wait_exits(tmp_path, options):
    """A SIGINT whose C handler runs while the main thread is already blocked waiting for
    the stalled thread (here it runs in that thread; in a terminal it lands just before
    the wait blocks): KeyboardInterrupt all the same, every process exits (bounded
    wait: `_limits.EXIT`)."""
    job = _faults.Job(tmp_path, *options, "--sigint-from-stall")
    job.wait_for("stalling")
    outcome = job.finish(job.pids())
    assert outcome.processes_left == [], outcome.where
    assert outcome.returncode == -signal.SIGINT


@pytest.mark.parametrize("lost", [False, True], ids=["sigint", "lost-in-gc-callback"])
def test_ctrl_c_mid_epoch_of_dataset_on_local_dask_cluster_exits(tmp_path, lost):
    """One SIGINT to the process group of a job iterating ``dataset()`` on a local Dask
    cluster, between batches: the job and its cluster's processes all exit (bounded
    wait: `_limits.EXIT`). Also when the Ctrl-C is lost in the main thread: its
    KeyboardInterrupt raised in a gc callback (a SIGINT arriving while the main thread
    collects), which CPython only reports; the job ran on to its end and exited 0."""
    options = ("--workers", "2", "--worker-type", "dask", "--consume", "dataset")
    ready = tmp_path / "ready"
    press = ("--press-in-gc-callback", str(ready)) if lost else ()
    job = _faults.Job(tmp_path, *options, "--step-seconds", "0.05", *press)
    job.wait_for("batch 5")
    pids = job.pids()
    if lost:
        ready.touch()  # the job presses once it has its processes counted
    else:
        job.signal_group(signal.SIGINT)
    outcome = job.finish(pids)
    assert len(pids) >= 5  # the job, 2 nannies and their 2 worker processes
    assert outcome.processes_left == [], outcome.where
    assert outcome.returncode == -signal.SIGINT
    assert ("pressing" in outcome.output) == lost


def test_parent_sigkill_during_stalled_map_fn_workers_exit(tmp_path):
    """SIGKILL of the parent alone while a worker sits in an hour-long map_fn: the
    workers exit on their own (bounded wait: `_limits.EXIT`, far below the stall)."""
    job = _faults.Job(tmp_path, "--stall", "map")
    job.wait_for("stalling")
    pids = job.pids()
    os.kill(job.proc.pid, signal.SIGKILL)
    outcome = job.finish(pids)
    assert len(pids) == 3
    assert outcome.processes_left == [], outcome.where
    assert outcome.shm_left == {}


@pytest.mark.parametrize("stdin_script", [False, True], ids=["script-file", "python-stdin"])
def test_script_without_main_guard_runs_once_with_process_workers(tmp_path, stdin_script):
    """A script with no __main__ guard that imports TensorFlow at the top, its map_fn in
    __main__, runs once with 2 process workers and yields the exact stream; the workers
    import neither the script nor TensorFlow."""
    job = _faults.Job(tmp_path, "--tf-flag", stdin_script=stdin_script)
    done = job.wait_for("done", timeout=_limits.PROCESS)
    outcome = job.finish([job.proc.pid])
    assert outcome.returncode == 0
    assert [line for line in outcome.output if line.startswith("start")] == [
        f"start {job.proc.pid}"
    ]
    assert "workers that imported TensorFlow: 0" in done
    assert _faults.records(tmp_path) == _faults.reference()
