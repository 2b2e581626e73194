"""A 70/30 mixture of two in-memory sources, against tf.data and grain, side by side in one run.

    python benchmarks/bench_mix.py [--quick] [--rounds 5]

Prints two tables and the targets of issue 12, met or missed (Markdown; also written to
results/bench_mix.json):

(a) Throughput, records/s: two sources of CIFAR-sized records (3x32x32 uint8 image +
    int64 label; "web" 70,000 and "code" 20,000 records, 7,000 and 2,000 with --quick)
    mixed 70/30, batch 128, each source shuffled:

    * resumeloader ``Pipeline.mix(...).batch(128)``: ``for batch in loader``, and
      ``dataset()`` + ``advance()`` in a ``tf.function`` loop;
    * tf.data: ``sample_from_datasets`` of ``from_tensor_slices(source).shuffle(10_000)
      .repeat()`` per source (the equivalent shuffled pipelines; seeded), then
      ``batch(128).prefetch(AUTOTUNE)``;
    * grain 0.2.18: ``MapDataset.mix`` of ``MapDataset.source(source).shuffle(seed)
      .repeat()`` per source, then ``.batch(128)``, iterated with ``ReadOptions(
      num_threads=0)`` (2 cores; reader threads would prefetch while others are timed);
    * a NumPy reference: the mixed record order precomputed, each batch one
      fancy-index per source (the memory-bound floor of the work).

    Every contender reads the same number of records per round (grain, per-record
    Python, a quarter of them) and keeps its iterator across rounds (tf.data's
    prefetch may fill a few batches between them; ``dataset()`` starts a new
    iterator each round); the rounds are interleaved so that the machine's load hits
    every contender alike, and the table gives the median of the rounds.
(b) Restore to the first batch at epoch 50 of a 10**6-record mixture (sources of
    700,000 and 300,000 records, batch 128): ``set_state`` or ``tf.train.Checkpoint.read``
    + the first batch of ``for batch in loader`` (the target); for information, a new
    loader + ``Checkpoint.read`` + the first batch of ``dataset()`` (what a restarted
    job pays, building the pipeline included); grain's ``set_state`` on a new iterator
    of the same mixture at the same position. Median and fastest of the rounds.

Absolute numbers depend on the machine and its load (printed); the ratios, measured in
the same run, are the result.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _common
import _results
import numpy as np
import tensorflow as tf
from _results import Column, Report, Table, Target

import resumeloader

BATCH = 128
SEED = 0
WEIGHTS = {"web": 0.7, "code": 0.3}


class _Records:
    """Per-record access to (image, label) arrays: what grain's sources read."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.images, self.labels = arrays["image"], arrays["label"]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int64]:
        return self.images[index], self.labels[index]


def _GRAIN_OPTIONS() -> Any:
    import grain

    return grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


def make_sources(sizes: dict[str, int]) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return {
        name: {
            "image": rng.integers(0, 256, (size, 3, 32, 32), dtype=np.uint8),
            "label": rng.integers(0, 10, size).astype(np.int64),
        }
        for name, size in sizes.items()
    }


def _mixed_loader(sources: dict[str, Any], **kwargs: Any) -> resumeloader.ResumableLoader:
    pipeline = resumeloader.Pipeline.mix(sources, weights=WEIGHTS, seed=SEED, **kwargs)
    return resumeloader.ResumableLoader.from_pipeline(pipeline.batch(BATCH))


def _count(batches: Iterator[Any], num_batches: int) -> int:
    records = 0
    for _ in range(num_batches):
        records += len(tf.nest.flatten(next(batches))[0])
    return records


