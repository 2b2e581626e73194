"""Workers that live as long as the loader: first batch of a new iteration, and Keras fit.

    python benchmarks/bench_workers.py [--quick] [--rounds 3]

Prints two tables (Markdown; also written to results/bench_workers.json), each with the
load average and CPU count:

(a) First batch of a new iteration, ms: a loader over 1,280 records (16 float32
    each, 10 batches per epoch) with a GIL-bound ``map_fn`` (``_common.burn_python``,
    ~50 us of pure Python per record), batch 128. For each configuration the loader is
    built once, then (1) 7 epochs are read as Keras reads them, a new
    ``iter(epoch_dataset(loader))`` per epoch, each to its end, and (2) 7 times a
    ``for batch in loader`` takes one batch and breaks (leaving batches in flight),
    then the state is moved (``set_state``). The first iteration includes the
    workers' start-up; the median of iterations 2-7 is what every later iteration
    pays. This script imports TensorFlow at the top, like a training script: worker
    processes must not pay for it.
(b) Keras ``fit`` of 5 epochs of 20,000 records (a small dense model, so the input
    pipeline dominates) through ``epoch_dataset`` + ``ResumeCallback``: wall time from
    building the loader to the end of ``fit`` (start-up included), records/s, and the
    ratio to 0 workers. Configurations are interleaved round by round; medians.

Absolute numbers depend on the machine and its load; the ratios in one run are the
result.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import tensorflow  # noqa: F401 - imported at the top, like a training script

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
import _results
from _results import Column, Report, Table, Target

import resumeloader
from resumeloader import keras as rl_keras

CONFIGS = [(0, "thread"), (2, "thread"), (2, "process")]
BATCH = 128


def _name(workers: int, kind: str) -> str:
    return "0 workers" if workers == 0 else f"{workers} {kind} workers"


def _loader(records: np.ndarray, workers: int, kind: str) -> resumeloader.ResumableLoader:
    return resumeloader.ResumableLoader(
        records, batch_size=BATCH, seed=0, map_fn=_common.burn_python, num_epochs=None,
        workers=resumeloader.Workers(workers, kind=kind if workers else None),
    )


def first_batches(records: np.ndarray, workers: int, kind: str, iterations: int) -> dict:
    """Milliseconds to the first batch of each iteration: a new Keras-style epoch after
    the previous one was read to its end, and a for loop after a break and a restore."""
    loader = _loader(records[: BATCH * 10], workers, kind)  # short epochs: 10 batches
    epoch_ds = rl_keras.epoch_dataset(loader)
    timings: dict[str, list[float]] = {"epoch": [], "loop": []}
    for _ in range(iterations):
        start = time.perf_counter()
        iterator = iter(epoch_ds)
        next(iterator)
        timings["epoch"].append((time.perf_counter() - start) * 1000)
        loader.advance()
        for _ in iterator:
            loader.advance()
    for iteration in range(iterations):
        loader.set_state(dict(loader.get_state(), epoch=iteration, offset=BATCH * 3))
        start = time.perf_counter()
        for _ in loader:  # leaves batches in flight, as a `break` does
            break
        timings["loop"].append((time.perf_counter() - start) * 1000)
    loader.close()
    return timings


def fit_seconds(records: np.ndarray, labels: np.ndarray, workers: int, kind: str,
                epochs: int) -> tuple[float, float]:
    """Wall time and CPU time (`_common.cpu_seconds`: the process and its workers) of
    building the loader and a Keras fit of `epochs` epochs."""
    keras.utils.set_random_seed(0)
    cpu, start = _common.cpu_seconds(), time.perf_counter()
    loader = resumeloader.ResumableLoader(
        (records, labels), batch_size=BATCH, seed=0, num_epochs=epochs,
        map_fn=lambda record, rng: (_common.burn_python(record[0]), record[1]),
        workers=resumeloader.Workers(workers, kind=kind if workers else None),
    )
    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    with tempfile.TemporaryDirectory() as ckpt:
        callback = rl_keras.ResumeCallback(loader, ckpt, save_at_epoch_end=False)
        model.fit(rl_keras.epoch_dataset(loader), epochs=epochs, callbacks=[callback], verbose=0)
    loader.close()  # stops the worker processes: their time is counted
    return time.perf_counter() - start, _common.cpu_seconds() - cpu


def parallel_capacity(count: int = 20_000) -> float:
    """CPUs' worth of Python work two processes get now (2.0 on an idle 2-core machine):
    no 2-worker speed-up can exceed it."""
    import subprocess

    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
        f"import _common; print(_common.burn_for({count}))"
    )

    def timed(copies: int) -> float:
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True) for _ in range(copies)]
        return statistics.mean(float(p.communicate()[0]) for p in procs)

    return 2 * timed(1) / timed(2)


def run(quick: bool, rounds: int) -> Report:
    """Both tables and the targets of 2 process workers (issue 15, item 1)."""
    num_records = 4096 if quick else 20_000
    rounds = 1 if quick else rounds
    epochs = 5
    records = np.random.default_rng(0).random((num_records, 16), dtype=np.float32)
    labels = records.sum(axis=1, keepdims=True)

    start = _results.load_average()
    firsts = {c: first_batches(records, *c, iterations=7) for c in CONFIGS}
    first = Table(
        "first_batch", "(h) First batch of a new iteration, ms", "bench_workers.py",
        f"GIL-bound `map_fn`, batch {BATCH}; iteration 1 includes the workers' start-up.",
        [Column("workers", "workers"),
         Column("epoch_first", "new epoch (epoch_dataset): iteration 1", ".1f"),
         Column("epoch_later", "median of 2-7", ".1f"),
         Column("loop_first", "for loop after a break and a restore: iteration 1", ".1f"),
         Column("loop_later", "median of 2-7", ".1f")],
    )
    for config, t in firsts.items():
        first.add(workers=_name(*config), epoch_first=t["epoch"][0],
                  epoch_later=statistics.median(t["epoch"][1:]), loop_first=t["loop"][0],
                  loop_later=statistics.median(t["loop"][1:]))
    first.finish(start)

    start = _results.load_average()
    fits: dict[tuple[int, str], list[tuple[float, float]]] = {c: [] for c in CONFIGS}
    for _ in range(rounds):
        for config in CONFIGS:
            fits[config].append(fit_seconds(records, labels, *config, epochs=epochs))
    base = statistics.median(wall for wall, _ in fits[CONFIGS[0]])
    total = num_records * epochs
    fit = Table(
        "fit", f"(h) Keras fit, {epochs} epochs of {num_records:,} records", "bench_workers.py",
        f"Start-up included; parallel capacity {parallel_capacity():.2f}; median of {rounds} "
        "interleaved rounds.",
        [Column("workers", "workers"), Column("seconds", "seconds", ".2f"),
         Column("rate", "records/s", ",.0f"), _results.cpu_column(),
         Column("vs_zero", "vs 0 workers", ".2f", "x")],
    )
    for config, times in fits.items():
        seconds = statistics.median(wall for wall, _ in times)
        cpu = statistics.median(cpu for _, cpu in times)
        fit.add(workers=_name(*config), seconds=seconds, rate=total / seconds,
                cpu_us=cpu * 1e6 / total, vs_zero=base / seconds)
    fit.finish(start)
    processes = _name(2, "process")
    targets = [
        Target("(h) first batch of a new epoch after the first, 2 process workers",
               first.row(processes)["epoch_later"], 50, unit=" ms", at_most=True,
               item="15.1, workers"),
        Target("(h) Keras fit, 5 epochs: 2 process workers / 0 workers",
               fit.row(processes)["vs_zero"], 1.5, item="15.1, workers"),
    ]
    return Report([first, fit], targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer records and rounds")
    parser.add_argument("--rounds", type=int, default=3)
    _common.add_json_option(parser)
    args = parser.parse_args()
    timer = _results.Timer(_results.command_line(), args.quick)
    _common.finish(run(args.quick, args.rounds), timer, args.json)


if __name__ == "__main__":
    main()
