"""The benchmark suite: one command, one Markdown report (benchmarks/RESULTS.md).

    python benchmarks/run_all.py [--quick] [--output benchmarks/RESULTS.md]

Everything is measured in the same run on the same machine, so the ratios are the
result; absolute numbers depend on the machine and its load (printed in the report).
Throughputs are records/s after the first 4 batches (worker start-up excluded), the best
of `--repeats` runs. Compared with resumeloader:

* plain tf.data: ``from_tensor_slices + shuffle(10_000) [+ map(numpy_function,
  AUTOTUNE)] + batch + prefetch`` (exact checkpoints, but the shuffle buffer is saved);
* the naive split pipeline: a checkpointed index iterator fed through
  ``from_generator`` (loses records on restore; see the README, "Why");
* seed-style replay: rebuild the order from the seed and skip the consumed records;
* grain 0.2.18 ``DataLoader`` with the same number of workers.
"""

from __future__ import annotations

import argparse
import os

# Single-threaded BLAS everywhere (also in worker processes), so that "workers" is the
# only parallelism being compared.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import _common  # noqa: E402
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
BATCH = 128
WARMUP = 4
BUDGET_SECONDS = 2.0


@dataclasses.dataclass
class Sizes:
    in_memory: int = 30_000
    gil_bound: int = 12_000
    numpy: int = 6_000
    repeats: int = 3

    @classmethod
    def quick(cls) -> Sizes:
        return cls(in_memory=10_000, gil_bound=3_000, numpy=2_000, repeats=1)


def _length(batch: Any) -> int:
    return int(np.shape(batch)[0])


def rate(make: Callable[[], Iterable[Any]]) -> tuple[float, float]:
    """Records/s of one fresh iteration after its first WARMUP batches, and the CPU
    time of this process (all its threads, not worker processes) per record in us.

    Stops after BUDGET_SECONDS, so that slow alternatives do not dominate the run.
    """
    iterator = iter(make())
    for _ in range(WARMUP):  # until every worker (ours or grain's) has started
        next(iterator)
    count = 0
    start, cpu = time.perf_counter(), time.process_time()
    for batch in iterator:
        count += _length(batch)
        if time.perf_counter() - start > BUDGET_SECONDS:
            break
    cpu_us = (time.process_time() - cpu) / count * 1e6
    return count / (time.perf_counter() - start), cpu_us


Row = tuple[str, str, float, float]  # workload, pipeline, records/s, CPU us per record


def _interleaved(workload: str, configs: list[tuple[str, Any]], repeats: int) -> list[Row]:
    """Best rate of each config over `repeats` rounds; a round runs every config once,
    so a burst of load on the shared machine hits all alternatives alike."""
    best = dict.fromkeys((name for name, _ in configs), (0.0, float("inf")))
    for _ in range(repeats):
        for name, make in configs:
            (old_rate, old_cpu), (new_rate, new_cpu) = best[name], rate(make)
            best[name] = max(old_rate, new_rate), min(old_cpu, new_cpu)
    rows = [(workload, name, value, cpu) for name, (value, cpu) in best.items()]
    for row in rows:
        print(row, flush=True)
    return rows


# -- pipelines -------------------------------------------------------------------------


def ours(source: Any, map_fn: Any = None, workers: int = 0, kind: str = "thread") -> Any:
    import resumeloader

    return lambda: resumeloader.ResumableLoader(
        source, batch_size=BATCH, seed=0, num_epochs=1, map_fn=map_fn,
        num_workers=workers, worker_type=kind,
    )


def ours_dataset(source: Any) -> Any:
    """What Keras consumes: the dataset; the position advances in the train step."""
    import resumeloader

    return lambda: resumeloader.ResumableLoader(
        source, batch_size=BATCH, seed=0, num_epochs=1
    ).dataset()


