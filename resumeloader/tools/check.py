"""`assert_resumes_identically` and the public testing helpers (see `resumeloader.testing`).

* `assert_resumes_identically` — in-process: restores fresh loaders at several
  break points (through ``get_state``/``set_state`` with a JSON round trip and
  through ``tf.train.Checkpoint``) and compares the rest of the stream with an
  uninterrupted run, record ids and bytes.
* `kill_and_restart` — across processes: runs your training command, SIGKILLs it
  at chosen or random steps, restarts it until it finishes and compares the
  stitched run with an uninterrupted one (`ResumeReport`). Your script records its
  steps with a `TraceRecorder`; the contract is in docs/guides/proving-it.md and in
  `TraceRecorder`.

Nothing here imports pytest, and TensorFlow only once `assert_resumes_identically`
runs; failures raise `ResumeMismatchError`, an `AssertionError`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from resumeloader import errors
from resumeloader.tools import harness as harness_lib
from resumeloader.tools import report as report_lib
from resumeloader.tools import trace as trace_lib

if TYPE_CHECKING:
    from resumeloader.tfdata import loader as loader_lib

__all__ = [
    "ResumeMismatchError",
    "ResumeReport",
    "TraceRecorder",
    "assert_resumes_identically",
    "digest",
    "kill_and_restart",
]

ResumeMismatchError = errors.ResumeMismatchError
ResumeReport = report_lib.ResumeReport
TraceRecorder = trace_lib.TraceRecorder
digest = trace_lib.digest
kill_and_restart = harness_lib.kill_and_restart

# Batches consumed after a resume before the state is saved and resumed again.
_SECOND_BREAK = 2
_WAYS = {"iter": "`for batch in loader`", "dataset": "`loader.dataset()` + `advance()`"}
# One compared batch: (record ids, digest of the batch's bytes).
_Item = tuple[list[int], str]


def _stream(
    loader: loader_lib.ResumableLoader, limit: int, *, via: str = "iter"
) -> Iterator[_Item]:
    """Up to `limit` (record ids, digest) of the loader's batches from its position,
    consumed by ``for batch in loader`` (`via` "iter") or by iterating ``dataset()``
    and calling ``advance()`` after each batch (`via` "dataset")."""
    per_epoch = loader.plan.records_per_epoch
    iterator = iter(loader) if via == "iter" else iter(loader.dataset())
    for _ in range(limit):
        # Read before the batch is handed out (that advances the position).
        start = None if loader.with_metadata else loader.position
        batch = next(iterator, None)
        if batch is None:
            return
        if via == "dataset":
            loader.advance()
        if start is None:
            data, meta = batch
            ids = np.asarray(meta["index"]).tolist()
        else:
            data = batch
            epoch, offset = divmod(start, per_epoch)
            # The positions the batch counted, not the batch: a tf_map stage may reshape
            # it, a windowed stage groups other records than those at its positions.
            layout = loader.plan.layout
            stop = layout.batch_end(start) if layout.known_counts else loader.position
            ids = loader.plan.indices(epoch, offset, offset + stop - start).tolist()
        yield ids, trace_lib.digest(data)


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
    make_loader: Callable[[], loader_lib.ResumableLoader],
    *,
    num_steps: int,
    break_points: Sequence[int] | None = None,
) -> None:
    """Asserts that a loader restored at any break point continues the uninterrupted stream.

    An uninterrupted run of ``num_steps`` batches plus one more epoch is the
    reference. At each break point b, fresh loaders from `make_loader` are restored
    with the reference's state after b batches, once through
    ``set_state(json.loads(json.dumps(get_state())))`` and once through
    ``tf.train.Checkpoint(loader=...)`` write/read. Each must yield exactly the
    reference's batches b, b+1 (record ids and the bytes of every element); its
    state after them is then restored the same way into another fresh loader (a
    second consecutive resume), which must yield the rest of the reference and end
    where it ends. Of the two loaders of each path, one is consumed by ``for batch
    in loader`` and the other by iterating ``dataset()`` with ``advance()``.
    Record ids come from the batch metadata when the loader has
    ``with_metadata=True``, else from ``loader.plan`` and its position.

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

    Examples:
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
    per_epoch = _batches_per_epoch(make_loader)
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

        def by_state(state: str) -> loader_lib.ResumableLoader:
            loader = make_loader()
            loader.set_state(json.loads(state))
            return loader

        def by_checkpoint(state: str) -> loader_lib.ResumableLoader:
            # A checkpoint of `state`, read into another fresh loader.
            writer = make_loader()
            writer.set_state(state)
            path = tf.train.Checkpoint(loader=writer).write(f"{tmp}/ckpt")
            loader = make_loader()
            tf.train.Checkpoint(loader=loader).read(path).assert_consumed()
            return loader

        for point in points:
            at = min(point, len(reference))
            # Each restore path, each way of consuming: the first resume reads one way,
            # the second the other.
            for how, restore, ways in (
                ("set_state (JSON round trip)", by_state, ("iter", "dataset")),
                ("tf.train.Checkpoint", by_checkpoint, ("dataset", "iter")),
            ):
                # Resume, consume up to _SECOND_BREAK batches, save and resume again.
                first = restore(states[at])
                second_at = min(at + _SECOND_BREAK, len(reference))
                _compare(first, reference[:second_at], at, False, how, ways[0])
                second = restore(json.dumps(first.get_state()))
                _compare(second, reference, second_at, ended, f"{how}, resumed twice", ways[1])

def _batches_per_epoch(make_loader: Callable[[], loader_lib.ResumableLoader]) -> int:
    """The loader's batches per epoch, counted when the data decides them (packing)."""
    loader = make_loader()
    try:
        return loader.batches_per_epoch
    except TypeError:
        return sum(1 for _ in loader.dataset(rest_of_epoch=True))


def _compare(
    loader: loader_lib.ResumableLoader,
    reference: list[_Item],
    at: int,
    ended: bool,
    how: str,
    via: str,
) -> None:
    # One batch more than the reference holds, to catch a stream that does not end.
    wanted = len(reference) - at + (1 if ended else 0)
    resumed = list(_stream(loader, wanted, via=via))
    for offset in range(max(len(resumed), len(reference) - at)):
        step = at + offset
        expected = reference[step] if step < len(reference) else None
        received = resumed[offset] if offset < len(resumed) else None
        if expected != received:
            msg = (
                f"The stream restored at break point {at} (via {how}) and read by "
                f"{_WAYS[via]} differs from the uninterrupted run at step {step}. "
                f"Expected: {_describe(expected)}. Received: {_describe(received)}."
            )
            raise errors.ResumeMismatchError(msg)
