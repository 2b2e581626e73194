"""Helpers that prove, in your own tests, that your pipeline resumes exactly.

* `assert_resumes_identically` — in-process: restores fresh loaders at several
  break points (through ``get_state``/``set_state`` with a JSON round trip and
  through ``tf.train.Checkpoint``) and compares the rest of the stream with an
  uninterrupted run, record ids and bytes.
* `kill_and_restart` — across processes: runs your training command, SIGKILLs it
  at chosen or random steps, restarts it until it finishes and compares the
  stitched run with an uninterrupted one (`ResumeReport`). Your script records its
  steps with a `TraceRecorder`; the contract is in the README section "Proving it
  on your own job" and in `TraceRecorder`.

Nothing here imports pytest, and TensorFlow only once `assert_resumes_identically`
runs; failures raise `ResumeMismatchError`, an `AssertionError`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import optree

from resumeloader import _harness, _report, _trace, errors

if TYPE_CHECKING:
    from resumeloader import _loader

__all__ = [
    "ResumeMismatchError",
    "ResumeReport",
    "TraceRecorder",
    "assert_resumes_identically",
    "digest",
    "kill_and_restart",
]

ResumeMismatchError = errors.ResumeMismatchError
ResumeReport = _report.ResumeReport
TraceRecorder = _trace.TraceRecorder
digest = _trace.digest
kill_and_restart = _harness.kill_and_restart

# One compared batch: (record ids, digest of the batch's bytes).
_Item = tuple[list[int], str]


def _stream(loader: _loader.ResumableLoader, limit: int) -> Iterator[_Item]:
    """Up to `limit` (record ids, digest) of the loader's batches from its position."""
    per_epoch = loader.sampler.records_per_epoch
    iterator = iter(loader)
    for _ in range(limit):
        # Read before the batch is handed out (that advances the position).
        start = None if loader.with_metadata else loader.position
        batch = next(iterator, None)
        if batch is None:
            return
        if start is None:
            data, meta = batch
            ids = np.asarray(meta["index"]).tolist()
        else:
            data = batch
            epoch, offset = divmod(start, per_epoch)
            size = len(optree.tree_leaves(data, none_is_leaf=True)[0])
            ids = loader.sampler.epoch_indices(epoch, offset, offset + size).tolist()
        yield ids, _trace.digest(data)


def _describe(item: _Item | None) -> str:
    if item is None:
        return "the end of the stream"
    ids, bytes_digest = item
    shown = ids if len(ids) <= 8 else [*ids[:8], "..."]
    return f"records {shown} (bytes {bytes_digest})"


def _default_break_points(num_steps: int, per_epoch: int, length: int, ended: bool) -> list[int]:
    points = {0, per_epoch // 2, per_epoch, num_steps - 1, num_steps}
    if ended:  # the last batch and the point after exhaustion
        points |= {length - 1, length}
    return sorted(p for p in points if 0 <= p <= length)


def assert_resumes_identically(
    make_loader: Callable[[], _loader.ResumableLoader],
    *,
    num_steps: int,
    break_points: Sequence[int] | None = None,
) -> None:
    """Asserts that a loader restored at any break point continues the uninterrupted stream.

    An uninterrupted run of ``num_steps`` batches plus one more epoch is the
    reference. At each break point b, two fresh loaders from `make_loader` are
    restored with the reference's state after b batches: one through
    ``set_state(json.loads(json.dumps(get_state())))``, one through
    ``tf.train.Checkpoint(loader=...)`` write/read. Each must yield exactly the
    reference's batches b, b+1, ... (record ids and the bytes of every element) and
    end where the reference ends. Record ids come from the batch metadata when the
    loader has ``with_metadata=True``, else from ``loader.sampler`` and its position.

    Args:
        make_loader: builds a fresh, identically configured loader at position 0.
        num_steps: batches over which break points lie (>= 1).
        break_points: batch counts to break at, each in [0, num_steps + one epoch];
            by default 0, mid-epoch, the epoch boundary, ``num_steps - 1``,
            ``num_steps`` and, for a finite loader that ends within the reference,
            its last batch and the point after exhaustion.

    Raises:
        ResumeMismatchError: a resumed stream differs; the message names the break
            point, the restore path, the first differing step, what was expected and
            what came.

    Example:
        >>> import numpy as np
        >>> from resumeloader import ResumableLoader
        >>> assert_resumes_identically(
        ...     lambda: ResumableLoader(np.arange(10), batch_size=3, seed=0, num_epochs=2),
        ...     num_steps=4,
        ... )
    """
    import tensorflow as tf

    if not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1:
        msg = f"`num_steps` must be an integer >= 1. Received: num_steps={num_steps!r}."
        raise ValueError(msg)
    reference_loader = make_loader()
    per_epoch = reference_loader.batches_per_epoch
    limit = num_steps + per_epoch
    for point in break_points or ():
        if not 0 <= point <= limit:
            msg = (
                f"Break points must lie in [0, num_steps + batches per epoch] = [0, {limit}]. "
                f"Received: {point}."
            )
            raise ValueError(msg)
    states = [json.dumps(reference_loader.get_state())]
    reference: list[_Item] = []
    for item in _stream(reference_loader, limit):
        reference.append(item)
        states.append(json.dumps(reference_loader.get_state()))
    ended = len(reference) < limit
    points = (
        _default_break_points(num_steps, per_epoch, len(reference), ended)
        if break_points is None
        else sorted(set(break_points))
    )
    with tempfile.TemporaryDirectory(prefix="resumeloader-") as tmp:
        for point in points:
            at = min(point, len(reference))
            by_state = make_loader()
            by_state.set_state(json.loads(states[at]))
            _compare(by_state, reference, at, ended, "set_state (JSON round trip)")
            # A checkpoint of the state after `at` batches, read into another fresh loader.
            writer = make_loader()
            writer.set_state(states[at])
            path = tf.train.Checkpoint(loader=writer).write(f"{tmp}/step-{at}")
            by_checkpoint = make_loader()
            tf.train.Checkpoint(loader=by_checkpoint).read(path).assert_consumed()
            _compare(by_checkpoint, reference, at, ended, "tf.train.Checkpoint")


def _compare(
    loader: _loader.ResumableLoader,
    reference: list[_Item],
    at: int,
    ended: bool,
    how: str,
) -> None:
    # One batch more than the reference holds, to catch a stream that does not end.
    wanted = len(reference) - at + (1 if ended else 0)
    resumed = list(_stream(loader, wanted))
    for offset in range(max(len(resumed), len(reference) - at)):
        step = at + offset
        expected = reference[step] if step < len(reference) else None
        received = resumed[offset] if offset < len(resumed) else None
        if expected != received:
            msg = (
                f"The stream restored at break point {at} (via {how}) differs from the "
                f"uninterrupted run at step {step}. Expected: {_describe(expected)}. "
                f"Received: {_describe(received)}."
            )
            raise errors.ResumeMismatchError(msg)
