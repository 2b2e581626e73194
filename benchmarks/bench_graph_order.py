"""The record order as TensorFlow ops (``resumeloader/tfdata/graph_order.py``) against NumPy.

    python benchmarks/bench_graph_order.py [--quick]

(a) Cost per index of the order, 128 offsets per call (one batch): the NumPy
    implementation (``core/sampler.permute``, ``core/blocks.BlockOrder.indices``; also at
    8,192 offsets per call, the chunk the loader's plan computes at once) against the
    same order in TensorFlow ops, eagerly, inside a ``tf.function`` and inside a
    ``tf.data`` map (``Dataset.range(batches).map(order)``, pulled inside a
    ``tf.function``), with the bare ``Dataset.range(...).map(offsets)`` beside it: what
    tf.data costs per element before any order is computed. Orders: the global shuffle
    of 50,000 records (Feistel network, cycle walking), of 200 records (the Fisher-Yates
    table), and block orders of 50,000 records with windows of 128 records (a table per
    window) and of 8,192 (a Feistel network per window). Epochs advance as a stream's do.
(b) The graph delivery path on an in-memory CIFAR-like array (50,000 x 32x32x3 uint8
    + int64 label, batch 128): ``GraphBatches.dataset`` (the batches' indices from the
    start position, in the graph, a chunk of batches at a time) + ``map(tf.gather)``, or
    each batch's order and gather in one map (``GraphBatches.batch``), pulled inside a
    ``tf.function`` or by ``for batch in ds``; resumeloader's ``dataset()`` on the graph
    path and on the gather path of 0.3 (index chunks through ``from_generator``), both
    with ``advance()`` in the ``tf.function``; against NumPy (a permutation per epoch
    and ``np.take`` into a batch allocated once, healthy malloc).

Every figure has CPU microseconds per index or record beside it (the process, every
thread: `_common.cpu_seconds`); rounds are interleaved, medians reported. Absolute
numbers depend on the machine and its load (stated under each table); the ratios of
one run are the result.
"""

from __future__ import annotations

import os
import sys
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

ITEM = "30.1, graph path"
NUMPY_TAKE = "NumPy permutation + `np.take` into a batch allocated once (reference)"
FUSED = "graph order + `tf.gather`, one map, in a `tf.function`"
LOADER = "resumeloader `dataset()` + `advance()` in a `tf.function`, graph path"
FLOOR = "floor: one batch made once (`from_tensors(batch).repeat()`), in a `tf.function`"
FLOOR_MAP = "floor + a parallel `map` (identity) + `prefetch`, in a `tf.function`"


def _orders() -> dict[str, tuple[int, Callable[..., Any], Callable[..., Any]]]:
    """name -> (records, NumPy order(epoch, offsets), graph order(epoch, offsets))."""
    from resumeloader.core import blocks, sampler
    from resumeloader.tfdata import graph_order

    def shuffle(n: int) -> tuple[int, Callable[..., Any], Callable[..., Any]]:
        return (n, lambda e, o: sampler.permute(n, SEED, e, o),
                lambda e, o: graph_order.permute(n, SEED, e, o))

    def block(chunk: int, window: int) -> tuple[int, Callable[..., Any], Callable[..., Any]]:
        order = blocks.BlockOrder(50_000, chunk, window, SEED)
        return (50_000, order.indices, lambda e, o: graph_order.block_indices(order, e, o))

    return {
        "global shuffle, 50,000 records": shuffle(50_000),
        "global shuffle, 200 records (table)": shuffle(200),
        "block order, 50,000 records, windows of 128 (tables)": block(32, 4),
        "block order, 50,000 records, windows of 8,192": block(1024, 8),
    }


