"""Padding, packing and restoring variable-length batches, against tf.data and grain, in one run.

    python benchmarks/bench_batching.py [--quick] [--rounds 5]

Prints three tables and the targets of issue 12 (items 2 and 3), met or missed (Markdown;
also written to results/bench_batching.json):

(a) Padded batching, records/s: 20,000 int32 token sequences of lengths 5-200 (5,000
    with --quick), one shuffled epoch per round, batch 128, padded to each batch's
    longest sequence:

    * resumeloader ``Pipeline({"tokens": ...}).shuffle().padded_batch(128)``: ``for
      batch in loader``, and ``dataset()`` + ``advance()`` in a ``tf.function`` loop;
    * tf.data on the same in-memory data: ``from_tensor_slices(ragged)``, shuffled
      (``shuffle(N)``, as ours) or in order, then ``ragged_batch(128).map(to_tensor)``,
      or ``padded_batch(128)``, prefetched (no exact resume). The targets compare with
      the faster of the two orders.

(b) Packing, sequences/s and the share of real tokens: 100,000 sequences (20,000 with
    --quick) of log-normal lengths (median ~245, clipped to [1, 2048]) into rows of
    L = 2048, 8 rows per batch:

    * resumeloader ``pack(2048, window=W, batch_size=8)`` (first-fit decreasing per
      window of W records, W = 1024 and 4096), ``for batch in loader``;
    * grain 0.2.18 ``FirstFitPackIterDataset(length_struct={"tokens": 2048},
      num_packing_bins=64)`` then ``batch(8)``, iterated with ``ReadOptions(num_threads=0)``
      (2 cores; reader threads would run while the others are timed).

(c) Restore to the first batch at epoch 50 of 10**6 records, for each stage: a virtual
    source of 10**6 token sequences (each computed from its index); ``set_state`` to a
    state saved inside a window (after 2 batches of it) + the first batch of ``for
    batch in loader``. A windowed stage recomputes that window.

Rounds are interleaved so that the machine's load hits every contender alike; tables
give medians. Absolute numbers depend on the machine and its load (printed); the
ratios, measured in the same run, are the result.
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

from resumeloader import Pipeline, ResumableLoader

BATCH = 128
ROW = 2048
ROWS = 8
SEED = 0


def token_sequences(count: int, lengths: np.ndarray) -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    values = rng.integers(1, 32_000, int(lengths.sum()), dtype=np.int32)
    return np.split(values, np.cumsum(lengths)[:-1])


def _medians(runs: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Records/s of each run, medians of interleaved rounds after one warm-up round
    (tracing, iterator start-up); CPU per record to `_common.CPU_US`."""
    return _common.interleaved(
        {name: lambda run=run: _common.records_rate(run) for name, run in runs.items()},
        rounds, warmup=1,
    )


# -- (a) padded batching ---------------------------------------------------------------
def padded_contenders(sequences: list[np.ndarray]) -> dict[str, Callable[[], int]]:
    """name -> one shuffled epoch of padded batches; returns the records read."""
    count = len(sequences)

    def loader() -> ResumableLoader:
        pipeline = Pipeline({"tokens": sequences}, seed=SEED).shuffle().padded_batch(BATCH)
        return ResumableLoader.from_pipeline(pipeline, num_epochs=10**6)

    looped = loader()
    graphed = loader()
    dataset = graphed.dataset(rest_of_epoch=True)

    @tf.function
    def consume(ds: tf.data.Dataset) -> tf.Tensor:
        total = tf.constant(0, tf.int64)
        for batch in ds:
            graphed.advance(after=batch)
            total += tf.shape(batch["tokens"], out_type=tf.int64)[0]
        return total

    def for_loop() -> int:
        records, batches = 0, iter(looped)
        for _ in range(looped.batches_left_in_epoch):
            records += int(next(batches)["tokens"].shape[0])
        batches.close()
        return records

    ragged = tf.RaggedTensor.from_row_lengths(
        np.concatenate(sequences), [len(s) for s in sequences]
    )
    slices = tf.data.Dataset.from_tensor_slices(ragged)
    tf_data = {}
    for order, ds in (("shuffle(N)", slices.shuffle(count, seed=SEED)), ("in order", slices)):
        tf_data[f"tf.data ({order}): ragged_batch -> to_tensor"] = (
            ds.ragged_batch(BATCH)
            .map(lambda r: r.to_tensor(), tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE)
        )
        # Slices of a ragged tensor are ragged_rank-0 elements; an identity map makes
        # them tensors, which padded_batch needs.
        tf_data[f"tf.data ({order}): padded_batch"] = (
            ds.map(lambda x: x).padded_batch(BATCH).prefetch(tf.data.AUTOTUNE)
        )

    def epoch(ds: tf.data.Dataset) -> int:
        return sum(int(batch.shape[0]) for batch in ds)

    runs: dict[str, Callable[[], int]] = {
        "resumeloader: padded_batch, for batch in loader": for_loop,
        "resumeloader: padded_batch, dataset() + advance() in tf.function": lambda: int(
            consume(dataset)
        ),
    }
    runs.update({name: (lambda ds=ds: epoch(ds)) for name, ds in tf_data.items()})
    return runs


