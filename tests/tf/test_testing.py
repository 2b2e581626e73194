"""Tests of resumeloader.testing: the in-process resume check and the trace recorder."""

from __future__ import annotations

import ast
import importlib
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import resumeloader
from resumeloader import Shard, testing
from resumeloader.tools.report import RunOutcome, build
from resumeloader.tools.trace import Trace


def _loader(**kwargs):
    defaults = dict(batch_size=4, seed=3, num_epochs=3)
    return resumeloader.ResumableLoader(np.arange(22, dtype=np.int64), **{**defaults, **kwargs})


def _noisy(record, rng):
    return np.float32(record) + rng.normal(size=2).astype(np.float32)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"map_fn": _noisy, "with_metadata": True},
        {"drop_remainder": True, "num_epochs": None},
        {"shard": Shard(1, 2), "prefetch": None},
    ],
    ids=["plain", "map-metadata", "drop-remainder-endless", "shard"],
)
def test_assert_resumes_identically_exact_loader_passes(kwargs):
    """A ResumableLoader passes at the default break points, finite or endless."""
    assert testing.assert_resumes_identically(lambda: _loader(**kwargs), num_steps=8) is None


def test_assert_resumes_identically_history_dependent_map_fn_fails_naming_step():
    """A map_fn drawing from one shared RNG stream is caught, naming the break point and step."""
    shared = np.random.default_rng(0)

    def stateful(record, rng):
        return np.float32(record) + np.float32(shared.normal())

    with pytest.raises(AssertionError) as info:
        testing.assert_resumes_identically(
            lambda: _loader(map_fn=stateful, prefetch=None), num_steps=6, break_points=[2]
        )
    assert isinstance(info.value, resumeloader.errors.ResumeMismatchError)
    assert "break point 2 (via set_state (JSON round trip))" in str(info.value)
    assert "at step 2. Expected: records" in str(info.value)


def test_assert_resumes_identically_stream_past_end_fails():
    """A factory whose loaders run longer than the reference is reported as an extra batch."""
    calls = []

    def make():
        calls.append(None)
        return _loader(num_epochs=1 if len(calls) == 1 else 2)

    with pytest.raises(resumeloader.errors.ResumeMismatchError) as info:
        testing.assert_resumes_identically(make, num_steps=2, break_points=[6])
    assert "Expected: the end of the stream. Received: records" in str(info.value)


@pytest.mark.parametrize("num_steps", [0, -1, 2.5, True], ids=["zero", "negative", "float", "bool"])
def test_assert_resumes_identically_bad_num_steps_raises(num_steps):
    """`num_steps` must be a positive integer."""
    with pytest.raises(ValueError) as info:
        testing.assert_resumes_identically(_loader, num_steps=num_steps)
    assert f"num_steps={num_steps!r}" in str(info.value)


def test_assert_resumes_identically_break_point_out_of_range_raises():
    """A break point beyond num_steps plus one epoch is rejected with the bounds."""
    with pytest.raises(ValueError) as info:
        testing.assert_resumes_identically(_loader, num_steps=2, break_points=[99])
    assert "[0, 8]" in str(info.value)
    assert "Received: 99" in str(info.value)


def test_recorder_without_env_is_noop(monkeypatch):
    """Outside the harness the recorder writes nothing and never pauses."""
    monkeypatch.delenv("RESUMELOADER_TRACE", raising=False)
    monkeypatch.setenv("RESUMELOADER_PAUSE_AT", "step:0")
    monkeypatch.setattr(time, "sleep", lambda _: pytest.fail("the recorder paused"))
    recorder = testing.TraceRecorder.from_env()
    recorder.start(0)
    recorder.step(0, np.zeros(2))
    recorder.commit(1)
    assert not recorder.enabled


def test_recorder_events_round_trip_through_trace(tmp_path):
    """Events written by the recorder are read back by Trace, a torn last line ignored."""
    path = tmp_path / "t.jsonl"
    recorder = testing.TraceRecorder(path)
    recorder.start(0)
    recorder.step(0, {"x": np.ones(3)}, records=np.array([[4, 5]]))
    recorder.commit(1)
    recorder.finish(weights=[np.zeros(2)], loss=0.5)
    recorder.close()
    with open(path, "a") as f:
        f.write('{"event":"step","st')
    trace = Trace.read(path)
    assert (trace.start, trace.commits, trace.end["loss"]) == (0, [1], 0.5)
    assert trace.steps[0]["records"] == [4, 5]
    assert trace.steps[0]["digest"] == testing.digest({"x": np.ones(3)})


@pytest.mark.parametrize("point", ["step", "step:", "kill:3", "step:-1"], ids=str)
def test_recorder_bad_pause_point_raises(tmp_path, point):
    """A malformed kill point names the accepted forms."""
    with pytest.raises(ValueError) as info:
        testing.TraceRecorder(tmp_path / "t.jsonl", pause_at=point)
    assert "'step:N', 'commit:N' or 'save:N'" in str(info.value)


