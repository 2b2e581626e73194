"""`Place`, `Lap`: what one place counts of a loader's stages — per batch, never per record.

Each place where stages run — the thread handing batches out, each worker thread, a
worker process, a Dask worker — counts into its own `Place`, so no two threads write
the same counter and no lock is taken on the hot path. A batch's run through a chain
of stages at a place is a *lap* of some kind (the producer's, the sampler's, the
hand-off's): every lap is counted (laps and records, exactly), and one lap in
`every` of each kind (from the second on: `timed_lap`) is *timed*: at each stage
boundary `Lap.lap` reads ``time.perf_counter_ns`` once and adds to that stage's
`Meter`. On one timed lap in `CPU_EVERY` the thread's CPU time
(``time.thread_time_ns``) is read at the same boundaries: a real system call (Linux
has no vDSO path for a thread's CPU clock), ~1 us each with what it costs the code
after it, against ~0.1 us for the wall clock (every lap timed, a per-record ``map_fn``
loop: the reads on one timed lap in 4 were about half of what the timing cost). A stage's
figures are the timed laps' scaled by laps / timed laps
(`resumeloader.core.stats.Stats`): its time is an estimate from one batch in `every`,
its batches and records are exact. Timing every batch would cost more than the
cheapest pipelines spend per batch; the environment variable
``RESUMELOADER_STATS=all`` times every batch (`every` 1, for profiling),
``RESUMELOADER_STATS=0`` counts nothing.

A place in another process sends what it counted since its last reply (`Place.take`)
with the batch it made; the loader's `resumeloader.core.board.Board` merges it.
A place that makes a *chunk* of batches at once (the eager loop over arrays) times
one chunk in `every` (from the second on, `Place.chunk`) and counts the chunk's
batches as that many laps with one call (`Place.laps`), timed laps if it was timed:
nothing is counted or timed per batch there, and a stage's time is scaled in batches.
The loops that run once per batch in the thread that hands batches out (the sampler's
in `Plan.tasks`, the producer's `BatchProducer.run` without workers, the eager
prefetch's hand-off) count each lap on their `Kind` themselves (`Place.kind`: three
integers added, no call) and call only on a timed lap (`Place.timing`, `Place.timed`):
a call per batch there cost more than the counting (~1% of a 300 us batch each, cache
misses on a thread that hands the GIL back and forth), the counts stay exact at any time.

Counting never changes a batch. Pure Python: no NumPy, no TensorFlow.
"""

from __future__ import annotations

import os
import time
from typing import Any

__all__ = [
    "CPU_EVERY", "ENV", "EVERY", "FIELDS", "HAND_OUT", "KIND_FIELDS", "SPLIT_EVERY", "STEP_FACTOR",
    "WORKER_THREADS", "Kind", "Lap", "Meter", "Place", "enabled", "every", "now",
    "timed_lap",
]

#: The environment variable: ``0`` (or ``off``) counts nothing, ``all`` times every
#: batch, anything else (or unset) one batch in `EVERY`.
ENV = "RESUMELOADER_STATS"
#: By default a place times one lap in this many of each kind (`timed_lap`).
EVERY = 8
#: An eager loop times one consumer step in this many times `every` (its first two
#: steps too, and every step with `every` 1; `resumeloader.core.board.Consumer`): its
#: cheapest steps cost less than a clock read with its cache misses.
STEP_FACTOR = 16
#: A timed lap reads the thread's CPU time on one in this many timed laps (with `EVERY`
#: one lap in 256 of each kind): each read is a system call at each stage boundary.
CPU_EVERY = 32
#: A timed lap times a record loop's parts on one in this many timed laps (the first
#: included; with `EVERY` one batch in 2,048): the twin that does costs up to half a
#: batch more for a cheap ``map_fn``, and at one in 64 it cost ~0.5% of such a loop.
SPLIT_EVERY = 256
#: The place every thread that is not a worker thread counts in.
HAND_OUT = "hand-out"
#: The name prefix of worker threads (each counts in a place of its own).
WORKER_THREADS = "resumeloader-worker-"
#: What a `Meter` counts, in the order `Meter.values` gives them.
FIELDS = ("batches", "records_in", "records_out", "bytes_out", "wall_ns", "cpu_ns", "cpu_wall_ns")
#: What a `Kind` counts, in the order `Kind.values` gives them.
KIND_FIELDS = ("laps", "timed", "records", "timed_records", "batches", "timed_batches")

