"""What the loader itself costs: per batch, and per record around a ``map_fn``.

    python benchmarks/bench_overhead.py [--quick]

(d) Fixed cost per batch: 8-byte records (so that moving the data costs nothing),
    batch 128, shuffled, microseconds per batch (median of interleaved rounds) for
    ``for batch in loader``, ``dataset()`` (in a ``tf.function`` and in a Python
    loop), plain tf.data consumed both ways, and the NumPy fancy-index loop.
(e) Per-record overhead around a ``map_fn``: a loader with an identity ``map_fn``
    over float32[16] records, 0 workers, timed at two batch sizes; the slope is the
    cost per record, from which the ``map_fn``'s own cost is subtracted. Its
    ``record_rng`` part is measured directly, next to the construction of 0.1.
(f) What the stage counters cost (``loader.stats()``): CPU microseconds per record of
    the whole process with counting on (the default) and off (``RESUMELOADER_STATS=0``),
    on the in-memory paths and on local TFRecord files: the two loaders of a path live
    side by side and take turns in short slices (``_common.paired``).
"""

from __future__ import annotations

import gc
import math
import os
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import _instructions
import _results
import numpy as np
from _common import BATCH, SEED
from _results import Column, Report, Table, Target

FOR_LOOP = "resumeloader: `for batch in loader`"


def fixed_cost(quick: bool) -> tuple[Table, list[Target]]:
    import tensorflow as tf

    import resumeloader

    rounds, batches = (3, 300) if quick else (7, 2_000)
    records = np.arange(200_000, dtype=np.int64)
    start = _results.load_average()

    def loader() -> resumeloader.ResumableLoader:
        return resumeloader.ResumableLoader(records, batch_size=BATCH, seed=SEED)

    def graph() -> float:
        fresh = loader()
        return _common.graph_rate(fresh.dataset(), batches, loader=fresh)

    def eager_dataset() -> float:
        fresh = loader()

        def advancing() -> object:
            for batch in fresh.dataset():
                fresh.advance()
                yield batch

        return _common.steady_rate(advancing)

    contenders: dict[str, Callable[[], float]] = {
        FOR_LOOP: lambda: _common.steady_rate(loader),
        "resumeloader: `dataset()` + `advance()` in a `tf.function`": graph,
        "resumeloader: `dataset()` + `advance()`, Python loop": eager_dataset,
        "plain tf.data, full shuffle, in a `tf.function`": lambda: _common.graph_rate(
            _common.plain_tf(records), batches
        ),
        "plain tf.data, full shuffle, `for batch in ds`": lambda: _common.steady_rate(
            lambda: _common.plain_tf(records)
        ),
        "NumPy permutation + fancy-index": lambda: _common.steady_rate(
            lambda: _common.numpy_reference(records)
        ),
    }
    rates = _common.interleaved(contenders, rounds)
    table = Table(
        "fixed_cost", "(d) Fixed cost per batch", "bench_overhead.py",
        f"int64 records (8 bytes), batch {BATCH}, shuffled; microseconds per batch in "
        f"steady state, median of {rounds} interleaved rounds.",
        [Column("consumer", "consumer"), Column("us", "us per batch", ",.1f"),
         _results.cpu_column("batch")],
        note=f"TensorFlow {tf.__version__}",
    )
    for name, rate in rates.items():
        cpu = _common.cpu_us(name)
        table.add(consumer=name, us=BATCH / rate * 1e6, cpu_us=None if cpu is None else cpu * BATCH)
    table.finish(start)
    cost = BATCH / rates[FOR_LOOP] * 1e6
    cpu = _common.cpu_us(FOR_LOOP)
    target = Target("(d) `for batch in loader` fixed cost per batch", cost, 100, unit=" us",
                    at_most=True, item="15.2, eager loop",
                    cpu_value=None if cpu is None else cpu * BATCH)
    return table, [target]


