"""ResumableLoader against the pipelines people use today, side by side in one run.

    python benchmarks/bench_loader.py [--quick] [--sections abc]

(a) In-memory CIFAR-like records (32x32x3 uint8 image + int64 label), batch 128,
    shuffled, records/s in steady state (after 4 batches, median of interleaved
    rounds): ``for batch in loader``; ``dataset()`` pulled inside a ``tf.function``
    with ``advance(after=batch)`` (what Keras does), on the graph path (the default for
    such arrays) and on the gather path it replaced; plain tf.data with a full and a
    10,000-record shuffle, consumed both ways; the naive split pipeline; grain's
    ``DataLoader`` and ``MapDataset``; the NumPy fancy-index loop (the "/ NumPy"
    reference), the NumPy ``np.take`` into a batch allocated once and the memory-copy
    bound.
(b) Restore latency: ms from restoring to holding the first batch, by position, against
    grain's ``set_state`` and the O(k) replays.
(c) Checkpoint size.

Absolute numbers depend on the machine and its load (printed under every table); the
ratios, measured in the same rounds, are the result.
"""

from __future__ import annotations

import contextlib
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
GATHER = "resumeloader: `dataset()` + `advance()` in a `tf.function`, gather path (0.3)"
PLAIN = "plain tf.data, full shuffle, in a `tf.function`"
PLAIN_EAGER = "plain tf.data, full shuffle, `for batch in ds`"
NUMPY = "NumPy permutation + fancy-index (reference)"
NUMPY_TAKE = "NumPy `np.take` into a batch allocated once"
MEMCPY = "memory-copy bound (memcpy bandwidth / record size)"
PATCH, HEALTHY = "TensorFlow's patch", "healthy"
ISSUE = "24, targets"
GRAPH_ISSUE = "30.1, graph path"
LOOP_ISSUE = "30.2, for-loop"


@contextlib.contextmanager
def _without_graph_path() -> Any:
    """Loaders built within it take the path the graph path replaced (the gather path)."""
    from resumeloader.tfdata import graph_path, paths

    saved = paths.PATHS
    paths.PATHS = tuple(p for p in saved if p is not graph_path.GraphPath)
    try:
        yield
    finally:
        paths.PATHS = saved


# -- (a) throughput ----------------------------------------------------------------------


