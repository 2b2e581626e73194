"""Workers for a Python ``map_fn``: resumeloader's threads and processes, tf.data and grain.

    python benchmarks/bench_workers.py [--quick]

(g) Steady state, records/s after 4 batches (median of interleaved rounds), batch 128:
    (ii) a GIL-bound ``map_fn`` (~50 us of pure Python per record) and (iii) a
    GIL-releasing NumPy one (64x64 matrix products), each with 0 workers, 2 thread
    and 2 process workers, plain tf.data (``numpy_function`` in ``map(AUTOTUNE)``)
    and grain's ``DataLoader`` with 0 and 2 worker processes (``num_threads=0``).
(h) Start-up: ms to the first batch of the first, second and third iteration of one
    loader with 2 process workers, and a Keras ``fit`` of 5 short epochs (start-up
    included) with 0 and 2 process workers, run as a user's training script that
    imports TensorFlow at the top.

"Parallel capacity" (printed) is how many CPUs' worth of Python two processes got
during the run (2.0 on an idle 2-core machine): no 2-worker speed-up can exceed it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
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
import numpy as np  # noqa: E402
from _common import BATCH, SEED, Target  # noqa: E402

ZERO, PROCESSES = "resumeloader, 0 workers", "resumeloader, 2 process workers"
GRAIN_TWO = "grain `DataLoader`, 2 workers"
EXIT_PROBLEMS: list[str] = []  # training processes that had to be killed


def _ours(source: np.ndarray, fn: Callable[..., object], workers: int = 0,
          kind: str = "thread") -> Callable[[], float]:
    import resumeloader

    return lambda: _common.steady_rate(lambda: resumeloader.ResumableLoader(
        source, batch_size=BATCH, seed=SEED, map_fn=fn, num_workers=workers, worker_type=kind
    ))


def _workload(source: np.ndarray, fn: Callable[..., object], operation: str,
              rounds: int) -> dict[str, float]:
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
    return _common.interleaved(contenders, rounds)


def steady(quick: bool) -> tuple[str, list[Target]]:
    rounds, records = (1, 4_000) if quick else (3, 20_000)
    span = _common.Span()
    capacity = [_common.parallel_capacity()]
    small = np.random.default_rng(1).random((records, 16), np.float32)
    mats = np.random.default_rng(2).random((records // 4, 64, 64), np.float32)
    gil_us = _common.calibrate_burn()
    numpy_us = _common.per_call_us(_common.numpy_work, mats[0], 500)
    workloads = {
        f"(ii) GIL-bound `map_fn` (~{gil_us:.0f} us)": _workload(
            small, _common.burn_python, "BurnPython", rounds),
        f"(iii) GIL-releasing NumPy `map_fn` (~{numpy_us:.0f} us)": _workload(
            mats, _common.numpy_work, "NumpyWork", rounds),
    }
    capacity.append(_common.parallel_capacity())
    rows = []
    for workload, rates in workloads.items():
        first = rates[ZERO]
        rows += [[workload, name, f"{rate:,.0f}", f"{rate / first:.2f}"]
                 for name, rate in rates.items()]
    text = "\n".join([
        "### (g) Workers for a Python `map_fn`, steady state (`bench_workers.py`)",
        "",
        f"{records:,} records per source, batch {BATCH}; records/s after "
        f"{_common.WARMUP_BATCHES} batches (worker start-up excluded), median of {rounds} "
        "interleaved round(s). Parallel capacity (before, after): "
        f"{capacity[0]:.2f}, {capacity[1]:.2f} CPUs.",
        "",
        _common.table(["workload", "pipeline", "records/s", "/ 0 workers"], rows),
        "",
        span.caption("Workers"),
    ])
    gil = next(iter(workloads.values()))
    targets = [
        Target("(g) GIL-bound: 2 process workers / 0 workers", gil[PROCESSES] / gil[ZERO], 1.8,
               item="1 (workers)"),
        Target("(g) GIL-bound: 2 process workers / grain 2 workers",
               gil[PROCESSES] / gil[GRAIN_TWO], 1.3, item="1 (workers)"),
    ]
    return text, targets


def first_batches(rounds: int) -> list[float]:
    """Median ms to the first batch of iterations 1, 2 and 3 of one 2-process loader."""
    import resumeloader

    source = np.random.default_rng(1).random((4_000, 16), np.float32)
    times: list[list[float]] = [[], [], []]
    for _ in range(rounds):
        loader = resumeloader.ResumableLoader(source, batch_size=BATCH, seed=SEED,
                                              map_fn=_common.burn_python, num_workers=2,
                                              worker_type="process")
        for column in times:
            start = time.perf_counter()
            next(iter(loader.dataset(rest_of_epoch=True)))
            column.append((time.perf_counter() - start) * 1e3)
        del loader
    return [statistics.median(column) for column in times]


# A user's training script: TensorFlow imported at the top, which spawned workers run
# again when they import the main module (unless the library keeps them from it).
_KERAS_SCRIPT = """
import sys, tempfile, time
import tensorflow as tf
import keras
import numpy as np
import resumeloader
from resumeloader.keras import ResumeCallback, epoch_dataset

