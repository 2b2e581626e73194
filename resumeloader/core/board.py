"""`Board`: every place's meters for one loader, its consumer's data wait, gauges and counts.

The board is what a loader's engine owns (`resumeloader.core.meters` holds what a
place counts): it finds the calling thread's place (`Board.here`), merges what places
in other processes sent (`Board.merge`), times what the consumer waited for data
(`Consumer`), samples queue depths (`Gauge`), keeps plain counters (the storage
layer's), and gives a `snapshot` as plain data, which `resumeloader.core.stats.Stats`
reads (`difference`: what happened between two snapshots). Pure Python.
"""

from __future__ import annotations

import collections
import threading
import time
import weakref
from typing import Any

from resumeloader.core import meters

__all__ = ["Board", "Consumer", "Gauge", "difference"]

_now = time.perf_counter_ns


class Gauge:
    """Samples of one queue's depth (of `capacity`, when it has one)."""

    __slots__ = ("capacity", "count", "maximum", "total")

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.count = self.total = self.maximum = 0

    def sample(self, depth: int) -> None:
        """One sample of the depth."""
        self.count += 1
        self.total += depth
        if depth > self.maximum:
            self.maximum = depth


class Consumer:
    """What the consumer (the training loop) waited for data, step by step.

    Its steps are exact, and so are the intervals between two steps of one loop (the
    consumer's compute); the wait and compute times are those of the *timed* steps
    and intervals (`timed_steps`, `compute_steps`), which
    `resumeloader.core.stats.Stats` scales to all. ``for batch in loader``
    (`resumeloader.handout.loop.EagerLoop`) counts its steps itself (read here while
    it is live, added when it ends) and times its first two steps' waits and the
    compute between them, then one step's wait and the compute before it in `every`
    (`sampled`): a step's clocks cost more than the cheapest loop's step. `handed`
    times one step exactly. `produced` and `advanced` estimate each step for
    ``dataset()`` consumed by a loop that advances the loader eagerly (Keras with
    `ResumeCallback`, a Python loop): a step's wait is how long after the previous
    advance (or the iteration's start) its batch left the Python producer for tf.data.

    Args:
        every: an eager loop times one step (and the compute before it) in this many.
    """

    def __init__(self, every: int = 1) -> None:
        self.every = every
        self.steps = 0  # of the loops that ended, and of every other way of consuming
        self.timed_steps = 0
        self.wait_ns = 0
        self.max_wait_ns = 0
        self.compute_ns = 0  # between handing a batch out and asking for the next
        self.compute_steps = 0
        #: The intervals between two steps of one loop (of the live eager loop: not yet).
        self.intervals = 0
        self._loop: Any = None  # a weak reference to the live eager loop
        self._handed_ns = -1  # when the last batch was handed out (-1: new loop)
        self._advanced_ns = -1
        self._started_ns = -1
        self._made: collections.deque[tuple[int, int]] = collections.deque(maxlen=4096)
        self._lock = threading.Lock()

    def _step(self, wait: int, compute: int) -> None:
        self.steps += 1
        self.timed_steps += 1
        self.wait_ns += wait
        self.compute_ns += compute
        self.compute_steps += 1
        self.intervals += 1
        if wait > self.max_wait_ns:
            self.max_wait_ns = wait

    def totals(self) -> tuple[int, int]:
        """Every step and interval so far, the live eager loop's included."""
        loop = None if self._loop is None else self._loop()
        handed = 0 if loop is None else loop.handed_out
        return self.steps + handed, self.intervals + max(0, handed - 1)

    # -- a loop that asks and gets (for batch in loader) --------------------------------
    def begun(self, loop: Any = None) -> None:
        """A new loop starts: the time before its first ask is not a step's. An eager
        `loop` (its ``handed_out`` are its steps) is read while live."""
        self._handed_ns = -1
        self.ended(None)
        if loop is not None:
            self._loop = weakref.ref(loop)

    def ended(self, loop: Any) -> None:
        """The eager loop `loop` (None: whichever was live) ended: its steps are added."""
        ref, self._loop = self._loop, None
        live = None if ref is None else ref() or loop  # a loop being finalised: dead ref
        if live is not None:
            self.steps += live.handed_out
            self.intervals += max(0, live.handed_out - 1)

    def sampled(self, wait: int, compute: int) -> None:
        """A timed step of an eager loop (its count is the loop's): the consumer waited
        `wait` ns for its batch, after `compute` ns since the previous batch (-1: not
        timed)."""
        self.timed_steps += 1
        self.wait_ns += wait
        if wait > self.max_wait_ns:
            self.max_wait_ns = wait
        if compute >= 0:
            self.compute_ns += compute
            self.compute_steps += 1

    def handed(self, asked_ns: int, got_ns: int) -> None:
        """One step, timed: the consumer asked for a batch at `asked_ns`, had it at
        `got_ns`."""
        compute = asked_ns - self._handed_ns if self._handed_ns >= 0 else -1
        self._handed_ns = got_ns
        self.steps += 1
        self.intervals += compute >= 0
        self.sampled(got_ns - asked_ns, compute)

    # -- dataset() and an eager advance ------------------------------------------------
    def started(self) -> None:
        """A dataset() iteration starts (asked for its first batch) now."""
        with self._lock:
            self._made.clear()
            self._started_ns = _now()
            self._advanced_ns = -1

    def produced(self, end: int) -> None:
        """The batch ending at position `end` leaves the producer now."""
        self._made.append((end, _now()))

    def advanced(self, end: int) -> None:
        """The consumer advanced to position `end` now (after its step)."""
        now = _now()
        with self._lock:
            made = None
            while self._made and self._made[0][0] <= end:
                position, made = self._made.popleft()
                if position == end:
                    break
            asked = max(self._advanced_ns, self._started_ns)
            self._advanced_ns = now
            if made is None or asked < 0:
                return
        wait = max(0, made - asked)
        self._step(wait, now - max(made, asked))


