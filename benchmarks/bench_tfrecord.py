"""TFRecord + ``tf_map`` against tf.data tuned as its docs recommend, over 8 and 64 files.

    python benchmarks/bench_tfrecord.py [--quick] [--json PATH]

JPEG-encoded 64x64 ``tf.train.Example`` records (20,000; 4,000 with ``--quick``, the
records of bench_data.py) written twice, to 8 and to 64 TFRecord files. Batch 128, one
shuffled epoch per contender after 4 warm-up batches, rounds interleaved, median
records/s, for each file count:

* resumeloader: ``TFRecordSource`` + ``tf_map(parse_example + decode_jpeg)`` in the
  global shuffle (``shuffle()``) and in the block order (``shuffle(block="4MiB")``,
  1 MiB with ``--quick``: chunks of consecutive records, shuffled, 4 per window), each
  through ``dataset()`` and through ``for batch in loader``;
* tf.data, the obvious pipeline: ``TFRecordDataset(files).shuffle(10_000)
  .map(parse + decode one record, AUTOTUNE).batch(128).prefetch(AUTOTUNE)``;
* tf.data tuned as its performance guide recommends: files read in parallel
  (``TFRecordDataset(files, num_parallel_reads=AUTOTUNE)``, or the files shuffled and
  ``interleave``d with ``num_parallel_calls=AUTOTUNE``), ``shuffle(10_000)``, then
  *batch before parsing* (one ``parse_example`` and the same decode as ours per batch,
  ``map(..., AUTOTUNE)``), ``prefetch(AUTOTUNE)``; deterministic, as resumeloader is;
* the in-memory decode bound: the same serialized records held in one tensor, batched
  and parsed + decoded with ``map(AUTOTUNE)`` (no reading at all).

Beside each rate: CPU microseconds per record (the process's every thread; the ratios
"CPU" divide the same way, by CPU per record: the figure a loaded machine leaves
stable), CPU seconds per wall second of the measurement (median over rounds; 2.0 is
both cores busy) and the number of *one-core rounds* (CPU/wall under 1.3: the pipeline
ran on one core while the machine had two).

Targets (issue 30, item 3), for 8 and for 64 files: ``dataset()`` in the block order
at least 1.0x and in the global shuffle at least 0.9x the best tuned tf.data pipeline,
in CPU per record (the best: the tuned pipeline spending the least CPU per record);
each order at least 0.85x the in-memory decode bound (CPU per record); ``for batch in
loader`` within 10% of ``dataset()`` in the same order (at least 0.9x its rate, and its
CPU per record on a loaded run).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common
import _results
import bench_data
import numpy as np
import tensorflow as tf
from _results import Column, Report, Table, Target

from resumeloader import Pipeline, ResumableLoader
from resumeloader.sources import TFRecordSource

BATCH = bench_data.BATCH
AUTOTUNE = tf.data.AUTOTUNE
FILE_COUNTS = (8, 64)
ONE_CORE = 1.3  # CPU seconds per wall second under which a round ran on one core
OURS_DATASET = "resumeloader: TFRecordSource + tf_map, `dataset()`"
OURS_LOOP = "resumeloader: TFRecordSource + tf_map, `for batch in loader`"
BLOCK_DATASET = "resumeloader: TFRecordSource + tf_map, block order, `dataset()`"
BLOCK_LOOP = "resumeloader: TFRecordSource + tf_map, block order, `for batch in loader`"
#: (dataset() contender, for-loop contender, the order in words, the bound on "/ best
#: tuned tf.data, CPU") of each order issue 30 sets targets for.
ORDERS = ((BLOCK_DATASET, BLOCK_LOOP, "block order", 1.0),
          (OURS_DATASET, OURS_LOOP, "global shuffle", 0.9))
ITEM = "30.3, TFRecord"
OLD_ITEM = "24.5, TFRecord"
OBVIOUS = "tf.data: TFRecordDataset.shuffle(10k).map(parse+decode one, AUTOTUNE).batch"
PARALLEL_READS = ("tf.data tuned: TFRecordDataset(num_parallel_reads=AUTOTUNE).shuffle(10k)"
                  ".batch.map(parse+decode batch, AUTOTUNE)")
INTERLEAVE = ("tf.data tuned: files.shuffle.interleave(TFRecordDataset, AUTOTUNE)"
              ".shuffle(10k).batch.map(parse+decode batch, AUTOTUNE)")
BOUND = "in-memory decode bound: records in a tensor, batch.map(parse+decode batch, AUTOTUNE)"


def write_files(root: str, num_records: int, count: int) -> list[str]:
    """`num_records` Examples (bench_data.py's) round-robin over `count` TFRecord files."""
    rng = np.random.default_rng(0)
    jpegs = [bench_data._jpeg(rng) for _ in range(64)]
    paths = [os.path.join(root, f"train-{i:02d}-of-{count}.tfrecord") for i in range(count)]
    writers = [tf.io.TFRecordWriter(path) for path in paths]
    for i in range(num_records):
        writers[i % count].write(bench_data._example(jpegs[i % 64] + bytes([i % 251]), i % 10))
    for writer in writers:
        writer.close()
    return paths


def _decode(batch: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    return bench_data.parse_decode_batch(batch, tf.zeros((), tf.int64))


def contenders(files: list[str], index_dir: str,
               block: str) -> dict[str, Callable[[], Iterable[Any]]]:
    def ours(way: str, order: str | None = None) -> Iterable[Any]:
        source = TFRecordSource(files, index_dir=index_dir)
        pipeline = Pipeline(source, seed=0).shuffle(block=order).batch(BATCH).tf_map(
            bench_data.parse_decode_batch)
        loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
        return loader.dataset() if way == "dataset" else loader

    def tuned(reads: tf.data.Dataset) -> tf.data.Dataset:
        return (reads.shuffle(10_000, seed=0).batch(BATCH)
                .map(_decode, num_parallel_calls=AUTOTUNE).prefetch(AUTOTUNE))

    records = tf.concat([tf.stack(list(tf.data.TFRecordDataset(files)))], 0)
    return {
        OURS_DATASET: lambda: ours("dataset"),
        OURS_LOOP: lambda: ours("loop"),
        BLOCK_DATASET: lambda: ours("dataset", block),
        BLOCK_LOOP: lambda: ours("loop", block),
        OBVIOUS: lambda: (tf.data.TFRecordDataset(files).shuffle(10_000, seed=0)
                          .map(bench_data.parse_decode_one, num_parallel_calls=AUTOTUNE)
                          .batch(BATCH).prefetch(AUTOTUNE)),
        PARALLEL_READS: lambda: tuned(
            tf.data.TFRecordDataset(files, num_parallel_reads=AUTOTUNE)),
        INTERLEAVE: lambda: tuned(
            tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=0).interleave(
                tf.data.TFRecordDataset, cycle_length=min(len(files), 8),
                num_parallel_calls=AUTOTUNE, deterministic=True)),
        BOUND: lambda: (tf.data.Dataset.from_tensor_slices(records).shuffle(10_000, seed=0)
                        .batch(BATCH).map(_decode, num_parallel_calls=AUTOTUNE)
                        .prefetch(AUTOTUNE)),
    }


def epoch(make: Callable[[], Iterable[Any]]) -> tuple[float, float, float]:
    """Records/s over one epoch after 4 warm-up batches, CPU seconds per wall second and
    CPU microseconds per record (`_common.cpu_seconds`)."""
    iterator = iter(make())
    for _ in range(4):
        next(iterator)
    records = 0
    cpu, start = _common.cpu_seconds(), time.perf_counter()
    for batch in iterator:
        records += int(batch[0].shape[0])
        del batch
    wall = time.perf_counter() - start
    cpu = _common.cpu_seconds() - cpu
    return records / wall, cpu / wall, cpu * 1e6 / records


def run(quick: bool) -> Report:
    num_records, rounds = (4_000, 3) if quick else (20_000, 5)
    block = "1MiB" if quick else "4MiB"
    table = Table(
        "tfrecord", "TFRecord + `tf_map` against tuned tf.data, 8 and 64 files",
        "bench_tfrecord.py",
        f"{num_records:,} JPEG Examples (64x64), batch {BATCH}, one shuffled epoch per "
        f"contender after 4 warm-up batches, median of {rounds} interleaved rounds. CPU / "
        "wall: CPU seconds (all threads) per wall second of the epoch, median; one-core "
        f"rounds: rounds with CPU / wall under {ONE_CORE}. Block order: "
        f"`shuffle(block=\"{block}\")`, 4 chunks per window. \"/ best tf.data\" divides by "
        "the faster tuned tf.data pipeline of the same files, \"/ best tf.data, CPU\" by "
        "the one spending the least CPU per record, \"/ bound\" by the in-memory decode "
        "bound.",
        [Column("files", "files", ",d"), Column("pipeline", "pipeline"),
         Column("rate", "records/s", ",.0f"), _results.cpu_column(),
         Column("vs_best", "/ best tf.data", ".2f"),
         Column("vs_best_cpu", "/ best tf.data, CPU", ".2f"),
         Column("vs_bound", "/ bound", ".2f"), Column("vs_bound_cpu", "/ bound, CPU", ".2f"),
         Column("cpu", "CPU / wall", ".2f"), Column("one_core", "one-core rounds", "d")],
        note=f"TensorFlow {tf.__version__}",
    )
    targets = []
    start = _results.load_average()
    with tempfile.TemporaryDirectory(prefix="bench-tfrecord-") as root:
        runs = {}
        for count in FILE_COUNTS:
            folder = os.path.join(root, f"files-{count}")
            os.makedirs(folder)
            runs[count] = contenders(write_files(folder, num_records, count),
                                     os.path.join(root, "index"), block)
        samples: dict[tuple[int, str], list[tuple[float, float, float]]] = {
            (count, name): [] for count, table_ in runs.items() for name in table_}
        for _ in range(rounds):
            for count, table_ in runs.items():
                for name, make in table_.items():
                    samples[count, name].append(epoch(make))
                    rate, cpu, cpu_us = samples[count, name][-1]
                    print(f"  {count} files, {name}: {rate:,.0f} ({cpu:.2f} CPU/wall, "
                          f"{cpu_us:.1f} CPU us/record)", file=sys.stderr, flush=True)
    for count, table_ in runs.items():
        medians = {name: statistics.median(r for r, _, _ in samples[count, name])
                   for name in table_}
        cpu_us = {name: statistics.median(c for _, _, c in samples[count, name])
                  for name in table_}
        best_name = max((PARALLEL_READS, INTERLEAVE), key=medians.__getitem__)
        best = medians[best_name]
        # In CPU per record, the best tuned pipeline is the one spending the least.
        best_cpu = min(cpu_us[PARALLEL_READS], cpu_us[INTERLEAVE])
        for name in table_:
            cpus = [c for _, c, _ in samples[count, name]]
            table.add(files=count, pipeline=name, rate=medians[name], cpu_us=cpu_us[name],
                      vs_best=medians[name] / best, vs_best_cpu=best_cpu / cpu_us[name],
                      vs_bound=medians[name] / medians[BOUND],
                      vs_bound_cpu=cpu_us[BOUND] / cpu_us[name],
                      cpu=statistics.median(cpus), one_core=sum(c < ONE_CORE for c in cpus))
        targets += _targets(count, medians, cpu_us, best, best_cpu,
                            {name: [c for _, c, _ in samples[count, name]] for name in table_})
    table.finish(start)
    return Report([table], targets)


def _targets(count: int, medians: dict[str, float], cpu_us: dict[str, float], best: float,
             best_cpu: float, cpus: dict[str, list[float]]) -> list[Target]:
    """Issue 30's targets for `count` files (`ITEM`), then the older ones of issue 24
    that no new target restates (`OLD_ITEM`: the for-loop against tuned tf.data and the
    bound, one-core rounds), all for the global shuffle (the order they were set for)."""
    targets = []
    for dataset, loop, order, bound in ORDERS:
        targets += [
            Target(f"TFRecord + tf_map `dataset()`, {order} / best tuned tf.data, CPU per "
                   f"record, {count} files", best_cpu / cpu_us[dataset], bound, item=ITEM),
            Target(f"TFRecord + tf_map `dataset()`, {order} / in-memory decode bound, CPU per "
                   f"record, {count} files", cpu_us[BOUND] / cpu_us[dataset], 0.85, item=ITEM),
            Target(f"TFRecord + tf_map for-loop / `dataset()`, {order}, {count} files",
                   medians[loop] / medians[dataset], 0.9, item=ITEM,
                   cpu_value=cpu_us[dataset] / cpu_us[loop]),
        ]
    targets += [
        Target(f"TFRecord + tf_map for-loop / best tuned tf.data, {count} files",
               medians[OURS_LOOP] / best, 1.0, item=OLD_ITEM,
               cpu_value=best_cpu / cpu_us[OURS_LOOP]),
        Target(f"TFRecord + tf_map for-loop / in-memory decode bound, {count} files",
               medians[OURS_LOOP] / medians[BOUND], 0.85, item=OLD_ITEM,
               cpu_value=cpu_us[BOUND] / cpu_us[OURS_LOOP]),
    ]
    for name, label in ((OURS_DATASET, "`dataset()`"), (OURS_LOOP, "for-loop")):
        targets.append(Target(f"TFRecord + tf_map {label} one-core rounds, {count} files",
                              sum(c < ONE_CORE for c in cpus[name]), 0, unit="",
                              at_most=True, item=OLD_ITEM))
    return targets


def main() -> None:
    _common.script_main(run, __doc__, "4,000 records, 3 rounds")


if __name__ == "__main__":
    main()