def _outcome(name, events, *, killed=False, pause_at=None, returncode=0):
    trace = Trace()
    for event in events:
        trace.add(event)
    return RunOutcome(name, trace, pause_at, killed, -9 if killed else returncode)


def _steps(ids_by_step, first=0):
    return [
        {"event": "step", "step": first + i, "records": ids, "digest": f"d{ids}"}
        for i, ids in enumerate(ids_by_step)
    ]


def test_report_superseded_steps_are_rerun_not_duplicated():
    """Uncommitted steps the restarted run repeats count as re-run, not duplicated."""
    ids = [[0, 1], [2, 3], [4, 5], [6, 7]]
    end = {"event": "end", "step": 4, "loss": 1.0, "weights": "w"}
    reference = _outcome("reference", [{"event": "start", "step": 0}, *_steps(ids), end])
    killed = _outcome(
        "attempt-0",
        [{"event": "start", "step": 0}, *_steps(ids[:3]), {"event": "commit", "step": 1}],
        killed=True,
        pause_at="step:2",
    )
    resumed = _outcome("attempt-1", [{"event": "start", "step": 1}, *_steps(ids[1:], 1), end])
    report = build(reference, [killed, resumed])
    assert (report.identical, report.steps_rerun, report.records_duplicated) == (True, 2, 0)
    assert "IDENTICAL" in str(report)


def test_report_lost_checkpoint_and_lost_records_are_reported():
    """Resuming below a committed step is a problem; records skipped by the resume are lost."""
    ids = [[0, 1], [2, 3], [4, 5]]
    reference = _outcome("reference", [{"event": "start", "step": 0}, *_steps(ids)])
    killed = _outcome(
        "attempt-0",
        [{"event": "start", "step": 0}, *_steps(ids[:2]), {"event": "commit", "step": 2}],
        killed=True,
        pause_at="commit:2",
    )
    resumed = _outcome("attempt-1", [{"event": "start", "step": 1}, *_steps([[4, 5], [9, 9]], 1)])
    report = build(reference, [killed, resumed])
    assert not report.identical
    assert (report.records_lost, report.records_duplicated) == (2, 2)
    assert any("a durable checkpoint was lost" in p for p in report.problems)
    assert report.first_difference.startswith("step 1: expected records [2, 3]")


def test_report_crashed_process_is_a_problem():
    """A process that exits non-zero without being killed makes the report fail."""
    reference = _outcome("reference", [{"event": "start", "step": 0}])
    crashed = _outcome("attempt-0", [], returncode=1)
    report = build(reference, [crashed])
    assert not report.identical
    assert "attempt-0 exited with code 1" in str(report)


def test_digest_differs_for_one_flipped_bit():
    """The batch digest sees every byte."""
    a = np.zeros(64, np.uint8)
    b = a.copy()
    b[63] = 1
    assert testing.digest(a) != testing.digest(b)


def test_trace_events_are_json_lines(tmp_path):
    """Each recorder event is one JSON object per line (the documented format)."""
    recorder = testing.TraceRecorder(os.fspath(tmp_path / "t.jsonl"))
    recorder.start(3)
    recorder.close()
    (line,) = (tmp_path / "t.jsonl").read_text().splitlines()
    assert json.loads(line) == {"event": "start", "pid": os.getpid(), "step": 3}


def test_testing_modules_do_not_import_pytest():
    """resumeloader.testing and the modules it uses never import pytest (users' code may not)."""
    for name in ["testing", "tools.check", "tools.harness", "tools.report", "tools.trace"]:
        module = importlib.import_module(f"resumeloader.{name}")
        tree = ast.parse(Path(module.__file__).read_text())
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                imported.add((node.module or "").split(".")[0])
        assert "pytest" not in imported, name


COUNTER = [sys.executable, str(Path(__file__).parents[1] / "scripts" / "train_counter.py")]


def test_kill_and_restart_exact_points_counter_job_identical(tmp_path):
    """Kills right after a step, after a commit and inside a save all resume exactly."""
    report = testing.kill_and_restart(
        COUNTER, kill_points=["step:5", "commit:12", "save:16"], workdir=tmp_path
    )
    assert report.identical, str(report)
    assert [(k.last_commit, k.resumed_at) for k in report.kills] == [(4, 4), (12, 12), (12, 12)]
    assert report.steps_rerun == 2 + 0 + 4
    assert report.weights_identical is True