class Board:
    """Every place's meters for one loader, the consumer, the gauges and the counts.

    Args:
        chain: the stages in the order batches pass them (the table's rows).
        every: each place times one lap in this many of each kind; default: `every()`
            (the environment variable's choice).
    """

    def __init__(
        self, chain: list[str] | tuple[str, ...] = (), *, every: int | None = None
    ) -> None:
        self.chain = list(chain)
        #: One lap in how many is timed.
        self.every = meters.every() if every is None else every
        self.born_ns = _now()
        self.process_cpu_ns = time.process_time_ns()
        self.consumer = Consumer(1 if self.every == 1 else self.every * meters.STEP_FACTOR)
        self.gauges: dict[str, Gauge] = {}
        #: Plain counters (e.g. ``storage.gets``), added by `count` and merged deltas.
        self.counts: collections.Counter[str] = collections.Counter()
        #: Functions returning counters of this process to add to `counts` at snapshot
        #: time (read once when registered, so that only what happens later counts).
        self._sources: list[tuple[Any, dict[str, int]]] = []
        #: What a tuner decided (``Workers("auto")``): plain dicts, oldest first.
        self.decisions: list[dict[str, Any]] = []
        self._places: dict[str, meters.Place] = {}
        self._readers: dict[str, Any] = {}
        self._local = threading.local()
        self._lock = threading.Lock()

    def here(self) -> meters.Place:
        """The calling thread's place: a worker thread's own (named after the thread),
        or `meters.HAND_OUT`, which every other thread shares (one hands batches out at a
        time: the thread of ``for batch in loader``, its prefetch thread, or the one
        tf.data runs the generator in)."""
        try:
            place: meters.Place = self._local.place
            return place
        except AttributeError:
            name = threading.current_thread().name
            if not name.startswith(meters.WORKER_THREADS):
                name = meters.HAND_OUT
            place = self._local.place = self.place(name)
            return place

    def place(self, name: str, *, parallel: int = 1) -> meters.Place:
        """The place named `name` (made on first use)."""
        with self._lock:
            place = self._places.get(name)
            if place is None:
                place = self._places[name] = meters.Place(name, parallel=parallel, every=self.every)
            return place

    def gauge(self, name: str, capacity: int | None = None) -> Gauge:
        """The gauge named `name` (made on first use, with `capacity`)."""
        gauge = self.gauges.get(name)
        if gauge is None:
            gauge = self.gauges.setdefault(name, Gauge(capacity))
        if capacity is not None:
            gauge.capacity = capacity
        return gauge

    def watch_place(self, name: str, read: Any, *, parallel: int = 1) -> None:
        """A place whose meters ``read()`` returns (``{stage: counts}``, absolute: e.g.
        variables a graph adds to), read at snapshot time."""
        self.place(name, parallel=parallel)
        self._readers[name] = read

    def watch_counts(self, read: Any, prefix: str) -> None:
        """Adds ``read()``'s counters (what they grow by from now on) to `counts` under
        ``prefix.``."""
        self._sources.append(((read, prefix), dict(read())))

    def merge(self, delta: tuple[str, int, int, dict[str, Any]],
              counts: dict[str, int] | None = None, *, name: str | None = None) -> None:
        """Adds what a place elsewhere counted (`meters.Place.take`), under `name` (default:
        the name it sent), and its plain `counts`."""
        sent, alive, cpu, changes = delta
        place = self.place(sent if name is None else name)
        place.alive_ns = max(alive, place.alive_ns or 0)
        place.process_cpu_ns = cpu
        place.merge(changes)
        if counts:
            self.counts.update(counts)

    def snapshot(self) -> dict[str, Any]:
        """Everything counted so far as plain data (what `resumeloader.core.stats.Stats`
        reads)."""
        now = _now()
        counts = collections.Counter(self.counts)
        for (read, prefix), base in self._sources:
            for key, value in read().items():
                counts[f"{prefix}.{key}"] += value - base.get(key, 0)
        with self._lock:
            places = list(self._places.values())
        for name, read in list(self._readers.items()):
            place = self._places[name]
            for stage, values in read().items():
                place[stage] = meter = meters.Meter()
                meter.add(values)
        consumer = self.consumer
        steps, intervals = consumer.totals()
        return {
            "elapsed_ns": now - self.born_ns,
            "process_cpu_ns": time.process_time_ns() - self.process_cpu_ns,
            "chain": list(self.chain),
            "places": [
                {
                    "name": place.name,
                    "parallel": place.parallel,
                    "alive_ns": place.alive_ns if place.alive_ns is not None
                    else now - place.born_ns,
                    "remote": place.alive_ns is not None,
                    "process_cpu_ns": place.process_cpu_ns,
                    "stages": {
                        stage: {**dict(zip(meters.FIELDS, meter.values(), strict=True)),
                                "kind": meter.kind}
                        for stage, meter in list(place.items())
                    },
                    "kinds": {kind: dict(zip(meters.KIND_FIELDS, counter.values(), strict=True))
                              for kind, counter in list(place.kinds.items())},
                }
                for place in places
            ],
            "consumer": {
                "steps": steps, "timed_steps": consumer.timed_steps,
                "wait_ns": consumer.wait_ns, "max_wait_ns": consumer.max_wait_ns,
                "intervals": intervals, "compute_ns": consumer.compute_ns,
                "compute_steps": consumer.compute_steps,
            },
            "gauges": {
                name: {"samples": g.count, "total": g.total, "max": g.maximum,
                       "capacity": g.capacity}
                for name, g in list(self.gauges.items())
            },
            "counts": {key: int(value) for key, value in sorted(counts.items()) if value},
            "decisions": [dict(d) for d in self.decisions],
        }


