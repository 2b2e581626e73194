"""Benchmark results as data: the tables a script prints and the JSON file it writes beside them.

Every benchmark script builds its tables as `Table` values (numbers stay numbers, each
column knows how to print them), prints them as Markdown and writes them, with its
targets, the command, the date and the machine, to ``benchmarks/results/<script>.json``
(`write`). The docs' performance and reliability pages are generated from those files
(``docs/_gen/``), never typed by hand, so the Markdown a script prints, RESULTS.md and the
docs show the same figures. Standard library only: worker processes import this module.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

SCHEMA = 1
RESULTS = Path(__file__).resolve().parent / "results"
#: The key of the CPU column of a throughput table (`cpu_column`); ``cpu_us_*`` keys are
#: further CPU columns of one table (e.g. of a reference measured beside it).
CPU_KEY = "cpu_us"
#: A run is *loaded* when its 1-minute load average exceeds this share of the CPUs at
#: its start or at its end (1.5 on 2 CPUs): its targets are then judged on CPU alone
#: (`Target`), and say which load made it so (`loaded_by`).
LOADED_SHARE = 0.75


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded to 0.01."""
    return [round(x, 2) for x in os.getloadavg()]


def format_load(load: list[float]) -> str:
    return " / ".join(f"{x:.2f}" for x in load)


@dataclasses.dataclass
class Column:
    """A column: the row key it shows, its header, and how a number in it is printed
    (a format spec such as ``",.0f"``, then `suffix`); strings print as they are.
    `identity`: whether its text names the row (`compare_runs.py` pairs two runs' rows
    by their naming text); False for text that reports what a run found."""

    key: str
    label: str
    format: str = ""
    suffix: str = ""
    identity: bool = True

    def cell(self, value: Any) -> str:
        if value is None:
            return ""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return str(value)
        return f"{value:{self.format}}{self.suffix}"


def cpu_column(per: str = "record", key: str = CPU_KEY) -> Column:
    """The CPU column a throughput table carries beside its rate: CPU microseconds of the
    whole process (every thread) and its worker processes per `per` in the timed part
    (`_common.cpu_seconds`), the median over the rounds."""
    return Column(key, f"CPU us / {per}", ",.2f")


def is_cpu(column: Column) -> bool:
    """Whether `column` is a CPU column (`cpu_column`)."""
    return column.key == CPU_KEY or column.key.startswith(CPU_KEY + "_")


_CPU_CAPTION = ("CPU us: CPU time of the process (every thread) and its worker processes "
                "in the timed part, median over the rounds")


@dataclasses.dataclass
class Table:
    """One table of a benchmark: rows of cells keyed by column key.

    `load` is the load average at the start and at the end of the measurement; `note`
    is printed before it in the caption (e.g. the TensorFlow version).
    """

    key: str
    title: str
    script: str
    description: str
    columns: list[Column]
    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    load: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    note: str = ""

    def add(self, **cells: Any) -> None:
        unknown = sorted(set(cells) - {column.key for column in self.columns})
        if unknown:
            msg = f"Table {self.key!r} has no columns {unknown}. Received: {sorted(cells)}."
            raise KeyError(msg)
        self.rows.append(cells)

    def finish(self, start_load: list[float]) -> Table:
        """Records the load average of the measurement (start given, end now)."""
        self.load = {"start": start_load, "end": load_average()}
        return self

    def row(self, name: str, key: str | None = None) -> dict[str, Any]:
        """The row whose first cell (or cell `key`) is `name`."""
        key = key or self.columns[0].key
        for row in self.rows:
            if row.get(key) == name:
                return row
        names = [r.get(key) for r in self.rows]
        msg = f"Table {self.key!r} has no row {key}={name!r}. Rows: {names}."
        raise KeyError(msg)

    def grid(self) -> str:
        """The rows as a Markdown table; columns after the first are right-aligned."""
        lines = ["| " + " | ".join(c.label for c in self.columns) + " |",
                 "|---|" + "---:|" * (len(self.columns) - 1)]
        for row in self.rows:
            lines.append("| " + " | ".join(c.cell(row.get(c.key)) for c in self.columns) + " |")
        return "\n".join(lines)

    def caption(self) -> str:
        parts = [self.note] if self.note else []
        if any(is_cpu(column) for column in self.columns):
            parts.append(_CPU_CAPTION)
        if self.load:
            parts.append(
                f"{os.cpu_count()} CPUs; load average (1 / 5 / 15 min) "
                f"{format_load(self.load['start'])} at the start, "
                f"{format_load(self.load['end'])} at the end"
            )
        return f"*{'. '.join(parts)}.*" if parts else ""

    def markdown(self, heading: str = "###") -> str:
        out = [f"{heading} {self.title} (`{self.script}`)", ""]
        if self.description:
            out += [self.description, ""]
        out.append(self.grid())
        caption = self.caption()
        return "\n".join([*out, "", caption] if caption else out)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Table:
        fields = dict(data, columns=[Column(**c) for c in data["columns"]])
        return cls(**fields)


