"""The benchmark suite: one command, one Markdown report (benchmarks/RESULTS.md) and the
same figures as data (benchmarks/results/<script>.json, one file per script).

    python benchmarks/run_all.py [--quick] [--sections loader,overhead,...,faults]
                                 [--scripts bench_overhead,bench_data,...]
                                 [--output benchmarks/RESULTS.md] [--results DIR]

With ``--results DIR`` (another folder than benchmarks/results) the report goes to
DIR/RESULTS.md unless ``--output`` says otherwise; two such runs are compared by
compare_runs.py (``--keep-others benchmarks/results`` after re-running some sections).

The docs' performance and reliability pages are generated from the JSON files
(`python docs/_gen/generate.py`), so after a run, regenerate them and commit both.

Runs every benchmark script in a fresh process of its own (so that no script inherits
another's malloc regime, heap or threads: TensorFlow's ``from_generator`` patch to
malloc, once applied, holds for the whole process) and writes their tables, each naming
the script that produces it alone, under a table of the targets, met or missed. For each
script it prints the malloc regime at its start and end (`_results.malloc_probe`) and
the largest minor-faults-per-batch figure of its tables. Every table
states the CPU count and the load average at its start and end; the contenders of a
table run in interleaved rounds and the medians are reported, so the ratios within a
table are the result, and absolute numbers depend on the machine and its load. Every
throughput table has a CPU column beside its rate (CPU microseconds per record of the
process and its worker processes, `_results.cpu_column`, measured by `_common.Meter`),
and throughput targets carry the same ratio in CPU, on which they are judged when the
run was loaded (`_results.Target`). Before each script (not with ``--quick``) it waits
for the load the previous one left to decay (`_settle`).
``--quick`` (a few minutes) checks that everything runs and shows roughly where the
targets stand; publish figures from a full run on an otherwise idle machine.

The scripts: bench_loader.py ((a) in-memory throughput, (b) restore latency, (c)
checkpoint size), bench_restore.py (the first batch after a restore, with and without
``start_prefetch``), bench_overhead.py ((d) fixed cost per batch, (e) per-record ``map_fn``
overhead), bench_augment.py ((r) ``map_batch`` against one generator per batch, (s) the
``map_fn`` path on small records against the bare function), bench_arrays.py ((f)
in-memory arrays below and above 1 GiB), bench_first_batch.py ((u) the first batch
over a 2 GiB ``np.load`` array), bench_map_fn.py
((g) workers for a Python ``map_fn`` against tf.data and grain), bench_autotune.py
(``Workers("auto")`` against hand-picked workers and tf.data AUTOTUNE), bench_profile.py
(``resumeloader profile``'s recommendation, applied, against the best hand-picked
workers), bench_workers.py ((h)
worker start-up and Keras ``fit``, TensorFlow imported at the top like a training
script), bench_sampler.py (index throughput), bench_graph_order.py (the record order
as TensorFlow ops and a gather pipeline built on it, against NumPy), bench_tfrecord.py
(TFRecord + ``tf_map`` against tuned tf.data over 8 and 64 files, and the in-memory
decode bound),
bench_data.py, bench_mix.py, bench_batching.py, bench_history.py (lineage lookups,
restore and state size with 16 amendments), faults.py, bench_objstore.py (object
storage: TFRecord objects in a local S3 server behind 20 ms of latency) and
bench_dask.py (the Dask backend: CPU-bound ``map_fn``, per-task cost, first batches,
scaling). Each writes its results file itself, which this script reads back. The
contenders they share are in _common.py; the tables and results files, _results.py.
Figures to publish come from two runs compared by compare_runs.py (only the figures
both reproduced within 15%).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import _common  # noqa: E402
import _results  # noqa: E402

SECTIONS = ("loader", "overhead", "arrays", "workers", "sampler", "data", "mix", "batching",
            "history", "faults", "objstore", "dask")

# The scripts each section runs, each in a process of its own.
SCRIPTS = {
    "loader": ["bench_loader", "bench_restore"],
    "overhead": ["bench_overhead", "bench_augment"],
    "arrays": ["bench_arrays", "bench_first_batch"],
    "workers": ["bench_map_fn", "bench_autotune", "bench_profile", "bench_workers"],
    "sampler": ["bench_sampler", "bench_graph_order"],
    "data": ["bench_data", "bench_tfrecord"],
    "mix": ["bench_mix"],
    "batching": ["bench_batching"],
    "history": ["bench_history"],
    "faults": ["faults"],
    "objstore": ["bench_objstore"],
    "dask": ["bench_dask"],
}


def _largest_faults(report: _results.Report) -> float | None:
    values = [row["faults"] for table in report.tables for row in table.rows
              if isinstance(row.get("faults"), (int, float))]
    return max(values) if values else None


def _say_malloc(script: str, path: Path) -> None:
    """Prints the malloc regime at the script's start and end, and its largest faults."""
    if not path.exists():
        return
    report, run = _results.read(path)
    for when in ("start", "end"):
        if run.malloc.get(when):
            print(f"  {script} {when}: {_results.describe_malloc(run.malloc[when])}",
                  file=sys.stderr, flush=True)
    faults = _largest_faults(report)
    if faults is not None:
        print(f"  {script}: at most {faults:,.1f} minor faults per batch in its tables",
              file=sys.stderr, flush=True)


#: Before each script: the 1-minute load average it waits for (this share of the CPUs)...
SETTLE_SHARE = 0.5
#: ... for at most this many seconds. The previous script's own processes raise the load
#: (~2 on 2 CPUs) and it decays with a one-minute time constant (2 to 1 in ~42 s): a script
#: started at once was judged "loaded" by what ran before it, not beside it. On a machine
#: loaded by others it goes on after this (and its tables say the load).
SETTLE_MAX_SECONDS = 90.0


