"""What the generated regions of the docs' pages print (called by cog from the pages).

A page holds, inside HTML comments, a call such as
``[[[cog import figures as f; f.table("bench_loader", "throughput")]]]``; cog
(`generate.py`) writes the call's output below it, up to ``[[[end]]]``. Every figure
comes from ``benchmarks/results/<script>.json``, written by the benchmark scripts;
the unsafe-ops table comes from the guard's own list. Nothing here is typed by hand.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(ROOT / "benchmarks"))

import _results  # noqa: E402

PLOTS = ROOT / "docs" / "assets" / "benchmarks"
# The results files the figures come from (another folder: to check the check).
RESULTS = Path(os.environ.get("RESUMELOADER_BENCH_RESULTS", str(_results.RESULTS)))


def _out(text: str) -> None:
    import cog  # the module cog provides while it runs a page's code

    # Blank lines around the output: Markdown ends the HTML comment of the marker first.
    cog.out(f"\n{text.strip()}\n\n")


def results(script: str) -> tuple[_results.Report, _results.Run]:
    path = RESULTS / f"{script}.json"
    if not path.exists():
        msg = (f"No benchmark results for {script}.py: {path} does not exist. Run "
               "`python benchmarks/run_all.py` (or `--quick`), then "
               "`python docs/_gen/generate.py`.")
        raise FileNotFoundError(msg)
    return _results.read(path)


def scripts() -> list[str]:
    return sorted(path.stem for path in RESULTS.glob("*.json"))


def table_text(script: str, key: str) -> str:
    report, _ = results(script)
    table = report.table(key)
    parts = [table.description, table.grid(), table.caption()]
    return "\n\n".join(part for part in parts if part)


def table(script: str, key: str) -> None:
    """A table of a results file: its description, its rows and its caption (the load)."""
    _out(table_text(script, key))


def provenance(names: list[str] | None = None) -> None:
    """Which run each results file comes from: date, quick or full, command, load, machine."""
    names = names or scripts()
    runs = {name: results(name)[1] for name in names}
    lines = []
    quick = sorted(name for name, run in runs.items() if run.quick)
    if quick:
        lines += [
            '!!! warning "Figures from a quick run"',
            "",
            f"    {len(quick)} of these {len(runs)} results files come from a `--quick` run "
            "(smaller data, fewer rounds): they show that the benchmarks run and roughly "
            "where each target stands, not publishable figures. Regenerate them from a "
            "full `python benchmarks/run_all.py` on an otherwise idle machine.",
            "",
        ]
    commands = {run.command for run in runs.values()}
    machines = {_machine(run) for run in runs.values()}
    columns = ["script", "date", "run", "seconds", "load average (1 / 5 / 15 min), start → end"]
    columns += ["command"] * (len(commands) > 1) + ["machine"] * (len(machines) > 1)
    lines += ["| " + " | ".join(columns) + " |", "|---|---|---|---:|---|" + "---|" * (
        len(columns) - 5)]
    for name, run in runs.items():
        load = run.load_average
        cells = [f"`{name}.py`", run.date, "**quick**" if run.quick else "full",
                 f"{run.seconds:,.0f}",
                 f"{_results.format_load(load['start'])} → {_results.format_load(load['end'])}"]
        cells += [f"`{run.command}`"] * (len(commands) > 1)
        cells += [_machine(run)] * (len(machines) > 1)
        lines.append("| " + " | ".join(cells) + " |")
    shared = []
    if len(commands) == 1:
        shared.append(f"Command: `{commands.pop()}`.")
    if len(machines) == 1:
        shared.append(f"Machine: {machines.pop()}.")
    versions = sorted({f"{k} {v}" for run in runs.values() for k, v in run.machine.items()
                       if k not in ("machine", "cpus", "python")})
    shared.append(f"Versions: {', '.join(versions)}.")
    if shared:
        lines += ["", " ".join(shared)]
    _out("\n".join(lines))


def _machine(run: _results.Run) -> str:
    info = run.machine
    return f"{info['machine']}, {info['cpus']} CPUs, Python {info['python']}"


def targets(names: list[str] | None = None) -> None:
    """The targets of every results file, measured against what was wanted, met or missed,
    sorted by issue (`_results.by_issue`). A target with a CPU figure is judged on it alone
    when its run was loaded, by the rule of `_results.judge` (applied here too, so a file
    written before the rule changed is judged by the current one) and says which load."""
    found: list[tuple[_results.Target, str]] = []
    for name in names or scripts():
        report, run = results(name)
        _results.judge(report.targets, run)
        found += [(target, name) for target in report.targets]
    order = {id(target): n for n, target in enumerate(_results.by_issue([t for t, _ in found]))}
    found.sort(key=lambda pair: order[id(pair[0])])
    lines = ["| target | measured | wanted |  | issue | script |", "|---|---:|---:|---|---|---|"]
    for target, name in found:
        verdict = "met" if target.met else f"**{target.verdict()}**"
        lines.append(f"| {target.label} | {target.measured()} | {target.wanted} | "
                     f"{verdict} | {target.item} | `{name}.py` |")
    _out("\n".join(lines))


# -- plots: drawn by plots.py, checked by a hash of the data they show --------------------

# name -> (script, table key, alt text)
PLOT_DATA = {
    "throughput": ("bench_loader", "throughput", "In-memory throughput, records/s, by pipeline"),
    "restore": ("bench_loader", "restore", "Restore to the first batch, ms, by position"),
}


def _figures(row: dict[str, Any], keys: list[str]) -> list[float]:
    return [row[k] for k in keys
            if isinstance(row.get(k), (int, float)) and not isinstance(row.get(k), bool)]


def plot_points(name: str) -> int:
    """How many figures plot `name` would draw: the numbers in its table's plotted
    columns (the rate of the throughput plot, the positions of the restore plot). A
    figure that a second run did not reproduce (compare_runs.py) is blank, not drawn."""
    script, key, _ = PLOT_DATA[name]
    table = results(script)[0].table(key)
    keys = ["rate"] if name == "throughput" else [c.key for c in table.columns[1:]]
    return sum(len(_figures(row, keys)) for row in table.rows)


def plot_digest(name: str) -> str:
    """A hash of what plot `name` shows: its table's rows and load, and its run."""
    script, key, _ = PLOT_DATA[name]
    report, run = results(script)
    shown: dict[str, Any] = {"table": report.table(key).to_json(), "date": run.date}
    return hashlib.sha256(json.dumps(shown, sort_keys=True).encode()).hexdigest()[:16]


