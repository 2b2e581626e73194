"""Keras 3 ``fit`` that resumes at the exact batch: `ResumeCallback` and `epoch_dataset`.

Keras' own `BackupAndRestore` restores only the epoch, so a restarted job re-runs
the interrupted epoch from its first batch. `ResumeCallback` checkpoints the model,
its optimizer and the loader together and advances the loader as Keras consumes
batches, so a restarted ``fit`` continues with the next unconsumed batch, in the
same Keras epoch, and ends with the weights of an uninterrupted run.

Keras epoch ``e`` is the loader's epoch ``e``. A fit resumed mid-epoch starts with
the rest of that epoch: the callback ends that short epoch itself, so that Keras
neither learns a short epoch length nor runs into the next loader epoch.
"""

from __future__ import annotations

import os
from typing import Any

import keras
import tensorflow as tf

from resumeloader.core import validate
from resumeloader.tfdata import loader as loader_lib

__all__ = ["ResumeCallback", "epoch_dataset"]


def epoch_dataset(loader: loader_lib.ResumableLoader) -> tf.data.Dataset:
    """A dataset whose every iteration yields the rest of the loader's current epoch.

    Pass it to ``model.fit`` without ``steps_per_epoch``, with a `ResumeCallback`
    advancing the loader: each Keras epoch then reads exactly one loader epoch, from
    the position current when Keras starts the epoch. Like `ResumableLoader.dataset`
    it never advances the loader itself.

    Example:
        >>> import numpy as np
        >>> loader = loader_lib.ResumableLoader(np.arange(5), batch_size=2, seed=0,
        ...                                  shuffle=False)
        >>> loader.advance()
        >>> [b.numpy().tolist() for b in epoch_dataset(loader)]
        [[2, 3], [4]]
    """
    if not isinstance(loader, loader_lib.ResumableLoader):
        msg = f"`loader` must be a ResumableLoader. Received: loader={loader!r}."
        raise TypeError(msg)
    return loader.dataset(rest_of_epoch=True)


