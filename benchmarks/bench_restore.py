"""The first batch behind the model's restore: the exposed wait with and without start_prefetch.

    python benchmarks/bench_restore.py [--quick] [--rounds 5]

Prints one table and the target of issue 31 (item 6), met or missed (Markdown; also
written to results/bench_restore.json).

A training script restores the loader's position, then its model (here a sleep of
``--restore-seconds``, 1 s by default, standing in for the weights and the optimizer),
then asks for its first batch. The *exposed wait* is what that first ``next()`` of
``for batch in loader`` takes (the loop's start included): the time training waits for
data after the restore. Side by side, in interleaved rounds, on a fresh loader each
time: ``set_state`` then the restore then the loop, and ``set_state``,
``loader.start_prefetch()``, the restore, the loop. The pipeline: 100,000 in-memory
records, shuffled, a GIL-holding Python augmentation calibrated to 0.5 ms a record
(``_common.burn_python``), batches of 64 (~32 ms of work a batch), made by the calling
thread's prefetch (the default), 2 worker threads, or 2 worker processes (whose start
is part of the wait). Median and slowest of the rounds, ms.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import statistics
import time
from collections.abc import Callable
from typing import Any

import _common
import _results
import numpy as np
import tensorflow as tf
from _results import Column, Report, Table, Target

from resumeloader import Pipeline, ResumableLoader, Workers

BATCH = 64
RECORD_US = 500.0
WORKERS: dict[str, dict[str, Any]] = {
    "calling thread (prefetch 2)": {},
    "2 worker threads": {"workers": Workers(2, kind="thread")},
    "2 worker processes": {"workers": Workers(2, kind="process")},
}


def _loader(options: dict[str, Any]) -> ResumableLoader:
    data = np.arange(100_000 * 16, dtype=np.float32).reshape(100_000, 16)
    pipeline = Pipeline(data, seed=0).shuffle().map(_common.burn_python).batch(BATCH)
    return ResumableLoader.from_pipeline(pipeline, **options)


def exposed_wait(options: dict[str, Any], state: dict[str, Any], *, early: bool,
                 restore_seconds: float) -> float:
    """Seconds the first batch after a restore keeps training waiting."""
    with _loader(options) as loader:
        loader.set_state(state)
        if early:
            loader.start_prefetch()
        time.sleep(restore_seconds)  # the model's restore
        start = time.perf_counter()
        loop = iter(loader)
        next(loop)
        waited = time.perf_counter() - start
        loop.close()
    return waited


def run(quick: bool, rounds: int, restore_seconds: float) -> Report:
    if quick:
        rounds = min(rounds, 2)
    cost = _common.calibrate_burn(RECORD_US)
    start_load = _results.load_average()
    state = dict(_loader({}).get_state(), epoch=50, offset=64_000)
    work: dict[tuple[str, bool], Callable[[], float]] = {
        (name, early): (lambda o=options, e=early: exposed_wait(
            o, state, early=e, restore_seconds=restore_seconds))
        for name, options in WORKERS.items() for early in (False, True)
    }
    for options in WORKERS.values():  # warm up: imports, the first process start
        exposed_wait(options, state, early=False, restore_seconds=0.0)
    times: dict[tuple[str, bool], list[float]] = {key: [] for key in work}
    for _ in range(rounds):
        for key, measure in work.items():
            times[key].append(measure())
    table = Table(
        "first_batch", "The first batch after a restore", "bench_restore.py",
        f"Position epoch 50 + 64,000 records of 100,000, batch {BATCH}, a Python "
        f"augmentation of {cost:,.0f} us a record; a {restore_seconds:g} s model restore "
        "between set_state and the loop; the first next() of the loop (its start "
        f"included), median and slowest of {rounds} interleaved rounds.",
        [Column("workers", "made by"), Column("late", "without start_prefetch", ",.2f", " ms"),
         Column("early", "with start_prefetch", ",.2f", " ms"),
         Column("early_max", "with, slowest", ",.2f", " ms"),
         Column("ratio", "without / with", ",.0f", "x")],
        note=f"TensorFlow {tf.__version__}",
    )
    for name in WORKERS:
        late = statistics.median(times[(name, False)]) * 1e3
        early = statistics.median(times[(name, True)]) * 1e3
        table.add(workers=name, late=late, early=early,
                  early_max=max(times[(name, True)]) * 1e3, ratio=late / early)
    table.finish(start_load)
    default = table.row("calling thread (prefetch 2)")["early"]
    targets = [
        Target(f"first batch after a restore with a {restore_seconds:g} s model restore in "
               "between (start_prefetch, calling thread): exposed wait", default, 5,
               unit=" ms", at_most=True, item="31.6, tuning"),
    ]
    return Report([table], targets)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median kept)")
    parser.add_argument("--restore-seconds", type=float, default=1.0,
                        help="the model's restore, slept (default: %(default)s)")
    _common.add_json_option(parser)
    args = parser.parse_args(argv)
    timer = _results.Timer(_results.command_line(), args.quick)
    _common.finish(run(args.quick, args.rounds, args.restore_seconds), timer, args.json)


if __name__ == "__main__":
    main()