def difference(after: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    """What was counted between two snapshots of one board (`after` minus `before`;
    maxima are those of `after`)."""
    if before is None:
        return after
    earlier = {p["name"]: p for p in before["places"]}
    places = []
    for place in after["places"]:
        old = earlier.get(place["name"])
        stages = {}
        for stage, values in place["stages"].items():
            was = {} if old is None else old["stages"].get(stage, {})
            stages[stage] = {key: value if key == "kind" else value - was.get(key, 0)
                             for key, value in values.items()}
        kinds = {}
        for kind, values in place["kinds"].items():
            was = {} if old is None else old["kinds"].get(kind, {})
            kinds[kind] = {key: value - was.get(key, 0) for key, value in values.items()}
        alive = place["alive_ns"] - (0 if old is None else old["alive_ns"])
        cpu = place["process_cpu_ns"]
        if cpu is not None and old is not None and old["process_cpu_ns"] is not None:
            cpu -= old["process_cpu_ns"]
        places.append({**place, "stages": stages, "kinds": kinds, "alive_ns": alive,
                       "process_cpu_ns": cpu})
    consumer = {key: value - (0 if key == "max_wait_ns" else before["consumer"][key])
                for key, value in after["consumer"].items()}
    gauges = {}
    for name, gauge in after["gauges"].items():
        was = before["gauges"].get(name, {"samples": 0, "total": 0})
        gauges[name] = {**gauge, "samples": gauge["samples"] - was["samples"],
                        "total": gauge["total"] - was["total"]}
    counts = {key: value - before["counts"].get(key, 0) for key, value in after["counts"].items()}
    return {
        **after,
        "elapsed_ns": after["elapsed_ns"] - before["elapsed_ns"],
        "process_cpu_ns": after["process_cpu_ns"] - before["process_cpu_ns"],
        "places": places, "consumer": consumer, "gauges": gauges,
        "decisions": after.get("decisions", [])[len(before.get("decisions", [])):],
        "counts": {key: value for key, value in counts.items() if value},
    }
