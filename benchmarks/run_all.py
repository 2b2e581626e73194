"""The benchmark suite: one command, one Markdown report (benchmarks/RESULTS.md).

    python benchmarks/run_all.py [--quick] [--sections loader,overhead,...,faults]
                                 [--output benchmarks/RESULTS.md]

Runs every benchmark script in one process (the in-memory-array sizes and the Keras
runs in fresh processes of their own) and writes their tables, each naming the script
that produces it alone, under a table of issue 15's targets, met or missed. Every table
states the CPU count and the load average at its start and end; the contenders of a
table run in interleaved rounds and the medians are reported, so the ratios within a
table are the result, and absolute numbers depend on the machine and its load.
``--quick`` (a few minutes) checks that everything runs and shows roughly where the
targets stand; publish figures from a full run on an otherwise idle machine.

The scripts: bench_loader.py ((a) in-memory throughput, (b) restore latency, (c)
checkpoint size), bench_overhead.py ((d) fixed cost per batch, (e) per-record ``map_fn``
overhead), bench_arrays.py ((f) in-memory arrays below and above 1 GiB), bench_map_fn.py
((g) workers for a Python ``map_fn`` against tf.data and grain), bench_workers.py ((h)
worker start-up and Keras ``fit``, run in a process of its own since it imports
TensorFlow at the top like a training script), bench_sampler.py (index throughput);
bench_data.py, bench_mix.py, bench_batching.py and faults.py each run in a process of
their own and their tables (with their own targets) are copied as printed. The
contenders they share are in _common.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import _common  # noqa: E402

SECTIONS = ("loader", "overhead", "arrays", "workers", "sampler", "data", "mix", "batching",
            "faults")

# Scripts run in a process of their own, their tables copied as printed (each prints its
# own targets table): section -> (script, heading).
_PRINTED = {
    "data": ("bench_data.py", "Real data: TFRecord, ArrayRecord, image files, tokens (issue 11)"),
    "mix": ("bench_mix.py", "Weighted mixing (issue 12)"),
    "batching": ("bench_batching.py", "Padding, bucketing and packing (issue 12)"),
    "faults": ("faults.py", "Fault injection: what each fault leaves behind (issue 14)"),
}


def _sampler(quick: bool) -> _common.Report:
    import bench_sampler

    span = _common.Span()
    table = bench_sampler.render(bench_sampler.measure(quick=quick))
    text = "\n".join([
        "### Sampler: record indices per second (`bench_sampler.py`)",
        "",
        "Positions taken at epoch 37, so nothing is replayed to get there; medians of 3 runs.",
        "",
        table,
        "",
        span.caption("Sampler"),
    ])
    return _common.Report(text, [])


def _row_cells(text: str, label: str, occurrence: int) -> list[str]:
    """The cells of the `occurrence`-th Markdown row of `text` labelled `label`."""
    rows = [line for line in text.splitlines() if line.startswith(f"| {label} |")]
    return [cell.strip() for cell in rows[occurrence].strip("|").split("|")]


def _worker_startup(quick: bool) -> _common.Report:
    """bench_workers.py in a fresh process, its tables copied as printed, and issue 15's
    item-1 targets read from its rows for 2 process workers."""
    span = _common.Span()
    with tempfile.TemporaryFile("w+") as out:
        command = [sys.executable, str(HERE / "bench_workers.py"), *(["--quick"] * quick)]
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL)
        try:
            process.wait(timeout=1800 if quick else 5400)
            note = "" if process.returncode == 0 else f"exited with status {process.returncode}"
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            note = "timed out and was killed"
        out.seek(0)
        printed = out.read().strip()
    first = fit = None
    try:
        first = float(_row_cells(printed, "2 process workers", 0)[2])
        fit = float(_row_cells(printed, "2 process workers", 1)[3].rstrip("x"))
    except (IndexError, ValueError):
        note = note or "its tables could not be read"
    text = "\n".join([
        "### (h) Worker start-up and Keras `fit` (`bench_workers.py`)",
        "",
        printed,
        *(["", f"**bench_workers.py: {note}.**"] if note else []),
        "",
        span.caption("Worker start-up (as printed by the script, in its own process)"),
    ])
    targets = [
        _common.Target("(h) first batch of a new epoch after the first, 2 process workers",
                       first, 50, unit=" ms", at_most=True, item="1 (workers)"),
        _common.Target("(h) Keras fit, 5 epochs: 2 process workers / 0 workers", fit, 1.5,
                       item="1 (workers)"),
    ]
    return _common.Report(text, targets)


def _printed(section: str, quick: bool) -> _common.Report:
    """A script of `_PRINTED` in a fresh process; its output as printed, in a text block."""
    script, heading = _PRINTED[section]
    span = _common.Span()
    command = [sys.executable, str(HERE / script)]
    if quick:
        command.append("--quick")
    env = dict(os.environ, COLUMNS="160", TERM="dumb")  # rich: no wrapping, no colours
    try:
        done = subprocess.run(command, capture_output=True, text=True, env=env,
                              timeout=1800 if quick else 3600, check=False)
        printed, status = done.stdout.strip(), done.returncode
        note = "" if status == 0 else f"exited with status {status}: {done.stderr[-600:]}"
    except subprocess.TimeoutExpired:
        printed, note = "", "timed out and was killed"
    text = "\n".join([
        f"### {heading} (`{script}`)",
        "",
        "```text",
        printed,
        "```",
        *(["", f"**{script}: {note}.**"] if note else []),
        "",
        span.caption(f"{script} (as printed, in its own process)"),
    ])
    return _common.Report(text, [])


def run(sections: list[str], quick: bool) -> list[_common.Report]:
    import bench_arrays
    import bench_loader
    import bench_map_fn
    import bench_overhead

    def workers() -> _common.Report:
        steady, startup = bench_map_fn.run(quick), _worker_startup(quick)
        return _common.Report(f"{steady.markdown}\n\n{startup.markdown}",
                              steady.targets + startup.targets)

    runners = {
        "loader": lambda: bench_loader.run(quick),
        "overhead": lambda: bench_overhead.run(quick),
        "arrays": lambda: bench_arrays.run(quick),
        "workers": workers,
        "sampler": lambda: _sampler(quick),
        **{name: (lambda name=name: _printed(name, quick)) for name in _PRINTED},
    }
    reports = []
    for name in sections:
        print(f"== {name}", file=sys.stderr, flush=True)
        reports.append(runners[name]())
    return reports


def render(reports: list[_common.Report], command: str, seconds: float, start_load: str) -> str:
    targets = [target for report in reports for target in report.targets]
    out = [
        "# Benchmark results",
        "",
        f"Generated by `{command}` in {seconds:,.0f} s on {_common.versions()}. Load "
        f"average (1 / 5 / 15 min) {start_load} at the start, {_common.load_average()} at "
        "the end. Each table below was measured in interleaved rounds (medians) and states "
        "the load during it; the ratios within a table are the result. Numbers from a "
        "shared or loaded machine (load average above ~1.5 on 2 CPUs) are provisional.",
        "",
        "## Targets (issue 15)",
        "",
        "The rows name the part of issue 15 they measure (items 1 and 2 were built on other "
        "branches; their targets are measured here all the same).",
        "",
        _common.targets_table(targets),
        "",
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
    parser.add_argument("--output", default=str(HERE / "RESULTS.md"))
    args = parser.parse_args()
    sections = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {unknown}; choose from {', '.join(SECTIONS)}")
    _common.BUDGET_SECONDS = 1.0 if args.quick else _common.BUDGET_SECONDS
    start, start_load = time.perf_counter(), _common.load_average()
    reports = run(sections, args.quick)
    command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "")
    if args.sections != ",".join(SECTIONS):
        command += f" --sections {args.sections}"
    report = render(reports, command, time.perf_counter() - start, start_load)
    Path(args.output).write_text(report)
    print(report)


if __name__ == "__main__":
    main()
