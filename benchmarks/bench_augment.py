"""Python augmentation against the loop a user would write: ``map_batch`` and ``map_fn``.

    python benchmarks/bench_augment.py [--quick] [--sections rs]

(r) ``map_batch`` with its per-row ``rngs``: CIFAR-like uint8 records, batch 128,
    shuffled; the same vectorised maths (to float32, a random flip, a random 4-pixel
    shift, a random brightness: three draws per row) run by the loader's ``map_batch``
    (``for batch in loader`` and a Python loop over ``dataset()``, 0 workers; and with
    ``out=True``, the last multiply writing into the loader's recycled output), by the
    same function drawing through ``rngs[i]`` row by row (what 0.3's helpers cost),
    and by the NumPy reference: a permutation per epoch, a fancy-index per batch and
    one ``numpy.random.Generator`` per batch for the draws.
(s) The per-record ``map_fn`` path on small records (8x8 float32, a ``map_fn`` with one
    draw): the loader with 0 workers (``for batch in loader``), a loop calling the bare
    function on the same records with a generator it already has, and plain tf.data
    ``map(numpy_function, AUTOTUNE)`` with the same function. The overhead is the
    loader's CPU per record minus the bare loop's.

Records/s and CPU microseconds per record of the whole process (all threads) over the
timed part, medians of interleaved rounds (`_common.interleaved`); the CPU figure is the
one a loaded machine leaves stable.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import _common  # noqa: E402
import _results  # noqa: E402
import numpy as np  # noqa: E402
from _common import BATCH, SEED  # noqa: E402
from _results import Column, Report, Table, Target  # noqa: E402

PAD = 4
_CPU_US: dict[str, list[float]] = {}


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _rate(name: str, make: Callable[[], Iterable[Any]], records_per_item: int) -> float:
    """Records/s of a fresh ``make()`` after warm-up; its CPU us per record is noted."""
    iterator = iter(make())
    for _ in range(_common.WARMUP_BATCHES):
        next(iterator)
    count, start, cpu = 0, time.perf_counter(), _cpu()
    for item in iterator:
        count += records_per_item
        del item
        if time.perf_counter() - start > _common.BUDGET_SECONDS:
            break
    seconds, cpu = time.perf_counter() - start, _cpu() - cpu
    _CPU_US.setdefault(name, []).append(cpu / count * 1e6)
    return count / seconds


def _measured(contenders: dict[str, tuple[Callable[[], Iterable[Any]], int]],
              rounds: int) -> dict[str, tuple[float, float]]:
    """(records/s, CPU us per record) of each contender, medians of interleaved rounds."""
    _CPU_US.clear()
    rates = _common.interleaved(
        {name: (lambda n=name, m=make, k=per: _rate(n, m, k))
         for name, (make, per) in contenders.items()}, rounds)
    return {name: (rates[name], statistics.median(_CPU_US[name])) for name in contenders}


# -- (r) map_batch -------------------------------------------------------------------


def augment(images: np.ndarray, flips: np.ndarray, shifts: np.ndarray,
            brightness: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """To float32 in [0, 1], flipped left-right where `flips`, shifted by `shifts` - PAD
    pixels (zero padding), scaled by `brightness`: the maths both sides run. With `out`
    the last multiply writes there instead of in place (the same operations)."""
    size = len(images)
    x = images.astype(np.float32)
    x *= np.float32(1 / 255)
    x = np.where(flips[:, None, None, None], x[:, :, ::-1], x)
    padded = np.pad(x, ((0, 0), (PAD, PAD), (PAD, PAD), (0, 0)))
    rows = shifts[:, :1] + np.arange(x.shape[1])
    cols = shifts[:, 1:] + np.arange(x.shape[2])
    x = padded[np.arange(size)[:, None, None], rows[:, :, None], cols[:, None, :]]
    if out is None:
        x *= brightness.astype(np.float32)[:, None, None, None]
        return x
    return np.multiply(x, brightness.astype(np.float32)[:, None, None, None], out=out)


def vectorised(batch: Any, rngs: Any) -> Any:
    """The ``map_batch`` function: three draws per row, all rows at once."""
    images, labels = batch
    flips = rngs.random() < 0.5
    shifts = rngs.integers(0, 2 * PAD + 1, size=2)
    brightness = rngs.uniform(0.8, 1.2)
    return augment(images, flips, shifts, brightness), labels


def vectorised_into(batch: Any, rngs: Any, out: Any) -> Any:
    """`vectorised` writing its images into the loader's ``out`` (``map_batch(...,
    out=True)``): handed to TensorFlow without a copy."""
    images, labels = batch
    flips = rngs.random() < 0.5
    shifts = rngs.integers(0, 2 * PAD + 1, size=2)
    brightness = rngs.uniform(0.8, 1.2)
    return augment(images, flips, shifts, brightness, out[0]), labels


def row_by_row(batch: Any, rngs: Any) -> Any:
    """The same draws made through each row's generator in turn (0.3's helpers did this)."""
    images, labels = batch
    flips = np.array([g.random() < 0.5 for g in rngs])
    shifts = np.stack([g.integers(0, 2 * PAD + 1, size=2) for g in rngs])
    brightness = np.array([g.uniform(0.8, 1.2) for g in rngs])
    return augment(images, flips, shifts, brightness), labels


def numpy_augment_loop(images: np.ndarray, labels: np.ndarray) -> Iterator[Any]:
    """The reference: a permutation per epoch, a fancy-index per batch, one generator
    per batch for the same draws, the same maths."""
    order_rng = np.random.default_rng(SEED)
    step = 0
    while True:
        order = order_rng.permutation(len(images))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            index = order[start : start + BATCH]
            rng = np.random.default_rng([SEED, step])
            step += 1
            flips = rng.random(BATCH) < 0.5
            shifts = rng.integers(0, 2 * PAD + 1, size=(BATCH, 2))
            brightness = rng.uniform(0.8, 1.2, BATCH)
            yield augment(images[index], flips, shifts, brightness), labels[index]


def map_batch_table(quick: bool) -> tuple[Table, list[Target]]:
    import tensorflow as tf

    import resumeloader

    rounds, records = (3, 10_000) if quick else (7, 50_000)
    images, labels = _common.cifar_like(records)
    start = _results.load_average()
    signature = (tf.TensorSpec((32, 32, 3), tf.float32), tf.TensorSpec((), tf.int64))

    def loader(fn: Callable[..., Any], out: bool = False) -> Any:
        pipeline = (resumeloader.Pipeline((images, labels), seed=SEED).shuffle()
                    .batch(BATCH, drop_remainder=True)
                    .map_batch(fn, output_signature=signature, out=out))
        return resumeloader.ResumableLoader.from_pipeline(pipeline)

    def over_dataset() -> Iterator[Any]:
        fresh = loader(vectorised)
        for batch in fresh.dataset():
            fresh.advance()
            yield batch

    reference = "NumPy loop, one `Generator` per batch (reference)"
    eager, graph = "`map_batch`, `for batch in loader`", "`map_batch`, `dataset()` in Python"
    into = "`map_batch(..., out=True)` writing into `out`, `for batch in loader`"
    results = _measured({
        eager: (lambda: loader(vectorised), BATCH),
        into: (lambda: loader(vectorised_into, out=True), BATCH),
        graph: (over_dataset, BATCH),
        "`map_batch` drawing through `rngs[i]` row by row, `for batch in loader`": (
            lambda: loader(row_by_row), BATCH),
        reference: (lambda: numpy_augment_loop(images, labels), BATCH),
    }, rounds)
    table = Table(
        "map_batch", "(r) `map_batch` and its per-row `rngs` against one generator per batch",
        "bench_augment.py",
        f"{records:,} CIFAR-like uint8 records, batch {BATCH}, shuffled, 0 workers; to "
        "float32, random flip, random shift by up to 4 pixels, random brightness (three "
        "draws per row); records/s and CPU us per record (whole process), median of "
        f"{rounds} interleaved rounds.",
        [Column("pipeline", "pipeline"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(), Column("ratio", "/ reference (CPU)", ".2f")],
    )
    base = results[reference][1]
    for name, (rate, cpu) in results.items():
        table.add(pipeline=name, rate=rate, cpu_us=cpu, ratio=base / cpu)
    table.finish(start)
    best = max(base / results[eager][1], base / results[graph][1])
    targets = [Target("(r) `map_batch` / one-generator NumPy loop, CPU per record", best, 0.9,
                      item="30.5, vectorised record RNGs")]
    return table, targets


# -- (s) map_fn overhead -------------------------------------------------------------


def jitter(record: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A small per-record ``map_fn``: one draw, one multiply."""
    return record * np.float32(rng.uniform(0.9, 1.1))


