"""Keras 3 ``fit`` that resumes at the exact batch: `ResumeCallback` and `epoch_dataset`.

Keras' own `BackupAndRestore` restores only the epoch, so a restarted job re-runs
the interrupted epoch from its first batch. `ResumeCallback` checkpoints the model,
its optimizer and the loader together and advances the loader as Keras consumes
batches, so a restarted ``fit`` continues with the next unconsumed batch, in the
same Keras epoch, and ends with the weights of an uninterrupted run. It works the
same on the TensorFlow, JAX and PyTorch backends (`resumeloader.integrations.stores`
chooses the checkpoint format).

Keras epoch ``e`` is the loader's epoch ``e``. A fit resumed mid-epoch starts with
the rest of that epoch: the callback ends that short epoch itself, so that Keras
neither learns a short epoch length nor runs into the next loader epoch, and the
fit's callbacks see that epoch's batches numbered as in the uninterrupted run. The
state of the fit's stateful callbacks and its training metrics are checkpointed too
(`resumeloader.integrations.callback_state`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import keras
import tensorflow as tf

from resumeloader.core import validate
from resumeloader.integrations import callback_state, fit_context, stores
from resumeloader.tfdata import loader as loader_lib

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
    _quiet_keras_shuffle_warning()
    return loader.dataset(rest_of_epoch=True)


def _quiet_keras_shuffle_warning() -> None:
    """Silences Keras' "`shuffle=True` was passed, but will be ignored" for datasets.

    ``fit`` warns so for every ``tf.data.Dataset`` because ``shuffle=True`` is its
    default: nobody passed it, and a loader orders its batches itself (a seeded
    shuffle, or none). Installed by the processes that use this integration.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"`shuffle=True` was passed, but will be ignored since the data `x` was "
        r"provided as a tf\.data\.Dataset",
        category=UserWarning,
    )


class _EpochBoundary:
    """The `model.stop_training` value that ends a resumed short epoch: true, and told
    apart from a `True` another callback sets (e.g. `EarlyStopping`), which is kept."""

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "<stop at the loader's epoch boundary>"