_now = time.perf_counter_ns
#: The clock of the timed laps (``time.perf_counter_ns``).
now = _now
_cpu = time.thread_time_ns
_OFF = ("0", "off", "false", "no")


def timed_lap(number: int, every: int) -> bool:
    """Whether lap `number` (from 1) is timed: with `every` 1 each one, else the second
    and then one in `every` (the first carries start-up costs — TensorFlow's first
    conversion, a worker's imports — that would weigh as `every` laps)."""
    return every == 1 or (number >= 2 and (number - 2) % every == 0)


def enabled() -> bool:
    """Whether loaders made now count (``RESUMELOADER_STATS`` is not ``0``/``off``)."""
    return os.environ.get(ENV, "1").strip().lower() not in _OFF


def every() -> int:
    """One lap in how many is timed: 1 with ``RESUMELOADER_STATS=all``, else `EVERY`."""
    return 1 if os.environ.get(ENV, "").strip().lower() == "all" else EVERY


class Meter:
    """What one stage did on the timed laps at one place: batches, records in and out,
    bytes out, wall time, and the CPU time and wall time of the laps whose CPU time
    was read.

    Attributes:
        kind: the kind of the laps that time it (`Place.lap`).
    """

    __slots__ = (*FIELDS, "kind")

    def __init__(self) -> None:
        self.batches = self.records_in = self.records_out = self.bytes_out = 0
        self.wall_ns = self.cpu_ns = self.cpu_wall_ns = 0
        self.kind = ""

    def values(self) -> tuple[int, ...]:
        """The counts, in `FIELDS` order."""
        return (self.batches, self.records_in, self.records_out, self.bytes_out,
                self.wall_ns, self.cpu_ns, self.cpu_wall_ns)

    def add(self, values: tuple[int, ...] | list[int]) -> None:
        """Adds counts given in `FIELDS` order."""
        (batches, records_in, records_out, bytes_out, wall, cpu, cpu_wall) = values
        self.batches += batches
        self.records_in += records_in
        self.records_out += records_out
        self.bytes_out += bytes_out
        self.wall_ns += wall
        self.cpu_ns += cpu
        self.cpu_wall_ns += cpu_wall


class Kind:
    """The laps of one kind at one place: all of them and the timed ones, with their
    records; and the `Lap` object the timed ones reuse."""

    __slots__ = (*KIND_FIELDS, "chunks", "due", "lap", "name", "starts")

    def __init__(self, place: Place, name: str) -> None:
        self.name = name
        self.laps = self.timed = self.records = self.timed_records = 0
        self.batches = self.timed_batches = 0
        #: The number of the next timed lap (`timed_lap`, without a call per lap).
        self.due = 1 if place.every == 1 else 2
        self.chunks = 0  # calls of `Place.chunk`
        self.starts = 0  # timed `Lap` starts (a chunk's is one start of several laps)
        self.lap = Lap(place, self)

    def values(self) -> tuple[int, ...]:
        """The counts, in `KIND_FIELDS` order."""
        return (self.laps, self.timed, self.records, self.timed_records, self.batches,
                self.timed_batches)

    def add(self, values: tuple[int, ...] | list[int]) -> None:
        """Adds counts given in `KIND_FIELDS` order."""
        self.laps += values[0]
        self.timed += values[1]
        self.records += values[2]
        self.timed_records += values[3]
        self.batches += values[4]
        self.timed_batches += values[5]


