"""benchmarks/compare_runs.py: only figures two runs reproduce within the tolerance are kept."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import _results  # noqa: E402
import compare_runs  # noqa: E402


def _run(folder: Path, rates: list[float], faults: list[float], target: float) -> Path:
    table = _results.Table(
        "throughput", "(a) t", "bench_x.py", "Rates.",
        [_results.Column("pipeline", "pipeline"), _results.Column("malloc", "malloc"),
         _results.Column("rate", "records/s", ",.0f"),
         _results.Column("faults", "faults / batch", ",.1f")],
    )
    for (name, regime), rate, fault in zip(
            [("ours", "patched"), ("ours", "healthy"), ("numpy", "healthy")], rates, faults,
            strict=True):
        table.add(pipeline=name, malloc=regime, rate=rate, faults=fault)
    report = _results.Report([table], [_results.Target("ours / numpy", target, 0.6)])
    run = _results.Run("python benchmarks/bench_x.py", False, "2026-12-02 00:00 UTC", 1.0,
                       {"machine": "x86_64", "cpus": 2, "python": "3.11"},
                       {"start": [0.1, 0.1, 0.1], "end": [0.1, 0.1, 0.1]})
    return _results.write(folder / "bench_x.json", report, run)


@pytest.mark.parametrize(
    ("a", "b", "floor", "agreed"),
    [(100.0, 115.0, 0.0, True), (100.0, 115.1, 0.0, False), (115.1, 100.0, 0.0, False),
     (0.2, 0.9, 1.0, True), (0.2, 1.3, 1.0, False), (-1.0, 1.0, 0.0, False),
     (0.0, 0.0, 0.0, True)],
    ids=["15%", "over-15%", "over-15%-reversed", "within-floor", "over-floor",
         "opposite-signs", "zeros"],
)
def test_agree_is_symmetric_relative_with_an_absolute_floor(a, b, floor, agreed):
    """Two figures agree when the larger is at most 1.15x the smaller, or within the floor."""
    assert compare_runs.agree(a, b, 0.15, floor) is agreed


def test_compare_keeps_reproduced_figures_and_empties_the_others(tmp_path):
    """A rate 30% off and a target 50% off are dropped; faults 0.1 vs 0.6 are kept."""
    first = _run(tmp_path / "one", [1000.0, 2000.0, 3000.0], [0.1, 0.0, 0.2], 1.0)
    _run(tmp_path / "two", [1300.0, 2100.0, 2900.0], [0.6, 0.0, 0.2], 0.5)

    found = compare_runs.compare(first.parent, tmp_path / "two")

    rows = found.kept["bench_x"].table("throughput").rows
    assert [row["rate"] for row in rows] == [None, 2000.0, 3000.0]
    assert [row["faults"] for row in rows] == [0.1, 0.0, 0.2]
    assert found.kept["bench_x"].targets[0].value is None
    assert found.compared == 7 and len(found.dropped) == 2
    assert "ours / patched" in found.dropped[0] and "1,000 vs 1,300" in found.dropped[0]
    assert not found.unmatched


def test_compare_runs_command_writes_the_results_the_docs_read(tmp_path):
    """The command writes the kept figures as results files and exits 0 when all match."""
    _run(tmp_path / "one", [1000.0, 2000.0, 3000.0], [0.1, 0.0, 0.2], 1.0)
    _run(tmp_path / "two", [1000.0, 2000.0, 3000.0], [0.1, 0.0, 0.2], 1.0)
    out = tmp_path / "out"

    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "compare_runs.py"), str(tmp_path / "one"),
         str(tmp_path / "two"), "--output", str(out), "--markdown", str(tmp_path / "R.md")],
        capture_output=True, text=True, timeout=120, check=False,
    )

    assert done.returncode == 0, done.stderr[-2000:]
    assert "0 of 7 figures not reproduced" in done.stdout
    kept = json.loads((out / "bench_x.json").read_text())
    assert [row["rate"] for row in kept["tables"][0]["rows"]] == [1000.0, 2000.0, 3000.0]
    assert "| ours | patched | 1,000 | 0.1 |" in (tmp_path / "R.md").read_text()


def test_compare_runs_a_missing_script_in_the_second_run_exits_1(tmp_path):
    """A results file of the first run without a counterpart makes the runs not comparable."""
    _run(tmp_path / "one", [1000.0, 2000.0, 3000.0], [0.1, 0.0, 0.2], 1.0)
    (tmp_path / "two").mkdir()
    shutil.copy(tmp_path / "one" / "bench_x.json", tmp_path / "one" / "bench_y.json")
    shutil.copy(tmp_path / "one" / "bench_x.json", tmp_path / "two" / "bench_x.json")

    assert compare_runs.main([str(tmp_path / "one"), str(tmp_path / "two"),
                              "--output", str(tmp_path / "out")]) == 1
    kept = json.loads((tmp_path / "out" / "bench_y.json").read_text())
    assert kept["tables"][0]["rows"] == []


def test_compare_cpu_figures_kept_or_dropped_like_any_figure(tmp_path):
    """A CPU column's figure and a target's CPU value not reproduced are dropped alone."""
    for name, cpu, target_cpu in (("one", 2.0, 0.9), ("two", 2.8, 0.5)):
        table = _results.Table("t", "T", "bench_x.py", "", [
            _results.Column("pipeline", "pipeline"), _results.Column("rate", "records/s"),
            _results.cpu_column()])
        table.add(pipeline="ours", rate=1000.0, cpu_us=cpu)
        target = _results.Target("ours / ref", 0.8, 0.6, cpu_value=target_cpu)
        run = _results.Run("python benchmarks/bench_x.py", False, "2026-12-02 00:00 UTC", 1.0,
                           {"machine": "x86_64", "cpus": 2, "python": "3.11"},
                           {"start": [0.1, 0.1, 0.1], "end": [0.1, 0.1, 0.1]})
        _results.write(tmp_path / name / "bench_x.json", _results.Report([table], [target]), run)

    found = compare_runs.compare(tmp_path / "one", tmp_path / "two")

    report = found.kept["bench_x"]
    assert report.table("t").rows == [{"pipeline": "ours", "rate": 1000.0, "cpu_us": None}]
    assert (report.targets[0].value, report.targets[0].cpu_value) == (0.8, None)
    assert any("target ours / ref (CPU)" in line for line in found.dropped)


def test_compare_runs_keep_others_keeps_scripts_not_rerun_with_their_own_runs(tmp_path):
    """Two runs of one script compared, `--keep-others` keeps another script's committed
    file as it is: copied to the output, its figures, date and load in RESULTS.md."""
    _run(tmp_path / "one", [1000.0, 2000.0, 3000.0], [0.1, 0.0, 0.2], 1.0)
    _run(tmp_path / "two", [1000.0, 2000.0, 3000.0], [0.1, 0.0, 0.2], 1.0)
    committed = tmp_path / "committed"
    _run(committed, [9.0, 9.0, 9.0], [0.0, 0.0, 0.0], 0.1)  # replaced by the comparison
    table = _results.Table("t", "T", "bench_y.py", "", [
        _results.Column("pipeline", "pipeline"), _results.Column("rate", "records/s", ",.0f")])
    table.add(pipeline="kept", rate=4242.0)
    older = _results.Run("python benchmarks/run_all.py", False, "2026-11-30 12:00 UTC", 5.0,
                         {"machine": "x86_64", "cpus": 2, "python": "3.11"},
                         {"start": [0.3, 0.3, 0.3], "end": [1.9, 0.5, 0.5]})
    _results.write(committed / "bench_y.json", _results.Report(
        [table], [_results.Target("kept / ref", 1.2, 1.0, item="30.9", cpu_value=1.1)]), older)
    out, markdown = tmp_path / "out", tmp_path / "R.md"

    assert compare_runs.main([str(tmp_path / "one"), str(tmp_path / "two"), "--output",
                              str(out), "--keep-others", str(committed),
                              "--markdown", str(markdown)]) == 0

    assert (out / "bench_y.json").read_bytes() == (committed / "bench_y.json").read_bytes()
    assert json.loads((out / "bench_x.json").read_text())["tables"][0]["rows"][0]["rate"] == 1000
    text = markdown.read_text()
    assert "| kept | 4,242 |" in text and "| ours | patched | 1,000 | 0.1 |" in text
    assert ("| `bench_y.py` | 2026-11-30 12:00 UTC | full | 0.30 / 0.30 / 0.30 → 1.90 / 0.50 / "
            "0.50 (1-min load 1.90 at the end > 1.5) | kept from" in text)
    assert "judged on CPU: loaded run, 1-min load 1.90 at the end > 1.5" in text
    assert f"| `bench_x.py` | 2026-12-02 00:00 UTC | full | 0.10 / 0.10 / 0.10 → 0.10 / 0.10 / " \
           f"0.10 | compared: `{tmp_path / 'one'}` against `{tmp_path / 'two'}` |" in text


def test_results_md_lists_targets_by_issue(tmp_path):
    """RESULTS.md's targets table is sorted by the issue each target belongs to."""
    reports = [_results.Report([], [_results.Target("late", 1.0, 1.0, item="31.3, profile"),
                                    _results.Target("early", 1.0, 1.0, item="12.1, mixing")]),
               _results.Report([], [_results.Target("middle", 1.0, 1.0, item="30.3, TFRecord")])]
    import run_all

    text = run_all.render(reports, "python benchmarks/run_all.py", 1.0, [0.1, 0.1, 0.1])
    rows = [line.split(" | ")[0] for line in text.splitlines() if line.startswith("| ")]
    assert rows[1:4] == ["| early", "| middle", "| late"]


