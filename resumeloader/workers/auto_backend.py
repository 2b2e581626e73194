"""`AutoBackend`: ``Workers("auto")``, batches made by the backend the measurements choose.

It runs one backend (no workers, threads or processes) at a time and may change to
another at any batch boundary inside an iteration: the tasks the old one took and did
not hand back are given to the new one, first (a task is a pure function of the
pipeline and its position: made again, it gives the same bytes), so no batch is lost
or repeated and the stream is that of ``Workers()``. What to run comes from
`resumeloader.workers.tuning` (trial windows, then settled, re-checked every
`Tuning.every` batches, its trials at most `Tuning.trial_share` of the time); each
decision is logged (INFO, ``resumeloader.workers``) and kept on the loader's board
(``loader.stats().decisions``). No TensorFlow here.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterator
from typing import Any, ClassVar

from resumeloader.stages import plan as plan_lib
from resumeloader.workers import backend, depth, options, produce, timing, tuning

__all__ = ["LOGGER", "AutoBackend"]

LOGGER = logging.getLogger("resumeloader.workers")
Task = plan_lib.Task
Choice = tuning.Choice
_now = time.perf_counter_ns
_cpu = time.thread_time_ns


class AutoBackend:
    """``Workers("auto")``: the worker kind and count chosen, and re-chosen, from measured
    batches, under a CPU and a RAM budget (`tuning.Tuning`, given as ``options=``).

    Args:
        workers: its options (``num_workers`` 0; ``timeout`` passed on to the workers).
        producer: what makes each task's batches.
    """

    kind: ClassVar[str] = "auto"
    option_fields: ClassVar[tuple[str, ...]] = ("timeout", "window")
    options_type: ClassVar[type | None] = tuning.Tuning
    # No workers asked for: a path that makes batches in TensorFlow without Python (in-memory
    # arrays gathered) is taken, as with no workers; otherwise this backend makes them.
    parallel: ClassVar[bool] = False

    def __init__(self, workers: options.Workers, producer: produce.BatchProducer) -> None:
        self._workers = workers
        self._producer = producer
        self._tuning: tuning.Tuning = workers.options
        try:
            backend.check_picklable(producer.pipeline, kind="process")
            picklable = True
        except TypeError:
            picklable = False
        self._tuner = tuning.Tuner(
            cpus=tuning.cpu_budget(self._tuning), memory=tuning.memory_budget(self._tuning),
            processes=picklable,
        )
        self._clock = _Clock()
        self._timed = _TimedProducer(producer, self._clock, lambda: self._trial is not None)
        self._lock = threading.Lock()
        self._children: dict[Choice, Any] = {}
        self._choice = self._tuner.restart()
        self._trial: _Trial | None = _Trial(self._choice, self._tuning)
        self._handed = 0  # batches handed out, over every run
        self._settled_at = 0
        self._trials_began = 0  # when the trials began (set as the first run starts)
        #: Settled: no re-check before this (`Tuning.trial_share` of the time on trials).
        self._recheck_ns = 0
        #: Every decision: ``{"batch", "kind", "num_workers", "why"}``.
        self.decisions: list[dict[str, Any]] = []

    @classmethod
    def check(cls, workers: options.Workers) -> None:
        if workers.num_workers:
            msg = (
                "kind='auto' chooses the number of workers itself. Received: "
                f"num_workers={workers.num_workers}. Expected: Workers('auto'), or a number "
                "with kind='thread' or 'process'."
            )
            raise ValueError(msg)

    # -- what it runs now ----------------------------------------------------------------
    @property
    def choice(self) -> Choice:
        """The kind and count making batches now."""
        return self._choice

    @property
    def reads_in_this_process(self) -> bool:
        return self._child(self._choice).reads_in_this_process

    @property
    def window(self) -> int:
        """The most tasks in flight: the largest window of the backends it ran."""
        current = self._child(self._choice)
        with self._lock:
            return max([current.window, *(c.window for c in self._children.values())])

    def _child(self, choice: Choice) -> Any:
        with self._lock:
            child = self._children.get(choice)
            if child is None:
                window = self._workers.window
                workers = options.Workers(
                    choice.num_workers, kind=choice.kind,
                    timeout=self._workers.timeout if choice.num_workers else None,
                    window=(depth.AUTO if window is None else window) if choice.num_workers
                    else None,
                )
                made = self._producer if choice.kind == "process" else self._timed
                child = self._children[choice] = workers.backend(made)  # type: ignore[arg-type]
                tuned = getattr(child, "depth", None)
                if tuned is not None:
                    tuned.on_decision = self._window_decided
                    tuned.frozen = self._frozen
                    tuned.memory = self._tuner.memory  # the Tuning's budget, not the default
            return child

    @property
    def _frozen(self) -> bool:
        """Whether the children's windows stay as they are: a trial is measuring, or the
        decisions are `Tuning.decide`'s."""
        return self._trial is not None or self._tuning.decide is not None

    # -- the run ---------------------------------------------------------------------
    def start(self) -> None:
        pass  # the chosen backend starts with the run

    def run(self, tasks: Iterator[Task]) -> Iterator[tuple[Task, produce.Produced]]:
        feed = _Feed(tasks)
        if not self._handed:
            self._trials_began = _now()  # the first trials begin with the first batch
        while True:
            if self._settled_inline() and not (yield from self._inline(feed)):
                return
            asked = _now()
            choice = self._choice
            produced = self._child(choice).run(feed.tasks())
            try:
                for task, made in produced:
                    feed.handed(task)
                    got = _now()
                    yield task, made
                    held = _now()
                    self._after(made, got - asked, held - got)
                    asked = held
                    if self._choice != choice or self._settled_inline():
                        break
                else:
                    return
            finally:
                produced.close()
            feed.rewind()  # what the old backend took and did not hand back comes first
            if self._trial is None and self._tuning.decide is None:
                self._stop_processes()  # settled: process workers not chosen free their memory

    def _settled_inline(self) -> bool:
        """Whether batches are made without workers, settled (no trial, no `decide`)."""
        return (self._choice.kind == "inline" and self._trial is None
                and self._tuning.decide is None)

    def _inline(self, feed: _Feed) -> Generator[tuple[Task, produce.Produced], None, bool]:
        """Settled on no workers: the producer's own loop (nothing timed or tracked per
        batch) up to the next re-check (`_recheck`). Each task is made before
        the next is taken, so none is in flight when it stops. Returns whether the
        tasks go on."""
        due = max(1, self._tuning.every - (self._handed - self._settled_at))
        handed = 0
        produced = self._producer.run(feed.untracked(due))
        try:
            for item in produced:
                handed += 1
                yield item
        finally:
            produced.close()
            self._handed += handed
        if handed < due:
            return False
        self._recheck()
        return True

    def _recheck(self) -> None:
        """Settled for `Tuning.every` batches: the trials run again if they would stay
        within `Tuning.trial_share` of the time, else after `every` more batches."""
        now = _now()
        if now < self._recheck_ns:
            self._settled_at = self._handed
            return
        self._trials_began = now
        self._choice = self._tuner.restart()
        self._trial = _Trial(self._choice, self._tuning)
        self._freeze()

    def _after(self, made: produce.Produced, wait: int, hold: int) -> None:
        """Counts a batch handed out; decides what makes the next ones."""
        self._handed += 1
        decide = self._tuning.decide
        if decide is not None:
            value: Any = decide(self._handed)
            window = None
            if isinstance(value, tuple) and len(value) == 3:
                value, window = value[:2], depth.parse_window(value[2], "Tuning.decide")
            chosen = tuning.parse_decision(value)
            if chosen is not None and chosen != self._choice:
                self._decide(chosen, "Tuning.decide")
            tuned = getattr(self._child(self._choice), "depth", None)
            if window is not None and tuned is not None:
                tuned.force(window, "Tuning.decide")
            return
        trial = self._trial
        if trial is None:
            if self._handed - self._settled_at >= self._tuning.every:
                self._recheck()
            return
        if not trial.add(made, wait, hold, self._clock, self._producer):
            return
        trial.measure.rss_bytes = self._rss(trial.choice)
        following = self._tuner.next(trial.choice, trial.measure)
        if following is not None:
            LOGGER.debug("Workers('auto') at batch %d: trying %s after %s", self._handed,
                         following, trial.measure.describe())
            self._choice = following
            self._trial = _Trial(following, self._tuning)
            return
        self._trial = None
        self._settled_at = self._handed
        now, share = _now(), self._tuning.trial_share
        self._recheck_ns = now + int((now - self._trials_began) * (1 - share) / share)
        self._decide(self._tuner.best(), self._tuner.summary())
        self._freeze()

    def _freeze(self) -> None:
        """The children's windows are tuned only while settled (not during trials)."""
        with self._lock:
            children = list(self._children.values())
        for child in children:
            tuned = getattr(child, "depth", None)
            if tuned is not None:
                tuned.frozen = self._frozen

    def _window_decided(self, decision: dict[str, Any]) -> None:
        """A child's window decision: counted in this backend's batches, kept and logged
        as its own."""
        decision = {**decision, "batch": self._handed, "by": "Workers('auto')"}
        self.decisions.append(decision)
        board = self._producer.board
        if board is not None:
            board.decisions.append(decision)
        LOGGER.info("Workers('auto') at batch %d: window %d for %s (%s)", self._handed,
                    decision["window"], decision["where"], decision["why"])

    def _decide(self, chosen: Choice, why: str) -> None:
        decision = {"batch": self._handed, "kind": chosen.kind,
                    "num_workers": chosen.num_workers, "why": why}
        self.decisions.append(decision)
        board = self._producer.board
        if board is not None:
            board.decisions.append(decision)
        LOGGER.info("Workers('auto') at batch %d: %s (%s)", self._handed, chosen, why)
        self._choice = chosen

    def _rss(self, choice: Choice) -> int:
        """The resident memory of `choice`'s worker processes (0 for others, or unknown)."""
        child = self._children.get(choice)
        total = 0
        for pid in getattr(child, "pids", ()) if choice.kind == "process" else ():
            try:
                with open(f"/proc/{pid}/status", encoding="ascii") as lines:
                    for line in lines:
                        if line.startswith("VmRSS:"):
                            total += int(line.split()[1]) * 1024
            except OSError:
                pass
        return total

    def _stop_processes(self) -> None:
        """Process workers not chosen give their memory back (they start again if chosen)."""
        for choice, child in list(self._children.items()):
            if choice.kind == "process" and choice != self._choice:
                child.close()

    # -- the lifetime ----------------------------------------------------------------
    def close(self) -> None:
        for child in list(self._children.values()):
            child.close()

    def release(self) -> None:
        for child in list(self._children.values()):
            child.release()

    def describe(self) -> str:
        last = self.decisions[-1] if self.decisions else None
        when = "measuring" if last is None else f"since batch {last['batch']}"
        return f"auto: {self._choice} now ({when}), in order"


