"""``Workers("auto")`` against hand-picked workers and tf.data's AUTOTUNE, same ``map_fn``.

    python benchmarks/bench_autotune.py [--quick]
    python benchmarks/bench_autotune.py --workload {a,b,c}   # one workload, printed only
    python benchmarks/bench_autotune.py --memory {a,b,c}     # its auto's memory (a child)

(w) Records/s in steady state and CPU microseconds per record (the process and its
    worker processes), batch 128, endless shuffled loaders, for three ``map_fn``s:
    (a) GIL-holding pure Python (`_common.burn_python`, calibrated to ~2 ms per
    record), (b) GIL-releasing NumPy (`_common.numpy_work`, 64x64 matrix products,
    single-threaded BLAS) and (c) a cheap stage (`_common.identity`). Contenders:
    resumeloader with 0 workers, 2 thread and 2 process workers (`bench_map_fn.py`'s
    contenders), ``Workers("auto")`` and plain tf.data with the same function in
    ``map(numpy_function, num_parallel_calls=AUTOTUNE)``. The hand-picked ones and tf.data
    are measured after 4 batches (start-up excluded); ``Workers("auto")`` after it
    decided (its trials excluded: their batches and seconds are in the table, with the
    decision, and after `SETTLE_SECONDS` more: the switch from its trials to its choice
    is not steady state). Interleaved rounds, medians (`_common.interleaved`). A row is
    named by its workload and pipeline only (`compare_runs.py` pairs the rows of two
    runs by their names): the map_fn's measured cost has a column of its own and the
    decision is not part of the name. For
    ``Workers("auto")``: the peak resident memory the loader added to the process tree
    against the RAM budget it was given (`Tuning`'s default: `tuning.MEMORY_SHARE` of the
    memory available when the loader was made, which leaves out what the process held
    already), measured once per workload in a process of its own (``--memory``) that
    imports TensorFlow and makes a few batches first, then runs one round of the auto
    contender: its peak above its memory when the loader was made, plus its worker
    processes' peaks, trials included (`_common.PeakRss.added`). In the rounds' process
    the figure held what the process gave back and took again from earlier contenders
    (141 and 187 MiB in two runs of (a), whose two workers hold ~95).

Absolute numbers depend on the machine and its load; the ratios in one run are the
result.
"""

from __future__ import annotations

import json
import os
import subprocess
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
#: Seconds of batches `Workers("auto")` reads after its decision before the clock starts:
#: its first half second ran up to 40% more CPU per record than the rest (3 runs of (b)).
SETTLE_SECONDS = 0.5
AUTO, TF = "`Workers(\"auto\")`", "tf.data `map(numpy_function, AUTOTUNE)`"
# What each Workers("auto") loader decided, per workload: (decision, batches, seconds).
_DECIDED: dict[str, list[tuple[str, int, float]]] = {}
# Per workload: the added peak RSS of the tree and the RAM budget (`_memory_alone`).
_MEMORY: dict[str, tuple[int, int]] = {}
#: The line of ``--memory``'s output that holds its figures.
MEMORY_LINE = "MEMORY "


def _auto_rate(source: np.ndarray, fn: Callable[..., Any], workload: str,
               peak: _common.PeakRss | None = None) -> Callable[[], float]:
    """Records/s of a fresh Workers("auto") loader once it decided and `SETTLE_SECONDS`
    passed (trials and the switch excluded). With `peak` (entered), its memory is sampled
    until then (`PeakRss.stop_watching`)."""
    import resumeloader

    def measure() -> float:
        start = time.perf_counter()
        loader = resumeloader.ResumableLoader(
            source, batch_size=BATCH, seed=SEED, map_fn=fn,
            workers=resumeloader.Workers("auto"))
        iterator = iter(loader)
        batches = 0
        while not loader.stats().decisions:
            next(iterator)
            batches += 1
        decision = loader.stats().decisions[-1]
        chosen = f"{decision['kind']} x {decision['num_workers']}"
        _DECIDED.setdefault(workload, []).append((chosen, batches, time.perf_counter() - start))
        print(f"  auto decided {chosen} after {batches} batches: {decision['why']}",
              file=sys.stderr)
        settled = time.perf_counter() + SETTLE_SECONDS
        while time.perf_counter() < settled:
            next(iterator)
        if peak is not None:
            # Its trial workers have ended or run on (their peaks kept by the kernel).
            peak.stop_watching()
        rate = _common.steady_rate(lambda: iterator)
        loader.close()
        return rate

    return measure


