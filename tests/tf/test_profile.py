"""``resumeloader profile``: the stage a delay is injected into is named the bottleneck,
wherever it sits in the chain, and the settings it recommends are those it measured."""

from __future__ import annotations

import json
import sys
import textwrap
import types

import pytest
from _objstore_fixtures import put_tfrecords, source

from resumeloader.tools import cli
from resumeloader.tools import profile as profile_tool

# A factory module per injected delay: `make()` returns a pipeline whose one stage sleeps.
# TensorFlow is imported where the tf_map stage needs it: the trials' process workers
# import the module to unpickle its functions, and each would import TensorFlow (~4 s of
# CPU per worker, most of these tests' time).
_COMMON = """
import dataclasses
import time

import numpy as np

import resumeloader
from resumeloader.stages import sampler
from resumeloader.stages.batching import fixed

RECORD_SLEEP = 0.004  # per record (batches of 4)
BATCH_SLEEP = 0.02  # per batch
DATA = np.arange(4096, dtype=np.float32).reshape(1024, 4)


def sleepy(record, rng):
    time.sleep(RECORD_SLEEP)
    return record


def quick(record, rng):
    return record + 1


def sleepy_batch(batch, rngs):
    time.sleep(BATCH_SLEEP)
    return batch


def _sleep():
    time.sleep(BATCH_SLEEP)
    return np.float32(0)


def sleepy_tensor(batch, seeds):
    import tensorflow as tf

    pause = tf.numpy_function(_sleep, [], tf.float32)
    return batch + pause


@dataclasses.dataclass(frozen=True)
class SleepySampler(sampler.SamplerStage):
    def indices(self, epoch, offsets, *, seed):
        time.sleep(BATCH_SLEEP)
        return super().indices(epoch, offsets, seed=seed)


@dataclasses.dataclass(frozen=True)
class SleepyBatch(fixed.FixedBatchStage):
    name = "sleepy_batch"

    def assemble(self, columns, spec):
        time.sleep(BATCH_SLEEP)
        return super().assemble(columns, spec)


class SleepySource:
    def __len__(self):
        return len(DATA)

    def __getitem__(self, index):
        time.sleep(RECORD_SLEEP)
        return DATA[index]


def pipeline(source=DATA):
    return resumeloader.Pipeline(source, seed=0)
"""

_CASES = {
    "sampler": "pipeline().apply(SleepySampler(len(DATA), shuffle=True)).batch(4)",
    "read": "pipeline(SleepySource()).batch(4)",
    "map_fn": "pipeline().map(sleepy).batch(4)",
    "map_fn#2": "pipeline().map(quick).map(sleepy).batch(4)",
    "sleepy_batch": "pipeline().map(quick).apply(SleepyBatch(4))",
    "map_batch": "pipeline().map(quick).batch(4).map_batch(sleepy_batch)",
    "tf_map": "pipeline().batch(4).tf_map(sleepy_tensor)",
}


@pytest.fixture
def factory(tmp_path, monkeypatch):
    """Writes a factory module for a chain and returns its MODULE:FACTORY."""
    monkeypatch.chdir(tmp_path)

    def write(name: str, chain: str) -> str:
        module = f"chain_{name.replace('#', '_')}"
        text = _COMMON + f"\n\ndef make():\n    return {chain}\n"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(text))
        return f"{module}:make"

    return write


@pytest.mark.parametrize("stage", list(_CASES), ids=list(_CASES))
def test_profile_names_the_delayed_stage_the_bottleneck(factory, stage):
    """A sleep in one stage makes that stage the bottleneck, in every position of the chain."""
    result = profile_tool.profile(factory(stage, _CASES[stage]), batches=6, tune=False)
    stats = result["stats"]
    assert stats.bottleneck == stage, str(stats)
    delayed = stats.stage(stage)
    assert delayed is not None and delayed.batches >= 5


