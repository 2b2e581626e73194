"""Helpers that prove, in your own tests, that your pipeline resumes exactly.

* `assert_resumes_identically` — in-process: restores fresh loaders at several
  break points (through ``get_state``/``set_state`` with a JSON round trip and
  through ``tf.train.Checkpoint``), resumes twice in a row, and compares the rest
  of the stream with an uninterrupted run, record ids and bytes.
* `kill_and_restart` — across processes: runs your training command, SIGKILLs it
  at chosen or random steps, restarts it until it finishes and compares the
  stitched run with an uninterrupted one (`ResumeReport`). Your script records its
  steps with a `TraceRecorder`; the contract is in docs/guides/proving-it.md and in
  `TraceRecorder`.

* `FitRecorder` — the same for a Keras ``fit`` with a `ResumeCallback`, on any
  Keras backend: one callback instead of the recorder calls.

Nothing here imports pytest, and TensorFlow only once `assert_resumes_identically`
runs (Keras once `FitRecorder` is used); failures raise `ResumeMismatchError`, an
`AssertionError`. The code lives in `resumeloader.tools`.
"""

from typing import TYPE_CHECKING, Any

from resumeloader.tools.check import (
    ResumeMismatchError,
    ResumeReport,
    TraceRecorder,
    assert_resumes_identically,
    digest,
    kill_and_restart,
)

if TYPE_CHECKING:
    from resumeloader.tools.fit_recorder import FitRecorder

__all__ = [
    "FitRecorder",
    "ResumeMismatchError",
    "ResumeReport",
    "TraceRecorder",
    "assert_resumes_identically",
    "digest",
    "kill_and_restart",
]


def __getattr__(name: str) -> Any:
    if name == "FitRecorder":  # imports Keras (and the loader: TensorFlow)
        from resumeloader.tools.fit_recorder import FitRecorder

        return FitRecorder
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