def test_compare_loaded_run_target_without_its_cpu_figure_is_not_measured(tmp_path):
    """On a loaded run, a target whose CPU figure was not reproduced reads "not measured"
    (its wall figure, reproduced or not, does not judge it instead)."""
    for name, target_cpu in (("one", 0.9), ("two", 0.5)):
        target = _results.Target("ours / ref", 0.8, 0.6, cpu_value=target_cpu)
        run = _results.Run("python benchmarks/bench_x.py", False, "2026-12-02 00:00 UTC", 1.0,
                           {"machine": "x86_64", "cpus": 2, "python": "3.11"},
                           {"start": [3.0, 3.0, 3.0], "end": [3.0, 3.0, 3.0]})
        _results.write(tmp_path / name / "bench_x.json", _results.Report([], [target]), run)

    found = compare_runs.compare(tmp_path / "one", tmp_path / "two")

    kept = found.kept["bench_x"].targets[0]
    assert (kept.value, kept.cpu_value, kept.verdict()) == (None, None, "not measured")


def _decided_run(folder: Path, decided: str, rate: float) -> Path:
    table = _results.Table(
        "autotune", "(w) t", "bench_x.py", "Rates.",
        [_results.Column("pipeline", "pipeline"),
         _results.Column("decided", "decided", identity=False),
         _results.Column("rate", "records/s", ",.0f")],
    )
    table.add(pipeline="auto", decided=decided, rate=rate)
    run = _results.Run("python benchmarks/bench_x.py", False, "2026-12-02 00:00 UTC", 1.0,
                       {"machine": "x86_64", "cpus": 2, "python": "3.11"},
                       {"start": [0.1, 0.1, 0.1], "end": [0.1, 0.1, 0.1]})
    return _results.write(folder / "bench_x.json", _results.Report([table], []), run)


