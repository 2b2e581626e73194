"""`FitRecorder`: a Keras ``fit`` with a `ResumeCallback` traced for ``resumeloader verify``.

A training script proves itself under the kill-and-restart harness by recording its
steps, commits and end in a trace (`resumeloader.tools.trace`). For a Keras ``fit``
that took a model subclass (to see each step's batch), record ids as a model input
and a checkpoint-manager subclass (to mark saves). The `ResumeCallback` already
knows all of it: which positions each step consumed and when a checkpoint is
written and committed. `FitRecorder` turns that into the trace, on any Keras
backend; outside the harness it does nothing.

What a step records: the ids of the records at the positions the step consumed
(`ResumableLoader.records_at`) and the digest of the batch the loader delivers there
(`ResumableLoader.batch_at`, rebuilt on its own: the same bytes as the batch
trained on, which Keras does not show a callback). The final weights digest then
proves what the model trained on.
"""

from __future__ import annotations

from typing import Any

import keras

from resumeloader.integrations import backend
from resumeloader.integrations import keras as keras_lib
from resumeloader.tools import trace as trace_lib

__all__ = ["FitRecorder"]


class FitRecorder(keras.callbacks.Callback):
    """Records a Keras ``fit`` for ``resumeloader verify``; put it last in ``callbacks``.

    Give it the fit's `ResumeCallback`; it records where each process starts, every
    training step (the record ids at the positions it consumed, the batch's digest),
    the kill points ``save:N`` (a checkpoint's files written, not yet the newest) and
    ``commit:N`` (after each save), ``mark:validation:N`` (during validation) and
    ``mark:epoch_end:N`` (an epoch's end, before its checkpoint), and at the end of
    ``fit`` the digest of the final weights and the last loss. Steps are numbered by
    the optimizer's ``iterations``.

    Outside the harness (``RESUMELOADER_TRACE`` unset) it does nothing, so the same
    script trains normally::

        resume = resumeloader.keras.ResumeCallback(loader, ckpt_dir, save_every=50)
        model.fit(epoch_dataset(loader), epochs=3,
                  callbacks=[early_stopping, resume, FitRecorder(resume)])

    Args:
        resume: the `ResumeCallback` of the fit.
        recorder: the `TraceRecorder` to write to (default: ``TraceRecorder.from_env()``).
    """

    def __init__(
        self, resume: keras_lib.ResumeCallback, *, recorder: trace_lib.TraceRecorder | None = None
    ) -> None:
        super().__init__()
        if not isinstance(resume, keras_lib.ResumeCallback):
            msg = f"`resume` must be the fit's ResumeCallback. Received: resume={resume!r}."
            raise TypeError(msg)
        self._resume = resume
        self._loader = resume.loader
        self._recorder = recorder if recorder is not None else trace_lib.TraceRecorder.from_env()
        self._position: int | None = None
        self._step = 0
        if self._recorder.enabled:
            resume.observe(self)

    @property
    def enabled(self) -> bool:
        """True when the harness asked for a trace."""
        return self._recorder.enabled

    def _record(self) -> None:
        """Records the steps the loader was advanced by since the last call."""
        if self._position is None:
            return
        while self._position < self._loader.position:
            [found] = self._loader.records_at(positions=[self._position])
            batch = self._loader.batch_at(position=found.start)
            ids = [record["index"] for record in found.records]
            self._recorder.step(self._step, batch, records=ids)
            self._step += 1
            self._position = found.stop

    # -- the fit ------------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self.enabled:
            return
        [iterations] = backend.values([self.model.optimizer.iterations])
        self._step = int(iterations)
        self._position = self._loader.position
        self._recorder.start(self._step)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._record()

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.enabled:
            self._recorder.mark("validation")

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if not self.enabled:
            return
        self._record()
        loss = (logs or {}).get("loss")
        self._recorder.finish(
            weights=backend.values(self.model.weights),
            loss=None if loss is None else float(loss),
        )

    # -- the ResumeCallback's saves (its observer) ----------------------------------------
    def epoch_end(self) -> None:
        """The epoch's end, before the ResumeCallback saves it."""
        self._record()
        self._recorder.mark("epoch_end")

    def written(self) -> None:
        """A checkpoint's files are written; it is not yet the newest."""
        self._record()
        self._recorder.save_point()

    def saved(self) -> None:
        """A checkpoint holding the steps recorded so far is the newest."""
        self._record()
        self._recorder.commit(self._step)
