"""Workers("auto")'s choices from measured trials: the tuner's policy, its options, its
errors. Synthetic measurements: no clock, no TensorFlow."""

from __future__ import annotations

import os

import pytest

from resumeloader import Tuning, Workers
from resumeloader.workers import tuning
from resumeloader.workers.tuning import Choice, Measure

MS = 1_000_000
INLINE, THREADS, PROCESSES = Choice("inline", 0), Choice("thread", 2), Choice("process", 2)


def _measure(wait_ms: float, *, hold_ms: float = 0.1, work_ms: float | None = None,
             cpu_ms: float | None = None, batch_bytes: int = 1000, rss: int = 0) -> Measure:
    """Ten batches with these figures per batch: the consumer's wait and hold, the
    producer's wall (default: the wait, as without workers) and CPU time (default: its
    wall)."""
    work = wait_ms if work_ms is None else work_ms
    cpu = work if cpu_ms is None else cpu_ms
    return Measure(batches=10, wait_ns=int(10 * wait_ms * MS), hold_ns=int(10 * hold_ms * MS),
                   work_wall_ns=int(10 * work * MS), work_cpu_ns=int(10 * cpu * MS),
                   batch_bytes=batch_bytes, rss_bytes=rss,
                   elapsed_ns=int(10 * (wait_ms + hold_ms) * MS))


def _tuner(*, cpus: int = 2, memory: int = 1 << 30, processes: bool = True) -> tuning.Tuner:
    tuner = tuning.Tuner(cpus=cpus, memory=memory, processes=processes)
    assert tuner.restart() == INLINE
    return tuner


def test_tuner_consumer_slower_than_producer_settles_on_no_workers():
    """A producer that keeps up with the consumer gets no workers (cheap stage)."""
    tuner = _tuner()
    assert tuner.next(INLINE, _measure(0.2, hold_ms=5.0)) is None
    assert tuner.best() == INLINE and "consumer is slower" in tuner.summary()


def test_tuner_cheap_stage_settles_on_no_workers():
    """A producer under 1 ms per batch keeps no workers, however fast the consumer."""
    tuner = _tuner()
    assert tuner.next(INLINE, _measure(0.6, hold_ms=0.01)) is None
    assert tuner.best() == INLINE and "a cheap stage (0.60 ms per batch)" in tuner.summary()


def test_tuner_threads_that_add_cpu_are_kept_without_trying_processes():
    """Code that releases the GIL: threads scale, so processes are not tried."""
    tuner = _tuner()
    assert tuner.next(INLINE, _measure(10.0)) == THREADS
    assert tuner.next(THREADS, _measure(5.0, work_ms=10.0)) == INLINE  # confirming
    assert tuner.next(INLINE, _measure(10.0)) == THREADS
    assert tuner.next(THREADS, _measure(5.0, work_ms=10.0)) is None
    assert tuner.best() == THREADS and "measured twice" in tuner.summary()


def test_tuner_threads_that_add_no_cpu_try_processes_and_keep_the_faster():
    """Code that holds the GIL: threads add no CPU, processes are tried and win."""
    tuner = _tuner()
    tuner.next(INLINE, _measure(10.0))
    assert tuner.next(THREADS, _measure(10.5, work_ms=20.0, cpu_ms=10.0)) == PROCESSES
    assert tuner.next(PROCESSES, _measure(5.0)) == INLINE
    assert tuner.next(INLINE, _measure(10.0)) == PROCESSES
    assert tuner.next(PROCESSES, _measure(5.0)) is None
    assert tuner.best() == PROCESSES and "GIL" in tuner.summary()


def test_tuner_threads_that_add_cpu_but_barely_cut_the_wait_try_processes():
    """Code that releases the GIL between short calls: threads burn more CPU (taking the
    GIL back) for 5% fewer waits; processes are tried and kept when faster."""
    tuner = _tuner()
    tuner.next(INLINE, _measure(10.0))
    assert tuner.next(THREADS, _measure(9.5, work_ms=19.0, cpu_ms=19.0)) == PROCESSES
    assert "threads barely cut the wait (10.00 -> 9.50 ms per batch)" in tuner.summary()
    assert tuner.next(PROCESSES, _measure(6.0)) == INLINE
    assert tuner.next(INLINE, _measure(10.0)) == PROCESSES
    assert tuner.next(PROCESSES, _measure(6.0)) is None
    assert tuner.best() == PROCESSES


def test_tuner_threads_that_cut_the_wait_are_kept_whatever_their_cpu():
    """Threads that make the consumer wait far less are not second-guessed by their CPU
    rate (a loaded machine, or code that waits part of the time): no process trial."""
    tuner = _tuner()
    tuner.next(INLINE, _measure(10.0))
    assert tuner.next(THREADS, _measure(1.0, work_ms=10.0, cpu_ms=1.0)) == INLINE
    assert "GIL" not in tuner.summary()


def test_tuner_workers_not_faster_when_confirmed_are_not_kept():
    """A candidate with workers that was faster once by a burst of load, and slower in the
    confirming round, loses to no workers on the sums."""
    tuner = _tuner()
    tuner.next(INLINE, _measure(10.0))
    assert tuner.next(THREADS, _measure(5.0, work_ms=10.0)) == INLINE
    assert tuner.next(INLINE, _measure(6.0)) == THREADS
    assert tuner.next(THREADS, _measure(12.0, work_ms=24.0)) is None
    assert tuner.best() == INLINE