def test_compare_pairs_rows_by_their_naming_text_only(tmp_path):
    """A text cell that reports what a run found (`identity=False`: a decision after so
    many batches and seconds) does not name the row: two runs' rows still pair up, and
    their figures are compared (kept within 15%, dropped beyond)."""
    first = _decided_run(tmp_path / "one", "process x 2 (398 batches, 1.8 s)", 1000.0)
    _decided_run(tmp_path / "two", "process x 2 (368 batches, 1.9 s)", 1100.0)
    _decided_run(tmp_path / "three", "process x 2 (401 batches, 1.8 s)", 1300.0)
    kept = compare_runs.compare(first.parent, tmp_path / "two").kept
    assert [row["rate"] for row in kept["bench_x"].table("autotune").rows] == [1000.0]
    kept = compare_runs.compare(first.parent, tmp_path / "three").kept
    assert [row["rate"] for row in kept["bench_x"].table("autotune").rows] == [None]


def test_compare_target_floor_keeps_small_noisy_values_and_drops_larger_ones(tmp_path):
    """A target's own floor: 0.001 vs 0.004 (a few MiB against a budget of GiB) agree under
    a floor of 0.005; without the floor, or 0.1 vs 0.4 under it, they do not."""
    cases = {"small, floor": (0.001, 0.004, 0.005), "small, none": (0.001, 0.004, 0.0),
             "large, floor": (0.1, 0.4, 0.005)}
    for name, (one, two, floor) in cases.items():
        for folder, value in (("one", one), ("two", two)):
            target = _results.Target(f"added RSS / budget ({name})", value, 1.0,
                                     at_most=True, floor=floor)
            run = _results.Run("python benchmarks/bench_x.py", False, "2026-12-02 00:00 UTC",
                               1.0, {"machine": "x86_64", "cpus": 2, "python": "3.11"},
                               {"start": [0.1, 0.1, 0.1], "end": [0.1, 0.1, 0.1]})
            _results.write(tmp_path / name / folder / "bench_x.json",
                           _results.Report([], [target]), run)

    kept = {name: compare_runs.compare(tmp_path / name / "one", tmp_path / name / "two")
            .kept["bench_x"].targets[0].verdict() for name in cases}

    assert kept == {"small, floor": "met", "small, none": "not measured",
                    "large, floor": "not measured"}
