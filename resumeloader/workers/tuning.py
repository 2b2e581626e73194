"""`Tuning`, `Tuner`: how ``Workers("auto")`` chooses workers from measured batches.

The tuner tries candidates in trial windows of batches — none (the calling thread),
threads, processes (when threads barely cut the consumer's wait) — and
settles on the one whose batches the consumer waited least for, the cheaper one when
two are within 10%: no workers before threads, threads before processes. What it
measures per trial: the consumer's wait per batch, the producer's wall and CPU time per
batch (its CPU/wall ratio in threads tells code that holds the GIL, whose threads wait
for it, from code that releases it), the bytes of a batch and the resident memory of
worker processes, counted against a RAM budget. It never sees a batch's content: a
decision changes where batches are made, never what they hold. Pure Python; no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any, NamedTuple

from resumeloader.core import validate

__all__ = [
    "MEMORY_SHARE", "Choice", "Depth", "Measure", "Tuner", "Tuning", "cpu_budget",
    "memory_budget",
]

#: The share of the memory available when a loader starts that its workers may use
#: by default (their resident memory and the batches in flight).
MEMORY_SHARE = 0.25
#: Threads that do not make the producer's CPU time per second of trial at least this
#: many times the calling thread's wait for the GIL (or for cores: the machine is busy).
_SCALES = 1.3
#: Threads whose batches the consumer still waits for more than this share of its wait
#: without workers did not parallelise the stage (the GIL, taken and given back at each
#: call, though they add CPU): processes are tried.
_HELPS = 0.75
#: Code computing (not waiting for I/O or a sleep) has at least this CPU/wall ratio in
#: the calling thread (low, since a loaded machine gives the thread a share of a core).
_BOUND = 0.2
#: Within this share of the best wait (or `_TIE_NS` of it), the cheaper candidate is kept.
_TIE = 0.10
_TIE_NS = 250_000
#: A producer this fast per batch is a cheap stage: handing its batches to workers costs
#: more than it saves (a task's round trip, the copies out of a worker process).
_CHEAP_NS = 1_000_000
_ORDER = ("inline", "thread", "process")
_MAX_WORKERS = 1024


class Choice(NamedTuple):
    """A worker kind and count (``("inline", 0)``, ``("thread", 2)``, ``("process", 2)``)."""

    kind: str
    num_workers: int

    def __str__(self) -> str:
        if self.kind == "inline":
            return "no workers"
        return f"{self.num_workers} {self.kind} worker{'s' if self.num_workers != 1 else ''}"


@dataclasses.dataclass(frozen=True)
class Tuning:
    """How ``Workers("auto")`` tunes: its budgets and trial windows (``options=``).

    Whatever it decides, and whenever, the stream is the one of ``Workers()``: batches
    are made by another backend from the next batch on, none lost or repeated, and the
    loader's state holds no decision.

    Args:
        cpus: the CPU budget, in cores; None: the cores this process may run on
            (``os.sched_getaffinity``).
        memory_bytes: the RAM budget of the workers (worker processes' resident
            memory and the batches in flight); None: `MEMORY_SHARE` of the memory
            available when the loader is made.
        trial_batches: batches measured per candidate (after its start-up batches).
        trial_seconds: the least a candidate's trial lasts (so that a burst of load on
            a shared machine weighs less against fast batches).
        every: batches between two re-checks once settled (the trials run again).
        trial_share: the most share of the time its re-checks' trials may take: settled,
            it re-checks after `every` batches and once the trials that settled it are
            at most this share of the time since they began (a cheap stage makes
            `every` batches in about a second; its trials take a quarter of one). 1:
            after `every` batches, however long the trials took.
        decide: for tests and experiments: ``decide(batches) -> (kind, num_workers)``
            or None, called after each batch handed out with the count so far; it
            replaces the measured decisions (kinds ``"inline"``, ``"thread"``,
            ``"process"``). A ``(kind, num_workers, window)`` also sets the window
            of those workers (the most batch tasks in flight).

    Raises:
        TypeError, ValueError: a field is invalid.
    """

    cpus: int | None = None
    memory_bytes: int | None = None
    trial_batches: int = 8
    trial_seconds: float = 0.25
    every: int = 2000
    trial_share: float = 0.05
    decide: Callable[[int], Any] | None = None

    def __post_init__(self) -> None:
        if self.cpus is not None:
            validate.integer("cpus", self.cpus, low=1, high=4096)
        if self.memory_bytes is not None:
            validate.integer("memory_bytes", self.memory_bytes, low=1)
        validate.integer("trial_batches", self.trial_batches, low=1, high=10_000)
        validate.integer("every", self.every, low=1)
        validate.number("trial_share", self.trial_share, low=0, high=1, low_open=True)
        validate.number("trial_seconds", self.trial_seconds, low=0, high=3600,
                        unit=" of seconds")
        if self.decide is not None and not callable(self.decide):
            msg = f"`decide` must be callable or None. Received: decide={self.decide!r:.80}."
            raise TypeError(msg)


def cpu_budget(tuning: Tuning) -> int:
    """The CPU budget of `tuning`: its `cpus`, or the cores this process may run on."""
    if tuning.cpus is not None:
        return tuning.cpus
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def memory_budget(tuning: Tuning) -> int:
    """The RAM budget of `tuning`: its `memory_bytes`, or `MEMORY_SHARE` of the memory
    available now (``MemAvailable`` of ``/proc/meminfo``; else of the physical memory)."""
    if tuning.memory_bytes is not None:
        return tuning.memory_bytes
    available = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as lines:
            for line in lines:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        pass
    if not available:
        try:
            available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (AttributeError, ValueError, OSError):
            available = 4 << 30
    return int(available * MEMORY_SHARE)


@dataclasses.dataclass
class Measure:
    """What one trial window measured (sums over its measured batches)."""

    batches: int = 0
    wait_ns: int = 0  # the consumer waited for the batch
    hold_ns: int = 0  # the consumer held control between batches
    work_wall_ns: int = 0  # producer calls timed in this process: wall
    work_cpu_ns: int = 0  # and CPU time of their threads
    batch_bytes: int = 0  # one batch's bytes
    rss_bytes: int = 0  # worker processes' resident memory
    elapsed_ns: int = 0  # the trial's measured batches took

    def plus(self, other: Measure) -> Measure:
        """The sums of two trials (the larger batch and resident memory)."""
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name)
                  for f in dataclasses.fields(self)}
        summed["batch_bytes"] = max(self.batch_bytes, other.batch_bytes)
        summed["rss_bytes"] = max(self.rss_bytes, other.rss_bytes)
        return Measure(**summed)

    def per_batch(self, value: int) -> float:
        return value / self.batches if self.batches else 0.0

    @property
    def ratio(self) -> float:
        """CPU time per wall time of the producer's calls (1: busy computing alone)."""
        return self.work_cpu_ns / self.work_wall_ns if self.work_wall_ns else 0.0

    @property
    def cpu_rate(self) -> float:
        """The producer's CPU seconds per second of the trial (its parallelism achieved)."""
        return self.work_cpu_ns / self.elapsed_ns if self.elapsed_ns else 0.0

    def describe(self) -> str:
        text = f"wait {self.per_batch(self.wait_ns) / 1e6:.2f} ms/batch"
        if self.work_wall_ns:
            text += f", CPU/wall {self.ratio:.2f}, {self.cpu_rate:.2f} CPU"
        return text