class _Feed:
    """A run's tasks, those taken by a backend and not handed back given again first."""

    def __init__(self, tasks: Iterator[Task]) -> None:
        self._tasks = tasks
        self._again: collections.deque[Task] = collections.deque()
        self._taken: collections.deque[Task] = collections.deque()

    def tasks(self) -> Iterator[Task]:
        while True:
            if self._again:
                task = self._again.popleft()
            else:
                following = next(self._tasks, None)
                if following is None:
                    return
                task = following
            self._taken.append(task)
            yield task

    def untracked(self, count: int) -> Iterator[Task]:
        """Up to `count` tasks, not tracked: for a consumer that hands each back before
        it takes the next."""
        for _ in range(count):
            if self._again:
                yield self._again.popleft()
                continue
            following = next(self._tasks, None)
            if following is None:
                return
            yield following

    def handed(self, task: Task) -> None:
        taken = self._taken.popleft()
        assert taken is task, "a backend handed back a task out of order"

    def rewind(self) -> None:
        self._again.extendleft(reversed(self._taken))
        self._taken.clear()


class _Clock:
    """Wall and thread CPU time of the producer's calls in this process (any thread)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wall = self.cpu = 0

    def add(self, wall: int, cpu: int) -> None:
        with self.lock:
            self.wall += wall
            self.cpu += cpu


class _TimedProducer:
    """A `BatchProducer` whose `batch` calls are timed on a `_Clock` while `measuring()`
    (a trial reads the clock; settled, batches are made without the clock calls)."""

    def __init__(self, producer: produce.BatchProducer, clock: _Clock,
                 measuring: Callable[[], bool]) -> None:
        self._producer = producer
        self._clock = clock
        self._measuring = measuring

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def run(self, tasks: Iterator[Task]) -> Iterator[tuple[Task, produce.Produced]]:
        """``(task, batch(task))`` for each of `tasks` (the inline backend's loop), each
        through the timed `batch`."""
        for task in tasks:
            yield task, self.batch(task)

    def batch(self, task: Task) -> produce.Produced:
        if not self._measuring():
            return self._producer.batch(task)
        wall, cpu = _now(), _cpu()
        try:
            return self._producer.batch(task)
        finally:
            self._clock.add(_now() - wall, _cpu() - cpu)


class _Trial:
    """One candidate's trial window: start-up batches skipped, then measured."""

    def __init__(self, choice: Choice, options: tuning.Tuning) -> None:
        self.choice = choice
        self.batches = options.trial_batches
        self.least_ns = int(options.trial_seconds * 1e9)
        self.skip = tuning.warmup(choice)
        self.measure = tuning.Measure()
        self._started = (0, 0)
        self._began = 0

    def add(self, made: produce.Produced, wait: int, hold: int, clock: _Clock,
            producer: produce.BatchProducer) -> bool:
        """Counts a batch; whether the trial is over."""
        if self.skip:
            self.skip -= 1
            if not self.skip:
                self._started, self._began = (clock.wall, clock.cpu), _now()
            return False
        m = self.measure
        m.batches += 1
        m.wait_ns += wait
        m.hold_ns += hold
        if not m.batch_bytes and made.batches:
            spec = producer.output_spec.treespec
            m.batch_bytes = timing.nbytes(spec.flatten_up_to(made.batches[0]))
        if m.batches < self.batches or _now() - self._began < self.least_ns:
            return False
        m.elapsed_ns = _now() - self._began
        m.work_wall_ns = clock.wall - self._started[0]
        m.work_cpu_ns = clock.cpu - self._started[1]
        return True