def plain_tf(array: np.ndarray, fn: Any = None) -> Any:
    import tensorflow as tf

    def make() -> Any:
        ds = tf.data.Dataset.from_tensor_slices(array).shuffle(10_000, seed=0)
        if fn is not None:
            spec = tf.TensorSpec(array.shape[1:], tf.as_dtype(array.dtype))

            def call(x: Any) -> Any:
                y = tf.numpy_function(fn, [x], spec.dtype, stateful=False)
                return tf.ensure_shape(y, spec.shape)

            ds = ds.map(call, num_parallel_calls=tf.data.AUTOTUNE)
        return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)

    return make


def naive_split(array: np.ndarray) -> Any:
    import tensorflow as tf

    def make() -> Any:
        indices = iter(tf.data.Dataset.range(len(array)).shuffle(len(array), seed=0))
        spec = tf.TensorSpec(array.shape[1:], tf.as_dtype(array.dtype))
        ds = tf.data.Dataset.from_generator(
            lambda: (array[int(i)] for i in indices), output_signature=spec
        )
        return ds.batch(BATCH).prefetch(tf.data.AUTOTUNE)

    return make


def grain_loader(array: np.ndarray, op: str | None = None, workers: int = 0) -> Any:
    import _grain_ops
    import grain.python as grain

    def make() -> Any:
        sampler = grain.IndexSampler(len(array), shard_options=grain.NoSharding(),
                                     shuffle=True, num_epochs=1, seed=0)
        ops = [] if op is None else [getattr(_grain_ops, op)()]
        return grain.DataLoader(data_source=_common.ArraySource(array), sampler=sampler,
                                operations=[*ops, grain.Batch(BATCH)], worker_count=workers)

    return make


# -- sections ---------------------------------------------------------------------------


def parallel_capacity(count: int = 4_000) -> float:
    """How many CPUs' worth of Python work two processes get right now (2.0 on an idle
    2-core machine): the ceiling for any 2-worker speed-up measured in this run."""
    import multiprocessing

    alone = _common.burn_for(count)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_common.burn_for, [10, 10])  # start-up outside the measurement
        start = time.perf_counter()
        pool.map(_common.burn_for, [count, count])
        together = time.perf_counter() - start
    return 2 * alone / together


def _per_record_us(fn: Callable[[np.ndarray], Any], record: np.ndarray) -> float:
    start = time.perf_counter()
    for _ in range(500):
        fn(record)
    return (time.perf_counter() - start) / 500 * 1e6


def throughput(sizes: Sizes) -> list[Row]:
    """Rows (workload, pipeline, records/s)."""
    rows: list[Row] = []
    r = sizes.repeats
    images = np.random.default_rng(0).integers(0, 255, (sizes.in_memory, 32, 32, 3), np.uint8)
    workload = "(i) in-memory uint8 32x32x3"
    configs = [
        ("resumeloader, loader.dataset()", ours_dataset(images)),
        ("resumeloader, for batch in loader (advances)", ours(images)),
        ("plain tf.data", plain_tf(images)),
        ("naive split (index iterator -> from_generator)", naive_split(images)),
        ("grain DataLoader, 0 workers", grain_loader(images)),
    ]
    rows += _interleaved(workload, configs, r)

    small = np.random.default_rng(1).random((sizes.gil_bound, 16), np.float32)
    costs = {"gil": _per_record_us(_common.burn_python, small[0])}
    workload = f"(ii) GIL-bound map_fn (~{costs['gil']:.0f} us Python/record)"
    configs = [
        ("resumeloader, 0 workers", ours(small, _common.burn_python)),
        ("resumeloader, 1 thread worker", ours(small, _common.burn_python, 1)),
        ("resumeloader, 2 thread workers", ours(small, _common.burn_python, 2)),
        ("resumeloader, 1 process worker", ours(small, _common.burn_python, 1, "process")),
        ("resumeloader, 2 process workers", ours(small, _common.burn_python, 2, "process")),
        ("plain tf.data (map AUTOTUNE)", plain_tf(small, _common.burn_python)),
        ("grain DataLoader, 0 workers", grain_loader(small, "BurnPython")),
        ("grain DataLoader, 1 worker", grain_loader(small, "BurnPython", 1)),
        ("grain DataLoader, 2 workers", grain_loader(small, "BurnPython", 2)),
    ]
    rows += _interleaved(workload, configs, r)

    mats = np.random.default_rng(2).random((sizes.numpy, 64, 64), np.float32)
    costs["numpy"] = _per_record_us(_common.numpy_work, mats[0])
    workload = f"(iii) GIL-releasing NumPy map_fn (~{costs['numpy']:.0f} us/record)"
    configs = [
        ("resumeloader, 0 workers", ours(mats, _common.numpy_work)),
        ("resumeloader, 2 thread workers", ours(mats, _common.numpy_work, 2)),
        ("resumeloader, 2 process workers", ours(mats, _common.numpy_work, 2, "process")),
        ("plain tf.data (map AUTOTUNE)", plain_tf(mats, _common.numpy_work)),
        ("grain DataLoader, 0 workers", grain_loader(mats, "NumpyWork")),
        ("grain DataLoader, 2 workers", grain_loader(mats, "NumpyWork", 2)),
    ]
    rows += _interleaved(workload, configs, r)
    return rows