# -- (b) packing -----------------------------------------------------------------------
class _Records:
    """Per-record access to dicts of tokens: what grain's sources read."""

    def __init__(self, sequences: list[np.ndarray]) -> None:
        self.sequences = sequences

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {"tokens": self.sequences[index]}


def _real_share(segment_ids: Any) -> float:
    return float((np.asarray(segment_ids) > 0).mean())


def packing_contenders(
    sequences: list[np.ndarray], windows: tuple[int, ...]
) -> tuple[dict[str, Callable[[], int]], dict[str, list[float]]]:
    """name -> one pass over the sequences (records/s), and each one's real-token shares."""
    count = len(sequences)
    shares: dict[str, list[float]] = {}
    runs: dict[str, Callable[[], int]] = {}
    for window in windows:
        name = f"resumeloader: pack(2048, window={window}, batch_size={ROWS})"
        pipeline = Pipeline({"tokens": sequences}, seed=SEED).shuffle()
        loader = ResumableLoader.from_pipeline(
            pipeline.pack(ROW, window=window, batch_size=ROWS), num_epochs=10**6
        )
        shares[name] = []

        def run(loader: ResumableLoader = loader, name: str = name) -> int:
            start = loader.position
            epoch_end = (loader.epoch + 1) * count
            for batch in loader:
                shares[name].append(_real_share(batch["tokens_segment_ids"]))
                if loader.position >= epoch_end:
                    break
            return loader.position - start

        runs[name] = run

    import grain

    name = f"grain: FirstFitPackIterDataset(num_packing_bins=64) -> batch({ROWS})"
    shares[name] = []

    def grain_run() -> int:
        source = grain.MapDataset.source(_Records(sequences)).shuffle(seed=SEED)
        iterable = source.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
        packed = grain.experimental.FirstFitPackIterDataset(
            iterable, length_struct={"tokens": ROW}, num_packing_bins=64, seed=SEED
        ).batch(ROWS)
        records = 0
        for batch in packed:
            ids = batch["tokens_segment_ids"]
            shares[name].append(_real_share(ids))
            records += int(sum(len(set(row[row > 0].tolist())) for row in ids))
        return records

    runs[name] = grain_run
    return runs, shares