def _bare_loop(records: np.ndarray) -> Iterator[int]:
    """The bare function over the records (shuffled), with a generator it already has,
    a batch's worth of calls per item."""
    generator = np.random.default_rng(SEED)
    order = np.random.default_rng(SEED).permutation(len(records))
    while True:
        for start in range(0, len(order) - BATCH + 1, BATCH):
            for index in order[start : start + BATCH].tolist():
                jitter(records[index], generator)
            yield BATCH


def map_fn_table(quick: bool) -> tuple[Table, list[Target]]:
    import resumeloader

    rounds, records = (3, 20_000) if quick else (7, 100_000)
    digits = np.random.default_rng(3).random((records, 8, 8), np.float32)
    start = _results.load_average()
    ours = "resumeloader `map_fn`, 0 workers, `for batch in loader`"
    bare = "the bare function in a loop (a generator it already has)"
    results = _measured({
        ours: (lambda: resumeloader.ResumableLoader(
            digits, batch_size=BATCH, seed=SEED, map_fn=jitter), BATCH),
        bare: (lambda: _bare_loop(digits), BATCH),
        "plain tf.data, `map(numpy_function, AUTOTUNE)`": (
            lambda: _common.plain_tf(digits, jitter_tf), BATCH),
    }, rounds)
    table = Table(
        "map_fn_overhead", "(s) The per-record `map_fn` path on small records",
        "bench_augment.py",
        f"{records:,} float32 8x8 records, batch {BATCH}, shuffled; `map_fn` = one "
        "`rng.uniform` and a multiply; records/s and CPU us per record (whole process), "
        f"median of {rounds} interleaved rounds; overhead = CPU per record minus the bare "
        "loop's.",
        [Column("pipeline", "pipeline"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(), Column("overhead", "overhead us/record", ".2f")],
    )
    for name, (rate, cpu) in results.items():
        table.add(pipeline=name, rate=rate, cpu_us=cpu, overhead=cpu - results[bare][1])
    table.finish(start)
    overhead = results[ours][1] - results[bare][1]
    targets = [Target("(s) `map_fn` overhead per record over the bare function, 0 workers",
                      overhead, 5, unit=" us", at_most=True, item="30.5, per-record map_fn")]
    return table, targets


_TF_RNG = np.random.default_rng(SEED)


def jitter_tf(record: np.ndarray) -> np.ndarray:
    """`jitter` as tf.data's ``numpy_function`` calls it: one shared generator (not keyed
    by the record, so not reproducible across runs or resumes)."""
    return jitter(record, _TF_RNG)


def run(quick: bool, sections: str = "rs") -> Report:
    """The tables of `sections` (``r``, ``s``) and their targets."""
    tables, targets = [], []
    for section, make in (("r", map_batch_table), ("s", map_fn_table)):
        if section in sections:
            table, found = make(quick)
            tables.append(table)
            targets += found
    return Report(tables, targets)


def main() -> None:
    _common.main_with_sections(__doc__.splitlines()[0], run, "rs", "fewer records and rounds")


if __name__ == "__main__":
    main()