class Place(dict[str, Meter]):
    """The meters of one place, by stage name (a missing stage's meter is made on use).

    Args:
        name: the place (``"hand-out"``, ``"resumeloader-worker-0"``, ...).
        parallel: how many calls it runs at once (tf.data's parallel map: the cores).
        every: it times one lap in this many of each kind.
    """

    def __init__(self, name: str, *, parallel: int = 1, every: int = EVERY) -> None:
        super().__init__()
        self.name = name
        self.parallel = parallel
        self.every = every
        self.born_ns = _now()
        #: Nanoseconds it has existed, as its own process tells (a remote place).
        self.alive_ns: int | None = None
        #: CPU nanoseconds of its whole process, as that process tells (a remote place).
        self.process_cpu_ns: int | None = None
        #: Nanoseconds measured per stage on the sampled records of record-by-record
        #: loops (how `Lap.split` divides such a loop's time among its stages).
        self.shares: dict[str, int] = {}
        #: Per record loop (its stage names): its meters with their `shares`, as
        #: `Lap.split` takes them (made again when `shares` change: `loop_shares`).
        self._loops: dict[tuple[str, ...], list[tuple[Meter, int]]] = {}
        #: The laps of each kind.
        self.kinds: dict[str, Kind] = {}
        self._sent: dict[str, tuple[int, ...]] = {}
        self._sent_kinds: dict[str, tuple[int, ...]] = {}

    def add_shares(self, spent: dict[str, int]) -> None:
        """Adds the ns measured per stage on a sampled record loop to `shares`."""
        for name, ns in spent.items():
            self.shares[name] = self.shares.get(name, 0) + ns
        self._loops.clear()

    def loop_shares(self, loop: tuple[str, ...]) -> list[tuple[Meter, int]]:
        """The meters of the record loop of stages `loop` with their `shares` (what
        `Lap.split` takes), kept until the shares change (`add_shares`)."""
        shares = self._loops.get(loop)
        if shares is None:
            shares = self._loops[loop] = [(self[name], self.shares.get(name, 0))
                                          for name in loop]
        return shares

    def __missing__(self, stage: str) -> Meter:
        meter = self[stage] = Meter()
        return meter

    def _kind(self, kind: str) -> Kind:
        counter = self.kinds.get(kind)
        if counter is None:
            counter = self.kinds[kind] = Kind(self, kind)
        return counter

    def lap(self, kind: str, records: int, batches: int = 1) -> Lap | None:
        """Counts a lap of `kind` over `records` records in `batches` batches (several
        when a task makes several batches); returns its `Lap`, restarted now, if this
        lap is timed (`timed_lap`), else None."""
        counter = self.kinds.get(kind)
        if counter is None:
            counter = self.kinds[kind] = Kind(self, kind)
        counter.laps += 1
        counter.records += records
        counter.batches += batches
        if counter.laps < counter.due:
            return None
        return self.timing(counter, records, batches)

    def kind(self, kind: str) -> Kind:
        """The counts of the laps of `kind` (made on first use). A loop that runs once per
        batch counts each lap on it itself, with no call (``laps``, ``records`` and
        ``batches`` each added to), and asks `timing` for the `Lap` of a lap whose number
        reached its ``due``."""
        return self._kind(kind)

    def timing(self, counter: Kind, records: int, batches: int = 1) -> Lap:
        """The lap just counted on `counter` (of `records` records in `batches` batches;
        its number reached ``counter.due``) is timed: its `Lap`, started now."""
        self._timed_lap(counter, records, batches)
        return self._started(counter, _now())

    def timed(self, counter: Kind, records: int, wall_ns: int) -> None:
        """The lap just counted on `counter` (of `records` records, one batch; its number
        reached ``counter.due``) took `wall_ns`, timed whole by its loop: into the meter
        of the kind's name (the sampler's, `resumeloader.stages.plan.Plan.tasks`)."""
        self._timed_lap(counter, records, 1)
        meter = self[counter.name]
        meter.kind = counter.name
        meter.batches += 1
        meter.records_in += records
        meter.records_out += records
        meter.wall_ns += wall_ns

    def _timed_lap(self, counter: Kind, records: int, batches: int) -> None:
        """Counts the lap just counted on `counter` as timed; the next is `every` on."""
        counter.due = counter.laps + self.every
        counter.timed += 1
        counter.timed_records += records
        counter.timed_batches += batches

    def chunk(self, kind: str) -> Lap | None:
        """A chunk of batches of `kind` begins now (made at once: counted by `laps` when
        made); returns its `Lap`, started now, if it is timed — the chunks of a kind
        are timed as laps are (`timed_lap`) —, else None."""
        counter = self._kind(kind)
        counter.chunks += 1
        if not timed_lap(counter.chunks, self.every):
            return None
        return self._started(counter, _now())

    def laps(self, kind: str, records: int, batches: int, lap: Lap | None) -> None:
        """Counts a chunk of `batches` batches holding `records` records as `batches`
        laps of `kind`, timed laps if the chunk's `lap` (`chunk`) is not None."""
        counter = self._kind(kind)
        counter.laps += batches
        counter.records += records
        counter.batches += batches
        if lap is not None:
            counter.timed += batches
            counter.timed_records += records
            counter.timed_batches += batches

    @staticmethod
    def _started(counter: Kind, now: int) -> Lap:
        """The kind's `Lap`, restarted at `now` (its CPU time read on one start in
        `CPU_EVERY`, its record loops split on one in `SPLIT_EVERY`)."""
        counter.starts += 1
        lap = counter.lap
        lap.splits = counter.starts % SPLIT_EVERY == 1
        lap.sampled = counter.starts % CPU_EVERY == 1
        lap._cpu = _cpu() if lap.sampled else -1
        lap._last = now
        return lap

    def take(self) -> tuple[str, int, int, dict[str, Any]]:
        """What was counted since the last `take`, to send to the board that hands
        batches out: ``(name, ns alive, process CPU ns, changes)``."""
        changed: dict[str, Any] = {}
        for stage, meter in list(self.items()):
            values = meter.values()
            sent = self._sent.get(stage)
            if values != sent:
                changed[stage] = (meter.kind, _minus(values, sent))
                self._sent[stage] = values
        kinds = {}
        for kind, counter in list(self.kinds.items()):
            values = counter.values()
            sent = self._sent_kinds.get(kind)
            if values != sent:
                kinds[kind] = _minus(values, sent)
                self._sent_kinds[kind] = values
        return (self.name, _now() - self.born_ns, time.process_time_ns(),
                {"stages": changed, "kinds": kinds})

    def merge(self, changes: dict[str, Any]) -> None:
        """Adds the changes another process's place sent (`take`)."""
        for stage, (kind, values) in changes["stages"].items():
            meter = self[stage]
            meter.kind = kind
            meter.add(values)
        for kind, values in changes["kinds"].items():
            counter = self.kinds.get(kind)
            if counter is None:
                counter = self.kinds[kind] = Kind(self, kind)
            counter.add(values)


