"""The first batch over a large array read by ``np.load``: no whole-array work before it.

    python benchmarks/bench_first_batch.py [--quick]

(u) A float32 array of 2 GiB (256 MiB with ``--quick``) saved as ``.npy`` and read back
    by ``np.load``, whose data starts 16 bytes past a 64-byte boundary (TensorFlow's
    kernels cannot read it in place). Each measurement runs in a fresh process whose
    TensorFlow is warmed up by a small loader's first batches (aligned and not);
    seconds (wall and CPU of the process) from the loader built to its first batch,
    through ``dataset()`` and through ``for batch in loader``, median of the rounds.
    Then, in one process, the steady state of ``dataset()`` in a ``tf.function`` over
    that array (rows gathered by NumPy) and over an aligned copy of it (read in place
    by ``tf.gather``): records/s and CPU us per record, interleaved rounds, medians.
    Before 0.4 the unaligned array was copied (and digested) whole before the first
    batch: 2.4-19 s for a 307 MB array on a loaded machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import _common  # noqa: E402
import _results  # noqa: E402
import numpy as np  # noqa: E402
from _results import Column, Report, Table, Target  # noqa: E402

WIDTH = 64  # float32 values per record: 256 bytes

_CHILD = """
import json, os, resource, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, sys.argv[3])
import numpy as np
import resumeloader

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

def placed(rows, offset):
    raw = np.empty(rows * 256 + 128, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    return raw[start : start + rows * 256].view(np.float32).reshape(rows, 64)

for offset in (0, 16):  # TensorFlow's one-time start-up, both gather kinds traced once
    warm = resumeloader.ResumableLoader(placed(1000, offset), batch_size=128, seed=0)
    next(iter(warm.dataset()))
    next(iter(warm))
data = np.load(sys.argv[1])
loader = resumeloader.ResumableLoader(data, batch_size=128, seed=0)
wall, start = time.perf_counter(), cpu()
if sys.argv[2] == "dataset":
    next(iter(loader.dataset()))
else:
    next(iter(loader))
print(json.dumps({"wall": time.perf_counter() - wall, "cpu": cpu() - start,
                  "misalignment": data.ctypes.data % 64}))
"""


def _first(path: Path, how: str) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), how, str(HERE)],
        capture_output=True, text=True, check=True, timeout=1800,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _steady(data: np.ndarray, rounds: int, batches: int) -> dict[str, tuple[float, float]]:
    """(records/s, CPU us per record) of dataset() + advance in a tf.function, over
    `data` as it is and over an aligned copy, interleaved rounds, medians."""
    import resumeloader

    aligned = np.empty(data.nbytes + 64, np.uint8)
    start = -aligned.ctypes.data % 64
    aligned = aligned[start : start + data.nbytes].view(data.dtype).reshape(data.shape)
    aligned[...] = data
    arrays = {"`np.load` array, rows gathered by NumPy": data,
              "aligned copy, read in place by `tf.gather`": aligned}

    def measure(array: np.ndarray) -> float:
        loader = resumeloader.ResumableLoader(array, batch_size=_common.BATCH, seed=0)
        return _common.graph_rate(loader.dataset(), batches, loader=loader)

    rates = _common.interleaved({name: (lambda a=a: measure(a)) for name, a in arrays.items()},
                                rounds)
    return {name: (rate, (_common.CPU[name] or 0.0) / rate * 1e6) for name, rate in rates.items()}


def run(quick: bool) -> Report:
    """The table and its target."""
    gib = 0.25 if quick else 2.0
    rounds = 3
    rows = int(gib * (1 << 30)) // (WIDTH * 4)
    start = _results.load_average()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "data.npy"
        array = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32,
                                          shape=(rows, WIDTH))
        array[...] = np.arange(WIDTH, dtype=np.float32)
        array.flush()
        del array
        firsts = {how: [_first(path, how) for _ in range(rounds)] for how in ("dataset", "loop")}
        steady = _steady(np.load(path), rounds, 200 if quick else 1000)
    misaligned = {r["misalignment"] for runs in firsts.values() for r in runs}
    table = Table(
        "first_batch", "(u) First batch over a 2 GiB `np.load` array", "bench_first_batch.py",
        f"{gib:g} GiB float32 array ({rows:,} records of {WIDTH}) saved as .npy and read by "
        f"`np.load` (data {sorted(misaligned)} bytes past a 64-byte boundary), batch "
        f"{_common.BATCH}, shuffled. First batch: seconds from the loader built, a fresh "
        f"warmed-up process each, median of {rounds}. Steady state: `dataset()` + "
        f"`advance()` in a `tf.function`, median of {rounds} interleaved rounds.",
        [Column("what", "what"), Column("wall", "wall", ".3f", " s"),
         Column("cpu", "CPU", ".3f", " s"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column()],
    )
    for how, label in (("dataset", "first batch, `dataset()`"),
                       ("loop", "first batch, `for batch in loader`")):
        runs = firsts[how]
        table.add(what=label, wall=statistics.median(r["wall"] for r in runs),
                  cpu=statistics.median(r["cpu"] for r in runs))
    for name, (rate, cpu) in steady.items():
        table.add(what=f"steady state, {name}", rate=rate, cpu_us=cpu)
    table.finish(start)
    first = {key: statistics.median(r[key] for r in firsts["dataset"]) for key in ("wall", "cpu")}
    # Wall time is the target on an idle machine; CPU time is what a loaded one leaves
    # stable: one target with both, judged on CPU alone when the run was loaded.
    targets = [Target("(u) first `dataset()` batch over a 2 GiB `np.load` array",
                      first["wall"] * 1e3, 100, unit=" ms", at_most=True,
                      item="30.6, no whole-array work", cpu_value=first["cpu"] * 1e3)]
    return Report([table], targets)


def main() -> None:
    _common.script_main(run, __doc__, "a 256 MiB array")


if __name__ == "__main__":
    main()
