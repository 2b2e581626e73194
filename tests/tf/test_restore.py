"""resumeloader.restore: a checkpoint is restored only if it holds the loader's state."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import ResumableLoader


def _loader() -> ResumableLoader:
    return ResumableLoader(np.arange(40), batch_size=4, seed=2, num_epochs=1)


def test_restore_checkpoint_without_loader_raises_and_changes_nothing(tmp_path):
    """A checkpoint saved without the loader is refused: neither model nor data restored."""
    weights = tf.Variable([1.0, 2.0])
    tf.train.CheckpointManager(tf.train.Checkpoint(weights=weights), str(tmp_path), 2).save()
    weights.assign([5.0, 5.0])
    loader = _loader()
    loader.advance(3)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(weights=weights, loader=loader), str(tmp_path), 2
    )

    with pytest.raises(resumeloader.StateError, match="holds no state for the loader") as info:
        resumeloader.restore(manager, loader)

    assert manager.latest_checkpoint in str(info.value)
    assert weights.numpy().tolist() == [5.0, 5.0]
    assert loader.position == 12


def test_restore_without_checkpoint_returns_none(tmp_path):
    """With no checkpoint yet (a fresh start) it restores nothing and returns None."""
    loader = _loader()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(loader=loader), str(tmp_path), 2)

    assert resumeloader.restore(manager, loader) is None
    assert loader.position == 0


def test_restore_latest_checkpoint_restores_model_and_loader(tmp_path):
    """The latest checkpoint restores the model and the loader together; its path is returned."""
    weights = tf.Variable(0.0)
    loader = _loader()
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(weights=weights, loader=loader), str(tmp_path), 2
    )
    for step, _ in enumerate(loader):
        weights.assign_add(1.0)
        if step == 2:
            saved = manager.save()
            break
    fresh_weights, fresh = tf.Variable(0.0), _loader()
    fresh_manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(weights=fresh_weights, loader=fresh), str(tmp_path), 2
    )

    assert resumeloader.restore(fresh_manager, fresh) == saved
    assert (float(fresh_weights.numpy()), fresh.position) == (3.0, 12)


def test_restore_loader_tracked_inside_another_object(tmp_path):
    """A loader tracked as an attribute of another trackable is found and restored."""
    loader = _loader()
    holder = tf.Module()
    holder.data = loader
    loader.advance(2)
    tf.train.CheckpointManager(tf.train.Checkpoint(job=holder), str(tmp_path), 2).save()
    fresh = _loader()
    fresh_holder = tf.Module()
    fresh_holder.data = fresh
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(job=fresh_holder), str(tmp_path), 2)

    resumeloader.restore(manager, fresh)

    assert fresh.position == 8


def test_restore_manager_not_tracking_loader_raises_value_error(tmp_path):
    """A manager whose checkpoint does not track the loader is refused before restoring."""
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(), str(tmp_path), 2)

    with pytest.raises(ValueError, match="does not track the loader") as info:
        resumeloader.restore(manager, _loader())

    assert "loader=ResumableLoader(" in str(info.value)


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [(("a directory", None), "manager='a directory'"), ((None, "data"), "loader='data'")],
    ids=["not-a-manager", "not-a-loader"],
)
def test_restore_wrong_argument_types_raise_type_error(tmp_path, arguments, fragment):
    """Anything but a CheckpointManager and a ResumableLoader raises a TypeError."""
    loader = _loader()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(loader=loader), str(tmp_path), 2)
    given = [manager if arguments[0] is None else arguments[0]]
    given.append(loader if arguments[1] is None else arguments[1])

    with pytest.raises(TypeError) as info:
        resumeloader.restore(*given)

    assert fragment in str(info.value)


class _SavedValue(tf.train.experimental.PythonState):
    """Another object saved under the loader's key (what a wrong checkpoint holds there)."""

    def __init__(self, value) -> None:
        self.value = value

    def serialize(self):
        return self.value

    def deserialize(self, string_value):
        del string_value


@pytest.mark.parametrize(
    ("value", "named"),
    [
        (pickle.dumps({"epoch": 3, "offset": 12}), "a Python pickle (protocol"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "bytes of binary data"),
        ('{"version": 2, "fingerprint": "ab', "truncated JSON"),
    ],
    ids=["pickle", "binary", "truncated-json"],
)
def test_checkpoint_value_not_a_loader_state_raises_state_error_naming_it(value, named, tmp_path):
    """A checkpoint whose loader value is not the loader's JSON is a StateError saying what
    it holds (never a UnicodeDecodeError), and the loader is unchanged."""
    path = tf.train.Checkpoint(loader=_SavedValue(value)).save(str(tmp_path / "ckpt"))
    loader = _loader()
    loader.advance(2)

    with pytest.raises(resumeloader.StateError) as info:
        tf.train.Checkpoint(loader=loader).read(path)

    assert named in str(info.value)
    assert loader.position == 8