def plot(name: str) -> None:
    """The image of plot `name` (an SVG under docs/assets/benchmarks/, made by generate.py),
    or, when its table has no figure to draw, a line saying so (and no image)."""
    script, key, alt = PLOT_DATA[name]
    if not plot_points(name):
        _out(f"*No plot: no figure of `{script}.json`'s table {key!r} is left to draw (each "
             "was blank: not measured, or not reproduced by a second run). The table "
             "below says what was measured.*")
        return
    _out(f"![{alt}](assets/benchmarks/{name}.svg)\n\n"
         f"<!-- plot data {plot_digest(name)}: {script}.json, table {key!r} -->")


# -- the guard's list ----------------------------------------------------------------------


def unsafe_ops() -> None:
    """The tf.data ops the guard of ``loader.dataset()`` refuses, from its own list."""
    from resumeloader.tfdata import guard

    lines = ["| op after `dataset()` | what it would do | instead |", "|---|---|---|"]
    for name, (effect, instead) in guard.UNSAFE.items():
        lines.append(f"| `{name}` | {effect} | {instead} |")
    lines += ["", "Safe (one element per batch, in order; what they return stays guarded): "
              + ", ".join(f"`{name}`" for name in guard.SAFE) + "."]
    _out("\n".join(lines))


def observed(name: str) -> None:
    """What a real run of a docs example printed, captured by ``observed.py``."""
    path = Path(__file__).resolve().parent / "observed" / f"{name}.txt"
    if not path.exists():
        msg = f"{path} does not exist: run `python docs/_gen/observed.py`."
        raise FileNotFoundError(msg)
    _out(f"```text\n{path.read_text().rstrip()}\n```")