def map_overhead(quick: bool) -> tuple[Table, list[Target]]:
    import resumeloader

    rounds, small, large = (5, 32, 1024) if quick else (7, 32, 1024)
    records = np.random.default_rng(0).random((100_000, 16), np.float32)
    start = _results.load_average()

    def rate(batch_size: int) -> Callable[[], float]:
        return lambda: _common.steady_rate(lambda: resumeloader.ResumableLoader(
            records, batch_size=batch_size, seed=SEED, map_fn=_common.identity
        ))

    rates = _common.interleaved({str(small): rate(small), str(large): rate(large)}, rounds)
    rates = {int(size): value for size, value in rates.items()}

    def slope(us_per_record: dict[int, float]) -> tuple[float, float]:
        """Per record and fixed per batch, from the cost per record at the two sizes."""
        batch = {size: size * us_per_record[size] for size in (small, large)}
        per_record = (batch[large] - batch[small]) / (large - small)
        return per_record, batch[small] - small * per_record

    per_record, fixed = slope({size: 1e6 / rates[size] for size in (small, large)})
    cpu_sizes = {size: _common.cpu_us(str(size)) for size in (small, large)}
    per_record_cpu, fixed_cpu = (None, None) if None in cpu_sizes.values() else slope(
        cpu_sizes)  # type: ignore[arg-type]
    call = _common.per_call_us(lambda r: _common.identity(r, None), records[0])
    call_cpu = _common.LAST_CPU_US

    def rng_0_1(index: int) -> np.random.Generator:
        # 0.1's construction: the same key, passed as Philox(key=...).
        return np.random.Generator(np.random.Philox(key=(7 << 64) | index))

    rngs = _common.interleaved({
        "now": lambda: _common.per_call_us(
            lambda i: resumeloader.record_rng(SEED, 0, i), 12_345),
        "0.1": lambda: _common.per_call_us(rng_0_1, 12_345),
    }, rounds)
    rng_now, rng_before = rngs["now"], rngs["0.1"]
    rng_now_cpu, rng_before_cpu = _common.cpu_us("now"), _common.cpu_us("0.1")
    burn = _common.per_call_us(lambda r: _common.burn_python(r), records[0])
    burn_cpu = _common.LAST_CPU_US
    overhead = per_record - call

    def minus(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a - b

    overhead_cpu = minus(per_record_cpu, call_cpu)
    table = Table(
        "map_overhead", "(e) Per-record overhead around a `map_fn`", "bench_overhead.py",
        f"float32[16] records, identity `map_fn`, 0 workers, `for batch in loader`; "
        f"records/s at batch sizes {small} and {large}, median of {rounds} interleaved "
        "rounds; the per-call rows are medians of 5 runs of 2,000 calls (the two "
        "`record_rng` rows interleaved, median of the rounds).",
        [Column("what", "what"), Column("us", "us", ".2f"), Column("cpu_us", "CPU us", ".2f")],
    )
    table.add(what="the `map_fn` itself (identity), per call", us=call, cpu_us=call_cpu)
    table.add(what=f"loader, per record (slope between batch sizes {small} and {large}), "
              "`map_fn` included", us=per_record, cpu_us=per_record_cpu)
    table.add(what="**overhead per record around the `map_fn`**", us=overhead,
              cpu_us=overhead_cpu)
    table.add(what="... of which `record_rng(seed, epoch, index)`", us=rng_now,
              cpu_us=rng_now_cpu)
    table.add(what="... the rest (read, spec check, stacking, glue)", us=overhead - rng_now,
              cpu_us=minus(overhead_cpu, rng_now_cpu))
    table.add(what=f"`record_rng` as built by 0.1 (`Philox(key=...)`), for comparison: now "
              f"{rng_now / rng_before:.2f}x of it", us=rng_before, cpu_us=rng_before_cpu)
    table.add(what="loader fixed cost per batch (intercept)", us=fixed, cpu_us=fixed_cpu)
    table.add(what=f"a GIL-bound `map_fn` (`burn_python`), per call; overhead = "
              f"{overhead / burn:.0%} of it", us=burn, cpu_us=burn_cpu)
    table.finish(start)
    targets = [Target("(e) overhead per record around `map_fn`", overhead, 10, unit=" us",
                      at_most=True, item="15.4, thin map path", cpu_value=overhead_cpu)]
    return table, targets


def _tfrecords(root: str, num_records: int) -> list[str]:
    """`num_records` 100-byte records in 4 local TFRecord files."""
    import tensorflow as tf

    paths = [os.path.join(root, f"part-{i}.tfrecord") for i in range(4)]
    writers = [tf.io.TFRecordWriter(path) for path in paths]
    for i in range(num_records):
        writers[i % 4].write(bytes([i % 251]) * 100)
    for writer in writers:
        writer.close()
    return paths


def _eager_run(loader: Any) -> Callable[[int], int]:
    """``run(batches)`` over a live ``for batch in loader`` iteration."""
    iterator = iter(loader)

    def run(batches: int) -> int:
        records = 0
        for _ in range(batches):
            records += _common._records(next(iterator))
        return records

    return run


def _graph_run(loader: Any) -> Callable[[int], int]:
    """``run(batches)`` over a live iterator of ``loader.dataset()`` pulled in a
    ``tf.function`` that advances the loader after each batch (as Keras' step does)."""
    return _common.graph_puller(loader.dataset(), loader=loader)


_INT64_LOOP = "in-memory int64, `for batch in loader`"
#: Fresh pairs of loaders (one on, one off) per row of table (f).
_PAIRS = 16
_MAP_LOOP = "in-memory float32[16] + identity `map_fn`, `for batch in loader`"
_GRAPH = "in-memory int64, `dataset()` + `advance()` in a `tf.function`"
#: The control rows of table (f): paths measured with both loaders of each pair off.
_CONTROLS = {f"control: {path}, both loaders off": path for path in (_MAP_LOOP, _GRAPH)}


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """A distribution-free interval for the median of `values`' population: the k-th
    lowest and k-th highest value, k the largest with P(Binomial(n, 1/2) < k) at most
    (1 - `confidence`) / 2 (k at least 1: with few values, their range). Returns
    ``(low, high, its confidence)``: 97.9% for 10 values (the 2nd and 9th)."""
    ordered, n = sorted(values), len(values)
    tail, k = 0.0, 1
    while k < n // 2:
        below = tail + math.comb(n, k) / 2**n  # P(fewer than k + 1 values below the median)
        if below > (1 - confidence) / 2:
            break
        tail, k = below, k + 1
    return ordered[k - 1], ordered[n - k], 1 - 2 * (tail + 1 / 2**n)


def _counter_paths(root: str) -> dict[str, Callable[[], Any]]:
    """The loaders of table (f) by path, their TFRecord files written under `root`."""
    import resumeloader
    from resumeloader.sources import TFRecordSource

    ints = np.arange(200_000, dtype=np.int64)
    floats = np.random.default_rng(0).random((100_000, 16), np.float32)
    files = _tfrecords(root, 40_000)
    return {
        _INT64_LOOP: lambda: resumeloader.ResumableLoader(ints, batch_size=BATCH, seed=SEED),
        _MAP_LOOP:
            lambda: resumeloader.ResumableLoader(floats, batch_size=BATCH, seed=SEED,
                                                 map_fn=_common.identity),
        "TFRecord files (100-byte records), `for batch in loader`":
            lambda: resumeloader.ResumableLoader.from_pipeline(resumeloader.Pipeline(
                TFRecordSource(files, index_dir=root), seed=SEED).shuffle().batch(BATCH)),
    }


def _built(on: bool, make: Callable[[], Any]) -> Any:
    """``make()`` with the stage counters on or off (``RESUMELOADER_STATS``)."""
    from resumeloader.core import meters

    os.environ[meters.ENV] = "1" if on else "0"
    try:
        return make()
    finally:
        os.environ.pop(meters.ENV, None)


def counting_loop(path: int, on: bool, batches: int) -> None:
    """Under `_instructions.counted`: builds path number `path` of table (f), counters
    `on` or off, warms it up, prints READY, waits for a line, runs `batches` batches,
    prints DONE and waits for its stdin to close. (Not waiting for the process to
    settle: under Valgrind an idle TensorFlow process keeps executing instructions,
    ~50 million a second, more than a prefetch thread's lead of a batch or two.)"""
    import tempfile

    root = tempfile.mkdtemp()
    run = _eager_run(_built(on, list(_counter_paths(root).values())[path]))
    run(64)
    print(_instructions.READY, flush=True)
    sys.stdin.readline()
    run(batches)
    print(_instructions.DONE, flush=True)
    sys.stdin.read()
    shutil.rmtree(root, ignore_errors=True)


def _instruction_counts(batches: int) -> dict[tuple[int, bool], int]:
    """Instructions per batch of each `for batch in loader` path of table (f), counters
    on and off, each in its own process under callgrind, two at a time."""
    import concurrent.futures

    script = str(Path(__file__).resolve())
    jobs = [(path, on) for path in range(3) for on in (True, False)]

    def count(job: tuple[int, bool]) -> int:
        path, on = job
        args = [script, "--count-loop", str(path), "on" if on else "off", str(batches)]
        return _instructions.counted(args)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return {job: total / batches for job, total in zip(jobs, pool.map(count, jobs),
                                                           strict=True)}


def counters_cost(quick: bool) -> tuple[Table, list[Target]]:
    import tempfile

    import tensorflow as tf

    from resumeloader.core import meters

    rounds, slice_seconds = (4, 0.02) if quick else (60, 0.02)
    pairs = 2 if quick else _PAIRS
    start = _results.load_average()
    root = tempfile.mkdtemp()
    paths = _counter_paths(root)

    def contender(path: str, on: bool) -> Callable[[], Callable[[int], int]]:
        if path == _GRAPH:
            return lambda: _graph_run(_built(on, paths[_INT64_LOOP]))
        return lambda: _eager_run(_built(on, paths[path]))

    # Per row, each pair's (CPU on, CPU off, wall on, wall off), us/record (medians over
    # its rounds), and its ratio (`round_ratio` of the CPU figures).
    figures: dict[str, list[tuple[float, float, float, float, float]]] = {}
    rows = [*paths, _GRAPH, *_CONTROLS]
    for name in rows:
        for number in range(pairs):
            # A fresh pair of loaders, one of each setting, live side by side and nothing
            # else; built on first, then off first (so the build order weighs on both
            # alike); the ratio is the median of the pairs' (a pair that met a burst of
            # load weighs as one pair). In a control row "on" is off too.
            contenders = {str(on): contender(_CONTROLS.get(name, name),
                                             on and name not in _CONTROLS)
                          for on in ((True, False) if number % 2 == 0 else (False, True))}
            measured = _common.paired(contenders, rounds, slice_seconds)
            (cpu_on, wall_on), (cpu_off, wall_off) = measured["True"], measured["False"]
            figures.setdefault(name, []).append((
                *(statistics.median(values) for values in (cpu_on, cpu_off, wall_on, wall_off)),
                _common.round_ratio(cpu_on, cpu_off)))
            del contenders, measured
            gc.collect()  # the pair's loaders and threads end before the next pair
    shutil.rmtree(root, ignore_errors=True)
    counts = _instruction_counts(100 if quick else 200) if _instructions.available() else {}
    table = Table(
        "counters_cost", "(f) What the stage counters cost", "bench_overhead.py",
        f"CPU microseconds per record of the whole process (all threads) with the stage "
        f"counters on (the default: every batch counted, one in {meters.EVERY} timed) and off "
        f"(`RESUMELOADER_STATS=0`), batch {BATCH}, 0 workers. Each row runs {pairs} fresh "
        "pairs of loaders, one on and one off (built on first, then off first), one pair "
        f"at a time. The two loaders of a pair live side by side and take turns for "
        f"{rounds} rounds of a slice of about {slice_seconds * 1000:.0f} ms each (every "
        "other round in reverse order), after a warm-up; a pair's ratio is the median over "
        "its rounds of the on slice's CPU over the off slice's of the same round (what the "
        "machine does moves both alike: a slice's CPU per record wanders by tens of "
        "percent on the graph path). 'on / off' is the median of the pairs' ratios, "
        "'interval' an interval for it that assumes no distribution (the pairs' ratios of "
        "ranks k and n + 1 - k, at the confidence given), 'pairs' the lowest and highest "
        "pair's ratio; CPU and wall us/record are medians over the pairs of each pair's "
        "median. The control rows measure pairs of two loaders both off ('on' is the one "
        "built first in even pairs, second in odd ones, as for the other rows): what the "
        "method resolves on that path in this run. "
        "Instructions: per batch, every thread, counted by Valgrind's callgrind over a "
        "fixed number of batches after a warm-up, each loader in its own process (a "
        "figure the machine's load does not move; not for the graph path, whose "
        "tf.data threads Valgrind serialises).",
        [Column("path", "path"), Column("cpu_on", "CPU us/record, on", ".3f"),
         Column("cpu_off", "CPU us/record, off", ".3f"), Column("ratio", "on / off", ".3f"),
         Column("interval", "interval", identity=False),
         Column("pairs", "pairs", identity=False),
         Column("ins_on", "instructions/batch, on", ",.0f"),
         Column("ins_off", "instructions/batch, off", ",.0f"),
         Column("ins_ratio", "on / off, instructions", ".4f"),
         Column("wall_on", "wall us/record, on", ".3f"),
         Column("wall_off", "wall us/record, off", ".3f")],
        note=f"TensorFlow {tf.__version__}",
    )
    targets = []
    for number, name in enumerate(rows):
        columns = list(zip(*figures[name], strict=True))
        cpu_on, cpu_off, wall_on, wall_off, ratio = (statistics.median(c) for c in columns)
        ratios = list(columns[-1])
        low, high, confidence = median_interval(ratios)
        ins_on, ins_off = counts.get((number, True)), counts.get((number, False))
        table.add(path=name, cpu_on=cpu_on, cpu_off=cpu_off, ratio=ratio,
                  interval=f"{low:.3f}-{high:.3f} ({confidence:.0%})",
                  pairs=f"{min(ratios):.3f}-{max(ratios):.3f}",
                  ins_on=ins_on, ins_off=ins_off,
                  ins_ratio=ins_on / ins_off if ins_on and ins_off else None,
                  wall_on=wall_on, wall_off=wall_off)
        if name not in _CONTROLS:
            targets.append(Target(f"(f) counters on / off, CPU per record: {name}", ratio,
                                  1.02, at_most=True, item="31.1, counters"))
    table.finish(start)
    return table, targets


def run(quick: bool) -> Report:
    """The tables and their targets."""
    first, targets = fixed_cost(quick)
    second, more = map_overhead(quick)
    third, counted = counters_cost(quick)
    return Report([first, second, third], targets + more + counted)


def main() -> None:
    if sys.argv[1:2] == ["--count-loop"]:  # a process `_instruction_counts` starts
        path, mode, batches = sys.argv[2:5]
        counting_loop(int(path), mode == "on", int(batches))
        return
    _common.script_main(run, __doc__, "fewer rounds and batches")


if __name__ == "__main__":
    main()
