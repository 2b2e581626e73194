"""In-memory arrays through ``dataset()``: peak memory and throughput below and above 1 GiB.

    python benchmarks/bench_arrays.py [--quick]

(f) float32[16] records (the arrays NumPy allocates, whatever their alignment), batch
    128, shuffled. Each size runs in a fresh process, so that its peak RSS (VmHWM) is
    its own: memory added by building the loader and running two iterators of
    ``dataset()``, as a multiple of the data's size; seconds to the first batch;
    records/s in a ``tf.function`` with ``advance()`` (the median of 3 iterators per
    process, then of interleaved rounds),
    next to the NumPy fancy-index loop on the same array, measured in the same process
    in TensorFlow's malloc regime and with a healthy one (the "/ NumPy" reference), and
    minor page faults per batch. Up to 0.2 the gather path
    switched off above 1 GiB (throughput / 3.2) and added 3.1x the data.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _common  # noqa: E402
import _results  # noqa: E402
from _results import Column, Report, Table, Target  # noqa: E402

GIB = 1 << 30
ROW_BYTES = 64

_CHILD = """
import json, os, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, sys.argv[3])
import numpy as np
import _common, resumeloader

def status(field):
    with open("/proc/self/status") as lines:
        return int(next(l for l in lines if l.startswith(field + ":")).split()[1]) * 1024

rows, batches = int(sys.argv[1]), int(sys.argv[2])
warm = resumeloader.ResumableLoader(np.zeros((1000, 16), np.float32), batch_size=128, seed=0)
_common.graph_rate(warm.dataset(), 10, loader=warm)
data = np.empty((rows, 16), np.float32)
data[...] = np.arange(16, dtype=np.float32)
before = status("VmRSS")
start = time.perf_counter()
loader = resumeloader.ResumableLoader(data, batch_size=_common.BATCH, seed=_common.SEED)
next(iter(loader.dataset()))
first = time.perf_counter() - start
rates, faults, cpus = [], [], []
for _ in range(3):
    rates.append(_common.graph_rate(loader.dataset(), batches, loader=loader))
    faults.append(_common.LAST_FAULTS)
    cpus.append(_common.LAST_CPU_US)
rate, faults, cpu_us = sorted(rates)[1], sorted(faults)[1], sorted(cpus)[1]
added = (status("VmHWM") - before) / data.nbytes
_common.TF_PATCHED = True  # dataset() built a from_generator dataset: TensorFlow's regime
patched = _common.steady_rate(lambda: _common.numpy_reference(data), share=0.5)
reference = _common.healthy(
    lambda: _common.steady_rate(lambda: _common.numpy_reference(data), share=0.5))()
numpy_cpu_us = _common.LAST_CPU_US
print(json.dumps({"added": added, "first": first, "rate": rate, "cpu_us": cpu_us,
                  "numpy": reference, "numpy_cpu_us": numpy_cpu_us,
                  "numpy_patched": patched, "faults": faults,
                  "in_place": data.ctypes.data % 64 == 0,
                  "gather": "tf.gather" in loader.describe()}))
"""


def _child(rows: int, batches: int) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(rows), str(batches), str(HERE)],
        capture_output=True, text=True, timeout=900, check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def run(quick: bool) -> Report:
    """The table and its targets."""
    if sys.platform != "linux":
        print("(f) In-memory arrays: needs Linux (/proc); not run.", file=sys.stderr)
        return Report([], [])
    sizes = [4_000_000, 17_500_000] if quick else [10_000_000, 17_500_000, 35_000_000]
    rounds, batches = (1, 4_000) if quick else (3, 20_000)
    start = _results.load_average()
    runs: dict[int, list[dict[str, float]]] = {rows: [] for rows in sizes}
    for _ in range(rounds):
        for rows in sizes:  # interleaved: a round runs every size once
            runs[rows].append(_child(rows, batches))
            print(f"  {rows:,} rows: {runs[rows][-1]}", file=sys.stderr, flush=True)
    table = Table(
        "arrays", "(f) In-memory arrays through `dataset()`, below and above 1 GiB",
        "bench_arrays.py",
        f"Batch {_common.BATCH}, shuffled, one fresh process per size and round, median of "
        f"{rounds} interleaved round(s); records/s over {batches:,} batches pulled in a "
        "`tf.function` with `advance()`, the median of 3 iterators in each process. Peak "
        "RSS includes the two extra iterators. The NumPy fancy-index loop on the same "
        "array runs twice in the same process after `dataset()`: as it is there (TensorFlow's "
        "malloc patch: every allocation of 128 KiB or more a fresh mmap) and with glibc's "
        f"mmap threshold raised to {_common.HEALTHY_MMAP_THRESHOLD >> 20} MiB for its "
        "measurement (healthy); \"/ NumPy\" divides by the healthy one. Faults: minor page "
        "faults per batch of the `dataset()` rate.",
        [Column("data", "data"), Column("path", "path"),
         Column("added", "peak RSS added / data", ".2f", "x"),
         Column("first", "first batch (s)", ".2f"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(), Column("faults", "faults / batch", ",.1f"),
         Column("numpy", "NumPy, healthy malloc", ",.0f"),
         _results.cpu_column(key="cpu_us_numpy"),
         Column("numpy_patched", "NumPy, TensorFlow's patch", ",.0f"),
         Column("vs_numpy", "/ NumPy", ".2f"), Column("vs_numpy_cpu", "/ NumPy, CPU", ".2f")],
    )
    medians = {}
    for rows in sizes:
        m = {key: statistics.median(r[key] for r in runs[rows]) for key in runs[rows][0]}
        medians[rows] = m
        table.add(
            data=f"{rows:,} x 16 float32 = {rows * ROW_BYTES / GIB:.2f} GiB",
            path="gather, " + ("read in place" if m["in_place"] else "copied once, aligned"),
            added=m["added"], first=m["first"], rate=m["rate"], cpu_us=m["cpu_us"],
            faults=m["faults"], numpy=m["numpy"], cpu_us_numpy=m["numpy_cpu_us"],
            numpy_patched=m["numpy_patched"], vs_numpy=m["rate"] / m["numpy"],
            vs_numpy_cpu=m["numpy_cpu_us"] / m["cpu_us"],
        )
    table.finish(start)
    below = [rows for rows in sizes if rows * ROW_BYTES < GIB]
    above = [rows for rows in sizes if rows * ROW_BYTES > GIB]
    targets = [
        Target(f"(f) peak memory added / data, {rows * ROW_BYTES / GIB:.2f} GiB",
               medians[rows]["added"], 1.3, at_most=True, item="15.3, no 1 GiB cliff")
        for rows in sizes
    ]
    for rows in above:
        targets.append(Target(
            f"(f) throughput at {rows * ROW_BYTES / GIB:.2f} GiB / at "
            f"{below[-1] * ROW_BYTES / GIB:.2f} GiB",
            medians[rows]["rate"] / medians[below[-1]]["rate"], 0.8, item="15.3, no 1 GiB cliff",
        ))
    return Report([table], targets)


def main() -> None:
    _common.script_main(run, __doc__, "smaller sizes, one round")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    main()