def _minus(values: tuple[int, ...], sent: tuple[int, ...] | None) -> tuple[int, ...]:
    return values if sent is None else tuple(a - b for a, b in zip(values, sent, strict=True))


class Lap:
    """A timed lap: one batch through consecutive stages at one place; `lap` closes
    the stage that ran since the previous boundary.

    Attributes:
        place: where it runs (its meters by stage name).
        kind: its kind's counts.
        sampled: whether this lap reads the thread's CPU time.
        splits: whether its record loops are timed part by part
            (`resumeloader.workers.timing.split`).
    """

    __slots__ = ("_cpu", "_last", "kind", "place", "sampled", "splits")

    def __init__(self, place: Place, kind: Kind) -> None:
        self.place = place
        self.kind = kind
        self.sampled = self.splits = False
        self._last = _now()
        self._cpu = -1

    def _close(self, meter: Meter) -> int:
        """Adds the time since the previous boundary to `meter`; returns it."""
        now = _now()
        wall = now - self._last
        meter.wall_ns += wall
        if self._cpu >= 0:
            cpu = _cpu()
            meter.cpu_ns += cpu - self._cpu
            meter.cpu_wall_ns += wall
            self._cpu = cpu
        self._last = now
        return wall

    def lap(self, meter: Meter, records: int, nbytes: int = 0, *, out: int | None = None,
            batches: int = 1) -> int:
        """Closes a stage of `records` records in (`out` out, default the same) and
        `nbytes` bytes out, `batches` batches of them (several when a stage works a
        chunk of batches at once): its time since the previous boundary goes to
        `meter`. Returns that time in ns."""
        meter.kind = self.kind.name
        meter.batches += batches
        meter.records_in += records
        meter.records_out += records if out is None else out
        meter.bytes_out += nbytes
        return self._close(meter)

    def more(self, meter: Meter) -> None:
        """Adds the time since the previous boundary to `meter` (a stage already counted
        for this batch, e.g. its batches' encoding after the batch map stages)."""
        self._close(meter)

    def split(self, shares: list[tuple[Meter, int]], records: int) -> None:
        """Closes several stages that ran interleaved (record by record) since the
        previous boundary: the time is divided among the meters in proportion to
        `shares` (each a meter and the ns measured on its sampled records)."""
        now = _now()
        wall = now - self._last
        self._last = now
        total = 0
        for _, ns in shares:
            total += ns
        total = total or 1
        spent = -1  # the CPU time since the previous boundary, on a lap that reads it
        if self._cpu >= 0:
            cpu = _cpu()
            spent, self._cpu = cpu - self._cpu, cpu
        name = self.kind.name
        for meter, ns in shares:
            part = wall * ns // total
            meter.kind = name
            meter.batches += 1
            meter.records_in += records
            meter.records_out += records
            meter.wall_ns += part
            if spent >= 0:
                meter.cpu_ns += spent * ns // total
                meter.cpu_wall_ns += part