def memory(letter: str) -> None:
    """``--memory LETTER``: in this process of its own, after TensorFlow's import and a
    few batches, one round of workload `letter`'s Workers("auto") under `PeakRss`; prints
    ``MEMORY {"added": bytes, "budget": bytes}``."""
    from resumeloader.workers import tuning

    _first_use()
    name, (source, fn, _) = _workload_named(letter)
    with _common.PeakRss() as peak:
        budget = tuning.memory_budget(tuning.Tuning())  # what the loader's default gets
        _auto_rate(source, fn, name, peak)()
    print(MEMORY_LINE + json.dumps({"added": peak.added, "budget": budget}), flush=True)


def _memory_alone(workload: str) -> tuple[int, int]:
    """The added peak RSS and RAM budget of `workload`'s Workers("auto"), measured by
    ``--memory`` in a process of its own."""
    done = subprocess.run(
        [sys.executable, __file__, "--memory", workload[1]], capture_output=True, text=True,
        timeout=600, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith(MEMORY_LINE)]
    if done.returncode or not lines:
        msg = (f"bench_autotune.py --memory {workload[1]} failed (exit {done.returncode}): "
               f"{done.stderr[-2000:]}")
        raise RuntimeError(msg)
    figures = json.loads(lines[-1][len(MEMORY_LINE):])
    return figures["added"], figures["budget"]


def _workload(name: str, source: np.ndarray, fn: Callable[..., Any],
              rounds: int) -> tuple[dict[str, float], dict[str, float | None]]:
    # Each warmed up as long as `Workers("auto")` runs its choice before its clock starts.
    contenders = {
        **bench_map_fn.hand_picked(source, fn, SETTLE_SECONDS),
        AUTO: _auto_rate(source, fn, name),
        TF: lambda: _common.steady_rate(lambda: _common.plain_tf(source, fn),
                                        warm_seconds=SETTLE_SECONDS),
    }
    rates = _common.interleaved(contenders, rounds)
    return rates, {name: _common.cpu_us(name) for name in contenders}


def _workloads() -> dict[str, tuple[np.ndarray, Callable[..., Any], float]]:
    """Each workload by name: its source, its map_fn and the map_fn's measured cost (us
    per record; not in the name, which identifies the row from one run to the next)."""
    gil_us = _common.calibrate_burn(2000.0)
    small = np.random.default_rng(1).random((4_000, 16), np.float32)
    mats = np.random.default_rng(2).random((4_000, 64, 64), np.float32)
    numpy_us = _common.per_call_us(_common.numpy_work, mats[0], 500)
    cheap_us = _common.per_call_us(_common.identity, small[0], 2_000)
    return {
        "(a) GIL-holding Python": (small, _common.burn_python, gil_us),
        "(b) GIL-releasing NumPy": (mats, _common.numpy_work, numpy_us),
        "(c) cheap stage": (small, _common.identity, cheap_us),
    }


def _workload_named(letter: str) -> tuple[str, tuple[np.ndarray, Callable[..., Any], float]]:
    """Workload `letter`'s name and (source, map_fn, its cost)."""
    return next((name, value) for name, value in _workloads().items()
                if name.startswith(f"({letter})"))


def _first_use() -> None:
    """Imports TensorFlow and makes a few batches in this process, so that no measured
    loader's added memory holds the process's one-off growth (TensorFlow's import and
    first tensors: 870 MiB here, measured when the first loader made was auto's)."""
    import resumeloader

    loader = resumeloader.ResumableLoader(np.zeros((256, 4), np.float32), batch_size=BATCH,
                                          seed=SEED, map_fn=_common.identity)
    for _, _batch in zip(range(4), loader, strict=False):
        pass
    loader.close()


