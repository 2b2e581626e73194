"""Keras 3 ``fit`` that resumes at the exact batch: `ResumeCallback` and `epoch_dataset`.

Keras' own `BackupAndRestore` restores only the epoch, so a restarted job re-runs
the interrupted epoch from its first batch. `ResumeCallback` checkpoints the model,
its optimizer and the loader together and advances the loader as Keras consumes
batches, so a restarted ``fit`` continues with the next unconsumed batch, in the
same Keras epoch, and ends with the weights of an uninterrupted run.

Keras epoch ``e`` is the loader's epoch ``e``. A fit resumed mid-epoch starts with
the rest of that epoch: the callback ends that short epoch itself, so that Keras
neither learns a short epoch length nor runs into the next loader epoch. The state of
the fit's stateful callbacks and its training metrics are checkpointed too
(`resumeloader.integrations.callback_state`).
"""

from __future__ import annotations

import os
from typing import Any

import keras
import tensorflow as tf

from resumeloader.core import validate
from resumeloader.integrations import callback_state
from resumeloader.tfdata import loader as loader_lib
from resumeloader.tfdata import restore as restore_lib

__all__ = ["ResumeCallback", "epoch_dataset"]


def epoch_dataset(loader: loader_lib.ResumableLoader) -> tf.data.Dataset:
    """A dataset whose every iteration yields the rest of the loader's current epoch.

    Pass it to ``model.fit`` without ``steps_per_epoch``, with a `ResumeCallback`
    advancing the loader: each Keras epoch then reads exactly one loader epoch, from
    the position current when Keras starts the epoch. Like `ResumableLoader.dataset`
    it never advances the loader itself.

    Examples:
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


class _EpochBoundary:
    """The `model.stop_training` value that ends a resumed short epoch: true, and told
    apart from a `True` another callback sets (e.g. `EarlyStopping`), which is kept."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<stop at the loader's epoch boundary>"


_BOUNDARY = _EpochBoundary()
# Where the fit state is tracked in the checkpoint.
_FIT_STATE = "resumeloader_fit"
_BEST_WEIGHTS = "resumeloader_best_weights"


