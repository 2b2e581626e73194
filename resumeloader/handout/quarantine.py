"""`Quarantine`: the bad-record policy's log and error budget, kept where batches are handed out.

A producer that replaces a failing record (`resumeloader.stages.on_error`) leaves the
batch's *skips* in its `resumeloader.workers.skips.SkipLedger` (a worker sends them
back with the batch). The process that hands batches out takes them with the batch
and gives them to its `Quarantine`, which appends each to the JSON-lines log once and
keeps the error budget (`handed_out` does both for a stream of produced tasks). No
TensorFlow.

The log has one JSON object per line: ``epoch``, ``position`` (as the loader counts:
this shard's records across epochs), ``record_index``, ``replacement`` (the record
index that replaced it; null for a callable policy), ``policy``, ``error`` and
``message`` (the exception's type and text), ``rejected`` (candidates that failed
too, if any), ``shard_index``, ``shard_count`` and ``fingerprint`` (of the loader's
order fields, as in its state). Its content is a function of the stream alone: a
resumed run appends only the lines an uninterrupted run would have written.

The budget of an epoch allows ``floor(max_fraction * records per epoch)``
replacements (this shard's records). A replacement at position ``p`` exceeds it when
more replacements than that lie at positions up to ``p`` of the epoch, counting the
log's lines of the same fingerprint and shard layout: so a restored run raises where
an uninterrupted one would, as long as the log is kept (after a change of shard
count the count starts anew).
"""

from __future__ import annotations

import bisect
import dataclasses
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

from resumeloader import errors
from resumeloader.core import state
from resumeloader.stages import on_error
from resumeloader.stages import plan as plan_lib
from resumeloader.workers import produce
from resumeloader.workers import skips as skips_lib

__all__ = ["Quarantine", "handed_out"]

Skips = skips_lib.Skips


