"""Two benchmark runs compared: only the figures both reproduced within a tolerance are kept.

    python benchmarks/compare_runs.py RUN1 RUN2 [--output DIR] [--tolerance 0.15]
                                      [--markdown PATH] [--keep-others DIR]

RUN1 and RUN2 are folders of results files (``<script>.json``, as `run_all.py --results`
writes them). Every number of every table row and every target of RUN1 is compared with
the same cell of RUN2 (rows matched by their text cells, e.g. pipeline and malloc
regime): it is *reproduced* when the larger of the two is at most ``1 + tolerance``
times the smaller (and has the same sign), or when both are within an absolute floor of
each other for a column whose figures are small counts (minor faults per batch: 0.2
against 0.4 is the same "none") or whose small values are noise (added peak RSS: a
few MiB more or less of the allocator's arenas; a target's own ``floor``). The results
written to ``--output`` (default: ``benchmarks/results``, which the docs are generated
from) are RUN1's figures with every figure that was not reproduced left empty (a
target's value and CPU value too, so it reads "not measured"; on a loaded run a target
without its CPU value loses its wall value too, since it is judged on CPU alone), and
each table's description says how many were dropped. The CPU columns (CPU microseconds
per record, `_results.cpu_column`) are figures like any other: kept where both runs
agree. Prints one line per dropped figure and a summary; exits with status 1 when a
table or a target of RUN1 has no counterpart in RUN2 (the runs are not comparable).
A publication run::

    python benchmarks/run_all.py --results /tmp/bench-run1 --output /tmp/bench-run1/RESULTS.md
    python benchmarks/run_all.py --results /tmp/bench-run2 --output /tmp/bench-run2/RESULTS.md
    python benchmarks/compare_runs.py /tmp/bench-run1 /tmp/bench-run2 \\
        --markdown benchmarks/RESULTS.md
    python docs/_gen/generate.py

After re-running some sections only (``run_all.py --sections data,workers --results
DIR``, twice), ``--keep-others benchmarks/results`` keeps the results files of the
scripts not re-run as they are (their own figures, dates and loads): they are copied to
``--output`` when it is another folder, and RESULTS.md shows them beside the compared
ones, each script's run (date, load, compared or kept) in its "Runs" table::

    python benchmarks/compare_runs.py /tmp/bench-run1 /tmp/bench-run2 \\
        --keep-others benchmarks/results --markdown benchmarks/RESULTS.md
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _results  # noqa: E402

TOLERANCE = 0.15
#: Columns of small counts: two figures within this of each other agree.
ABSOLUTE_FLOORS = {"faults": 1.0, "peak_rss_mib": _results.RSS_FLOOR_MIB}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def agree(a: float, b: float, tolerance: float = TOLERANCE, floor: float = 0.0) -> bool:
    """Whether `a` and `b` agree: within `floor` of each other, or of one sign and the
    larger at most ``1 + tolerance`` times the smaller."""
    if abs(a - b) <= floor:
        return True
    if a == 0 or b == 0 or (a < 0) != (b < 0):
        return False
    small, large = sorted((abs(a), abs(b)))
    return large <= (1 + tolerance) * small * (1 + 1e-12)  # 1.15 * 100 is 114.999...


def _row_key(table: _results.Table, row: dict[str, Any], seen: dict[tuple, int]) -> tuple:
    """A row's naming text cells (`_results.Column.identity`), and which occurrence of
    them it is (rows may repeat them)."""
    text = tuple((c.key, row.get(c.key)) for c in table.columns
                 if c.identity and not _number(row.get(c.key)))
    seen[text] = seen.get(text, 0) + 1
    return (*text, seen[text])


def _rows(table: _results.Table) -> dict[tuple, dict[str, Any]]:
    seen: dict[tuple, int] = {}
    return {_row_key(table, row, seen): row for row in table.rows}


@dataclasses.dataclass
class Comparison:
    """What comparing two runs found."""

    kept: dict[str, _results.Report] = dataclasses.field(default_factory=dict)
    runs: dict[str, _results.Run] = dataclasses.field(default_factory=dict)
    dropped: list[str] = dataclasses.field(default_factory=list)  # one line per figure
    compared: int = 0
    unmatched: list[str] = dataclasses.field(default_factory=list)
    #: Results files of scripts the two runs did not run, kept as they are (`keep_others`).
    others: dict[str, Path] = dataclasses.field(default_factory=dict)


def compare_tables(script: str, one: _results.Table, two: _results.Table, tolerance: float,
                   found: Comparison) -> _results.Table:
    """`one` with the figures `two` does not reproduce emptied."""
    others = _rows(two)
    kept = dataclasses.replace(one, rows=[])
    drops = 0
    for key, row in _rows(one).items():
        other = others.get(key)
        row = dict(row)
        for column in one.columns:
            value = row.get(column.key)
            if not _number(value):
                continue
            found.compared += 1
            theirs = None if other is None else other.get(column.key)
            if _number(theirs) and agree(value, theirs, tolerance,
                                         ABSOLUTE_FLOORS.get(column.key, 0.0)):
                continue
            name = " / ".join(str(v) for _, v in key[:-1] if v not in (None, ""))
            found.dropped.append(f"{script}: {one.key}: {name}: {column.label}: "
                                 f"{column.cell(value)} vs {column.cell(theirs) or 'nothing'}")
            row[column.key] = None
            drops += 1
        kept.rows.append(row)
    if drops:
        kept.description = (f"{one.description} {drops} figure(s) not reproduced within "
                            f"{tolerance:.0%} by a second run are left out.").strip()
    return kept


def _compare_target(script: str, target: _results.Target, other: _results.Target | None,
                    tolerance: float, found: Comparison) -> _results.Target:
    """`target` with its value and its CPU value emptied where `other` does not
    reproduce them."""
    for field in ("value", "cpu_value"):
        mine = getattr(target, field)
        if mine is None:
            continue
        found.compared += 1
        theirs = None if other is None else getattr(other, field)
        if theirs is None or not agree(mine, theirs, tolerance, target.floor):
            what = "" if field == "value" else " (CPU)"
            shown = "nothing" if theirs is None else f"{theirs:,.2f}{target.unit}"
            found.dropped.append(f"{script}: target {target.label}{what}: "
                                 f"{mine:,.2f}{target.unit} vs {shown}")
            target = dataclasses.replace(target, **{field: None})
    return target


def compare(first: Path, second: Path, tolerance: float = TOLERANCE) -> Comparison:
    """Compares every results file of folder `first` with the same file of `second`."""
    found = Comparison()
    for path in sorted(first.glob("*.json")):
        script = path.stem
        one, run = _results.read(path)
        found.runs[script] = run
        other_path = second / path.name
        if not other_path.exists():
            found.unmatched.append(f"{script}: no {other_path}")
            found.kept[script] = _results.Report(
                [dataclasses.replace(t, rows=[]) for t in one.tables], [])
            continue
        two, _ = _results.read(other_path)
        tables = []
        for table in one.tables:
            match = next((t for t in two.tables if t.key == table.key), None)
            if match is None:
                found.unmatched.append(f"{script}: no table {table.key!r} in {other_path}")
                match = dataclasses.replace(table, rows=[])
            tables.append(compare_tables(script, table, match, tolerance, found))
        targets = []
        theirs = {t.label: t for t in two.targets}
        for target in one.targets:
            other = theirs.get(target.label)
            if other is None:
                found.unmatched.append(f"{script}: no target {target.label!r} in {other_path}")
            kept = _compare_target(script, target, other, tolerance, found)
            if target.cpu_value is not None and kept.cpu_value is None and _results.loaded(run):
                # A loaded run's target is judged on its CPU figure alone: without it, its
                # wall figure would judge it instead.
                kept = dataclasses.replace(kept, value=None)
            targets.append(kept)
        found.kept[script] = _results.Report(tables, targets)
    return found


def keep_others(found: Comparison, folder: Path) -> None:
    """Adds the results files of `folder` whose scripts the compared runs did not run to
    `found`, figures, dates and loads as they are."""
    for path in sorted(folder.glob("*.json")):
        if path.stem in found.kept:
            continue
        report, run = _results.read(path)
        _results.judge(report.targets, run)  # by the current rule, as the docs judge it
        found.kept[path.stem] = report
        found.runs[path.stem] = run
        found.others[path.stem] = path


def _ordered(scripts: list[str]) -> list[str]:
    """`scripts` in run_all.py's order (its sections'), others after, by name."""
    import run_all

    order = [script for section in run_all.SECTIONS for script in run_all.SCRIPTS[section]]
    return sorted(scripts, key=lambda s: (order.index(s) if s in order else len(order), s))


def runs_table(found: Comparison, first: Path, second: Path) -> str:
    """Where each script's figures come from: its run's date, quick or full, load, and
    whether they were compared (`first` against `second`) or kept as they were."""
    lines = ["| script | date | run | load average (1 / 5 / 15 min), start → end | figures |",
             "|---|---|---|---|---|"]
    for script in _ordered(list(found.kept)):
        run = found.runs[script]
        load = run.load_average
        where = (f"kept from `{found.others[script]}` (not re-run; `{run.command}`)"
                 if script in found.others else f"compared: `{first}` against `{second}`")
        loaded = _results.loaded_by(run)
        lines.append(f"| `{script}.py` | {run.date} | {'quick' if run.quick else 'full'} | "
                     f"{_results.format_load(load['start'])} → "
                     f"{_results.format_load(load['end'])}{f' ({loaded})' if loaded else ''} "
                     f"| {where} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path, help="the first run's results folder")
    parser.add_argument("second", type=Path, help="the second run's results folder")
    parser.add_argument("--output", type=Path, default=_results.RESULTS,
                        help="where to write the reproduced results (default: %(default)s)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="the largest relative difference kept (default: %(default)s)")
    parser.add_argument("--markdown", type=Path,
                        help="also write the reproduced tables as a RESULTS.md there")
    parser.add_argument("--keep-others", type=Path, metavar="DIR",
                        help="keep the results files in DIR of the scripts the two runs did "
                             "not run, as they are (e.g. benchmarks/results)")
    args = parser.parse_args(argv)
    if not any(args.first.glob("*.json")):
        parser.error(f"{args.first} holds no results files (*.json)")
    found = compare(args.first, args.second, args.tolerance)
    if args.keep_others is not None:
        if not args.keep_others.is_dir():
            parser.error(f"--keep-others {args.keep_others} is not a folder")
        keep_others(found, args.keep_others)
    for script, report in found.kept.items():
        target = args.output / f"{script}.json"
        if script not in found.others:
            _results.write(target, report, found.runs[script])
        elif found.others[script].resolve() != target.resolve():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(found.others[script], target)
    for line in found.dropped:
        print(f"dropped: {line}")
    for line in found.unmatched:
        print(f"unmatched: {line}", file=sys.stderr)
    print(f"{len(found.dropped)} of {found.compared} figures not reproduced within "
          f"{args.tolerance:.0%}; results written to {args.output}"
          + (f" ({len(found.others)} kept from {args.keep_others})." if found.others else "."))
    if args.markdown:
        import run_all

        scripts = _ordered(list(found.kept))
        reports = [found.kept[script] for script in scripts]
        compared = [found.runs[script] for script in scripts if script not in found.others]
        command = (f"python benchmarks/compare_runs.py {args.first} {args.second} "
                   f"--tolerance {args.tolerance:g}")  # figures reproduced within it
        if found.others:
            command += f" --keep-others {args.keep_others}"
        seconds = sum(run.seconds for run in compared)
        load = compared[0].load_average["start"] if compared else _results.load_average()
        args.markdown.write_text(run_all.render(
            reports, command, seconds, load,
            runs=runs_table(found, args.first, args.second)))
    return 1 if found.unmatched else 0


if __name__ == "__main__":
    sys.exit(main())