# -- (c) restore -----------------------------------------------------------------------
class VirtualTokens:
    """`count` token sequences, each computed from its index (length 5-200); read_batch."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> np.ndarray:
        length = 5 + (index * 2654435761) % 196
        return (np.arange(length, dtype=np.int32) + index) % 32_000

    def read_batch(self, indices: np.ndarray) -> list[np.ndarray]:
        return [self[i] for i in indices.tolist()]


def restore_times(rounds: int) -> dict[str, list[float]]:
    """Seconds from set_state (inside a window at epoch 50 of 10**6) to the first batch."""
    source = VirtualTokens(10**6)
    signature = tf.TensorSpec((None,), tf.int32)
    stages = {
        "padded_batch(128)": lambda p: p.padded_batch(BATCH),
        "bucket_by_length(128, window=1024)": lambda p: p.bucket_by_length(BATCH, window=1024),
        "batch_by_tokens(8192, window=1024)": lambda p: p.batch_by_tokens(8192, window=1024),
        "pack(2048, window=1024, batch_size=8)": lambda p: p.pack(
            ROW, window=1024, batch_size=ROWS
        ),
    }
    work: dict[str, Callable[[], Any]] = {}
    for name, stage in stages.items():
        pipeline = stage(Pipeline(source, seed=SEED, output_signature=signature).shuffle())
        loader = ResumableLoader.from_pipeline(pipeline)
        # A state inside a window: its start at epoch 50, then two batches.
        loader.set_state(dict(loader.get_state(), epoch=50, offset=500 * 1024))
        iterator = iter(loader)
        next(iterator)
        next(iterator)
        iterator.close()
        state = loader.get_state()

        def restore(loader: ResumableLoader = loader, state: dict[str, Any] = state) -> None:
            loader.set_state(state)
            iterator = iter(loader)
            next(iterator)
            iterator.close()

        work[f"{name}: set_state + first batch of for-loop"] = restore
    times: dict[str, list[float]] = {name: [] for name in work}
    for _ in range(rounds):
        for name, run in work.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return times


# -- report ----------------------------------------------------------------------------
def run(quick: bool, rounds: int) -> Report:
    """The three tables and the targets of issue 12 (items 2 and 3)."""
    padded_count, packed_count = 20_000, 100_000
    if quick:
        padded_count, packed_count, rounds = 5_000, 20_000, min(rounds, 3)
    rng = np.random.default_rng(1)

    start = _results.load_average()
    sequences = token_sequences(padded_count, rng.integers(5, 201, padded_count))
    rates = _medians(padded_contenders(sequences), rounds)
    # The faster tf.data pipeline of each kind (shuffled like ours, or in order).
    ragged_rate = max(v for k, v in rates.items() if k.endswith("ragged_batch -> to_tensor"))
    padded_rate = max(v for k, v in rates.items() if k.endswith("): padded_batch"))
    padded = Table(
        "padded", "Padded batching", "bench_batching.py",
        f"{padded_count:,} sequences of 5-200 tokens, batch {BATCH}, records/s, median of "
        f"{rounds} interleaved rounds.",
        [Column("pipeline", "pipeline"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(),
         Column("vs_ragged", "vs faster tf.data ragged_batch", ".2f", "x"),
         Column("vs_padded", "vs faster tf.data padded_batch", ".2f", "x")],
        note=f"TensorFlow {tf.__version__}",
    )
    padded_cpu = {name: _common.cpu_us(name) for name in rates}
    for name, rate in rates.items():
        padded.add(pipeline=name, rate=rate, cpu_us=padded_cpu[name],
                   vs_ragged=rate / ragged_rate, vs_padded=rate / padded_rate)
    padded.finish(start)

    start = _results.load_average()
    lengths = np.clip(rng.lognormal(5.5, 1.0, packed_count), 1, ROW).astype(np.int64)
    runs, shares = packing_contenders(token_sequences(packed_count, lengths), (1024, 4096))
    pack_rates = _medians(runs, max(1, rounds - 1))
    grain_name = next(name for name in pack_rates if name.startswith("grain"))
    packing = Table(
        "packing", "Sequence packing", "bench_batching.py",
        f"{packed_count:,} log-normal sequences (median {int(np.median(lengths))} tokens) "
        f"into rows of {ROW}, {ROWS} rows per batch, sequences/s, median of "
        f"{max(1, rounds - 1)} interleaved rounds.",
        [Column("pipeline", "pipeline"), Column("rate", "sequences/s", ",.0f"),
         _results.cpu_column("sequence"), Column("real", "real tokens", ".1%"),
         Column("vs_grain", "vs grain", ".2f", "x")],
    )
    for name, rate in pack_rates.items():
        packing.add(pipeline=name, rate=rate, cpu_us=_common.cpu_us(name),
                    real=statistics.fmean(shares[name]), vs_grain=rate / pack_rates[grain_name])
    packing.finish(start)

    start = _results.load_average()
    restore = restore_times(rounds + 2)
    restored = Table(
        "restore", "Variable-length batches: restore to the first batch", "bench_batching.py",
        f"Inside a window at epoch 50 of 10**6 records; ms, median and fastest of "
        f"{rounds + 2} rounds.",
        [Column("stage", "stage"), Column("median", f"median of {rounds + 2}", ",.1f", " ms"),
         Column("fastest", "fastest", ",.1f", " ms")],
    )
    for name, seconds in restore.items():
        restored.add(stage=name, median=statistics.median(seconds) * 1e3,
                     fastest=min(seconds) * 1e3)
    restored.finish(start)

    ours_name = max((k for k in rates if k.startswith("resumeloader")), key=rates.__getitem__)
    ours_padded = rates[ours_name]
    ragged_name = max((k for k in rates if k.endswith("ragged_batch -> to_tensor")),
                      key=rates.__getitem__)
    padded_name = max((k for k in rates if k.endswith("): padded_batch")), key=rates.__getitem__)

    def padded_cpu_ratio(reference: str) -> float | None:
        ours, theirs = padded_cpu[ours_name], padded_cpu[reference]
        return None if not ours or theirs is None else theirs / ours

    best_pack = max(
        (k for k in pack_rates if k.startswith("resumeloader")), key=lambda k: pack_rates[k]
    )
    best_share = max(statistics.fmean(shares[k]) for k in pack_rates if k.startswith("resume"))
    item = "12.2-3, batching"
    targets = [
        Target("padded batching (faster way) / tf.data ragged_batch -> to_tensor",
               ours_padded / ragged_rate, 1.0, item=item, cpu_value=padded_cpu_ratio(ragged_name)),
        Target("padded batching (faster way) / tf.data padded_batch",
               ours_padded / padded_rate, 1.0, item=item, cpu_value=padded_cpu_ratio(padded_name)),
        Target("packing: share of real tokens (best window)", best_share * 100, 90, unit="%",
               item=item),
        Target(f"packing throughput / grain FirstFitPackIterDataset ({best_pack.split(': ')[1]})",
               pack_rates[best_pack] / pack_rates[grain_name], 1.0, item=item,
               cpu_value=_common.cpu_ratio(best_pack, grain_name)),
        Target("restore -> first batch, epoch 50 of 10**6 (slowest stage)",
               max(statistics.median(v) for v in restore.values()) * 1e3, 50, unit=" ms",
               at_most=True, item=item),
    ]
    return Report([padded, packing, restored], targets)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="less data, fewer rounds")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median kept)")
    _common.add_json_option(parser)
    args = parser.parse_args(argv)
    timer = _results.Timer(_results.command_line(), args.quick)
    _common.finish(run(args.quick, args.rounds), timer, args.json)


if __name__ == "__main__":
    main()
