"""The benchmarks' CPU figures (benchmarks/_common.py, _results.py): worker processes are
counted, stand-ins for remote servers are not, and targets are judged on CPU when loaded."""

from __future__ import annotations

import ast
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import _common  # noqa: E402
import _results  # noqa: E402

# A child that spends 0.3 s of its own CPU time, then waits for its stdin to close. The
# kernel reports a live process's time in clock ticks (10 ms): counted means >= 0.25 s.
_BURN = (
    "import sys, time\n"
    "while time.process_time() < 0.3: pass\n"
    "print('done', flush=True)\n"
    "sys.stdin.read()\n"
)


@pytest.fixture(autouse=True)
def _earlier_children_not_counted():
    """Processes this pytest worker had before the test (a session's storage servers,
    started by another test) are not the test's: their CPU is left out of its figures."""
    import psutil

    earlier = {p.pid for p in psutil.Process().children(recursive=True)} - _common._NOT_COUNTED
    _common.not_counted(earlier)
    yield
    _common._NOT_COUNTED.difference_update(earlier)


def _burning_child() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", _BURN], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "done\n"
    return child


def test_cpu_seconds_live_worker_process_counted():
    """A worker process still running at the end of the measurement is counted."""
    before = _common.cpu_seconds()
    child = _burning_child()
    try:
        spent = _common.cpu_seconds() - before
    finally:
        child.communicate("", timeout=60)
    assert spent >= 0.25


def test_cpu_seconds_ended_worker_counted_once():
    """A worker that ends (and is reaped) during the measurement is counted once."""
    child = _burning_child()
    before = _common.cpu_seconds()  # the child's 0.3 s already spent: not in the figure
    child.communicate("", timeout=60)
    assert _common.cpu_seconds() - before < 0.15


def test_cpu_seconds_not_counted_process_left_out():
    """A child declared `not_counted` (a stand-in for a remote server) is left out."""
    before = _common.cpu_seconds()
    child = _burning_child()
    try:
        _common.not_counted([child.pid])
        spent = _common.cpu_seconds() - before
    finally:
        child.communicate("", timeout=60)
        _common._NOT_COUNTED.discard(child.pid)
    assert spent < 0.15


def test_meter_cpu_us_per_record_of_the_timed_part():
    """`Meter.done(batches, records)` gives CPU microseconds per record of the timed part."""
    with _common.Meter() as meter:
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
        meter.done(10, 1000)
    assert _common.LAST_CPU_US is not None and _common.LAST_CPU_US >= 40.0


@pytest.mark.parametrize(
    ("value", "cpu", "loaded", "met"),
    [(0.7, 0.9, True, True), (0.9, 0.7, True, False), (0.7, 0.9, False, False),
     (0.9, 0.9, False, True), (None, 0.9, False, True), (0.9, None, True, True)],
    ids=["loaded-cpu-meets", "loaded-cpu-misses", "idle-wall-misses", "idle-both-meet",
         "idle-wall-not-reproduced", "no-cpu-figure"],
)
def test_target_judged_on_cpu_when_loaded_on_both_when_idle(value, cpu, loaded, met):
    """A loaded run's target is judged on its CPU figure alone; an idle run's on both."""
    target = _results.Target("ours / reference", value, 0.8, cpu_value=cpu, loaded=loaded)
    assert target.met is met


@pytest.mark.parametrize(
    ("value", "cpu", "loaded", "met"),
    [(0.85, 0.95, False, True), (0.85, 0.85, False, False), (0.7, 0.95, True, True),
     (0.95, 0.85, True, False)],
    ids=["idle-both-meet", "idle-cpu-under-its-bound", "loaded-cpu-meets", "loaded-cpu-misses"],
)
def test_target_cpu_bound_judges_the_cpu_figure(value, cpu, loaded, met):
    """A target's own CPU bound (CPU >= 0.9x, wall >= 0.8x) applies to the CPU figure."""
    target = _results.Target("s3 / local", value, 0.8, cpu_value=cpu, loaded=loaded,
                             cpu_bound=0.9)
    assert (target.met, target.wanted) == (met, ">= 0.8x, CPU >= 0.9x")


def test_write_marks_targets_with_cpu_loaded_from_the_run(tmp_path):
    """`write` marks a target with a CPU figure loaded when the run's load was high."""
    targets = [_results.Target("a", 0.7, 0.8, cpu_value=0.9), _results.Target("b", 0.7, 0.8)]
    run = _results.Run("python x.py", False, "2026-01-01 00:00 UTC", 1.0,
                       {"machine": "x86_64", "cpus": 2, "python": "3.11"},
                       {"start": [1.9, 1.0, 1.0], "end": [0.2, 0.2, 0.2]})
    path = _results.write(tmp_path / "x.json", _results.Report([], targets), run)
    read = _results.read(path)[0].targets
    assert [(t.loaded, t.met) for t in read] == [(True, True), (False, False)]
    assert read[0].measured() == (
        "0.70x, CPU 0.90x (judged on CPU: loaded run, 1-min load 1.90 at the start > 1.5)")


