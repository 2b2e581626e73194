"""`ResumeCallback` checkpoints as ``tf.train.Checkpoint``s (the TensorFlow backend).

On TensorFlow a Keras model, its optimizer and the loader are trackable, so one
``tf.train.Checkpoint`` written by a ``tf.train.CheckpointManager`` holds them all —
the format of resumeloader 0.1 to 0.3, which `resumeloader.restore`, ``resumeloader
inspect`` and your own ``CheckpointManager`` read. The fit's state is tracked beside
them: its JSON (`FitState`) as a ``PythonState`` under ``resumeloader_fit``,
`EarlyStopping`'s best weights as variables under ``resumeloader_best_weights``, and
the model's variables the object graph does not reach from the model (a seed
generator's state) under ``resumeloader_model_state``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from resumeloader.integrations import callback_state
from resumeloader.tfdata import loader as loader_lib
from resumeloader.tfdata import restore as restore_lib

__all__ = ["TFCheckpointStore"]

# Where the fit state is tracked in the checkpoint.
_FIT_STATE = "resumeloader_fit"
_BEST_WEIGHTS = "resumeloader_best_weights"
_UNTRACKED = "resumeloader_model_state"


class _Variables(tf.Module):
    """Model variables ``tf.train.Checkpoint`` does not reach through the model."""

    def __init__(self, variables: list[Any]) -> None:
        super().__init__(name="resumeloader_model_state")
        self.variables_list = variables


def _untracked(checkpoint: Any, model: Any) -> list[Any]:
    """The variables of `model` that `checkpoint` would not save.

    Keras 3 keeps a seed generator's state (``Dropout``, random augmentation layers)
    in a variable that TensorFlow's object graph does not reach from the model: left
    out, a resumed fit would draw other dropout masks than the uninterrupted one.
    """
    reached = {id(obj) for obj in tf.train.TrackableView(checkpoint).descendants()}
    return [v for v in model.variables if id(v) not in reached]


class _BestWeights(tf.Module):
    """Variables holding `EarlyStopping.best_weights`, one set per such callback."""

    def __init__(self, model: Any, count: int) -> None:
        super().__init__(name="resumeloader_best_weights")
        shapes = [(np.shape(w), np.asarray(w).dtype) for w in model.get_weights()]
        self.sets = [
            [tf.Variable(np.zeros(shape, dtype), trainable=False) for shape, dtype in shapes]
            for _ in range(count)
        ]


class _TrackedFitState(tf.train.experimental.PythonState):
    """A `FitState` as a ``PythonState``; saving copies the best weights into variables."""

    def __init__(self, fit_state: callback_state.FitState) -> None:
        self.fit_state = fit_state
        self.best = _BestWeights(fit_state.model, len(fit_state.keepers))

    def serialize(self) -> str:
        for variables, weights in zip(
            self.best.sets, self.fit_state.best_weights(), strict=True
        ):
            for variable, value in zip(variables, weights or (), strict=False):
                variable.assign(value)
        return self.fit_state.to_json()

    def deserialize(self, string_value: Any) -> None:
        if isinstance(string_value, tf.Tensor):
            string_value = string_value.numpy()
        self.fit_state.load_json(string_value)


class TFCheckpointStore:
    """Model, optimizer, loader and fit state in one ``tf.train.Checkpoint``.

    Args:
        loader: the loader, tracked as ``loader``.
        manager: your ``tf.train.CheckpointManager`` whose checkpoint tracks the
            loader, or None to make one of model, optimizer and loader in `directory`.
        directory: where checkpoints go when `manager` is None.
        max_to_keep: checkpoints the manager made here keeps.
    """

    def __init__(
        self,
        loader: loader_lib.ResumableLoader,
        *,
        manager: tf.train.CheckpointManager | None = None,
        directory: str | None = None,
        max_to_keep: int = 3,
    ) -> None:
        if manager is not None:
            restore_lib.check_tracks_loader(manager, loader)
        self._loader = loader
        self.manager = manager
        self._directory = directory
        self._max_to_keep = max_to_keep
        self._tracked: _TrackedFitState | None = None

    @property
    def directory(self) -> str:
        """The checkpoint directory."""
        if self.manager is not None:
            return os.fspath(self.manager.directory)
        assert self._directory is not None
        return self._directory

    def _track(self, fit_state: callback_state.FitState) -> None:
        assert self.manager is not None
        if self._tracked is None or self._tracked.fit_state is not fit_state:
            self._tracked = _TrackedFitState(fit_state)
        checkpoint = self.manager.checkpoint
        setattr(checkpoint, _FIT_STATE, self._tracked)
        setattr(checkpoint, _BEST_WEIGHTS, self._tracked.best)

    def restore(self, model: Any, fit_state: callback_state.FitState) -> str | None:
        """Restores the latest checkpoint into model, optimizer, loader and `fit_state`.

        Returns:
            The checkpoint restored, or None when there is none yet.
        """
        if self.manager is None:
            checkpoint = tf.train.Checkpoint(
                model=model, optimizer=model.optimizer, loader=self._loader
            )
            self.manager = tf.train.CheckpointManager(
                checkpoint, self._directory, max_to_keep=self._max_to_keep
            )
        checkpoint = self.manager.checkpoint
        if getattr(checkpoint, _UNTRACKED, None) is None:
            missing = _untracked(checkpoint, model)
            if missing:
                setattr(checkpoint, _UNTRACKED, _Variables(missing))
        path = restore_lib.checked_path(self.manager, self._loader)
        # A checkpoint written without the fit state (by resumeloader 0.1, or by your
        # code) still restores: the fit state is tracked after it then.
        saved = set() if path is None else {n for n, _ in tf.train.list_variables(path)}
        if any(name.startswith(f"{_FIT_STATE}/") for name in saved):
            self._track(fit_state)
        if path is not None:
            self.manager.checkpoint.restore(path).assert_existing_objects_matched()
            assert self._tracked is None or self._tracked.fit_state is fit_state
            sets = self._tracked.best.sets if self._tracked is not None else []
            fit_state.apply_callbacks(lambda k: [v.numpy() for v in sets[k]])
        self._track(fit_state)
        return path

    def save(self, *, written: Callable[[], None] | None = None) -> str:
        """Writes a checkpoint; `written` runs once its files are written, before the
        manager records it as the latest."""
        assert self.manager is not None
        if written is None:  # a manager of yours may pass options of its own
            return str(self.manager.save())
        options = tf.train.CheckpointOptions(experimental_write_callbacks=[written])
        return str(self.manager.save(options=options))