class ResumeCallback(keras.callbacks.Callback):
    """Checkpoints model, optimizer and loader together; resumes ``fit`` at the exact batch.

    On ``fit`` start it restores the latest checkpoint (if any; one without the
    loader's state is refused, see `resumeloader.restore`) and sets Keras' initial
    epoch to the loader's epoch. After every training step it advances the loader by
    the batches Keras consumed (``steps_per_execution`` included), saves every
    `save_every` batches and/or at each epoch end, and when ``fit`` returns.

    With the checkpoint it saves the state of the fit's stateful callbacks —
    `EarlyStopping` (``wait``, ``best``, ``best_weights``, ...), `ReduceLROnPlateau`
    and `ModelCheckpoint` (its best value) — and the training metrics of the epoch so
    far, so a resumed epoch ends with the logs, and the callbacks with the decisions,
    of the uninterrupted run. Put this callback *after* those callbacks in
    ``callbacks`` (it saves their state once they updated it; the other order raises).
    A fit a callback stopped stays stopped: resumed, it trains no more epochs. Other
    callbacks' own state is not saved.

    Guarantees: a ``fit`` interrupted at any point (an exception, SIGKILL) and
    resumed from a checkpoint of this callback consumes exactly the batches the
    uninterrupted run would have, in the same Keras epochs, runs every epoch's
    validation and ``on_epoch_end`` once, stops at the same epoch, so with
    deterministic ops its weights and logs are bit-identical. Compiled metrics
    (``metrics=``, ``weighted_metrics=``, per output) resume with the epoch. Keras epoch ``e`` is
    always the loader's epoch ``e`` (a mismatch raises), and ``epochs`` counts epochs
    from the start of the loader: calling ``fit(epochs=4)`` after ``fit(epochs=2)``
    trains epochs 2 and 3. ``fit`` stops when a finite loader is exhausted.

    Feed ``fit`` with either ``epoch_dataset(loader)`` and no ``steps_per_epoch``, or
    ``loader.dataset()`` with ``steps_per_epoch=loader.batches_per_epoch`` (which
    ``steps_per_execution`` must divide). A loader whose batches count the records
    they hold (`Pipeline.pack`, `Pipeline.batch_by_tokens`) has no batches per epoch
    known in advance: feed it ``epoch_dataset(loader)``; the callback ends each Keras
    epoch where the loader's epoch ends. Metric values of a resumed epoch cover all
    its batches, those before the interruption included.

    Args:
        loader: the `ResumableLoader` feeding ``fit``.
        checkpoint: a directory (a ``tf.train.CheckpointManager`` of model,
            optimizer and loader is kept there), or your own
            ``tf.train.CheckpointManager`` whose checkpoint tracks the loader (the
            callback adds the callbacks' state to its checkpoint).
        save_every: save after every this many batches; None saves only at epoch
            ends (if `save_at_epoch_end`) and when ``fit`` returns. A save due at an
            epoch's last batch is made at that epoch's end instead (after its
            validation and the ``on_epoch_end`` of the callbacks before this one), so a
            fit killed in between resumes before the last batch and runs that epoch's
            end once.
        save_at_epoch_end: save after every epoch.
        max_to_keep: checkpoints kept in `checkpoint` when it is a directory.
        summaries: a directory or a `tf.summary.SummaryWriter`: the loader's stage
            figures are written there as scalars (`ResumableLoader.write_summaries`:
            ``resumeloader/data_wait_ms``, per stage ``ms_per_batch``, ...) every
            `summaries_every` batches and at each epoch end, at the optimizer's
            iteration count (the step Keras' `TensorBoard` callback writes batch
            figures at), so TensorBoard shows the data wait beside the loss. None
            writes none.
        summaries_every: batches between two writes of `summaries`.
    """

    def __init__(
        self,
        loader: loader_lib.ResumableLoader,
        checkpoint: str | os.PathLike[str] | tf.train.CheckpointManager,
        *,
        save_every: int | None = None,
        save_at_epoch_end: bool = True,
        max_to_keep: int = 3,
        summaries: str | os.PathLike[str] | tf.summary.SummaryWriter | None = None,
        summaries_every: int = 100,
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
        self._summaries_every = validate.integer("summaries_every", summaries_every, low=1)
        if summaries is not None and not isinstance(
            summaries, (str, os.PathLike, tf.summary.SummaryWriter)
        ):
            msg = (
                "`summaries` must be a directory, a tf.summary.SummaryWriter or None. "
                f"Received: summaries={summaries!r:.80} of type {type(summaries).__name__}."
            )
            raise TypeError(msg)
        self._summaries = summaries
        self._writer: tf.summary.SummaryWriter | None = None
        self._since_summary = 0
        self._manager: tf.train.CheckpointManager | None = None
        self._directory: str | None = None
        if isinstance(checkpoint, tf.train.CheckpointManager):
            restore_lib.check_tracks_loader(checkpoint, loader)
            self._manager = checkpoint
        elif isinstance(checkpoint, (str, os.PathLike)):
            self._directory = os.fspath(checkpoint)
        else:
            msg = (
                "`checkpoint` must be a directory or a tf.train.CheckpointManager. "
                f"Received: checkpoint={checkpoint!r}."
            )
            raise TypeError(msg)
        self._fit_state: callback_state.FitState | None = None
        # False for packing and token budgets: an epoch has as many batches as its data.
        self._known = loader.plan.layout.known_counts
        self._epoch = 0  # the Keras epoch running
        self._left = 0  # batches of the loader's epoch left when the Keras epoch began
        self._counted = 0  # batches of this Keras epoch the loader was advanced by
        self._since_save = 0
        self._saved_position: int | None = None
        self._resumed_mid_epoch = False
        self._data_spec: Any = None  # of the data fit reads (to build compiled metrics)

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
        fit_state = self._track_callbacks(callback_state.fit_callbacks(self))
        if self._manager is None:
            checkpoint = tf.train.Checkpoint(
                model=self.model, optimizer=optimizer, loader=self._loader
            )
            self._manager = tf.train.CheckpointManager(
                checkpoint, self._directory, max_to_keep=self._max_to_keep
            )
        checkpoint = self._manager.checkpoint
        fit_state.restored, fit_state.stopped = None, False
        path = restore_lib.checked_path(self._manager, self._loader)
        # A checkpoint written without the fit state (by resumeloader 0.1, or by your
        # code) still restores: the fit state is tracked after it then.
        saved = set() if path is None else {n for n, _ in tf.train.list_variables(path)}
        if any(name.startswith(f"{_FIT_STATE}/") for name in saved):
            self._track_fit_state(checkpoint, fit_state)
        if path is not None:
            checkpoint.restore(path).assert_existing_objects_matched()
            fit_state.apply_callbacks()
        self._track_fit_state(checkpoint, fit_state)
        self._saved_position = self._loader.position
        self._since_save = 0
        if self._summaries is not None and self._writer is None:
            summaries = self._summaries
            self._writer = (
                summaries if isinstance(summaries, tf.summary.SummaryWriter)
                else tf.summary.create_file_writer(os.fspath(summaries))
            )
        self._resumed_mid_epoch = self._loader.position % self._loader.plan.records_per_epoch > 0
        self._data_spec = callback_state.fit_data_spec(self.model)
        self._check_fit_arguments()
        # Read by fit right after on_train_begin, as for BackupAndRestore (0 reads as
        # unset); cleared again in on_epoch_begin so that it cannot leak to later fits.
        # A fit a callback had stopped trains no more epochs.
        epochs = self.params.get("epochs") if fit_state.stopped else None
        self.model._initial_epoch = epochs or self._loader.epoch or None

    @staticmethod
    def _track_fit_state(checkpoint: Any, fit_state: callback_state.FitState) -> None:
        setattr(checkpoint, _FIT_STATE, fit_state)
        setattr(checkpoint, _BEST_WEIGHTS, fit_state.best_weights)

    def _track_callbacks(self, callbacks: list[Any]) -> callback_state.FitState:
        if self._fit_state is None:
            self._fit_state = callback_state.FitState(self.model, callbacks)
        elif [type(c) for c in callbacks] != [type(c) for c in self._fit_state.callbacks]:
            msg = (
                "Every fit of one ResumeCallback must have the same stateful callbacks, in "
                "the same order (their state shares one checkpoint). Received: "
                f"{[type(c).__name__ for c in callbacks]} after "
                f"{[type(c).__name__ for c in self._fit_state.callbacks]}."
            )
            raise ValueError(msg)
        self._fit_state.callbacks = callbacks
        return self._fit_state

    def _check_fit_arguments(self) -> None:
        steps = self.params.get("steps")
        per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
        if steps is None:
            return
        if not self._known:
            msg = (
                "This loader's epochs have as many batches as its data makes (packing, token "
                "budgets): pass `epoch_dataset(loader)` without `steps_per_epoch`. "
                f"Received: steps_per_epoch={steps}."
            )
            raise ValueError(msg)
        per_epoch = self._loader.batches_per_epoch
        if steps != per_epoch:
            msg = (
                "ResumeCallback keeps Keras epochs equal to loader epochs: `steps_per_epoch` "
                "must be the loader's batches per epoch or not given (fit also takes it from "
                "the dataset's cardinality: `loader.dataset()` of a finite loader holds every "
                "batch left, so pass `epoch_dataset(loader)` instead). Received: "
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
        assert self._fit_state is not None
        stop = self.model.stop_training
        # Stopped by another callback (not by the end of the loader): saved, so that a
        # resumed fit stops too, with the weights that callback left (best weights).
        stopped = bool(stop) and stop is not _BOUNDARY and not self._loader.exhausted
        if stopped:  # saved again: on_train_end of EarlyStopping may restore best weights
            self._fit_state.stopped = True
            self._save()
        elif self._loader.position != self._saved_position:
            self._save()

    # -- epochs ------------------------------------------------------------------------
    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.model._initial_epoch = None
        if epoch != self._loader.epoch:
            msg = (
                f"Keras epoch {epoch} does not match the loader's epoch {self._loader.epoch}: "
                "do not pass `initial_epoch` with ResumeCallback (it sets it from the loader) "
                f"and feed fit from this loader. Received: epoch={epoch}, "
                f"loader={self._loader!r}."
            )
            raise ValueError(msg)
        if self._resumed_mid_epoch:
            # Keras reset the metrics before this call: continue those of the
            # interrupted epoch, so its logs average all its batches.
            assert self._fit_state is not None
            self._fit_state.apply_metrics(self._data_spec)
            self._resumed_mid_epoch = False
        self._epoch = epoch
        self._left = self._loader.batches_left_in_epoch if self._known else 0
        self._counted = 0
        if self._loader.exhausted:  # nothing more to train on
            self.model.stop_training = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Keras passes the last step of the execution; an execution cut short by the
        # end of an epoch_dataset still reports its full length.
        if self._known:
            consumed = min(batch + 1, self._left)
            if consumed > self._counted:
                self._loader.advance(consumed - self._counted)
                self._since_save += consumed - self._counted
                self._counted = consumed
            ended = consumed >= self._left
        else:
            # Where the epoch ends is known once it is there: one batch at a time.
            while self._counted < batch + 1 and self._loader.epoch == self._epoch:
                self._loader.advance()
                self._since_save += 1
                self._counted += 1
            ended = self._loader.epoch != self._epoch or self._loader.exhausted
        if self._writer is not None:
            self._since_summary += 1
            if self._since_summary >= self._summaries_every:
                self._write_summaries()
        # The save due at an epoch's last batch waits for the epoch's end (validation and
        # the other callbacks' on_epoch_end): saved before them, a resumed fit would start
        # at the next epoch and they would never run for this one.
        if not ended and self._save_every is not None and self._since_save >= self._save_every:
            self._save()
        if ended and not self.model.stop_training:
            # Ends the epoch exactly at the loader's epoch boundary (before Keras runs out
            # of data: it would learn that epoch's length for the next ones).
            self.model.stop_training = _BOUNDARY

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        assert self._fit_state is not None
        stop = self.model.stop_training
        if stop is _BOUNDARY and not self._loader.exhausted:
            self.model.stop_training = False
        elif stop and stop is not _BOUNDARY and not self._loader.exhausted:
            # Stopped by a callback before this one (EarlyStopping): saved as stopped now,
            # so that a fit killed before on_train_end does not train another epoch.
            self._fit_state.stopped = True
        due = self._save_every is not None and self._since_save >= self._save_every
        if self._save_at_epoch_end or due:
            self._save()
        if self._writer is not None:
            self._write_summaries()

    def _write_summaries(self) -> None:
        assert self._writer is not None
        optimizer = self.model.optimizer
        step = int(optimizer.iterations.numpy()) if optimizer is not None else 0
        self._loader.write_summaries(step, self._writer)
        self._since_summary = 0

    def _save(self) -> None:
        assert self._manager is not None
        self._manager.save()
        self._saved_position = self._loader.position
        self._since_save = 0