sys.path.insert(0, {here!r})
import _common

if __name__ == "__main__":
    workers, records = int(sys.argv[1]), int(sys.argv[2])
    data = np.random.default_rng(1).random((records, 16), np.float32)
    start = time.perf_counter()
    loader = resumeloader.ResumableLoader(
        (data, data[:, 0].copy()), batch_size=_common.BATCH, seed=0, num_epochs=5,
        map_fn=_common.burn_pair, num_workers=workers, worker_type="process")
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    callback = ResumeCallback(loader, tempfile.mkdtemp())
    model.fit(epoch_dataset(loader), epochs=5, callbacks=[callback], verbose=0)
    print(time.perf_counter() - start)
"""


def keras_fit_rate(workers: int, records: int, script: Path, timeout: float) -> float:
    """Records/s of the whole `fit` in a fresh process (0.0 if it does not finish within
    `timeout` s). A process still alive 10 s after printing its time is killed and
    reported on stderr: the measurement stands, the exit is a bug of its own."""
    out = script.with_name(f"fit{workers}.out")
    with out.open("w") as stdout:
        process = subprocess.Popen([sys.executable, str(script), str(workers), str(records)],
                                   stdout=stdout, stderr=subprocess.DEVNULL)
    deadline, printed = time.monotonic() + timeout, None
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
        if printed is None and out.read_text().strip():
            printed = time.monotonic()
            deadline = min(deadline, printed + 10)
    if process.poll() is None:
        process.kill()
        process.wait()
        what = "did not exit 10 s after fit" if printed else f"no result within {timeout:.0f} s"
        EXIT_PROBLEMS.append(f"Keras fit with {workers} process workers: {what}, killed.")
        print(f"  {EXIT_PROBLEMS[-1]}", file=sys.stderr, flush=True)
    lines = out.read_text().split()
    return 5 * records / float(lines[-1]) if lines else 0.0


def run(quick: bool) -> _common.Report:
    """The tables' Markdown and their targets."""
    text, targets = steady(quick)  # calibrates burn_python for the Keras runs too
    rounds, records, timeout = (1, 4_000, 300) if quick else (3, 20_000, 900)
    span = _common.Span()
    first = first_batches(rounds)
    script = Path(tempfile.mkdtemp(prefix="bench_workers_")) / "train.py"
    script.write_text(_KERAS_SCRIPT.format(here=str(HERE)))
    fits = _common.interleaved(
        {w: (lambda w=w: keras_fit_rate(w, records, script, timeout)) for w in (0, 2)}, rounds
    )
    rows = [[f"first batch of iteration {i + 1} (`dataset(rest_of_epoch=True)`)",
             f"{ms:,.1f} ms"] for i, ms in enumerate(first)]
    rows += [[f"Keras `fit`, 5 epochs of {records:,} records, {w} process workers",
              f"{rate:,.0f} records/s" if rate else f"over {timeout} s"]
             for w, rate in fits.items()]
    text += "\n\n" + "\n".join([
        "### (h) Worker start-up (`bench_workers.py`)",
        "",
        f"2 process workers, GIL-bound `map_fn`, batch {BATCH}; medians of {rounds} "
        "round(s). The Keras rows run a training script that imports TensorFlow at the "
        "top; its time starts before the loader is built and includes every epoch's "
        "start-up.",
        "",
        _common.table(["what", "measured"], rows),
        "",
        *(f"**{problem}**" for problem in sorted(set(EXIT_PROBLEMS))),
        "",
        span.caption("Worker start-up"),
    ])
    targets += [
        Target("(h) first batch of the 2nd iteration, 2 process workers", first[1], 50,
               unit=" ms", at_most=True, item="1 (workers)"),
        Target("(h) Keras fit, 5 epochs: 2 process workers / 0 workers",
               fits[2] / fits[0] if fits[0] else None, 1.5, item="1 (workers)"),
    ]
    return _common.Report(text, targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one round")
    quick = parser.parse_args().quick
    _common.BUDGET_SECONDS = 1.0 if quick else _common.BUDGET_SECONDS
    report = run(quick)
    print(report.markdown)
    print()
    print(_common.targets_table(report.targets))


if __name__ == "__main__":
    main()