class ResumeCallback(keras.callbacks.Callback):
    """Checkpoints model, optimizer and loader together; resumes ``fit`` at the exact batch.

    On ``fit`` start it restores the latest checkpoint (if any) and sets Keras'
    initial epoch to the loader's epoch. After every training step it advances the
    loader by the batches Keras consumed (``steps_per_execution`` included), saves
    every `save_every` batches and/or at each epoch end, and when ``fit`` returns.

    Guarantees: a ``fit`` interrupted at any point (an exception, SIGKILL) and
    resumed from a checkpoint of this callback consumes exactly the batches the
    uninterrupted run would have, in the same Keras epochs, so with deterministic
    ops its weights are bit-identical. Keras epoch ``e`` is always the loader's
    epoch ``e`` (a mismatch raises), and ``epochs`` counts epochs from the start of
    the loader: calling ``fit(epochs=4)`` after ``fit(epochs=2)`` trains epochs 2
    and 3. ``fit`` stops when a finite loader is exhausted.

    Feed ``fit`` with either ``epoch_dataset(loader)`` and no ``steps_per_epoch``, or
    ``loader.dataset()`` with ``steps_per_epoch=loader.batches_per_epoch`` (which
    ``steps_per_execution`` must divide). Put this callback before callbacks that
    stop training at an epoch end (e.g. `EarlyStopping`): it ends a resumed short
    epoch through ``model.stop_training`` and clears that flag in ``on_epoch_end``.
    Metric values of a resumed epoch cover only the batches run after the resume.

    Args:
        loader: the `ResumableLoader` feeding ``fit``.
        checkpoint: a directory (a ``tf.train.CheckpointManager`` of model,
            optimizer and loader is kept there), or your own
            ``tf.train.CheckpointManager`` whose checkpoint tracks the loader.
        save_every: save after every this many batches; None saves only at epoch
            ends (if `save_at_epoch_end`) and when ``fit`` returns.
        save_at_epoch_end: save after every epoch.
        max_to_keep: checkpoints kept in `checkpoint` when it is a directory.
    """

    def __init__(
        self,
        loader: loader_lib.ResumableLoader,
        checkpoint: str | os.PathLike[str] | tf.train.CheckpointManager,
        *,
        save_every: int | None = None,
        save_at_epoch_end: bool = True,
        max_to_keep: int = 3,
    ) -> None:
        super().__init__()
        if not isinstance(loader, loader_lib.ResumableLoader):
            msg = f"`loader` must be a ResumableLoader. Received: loader={loader!r}."
            raise TypeError(msg)
        self._loader = loader
        self._save_every = (
            None if save_every is None else validate.integer("save_every", save_every, low=1)
        )
        self._save_at_epoch_end = validate.boolean("save_at_epoch_end", save_at_epoch_end)
        self._max_to_keep = validate.integer("max_to_keep", max_to_keep, low=1)
        self._manager: tf.train.CheckpointManager | None = None
        self._directory: str | None = None
        if isinstance(checkpoint, tf.train.CheckpointManager):
            _check_tracks_loader(checkpoint, loader)
            self._manager = checkpoint
        elif isinstance(checkpoint, (str, os.PathLike)):
            self._directory = os.fspath(checkpoint)
        else:
            msg = (
                "`checkpoint` must be a directory or a tf.train.CheckpointManager. "
                f"Received: checkpoint={checkpoint!r}."
            )
            raise TypeError(msg)
        self._left = 0  # batches of the loader's epoch left when the Keras epoch began
        self._counted = 0  # batches of this Keras epoch the loader was advanced by
        self._since_save = 0
        self._saved_position: int | None = None
        self._ended_epoch = False

    @property
    def manager(self) -> tf.train.CheckpointManager | None:
        """The checkpoint manager (created at the first ``fit`` for a directory)."""
        return self._manager

    # -- fit begin / end ---------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        optimizer = self.model.optimizer
        if optimizer is not None and not optimizer.built:
            # Built now, its slots are restored immediately instead of never.
            optimizer.build(self.model.trainable_variables)
        if self._manager is None:
            checkpoint = tf.train.Checkpoint(
                model=self.model, optimizer=optimizer, loader=self._loader
            )
            self._manager = tf.train.CheckpointManager(
                checkpoint, self._directory, max_to_keep=self._max_to_keep
            )
        latest = self._manager.latest_checkpoint
        if latest is not None:
            self._manager.checkpoint.restore(latest).assert_existing_objects_matched()
        self._saved_position = self._loader.position
        self._since_save = 0
        self._check_fit_arguments()
        # Read by fit right after on_train_begin, as for BackupAndRestore (0 reads as
        # unset); cleared again in on_epoch_begin so that it cannot leak to later fits.
        self.model._initial_epoch = self._loader.epoch or None

    def _check_fit_arguments(self) -> None:
        steps = self.params.get("steps")
        per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
        per_epoch = self._loader.batches_per_epoch
        if steps is None:
            return
        if steps != per_epoch:
            msg = (
                "ResumeCallback keeps Keras epochs equal to loader epochs: `steps_per_epoch` "
                f"must be the loader's batches per epoch or not given. Received: "
                f"steps_per_epoch={steps}, loader.batches_per_epoch={per_epoch}."
            )
            raise ValueError(msg)
        left = self._loader.batches_left_in_epoch
        if per_epoch % per_execution or left % per_execution:
            msg = (
                "With `steps_per_epoch` given, `steps_per_execution` must divide the batches "
                f"of an epoch and those left in the current one, or an execution would cross "
                f"into the next epoch. Received: steps_per_execution={per_execution}, "
                f"batches per epoch={per_epoch}, left in epoch {self._loader.epoch}={left}. "
                "Pass epoch_dataset(loader) without steps_per_epoch instead."
            )
            raise ValueError(msg)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._loader.position != self._saved_position:
            self._save()

    # -- epochs ------------------------------------------------------------------------
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.model._initial_epoch = None
        if epoch != self._loader.epoch:
            msg = (
                f"Keras epoch {epoch} does not match the loader's epoch {self._loader.epoch}: "
                "do not pass `initial_epoch` with ResumeCallback (it sets it from the loader) "
                "and feed fit from this loader. Received: epoch={epoch}, "
                f"loader={self._loader!r}."
            )
            raise ValueError(msg)
        self._left = self._loader.batches_left_in_epoch
        self._counted = 0
        self._ended_epoch = False
        if self._left == 0:  # an exhausted loader has nothing more to train on
            self.model.stop_training = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Keras passes the last step of the execution; an execution cut short by the
        # end of an epoch_dataset still reports its full length.
        consumed = min(batch + 1, self._left)
        if consumed > self._counted:
            self._loader.advance(consumed - self._counted)
            self._since_save += consumed - self._counted
            self._counted = consumed
        if self._save_every is not None and self._since_save >= self._save_every:
            self._save()
        if consumed >= self._left and not self.model.stop_training:
            # Ends the epoch exactly at the loader's epoch boundary.
            self.model.stop_training = True
            self._ended_epoch = True

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._ended_epoch and not self._loader.exhausted:
            self.model.stop_training = False
        self._ended_epoch = False
        if self._save_at_epoch_end:
            self._save()

    def _save(self) -> None:
        assert self._manager is not None
        self._manager.save()
        self._saved_position = self._loader.position
        self._since_save = 0


def _check_tracks_loader(manager: tf.train.CheckpointManager, loader: Any) -> None:
    tracked = tf.train.TrackableView(manager.checkpoint).descendants()
    if not any(obj is loader for obj in tracked):
        msg = (
            "The CheckpointManager's checkpoint does not track the loader, so saving it "
            "would not save the loader's position. Create it as tf.train.Checkpoint("
            f"model=..., optimizer=..., loader=loader). Received: loader={loader!r}."
        )
        raise ValueError(msg)