# -- (a) throughput --------------------------------------------------------------------
def contenders(sources: dict[str, Any], num_batches: int) -> dict[str, Callable[[], int]]:
    """name -> a run reading `num_batches` batches (grain: a quarter) and returning records."""
    loader = _mixed_loader(sources, records_per_epoch=10**9)
    dataset = loader.dataset()
    loop = iter(_mixed_loader(sources, records_per_epoch=10**9))

    @tf.function
    def consume(ds: tf.data.Dataset, steps: tf.Tensor) -> tf.Tensor:
        total = tf.constant(0, tf.int64)
        for batch in ds.take(steps):
            loader.advance(after=batch)
            total += tf.shape(batch["label"], out_type=tf.int64)[0]
        return total

    names = list(WEIGHTS)
    shuffled = [
        tf.data.Dataset.from_tensor_slices(sources[name]).shuffle(10_000, seed=k).repeat()
        for k, name in enumerate(names)
    ]
    mixed = (
        tf.data.Dataset.sample_from_datasets(
            shuffled, weights=[WEIGHTS[n] for n in names], seed=SEED
        )
        .batch(BATCH)
        .prefetch(tf.data.AUTOTUNE)
    )
    tf_iterator = iter(mixed)

    import grain

    parts = [
        grain.MapDataset.source(_Records(sources[name])).shuffle(seed=k).repeat()
        for k, name in enumerate(names)
    ]
    grain_mix = grain.MapDataset.mix(parts, weights=[WEIGHTS[n] for n in names]).batch(BATCH)
    # No reader threads (2 cores): with them grain prefetches while the others are timed.
    grain_iterator = iter(grain_mix.to_iter_dataset(_GRAIN_OPTIONS()))

    # NumPy floor: the order precomputed (not timed), one fancy-index per source per batch.
    keys = loader.pipeline.index_stage.indices(
        0, np.arange(num_batches * BATCH), seed=loader.pipeline.seed
    )
    concat = loader.pipeline.source

    def numpy_reference() -> int:
        flat = keys % len(concat)
        for start in range(0, len(flat), BATCH):
            concat.read_batch(flat[start : start + BATCH])
        return len(flat)

    return {
        "resumeloader: for batch in loader": lambda: _count(loop, num_batches),
        "resumeloader: dataset() + advance() in tf.function": lambda: int(
            consume(dataset, tf.constant(num_batches, tf.int64))
        ),
        "tf.data: sample_from_datasets of shuffled sources": lambda: _count(
            tf_iterator, num_batches
        ),
        "grain: MapDataset.mix -> batch": lambda: _count(grain_iterator, num_batches // 4),
        "NumPy reference: precomputed order, a fancy-index per source": numpy_reference,
    }


def throughput(sources: dict[str, Any], num_batches: int, rounds: int) -> dict[str, float]:
    """Median records/s of each contender over interleaved rounds (after one warm-up)."""
    runs = contenders(sources, num_batches)
    # One warm-up round (tracing, iterator start-up); CPU per record to `_common.CPU_US`.
    return _common.interleaved(
        {name: lambda run=run: _common.records_rate(run) for name, run in runs.items()},
        rounds, warmup=1,
    )


# -- (b) restore -----------------------------------------------------------------------
def restore_times(rounds: int, workdir: Path) -> dict[str, list[float]]:
    """Seconds from restoring at epoch 50 (middle) of a 10**6-record mixture to a batch."""
    sources = {
        "web": np.arange(700_000, dtype=np.int64),
        "code": np.arange(300_000, dtype=np.int64) + 10**6,
    }
    loader = _mixed_loader(sources, records_per_epoch=10**6)
    next(iter(loader))  # warm up
    state = dict(loader.get_state(), epoch=50, offset=500_096)
    loader.set_state(state)
    path = tf.train.Checkpoint(loader=loader).write(str(workdir / "mix"))

    def fresh() -> None:
        new = _mixed_loader(sources, records_per_epoch=10**6)
        tf.train.Checkpoint(loader=new).read(path)
        next(iter(new.dataset()))

    import grain

    parts = [
        grain.MapDataset.source(sources[name]).shuffle(seed=k).repeat()
        for k, name in enumerate(WEIGHTS)
    ]
    grain_mix = grain.MapDataset.mix(parts, weights=list(WEIGHTS.values())).batch(BATCH)
    grain_state = {"next_index": (50 * 10**6 + 500_096) // BATCH}

    def grain_restore() -> None:
        iterator = iter(grain_mix.to_iter_dataset(_GRAIN_OPTIONS()))
        iterator.set_state(grain_state)
        next(iterator)

    checkpoint = tf.train.Checkpoint(loader=loader)
    work = {
        "resumeloader: set_state + first batch of for-loop": lambda: (
            loader.set_state(state),
            next(iter(loader)),
        ),
        "resumeloader: Checkpoint.read + first batch of for-loop": lambda: (
            checkpoint.read(path),
            next(iter(loader)),
        ),
        "resumeloader: new loader + Checkpoint.read + first batch of dataset() (info)": fresh,
        "grain: new iterator + set_state + first batch": grain_restore,
    }
    times: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(rounds):
        for name, run in work.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


# -- report ----------------------------------------------------------------------------
def run(quick: bool, rounds: int) -> Report:
    """Both tables and the targets of issue 12 (item 1)."""
    sizes, num_batches = {"web": 70_000, "code": 20_000}, 200
    if quick:
        sizes, num_batches, rounds = {"web": 7_000, "code": 2_000}, 100, min(rounds, 3)
    start = _results.load_average()
    rates = throughput(make_sources(sizes), num_batches, rounds)
    tf_rate = rates["tf.data: sample_from_datasets of shuffled sources"]
    grain_rate = rates["grain: MapDataset.mix -> batch"]
    mixed = Table(
        "throughput", "Weighted mixing: throughput", "bench_mix.py",
        f"A 70/30 mixture of {sizes['web']:,} + {sizes['code']:,} records (3x32x32 uint8 + "
        f"label), batch {BATCH}, records/s, median of {rounds} interleaved rounds.",
        [Column("pipeline", "pipeline"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(), Column("vs_tf", "vs tf.data", ".2f", "x"),
         Column("vs_grain", "vs grain", ".2f", "x")],
        note=f"TensorFlow {tf.__version__}",
    )
    for name, rate in rates.items():
        mixed.add(pipeline=name, rate=rate, cpu_us=_common.cpu_us(name), vs_tf=rate / tf_rate,
                  vs_grain=rate / grain_rate)
    mixed.finish(start)

    start = _results.load_average()
    with tempfile.TemporaryDirectory(prefix="bench_mix_") as workdir:
        restore = restore_times(rounds + 2, Path(workdir))
    restored = Table(
        "restore", "Weighted mixing: restore to the first batch", "bench_mix.py",
        f"Epoch 50 of a 10**6-record mixture; ms, median and fastest of {rounds + 2} rounds.",
        [Column("method", "method"), Column("median", f"median of {rounds + 2}", ",.1f", " ms"),
         Column("fastest", "fastest", ",.1f", " ms")],
    )
    for name, seconds in restore.items():
        restored.add(method=name, median=statistics.median(seconds) * 1e3,
                     fastest=min(seconds) * 1e3)
    restored.finish(start)

    faster = max(("resumeloader: for batch in loader",
                  "resumeloader: dataset() + advance() in tf.function"), key=rates.__getitem__)
    ours = rates[faster]
    slowest_restore = max(
        statistics.median(v) for k, v in restore.items()
        if k.startswith("resumeloader") and not k.endswith("(info)")
    )
    targets = [
        Target("resumeloader (faster way) / tf.data sample_from_datasets", ours / tf_rate, 2.0,
               item="12.1, mixing", cpu_value=_common.cpu_ratio(
                   faster, "tf.data: sample_from_datasets of shuffled sources")),
        Target("resumeloader (faster way) / grain MapDataset.mix -> batch", ours / grain_rate,
               2.0, item="12.1, mixing",
               cpu_value=_common.cpu_ratio(faster, "grain: MapDataset.mix -> batch")),
        Target("restore -> first batch, epoch 50 of 10**6 (slower of set_state, Checkpoint.read)",
               slowest_restore * 1e3, 50, unit=" ms", at_most=True, item="12.1, mixing"),
    ]
    return Report([mixed, restored], targets)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sources, fewer rounds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median kept)")
    _common.add_json_option(parser)
    args = parser.parse_args(argv)
    timer = _results.Timer(_results.command_line(), args.quick)
    _common.finish(run(args.quick, args.rounds), timer, args.json)


if __name__ == "__main__":
    main()