def autotune(quick: bool) -> tuple[Table, list[Target]]:
    rounds = 1 if quick else 3
    start = _results.load_average()
    _first_use()
    workloads = _workloads()
    measured = {name: _workload(name, source, fn, rounds)
                for name, (source, fn, _) in workloads.items()}
    for name in workloads:
        _MEMORY[name] = _memory_alone(name)
    table = Table(
        "autotune", "(w) `Workers(\"auto\")` against hand-picked workers and tf.data AUTOTUNE",
        "bench_autotune.py",
        f"Batch {BATCH}, endless shuffled loaders; records/s after 4 batches and "
        f"{SETTLE_SECONDS:g} s (start-up excluded; `Workers(\"auto\")`: after its decision and "
        f"{SETTLE_SECONDS:g} s, its memory no longer sampled by a thread), median of "
        f"{rounds} interleaved round(s); CPU budget {os.cpu_count()} cores. 'map_fn us' is "
        "one call's time, measured alone. 'decided' is "
        "what `Workers(\"auto\")` chose in each round, after how many batches and seconds; "
        "'added peak RSS' the peak resident memory the loader added to the process tree in "
        "one more round run in a process of its own after TensorFlow's import and a few "
        "batches (that process's peak above its memory when the loader was made, plus each "
        "worker process's peak, trials included), 'RAM budget' what its default `Tuning` "
        "gave it (a share of the memory available then).",
        [Column("workload", "workload"), Column("fn_us", "map_fn us", ",.1f"),
         Column("pipeline", "pipeline"),
         Column("rate", "records/s", ",.0f"), _results.cpu_column(),
         Column("vs_best", "/ best hand-picked", ".2f"),
         Column("decided", "decided", identity=False),
         Column("peak_rss_mib", "added peak RSS MiB", ",.0f"),
         Column("budget_mib", "RAM budget MiB", ",.0f")],
    )
    targets = []
    for workload, (rates, cpus) in measured.items():
        best = max(HAND_PICKED, key=lambda n: rates[n])
        for name, rate in rates.items():
            decided, peak, budget = "", None, None
            if name == AUTO:
                decided = "; ".join(f"{c} ({b} batches, {s:.1f} s)"
                                    for c, b, s in _DECIDED.get(workload, []))
                peak, budget = _peak_and_budget(workload)
            table.add(workload=workload, fn_us=workloads[workload][2], pipeline=name,
                      rate=rate, cpu_us=cpus[name],
                      vs_best=rate / rates[best], decided=decided,
                      peak_rss_mib=None if peak is None else peak / 2**20,
                      budget_mib=None if budget is None else budget / 2**20)
        label = workload
        peak, budget = _peak_and_budget(workload)
        targets += [
            Target(f"(w) {label}: auto added peak RSS (process tree) / RAM budget",
                   peak / budget if peak is not None and budget else None, 1.0,
                   at_most=True, item="31.4, autotune",
                   floor=_results.RSS_FLOOR_MIB * 2**20 / budget
                   if budget else 0.0),
            Target(f"(w) {label}: auto / best hand-picked ({best})", rates[AUTO] / rates[best],
                   0.9, item="31.4, autotune"),
            Target(f"(w) {label}: auto / tf.data AUTOTUNE", rates[AUTO] / rates[TF], 1.0,
                   item="31.4, autotune",
                   cpu_value=cpus[TF] / cpus[AUTO] if cpus[TF] and cpus[AUTO] else None),
        ]
    table.finish(start)
    return table, targets


def _peak_and_budget(workload: str) -> tuple[int | None, int | None]:
    """The added peak RSS of the `workload`'s Workers("auto") and the budget it was given
    (None, None: not measured)."""
    return _MEMORY.get(workload, (None, None))


def run(quick: bool) -> Report:
    """The table and its targets."""
    table, targets = autotune(quick)
    return Report([table], targets)


def only(letter: str) -> None:
    """Workload `letter` alone (``--workload``), 3 rounds: each contender's records/s and
    CPU microseconds per record, the decisions and the added peak RSS, printed only."""
    _first_use()
    name, (source, fn, cost) = _workload_named(letter)
    rates, cpus = _workload(name, source, fn, 3)
    print(f"{name} (map_fn {cost:,.1f} us)")
    for contender, rate in rates.items():
        print(f"  {contender}: {rate:,.0f} records/s, {cpus[contender] or 0:.1f} CPU us/record")
    print("  decided:", "; ".join(f"{c} ({b} batches, {s:.1f} s)"
                                  for c, b, s in _DECIDED.get(name, [])))
    peak, budget = _memory_alone(name)
    print(f"  added peak RSS {peak / 2**20:,.0f} MiB of a {budget / 2**20:,.0f} MiB budget "
          "(a process of its own)")


def main() -> None:
    if "--workload" in sys.argv or "--memory" in sys.argv:  # printed only (no results file)
        import argparse

        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--workload", choices="abc", help="one workload, printed")
        which.add_argument("--memory", choices="abc",
                           help="one workload's auto memory, in this process (`memory`)")
        args = parser.parse_args()
        if args.memory:
            memory(args.memory)
        else:
            only(args.workload)
        return
    _common.script_main(run, __doc__, "one round")


if __name__ == "__main__":
    main()
