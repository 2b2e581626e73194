"""`read_rows`: what a loader's order will read over a range of steps, without reading it.

For each shard and each group of steps, `read_rows` walks the plan's batch tasks (the
records of each batch, from `resumeloader.stages.plan.Plan`, O(batch) per step) and asks
the source what reading them sends (`Source.dry_read` into a
`resumeloader.sources.storage.fetch.DryRun`): the GETs after the storage layer's own merging
and span cache, and the local preads. It adds them up per `Row`, with the objects or
files touched, the read-ahead one step starts, and what the cache must hold
(`resumeloader.tools.cache_need`). Rows stream out as they are done; memory does not
grow with the number of steps.

The reads are those of one process per shard reading its tasks in order (the calling
thread or worker threads) with its read-ahead: the tasks pass through the same
`resumeloader.workers.readahead.hinted` as in a run, their prefetches recorded by the
source (`Source.dry_prefetch`), so the GETs read-ahead starts, and what its spans
make the cache drop, are counted in the step that starts them (also past the last
step planned, as in a run). Worker processes each keep their own cache and read no
further ahead than their tasks (``read_ahead=False``); a span that two of them need is
read by each: more GETs than planned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any, cast

from resumeloader.core import shard as shard_lib
from resumeloader.sources import base as sources_base
from resumeloader.sources.storage import fetch, objects
from resumeloader.stages import plan as plan_lib
from resumeloader.tools import cache_need
from resumeloader.workers import readahead

__all__ = ["NEED_BYTES", "Row", "read_rows", "shard_plan", "step_positions"]

#: The fewest bytes of spans the cache need is looked for in (with at least 4x the
#: source's ``cache_bytes``): a larger need is noticed (`Row.cache_beyond`), not measured.
NEED_BYTES = 1 << 30


@dataclasses.dataclass
class Row:
    """What one shard reads over steps ``[first_step, stop_step)`` (see the module docstring).

    Attributes:
        shard: the shard's index.
        first_step, stop_step: the steps (batches from position 0), stop excluded.
        first_epoch, last_epoch: the epochs they lie in.
        records: records read.
        files: the objects or files touched (URL or path), in the order first touched.
        gets, get_bytes: ranged GETs of objects and their bytes.
        preads, pread_bytes: reads of local files and their bytes.
        record_bytes: the bytes of the records themselves.
        readahead_bytes: the most bytes of GETs one step's records need, started by
            read-ahead or by the step's own read (what ``ObjectReads.readahead_bytes``
            must hold to start a whole step ahead).
        cache_bytes: an ``ObjectReads.cache_bytes`` with which these steps read
            again no span that an earlier step of the epoch read (the largest reuse
            distance within an epoch, of the reads with a cache that drops nothing).
        reread_bytes: bytes that GETs read again in an epoch because the cache had
            dropped them.
        cache_followed: the largest cache the need is looked for in (bytes): a larger
            need is only noticed (`cache_beyond`).
        cache_beyond: whether an epoch reuses a span farther than `cache_followed`:
            the need is then larger than that, and `cache_bytes` only what was seen.
        predicted: False when the source cannot tell its reads (then only `records`).
        cache_limit, readahead_limit: the source's ``ObjectReads.cache_bytes`` and
            ``readahead_bytes`` (None for a source that reads no object).
    """

    shard: int
    first_step: int
    stop_step: int = 0
    first_epoch: int = 0
    last_epoch: int = 0
    records: int = 0
    files: list[str] = dataclasses.field(default_factory=list)
    gets: int = 0
    get_bytes: int = 0
    preads: int = 0
    pread_bytes: int = 0
    record_bytes: int = 0
    readahead_bytes: int = 0
    cache_bytes: int = 0
    reread_bytes: int = 0
    cache_followed: int = 0
    cache_beyond: bool = False
    predicted: bool = True
    cache_limit: int | None = None
    readahead_limit: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as a JSON-serialisable dict (`files` by full name)."""
        return dataclasses.asdict(self)

    def add(self, other: Row) -> None:
        """Adds `other` (a later row) to this one (the largest needs kept)."""
        self.stop_step = max(self.stop_step, other.stop_step)
        self.last_epoch = max(self.last_epoch, other.last_epoch)
        seen = set(self.files)
        self.files += [f for f in other.files if f not in seen]
        for name in ("records", "gets", "get_bytes", "preads", "pread_bytes", "record_bytes",
                     "reread_bytes"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for name in ("readahead_bytes", "cache_bytes", "cache_followed"):
            setattr(self, name, max(getattr(self, name), getattr(other, name)))
        self.cache_beyond = self.cache_beyond or other.cache_beyond
        self.predicted = self.predicted and other.predicted
        self.cache_limit = self.cache_limit or other.cache_limit
        self.readahead_limit = self.readahead_limit or other.readahead_limit


def step_positions(plan: plan_lib.Plan, first: int, stop: int) -> tuple[int, int]:
    """The positions where steps `first` and `stop` start (batches from position 0).

    Raises:
        ValueError: the batches count the records they hold (packing, token budgets):
            a step's position depends on the data; or `first` lies past the end.
    """
    layout = plan.layout
    if not layout.known_counts:
        stage = plan.pipeline.batch_stage
        msg = (
            "Steps cannot be planned for this loader without reading its data: its batches "
            "hold as many records as the data lets them (packing, token budgets), so where "
            f"step k starts depends on every window before it. Received: batch stage "
            f"{stage.describe() if stage else None}."
        )
        raise ValueError(msg)
    start, end = layout.advance(0, first), layout.end
    if end is not None and start >= end:
        msg = (
            f"--steps starts past the end of this finite loader ({layout.batches_to_end(0)} "
            f"steps). Received: first step {first}."
        )
        raise ValueError(msg)
    return start, layout.advance(0, stop)


def shard_plan(plan: plan_lib.Plan, index: int, count: int) -> plan_lib.Plan:
    """`plan` for shard `index` of `count` (itself when it is that shard)."""
    if (plan.shard.index, plan.shard.count) == (index, count):
        return plan
    shard = shard_lib.Shard(index, count)
    return plan.sharded(shard, batch_size=plan.batch_size)


def _one_call(plan: plan_lib.Plan) -> bool:
    """Whether the producer reads a task's records with one call (else one per record)."""
    source, pipeline = plan.pipeline.source, plan.pipeline
    batched = sources_base.optional(source, "read_batch") is not None
    return bool((batched and not pipeline.record_stages)
                or sources_base.optional(source, "read_many") is not None)


class _DryAhead:
    """What `readahead.hinted` asks of a source, recorded in a `fetch.DryRun`, with the
    bytes of the GETs started for each task (by its records' array)."""

    def __init__(self, source: sources_base.Source, dry: fetch.DryRun) -> None:
        self._source, self._dry = source, dry
        self._started: dict[int, tuple[Any, int]] = {}  # id(indices) -> (indices, bytes)

    def prefetch(self, indices: Any) -> bool:
        before = self._dry.get_bytes
        done = self._source.dry_prefetch(indices, self._dry)
        held = self._started.get(id(indices), (indices, 0))
        self._started[id(indices)] = (indices, held[1] + self._dry.get_bytes - before)
        return done

    def started(self, task: plan_lib.Task) -> int:
        """The bytes of the GETs read-ahead started for `task` (forgotten after)."""
        return self._started.pop(id(task.indices), (None, 0))[1]


def _steps(
    plan: plan_lib.Plan, first: int, stop: int, ahead: _DryAhead | None = None
) -> Iterator[tuple[int, plan_lib.Task]]:
    """(the first step it serves, task) of the tasks serving steps [first, stop); with
    `ahead`, read ahead of as in a run."""
    start, end = step_positions(plan, first, stop)
    layout, step = plan.layout, first
    tasks: Iterator[plan_lib.Task] = plan.tasks(start)
    if ahead is not None and sources_base.optional(plan.pipeline.source, "prefetch") is not None:
        tasks = readahead.hinted(tasks, cast(sources_base.Source, ahead))
    for task in tasks:
        if task.position >= end:
            return
        yield step, task
        at, task_end = max(task.position, start), task.position + len(task.indices)
        while at < min(task_end, end):  # the batches of a window (one, unless windowed)
            at, step = layout.normalise(layout.batch_end(at)), step + 1


def read_rows(
    plan: plan_lib.Plan, *, steps: tuple[int, int], every: int, shards: list[int],
    shard_count: int, read_ahead: bool = True,
) -> Iterator[Row]:
    """One `Row` per shard and `every` steps of `steps` ``(first, stop)``, in order;
    `read_ahead`: whether the tasks are read ahead of (by the calling thread or worker
    threads, not by worker processes).

    Raises:
        ValueError: the steps cannot be planned (see `step_positions`).
    """
    for index in shards:
        shard_plan_ = shard_plan(plan, index, shard_count)
        step_positions(shard_plan_, *steps)  # refuses before any row
        yield from _shard_rows(shard_plan_, index, steps, every, read_ahead)


def _shard_rows(
    plan: plan_lib.Plan, index: int, steps: tuple[int, int], every: int, read_ahead: bool
) -> Iterator[Row]:
    # The cache need: the reuse distances of the same reads with a cache that drops no
    # span within `need.limit` bytes (`shadow`): with a cache of that need, a run reads as
    # it does (the GETs depend on what the cache holds). The re-reads: of `dry`'s own.
    # One dry read of the source records its reads in both caches (`DryRun.shadow`).
    need = cache_need.CacheNeed(NEED_BYTES)
    shadow = fetch.DryRun(cache_bytes=NEED_BYTES)
    dry = fetch.DryRun(shadow=shadow)
    reuse = cache_need.CacheNeed(NEED_BYTES)
    source, one_call = plan.pipeline.source, _one_call(plan)
    row: Row | None = None
    seen: set[str] = set()
    ahead = _DryAhead(source, dry) if read_ahead else None
    for step, task in _steps(plan, *steps, ahead=ahead):
        if row is not None and step >= row.first_step + every:
            yield row
            row = None
        if row is None:
            row, seen = Row(index, step, first_epoch=task.epoch), set()
        calls = [task.indices] if one_call else [task.indices[k : k + 1]
                                                 for k in range(len(task.indices))]
        before = dry.get_bytes
        predicted = all([source.dry_read(indices, dry) for indices in calls])
        taken, shadowed = dry.take(), shadow.take()
        if dry.reads is not None:  # the source's settings, known after its first read
            need.limit = reuse.limit = max(NEED_BYTES, 4 * dry.reads.cache_bytes)
            shadow.cache_bytes = need.limit
            row.cache_limit = dry.reads.cache_bytes
            row.readahead_limit = fetch.budget_of(dry.reads)  # "auto": its first budget
            row.cache_followed = need.limit
        # the GETs the step's records need: those read-ahead started, then its own
        started = dry.get_bytes - before + (ahead.started(task) if ahead is not None else 0)
        row.readahead_bytes = max(row.readahead_bytes, started)
        _count(row, seen, taken, task, predicted)
        gets = [(o, a, b) for o, a, b in taken.sent if isinstance(o, objects.Object)]
        _, reread = reuse.step(step, task.epoch, taken.cached, gets, dry.holds)
        gets = [(o, a, b) for o, a, b in shadowed.sent if isinstance(o, objects.Object)]
        beyond = need.beyond
        distance, _ = need.step(step, task.epoch, shadowed.cached, gets, shadow.holds)
        row.cache_bytes = max(row.cache_bytes, distance)
        row.cache_beyond = row.cache_beyond or need.beyond > beyond
        row.reread_bytes += reread
        row.stop_step = max(row.stop_step, step + 1)
    if row is not None:
        yield row


def _count(
    row: Row, seen: set[str], taken: fetch.DryReads, task: plan_lib.Task, predicted: bool
) -> None:
    row.last_epoch = task.epoch
    row.records += len(task.indices)
    row.predicted = row.predicted and predicted
    row.record_bytes += taken.wanted_bytes
    for where, start, stop in taken.sent:
        name = where.url if isinstance(where, objects.Object) else str(where)
        if name not in seen:
            seen.add(name)
            row.files.append(name)
        if isinstance(where, objects.Object):
            row.gets += 1
            row.get_bytes += stop - start
        else:
            row.preads += 1
            row.pread_bytes += stop - start