#: Added peak RSS figures of two runs this close (MiB) agree (`compare_runs`): a few MiB
#: more or less of the allocator's arenas and Python's pools, not the code measured.
RSS_FLOOR_MIB = 32.0


@dataclasses.dataclass
class Target:
    """A target the project set itself: `value` compared with `bound` (None: not measured).

    A throughput target may also carry `cpu_value`, the same ratio computed from CPU time
    per record (process and workers): on a *loaded* run (`LOADED_SHARE`, set by `write`)
    the target is judged on it alone, since wall-time ratios swing with the load; on an
    idle run both must meet the bound. `cpu_bound`, when given, is the CPU figure's own
    bound (e.g. CPU >= 0.9x, wall >= 0.8x). `loaded_by` says which load made the run
    loaded (e.g. ``1-min load 1.81 at the end > 1.5``).
    """

    label: str
    value: float | None
    bound: float
    unit: str = "x"
    at_most: bool = False  # the value must stay below the bound (a cost), not above it
    item: str = ""  # the issue (and item) it belongs to
    cpu_value: float | None = None
    loaded: bool = False  # the run was loaded: judged on `cpu_value` when there is one
    loaded_by: str = ""  # which load made the run loaded (`loaded_by`)
    cpu_bound: float | None = None  # the bound of `cpu_value` (None: `bound`)
    #: Two runs' values this close (in `unit`) agree whatever their ratio
    #: (`compare_runs`): for a figure far below its bound whose size is noise (a few
    #: MiB of added memory against a budget of gigabytes).
    floor: float = 0.0

    def _meets(self, value: float | None, bound: float) -> bool | None:
        if value is None:
            return None
        return value <= bound if self.at_most else value >= bound

    @property
    def met(self) -> bool | None:
        cpu_bound = self.bound if self.cpu_bound is None else self.cpu_bound
        wall, cpu = self._meets(self.value, self.bound), self._meets(self.cpu_value, cpu_bound)
        if cpu is None or (wall is None and not self.loaded):
            return wall if cpu is None else cpu
        return cpu if self.loaded else wall and cpu

    @property
    def wanted(self) -> str:
        sign = "<=" if self.at_most else ">="
        wanted = f"{sign} {self.bound:g}{self.unit}"
        if self.cpu_bound is not None and self.cpu_bound != self.bound:
            wanted += f", CPU {sign} {self.cpu_bound:g}{self.unit}"
        return wanted

    def measured(self) -> str:
        wall = "-" if self.value is None else f"{self.value:,.2f}{self.unit}"
        if self.cpu_value is None:
            return wall
        why = f", {self.loaded_by}" if self.loaded_by else ""
        judged = f" (judged on CPU: loaded run{why})" if self.loaded else ""
        return f"{wall}, CPU {self.cpu_value:,.2f}{self.unit}{judged}"

    def verdict(self) -> str:
        return {None: "not measured", True: "met", False: "MISSED"}[self.met]

    def row(self) -> list[str]:
        return [self.label, self.measured(), self.wanted, self.verdict(), self.item]

    def to_json(self) -> dict[str, Any]:
        return dict(dataclasses.asdict(self), met=self.met)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Target:
        return cls(**{k: v for k, v in data.items() if k != "met"})


def _issue_key(item: str) -> tuple[int, tuple[int, ...]]:
    """`Target.item`'s issue and item numbers (``"30.3, TFRecord"``: (30, 3)); unlabelled
    targets after the others."""
    number = item.split(",")[0].strip()
    parts = number.split(".")
    if not number or not all(part.isdigit() for part in parts):
        return (1, ())
    return (0, tuple(int(part) for part in parts))


def by_issue(targets: list[Target]) -> list[Target]:
    """`targets` sorted by their issue and item number (`Target.item`), in the given
    order within one item."""
    return sorted(targets, key=lambda target: _issue_key(target.item))


def targets_table(targets: list[Target]) -> str:
    """The targets as a Markdown table, by issue (`by_issue`)."""
    lines = ["| target | measured | wanted |  | issue |", "|---|---:|---:|---|---|"]
    lines += ["| " + " | ".join(t.row()) + " |" for t in by_issue(targets)]
    return "\n".join(lines)


@dataclasses.dataclass
class Report:
    """What a benchmark script measured: its tables and its targets."""

    tables: list[Table]
    targets: list[Target]

    @property
    def markdown(self) -> str:
        return "\n\n".join(table.markdown() for table in self.tables)

    def table(self, key: str) -> Table:
        for table in self.tables:
            if table.key == key:
                return table
        msg = f"No table {key!r}. Tables: {[t.key for t in self.tables]}."
        raise KeyError(msg)


def machine() -> dict[str, Any]:
    """The machine and the versions of what the run imported."""
    info: dict[str, Any] = {
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }
    for name in ("numpy", "tensorflow", "grain", "resumeloader"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "__version__"):
            info[name] = module.__version__
    return info


def describe_machine(info: dict[str, Any]) -> str:
    versions = [f"Python {info['python']}"] + [
        f"{name} {info[name]}" for name in ("numpy", "tensorflow", "grain", "resumeloader")
        if name in info
    ]
    return f"{info['machine']}, {info['cpus']} CPUs, " + ", ".join(versions)