def _settle() -> None:
    """Waits until the 1-minute load average is below `SETTLE_SHARE` of the CPUs (at most
    `SETTLE_MAX_SECONDS`); says how long it waited."""
    limit = SETTLE_SHARE * (os.cpu_count() or 1)
    began = time.monotonic()
    while os.getloadavg()[0] >= limit and time.monotonic() - began < SETTLE_MAX_SECONDS:
        time.sleep(2.0)
    waited = time.monotonic() - began
    if waited >= 1:
        print(f"  waited {waited:.0f} s for the 1-min load average to fall below {limit:g} "
              f"(now {os.getloadavg()[0]:.2f})", file=sys.stderr, flush=True)


def _own_process(script: str, quick: bool, results: Path, run_command: str) -> _results.Report:
    """`script` in a fresh process, writing its results file; the report read back from it."""
    path = results / f"{script}.json"
    command = [sys.executable, str(HERE / f"{script}.py"), "--json", str(path)]
    if quick:
        command.append("--quick")
    path.unlink(missing_ok=True)
    timeout = (1800 if quick else 5400) if script == "bench_workers" else (
        1800 if quick else 3600)
    results.mkdir(parents=True, exist_ok=True)
    try:
        env = dict(os.environ, **{_results.PARENT_COMMAND: run_command})
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              check=False, env=env)
        note = "" if done.returncode == 0 else (
            f"exited with status {done.returncode}: {done.stderr[-600:]}")
    except subprocess.TimeoutExpired:
        note = "timed out and was killed"
    if note or not path.exists():
        table = _results.Table("failed", f"{script}.py: {note or 'no results file'}",
                               f"{script}.py", "", [_results.Column("note", "note")])
        return _results.Report([table], [])
    return _results.read(path)[0]


def run(sections: list[str], quick: bool, results: Path, command: str,
        only: set[str] | None = None) -> list[_results.Report]:
    """The reports of `sections`' scripts (those in `only`, if given), each in a process."""
    reports = []
    for name in sections:
        print(f"== {name}", file=sys.stderr, flush=True)
        for script in SCRIPTS[name]:
            if only is not None and script not in only:
                continue
            if not quick:
                _settle()
            reports.append(_own_process(script, quick, results, command))
            _say_malloc(script, results / f"{script}.json")
    return reports


def render(reports: list[_results.Report], command: str, seconds: float,
           start_load: list[float], runs: str = "") -> str:
    """RESULTS.md: the targets (by issue: `_results.targets_table`), then the tables;
    `runs`, a table of where each script's figures come from (`compare_runs.py`), goes
    between the two when given."""
    targets = [target for report in reports for target in report.targets]
    load = (f"Load average (1 / 5 / 15 min) {_results.format_load(start_load)} at the start, "
            f"{_common.load_average()} at the end." if not runs else
            "Each script's run (date, load, compared or kept) is in the Runs table below.")
    out = [
        "# Benchmark results",
        "",
        f"Generated by `{command}` in {seconds:,.0f} s on {_common.versions()}. {load} "
        "Each table below was measured in interleaved "
        "rounds (medians) and states the load during it; the ratios within a table are the "
        "result. Beside each rate, CPU us per record: the CPU time of the process (every "
        "thread) and its worker processes in the timed part, the figure a loaded machine "
        "leaves stable. Numbers from a shared or loaded machine (load average above ~1.5 on "
        "2 CPUs) are provisional: a target with a CPU figure is then judged on it alone, "
        "on both when the machine was idle. The same figures, as data: "
        "`benchmarks/results/*.json`.",
        "",
        "## Targets",
        "",
        "By issue: the rows name the issue (and item) they belong to.",
        "",
        _results.targets_table(targets),
        "",
    ]
    if runs:
        out += ["## Runs", "",
                "Where each script's figures come from (the load of each table is stated "
                "under it):", "", runs, ""]
    out += [
        "## Tables",
        "",
    ]
    out.append("\n\n".join(report.markdown for report in reports))
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {', '.join(SECTIONS)}")
    parser.add_argument("--output", type=Path,
                        help="the Markdown report (default: benchmarks/RESULTS.md, or "
                             "RESULTS.md in --results when that is another folder)")
    parser.add_argument("--results", type=Path, default=_results.RESULTS,
                        help="folder of the JSON results, one file per script "
                             "(default: %(default)s)")
    parser.add_argument("--scripts",
                        help="comma-separated scripts to run (e.g. bench_overhead,bench_data), "
                             "from the sections that hold them; default: every script of "
                             "--sections")
    args = parser.parse_args()
    if args.output is None:  # a run into another folder leaves the published report alone
        other = args.results.resolve() != _results.RESULTS.resolve()
        args.output = args.results / "RESULTS.md" if other else HERE / "RESULTS.md"
    sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    only = None
    if args.scripts:
        only = {name.strip() for name in args.scripts.split(",") if name.strip()}
        known = {script for name in SECTIONS for script in SCRIPTS[name]}
        if only - known:
            parser.error(f"unknown scripts {sorted(only - known)}; choose from "
                         f"{', '.join(sorted(known))}")
        if args.sections == ",".join(SECTIONS):  # the sections that hold them
            sections = [name for name in SECTIONS if only & set(SCRIPTS[name])]
    start, start_load = time.perf_counter(), _results.load_average()
    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "")
    if args.sections != ",".join(SECTIONS):
        command += f" --sections {args.sections}"
    if args.scripts:
        command += f" --scripts {args.scripts}"
    reports = run(sections, args.quick, args.results, command, only)
    report = render(reports, command, time.perf_counter() - start, start_load)
    Path(args.output).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
