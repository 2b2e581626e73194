"""The run's data history: lineage lookups, restore and state size with 16 amendments.

    python benchmarks/bench_history.py [--quick] [--rounds 5]

Prints three tables and the targets of issue 23, met or missed (Markdown; also written
to results/bench_history.json):

(a) ``records_at`` of one step, ms: a mixture of 10**10 records (virtual sources
    "web" 6*10**9 and "code" 4*10**9, and "math" 10**9 added by an amendment; each
    shuffled), batch 256, 16 amendments (8 mixture changes: new weights, a source
    added, one removed and brought back; 8 skips) spread over the first 10**12
    positions; lookups of random steps in that range (every amendment in the past of
    most of them). Side by side, in interleaved rounds: the same lookups on the mixture
    without amendments (what the history costs), and the physical reference: the
    precomputed index log OLMo-style runs keep (one int64 per record written at
    training time, here of one region of 2**14 steps), read at a random step from a
    memory-mapped file (what a lookup costs that stores the whole past). Median and
    99th percentile over all lookups; the target is on the median (the 99th
    percentile of a shared machine is its scheduler's).
(b) Restore to the first batch with 16 amendments in the past (an in-memory mixture of
    700,000 + 300,000 records, batch 128, position 5 * 10**7): ``set_state`` +
    the first batch of ``for batch in loader``, and ``tf.train.Checkpoint.read`` + the
    first batch; against the same loader without amendments. Median of the rounds.
(c) The state's JSON size, with and without the 16 amendments.

Absolute numbers depend on the machine and its load (printed); the ratios, measured in
the same run, are the result.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import _common
import _results
import numpy as np
import tensorflow as tf
from _results import Column, Report, Table, Target

import resumeloader

BATCH = 256
SEED = 0
HORIZON = 10**12  # positions over which the amendments and the looked-up steps lie


def amended(pipeline: resumeloader.Pipeline, extra: Any, span: int) -> resumeloader.Pipeline:
    """`pipeline` with 16 amendments over `span` positions (8 changes, 8 skips)."""
    step = span // 16
    plan = [
        {"web": 1, "code": 1}, {"web": 1, "code": 1, "math": 1}, {"web": 2, "code": 0, "math": 1},
        {"web": 1, "code": 3, "math": 1}, {"web": 3, "code": 1, "math": 0},
        {"web": 1, "code": 1, "math": 1}, {"web": 5, "code": 2, "math": 3},
        {"web": 7, "code": 3, "math": 0},
    ]
    for k, weights in enumerate(plan):
        at = (2 * k + 1) * step
        pipeline = pipeline.amend(at, weights=weights, add={"math": extra} if k == 1 else None)
        skip = (2 * k + 2) * step - 100 * BATCH
        pipeline = pipeline.skip(skip - skip % BATCH, skip - skip % BATCH + 50 * BATCH)
    return pipeline


def _virtual() -> tuple[resumeloader.Pipeline, Any]:
    sources = {"web": _common.RangeSource(6 * 10**9), "code": _common.RangeSource(4 * 10**9)}
    base = resumeloader.Pipeline.mix(sources, weights={"web": 0.7, "code": 0.3}, seed=SEED,
                                     records_per_epoch=10**10)
    return base, _common.RangeSource(10**9)


def lookups(quick: bool, rounds: int, workdir: Path) -> dict[str, list[float]]:
    """Seconds per lookup of one random step, per contender."""
    base, extra = _virtual()
    loaders = {
        "records_at, 16 amendments": resumeloader.ResumableLoader.from_pipeline(
            amended(base, extra, HORIZON).batch(BATCH)),
        "records_at, no amendment": resumeloader.ResumableLoader.from_pipeline(base.batch(BATCH)),
    }
    log_steps = 1 << 14
    log = np.lib.format.open_memmap(
        workdir / "index-log.npy", mode="w+", dtype=np.int64, shape=(log_steps, BATCH)
    )
    log[:] = np.arange(log_steps * BATCH, dtype=np.int64).reshape(log_steps, BATCH)
    log.flush()
    reader = np.load(workdir / "index-log.npy", mmap_mode="r")
    per_round = 50 if quick else 400
    rng = random.Random(1)
    work: dict[str, Callable[[int], Any]] = {
        name: (lambda step, loader=loader: loader.records_at(step))
        for name, loader in loaders.items()
    }
    work["reference: a logged index file, one step read (mmap)"] = lambda step: (
        reader[step % log_steps].tolist()
    )
    for loader in loaders.values():  # warm up (quota tables, caches)
        loader.records_at(1)
    times: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(rounds):
        steps = [rng.randrange(HORIZON // BATCH) for _ in range(per_round)]
        for name, lookup in work.items():
            for step in steps:
                start = time.perf_counter()
                lookup(step)
                times[name].append(time.perf_counter() - start)
    return times


def _in_memory(history: bool) -> resumeloader.ResumableLoader:
    sources = {"web": np.arange(700_000, dtype=np.int64),
               "code": np.arange(300_000, dtype=np.int64) + 10**6}
    pipeline = resumeloader.Pipeline.mix(sources, weights={"web": 0.7, "code": 0.3}, seed=SEED,
                                         records_per_epoch=10**6)
    if history:
        pipeline = amended(pipeline, np.arange(50_000, dtype=np.int64) + 2 * 10**6, 5 * 10**7)
    return resumeloader.ResumableLoader.from_pipeline(pipeline.batch(128))


def restore_times(rounds: int, workdir: Path) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Seconds from a restore to the first batch; the states' sizes in bytes."""
    work: dict[str, Callable[[], Any]] = {}
    sizes = {}
    for history in (True, False):
        loader = _in_memory(history)
        next(iter(loader))  # warm up
        state = dict(loader.get_state(), epoch=50, offset=0)  # position 5 * 10**7
        loader.set_state(state)
        sizes["16 amendments" if history else "no amendment"] = len(loader.serialize())
        path = tf.train.Checkpoint(loader=loader).write(str(workdir / f"h{int(history)}"))
        checkpoint = tf.train.Checkpoint(loader=loader)
        label = "16 amendments" if history else "no amendment (reference)"
        work[f"set_state + first batch, {label}"] = lambda loader=loader, state=state: (
            loader.set_state(state), next(iter(loader)))
        work[f"Checkpoint.read + first batch, {label}"] = lambda c=checkpoint, p=path, lo=loader: (
            c.read(p), next(iter(lo)))
    times: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(rounds):
        for name, run in work.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times, sizes