class Tuner:
    """The candidates to try next, and the decision once they were measured.

    Args:
        cpus: the CPU budget; memory: the RAM budget in bytes.
        processes: whether process workers can take the pipeline (it pickles).
    """

    def __init__(self, *, cpus: int, memory: int, processes: bool) -> None:
        self.cpus = cpus
        self.memory = memory
        self.processes = processes
        #: Per candidate, what its trials measured (summed over them).
        self.measured: dict[Choice, Measure] = {}
        self.notes: list[str] = []
        self._confirm: list[Choice] | None = None  # the confirming round's candidates left

    def restart(self) -> Choice:
        """Forgets what was measured; the first candidate (no workers)."""
        self.measured.clear()
        self.notes = []
        self._confirm = None
        return Choice("inline", 0)

    def fits(self, choice: Choice, measure: Measure) -> bool:
        """Whether `choice` stays within the RAM budget: its workers' resident memory and
        two batches in flight per worker."""
        need = measure.rss_bytes + 2 * choice.num_workers * measure.batch_bytes
        return need <= self.memory

    def next(self, choice: Choice, measure: Measure) -> Choice | None:
        """The candidate to try after `choice` measured `measure`; None: settled (`best`).

        Workers are paid for only when measured twice: once the candidates were tried, a
        best one that has workers and no workers are tried once more, in turn (a burst of
        load on a shared machine then weighs on both), and `best` judges the sums.
        """
        earlier = self.measured.get(choice)
        self.measured[choice] = measure if earlier is None else earlier.plus(measure)
        if not self.fits(choice, measure):
            self.notes.append(f"{choice} over the RAM budget of {self.memory / 2**20:,.0f} MiB")
        if self._confirm is not None:
            return self._confirm.pop(0) if self._confirm else None
        following = self._explore(choice, measure)
        if following is not None:
            return following
        best = self.best()
        if best.kind == "inline":
            return None
        inline = Choice("inline", 0)
        self._confirm = [inline, best] if best == choice else [best, inline]
        self.notes.append(f"{best} and no workers measured twice")
        return self._confirm.pop(0)

    def _explore(self, choice: Choice, measure: Measure) -> Choice | None:
        """The next candidate of the first round; None: all tried."""
        if choice.kind == "inline":
            work = measure.per_batch(measure.work_wall_ns)
            hold = measure.per_batch(measure.hold_ns)
            if work <= hold / 2:
                self.notes.append("the consumer is slower than the producer")
                return None
            if work < _CHEAP_NS:
                self.notes.append(f"a cheap stage ({work / 1e6:.2f} ms per batch)")
                return None
            if self.cpus < 2 and measure.ratio >= _BOUND:
                self.notes.append("1 CPU in the budget")
                return None
            bound = measure.ratio >= _BOUND  # computing, not waiting (I/O, sleep)
            count = self.cpus if bound else min(4 * self.cpus, 16)
            return Choice("thread", self._counted(max(2, count), measure))
        if choice.kind == "thread":
            alone = self.measured[Choice("inline", 0)]
            if alone.ratio < _BOUND:
                return None  # code that waits: threads are its workers
            before, after = alone.per_batch(alone.wait_ns), measure.per_batch(measure.wait_ns)
            if after <= _HELPS * before:
                return None  # the threads parallelise the stage
            if measure.cpu_rate < _SCALES * alone.cpu_rate:
                self.notes.append("threads add no CPU: the GIL is held (or the cores are busy)")
            else:  # more CPU, hardly more batches: the GIL taken and given back per call
                self.notes.append(f"threads barely cut the wait ({before / 1e6:.2f} -> "
                                  f"{after / 1e6:.2f} ms per batch)")
            if self.processes:
                return Choice("process", self._counted(max(2, self.cpus), measure))
            self.notes.append("the pipeline does not pickle: no process workers")
        return None

    def _counted(self, count: int, measure: Measure) -> int:
        """`count`, fewer if their batches in flight would not fit the RAM budget."""
        if measure.batch_bytes:
            count = min(count, max(1, self.memory // (2 * measure.batch_bytes)))
        return count

    def best(self) -> Choice:
        """The measured candidate the consumer waited least for, within the RAM budget; of
        two within 10% (or 0.25 ms per batch) of each other, the cheaper."""
        fitting = {c: m for c, m in self.measured.items() if self.fits(c, m) or c.kind == "inline"}
        waits = {c: m.per_batch(m.wait_ns) for c, m in fitting.items()}
        least = min(waits.values())
        ranked = sorted(waits, key=lambda c: (_ORDER.index(c.kind), c.num_workers))
        return next(c for c in ranked if waits[c] <= least * (1 + _TIE) + _TIE_NS)

    def summary(self) -> str:
        """What was measured, one candidate after another, and why."""
        parts = [f"{c}: {m.describe()}" for c, m in self.measured.items()]
        return "; ".join(parts + list(dict.fromkeys(self.notes)))


def warmup(choice: Choice) -> int:
    """Batches of a trial not measured: a worker's start-up, the window filling."""
    return 1 if choice.kind == "inline" else 2 * choice.num_workers + 1


def parse_decision(value: Any) -> Choice | None:
    """What a `Tuning.decide` returned, as a `Choice` (None: no change).

    Raises:
        ValueError: not a ``(kind, num_workers)`` pair of a kind it can choose.
    """
    if value is None:
        return None
    ok = isinstance(value, tuple) and len(value) == 2 and value[0] in _ORDER
    count: Any = value[1] if ok else -1
    ok = ok and validate.is_integer(count) and (count == 0) == (value[0] == "inline")
    if not ok or not 0 <= count <= _MAX_WORKERS:
        msg = (
            "`Tuning.decide` must return None or a (kind, num_workers) pair: ('inline', 0), "
            f"('thread', n) or ('process', n) with n >= 1. Received: {value!r:.80}."
        )
        raise ValueError(msg)
    return Choice(value[0], int(count))


#: The window grows while the consumer's wait is more than this share of its step.
GROW_SHARE = 0.05
#: The consumer never waited: no batch of the period waited this long (nor 1% of a step).
_NEVER_NS = 50_000
#: A grown window is kept when the wait share falls at least this much (else undone).
_HELPED = 0.8
#: The largest window, per worker (and in all).
_MOST_PER_WORKER = 8
_MOST = 256
#: Periods after a growth that helped before the window may shrink again.
_SHRINK_AFTER = 4


class Depth:
    """`window="auto"`'s policy: the most batch tasks in flight, from measured periods.

    It grows the window (one task more per worker) while the consumer's wait is more than
    `GROW_SHARE` of its step (wait + its own time between batches) and 50 µs per batch
    (less is the hand-out's own cost, which no window removes), and the batches in
    flight fit the RAM budget; a growth the next period does not show to help is undone
    (and not tried again for longer each time); it shrinks the window by one when the
    consumer never waited during a period, down to one task per worker. The window
    changes only how far ahead tasks are made, never their order: the stream is the same.

    Args:
        window: the window to start with (the kind's default).
        floor: the least window (one per worker).
        memory: the RAM budget, in bytes, for ``window`` batches.
    """

    def __init__(self, window: int, *, floor: int, memory: int) -> None:
        self.floor = max(1, floor)
        self.window = max(self.floor, window)
        self.memory = memory
        self._before: tuple[int, float] | None = None  # (window, wait share) before a growth
        self._rest = 0  # periods before the next growth
        self._backoff = 1
        self._grown = _SHRINK_AFTER  # periods since the last growth kept

    def ceiling(self, batch_bytes: int) -> int:
        """The largest window: `_MOST_PER_WORKER` per worker, within the RAM budget."""
        most = min(_MOST, _MOST_PER_WORKER * self.floor)
        if batch_bytes:
            most = min(most, self.memory // batch_bytes)
        return max(1, most)

    def period(self) -> int:
        """Batches measured before each decision."""
        return max(8, 2 * self.window)

    def next(self, measure: Measure, longest_wait_ns: int) -> tuple[int, str] | None:
        """The window after a period that measured `measure` (its longest wait
        `longest_wait_ns`) and why; None: unchanged."""
        step = measure.wait_ns + measure.hold_ns
        share = measure.wait_ns / step if step else 0.0
        per = measure.per_batch
        said = (f"the consumer waited {share:.0%} of its step ({per(measure.wait_ns) / 1e6:.2f} "
                f"of {per(step) / 1e6:.2f} ms per batch)")
        ceiling = self.ceiling(measure.batch_bytes)
        budget = f"{measure.batch_bytes / 2**20:,.2f} MiB per batch, RAM budget " \
            f"{self.memory / 2**20:,.0f} MiB"
        before, self._before = self._before, None
        self._rest = max(0, self._rest - 1)
        self._grown += 1
        if self.window > ceiling:
            return self._set(ceiling, f"over the RAM budget ({budget})")
        if before is not None and share > _HELPED * before[1]:
            # Not tried again for `_backoff` periods (counted from the next), then twice as long.
            self._rest, self._backoff = self._backoff + 1, min(64, 2 * self._backoff)
            return self._set(before[0], f"{said}: the larger window did not help")
        if before is not None:
            self._grown = 0  # it helped: kept
        waits = share > GROW_SHARE and per(measure.wait_ns) > _NEVER_NS  # (not the hand-off's own)
        if waits and not self._rest and self.window < ceiling:
            self._before = (self.window, share)
            grown = min(ceiling, self.window + self.floor)
            return self._set(grown, f"{said}; {budget}")
        never = max(_NEVER_NS, step // max(1, measure.batches) // 100)
        if longest_wait_ns < never and self.window > self.floor and self._grown > _SHRINK_AFTER:
            return self._set(self.window - 1, "the consumer never waited")
        return None

    def _set(self, window: int, why: str) -> tuple[int, str] | None:
        window = max(1, window)
        if window == self.window:
            return None
        self.window = window
        return window, why