def malloc_probe(nbytes: int = 1 << 20) -> dict[str, int | bool]:
    """Minor page faults of writing a fresh `nbytes` malloc block (the third in a row):
    ~nbytes/4096 when large allocations are fresh mmaps (TensorFlow's 128 KiB mmap
    threshold with the heap trimmed), ~0 when malloc reuses its heap. A probe of the
    heap's state now, not of the threshold (glibc has no call that reads it). Linux
    with glibc only: elsewhere ``{"faults": -1}``."""
    import ctypes
    import resource

    try:
        libc = ctypes.CDLL(None)
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):
        return {"faults": -1, "mmapped": False}
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.argtypes = [ctypes.c_void_p]
    faults = 0
    for _ in range(3):
        block = malloc(nbytes)
        if not block:
            return {"faults": -1, "mmapped": False}
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        ctypes.memset(block, 1, nbytes)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start
        free(block)
    return {"faults": faults, "mmapped": faults > nbytes // 4096 // 4}


def describe_malloc(probe: dict[str, Any]) -> str:
    if probe.get("faults", -1) < 0:
        return "malloc: not probed (not glibc)"
    kind = ("large allocations are fresh mmaps (TensorFlow's patch)" if probe["mmapped"]
            else "large allocations reuse the heap")
    return f"malloc: {kind}, {probe['faults']} minor faults per 1 MiB block"


@dataclasses.dataclass
class Run:
    """How a results file was made: the command, quick or full, when, where, the load,
    and the malloc regime at the start and the end (`malloc_probe`; empty in files
    written before it was recorded)."""

    command: str
    quick: bool
    date: str
    seconds: float
    machine: dict[str, Any]
    load_average: dict[str, list[float]]
    malloc: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


class Timer:
    """Starts a run: the date and the load average now; `run()` closes it."""

    def __init__(self, command: str, quick: bool) -> None:
        self.command, self.quick = command, quick
        self.date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        self.start_load = load_average()
        self.start_malloc = malloc_probe()
        self.start = datetime.datetime.now().timestamp()

    def run(self) -> Run:
        seconds = round(datetime.datetime.now().timestamp() - self.start, 1)
        return Run(self.command, self.quick, self.date, seconds, machine(),
                   {"start": self.start_load, "end": load_average()},
                   {"start": self.start_malloc, "end": malloc_probe()})


# run_all.py sets it for the scripts it starts: their results name the command it ran.
PARENT_COMMAND = "RESUMELOADER_BENCH_COMMAND"


def command_line() -> str:
    """How this run was started, as the user typed it (run_all.py's command for the
    scripts it starts), without a ``--json`` option pointing at the default folder."""
    if os.environ.get(PARENT_COMMAND):
        return os.environ[PARENT_COMMAND]
    script = Path(sys.argv[0])
    args = list(sys.argv[1:])
    if "--json" in args[:-1]:
        at = args.index("--json")
        if Path(args[at + 1]).resolve().parent == RESULTS:
            del args[at : at + 2]
    ours = script.resolve().parent == RESULTS.parent
    shown = f"benchmarks/{script.name}" if ours else str(script)
    return " ".join(["python", shown, *args])


def loaded_by(run: Run) -> str:
    """Which 1-minute load average made `run` loaded: its start's and its end's above
    `LOADED_SHARE` of its CPUs, named (``1-min load 1.81 at the end > 1.5``); "" for a
    run on an idle machine. The end's load counts the run's own processes too."""
    cpus = run.machine.get("cpus") or os.cpu_count() or 1
    limit = LOADED_SHARE * cpus
    over = [f"{run.load_average[when][0]:.2f} at the {when}" for when in ("start", "end")
            if run.load_average[when][0] > limit]
    return f"1-min load {' and '.join(over)} > {limit:g}" if over else ""


def loaded(run: Run) -> bool:
    """Whether `run` ran on a loaded machine (`loaded_by`)."""
    return bool(loaded_by(run))


def judge(targets: list[Target], run: Run) -> None:
    """Marks each target with a CPU figure loaded or not from `run`'s load (`loaded_by`)."""
    why = loaded_by(run)
    for target in targets:
        target.loaded = bool(why) and target.cpu_value is not None
        target.loaded_by = why if target.loaded else ""


def write(path: Path, report: Report, run: Run) -> Path:
    """Writes `report` and how it was made to `path` (a ``results/<script>.json``); each
    target with a CPU figure is marked loaded or not from the run's load (`judge`)."""
    judge(report.targets, run)
    data = {
        "schema": SCHEMA,
        "run": dataclasses.asdict(run),
        "tables": [table.to_json() for table in report.tables],
        "targets": [target.to_json() for target in report.targets],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def read(path: Path) -> tuple[Report, Run]:
    """The report and the run of a results file written by `write`."""
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        msg = (f"{path} is not a results file of schema {SCHEMA}. "
               f"Received: schema={data.get('schema')!r}.")
        raise ValueError(msg)
    report = Report([Table.from_json(t) for t in data["tables"]],
                    [Target.from_json(t) for t in data["targets"]])
    return report, Run(**data["run"])
