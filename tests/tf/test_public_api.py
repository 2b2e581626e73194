"""Tests of the package surface: exports, lazy TensorFlow import, version."""

from __future__ import annotations

import dataclasses
import inspect
import subprocess
import sys

import pytest

import resumeloader
import resumeloader.stages


def test_all_sorted_and_importable():
    """__all__ is sorted and every name in it resolves."""
    assert list(resumeloader.__all__) == sorted(resumeloader.__all__)
    for name in resumeloader.__all__:
        assert getattr(resumeloader, name) is not None


def test_import_does_not_load_tensorflow():
    """`import resumeloader` and the sampler stay TensorFlow-free (workers rely on it)."""
    code = (
        "import sys, resumeloader; resumeloader.IndexSampler(10, seed=0)[3];"
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_errors_refine_builtins():
    """Library errors subclass the built-in exceptions they refine."""
    assert issubclass(resumeloader.StateMismatchError, ValueError)
    assert issubclass(resumeloader.ElasticResumeError, resumeloader.StateError)
    assert issubclass(resumeloader.RecordError, RuntimeError)
    assert issubclass(resumeloader.RecordSpecError, ValueError)


def test_unknown_attribute_raises_attribute_error():
    """A misspelt name raises AttributeError, not an import error."""
    with pytest.raises(AttributeError) as info:
        resumeloader.ResumableLoder  # noqa: B018
    assert "ResumableLoder" in str(info.value)


def test_version_is_pep440_string():
    """__version__ is a non-empty version string."""
    assert resumeloader.__version__[0].isdigit()


# The public surface, pinned: a change here is a change of the API (and of the CHANGELOG).
LOADER_PARAMETERS = [
    "source", "batch_size", "seed", "shuffle", "num_epochs", "map_fn", "drop_remainder",
    "prefetch", "output_signature", "with_metadata", "shard", "workers",
]
FROM_PIPELINE_PARAMETERS = [
    "pipeline", "num_epochs", "shard", "workers", "prefetch", "with_metadata",
]
LOADER_MEMBERS = [
    "advance", "batch_at", "batch_size", "batches_left_in_epoch", "batches_per_epoch",
    "close", "dataset", "describe", "deserialize", "drop_remainder", "element_spec", "epoch",
    "excluding_in_flight", "exhausted", "from_pipeline", "get_state", "log_stats", "num_epochs",
    "num_records", "pipeline", "plan", "position", "records_at", "sampler", "seed",
    "serialize", "set_state", "shard", "start_prefetch", "stats", "step", "with_metadata",
    "workers", "write_summaries",
]
STAGES = [
    "BatchMapStage", "BatchStage", "BlockStage", "BucketStage", "FixedBatchStage", "Group",
    "GroupError", "IndexStage", "MapBatchStage", "MapStage", "MixStage", "PackStage",
    "PaddedBatchStage", "PlainBatchStage", "RecordStage", "SamplerStage", "Stage", "TFMapStage",
    "TensorStage", "TokenBudgetStage", "WindowedBatchStage",
]


def _parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name not in ("self", "cls")]


def test_loader_constructors_take_one_spelling_per_option():
    """The loader's constructors: at most 13 parameters, `shard` and `workers` as values."""
    assert _parameters(resumeloader.ResumableLoader.__init__) == LOADER_PARAMETERS
    assert _parameters(resumeloader.ResumableLoader.from_pipeline) == FROM_PIPELINE_PARAMETERS
    assert len(LOADER_PARAMETERS) <= 13


def test_loader_public_members_are_pinned():
    """The loader's public members (the `tf.train` hooks `serialize`/`deserialize` among them)."""
    loader = resumeloader.ResumableLoader
    own = [
        name for name in dir(loader)
        if not name.startswith("_")
        and any(name in vars(k) for k in loader.__mro__ if k.__module__.startswith("resumeloader"))
    ]
    assert own == LOADER_MEMBERS
    properties = [n for n in own if isinstance(inspect.getattr_static(loader, n), property)]
    assert all(inspect.getattr_static(loader, n).fget.__name__ == n for n in properties)


def test_stages_package_exports_stages_not_plumbing():
    """`resumeloader.stages` exports the stages and the bases of your own; `Plan`, `Task`
    and `Batches` are the library's."""
    assert resumeloader.stages.__all__ == STAGES


def test_pipeline_is_a_frozen_value():
    """A pipeline cannot be changed: each builder method returns a new one."""
    pipeline = resumeloader.Pipeline(list(range(6)), seed=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        pipeline.seed = 2  # type: ignore[misc]
    batched = pipeline.batch(2)
    assert pipeline.batch_stage is None and batched.batch_stage is not None
    assert batched.source is pipeline.source and batched.seed == 1


def test_index_sampler_takes_a_shard():
    """`IndexSampler` takes a `Shard` value, as the loader does."""
    assert _parameters(resumeloader.IndexSampler) == [
        "num_records", "seed", "shuffle", "num_epochs", "shard",
    ]
