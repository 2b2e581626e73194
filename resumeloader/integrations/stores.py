"""Where a `ResumeCallback` keeps its checkpoints: the one place the format is chosen.

* TensorFlow backend: a ``tf.train.CheckpointManager`` of model, optimizer and loader
  (`resumeloader.integrations.tf_checkpoint`), in the directory given or your own
  manager — the format of resumeloader 0.1 to 0.3.
* JAX and PyTorch backends: ``ckpt-N`` directories of JSON and arrays
  (`resumeloader.integrations.checkpoint_files`), since ``tf.train.Checkpoint`` cannot
  track their variables.

Either way the loader's state is JSON and the callback's behaviour is the same. A
checkpoint does not move across backends: a directory holding the other format is
refused before anything is restored (a silent fresh start would retrain from zero).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, Protocol

from resumeloader import errors
from resumeloader.integrations import backend, callback_state, checkpoint_files, checkpoint_layout
from resumeloader.tfdata import loader as loader_lib

__all__ = ["Store", "check_format", "open_store"]

_TF_INDEX = "checkpoint"  # the index file a tf.train.CheckpointManager writes


class Store(Protocol):
    """What the callback asks of a checkpoint format."""

    @property
    def directory(self) -> str:
        """The checkpoint directory."""

    def restore(self, model: Any, fit_state: callback_state.FitState) -> str | None:
        """Restores the newest checkpoint (None: there is none)."""

    def save(self, *, written: Callable[[], None] | None = None) -> str:
        """Writes a checkpoint; `written` runs once its files are written, before it
        becomes the newest."""


def _is_manager(value: Any) -> bool:
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(value, tf.train.CheckpointManager)


def open_store(
    loader: loader_lib.ResumableLoader,
    checkpoint: str | os.PathLike[str] | Any,
    *,
    max_to_keep: int,
) -> Store:
    """The store for `checkpoint` (a directory or a ``tf.train.CheckpointManager``).

    Raises:
        TypeError: `checkpoint` is neither, or a manager on another backend than
            TensorFlow.
        ValueError: the manager's checkpoint does not track `loader`.
    """
    if isinstance(checkpoint, (str, os.PathLike)):
        directory = os.fspath(checkpoint)
        if not backend.is_tensorflow():
            return checkpoint_files.FileStore(
                loader, directory=directory, max_to_keep=max_to_keep
            )
        from resumeloader.integrations import tf_checkpoint

        return tf_checkpoint.TFCheckpointStore(
            loader, directory=directory, max_to_keep=max_to_keep
        )
    if _is_manager(checkpoint):
        if not backend.is_tensorflow():
            msg = (
                "A tf.train.CheckpointManager saves TensorFlow objects only, and on the "
                f"{backend.name()} backend the model's variables are not: pass a "
                "directory (ResumeCallback then saves model, optimizer and loader there "
                f"itself). Received: checkpoint={checkpoint!r:.80}, KERAS_BACKEND="
                f"{backend.name()}."
            )
            raise TypeError(msg)
        from resumeloader.integrations import tf_checkpoint

        return tf_checkpoint.TFCheckpointStore(loader, manager=checkpoint)
    msg = (
        "`checkpoint` must be a directory or a tf.train.CheckpointManager. "
        f"Received: checkpoint={checkpoint!r:.80}."
    )
    raise TypeError(msg)


def check_format(store: Store) -> None:
    """Raises `StateError` when `store`'s directory holds the other backends' checkpoints
    and none of its own (they would be ignored: the fit would start from zero)."""
    directory = store.directory
    files = checkpoint_layout.checkpoints(directory)
    tf_index = os.path.isfile(os.path.join(directory, _TF_INDEX))
    if isinstance(store, checkpoint_files.FileStore):
        foreign, own = tf_index, bool(files)
        kind = "TensorFlow backend (tf.train.Checkpoint)"
    else:
        foreign, own = bool(files), tf_index
        kind = "JAX or PyTorch backend (ckpt-N directories)"
    if foreign and not own:
        msg = (
            f"The checkpoint directory {directory!r} holds checkpoints written on the "
            f"{kind}; this fit runs on the {backend.name()} backend, whose checkpoints "
            "differ, so it would start from zero. Resume on the backend that wrote them, "
            f"or give another directory. Received: KERAS_BACKEND={backend.name()}."
        )
        raise errors.StateError(msg)
