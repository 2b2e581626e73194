"""The Dask backend: a CPU-bound ``map_fn`` on 2 cores, its per-task cost, its first
batches, and its scaling on paper.

    python benchmarks/bench_dask.py [--quick]

(a) Records/s after 4 batches (cluster start-up excluded; median of interleaved rounds),
    batch 32, a GIL-bound ``map_fn`` of ~2 ms of pure Python per record (calibrated at
    the start): 0 workers, resumeloader's own 2 process workers, a Dask
    ``LocalCluster`` of 2 process workers (1 thread each; started once, shared by the
    rounds), plain tf.data ``map(numpy_function, AUTOTUNE)``.
(b) The cost of a batch task on the cluster: a 1-record batch, ``map_fn`` doing
    nothing, one task in flight (``window=1``: each a full round trip: submit, schedule,
    run, send back) and with the default window (2 per thread), against 0 workers; and
    the first batch of a new iteration of a loader on the running cluster, and of a new
    loader restored mid-epoch (``set_state``; the pipeline travels to the workers then),
    with (a)'s ``map_fn`` (one batch takes ~64 ms of work), each after a pause that lets
    the tasks still on the cluster finish and be forgotten (pure keys: a task still held
    would be reused, not made).
(c) Scaling on paper: a cluster of N thread workers in this process (``processes=False``,
    1 thread each) running a ``map_fn`` that sleeps 1 ms per record (the GIL is free
    while it sleeps: each thread stands for a remote CPU), 4 KiB records, batch 32.
    Throughput against N x one worker's, then the hand-out bound: the same cluster with
    a ``map_fn`` that does nothing, i.e. one process (the consumer, here also the
    scheduler) taking batches in task order, in records/s and MB/s; and the window
    (tasks in flight) the bound needs: the bound in tasks/s times one task's time.

The figures are for this machine and its load (printed); the ratios, measured in the
same run, are the result.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import _common  # noqa: E402
import _results  # noqa: E402
import numpy as np  # noqa: E402
from _common import SEED  # noqa: E402
from _results import Column, Report, Table, Target  # noqa: E402

BATCH = 32
RECORD_MS = 2.0
SLEEP_S = 0.001
PAUSE_S = 1.0
ZERO, OWN, DASK = ("resumeloader, 0 workers", "resumeloader, 2 process workers",
                   "resumeloader, Dask 2 process workers")
TF = "plain tf.data, `map(numpy_function, AUTOTUNE)`"


def sleep_record(record: np.ndarray, rng: Any = None) -> np.ndarray:
    """A ``map_fn`` of known cost that leaves the GIL free: sleeps SLEEP_S."""
    time.sleep(SLEEP_S)
    return record


def _cluster(workers: int, processes: bool) -> Any:
    from distributed import Client, LocalCluster

    # In-process workers talk to the scheduler in memory (inproc://); only the HTTP
    # servers listen, on 127.0.0.1 and ephemeral ports.
    network = {"host": "127.0.0.1", "scheduler_port": 0} if processes else {}
    # In-process workers share this process: each would compare the whole process's
    # memory (TensorFlow, the source) with its share of the machine's and pause at 80%
    # (16 workers here: 1.5 GiB each; paused workers run nothing and the loader waits).
    memory = {} if processes else {"memory_limit": 0}
    cluster = LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=processes,
        dashboard_address="127.0.0.1:0", worker_dashboard_address="127.0.0.1:0",
        silence_logs=logging.ERROR, **network, **memory,
    )
    client = Client(cluster, set_as_default=False)
    client.wait_for_workers(workers, timeout=120)
    return client


def _loader(source: Any, fn: Callable[..., Any], workers: Any, batch: int = BATCH) -> Any:
    import resumeloader

    return resumeloader.ResumableLoader(
        source, batch_size=batch, seed=SEED, map_fn=fn, workers=workers
    )


def _rate(source: Any, fn: Callable[..., Any], workers: Any, batch: int = BATCH,
          share: float = 1.0) -> float:
    made: list[Any] = []

    def make() -> Any:
        made.append(_loader(source, fn, workers, batch))
        return made[-1]

    try:
        return _common.steady_rate(make, share)
    finally:
        for loader in made:
            loader.close()


def _on(client: Any, **kwargs: Any) -> Any:
    """The `Workers` of the Dask cluster of `client`."""
    from resumeloader import DaskOptions, Workers

    return Workers(kind="dask", options=DaskOptions(client=client), **kwargs)


def cpu_bound(quick: bool, client: Any) -> tuple[Table, list[Target]]:
    from resumeloader import Workers

    rounds, records = (1, 2_000) if quick else (3, 8_000)
    start = _results.load_average()
    source = np.random.default_rng(1).random((records, 16), np.float32)
    capacity = _common.parallel_capacity()
    contenders = {
        ZERO: lambda: _rate(source, _common.burn_python, Workers()),
        OWN: lambda: _rate(source, _common.burn_python, Workers(2, kind="process")),
        DASK: lambda: _rate(source, _common.burn_python, _on(client)),
        TF: lambda: _common.steady_rate(lambda: _plain_tf(source)),
    }
    rates = _common.interleaved(contenders, rounds)
    table = Table(
        "dask_cpu", "(a) Dask process workers for a CPU-bound `map_fn`", "bench_dask.py",
        f"{records:,} records of 16 float32, batch {BATCH}, ~{RECORD_MS:g} ms of pure Python "
        f"per record; records/s after {_common.WARMUP_BATCHES} batches (start-up excluded), "
        f"median of {rounds} interleaved round(s). Parallel capacity: {capacity:.2f} CPUs.",
        [Column("pipeline", "pipeline"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(), Column("vs_zero", "/ 0 workers", ".2f"),
         Column("vs_own", "/ own 2 processes", ".2f")],
    )
    for name, rate in rates.items():
        table.add(pipeline=name, rate=rate, cpu_us=_common.cpu_us(name),
                  vs_zero=rate / rates[ZERO], vs_own=rate / rates[OWN])
    table.finish(start)
    targets = [
        Target("Dask: 2 process workers / 0 workers", rates[DASK] / rates[ZERO], 1.6,
               item="22.4, dask"),
        Target("Dask: 2 process workers / own 2 process workers", rates[DASK] / rates[OWN],
               0.85, item="22.4, dask", cpu_value=_common.cpu_ratio(DASK, OWN)),
    ]
    return table, targets


def _plain_tf(source: np.ndarray) -> Any:
    batch, _common.BATCH = _common.BATCH, BATCH
    try:
        return _common.plain_tf(source, _common.burn_python)
    finally:
        _common.BATCH = batch


def _seconds(action: Callable[[], Any], repeats: int, pause: float = 0.0) -> float:
    """The median time of `action()`, with `pause` seconds (untimed) before each."""
    times = []
    for _ in range(repeats):
        time.sleep(pause)
        begin = time.perf_counter()
        action()
        times.append(time.perf_counter() - begin)
    return float(np.median(times))


def costs(quick: bool, client: Any) -> tuple[Table, list[Target]]:
    from resumeloader import Workers

    start = _results.load_average()
    tiny = np.arange(4_000 * 4, dtype=np.float32).reshape(4_000, 4)
    per_task = {
        "0 workers": 1 / _rate(tiny, _common.identity, Workers(), 1, 0.5),
        "Dask, window=1 (a round trip per task)":
            1 / _rate(tiny, _common.identity, _on(client, window=1), 1,
                      0.5),
        "Dask, default window (2 per thread)":
            1 / _rate(tiny, _common.identity, _on(client), 1, 0.5),
    }
    source = np.random.default_rng(1).random((2_000, 16), np.float32)
    repeats = 3 if quick else 7
    workers = _on(client)
    running = _loader(source, _common.burn_python, workers)
    batches = iter(running)  # the pipeline travels to the workers with the first batch
    for _ in range(len(source) // BATCH // 2):
        next(batches)
    state = running.get_state()  # mid-epoch 0
    batches.close()
    # A pause before each: the tasks the last iteration had in flight finish and are
    # forgotten, so the first batch is made, not found (keys are pure: a task still on
    # the cluster would be reused).
    new_iteration = _seconds(lambda: next(iter(running)), repeats, PAUSE_S)

    def restored() -> None:
        loader = _loader(source, _common.burn_python, workers)
        loader.set_state(state)
        next(iter(loader))
        loader.close()

    after_restore = _seconds(restored, repeats, PAUSE_S)
    one_batch = _seconds(lambda: next(iter(_loader(source, _common.burn_python, Workers()))),
                         repeats)
    running.close()
    table = Table(
        "dask_costs", "(b) Dask: per-task cost and first batches", "bench_dask.py",
        "Per task: 1-record batches, `map_fn` doing nothing, seconds per batch in steady "
        "state; the overhead is the difference with 0 workers. First batches: batch "
        f"{BATCH} of (a)'s ~{RECORD_MS:g} ms/record `map_fn`, median of {repeats}.",
        [Column("what", "what"), Column("ms", "ms", ",.2f"),
         Column("overhead", "overhead vs 0 workers, ms", ",.2f")],
    )
    for name, seconds in per_task.items():
        table.add(what=f"one batch task: {name}", ms=seconds * 1e3,
                  overhead=(seconds - per_task["0 workers"]) * 1e3)
    table.add(what="first batch of a new iteration, running cluster", ms=new_iteration * 1e3,
              overhead=(new_iteration - one_batch) * 1e3)
    table.add(what="first batch after set_state, new loader, running cluster",
              ms=after_restore * 1e3, overhead=(after_restore - one_batch) * 1e3)
    table.add(what="first batch, 0 workers (reference)", ms=one_batch * 1e3, overhead=0.0)
    table.finish(start)
    targets = [
        Target("Dask: first batch after a restore, running cluster", after_restore, 1.0,
               unit=" s", at_most=True, item="22.4, dask"),
    ]
    return table, targets


def scaling(quick: bool) -> tuple[Table, list[Target]]:

    counts = (1, 2, 4, 8) if quick else (1, 2, 4, 8, 16, 32)
    share = 0.5 if quick else 1.0
    start = _results.load_average()
    source = np.zeros((20_000, 1024), np.float32)  # 4 KiB records
    record_bytes = source[0].nbytes
    rows: list[dict[str, Any]] = []
    for count in counts:
        client = _cluster(count, processes=False)
        try:
            workers = _on(client)
            rate = _rate(source, sleep_record, workers, share=share)
            cpu = _common.LAST_CPU_US
            bound = _rate(source, _common.identity, workers, share=share)
        finally:
            client.cluster.close()
            client.close()
        rows.append({"workers": count, "rate": rate, "cpu_us": cpu, "bound": bound})
    single = rows[0]["rate"]
    bound = max(row["bound"] for row in rows)
    task_seconds = BATCH * SLEEP_S
    window = bound / BATCH * task_seconds
    table = Table(
        "dask_scaling", "(c) Dask: scaling on paper, and the hand-out bound", "bench_dask.py",
        f"N thread workers in this process, `map_fn` sleeping {SLEEP_S * 1e3:g} ms per record "
        f"({record_bytes // 1024} KiB records, batch {BATCH}: {task_seconds * 1e3:g} ms per "
        "task), default window (2 per thread); records/s after "
        f"{_common.WARMUP_BATCHES} batches. Hand-out: the same cluster, `map_fn` doing "
        f"nothing. Best hand-out bound {bound:,.0f} records/s = "
        f"{bound * record_bytes / 1e6:,.0f} MB/s, reached with >= {bound / single:,.1f} such "
        f"workers; it needs a window of >= {window:,.1f} tasks in flight (bound in tasks/s x "
        "one task's time).",
        [Column("workers", "workers"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(), Column("linear", "/ (N x 1 worker)", ".2f"),
         Column("mb", "MB/s", ",.1f"),
         Column("bound", "hand-out, records/s", ",.0f"),
         Column("bound_mb", "hand-out, MB/s", ",.0f")],
    )
    for row in rows:
        table.add(workers=row["workers"], rate=row["rate"], cpu_us=row["cpu_us"],
                  linear=row["rate"] / (row["workers"] * single),
                  mb=row["rate"] * record_bytes / 1e6, bound=row["bound"],
                  bound_mb=row["bound"] * record_bytes / 1e6)
    table.finish(start)
    below = [row for row in rows if row["workers"] * single <= 0.8 * bound]
    worst = min(row["rate"] / (row["workers"] * single) for row in below) if below else None
    targets = [
        Target("Dask simulated scaling: worst / linear, below the hand-out bound", worst, 0.8,
               item="22.4, dask"),
    ]
    return table, targets


def run(quick: bool) -> Report:
    """The tables and their targets."""
    calibrated = _common.calibrate_burn(RECORD_MS * 1e3)  # before any worker starts
    print(f"  map_fn: {calibrated / 1e3:.2f} ms per record", file=sys.stderr, flush=True)
    client = _cluster(2, processes=True)
    try:
        cpu, cpu_targets = cpu_bound(quick, client)
        cost, cost_targets = costs(quick, client)
    finally:
        client.cluster.close()
        client.close()
    scale, scale_targets = scaling(quick)
    return Report([cpu, cost, scale], [*cpu_targets, *cost_targets, *scale_targets])


def main() -> None:
    _common.script_main(run, __doc__, "smaller sources, one round, fewer workers")


if __name__ == "__main__":
    main()