def _per_call(order: Callable[..., Any], records: int, calls: int, size: int,
              tensors: bool = False) -> Callable[[], float]:
    """Indices/s of `calls` calls of `order(epoch, offsets)` on consecutive batches of
    `size` offsets of the stream (the epoch advancing as a stream's does), given as
    Python ints and NumPy arrays or, with `tensors`, as eager tensors."""
    import tensorflow as tf

    per_epoch = max(1, records // size)

    def work() -> int:
        for k in range(calls):
            epoch, batch = divmod(k, per_epoch)
            offsets = np.arange(batch * size, min(records, (batch + 1) * size), dtype=np.int64)
            if tensors:
                order(tf.constant(epoch, tf.int64), tf.constant(offsets))
            else:
                order(epoch, offsets)
        return calls * min(size, records)

    return lambda: _common.records_rate(work, calls)


def _in_dataset(order: Callable[..., Any] | None, records: int, calls: int) -> Callable[[], float]:
    """Indices/s of ``Dataset.range(calls).map(order of batch k)`` pulled in a tf.function
    (`order` None: the offsets themselves, tf.data's own cost per element)."""
    import tensorflow as tf

    per_epoch = max(1, records // BATCH)
    size = min(BATCH, records)

    def batch(k: tf.Tensor) -> tf.Tensor:
        offsets = (k % per_epoch) * size + tf.range(size, dtype=tf.int64)
        return offsets if order is None else order(k // per_epoch, offsets)

    def rate() -> float:
        ds = tf.data.Dataset.range(calls + 2 * _common.WARMUP_BATCHES).map(
            batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        return _common.graph_rate(ds, calls)

    return rate


def order_cost(quick: bool) -> tuple[Table, list[Target]]:
    import tensorflow as tf

    rounds, calls = (2, 200) if quick else (5, 2_000)
    start = _results.load_average()
    contenders: dict[str, Callable[[], float]] = {}
    rows: list[tuple[str, str, int, str]] = []  # (order, where, per call, contender key)
    for name, (records, numpy_order, graph) in _orders().items():
        function = tf.function(graph)
        ways = {
            "NumPy, 128 per call": _per_call(numpy_order, records, calls, BATCH),
            "NumPy, 8,192 per call": _per_call(numpy_order, records, max(1, calls // 64),
                                               8192),
            "TensorFlow, eager": _per_call(graph, records, max(1, calls // 10), BATCH, True),
            "TensorFlow, in a `tf.function`": _per_call(function, records, calls, BATCH, True),
            "TensorFlow, in a tf.data map": _in_dataset(graph, records, calls),
        }
        for where, measure in ways.items():
            key = f"{name}: {where}"
            contenders[key] = measure
            rows.append((name, where, 8192 if "8,192" in where else BATCH, key))
    bare = "tf.data alone: `Dataset.range().map(offsets)`"
    contenders[bare] = _in_dataset(None, 50_000, calls)
    rates = _common.interleaved(contenders, rounds)
    table = Table(
        "order_cost", "(a) The record order in TensorFlow ops: cost per index",
        "bench_graph_order.py",
        f"Offsets of consecutive batches of a stream, epochs advancing; median of {rounds} "
        "interleaved rounds. \"/ NumPy, CPU\" divides NumPy's CPU per index at 128 per call "
        "by the row's. The tf.data rows include tf.data's own cost per element: the last "
        "row is that cost alone.",
        [Column("order", "order"), Column("where", "where"),
         Column("per_call", "indices per call", ",d"),
         Column("us", "us / index", ",.3f"), _results.cpu_column("index"),
         Column("vs_numpy_cpu", "/ NumPy, CPU", ".2f")],
        note=f"TensorFlow {tf.__version__}",
    )
    for name, where, per_call, key in rows:
        reference = f"{name}: NumPy, 128 per call"
        table.add(order=name, where=where, per_call=per_call, us=1e6 / rates[key],
                  cpu_us=_common.cpu_us(key), vs_numpy_cpu=_common.cpu_ratio(key, reference))
    table.add(order="(none)", where=bare, per_call=BATCH, us=1e6 / rates[bare],
              cpu_us=_common.cpu_us(bare))
    table.finish(start)
    return table, []


def _gather_pipelines(arrays: tuple[np.ndarray, np.ndarray], batches: int
                      ) -> dict[str, Callable[[], float]]:
    import tensorflow as tf

    import resumeloader
    from resumeloader.stages import plan as plan_lib
    from resumeloader.tfdata import graph_batches

    with tf.device("CPU"):
        columns = [tf.convert_to_tensor(a) for a in arrays]
    pipeline = resumeloader.Pipeline(arrays, seed=SEED).shuffle().batch(BATCH)
    plan = plan_lib.Plan(pipeline, num_epochs=None)
    ops = graph_batches.GraphBatches(plan)
    options = tf.data.Options()
    # As the gather path does: no static rewrite, which would copy the captured columns.
    options.experimental_optimization.apply_default_optimizations = False

    def gather(batch: graph_batches.BatchIndices) -> tuple[tf.Tensor, ...]:
        return tuple(tf.gather(column, batch.indices) for column in columns)

    def two_maps() -> tf.data.Dataset:
        ds = ops.dataset(tf.Variable(0, dtype=tf.int64))
        return ds.map(gather, num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=True).prefetch(tf.data.AUTOTUNE).with_options(options)

    def fused() -> tf.data.Dataset:
        ds = tf.data.Dataset.counter().map(
            lambda k: gather(ops.batch(0, k)), num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True)
        return ds.prefetch(tf.data.AUTOTUNE).with_options(options)

    def loader_rate(*, graph: bool) -> float:
        from resumeloader.tfdata import graph_path, paths

        saved = paths.PATHS
        if not graph:
            paths.PATHS = tuple(p for p in saved if p is not graph_path.GraphPath)
        try:
            loader = resumeloader.ResumableLoader(arrays, batch_size=BATCH, seed=SEED)
        finally:
            paths.PATHS = saved
        return _common.graph_rate(loader.dataset(), batches, loader=loader)

    take = _common.healthy(lambda: _common.steady_rate(
        lambda: _common.numpy_take_reference(arrays)))
    with tf.device("CPU"):
        one = tuple(tf.gather(column, tf.range(BATCH)) for column in columns)

    def constant(mapped: bool) -> tf.data.Dataset:
        """A batch already made, every element: tf.data's own cost per batch."""
        ds = tf.data.Dataset.from_tensors(one).repeat()
        if mapped:
            ds = ds.map(lambda *batch: batch, num_parallel_calls=tf.data.AUTOTUNE,
                        deterministic=True).prefetch(tf.data.AUTOTUNE)
        return ds.with_options(options)

    return {
        NUMPY_TAKE: take,
        "graph order + `tf.gather`, two maps, in a `tf.function`": lambda: _common.graph_rate(
            two_maps(), batches),
        FUSED: lambda: _common.graph_rate(fused(), batches),
        "graph order + `tf.gather`, one map, `for batch in ds`": lambda: _common.steady_rate(
            fused),
        FLOOR: lambda: _common.graph_rate(constant(False), batches),
        FLOOR_MAP: lambda: _common.graph_rate(constant(True), batches),
        LOADER: lambda: loader_rate(graph=True),
        "resumeloader `dataset()` + `advance()` in a `tf.function`, gather path (0.3)":
            lambda: loader_rate(graph=False),
    }


def gather_pipeline(quick: bool) -> tuple[Table, list[Target]]:
    import tensorflow as tf

    rounds, batches = (2, 150) if quick else (5, 600)
    arrays = _common.cifar_like(50_000)
    _common.apply_tensorflow_patch()  # every job that builds a tf.data pipeline is there
    start = _results.load_average()
    contenders = _gather_pipelines(arrays, batches)
    rates = _common.interleaved(contenders, rounds)
    reference = rates[NUMPY_TAKE]
    table = Table(
        "gather", "(b) The order and the gather in the graph, CIFAR-like in memory",
        "bench_graph_order.py",
        f"50,000 records of 32x32x3 uint8 + int64 label, batch {BATCH}, shuffled (endless); "
        f"records/s after {_common.WARMUP_BATCHES} batches, median of {rounds} interleaved "
        f"rounds (`tf.function` rows: {batches} batches). The process is in TensorFlow's "
        "malloc regime; the NumPy reference runs with a healthy one (as bench_loader.py's "
        "\"/ NumPy\"). The floor rows hand out a batch made once: what pulling an element "
        "through tf.data into a `tf.function` costs before any order or gather.",
        [Column("pipeline", "pipeline"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(), Column("vs_numpy", "/ NumPy", ".2f"),
         Column("vs_numpy_cpu", "/ NumPy, CPU", ".2f"),
         Column("faults", "faults / batch", ",.1f")],
        note=f"TensorFlow {tf.__version__}",
    )
    for name, rate in rates.items():
        table.add(pipeline=name, rate=rate, cpu_us=_common.cpu_us(name),
                  vs_numpy=rate / reference, vs_numpy_cpu=_common.cpu_ratio(name, NUMPY_TAKE),
                  faults=_common.FAULTS.get(name))
    table.finish(start)
    targets = [
        Target("graph path `dataset()` + `advance()` (tf.function) / healthy NumPy take",
               rates[LOADER] / reference, 0.8, item=ITEM,
               cpu_value=_common.cpu_ratio(LOADER, NUMPY_TAKE)),
    ]
    return table, targets


def run(quick: bool) -> Report:
    """Both tables and the target."""
    cost, targets = order_cost(quick)
    gather, more = gather_pipeline(quick)
    return Report([cost, gather], targets + more)


def main() -> None:
    _common.script_main(run, __doc__, "fewer calls and rounds")


if __name__ == "__main__":
    main()