_BOUNDARY = _EpochBoundary()


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
        checkpoint: a directory — on TensorFlow a ``tf.train.CheckpointManager`` of
            model, optimizer and loader is kept there, on JAX and PyTorch atomic
            ``ckpt-N`` directories of JSON and arrays
            (`resumeloader.integrations.checkpoint_files`) — or, on TensorFlow, your
            own ``tf.train.CheckpointManager`` whose checkpoint tracks the loader (the
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
        checkpoint: str | os.PathLike[str] | Any,
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
        _quiet_keras_shuffle_warning()
        self._loader = loader
        self._save_every = (
            None if save_every is None else validate.integer("save_every", save_every, low=1)
        )
        self._save_at_epoch_end = validate.boolean("save_at_epoch_end", save_at_epoch_end)
        max_to_keep = validate.integer("max_to_keep", max_to_keep, low=1)
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
        self._store = stores.open_store(loader, checkpoint, max_to_keep=max_to_keep)
        self._fit_state: callback_state.FitState | None = None
        self._observers: list[Any] = []
        # False for packing and token budgets: an epoch has as many batches as its data.
        self._known = loader.plan.layout.known_counts
        self._epoch = 0  # the Keras epoch running
        self._left = 0  # batches of the loader's epoch left when the Keras epoch began
        self._counted = 0  # batches of this Keras epoch the loader was advanced by
        self._since_save = 0
        self._offset = 0  # batches of the running Keras epoch run before it was resumed
        self._saved_position: int | None = None
        self._resumed_mid_epoch = False
        self._data_spec: Any = None  # of the data fit reads (to build compiled metrics)
        self._restored: str | None = None
        self._numbers: fit_context.BatchNumbers | None = None

    @property
    def loader(self) -> loader_lib.ResumableLoader:
        """The loader this callback advances."""
        return self._loader

    @property
    def directory(self) -> str:
        """The checkpoint directory."""
        return self._store.directory

    @property
    def manager(self) -> Any:
        """The ``tf.train.CheckpointManager`` on the TensorFlow backend (created at the
        first ``fit`` for a directory); None on the other backends."""
        return getattr(self._store, "manager", None)

    @property
    def restored(self) -> str | None:
        """The checkpoint the last ``fit`` started from, or None (a fresh start)."""
        return self._restored

    def observe(self, observer: Any) -> None:
        """Tells `observer` about every save: ``observer.written()`` once a checkpoint's
        files are written (before it becomes the newest), ``observer.saved()`` after;
        and ``observer.epoch_end()`` at each epoch's end, before its checkpoint.

        `resumeloader.testing.FitRecorder` uses it to mark the kill points of
        ``resumeloader verify``.
        """
        self._observers.append(observer)

    # -- fit begin / end ---------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        model = self.model  # on JAX: the training state written back into the variables
        optimizer = model.optimizer
        if optimizer is not None and not optimizer.built:
            # Built now, its slots are restored immediately instead of never.
            optimizer.build(model.trainable_variables)
        found = fit_context.callback_list(self)
        fit_state = self._track_callbacks(
            fit_context.fit_callbacks(self, found, callback_state.stateful)
        )
        fit_state.restored, fit_state.stopped = None, False
        stores.check_format(self._store)
        self._restored = self._store.restore(model, fit_state)
        self._numbers = fit_context.BatchNumbers(found)
        self._saved_position = self._loader.position
        self._since_save = 0
        if self._summaries is not None and self._writer is None:
            summaries = self._summaries
            self._writer = (
                summaries if isinstance(summaries, tf.summary.SummaryWriter)
                else tf.summary.create_file_writer(os.fspath(summaries))
            )
        self._resumed_mid_epoch = self._loader.position % self._loader.plan.records_per_epoch > 0
        self._data_spec = fit_context.fit_data_spec(model)
        self._check_fit_arguments()
        # Read by fit right after on_train_begin, as for BackupAndRestore (0 reads as
        # unset); cleared again in on_epoch_begin so that it cannot leak to later fits.
        # A fit a callback had stopped trains no more epochs.
        epochs = self.params.get("epochs") if fit_state.stopped else None
        model._initial_epoch = epochs or self._loader.epoch or None

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
        if self._numbers is not None:
            self._numbers.remove()
            self._numbers = None
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
        offset = 0
        if self._resumed_mid_epoch:
            # Keras reset the metrics before this call: continue those of the
            # interrupted epoch, so its logs average all its batches.
            assert self._fit_state is not None
            if self._fit_state.pending_metrics:
                fit_context.build_metrics(self.model, self._data_spec)
            self._fit_state.apply_metrics()
            self._resumed_mid_epoch = False
            saved = self._fit_state.epoch_batches
            # None: saved by resumeloader 0.3 or earlier.
            offset = saved if saved is not None else self._loader.step if self._known else 0
        if self._numbers is not None:
            self._numbers.offset = offset
        self._offset = offset
        self._epoch = epoch
        self._left = self._loader.batches_left_in_epoch if self._known else 0
        self._counted = 0
        if self._loader.exhausted:  # nothing more to train on
            self.model.stop_training = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Keras passes the last step of the execution; an execution cut short by the
        # end of an epoch_dataset still reports its full length. In a resumed epoch the
        # index is shifted by the batches run before the interruption (BatchNumbers).
        batch -= self._offset
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
        for observer in self._observers:
            observer.epoch_end()
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
        self.model  # noqa: B018 (on JAX: the training state written back into the variables)
        assert self._fit_state is not None
        self._fit_state.epoch_batches = self._offset + self._counted
        observers = list(self._observers)

        def written() -> None:
            for observer in observers:
                observer.written()

        self._store.save(written=written if observers else None)
        self._saved_position = self._loader.position
        self._since_save = 0
        for observer in observers:
            observer.saved()

