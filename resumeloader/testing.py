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

Nothing here imports pytest, and TensorFlow only once `assert_resumes_identically`
runs; failures raise `ResumeMismatchError`, an `AssertionError`. The code lives in
`resumeloader.tools`.
"""

from resumeloader.tools.check import (
    ResumeMismatchError,
    ResumeReport,
    TraceRecorder,
    assert_resumes_identically,
    digest,
    kill_and_restart,
)

__all__ = [
    "ResumeMismatchError",
    "ResumeReport",
    "TraceRecorder",
    "assert_resumes_identically",
    "digest",
    "kill_and_restart",
]