def throughput(quick: bool) -> tuple[Table, list[Target]]:
    import tensorflow as tf

    import resumeloader

    num_records, rounds, batches = (20_000, 3, 150) if quick else (100_000, 5, 600)
    arrays = _common.cifar_like(num_records)
    _common.apply_tensorflow_patch()
    start = _results.load_average()

    def loader() -> resumeloader.ResumableLoader:
        return resumeloader.ResumableLoader(arrays, batch_size=BATCH, seed=SEED)

    def ours_graph() -> float:
        fresh = loader()
        return _common.graph_rate(fresh.dataset(), batches, loader=fresh)

    def ours_gather() -> float:
        with _without_graph_path():
            fresh = loader()
        return _common.graph_rate(fresh.dataset(), batches, loader=fresh)

    def ours_loop() -> float:
        return _common.steady_rate(loader)

    def numpy_loop() -> float:
        return _common.steady_rate(lambda: _common.numpy_reference(arrays))

    # (name, malloc regime, measure): the process is in TensorFlow's regime; the healthy
    # rows run with glibc's mmap threshold raised for their measurement only.
    rows: list[tuple[str, str, Callable[[], float]]] = [
        (FOR_LOOP, PATCH, ours_loop),
        (FOR_LOOP, HEALTHY, _common.healthy(ours_loop)),
        (DATASET, PATCH, ours_graph),
        (DATASET, HEALTHY, _common.healthy(ours_graph)),
        (GATHER, PATCH, ours_gather),
        (PLAIN, PATCH, lambda: _common.graph_rate(_common.plain_tf(arrays), batches)),
        (PLAIN_EAGER, PATCH, lambda: _common.steady_rate(lambda: _common.plain_tf(arrays))),
        ("plain tf.data, shuffle(10,000), in a `tf.function`", PATCH,
         lambda: _common.graph_rate(_common.plain_tf(arrays, shuffle_buffer=10_000), batches)),
        ("naive split pipeline (`from_generator`), `for batch in ds`", PATCH,
         lambda: _common.steady_rate(lambda: _common.naive_split(arrays), share=0.5)),
        ("grain `DataLoader`, 0 workers, `num_threads=0`", PATCH,
         lambda: _common.steady_rate(lambda: _common.grain_loader(arrays), share=0.5)),
        ("grain `MapDataset.source().shuffle().batch()`", PATCH,
         lambda: _common.steady_rate(lambda: _common.grain_dataset(arrays), share=0.5)),
        (NUMPY, HEALTHY, _common.healthy(numpy_loop)),
        (NUMPY, PATCH, numpy_loop),
        (NUMPY_TAKE, PATCH,
         lambda: _common.steady_rate(lambda: _common.numpy_take_reference(arrays))),
        (NUMPY_TAKE, HEALTHY, _common.healthy(
            lambda: _common.steady_rate(lambda: _common.numpy_take_reference(arrays)))),
    ]
    contenders = {f"{name} [{regime}]": measure for name, regime, measure in rows}
    rates = _common.interleaved(contenders, rounds)
    record_bytes = arrays[0][0].nbytes + arrays[1][0].nbytes
    memcpy = _common.copy_bandwidth() / record_bytes

    def rate(name: str, regime: str = PATCH) -> float:
        return rates[f"{name} [{regime}]"]

    reference, plain, eager_plain = rate(NUMPY, HEALTHY), rate(PLAIN), rate(PLAIN_EAGER)
    table = Table(
        "throughput", f"(a) In-memory CIFAR-like records, batch {BATCH}", "bench_loader.py",
        f"{num_records:,} records of 32x32x3 uint8 + int64 label, shuffled; records/s "
        f"after {_common.WARMUP_BATCHES} batches, median of {rounds} interleaved rounds "
        f"(`tf.function` rows: {batches} batches; Python rows: up to "
        f"{_common.BUDGET_SECONDS:g} s, half that for the per-record pipelines). The "
        "process runs in TensorFlow's malloc regime (a `from_generator` dataset iterated "
        "first: every allocation of 128 KiB or more is a fresh mmap), as every job that "
        "calls `dataset()` or Keras `fit` does; *healthy* rows raise glibc's mmap "
        f"threshold to {_common.HEALTHY_MMAP_THRESHOLD >> 20} MiB (`mallopt`) for their "
        "own measurement, so the NumPy loop does not page-fault: the \"/ NumPy\" column "
        "divides by that healthy NumPy loop. Faults: minor page faults per batch "
        "(`getrusage`, the whole process) in the timed part. `dataset()` takes the graph "
        "path (record order and gather in TensorFlow ops, no `from_generator`) unless the "
        "row says gather path (0.3: index chunks through `from_generator`).",
        [Column("pipeline", "pipeline"), Column("malloc", "malloc"),
         Column("rate", "records/s", ",.0f"), _results.cpu_column(),
         Column("vs_numpy", "/ NumPy", ".2f"), Column("vs_numpy_cpu", "/ NumPy, CPU", ".2f"),
         Column("vs_plain", "/ plain tf.data", ".2f"),
         Column("faults", "faults / batch", ",.1f")],
        note=f"TensorFlow {tf.__version__}",
    )
    numpy_key = f"{NUMPY} [{HEALTHY}]"
    for name, regime, _ in rows:
        key = f"{name} [{regime}]"
        table.add(pipeline=name, malloc=regime, rate=rates[key], cpu_us=_common.cpu_us(key),
                  vs_numpy=rates[key] / reference,
                  vs_numpy_cpu=_common.cpu_ratio(key, numpy_key),
                  vs_plain=rates[key] / plain, faults=_common.FAULTS.get(key))
    table.add(pipeline=MEMCPY, malloc="", rate=memcpy, vs_numpy=memcpy / reference,
              vs_plain=memcpy / plain)
    table.finish(start)
    targets = []
    def cpu(name: str, regime: str, reference: str, reference_regime: str) -> float | None:
        return _common.cpu_ratio(f"{name} [{regime}]", f"{reference} [{reference_regime}]")

    # Issue 30 replaced issue 24's "/ healthy NumPy" bounds (for-loop 0.6x, `dataset()`
    # 0.4x): the for-loop at 0.5x the fancy-index reference, `dataset()` at 0.8x the
    # `np.take` one (below).
    for regime in (PATCH, HEALTHY):
        targets += [
            Target(f"(a) for-loop / healthy NumPy, {regime}", rate(FOR_LOOP, regime) / reference,
                   0.5, item=LOOP_ISSUE, cpu_value=cpu(FOR_LOOP, regime, NUMPY, HEALTHY)),
            Target(f"(a) for-loop / plain tf.data (both `for batch in ...`), {regime}",
                   rate(FOR_LOOP, regime) / eager_plain, 2.0, item=ISSUE,
                   cpu_value=cpu(FOR_LOOP, regime, PLAIN_EAGER, PATCH)),
            Target(f"(a) `dataset()` / plain tf.data (both in a `tf.function`), {regime}",
                   rate(DATASET, regime) / plain, 2.0, item=ISSUE,
                   cpu_value=cpu(DATASET, regime, PLAIN, PATCH)),
        ]
    take = rate(NUMPY_TAKE, HEALTHY)
    for regime in (PATCH, HEALTHY):
        targets.append(Target(
            f"(a) `dataset()` / healthy NumPy `np.take` into a batch allocated once, {regime}",
            rate(DATASET, regime) / take, 0.8, item=GRAPH_ISSUE,
            cpu_value=cpu(DATASET, regime, NUMPY_TAKE, HEALTHY)))
    for name in (FOR_LOOP, DATASET):
        faults = _common.FAULTS.get(f"{name} [{PATCH}]")
        label = "for-loop" if name == FOR_LOOP else "`dataset()`"
        targets.append(Target(f"(a) {label} minor faults per batch, {PATCH}", faults, 1.0,
                              unit="", at_most=True, item=ISSUE))
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
    _common.main_with_sections(__doc__.splitlines()[0], run, "abc", "smaller sizes, fewer rounds")


if __name__ == "__main__":
    main()