def run(quick: bool, rounds: int) -> Report:
    """The three tables and the targets of issue 23."""
    if quick:
        rounds = min(rounds, 3)
    start = _results.load_average()
    with tempfile.TemporaryDirectory(prefix="bench_history_") as workdir:
        looked = lookups(quick, rounds, Path(workdir))
        restored, sizes = restore_times(rounds + 2, Path(workdir))
    reference = statistics.median(looked["reference: a logged index file, one step read (mmap)"])
    lineage = Table(
        "records_at", "Lineage: the records of one step", "bench_history.py",
        f"Random steps of a 10**10-record mixture, batch {BATCH}, "
        f"{len(next(iter(looked.values()))):,} lookups in {rounds} interleaved rounds; ms.",
        [Column("lookup", "lookup"), Column("median", "median", ",.3f", " ms"),
         Column("p99", "99th percentile", ",.3f", " ms"),
         Column("vs_log", "median vs index log", ",.1f", "x")],
    )
    for name, seconds in looked.items():
        median = statistics.median(seconds)
        lineage.add(lookup=name, median=median * 1e3,
                    p99=float(np.percentile(seconds, 99)) * 1e3, vs_log=median / reference)
    lineage.finish(start)
    start = _results.load_average()
    restore = Table(
        "restore", "Restore to the first batch with 16 amendments", "bench_history.py",
        f"A 10**6-record in-memory mixture at position 5*10**7, batch 128; ms, median and "
        f"fastest of {rounds + 2} rounds.",
        [Column("method", "method"), Column("median", "median", ",.1f", " ms"),
         Column("fastest", "fastest", ",.1f", " ms")],
        note=f"TensorFlow {tf.__version__}",
    )
    for name, seconds in restored.items():
        restore.add(method=name, median=statistics.median(seconds) * 1e3,
                    fastest=min(seconds) * 1e3)
    restore.finish(start)
    size = Table(
        "state", "State size", "bench_history.py", "The loader state's JSON text, bytes.",
        [Column("pipeline", "pipeline"), Column("bytes", "bytes", ",d")],
    )
    for name, count in sizes.items():
        size.add(pipeline=name, bytes=count)
    size.finish(_results.load_average())
    slowest_restore = max(
        statistics.median(v) for k, v in restored.items() if "16 amendments" in k
    )
    median = statistics.median(looked["records_at, 16 amendments"])
    targets = [
        Target("records_at, a random step of a 10**10-record mixture, 16 amendments (median)",
               median * 1e3, 5, unit=" ms", at_most=True, item="23, lineage"),
        Target("restore -> first batch with 16 amendments (slower of set_state, "
               "Checkpoint.read)", slowest_restore * 1e3, 50, unit=" ms", at_most=True,
               item="23, history"),
        Target("state size with 16 amendments", sizes["16 amendments"], 1024, unit=" B",
               at_most=True, item="23, history"),
    ]
    return Report([lineage, restore, size], targets)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer lookups and rounds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median kept)")
    _common.add_json_option(parser)
    args = parser.parse_args(argv)
    timer = _results.Timer(_results.command_line(), args.quick)
    _common.finish(run(args.quick, args.rounds), timer, args.json)


if __name__ == "__main__":
    main()
