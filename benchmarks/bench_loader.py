"""ResumableLoader against the pipelines people use today, side by side in one run.

    python benchmarks/bench_loader.py [--quick] [--sections abc]

(a) In-memory CIFAR-like records (32x32x3 uint8 image + int64 label), batch 128,
    shuffled, records/s in steady state (after 4 batches, median of interleaved
    rounds): ``for batch in loader``; ``dataset()`` pulled inside a ``tf.function``
    with ``advance(after=batch)`` (what Keras does); plain tf.data with a full and a
    10,000-record shuffle, consumed both ways; the naive split pipeline; grain's
    ``DataLoader`` and ``MapDataset``; the NumPy fancy-index loop (the "/ NumPy"
    reference) and the memory-copy bound.
(b) Restore latency: ms from restoring to holding the first batch, by position, against
    grain's ``set_state`` and the O(k) replays.
(c) Checkpoint size.

Absolute numbers depend on the machine and its load (printed under every table); the
ratios, measured in the same rounds, are the result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import _results
import numpy as np
from _common import BATCH, SEED
from _results import Column, Report, Table, Target

FOR_LOOP = "resumeloader: `for batch in loader`"
DATASET = "resumeloader: `dataset()` + `advance()` in a `tf.function`"
PLAIN = "plain tf.data, full shuffle, in a `tf.function`"
PLAIN_EAGER = "plain tf.data, full shuffle, `for batch in ds`"
NUMPY = "NumPy permutation + fancy-index (reference)"


# -- (a) throughput ----------------------------------------------------------------------


def throughput(quick: bool) -> tuple[Table, list[Target]]:
    import tensorflow as tf

    import resumeloader

    num_records, rounds, batches = (20_000, 3, 150) if quick else (100_000, 5, 600)
    arrays = _common.cifar_like(num_records)
    start = _results.load_average()

    def loader() -> resumeloader.ResumableLoader:
        return resumeloader.ResumableLoader(arrays, batch_size=BATCH, seed=SEED)

    def ours_graph() -> float:
        fresh = loader()
        return _common.graph_rate(fresh.dataset(), batches, loader=fresh)

    contenders: dict[str, Callable[[], float]] = {
        FOR_LOOP: lambda: _common.steady_rate(loader),
        DATASET: ours_graph,
        PLAIN: lambda: _common.graph_rate(_common.plain_tf(arrays), batches),
        PLAIN_EAGER: lambda: _common.steady_rate(lambda: _common.plain_tf(arrays)),
        "plain tf.data, shuffle(10,000), in a `tf.function`": lambda: _common.graph_rate(
            _common.plain_tf(arrays, shuffle_buffer=10_000), batches
        ),
        "naive split pipeline (`from_generator`), `for batch in ds`": lambda: (
            _common.steady_rate(lambda: _common.naive_split(arrays), share=0.5)
        ),
        "grain `DataLoader`, 0 workers, `num_threads=0`": lambda: _common.steady_rate(
            lambda: _common.grain_loader(arrays), share=0.5
        ),
        "grain `MapDataset.source().shuffle().batch()`": lambda: _common.steady_rate(
            lambda: _common.grain_dataset(arrays), share=0.5
        ),
        NUMPY: lambda: _common.steady_rate(lambda: _common.numpy_reference(arrays)),
    }
    rates = _common.interleaved(contenders, rounds)
    record_bytes = arrays[0][0].nbytes + arrays[1][0].nbytes
    rates["memory-copy bound (memcpy bandwidth / record size)"] = (
        _common.copy_bandwidth() / record_bytes
    )
    reference, plain = rates[NUMPY], rates[PLAIN]
    table = Table(
        "throughput", f"(a) In-memory CIFAR-like records, batch {BATCH}", "bench_loader.py",
        f"{num_records:,} records of 32x32x3 uint8 + int64 label, shuffled; records/s "
        f"after {_common.WARMUP_BATCHES} batches, median of {rounds} interleaved rounds "
        f"(`tf.function` rows: {batches} batches; Python rows: up to "
        f"{_common.BUDGET_SECONDS:g} s, half that for the per-record pipelines).",
        [Column("pipeline", "pipeline"), Column("rate", "records/s", ",.0f"),
         Column("vs_numpy", "/ NumPy", ".2f"), Column("vs_plain", "/ plain tf.data", ".2f")],
        note=f"TensorFlow {tf.__version__}",
    )
    for name, rate in rates.items():
        table.add(pipeline=name, rate=rate, vs_numpy=rate / reference, vs_plain=rate / plain)
    table.finish(start)
    eager_plain = rates[PLAIN_EAGER]
    targets = [
        Target("(a) `dataset()` / NumPy reference", rates[DATASET] / reference, 0.75,
               item="15, targets"),
        Target("(a) `dataset()` / plain tf.data (both in a `tf.function`)",
               rates[DATASET] / plain, 1.5, item="15, targets"),
        Target("(a) for-loop / NumPy reference", rates[FOR_LOOP] / reference, 0.6,
               item="15.2, eager loop"),
        Target("(a) for-loop / plain tf.data (both `for batch in ...`)",
               rates[FOR_LOOP] / eager_plain, 1.5, item="15.2, eager loop"),
    ]
    return table, targets


# -- (b) restore latency -------------------------------------------------------------------

POSITIONS = [0, 10**4, 10**6, 10**8, 10**10]
RESTORE_RECORDS = 10**6


def _first_batch_ms(restore: Callable[[], Any]) -> float:
    start = time.perf_counter()
    next(iter(restore()))
    return (time.perf_counter() - start) * 1e3


def restore_latency(quick: bool, workdir: Path) -> tuple[Table, list[Target]]:
    import grain.python as grain
    import tensorflow as tf

    import resumeloader

    source = _common.RangeSource(RESTORE_RECORDS)
    rounds = 3 if quick else 7
    start = _results.load_average()
    loader = resumeloader.ResumableLoader(source, batch_size=BATCH, seed=SEED)
    next(iter(loader))
    template = loader.get_state()

    def state_at(position: int) -> dict[str, Any]:
        epoch, offset = divmod(position, RESTORE_RECORDS)
        return dict(template, epoch=epoch, offset=offset)

    def set_state(position: int) -> Callable[[], Any]:
        return lambda: (loader.set_state(state_at(position)), loader)[1]

    def checkpoint_read(position: int) -> Callable[[], Any]:
        loader.set_state(state_at(position))
        path = tf.train.Checkpoint(loader=loader).write(str(workdir / f"at{position}"))

        def restore() -> Any:
            fresh = resumeloader.ResumableLoader(source, batch_size=BATCH, seed=SEED)
            tf.train.Checkpoint(loader=fresh).read(path).assert_consumed()
            return fresh.dataset()

        return restore

    sampler = grain.IndexSampler(RESTORE_RECORDS, shard_options=grain.NoSharding(),
                                 shuffle=True, num_epochs=None, seed=SEED)
    grain_loader = grain.DataLoader(data_source=source, sampler=sampler,
                                    operations=[grain.Batch(BATCH)], worker_count=0,
                                    read_options=grain.ReadOptions(num_threads=0))
    grain_state = json.loads(iter(grain_loader).get_state())

    def grain_at(position: int) -> Callable[[], Any]:
        state = json.dumps(dict(grain_state, last_seen_indices={"0": position - 1})).encode()

        def restore() -> Any:
            iterator = iter(grain_loader)
            iterator.set_state(state)
            return iterator

        return restore

    def skip_at(position: int) -> Callable[[], Any]:
        return lambda: (tf.data.Dataset.range(RESTORE_RECORDS).shuffle(10_000, seed=SEED)
                        .repeat().skip(position).batch(BATCH))

    def replay_at(position: int) -> Callable[[], Any]:
        def restore() -> Any:
            rng = np.random.default_rng(SEED)
            epoch, offset = divmod(position, RESTORE_RECORDS)
            for _ in range(epoch):  # rebuild the generator state epoch by epoch
                rng.permutation(RESTORE_RECORDS)
            return [rng.permutation(RESTORE_RECORDS)[offset : offset + BATCH]]

        return restore

    limit = 10**6 if quick else 10**7  # O(k) replays beyond this take minutes
    methods: list[tuple[str, Callable[[int], Callable[[], Any]], int | None]] = [
        ("resumeloader: `set_state` + first batch of `for batch in loader`", set_state, None),
        ("resumeloader: new loader + `Checkpoint.read` + first batch of `dataset()`",
         checkpoint_read, None),
        ("grain `DataLoader`: `set_state` + first batch", grain_at, None),
        ("tf.data replay: `shuffle(10k).repeat().skip(k)`", skip_at, limit),
        ("seed replay: re-run each epoch's permutation", replay_at, limit * 10),
    ]
    contenders, cells_not_run = {}, {}
    for name, at, most in methods:
        for position in POSITIONS:
            if most is not None and position > most:
                cells_not_run[name, position] = "not run (O(k))"
            else:
                restore = at(position)
                contenders[f"{name} @ {position:.0e}"] = lambda r=restore: _first_batch_ms(r)
    medians = _common.interleaved(contenders, rounds)
    table = Table(
        "restore", "(b) Restore latency", "bench_loader.py",
        "ms from restoring to holding the first batch, by position (records consumed), "
        f"median of {rounds} interleaved rounds; {RESTORE_RECORDS:,} records, so position "
        "10^10 is epoch 10,000.",
        [Column("method", "method (ms, median)"),
         *(Column(f"at_{p}", f"{p:.0e}" if p else "0", ",.1f") for p in POSITIONS)],
    )
    for name, _, _ in methods:
        cells = {f"at_{p}": cells_not_run.get((name, p), medians.get(f"{name} @ {p:.0e}"))
                 for p in POSITIONS}
        table.add(method=name, **cells)
    table.finish(start)
    ours = [medians[f"{methods[0][0]} @ {p:.0e}"] for p in POSITIONS]
    targets = [
        Target("(b) `set_state` + first batch, slowest position", max(ours), 50,
               unit=" ms", at_most=True, item="15, restore"),
    ]
    return table, targets


# -- (c) checkpoint size ---------------------------------------------------------------------


def checkpoint_sizes(workdir: Path) -> Table:
    import tensorflow as tf

    import resumeloader

    def saved(name: str, **objects: Any) -> int:
        path = tf.train.Checkpoint(**objects).write(str(workdir / name))
        return sum(p.stat().st_size for p in workdir.glob(Path(path).name + "*"))

    arrays = _common.cifar_like(30_000)
    loader = resumeloader.ResumableLoader(arrays, batch_size=BATCH, seed=SEED)
    next(iter(loader))
    start = _results.load_average()
    table = Table("checkpoint", "(c) Checkpoint size", "bench_loader.py", "",
                  [Column("what", "what"), Column("bytes", "bytes", ",d"),
                   Column("saved", "what is saved")])
    table.add(what="resumeloader: `tf.train.Checkpoint(loader=loader)` files",
              bytes=saved("loader", loader=loader), saved="position + order fields (JSON)")
    table.add(what="resumeloader: `get_state()` as JSON", bytes=len(json.dumps(loader.get_state())),
              saved="the same, without the checkpoint container")
    for buffer in (1_000, 10_000):
        iterator = iter(tf.data.Dataset.from_tensor_slices(arrays).shuffle(buffer, seed=SEED)
                        .batch(BATCH))
        next(iterator)
        size = saved(f"tf{buffer}", iterator=iterator)
        table.add(what=f"plain tf.data iterator, `shuffle({buffer:,})`", bytes=size,
                  saved="the shuffle buffer's records")
    indices = iter(tf.data.Dataset.range(10**6).shuffle(10**6, seed=SEED))
    next(indices)
    table.add(what="naive split: index iterator, `range(10**6).shuffle(10**6)`",
              bytes=saved("naive", iterator=indices), saved="the index buffer")
    grain_iterator = iter(_common.grain_loader(arrays))
    next(grain_iterator)
    table.add(what="grain `DataLoader` `get_state()`", bytes=len(grain_iterator.get_state()),
              saved="last seen index per worker (JSON)")
    return table.finish(start)


def run(quick: bool, sections: str = "abc") -> Report:
    """The sections' tables and their targets."""
    tables, targets = [], []
    if "a" in sections:
        table, found = throughput(quick)
        tables.append(table)
        targets += found
    with tempfile.TemporaryDirectory(prefix="bench_loader_") as directory:
        workdir = Path(directory)  # checkpoints: about 220 MB for (c)
        if "b" in sections:
            table, found = restore_latency(quick, workdir)
            tables.append(table)
            targets += found
        if "c" in sections:
            tables.append(checkpoint_sizes(workdir))
    return Report(tables, targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    parser.add_argument("--sections", default="abc", help="which tables, e.g. 'a'")
    _common.add_json_option(parser)
    args = parser.parse_args()
    _common.BUDGET_SECONDS = 1.0 if args.quick else _common.BUDGET_SECONDS
    timer = _results.Timer(_results.command_line(), args.quick)
    _common.finish(run(args.quick, args.sections), timer, args.json)


if __name__ == "__main__":
    main()