def test_profile_command_prints_the_table_the_bottleneck_and_the_fastest_measured_setting(
    factory, capsys, monkeypatch
):
    """The command prints the stage table, the bottleneck, and recommends a measured
    setting: every trial was measured; the workers chosen are the fastest if MARGIN faster
    than the current ones, the recommended depth the fastest of those measured with them.

    One run of trials for both (until 0.4 a second test ran its own trials of the same
    chain through `profile_tool.profile`, ~20 s of CPU: the command calls it)."""
    results = []
    profile = profile_tool.profile

    def spy(*args, **kwargs):
        results.append(profile(*args, **kwargs))
        return results[-1]

    monkeypatch.setattr(profile_tool, "profile", spy)
    spec = factory("map_fn", _CASES["map_fn"])
    status = cli.main(["profile", spec, "--batches", "4", "--trial-batches", "3"])
    out = capsys.readouterr().out
    assert status == 0
    assert "bottleneck: map_fn" in out
    for label in ("no workers, prefetch AUTOTUNE (current)", "2 thread workers",
                  "2 process workers"):
        assert label in " ".join(out.split()), out
    assert "Recommendation (measured):" in out

    (result,) = results
    trials, best = result["trials"], result["recommended"]
    workers = [t for t in trials if t.group == "workers"]
    depths = [t for t in trials if t.group == "prefetch"]
    assert [t.label.split(", prefetch ")[1] for t in depths] == ["AUTOTUNE", "0", "8"]
    assert all(t.records_per_s > 0 for t in workers + depths if t.error is None)
    current = workers[0]
    fastest = max((t for t in workers if t.error is None), key=lambda t: t.records_per_s)
    chosen = fastest if fastest.records_per_s >= profile_tool.MARGIN * current.records_per_s \
        else current
    assert depths[0].label.split(", prefetch")[0] == chosen.label.split(", prefetch")[0]
    deeper = max(depths, key=lambda t: t.records_per_s)
    if deeper.records_per_s < profile_tool.MARGIN * depths[0].records_per_s:
        deeper = depths[0]
    assert best == (current if chosen is current and deeper is depths[0] else deeper)


def test_profile_measures_the_block_order_for_objects_and_never_recommends_it(
    tmp_path, monkeypatch, s3_store
):
    """For objects in storage read in a global shuffle, the block order is measured beside
    (another stream: reported, never the recommendation)."""
    url, _ = put_tfrecords(s3_store, files=2, count=60, size=500)
    shared = types.ModuleType("_profile_objects")
    shared.SOURCE = source(s3_store, url, tmp_path)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "_profile_objects", shared)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "objects_job.py").write_text(
        "import _profile_objects\nfrom resumeloader import Pipeline\n\n\ndef make():\n"
        "    return Pipeline(_profile_objects.SOURCE, seed=0).shuffle().batch(8)\n"
    )
    result = profile_tool.profile("objects_job:make", batches=4, trial_batches=2, rounds=1)
    blocked = [t for t in result["trials"] if t.changes_order]
    assert len(blocked) == 1 and blocked[0].error is None and blocked[0].records_per_s > 0
    assert blocked[0].setting.startswith("pipeline.shuffle(block=")
    assert not result["recommended"].changes_order


def test_profile_json_is_one_object_with_stats_and_trials(factory, capsys):
    """--json prints one JSON object: the stats, the trials and the recommendation."""
    spec = factory("read", _CASES["read"])
    assert cli.main(["profile", spec, "--batches", "3", "--no-tune", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["stats"]["bottleneck"] == "read"
    assert data["trials"] == [] and data["recommended"] is None


def test_profile_refuses_too_few_batches(factory, capsys):
    """--batches below 2 is a usage error (exit 2) naming the option."""
    assert cli.main(["profile", factory("read", _CASES["read"]), "--batches", "1"]) == 2
    assert "--batches must be at least 2" in capsys.readouterr().err