@pytest.mark.parametrize(
    ("start", "end", "why"),
    [(0.2, 0.3, ""), (0.2, 1.81, "1-min load 1.81 at the end > 1.5"),
     (1.6, 1.7, "1-min load 1.60 at the start and 1.70 at the end > 1.5"),
     (1.5, 1.5, "")],
    ids=["idle", "loaded-at-the-end", "loaded-at-both", "at-the-threshold"],
)
def test_loaded_by_names_the_load_above_the_threshold(start, end, why):
    """A run is loaded when its start's or its end's 1-minute load exceeds 0.75 per CPU,
    and says which."""
    run = _results.Run("python x.py", False, "2026-01-01 00:00 UTC", 1.0,
                       {"machine": "x86_64", "cpus": 2, "python": "3.11"},
                       {"start": [start, 0.0, 0.0], "end": [end, 0.0, 0.0]})
    assert (_results.loaded_by(run), _results.loaded(run)) == (why, bool(why))


def test_targets_sorted_by_issue_number_then_as_given():
    """The targets tables list issue 9 before 12.1 before 30.3 before 31, unlabelled last."""
    items = ["31.1, counters", "", "30.3, TFRecord", "9", "30.3, TFRecord", "12.1, mixing"]
    targets = [_results.Target(str(i), 1.0, 1.0, item=item) for i, item in enumerate(items)]
    ordered = _results.by_issue(targets)
    assert [t.label for t in ordered] == ["3", "5", "2", "4", "0", "1"]


def test_table_with_cpu_column_caption_says_what_it_counts():
    """A table with a CPU column explains it in its caption."""
    table = _results.Table("t", "T", "x.py", "", [_results.Column("rate", "records/s"),
                                                  _results.cpu_column()])
    assert "worker processes" in table.caption()
    assert table.columns[1].label == "CPU us / record"


def _table_calls(path: Path) -> list[tuple[str, ast.Call]]:
    """(key, call) of every ``Table(...)`` built in the benchmark script at `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(
                node.func, "attr", None)) == "Table" and node.args:
            key = node.args[0]
            found.append((getattr(key, "value", "?"), node))
    return found


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)]


def _calls_cpu_column(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(
        n.func, "id", None)) == "cpu_column" for n in ast.walk(node))


@pytest.mark.parametrize(
    "script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")), ids=str
)
def test_every_table_with_a_rate_has_a_cpu_column(script):
    """A benchmark table with a records/s column has the CPU column beside it
    (`_results.cpu_column`: its key, label and caption)."""
    for key, call in _table_calls(ROOT / "benchmarks" / script):
        columns = call.args[4] if len(call.args) > 4 else next(
            (k.value for k in call.keywords if k.arg == "columns"), call)
        if any("records/s" in text for text in _strings(columns)):
            assert _calls_cpu_column(columns), f"{script}: table {key!r} has no CPU column"


def test_paired_slice_holds_the_background_refill_of_its_own_contender():
    """A contender whose helper thread keeps working after each slice (a prefetch
    refilling its buffer) is charged that work, and its twin is not: the settle between
    slices gives each slice its own tail. Run in a process of its own: a test worker's
    threads left by other tests would be charged to whichever slice they ran in."""
    script = (
        "import json, sys, threading, time\n"
        f"sys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
        "import _common\n"
        "def spin(seconds):\n"
        "    end = time.thread_time() + seconds\n"
        "    while time.thread_time() < end:\n"
        "        pass\n"
        "def with_tail():\n"
        "    def run(batches):\n"
        "        spin(0.002 * batches)\n"
        "        # finishes after the slice, like a prefetch refilling\n"
        "        threading.Thread(target=spin, args=(0.002 * batches,)).start()\n"
        "        return batches\n"
        "    return run\n"
        "def plain():\n"
        "    def run(batches):\n"
        "        spin(0.002 * batches)\n"
        "        return batches\n"
        "    return run\n"
        "figures = _common.paired({'tail': with_tail, 'plain': plain}, rounds=4,\n"
        "                         slice_seconds=0.05)\n"
        "print(json.dumps(figures))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, check=True)
    figures = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    tail, plain_cpu = (statistics.median(figures[name][0]) for name in ("tail", "plain"))
    # CPU per "record": ~2,000 us for plain, ~4,000 us with the tail; clock ticks are 10 ms.
    assert 1.5 < tail / plain_cpu < 2.6, figures


def test_slice_calibration_lasts_what_it_is_asked_despite_a_cost_per_call(monkeypatch):
    """`_batches_taking`, which sizes `paired`'s slices, gives a slice of about the
    seconds asked when each ``run`` call has a cost of its own (a ``tf.function``'s,
    ~6x a graph batch): counting ``run(1)`` calls for that long picked 7x too few
    batches. On a clock that only the calls move."""
    clock = [0.0]
    per_call, per_batch = 0.0004, 0.00007

    def run(batches: int) -> int:
        clock[0] += per_call + per_batch * batches
        return batches

    monkeypatch.setattr(_common.time, "perf_counter", lambda: clock[0])
    batches = _common._batches_taking(run, 0.25)
    assert 0.9 < (per_call + per_batch * batches) / 0.25 < 1.1, batches


def test_round_ratio_compares_the_slices_of_a_round():
    """What moved both slices of a round cancels: the third round ran in a slow spell
    (both 10x), the second had a burst in the first contender's slice only."""
    these, those = [1.0, 10.0, 10.0], [1.0, 1.0, 10.0]
    assert _common.round_ratio(these, those) == 1.0
    assert statistics.median(these) / statistics.median(those) == 10.0