def test_tuner_unpicklable_pipeline_never_tries_processes():
    """Without a picklable pipeline the GIL-bound case stays in this process."""
    tuner = _tuner(processes=False)
    tuner.next(INLINE, _measure(10.0))
    assert tuner.next(THREADS, _measure(10.5, work_ms=20.0, cpu_ms=10.0)) is None
    assert tuner.best() == INLINE and "does not pickle" in tuner.summary()


def test_tuner_candidate_over_the_ram_budget_is_not_chosen():
    """Processes whose resident memory exceeds the budget lose however fast they were."""
    tuner = _tuner(memory=100 << 20)
    tuner.next(INLINE, _measure(10.0))
    tuner.next(THREADS, _measure(10.5, work_ms=20.0, cpu_ms=10.0))
    assert tuner.next(PROCESSES, _measure(1.0, rss=200 << 20)) is None
    assert tuner.best() == INLINE and "over the RAM budget" in tuner.summary()


def test_tuner_counts_fewer_workers_when_batches_in_flight_exceed_the_budget():
    """Two batches in flight per worker must fit the RAM budget."""
    tuner = _tuner(cpus=8, memory=4 << 20)
    assert tuner.next(INLINE, _measure(10.0, batch_bytes=1 << 20)) == Choice("thread", 2)


def test_tuner_waiting_code_gets_more_threads_than_cores():
    """Code that waits (I/O, sleep: low CPU/wall) gets up to 4 threads per core."""
    tuner = _tuner(cpus=2)
    assert tuner.next(INLINE, _measure(10.0, cpu_ms=0.5)) == Choice("thread", 8)


def test_tuner_within_ten_percent_keeps_the_cheaper():
    """A slightly faster but costlier candidate is not worth its workers."""
    tuner = _tuner()
    tuner.next(INLINE, _measure(10.0))
    tuner.next(THREADS, _measure(9.5, work_ms=19.0))
    assert tuner.best() == INLINE


def test_tuning_defaults_come_from_the_machine():
    """The CPU budget is the affinity set; the RAM budget a share of available memory."""
    assert tuning.cpu_budget(Tuning()) == len(os.sched_getaffinity(0))
    assert tuning.cpu_budget(Tuning(cpus=3)) == 3
    assert tuning.memory_budget(Tuning(memory_bytes=5)) == 5
    with open("/proc/meminfo", encoding="ascii") as lines:
        available = next(int(line.split()[1]) * 1024 for line in lines
                         if line.startswith("MemAvailable:"))
    share = tuning.memory_budget(Tuning()) / available  # available memory moves a little
    assert abs(share - tuning.MEMORY_SHARE) < 0.05 * tuning.MEMORY_SHARE, share


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [({"cpus": 0}, ValueError, "`cpus`"), ({"memory_bytes": -1}, ValueError, "`memory_bytes`"),
     ({"trial_batches": 0}, ValueError, "`trial_batches`"), ({"every": 1.5}, TypeError, "`every`"),
     ({"trial_seconds": -1}, ValueError, "`trial_seconds`"),
     ({"trial_seconds": "1"}, TypeError, "`trial_seconds`"),
     ({"trial_share": 0}, ValueError, "`trial_share`"),
     ({"trial_share": 1.5}, ValueError, "`trial_share`"),
     ({"trial_share": True}, TypeError, "`trial_share`"),
     ({"trial_share": None}, TypeError, "`trial_share`"),
     ({"decide": 3}, TypeError, "`decide`")],
    ids=["cpus", "memory", "trial", "every", "seconds-negative", "seconds-str", "share-0",
         "share-1.5", "share-bool", "share-none", "decide"],
)
def test_tuning_invalid_raises_naming_field(kwargs, error, fragment):
    """Each invalid field of Tuning is refused on construction."""
    with pytest.raises(error) as info:
        Tuning(**kwargs)
    assert fragment in str(info.value) and "Received:" in str(info.value)


@pytest.mark.parametrize(
    "value", [("thread", 0), ("inline", 2), ("fork", 2), "thread", ("process", 2.0)],
    ids=["thread-0", "inline-2", "unknown", "str", "float"],
)
def test_decide_returning_a_bad_choice_raises_naming_it(value):
    """A decide hook's answer must be a (kind, num_workers) pair it can run."""
    with pytest.raises(ValueError, match=r"Tuning\.decide") as info:
        tuning.parse_decision(value)
    assert repr(value)[:20] in str(info.value)


def test_workers_auto_is_one_value_whatever_its_spelling():
    """Workers('auto') equals Workers(kind='auto'), has no count, and shows its options."""
    assert Workers("auto") == Workers(kind="auto") and Workers("auto").num_workers == 0
    assert repr(Workers("auto")) == "Workers('auto')"
    assert repr(Workers("auto", timeout=2)) == "Workers('auto', timeout=2.0)"
    assert "Tuning(cpus=1" in repr(Workers("auto", options=Tuning(cpus=1)))
