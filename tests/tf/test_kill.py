"""Real SIGKILL integration tests: the demo job killed at three points across two epochs.

One ``resumeloader verify`` run is shared by every test (a reference process plus four
killed or resumed processes): kills right after step 6 (mid-epoch 0), right after the
checkpoint of steps 0..14 was saved, and inside the save of steps 0..24 (epoch 1),
with batch, prefetch, a randomly augmenting ``map_fn`` and op determinism. The report
object is taken from the harness call the command makes.
"""

from __future__ import annotations

import os
import sys

import _once
import pytest
import tensorflow as tf

from resumeloader import cli
from resumeloader.tools import harness as _harness
from resumeloader.tools import inspect as _inspect

pytestmark = pytest.mark.slow

KILL_POINTS = ["step:6", "commit:15", "save:25"]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory, worker_id):
    """(exit status, report, what each kill left): one run for the whole test run."""
    return _once.once_per_run(tmp_path_factory, worker_id, "kill-verify", _killed_run)


def _killed_run(folder):
    work = folder / "verify"
    ckpt_dir = str(work / "resumed-ckpt")
    at_kill = {}
    reports = []
    harness = _harness.kill_and_restart

    def snapshot(event):
        if event["event"] == "pause":  # the process is dead: look at what it left
            at_kill[event["point"]] = {
                "files": sorted(os.listdir(ckpt_dir)),
                "latest": tf.train.latest_checkpoint(ckpt_dir),
                "states": _inspect.find_states(ckpt_dir)[1],
            }

    def spy(command, *, on_event, **kwargs):
        def both(name, event):
            snapshot(event)
            on_event(name, event)

        reports.append(harness(command, on_event=both, **kwargs))
        return reports[-1]

    argv = ["verify", "--workdir", str(work)]
    argv += [f"--kill-at={point}" for point in KILL_POINTS]
    argv += ["--", sys.executable, "-m", "resumeloader.tools.demo", "--epochs", "2"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_harness, "kill_and_restart", spy)
        status = cli.main(argv)
    (report,) = reports
    return status, report, at_kill


def test_kill_verify_resumeloader_job_exits_0(killed_run):
    """`resumeloader verify` exits 0 on a resumeloader training job killed three times."""
    status, report, _ = killed_run
    assert status == 0, str(report)


def test_kill_three_points_resumed_stream_identical(killed_run):
    """After three SIGKILLs the stitched run trained on exactly the reference's batches."""
    _, report, _ = killed_run
    assert report.identical, str(report)
    assert (report.reference_steps, report.resumed_steps, report.processes) == (32, 32, 4)
    assert (report.records_lost, report.records_duplicated) == (0, 0)
    assert (report.batches_differing, report.digests_differing) == (0, 0)


def test_kill_three_points_final_weights_bit_identical(killed_run):
    """The final weights digest and loss equal the uninterrupted run's."""
    _, report, _ = killed_run
    assert report.weights_identical is True
    assert report.resumed_loss == report.reference_loss


def test_kill_each_point_resumes_at_last_committed_step(killed_run):
    """Each restart resumes at the newest complete checkpoint; uncommitted steps are re-run."""
    _, report, _ = killed_run
    assert [(k.point, k.last_step, k.resumed_at) for k in report.kills] == [
        ("step:6", 6, 5),
        ("commit:15", 14, 15),
        ("save:25", 24, 20),
    ]
    assert report.steps_rerun == 2 + 0 + 5


def test_kill_during_save_leaves_previous_checkpoint_loadable(killed_run):
    """Killed inside a save (files written, index not updated): the previous checkpoint loads."""
    _, _, at_kill = killed_run
    snapshot = at_kill["save:25"]
    assert "ckpt-25.index" in snapshot["files"]
    assert snapshot["latest"].endswith("ckpt-20")
    (state,) = snapshot["states"].values()
    assert (state["epoch"], state["offset"]) == (1, 20 * 32 - 512)


def test_kill_right_after_save_checkpoint_holds_position(killed_run):
    """Killed right after a commit: the newest checkpoint holds the loader at that step."""
    _, _, at_kill = killed_run
    snapshot = at_kill["commit:15"]
    assert snapshot["latest"].endswith("ckpt-15")
    (state,) = snapshot["states"].values()
    assert (state["epoch"], state["offset"]) == (0, 15 * 32)