POSITIONS = [0, 10**4, 10**6, 10**8, 10**10]
RESTORE_RECORDS = 10**6


def _first_batch_ms(restore: Callable[[], Iterable[Any]], repeats: int = 5) -> float:
    """The fastest of `repeats` restores: load on a shared machine only adds time."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        next(iter(restore()))
        times.append((time.perf_counter() - start) * 1e3)
    return min(times)


def restore_latency(quick: bool) -> list[tuple[str, list[str]]]:
    """Rows (method, ms to the first batch after restoring at each of POSITIONS)."""
    import grain.python as grain
    import tensorflow as tf

    import resumeloader

    source = _common.RangeSource(RESTORE_RECORDS)
    rows = []

    def ours_at(position: int) -> Callable[[], Any]:
        loader = resumeloader.ResumableLoader(source, batch_size=BATCH, seed=0)
        epoch, offset = divmod(position, RESTORE_RECORDS)
        state = dict(loader.get_state(), epoch=epoch, offset=offset)

        def restore() -> Any:
            loader.set_state(state)
            return loader

        return restore

    sampler = grain.IndexSampler(RESTORE_RECORDS, shard_options=grain.NoSharding(),
                                 shuffle=True, num_epochs=None, seed=0)
    loader = grain.DataLoader(data_source=source, sampler=sampler,
                              operations=[grain.Batch(BATCH)], worker_count=0)
    template = json.loads(iter(loader).get_state())

    def grain_at(position: int) -> Callable[[], Any]:
        state = json.dumps(dict(template, last_seen_indices={"0": position - 1})).encode()

        def restore() -> Any:
            iterator = iter(loader)
            iterator.set_state(state)
            return iterator

        return restore

    def skip_at(position: int) -> Callable[[], Any]:
        return lambda: (
            tf.data.Dataset.range(RESTORE_RECORDS).shuffle(10_000, seed=0).repeat()
            .skip(position).batch(BATCH)
        )

    def reshuffle_at(position: int) -> Callable[[], Any]:
        def restore() -> Any:
            rng = np.random.default_rng(0)
            epoch, offset = divmod(position, RESTORE_RECORDS)
            for _ in range(epoch):  # rebuild the generator state epoch by epoch
                rng.permutation(RESTORE_RECORDS)
            order = rng.permutation(RESTORE_RECORDS)
            return [order[offset : offset + BATCH]]

        return restore

    limit = 10**6 if quick else 10**7  # replay beyond this takes too long to measure here
    for name, at, max_position in [
        ("resumeloader (set_state + first batch)", ours_at, None),
        ("grain DataLoader (set_state + first batch)", grain_at, None),
        ("tf.data replay: shuffle(10k).repeat().skip(k)", skip_at, limit),
        ("seed replay: re-run each epoch's permutation", reshuffle_at, limit * 10),
    ]:
        cells = []
        for position in POSITIONS:
            if max_position is not None and position > max_position:
                cells.append("not run (O(k))")
            else:
                cells.append(f"{_first_batch_ms(at(position)):,.1f}")
        rows.append((name, cells))
        print(rows[-1], flush=True)
    return rows


def _directory_bytes(path: str) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def checkpoint_bytes() -> list[tuple[str, int, str]]:
    """Rows (method, bytes, what is saved)."""
    import grain.python as grain
    import tensorflow as tf

    import resumeloader

    images = np.random.default_rng(0).integers(0, 255, (30_000, 32, 32, 3), np.uint8)
    rows = []
    loader = resumeloader.ResumableLoader(images, batch_size=BATCH, seed=0)
    next(iter(loader))

    def saved(**objects: Any) -> int:
        with tempfile.TemporaryDirectory() as directory:
            tf.train.Checkpoint(**objects).write(os.path.join(directory, "ckpt"))
            return _directory_bytes(directory)

    rows.append(("resumeloader: tf.train.Checkpoint(loader=loader)", saved(loader=loader),
                 "position + order fingerprint (JSON)"))
    rows.append(("resumeloader: get_state() as JSON", len(json.dumps(loader.get_state())),
                 "the same, without the TF checkpoint container"))
    for buffer in (1_000, 10_000):
        ds = tf.data.Dataset.from_tensor_slices(images).shuffle(buffer, seed=0).batch(BATCH)
        iterator = iter(ds)
        next(iterator)
        rows.append((f"plain tf.data iterator, shuffle({buffer:,})", saved(iterator=iterator),
                     "the shuffle buffer's records"))
    indices = iter(tf.data.Dataset.range(len(images)).shuffle(len(images), seed=0))
    next(indices)
    rows.append(("naive split: index iterator, shuffle(N)", saved(iterator=indices),
                 "the index buffer (and loses records on restore)"))
    sampler = grain.IndexSampler(len(images), shard_options=grain.NoSharding(), shuffle=True,
                                 num_epochs=1, seed=0)
    grain_iterator = iter(grain.DataLoader(data_source=_common.ArraySource(images),
                                           sampler=sampler, operations=[grain.Batch(BATCH)],
                                           worker_count=0))
    next(grain_iterator)
    rows.append(("grain DataLoader get_state()", len(grain_iterator.get_state()),
                 "last seen index per worker (JSON)"))
    rows.append(("seed replay", 16, "seed + count, but O(k) work on restore"))
    for row in rows:
        print(row, flush=True)
    return rows


# -- report -----------------------------------------------------------------------------


def _find(rows: list[Row], workload: str, name: str, column: int = 2) -> float:
    row = next(row for row in rows if row[0].startswith(workload) and row[1] == name)
    return float(row[column])


def targets(rows: list[Row], restore: list[tuple[str, list[str]]]) -> list[str]:
    ii, iii = "(ii)", "(iii)"
    lines = []

    def check(label: str, value: float, bound: float) -> None:
        verdict = "met" if value >= bound else "NOT met"
        lines.append(f"| {label} | {value:.2f}x | >= {bound}x | {verdict} |")

    check("GIL-bound: 2 process workers / 0 workers",
          _find(rows, ii, "resumeloader, 2 process workers")
          / _find(rows, ii, "resumeloader, 0 workers"), 1.7)
    check("in-memory: resumeloader / plain tf.data",
          _find(rows, "(i)", "resumeloader, loader.dataset()")
          / _find(rows, "(i)", "plain tf.data"), 0.9)
    check("in-memory, CPU per record: plain tf.data / resumeloader (load-robust view)",
          _find(rows, "(i)", "plain tf.data", 3)
          / _find(rows, "(i)", "resumeloader, loader.dataset()", 3), 0.9)
    for workload, workers in [(ii, 0), (ii, 1), (ii, 2), (iii, 0), (iii, 2)]:
        suffix = f"{workers} worker" + ("" if workers == 1 else "s")
        grain_rate = _find(rows, workload, f"grain DataLoader, {suffix}")
        for kind in ("thread", "process") if workers else ("",):
            name = "resumeloader, 0 workers" if not workers else (
                f"resumeloader, {workers} {kind} worker" + ("" if workers == 1 else "s"))
            if not any(row[1] == name for row in rows if row[0].startswith(workload)):
                continue
            check(f"{workload} {name.split(', ')[1]} / grain {suffix}",
                  _find(rows, workload, name) / grain_rate, 2.0)
    ours_ms = [float(c.replace(",", "")) for c in restore[0][1]]
    check("restore flat in position: first / slowest latency", min(ours_ms) / max(ours_ms), 0.5)
    return lines


def render(sampler_table: str, rows: list[Row], repeats: int, capacity: float,
           restore: list[tuple[str, list[str]]], checkpoints: list[tuple[str, int, str]],
           seconds: float, quick: bool) -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    out = [
        "# Benchmark results",
        "",
        f"Generated by `python benchmarks/run_all.py{' --quick' if quick else ''}` in "
        f"{seconds:.0f} s on {platform.machine()} with {os.cpu_count()} CPUs (load average "
        f"{load} at the end), Python {platform.python_version()}. Batch size {BATCH}. "
        "Numbers are noisy on a shared machine; the ratios within one run are the result. "
        f"Parallel capacity (CPUs' worth of Python work two processes got, mean of a check "
        f"before and after the throughput runs; 2.0 on an idle 2-core machine): "
        f"{capacity:.2f}. No 2-worker speed-up can exceed it.",
        "",
        "## Targets",
        "",
        "| target | measured | wanted | |",
        "|---|---:|---:|---|",
        *targets(rows, restore),
        "",
        f"## Throughput (records/s after the first {WARMUP} batches, best of {repeats})",
        "",
        "| workload | pipeline | records/s | vs first row of workload "
        "| CPU us/record (main process) |",
        "|---|---|---:|---:|---:|",
    ]
    first: dict[str, float] = {}
    for workload, name, value, cpu in rows:
        base = first.setdefault(workload, value)
        out.append(f"| {workload} | {name} | {value:,.0f} | {value / base:.2f}x | {cpu:.1f} |")
    out += [
        "",
        "## Restore latency: ms from restoring to the first batch (best of 5), by position",
        f"Source of {RESTORE_RECORDS:,} records; position 10^10 is epoch 10,000.",
        "",
        "| method | " + " | ".join(f"{p:.0e}" if p else "0" for p in POSITIONS) + " |",
        "|---|" + "---:|" * len(POSITIONS),
    ]
    out += [f"| {name} | " + " | ".join(cells) + " |" for name, cells in restore]
    out += ["", "## Checkpoint size", "", "| method | bytes | what is saved |", "|---|---:|---|"]
    out += [f"| {name} | {size:,} | {what} |" for name, size, what in checkpoints]
    out += ["", "## Sampler throughput (benchmarks/bench_sampler.py --quick)", "", sampler_table]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one repeat")
    parser.add_argument("--output", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    sizes = Sizes.quick() if args.quick else Sizes()
    start = time.perf_counter()
    sys.path.insert(0, str(HERE))
    import bench_sampler

    sampler_table = bench_sampler.render(bench_sampler.measure(quick=True))
    capacity = parallel_capacity()
    print(f"parallel capacity: {capacity:.2f} CPUs", flush=True)
    rows = throughput(sizes)
    capacity = (capacity + parallel_capacity()) / 2
    restore = restore_latency(args.quick)
    checkpoints = checkpoint_bytes()
    report = render(sampler_table, rows, sizes.repeats, capacity, restore, checkpoints,
                    time.perf_counter() - start, args.quick)
    Path(args.output).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