class Quarantine:
    """The quarantine log and error budget of a loader's bad-record policy.

    Args:
        policy: a policy that replaces (``"skip"`` or a callable).
        order: the loader's order fields (their fingerprint marks its lines).
    """

    def __init__(self, policy: on_error.ErrorPolicy, order: dict[str, Any]) -> None:
        assert policy.quarantine is not None
        self.path = policy.quarantine
        self.max_fraction = policy.max_fraction
        self._allowed = policy.allowed
        self._fingerprint = state.fingerprint(order)
        self._lock = threading.Lock()
        # (shard_index, shard_count, epoch) -> sorted positions of its replacements.
        self._seen: dict[tuple[int, int, int], list[int]] = {}
        self._read = 0  # bytes of the log read so far
        self._lines_read = 0  # and the lines they hold
        self._unsynced = False  # lines appended since the last fsync
        self._created = False  # the log was created by an append since the last fsync

    def hand_out(self, plan: plan_lib.Plan, task: plan_lib.Task, skips: Skips) -> plan_lib.Task:
        """Logs `skips` of `task`'s batch of `plan` and checks the budget; returns the task
        with each replaced record's index changed to its replacement's (for metadata).

        Raises:
            ErrorBudgetError: a replacement exceeds its epoch's budget (logged first).
        """
        if not skips:
            return task
        layout = (plan.shard.index, plan.shard.count)
        with self._lock:
            self._catch_up()
            lines = []
            for skip in skips:
                if self._note((*layout, skip["epoch"]), skip["position"]):
                    line = {**skip, "shard_index": layout[0], "shard_count": layout[1]}
                    lines.append(json.dumps({**line, "fingerprint": self._fingerprint}))
            self._append(lines)
            for skip in skips:
                self._check_budget(plan, skip)
        indices = task.indices.copy()
        for skip in skips:
            if skip["replacement"] is not None:
                indices[skip["position"] - task.position] = skip["replacement"]
        return dataclasses.replace(task, indices=indices)

    def _note(self, key: tuple[int, int, int], position: int) -> bool:
        """Adds a replacement at `position` of `key`; False if it was known."""
        positions = self._seen.setdefault(key, [])
        at = bisect.bisect_left(positions, position)
        if at < len(positions) and positions[at] == position:
            return False
        positions.insert(at, position)
        return True

    def _check_budget(self, plan: plan_lib.Plan, skip: dict[str, Any]) -> None:
        per_epoch = plan.records_per_epoch
        allowed = self._allowed(per_epoch)
        positions = self._seen[(plan.shard.index, plan.shard.count, skip["epoch"])]
        count = bisect.bisect_right(positions, skip["position"])
        if count <= allowed:
            return
        shard = f" of shard {plan.shard.index}/{plan.shard.count}" if plan.shard.count > 1 else ""
        msg = (
            f"The bad-record policy's error budget is exceeded: {count} records of epoch "
            f"{skip['epoch']}{shard} up to position {skip['position']} were replaced; "
            f"max_fraction={self.max_fraction} of its {per_epoch} records allows "
            f"{allowed}. The last: record index {skip['record_index']} failed with "
            f"{skip['error']}: {skip['message']}. Every replacement is in the quarantine "
            f"log {self.path}. Fix or remove the failing records, or raise `max_fraction`."
        )
        raise errors.ErrorBudgetError(
            msg, record_index=skip["record_index"], epoch=skip["epoch"], position=skip["position"]
        )

    def _catch_up(self) -> None:
        """Reads the lines appended to the log since the last look (by any process)."""
        try:
            with open(self.path, "rb") as log:
                if os.fstat(log.fileno()).st_size < self._read:
                    self._read = self._lines_read = 0  # truncated or replaced: read it again
                log.seek(self._read)
                data = log.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        self._read += end
        for raw in data[:end].split(b"\n")[:-1]:
            self._lines_read += 1
            try:
                line = json.loads(raw)
                fields = ("shard_index", "shard_count", "epoch", "position")
                values = [line[name] for name in fields]
                ours = line["fingerprint"] == self._fingerprint
            except (ValueError, TypeError, KeyError):
                continue  # not a line of ours (a hand-written note, a torn write)
            except RecursionError as err:
                msg = (
                    f"The quarantine log {self.path!r}, line {self._lines_read}, holds JSON "
                    f"nested too deeply to read ({len(raw)} bytes starting {raw[:20]!r}): "
                    "a line of this log is one flat JSON object. Remove or fix that line."
                )
                raise ValueError(msg) from err
            if ours and all(type(value) is int for value in values):
                self._note((values[0], values[1], values[2]), values[3])

    def sync(self) -> None:
        """Makes the lines appended so far durable (fsync; the folder's too if the log
        was created), when there are any.

        Called when the loader's state is taken for a checkpoint: a checkpoint at
        position p must not outlive the lines of the replacements before p (a
        restored run does not write them again, so the budget would count fewer).
        Appends are not synced one by one: an fsync costs 3-4 ms on an ext4 disk,
        against 30 us for the write, and a batch with a replaced record in it is
        common under a budget of 1%.
        """
        with self._lock:
            if not self._unsynced:
                return
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if self._created:
                folder = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
            self._unsynced = self._created = False

    def _append(self, lines: list[str]) -> None:
        if not lines:
            return
        data = ("\n".join(lines) + "\n").encode()
        self._created |= not os.path.exists(self.path)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size > self._read:  # a torn last line: start a new one
                with open(self.path, "rb") as log:
                    log.seek(-1, os.SEEK_END)
                    if log.read(1) != b"\n":
                        data = b"\n" + data
            # One write: appends of other processes do not land inside these lines.
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, data[written:])
        finally:
            os.close(fd)
            self._unsynced = True


def handed_out(
    quarantine: Quarantine,
    plan: plan_lib.Plan,
    producer: produce.BatchProducer,
    produced: Iterator[tuple[plan_lib.Task, produce.Produced]],
) -> Iterator[tuple[plan_lib.Task, produce.Produced]]:
    """`produced`, each task's replaced records logged to `quarantine` (its budget
    checked) as it is handed out, the task's indices naming the replacements."""
    for task, out in produced:
        yield quarantine.hand_out(plan, task, producer.skips.take(task)), out