@pytest.mark.skipif(not __import__("_instructions").available(),
                    reason="Valgrind (callgrind) is not installed")
def test_instructions_counted_between_ready_and_done_only():
    """`_instructions.counted` counts what runs between READY and DONE: ten times the
    loop, about ten times the instructions, whatever ran before and after."""
    import _instructions

    script = (
        "import sys\n"
        "n = int(sys.argv[1])\n"
        "sum(range(300_000))\n"  # before READY: not counted
        "print('READY', flush=True); sys.stdin.readline()\n"
        "for _ in range(n): sum(range(100_000))\n"
        "print('DONE', flush=True); sys.stdin.read()\n"
        "sum(range(300_000))\n"  # after DONE: not counted
    )
    one = _instructions.counted(["-c", script, "1"], timeout=120)
    ten = _instructions.counted(["-c", script, "10"], timeout=120)
    assert one > 100_000
    assert 8 < ten / one < 11, (one, ten)


# A child that touches 128 MiB (each page written: resident), says so, and waits for its
# stdin to close.
_HOLD = (
    "import sys\n"
    "b = bytearray(128 << 20)\n"
    "b[::4096] = b'\\x01' * len(range(0, len(b), 4096))\n"
    "print('held', flush=True)\n"
    "sys.stdin.read()\n"
)


def _held_then_ended() -> None:
    child = subprocess.Popen([sys.executable, "-c", _HOLD], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "held\n"
    time.sleep(0.1)  # two sampling intervals
    child.communicate("")


def test_peak_rss_counts_a_child_that_ended_while_watched_not_after_it_stopped_watching():
    """The sampling thread sees a worker that ends (a tuner's trial); `stop_watching` ends
    the thread (no `/proc` reads beside a timed part), so one that starts and ends after
    it is not seen."""
    with _common.PeakRss(interval=0.02) as peak:
        _held_then_ended()
        peak.stop_watching()
        watched = peak.added
        assert not peak._thread.is_alive()
        _held_then_ended()
    assert watched >= 128 << 20
    assert peak.added < watched + (64 << 20)


@pytest.mark.parametrize("n", [2, 5, 6, 10, 13, 20])
def test_median_interval_covers_the_median_as_often_as_it_says(n):
    """bench_overhead's interval for a median: its confidence is the binomial chance that
    the population's median lies between the two ranks it picks (checked over all 2^n
    ways n values fall below or above it), and it is the narrowest with at least 95%
    (or the whole range when none has)."""
    import itertools

    import bench_overhead

    values = [float(v) for v in range(n)]
    low, high, confidence = bench_overhead.median_interval(values)
    k = int(low) + 1  # its ranks: k-th lowest and k-th highest
    assert high == n - k
    # The median is inside [x(k), x(n+1-k)] unless fewer than k values lie below it or
    # fewer than k above it.
    inside = sum(1 for below in itertools.product((0, 1), repeat=n)
                 if k <= sum(below) <= n - k) / 2**n
    assert confidence == pytest.approx(inside)
    assert confidence >= 0.95 or k == 1
    if k + 1 <= n // 2:  # one rank narrower falls short of 95%
        narrower = sum(1 for below in itertools.product((0, 1), repeat=n)
                       if k + 1 <= sum(below) <= n - k - 1) / 2**n
        assert narrower < 0.95
