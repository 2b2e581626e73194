"""Index throughput of IndexSampler against the shuffles people use today, in one run.

    python benchmarks/bench_sampler.py [--quick]

Prints a table (and writes it to results/bench_sampler.json): indices/s, the ratio to
resumeloader's vectorised sampler, the memory each approach holds, and whether it is a
bijection at N = 65,537 (= 2**16 + 1, where TensorFlow's and grain's index_shuffle drop
one record and double another).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

import _common
import _results
import numpy as np
from _results import Column, Report, Table

from resumeloader import IndexSampler

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

CHUNK = 100_000
PROBE = 65_537


@dataclass
class Row:
    method: str
    num_records: str
    rate: float  # indices per second
    cpu_us: float  # CPU microseconds per index
    memory: str
    bijective: str


def _median_rate(work: Callable[[], int], repeats: int) -> tuple[float, float]:
    """Indices per second and CPU microseconds per index (`_common.cpu_seconds`), the
    medians of `repeats` runs (after one warm-up run)."""
    work()
    rates, cpus = [], []
    for _ in range(repeats):
        cpu, start = _common.cpu_seconds(), time.perf_counter()
        count = work()
        rates.append(count / (time.perf_counter() - start))
        cpus.append((_common.cpu_seconds() - cpu) * 1e6 / count)
    return statistics.median(rates), statistics.median(cpus)


def _is_bijection(order: np.ndarray, num_records: int) -> str:
    return "yes" if np.array_equal(np.sort(order), np.arange(num_records)) else "NO"


def _ours(rows: list[Row], quick: bool) -> None:
    chunks = 20 if quick else 100
    bijective = _is_bijection(IndexSampler(PROBE, seed=0).indices(0, PROBE), PROBE)
    for num_records in (10**6, 10**10):
        sampler = IndexSampler(num_records, seed=0)
        start = 37 * num_records  # epoch 37: nothing is replayed to get there

        def vectorised(sampler: IndexSampler = sampler, start: int = start) -> int:
            for k in range(chunks):
                sampler.indices(start + k * CHUNK, start + (k + 1) * CHUNK)
            return chunks * CHUNK

        def one_at_a_time(sampler: IndexSampler = sampler, start: int = start) -> int:
            count = 20_000 if quick else 100_000
            for position in range(start, start + count):
                sampler[position]
            return count

        label = f"{num_records:.0e}"
        rows.append(Row("resumeloader, vectorised (chunks of 1e5)", label,
                        *_median_rate(vectorised, 3), "O(chunk)", bijective))
        rows.append(Row("resumeloader, one index at a time", label,
                        *_median_rate(one_at_a_time, 3), "O(1)", bijective))


def _numpy(rows: list[Row], quick: bool) -> None:
    bijective = _is_bijection(np.random.default_rng(0).permutation(PROBE), PROBE)
    for num_records in (10**6,) if quick else (10**6, 10**8):
        def permute(num_records: int = num_records) -> int:
            np.random.default_rng(0).permutation(num_records)
            return num_records

        rate, cpu = _median_rate(permute, 1 if num_records > 10**7 else 3)
        rows.append(Row("numpy default_rng(seed).permutation(N)", f"{num_records:.0e}", rate,
                        cpu, f"{8 * num_records / 2**20:,.0f} MiB", bijective))


def _tensorflow(rows: list[Row], quick: bool) -> None:
    try:
        import tensorflow as tf
    except ImportError:
        return
    seed = tf.constant([1, 2], tf.int64)

    def shuffle(indices: np.ndarray, num_records: int) -> np.ndarray:
        return tf.random.experimental.index_shuffle(
            tf.constant(indices, tf.int64), seed, tf.constant(num_records - 1, tf.int64)
        ).numpy()

    bijective = _is_bijection(shuffle(np.arange(PROBE), PROBE), PROBE)
    chunks = 10 if quick else 50
    for num_records in (10**6, 10**10):
        def vectorised(num_records: int = num_records) -> int:
            for k in range(chunks):
                first = (k * CHUNK) % (num_records - CHUNK)
                shuffle(np.arange(first, first + CHUNK), num_records)
            return chunks * CHUNK

        rows.append(Row("tf.random.experimental.index_shuffle (chunks of 1e5)",
                        f"{num_records:.0e}", *_median_rate(vectorised, 3), "O(chunk)",
                        bijective))


def _grain(rows: list[Row], quick: bool) -> None:
    try:
        import grain.python as grain
    except ImportError:
        return

    def sampler(num_records: int) -> object:
        return grain.IndexSampler(num_records, shard_options=grain.NoSharding(), shuffle=True,
                                  num_epochs=1, seed=0)

    probe = sampler(PROBE)
    bijective = _is_bijection(np.array([probe[i].record_key for i in range(PROBE)]), PROBE)
    big = sampler(10**6)

    def one_at_a_time() -> int:
        count = 5_000 if quick else 20_000
        for position in range(count):
            big[position]
        return count

    rows.append(Row("grain IndexSampler, one index at a time", "1e+06",
                    *_median_rate(one_at_a_time, 2), "O(1)", bijective))


def measure(quick: bool = False) -> list[Row]:
    """Runs every method available here and returns the rows of the table."""
    rows: list[Row] = []
    tracemalloc.stop()
    for part in (_ours, _numpy, _tensorflow, _grain):
        part(rows, quick)
    return rows


def table(rows: list[Row], start: list[float]) -> Table:
    """The rows as a table with ratios to resumeloader's vectorised sampler."""
    reference = next(r.rate for r in rows if r.method.startswith("resumeloader, vectorised"))
    result = Table(
        "sampler", "Sampler: record indices per second", "bench_sampler.py",
        "Positions taken at epoch 37, so nothing is replayed to get there; medians of 3 runs.",
        [Column("method", "method"), Column("num_records", "N"),
         Column("rate", "indices/s", ",.0f"), _results.cpu_column("index"),
         Column("vs_ours", "vs resumeloader vectorised", ".3f", "x"),
         Column("memory", "memory held"), Column("bijective", "bijective at 65,537")],
    )
    for r in rows:
        result.add(method=r.method, num_records=r.num_records, rate=r.rate, cpu_us=r.cpu_us,
                   vs_ours=r.rate / reference, memory=r.memory, bijective=r.bijective)
    return result.finish(start)


def run(quick: bool) -> Report:
    start = _results.load_average()
    return Report([table(measure(quick), start)], [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, smaller sizes")
    _common.add_json_option(parser)
    args = parser.parse_args()
    timer = _results.Timer(_results.command_line(), args.quick)
    _common.finish(run(args.quick), timer, args.json)


if __name__ == "__main__":
    main()