def test_kill_and_restart_async_kills_land_after_their_step(tmp_path):
    """Without pausing, each kill lands at or after its step while the job runs on."""
    report = testing.kill_and_restart(
        [*COUNTER, "--sleep", "0.02"], kill_points=[5, 13], workdir=tmp_path, pause=False
    )
    assert report.identical, str(report)
    assert all(k.last_step >= step for k, step in zip(report.kills, [5, 13], strict=True))
    for attempt in ("attempt-0", "attempt-1"):  # killed while running, never paused
        assert '"event":"pause"' not in (tmp_path / f"{attempt}.trace.jsonl").read_text()


def test_kill_and_restart_random_kills_seeded(tmp_path):
    """Random kill points are drawn from the reference's steps, reproducibly for a seed."""
    report = testing.kill_and_restart(COUNTER, kills=2, seed=4, workdir=tmp_path / "a")
    again = testing.kill_and_restart(COUNTER, kills=2, seed=4, workdir=tmp_path / "b")
    assert report.identical, str(report)
    assert len(report.kills) == 2
    assert [k.point for k in report.kills] == [k.point for k in again.kills]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("crash", "attempt-1 exited with code 3"),
        ("lose", "resumed at step 0 although step 8 was committed"),
    ],
    ids=["crash", "lost-checkpoint"],
)
def test_kill_and_restart_broken_job_reports_problem(tmp_path, mode, expected):
    """A crash or a restart that ignores its checkpoint fails the check and is named."""
    report = testing.kill_and_restart(
        [*COUNTER, "--mode", mode, "--at", "10"], kill_points=["step:10"], workdir=tmp_path
    )
    assert not report.identical
    assert any(expected in problem for problem in report.problems), report.problems


def test_kill_and_restart_data_ahead_of_checkpoint_reports_lost_records(tmp_path):
    """A restart whose data runs one batch ahead loses that batch's records."""
    report = testing.kill_and_restart(
        [*COUNTER, "--mode", "skip"], kill_points=["step:10"], workdir=tmp_path
    )
    assert not report.identical
    assert (report.records_lost, report.records_duplicated) == (4, 4)
    assert report.first_difference.startswith("step 8: expected records [32, 33, 34, 35]")
    assert "DIFFERENT" in str(report)


def test_kill_and_restart_nonempty_workdir_raises(tmp_path):
    """A work directory with leftovers is refused: they would be resumed from."""
    (tmp_path / "old").mkdir()
    with pytest.raises(ValueError) as info:
        testing.kill_and_restart(COUNTER, kill_points=[3], workdir=tmp_path)
    assert "(not empty)" in str(info.value)


def test_kill_and_restart_missing_command_raises(tmp_path):
    """A command that cannot start raises HarnessError naming it."""
    with pytest.raises(resumeloader.HarnessError) as info:
        testing.kill_and_restart([str(tmp_path / "nope")], kill_points=[3], workdir=tmp_path)
    assert "Cannot start the training command" in str(info.value)


def test_kill_and_restart_timeout_raises(tmp_path):
    """A process running past the timeout is killed and reported with its output."""
    with pytest.raises(resumeloader.HarnessError) as info:
        testing.kill_and_restart(
            [*COUNTER, "--sleep", "0.5"], kill_points=[20], workdir=tmp_path, timeout=1.0
        )
    assert "did not finish within the timeout" in str(info.value)


def test_kill_and_restart_wrapper_script_child_is_killed_too(tmp_path):
    """SIGKILL reaches the whole process group: a wrapper's child does not outlive the kill."""
    wrapped = ["sh", "-c", " ".join(COUNTER) + "; exit $?"]
    report = testing.kill_and_restart(wrapped, kill_points=[5], workdir=tmp_path)
    assert report.identical, str(report)
    (start, *_) = (tmp_path / "attempt-0.trace.jsonl").read_text().splitlines()
    stat = Path(f"/proc/{json.loads(start)['pid']}/stat")
    # Gone, or a zombie waiting for a reaper (the killed wrapper was its parent).
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_kill_and_restart_command_without_recorder_reports_no_trace(tmp_path):
    """A command that never records is reported as such instead of passing vacuously."""
    report = testing.kill_and_restart([sys.executable, "-c", "pass"], workdir=tmp_path)
    assert not report.identical
    assert "reference wrote no trace" in report.problems[0]


def test_report_swapped_steps_count_as_moved_not_lost():
    """Records trained at the wrong step are counted as moved, with nothing lost."""
    ids = [[0, 1], [2, 3], [4, 5]]
    reference = _outcome("reference", [{"event": "start", "step": 0}, *_steps(ids)])
    order = [ids[0], ids[2], ids[1]]
    swapped = _outcome("attempt-0", [{"event": "start", "step": 0}, *_steps(order)])
    report = build(reference, [swapped])
    assert (report.records_lost, report.records_duplicated, report.records_moved) == (0, 0, 4)
    assert not report.identical
