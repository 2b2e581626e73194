"""A Python ``map_fn`` in steady state: resumeloader's workers against tf.data and grain.

    python benchmarks/bench_map_fn.py [--quick]

(g) Records/s after 4 batches (worker start-up excluded; median of interleaved rounds),
    batch 128: (ii) a GIL-bound ``map_fn`` (~50 us of pure Python per record,
    calibrated at the start) and (iii) a GIL-releasing NumPy one (64x64 matrix
    products), each with 0 workers, 2 thread and 2 process workers, plain tf.data
    (``numpy_function`` in ``map(AUTOTUNE)``) and grain's ``DataLoader`` with 0 and 2
    worker processes (``num_threads=0``).

Worker start-up, each new iteration's first batch and a Keras ``fit`` are measured by
bench_workers.py. "Parallel capacity" (printed) is how many CPUs' worth of Python two
processes got during the run (2.0 on an idle 2-core machine): no 2-worker speed-up can
exceed it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Single-threaded BLAS everywhere (worker processes inherit it), so that the workers are
# the only parallelism compared.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import _common  # noqa: E402
import _results  # noqa: E402
import numpy as np  # noqa: E402
from _common import BATCH, SEED  # noqa: E402
from _results import Column, Report, Table, Target  # noqa: E402

ZERO, PROCESSES = "resumeloader, 0 workers", "resumeloader, 2 process workers"
GRAIN_TWO = "grain `DataLoader`, 2 workers"
# The hand-picked settings the autotune and profile tables compare against.
HAND_PICKED = ("0 workers", "2 thread workers", "2 process workers")


def _ours(source: np.ndarray, fn: Callable[..., object], workers: int = 0,
          kind: str = "thread", warm_seconds: float = 0.0) -> Callable[[], float]:
    import resumeloader

    return lambda: _common.steady_rate(lambda: resumeloader.ResumableLoader(
        source, batch_size=BATCH, seed=SEED, map_fn=fn,
        workers=resumeloader.Workers(workers, kind=kind if workers else None),
    ), warm_seconds=warm_seconds)


def hand_picked(source: np.ndarray, fn: Callable[..., object],
                warm_seconds: float = 0.0) -> dict[str, Callable[[], float]]:
    """`HAND_PICKED`'s contenders: `fn` in 0 workers, 2 threads and 2 processes, each
    measured after `warm_seconds` of batches."""
    return {HAND_PICKED[0]: _ours(source, fn, warm_seconds=warm_seconds),
            HAND_PICKED[1]: _ours(source, fn, 2, warm_seconds=warm_seconds),
            HAND_PICKED[2]: _ours(source, fn, 2, "process", warm_seconds=warm_seconds)}


def _workload(source: np.ndarray, fn: Callable[..., object], operation: str,
              rounds: int) -> tuple[dict[str, float], dict[str, float | None]]:
    """Records/s and CPU us per record of each contender, medians of interleaved rounds."""
    import _grain_ops

    contenders = {
        ZERO: _ours(source, fn),
        "resumeloader, 2 thread workers": _ours(source, fn, 2),
        PROCESSES: _ours(source, fn, 2, "process"),
        "plain tf.data, `map(numpy_function, AUTOTUNE)`": lambda: _common.steady_rate(
            lambda: _common.plain_tf(source, fn)
        ),
        "grain `DataLoader`, 0 workers": lambda: _common.steady_rate(
            lambda: _common.grain_loader(source, getattr(_grain_ops, operation)())
        ),
        GRAIN_TWO: lambda: _common.steady_rate(
            lambda: _common.grain_loader(source, getattr(_grain_ops, operation)(), 2)
        ),
    }
    rates = _common.interleaved(contenders, rounds)
    return rates, {name: _common.cpu_us(name) for name in contenders}


def steady(quick: bool) -> tuple[Table, list[Target]]:
    rounds, records = (1, 4_000) if quick else (3, 20_000)
    start = _results.load_average()
    capacity = [_common.parallel_capacity()]
    small = np.random.default_rng(1).random((records, 16), np.float32)
    mats = np.random.default_rng(2).random((records // 4, 64, 64), np.float32)
    gil_us = _common.calibrate_burn()
    numpy_us = _common.per_call_us(_common.numpy_work, mats[0], 500)
    # Named without their measured cost (its own column): `compare_runs.py` pairs the
    # rows of two runs by their names.
    costs = {"(ii) GIL-bound `map_fn`": gil_us, "(iii) GIL-releasing NumPy `map_fn`": numpy_us}
    workloads = {
        "(ii) GIL-bound `map_fn`": _workload(small, _common.burn_python, "BurnPython", rounds),
        "(iii) GIL-releasing NumPy `map_fn`": _workload(
            mats, _common.numpy_work, "NumpyWork", rounds),
    }
    capacity.append(_common.parallel_capacity())
    table = Table(
        "map_fn", "(g) Workers for a Python `map_fn`, steady state", "bench_map_fn.py",
        f"{records:,} records per source, batch {BATCH}; records/s after "
        f"{_common.WARMUP_BATCHES} batches (worker start-up excluded), median of {rounds} "
        "interleaved round(s); 'map_fn us' is one call's time, measured alone. Parallel "
        "capacity (before, after): "
        f"{capacity[0]:.2f}, {capacity[1]:.2f} CPUs.",
        [Column("workload", "workload"), Column("fn_us", "map_fn us", ",.1f"),
         Column("pipeline", "pipeline"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(), Column("vs_zero", "/ 0 workers", ".2f")],
    )
    for workload, (rates, cpus) in workloads.items():
        for name, rate in rates.items():
            table.add(workload=workload, fn_us=costs[workload], pipeline=name, rate=rate,
                      cpu_us=cpus[name], vs_zero=rate / rates[ZERO])
    table.finish(start)
    gil, gil_cpu = next(iter(workloads.values()))

    def cpu_ratio(name: str, reference: str) -> float | None:
        ours, theirs = gil_cpu[name], gil_cpu[reference]
        return None if not ours or theirs is None else theirs / ours

    targets = [
        # Workers are for wall time: 2 processes spend more CPU, not less, so this target
        # has no CPU form.
        Target("(g) GIL-bound: 2 process workers / 0 workers", gil[PROCESSES] / gil[ZERO], 1.8,
               item="15.1, workers"),
        Target("(g) GIL-bound: 2 process workers / grain 2 workers",
               gil[PROCESSES] / gil[GRAIN_TWO], 1.3, item="15.1, workers",
               cpu_value=cpu_ratio(PROCESSES, GRAIN_TWO)),
    ]
    return table, targets


def run(quick: bool) -> Report:
    """The table and its targets."""
    table, targets = steady(quick)
    return Report([table], targets)


def main() -> None:
    _common.script_main(run, __doc__, "smaller sizes, one round")


if __name__ == "__main__":
    main()
