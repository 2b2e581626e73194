"""``resumeloader profile``'s recommendation, applied, against the best hand-picked workers.

    python benchmarks/bench_profile.py [--quick] [--json PATH]

(x) For the three ``map_fn``s of bench_autotune.py — (a) GIL-holding pure Python
    (`_common.burn_python`, calibrated to ~2 ms per record; ~0.5 ms with ``--quick``),
    (b) GIL-releasing NumPy (`_common.numpy_work`) and (c) a cheap stage
    (`_common.identity`) — runs the profiler (`resumeloader.tools.profile.profile`, what
    ``resumeloader profile bench_profile:FACTORY`` runs) on a loader of this module with
    no workers (a first try), takes the setting it recommends as the code it prints
    (``workers=Workers(2, kind='process'), prefetch=AUTOTUNE``, evaluated as a user
    pastes it) and builds a loader with it. That loader is then measured beside 0
    workers, 2 thread workers and 2 process workers (bench_map_fn.py's contenders):
    endless shuffled loaders, batch 128, ``for batch in loader``, records/s after 4
    batches, interleaved rounds, medians (`_common.interleaved`). The table also gives
    how long the profiler took and what it recommended.

Target (issue 31, item 3): the recommendation, applied, within 10% of the best
hand-picked setting (records/s; CPU per record is no measure of a choice of workers,
which spend more CPU to go faster). Absolute numbers depend on the machine and its
load; the ratios in one run are the result.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import _common  # noqa: E402
import _results  # noqa: E402
import bench_map_fn  # noqa: E402
import numpy as np  # noqa: E402
from _common import BATCH, SEED  # noqa: E402
from _results import Column, Report, Table, Target  # noqa: E402

HAND_PICKED = bench_map_fn.HAND_PICKED
RECOMMENDED = "profile's recommendation"
ITEM = "31.3, profile"

# The workloads' records and functions (the loaders the profiler builds are made here).
_SMALL = np.random.default_rng(1).random((4_000, 16), np.float32)
_MATS = np.random.default_rng(2).random((4_000, 64, 64), np.float32)
WORKLOADS: dict[str, tuple[np.ndarray, Callable[..., Any]]] = {
    "gil": (_SMALL, _common.burn_python),
    "matmul": (_MATS, _common.numpy_work),
    "cheap": (_SMALL, _common.identity),
}


def _first_try(workload: str) -> Any:
    """A loader of `workload` as a user first writes it: no workers, default prefetch."""
    import resumeloader

    source, fn = WORKLOADS[workload]
    return resumeloader.ResumableLoader(source, batch_size=BATCH, seed=SEED, map_fn=fn)


def gil() -> Any:
    """The profiler's factory for workload (a): ``bench_profile:gil``."""
    return _first_try("gil")


def matmul() -> Any:
    """The profiler's factory for workload (b): ``bench_profile:matmul``."""
    return _first_try("matmul")


def cheap() -> Any:
    """The profiler's factory for workload (c): ``bench_profile:cheap``."""
    return _first_try("cheap")


def applied(setting: str) -> dict[str, Any]:
    """The loader arguments of a recommended `setting`, as a user pasting the printed
    code gets them (``workers=Workers(2, kind='process'), prefetch=AUTOTUNE``)."""
    import resumeloader
    from resumeloader.tfdata import loader as loader_lib

    names = {"Workers": resumeloader.Workers, "AUTOTUNE": loader_lib.AUTOTUNE}
    return eval(f"dict({setting})", {"__builtins__": {"dict": dict}}, names)


def _recommended(workload: str, quick: bool) -> tuple[str, float]:
    """The setting the profiler recommends for `workload`'s first try, and its seconds."""
    from resumeloader.tools import profile

    start = time.perf_counter()
    result = profile.profile(f"bench_profile:{workload}", batches=6 if quick else 20,
                             trial_batches=4 if quick else 10, rounds=1 if quick else 3)
    seconds = time.perf_counter() - start
    chosen = result["recommended"]
    print(f"  profile recommends {chosen.setting} for {workload} ({seconds:.0f} s)",
          file=sys.stderr, flush=True)
    return chosen.setting, seconds


def _apply(workload: str, setting: str) -> Callable[[], float]:
    import resumeloader

    source, fn = WORKLOADS[workload]
    return lambda: _common.steady_rate(lambda: resumeloader.ResumableLoader(
        source, batch_size=BATCH, seed=SEED, map_fn=fn, **applied(setting)))


def profile_table(quick: bool) -> tuple[Table, list[Target]]:
    rounds = 1 if quick else 3
    start = _results.load_average()
    gil_us = _common.calibrate_burn(500.0 if quick else 2000.0)
    numpy_us = _common.per_call_us(_common.numpy_work, _MATS[0], 500)
    cheap_us = _common.per_call_us(_common.identity, _SMALL[0], 2_000)
    # Named without their measured cost (its own column): `compare_runs.py` pairs the
    # rows of two runs by their names.
    labels = {"gil": "(a) GIL-holding Python", "matmul": "(b) GIL-releasing NumPy",
              "cheap": "(c) cheap stage"}
    costs = {"gil": gil_us, "matmul": numpy_us, "cheap": cheap_us}
    table = Table(
        "profile", "(x) `resumeloader profile`'s recommendation against hand-picked workers",
        "bench_profile.py",
        f"Batch {BATCH}, endless shuffled loaders, `for batch in loader`; the profiler run "
        "on a loader with no workers, its recommended setting applied to a fresh loader; "
        f"records/s after {_common.WARMUP_BATCHES} batches, median of {rounds} interleaved "
        "round(s). 'map_fn us' is one call's time, measured alone; 'recommended' the "
        "setting the profiler printed and how long it took.",
        [Column("workload", "workload"), Column("fn_us", "map_fn us", ",.1f"),
         Column("pipeline", "pipeline"), Column("rate", "records/s", ",.0f"),
         _results.cpu_column(), Column("vs_best", "/ best hand-picked", ".2f"),
         Column("recommended", "recommended", identity=False)],
    )
    targets = []
    for workload, (source, fn) in WORKLOADS.items():
        setting, seconds = _recommended(workload, quick)
        contenders = {
            **bench_map_fn.hand_picked(source, fn),
            RECOMMENDED: _apply(workload, setting),
        }
        rates = _common.interleaved(contenders, rounds)
        best = max(HAND_PICKED, key=lambda name: rates[name])
        for name, rate in rates.items():
            shown = f"`{setting}` (profiled in {seconds:.0f} s)" if name == RECOMMENDED else ""
            table.add(workload=labels[workload], fn_us=costs[workload], pipeline=name, rate=rate,
                      cpu_us=_common.cpu_us(name), vs_best=rate / rates[best],
                      recommended=shown)
        label = labels[workload]
        targets.append(Target(f"(x) {label}: profile's recommendation / best hand-picked "
                              f"({best})", rates[RECOMMENDED] / rates[best], 0.9, item=ITEM))
    table.finish(start)
    return table, targets


def run(quick: bool) -> Report:
    """The table and its targets."""
    table, targets = profile_table(quick)
    return Report([table], targets)


def main() -> None:
    _common.script_main(run, __doc__, "one round, shorter profiles, ~0.5 ms GIL work")


if __name__ == "__main__":
    main()
