"""What every benchmark script shares: the machine line, interleaved timing with medians,
Markdown tables, targets, the user functions, and the contenders resumeloader is
compared with (plain tf.data, the naive split pipeline, grain, the NumPy reference).

Worker processes (resumeloader's and grain's) import this module to unpickle the user
functions, so importing it stays light: NumPy only. TensorFlow, grain and resumeloader
are imported inside the functions that need them.

The contenders are tuned as their documentation recommends for an in-memory source on
this machine: tf.data with ``AUTOTUNE`` parallelism and prefetch (``deterministic=True``,
so that every run yields the same order, as resumeloader does); grain with
``ReadOptions(num_threads=0)`` ("if the data are already loaded in memory, we recommend
setting this to 0") and the same number of worker processes as resumeloader.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import _results
import numpy as np
from _results import Report, Table, Target

__all__ = ["Report", "Table", "Target"]  # re-exported: the scripts take them from here

BATCH = 128
SEED = 0
WARMUP_BATCHES = 4
# Seconds a Python-consumed contender runs per measurement (`--quick` halves it).
BUDGET_SECONDS = 2.0

# -- the machine ---------------------------------------------------------------------


def load_average() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def versions() -> str:
    return _results.describe_machine(_results.machine())


# -- timing ----------------------------------------------------------------------------


# Minor page faults per batch of the last `steady_rate` / `graph_rate` measurement, and
# the median of each contender of the last `interleaved` call (None: not measured).
LAST_FAULTS: float | None = None
FAULTS: dict[str, float | None] = {}
# CPU seconds (all threads) per wall second of the same measurements: ~1.0 means the
# work ran on one core.
LAST_CPU: float | None = None
CPU: dict[str, float | None] = {}
# CPU microseconds per record (`cpu_seconds`: the process, every thread, and its worker
# processes) of the same measurements: the figure a loaded machine leaves stable.
LAST_CPU_US: float | None = None
CPU_US: dict[str, float | None] = {}


def minor_faults() -> int:
    """Minor page faults of this process so far (every thread)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def cpu_seconds() -> float:
    """CPU seconds (user + system) of this process so far: every thread, the worker
    processes it started that still run (psutil, recursively) and those that ended
    (``RUSAGE_CHILDREN``; a worker that ends between two calls moves from the one to
    the other with its whole time, so a difference of two calls stays right)."""
    return own_cpu_seconds() + _live_children_cpu()


def own_cpu_seconds() -> float:
    """`cpu_seconds` without the worker processes still running: two ``getrusage``
    calls, no scan of ``/proc`` (which costs this process 1 to 4 ms of CPU a call)."""
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


# Child processes that stand for something outside the measured system (a storage
# server standing in for a remote one): their CPU time is not the contender's.
_NOT_COUNTED: set[int] = set()


def not_counted(pids: Iterable[int]) -> None:
    """Leaves the processes `pids` (and their descendants) out of `cpu_seconds` from now
    on: children that stand for something outside the measured system."""
    _NOT_COUNTED.update(pids)


def _live_children_cpu() -> float:
    import psutil

    total = 0.0
    skipped: set[int] = set()
    for pid in _NOT_COUNTED:
        try:
            skipped |= {pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))}
        except psutil.NoSuchProcess:
            continue
    for child in psutil.Process().children(recursive=True):
        if child.pid in skipped:
            continue
        try:
            times = child.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # ended meanwhile: counted in RUSAGE_CHILDREN once reaped
        total += times.user + times.system
    return total


def _status_kib(pid: int | str, field: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmHWM``, ``VmRSS``) in KiB, or None."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class PeakRss:
    """Peak resident memory of the process tree while in use: this process's peak
    (``VmHWM``, reset on entry through ``/proc/self/clear_refs`` where the kernel
    allows; else its peak so far) plus each worker process's peak, child processes
    (recursively) read every `interval` seconds by a thread, so that workers that end
    meanwhile (a tuner's trial) count too. A sum of peaks: at least the tree's peak.
    `added` leaves out what this process held on entry (its resident memory then): what
    the code run inside added, the figure to hold against a RAM budget given as a share
    of the memory available then; `bytes` depends on all this process ran before.
    """

    def __init__(self, interval: float = 0.05) -> None:
        self.interval = interval
        self._children: dict[int, int] = {}  # pid -> its largest VmHWM seen (KiB)
        self._own = 0
        self._entry = 0  # this process's resident memory on entry (KiB)
        self._stop: Any = None
        self._thread: Any = None

    def __enter__(self) -> PeakRss:
        import threading

        try:
            with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
                refs.write("5")
        except OSError:
            pass  # an older kernel or a sandbox: the peak since the process started
        self._entry = _status_kib("self", "VmRSS") or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="bench-peak-rss", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        import psutil

        for child in psutil.Process().children(recursive=True):
            if child.pid in _NOT_COUNTED:
                continue
            peak = _status_kib(child.pid, "VmHWM")
            if peak is not None:
                # The latest reading, not the largest: VmHWM only grows within a program,
                # but a child read between its fork and its exec shows its parent's
                # pages (a worker process at 922 MiB instead of 184, once in 8 rounds).
                self._children[child.pid] = peak
        self._own = max(self._own, _status_kib("self", "VmHWM") or 0)

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def stop_watching(self) -> None:
        """Stops the sampling thread after one last sample: the processes that may end
        (a tuner's trials) are over, and the kernel keeps the peaks of those still
        running (``VmHWM``, read on exit). The thread's reads hold the GIL ~20 times a
        second: what is timed after this does not pay for them."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join()
        self._sample()

    def __exit__(self, *exc: Any) -> None:
        self.stop_watching()

    @property
    def bytes(self) -> int:
        """This process's peak plus every worker process's, in bytes."""
        return (self._own + sum(self._children.values())) * 1024

    @property
    def added(self) -> int:
        """`bytes` less this process's resident memory on entry: this process's peak
        above it plus every worker process's peak, in bytes."""
        return (max(0, self._own - self._entry) + sum(self._children.values())) * 1024


class Meter:
    """Measures a timed part: minor faults per batch, CPU per wall second and CPU
    microseconds per record (`cpu_seconds`), into `LAST_FAULTS`, `LAST_CPU`, `LAST_CPU_US`."""

    def __enter__(self) -> Meter:
        self.faults, self.cpu, self.wall = minor_faults(), cpu_seconds(), time.perf_counter()
        return self

    def done(self, batches: int, records: int | None = None) -> None:
        """Ends the measurement of `batches` batches holding `records` records."""
        global LAST_FAULTS, LAST_CPU, LAST_CPU_US
        wall = time.perf_counter() - self.wall
        cpu = cpu_seconds() - self.cpu
        LAST_FAULTS = (minor_faults() - self.faults) / max(batches, 1)
        LAST_CPU = cpu / wall if wall > 0 else None
        LAST_CPU_US = cpu * 1e6 / records if records else None

    def __exit__(self, *exc: Any) -> None:
        pass


def cpu_us(name: str) -> float | None:
    """The median CPU microseconds per record of contender `name` in the last
    `interleaved` call (None: not measured)."""
    return CPU_US.get(name)


def cpu_ratio(name: str, reference: str) -> float | None:
    """How many times less CPU per record contender `name` spent than `reference` (a
    speed ratio like ``rate / reference rate``, from the last `interleaved` call)."""
    ours, theirs = CPU_US.get(name), CPU_US.get(reference)
    return None if not ours or theirs is None else theirs / ours


def records_rate(work: Callable[[], int], batches: int = 1) -> float:
    """Records/s of one ``work()`` call, which returns the records it handled; its
    `Meter` figures (CPU microseconds per record, ...) go to the ``LAST_*`` values."""
    with Meter() as meter:
        start = time.perf_counter()
        records = work()
        seconds = time.perf_counter() - start
        meter.done(batches, records)
    return records / seconds


def interleaved(contenders: dict[str, Callable[[], float]], rounds: int,
                warmup: int = 0, *, alternate: bool = False) -> dict[str, float]:
    """The median of `rounds` measurements of each contender (each returns e.g. records/s),
    after `warmup` rounds whose measurements are dropped.

    A round runs every contender once, in turn, so a burst of load on a shared machine
    hits all of them alike instead of one. With `alternate`, every other round runs them
    in reverse order: a contender run right after a similar one finds its data and code
    in the caches, which is worth a few percent to a cheap loop — two near-equal
    contenders (a switch on and off) are then each run second as often as first. The
    medians of the faults per batch, the CPU use and the CPU microseconds per record
    that a contender's `Meter` measured (`steady_rate`, `graph_rate`, `records_rate`,
    `per_call_us`, ...) go to `FAULTS`, `CPU` and `CPU_US`.
    """
    global LAST_FAULTS, LAST_CPU, LAST_CPU_US
    samples: dict[str, list[float]] = {name: [] for name in contenders}
    extras: dict[str, dict[str, list[float]]] = {
        kind: {name: [] for name in contenders} for kind in ("faults", "cpu", "cpu_us")}
    for _ in range(warmup):
        for measure in contenders.values():
            measure()
    for number in range(rounds):
        order = list(contenders.items())
        for name, measure in order[::-1] if alternate and number % 2 else order:
            LAST_FAULTS = LAST_CPU = LAST_CPU_US = None
            samples[name].append(measure())
            for kind, value in (("faults", LAST_FAULTS), ("cpu", LAST_CPU),
                                ("cpu_us", LAST_CPU_US)):
                if value is not None:
                    extras[kind][name].append(value)
            extra = "" if LAST_FAULTS is None else f" ({LAST_FAULTS:.1f} faults/batch)"
            extra += "" if LAST_CPU_US is None else f" ({LAST_CPU_US:,.2f} CPU us/record)"
            print(f"  {name}: {samples[name][-1]:,.1f}{extra}", file=sys.stderr, flush=True)
    for kind, medians in (("faults", FAULTS), ("cpu", CPU), ("cpu_us", CPU_US)):
        for name, values in extras[kind].items():
            medians[name] = statistics.median(values) if values else None
    return {name: statistics.median(values) for name, values in samples.items()}


def _settled(step: float = 0.02, idle: float = 0.1, limit: float = 1.0) -> float:
    """`own_cpu_seconds` once the process's threads have stopped working: the first time
    a `step` s sleep costs under `idle` x `step` of CPU (`limit` s at most). Read without
    a ``/proc`` scan: with one (`cpu_seconds`) the check's own CPU, 1 to 4 ms, was as much
    as its threshold (2 ms), and on a loaded machine it went on to its limit."""
    last = own_cpu_seconds()
    deadline = time.perf_counter() + limit
    while time.perf_counter() < deadline:
        time.sleep(step)
        now = own_cpu_seconds()
        if now - last < idle * step:
            return now
        last = now
    return last


def _batches_taking(run: Callable[[int], int], seconds: float) -> int:
    """The batches one ``run(batches)`` call takes about `seconds` for, from calls of 1,
    2, 4, ... batches until one takes a quarter of it. (Not by counting ``run(1)`` calls:
    a call's own cost, ~0.4 ms for the graph path's ``tf.function`` against ~70 us a
    batch, made that path's slices 7x shorter than `seconds`.)"""
    batches = 1
    while True:
        begin = time.perf_counter()
        run(batches)
        took = time.perf_counter() - begin
        if took >= seconds / 4:
            return max(1, round(batches * seconds / took))
        batches *= 2


def paired(contenders: dict[str, Callable[[], Callable[[int], int]]], rounds: int,
           slice_seconds: float = 0.02) -> dict[str, tuple[list[float], list[float]]]:
    """CPU and wall microseconds per record of contenders kept live side by side, a value
    per round each (compare them round by round: see `round_ratio`).

    ``contenders[name]()`` starts one (a loader and its iterator) and returns
    ``run(batches)``, which consumes that many batches and returns their records. Every
    contender is started first, warmed up (WARMUP_BATCHES plus a calibration that picks
    the batches a slice of about `slice_seconds` takes), then the rounds alternate their
    slices (every other round in reverse order). Unlike `interleaved` with a fresh
    loader per measurement, no contender's start-up, closing or garbage lands in
    another's measured slice, and both sides of a switch run in the same warm process:
    what is left between them is what the switch costs.

    A contender's prefetch keeps producing after its slice until its buffers are full
    again: a slice's CPU time is read once the process's threads have settled
    (`_settled`; worker processes are not waited for: table (f) runs none), so it holds
    the refill of what the slice took from the buffers and no other contender's; its
    wall time ends with its last batch. What the measuring costs stays out of it: the
    scan for worker processes' CPU time is done before the slice's first reading and
    after its last. Every contender runs the same number of batches per slice (the
    median of their calibrations): a cost per slice (the settling's clock reads and
    sleeps) weighs on each record alike (one calibrated first, in a colder process, got
    a third fewer batches).
    """
    runs = {name: start() for name, start in contenders.items()}
    calibrated: list[int] = []
    for run in runs.values():
        run(WARMUP_BATCHES)
        calibrated.append(_batches_taking(run, slice_seconds))
    size = int(statistics.median(calibrated))
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    wall: dict[str, list[float]] = {name: [] for name in runs}
    order = list(runs)
    for number in range(rounds):
        for name in order[::-1] if number % 2 else order:
            workers = _live_children_cpu()
            before, start = own_cpu_seconds(), time.perf_counter()
            records = runs[name](size)
            wall[name].append((time.perf_counter() - start) * 1e6 / records)
            spent = _settled() - before + _live_children_cpu() - workers
            cpu[name].append(spent * 1e6 / records)
    for name in runs:
        print(f"  {name}: {statistics.median(cpu[name]):,.3f} CPU us/record", file=sys.stderr,
              flush=True)
    return {name: (cpu[name], wall[name]) for name in runs}


def round_ratio(these: list[float], those: list[float]) -> float:
    """The median over rounds of ``these[i] / those[i]``: two contenders of `paired`
    compared slice by slice. What the machine does moves both slices of a round alike
    (they run one after the other): in an idle process of TensorFlow's graph path a
    slice's CPU per record wanders by tens of percent between slices of 0.25 s and
    back within seconds. Pairs of two loaders of one setting (A/A), sd of their ratios:
    on that path 3.7-5.1% by the medians of 10 slices, 1.4-1.9% by the median of 60
    rounds' ratios of 20-ms slices; on the `for batch in loader` paths 0.2-0.9% by the
    rounds' ratios, 0.2-4.7% by the medians of the same slices."""
    return statistics.median(a / b for a, b in zip(these, those, strict=True))


# -- the malloc regime ----------------------------------------------------------------

# glibc's mallopt parameters.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: TensorFlow's value (GeneratorDatasetOp, once per process, at the first iterator of a
#: ``from_generator`` dataset).
TF_MMAP_THRESHOLD = 128 << 10
#: What "healthy" sets: large allocations come from the heap and are reused, as with
#: glibc's dynamic threshold after a few frees (its maximum is 32 MiB on 64 bits).
HEALTHY_MMAP_THRESHOLD = 32 << 20


def _mallopt(param: int, value: int) -> bool:
    import ctypes

    try:
        return bool(ctypes.CDLL(None).mallopt(param, value))
    except (OSError, AttributeError):  # not glibc
        return False


def set_mmap_threshold(nbytes: int) -> bool:
    """Sets glibc's mmap threshold (and a trim threshold twice it) for the process."""
    return _mallopt(_M_MMAP_THRESHOLD, nbytes) and _mallopt(_M_TRIM_THRESHOLD, 2 * nbytes)


#: Whether this process is in TensorFlow's regime (`apply_tensorflow_patch` ran): the
#: regime is known from what was set, not probed (a probe depends on the heap's state).
TF_PATCHED = False


def apply_tensorflow_patch() -> None:
    """Iterates a ``from_generator`` dataset: TensorFlow sets malloc's mmap threshold to
    128 KiB for the process, as in every job that calls ``dataset()`` or Keras ``fit``."""
    global TF_PATCHED
    import tensorflow as tf

    ds = tf.data.Dataset.from_generator(
        lambda: iter([0]), output_signature=tf.TensorSpec((), tf.int32))
    for _ in ds:
        pass
    TF_PATCHED = True


def malloc_regime() -> str:
    """The process's malloc regime now, in words (`_results.malloc_probe`)."""
    return _results.describe_malloc(_results.malloc_probe())


class healthy_malloc:
    """Within it, glibc's mmap threshold is `HEALTHY_MMAP_THRESHOLD`; on exit it is
    TensorFlow's 128 KiB again, the heap trimmed, if the process was in TensorFlow's
    regime (`TF_PATCHED`)."""

    def __enter__(self) -> healthy_malloc:
        set_mmap_threshold(HEALTHY_MMAP_THRESHOLD)
        return self

    def __exit__(self, *exc: Any) -> None:
        if TF_PATCHED:
            set_mmap_threshold(TF_MMAP_THRESHOLD)
            _malloc_trim()  # the heap back to what TensorFlow's regime leaves


def _malloc_trim() -> None:
    import contextlib
    import ctypes

    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


def healthy(measure: Callable[[], float]) -> Callable[[], float]:
    """`measure`, run with `healthy_malloc`."""

    def run() -> float:
        with healthy_malloc():
            return measure()

    return run


def _records(batch: Any) -> int:
    while isinstance(batch, (tuple, list)):
        batch = batch[0]
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    return int(np.shape(batch)[0])


def steady_rate(make: Callable[[], Iterable[Any]], share: float = 1.0,
                warm_seconds: float = 0.0) -> float:
    """Records/s of a fresh iteration of ``make()`` after its first WARMUP_BATCHES batches
    and `warm_seconds` more (start-up excluded), consumed in Python for `share` x
    BUDGET_SECONDS at most."""
    budget = share * BUDGET_SECONDS
    iterator = iter(make())
    for _ in range(WARMUP_BATCHES):
        next(iterator)
    warm = time.perf_counter() + warm_seconds
    while time.perf_counter() < warm:
        next(iterator)
    count, batches = 0, 0
    with Meter() as meter:
        start = time.perf_counter()
        for batch in iterator:
            count += _records(batch)
            batches += 1
            del batch  # its memory may go back to a pool before the next one is made
            if time.perf_counter() - start > budget:
                break
        seconds = time.perf_counter() - start
        meter.done(batches, count)
    return count / seconds


def graph_puller(dataset: Any, *, loader: Any = None) -> Callable[[int], int]:
    """``run(batches)``: pulls that many batches from one live iterator of `dataset` in a
    ``tf.function`` (as Keras' train step does), advancing `loader` (if given) after each;
    returns their records."""
    import tensorflow as tf

    @tf.function
    def pull(iterator: Any, count: tf.Tensor) -> tf.Tensor:
        records = tf.constant(0, tf.int64)
        for _ in tf.range(count):
            batch = next(iterator)
            records += tf.shape(tf.nest.flatten(batch)[0], out_type=tf.int64)[0]
            if loader is not None:
                loader.advance(after=batch)
        return records

    iterator = iter(dataset)

    def run(batches: int) -> int:
        return int(pull(iterator, tf.constant(batches)))

    return run


def graph_rate(dataset: Any, batches: int, *, loader: Any = None) -> float:
    """Records/s of `batches` batches pulled from an iterator of `dataset` inside a
    ``tf.function`` (as Keras' train step does), after WARMUP_BATCHES; `loader`, if
    given, is advanced after each batch. `dataset` must not end before."""
    run = graph_puller(dataset, loader=loader)
    run(WARMUP_BATCHES)
    with Meter() as meter:
        start = time.perf_counter()
        records = run(batches)
        seconds = time.perf_counter() - start
        meter.done(batches, records)
    return records / seconds


# -- user code -------------------------------------------------------------------------

# Iterations of pure-Python arithmetic in `burn_python`. `calibrate_burn` sets them for
# ~50 us on the machine at hand and passes them to worker processes (which import this
# module afresh) through the environment.
_BURN_VARIABLE = "RESUMELOADER_BENCH_BURN_ITERATIONS"
BURN_ITERATIONS = int(os.environ.get(_BURN_VARIABLE, "700"))


def _burn() -> int:
    total = 0
    for i in range(BURN_ITERATIONS):
        total += i * i % 7
    return total


def burn_python(record: np.ndarray, rng: Any = None) -> np.ndarray:
    """GIL-bound work: pure-Python arithmetic, then a tiny NumPy op."""
    return record + np.float32(_burn() % 3)


def calibrate_burn(target_us: float = 50.0) -> float:
    """Sets BURN_ITERATIONS (here and in processes started afterwards) so that
    `burn_python` takes about `target_us`; returns the cost measured after."""
    global BURN_ITERATIONS
    record = np.zeros(16, np.float32)
    cost = per_call_us(burn_python, record, 500)
    BURN_ITERATIONS = max(1, round(BURN_ITERATIONS * target_us / cost))
    os.environ[_BURN_VARIABLE] = str(BURN_ITERATIONS)
    return per_call_us(burn_python, record, 500)


def burn_pair(record: tuple[np.ndarray, Any], rng: Any = None) -> tuple[np.ndarray, Any]:
    """`burn_python` on the features of a (features, label) record."""
    return burn_python(record[0]), record[1]


def numpy_work(record: np.ndarray, rng: Any = None) -> np.ndarray:
    """GIL-releasing work: matrix products and a ufunc on a 64x64 float32 record."""
    product = np.tanh(record @ record.T)
    return (product @ record @ product.T).astype(np.float32)


def identity(record: Any, rng: Any = None) -> Any:
    """A ``map_fn`` that does nothing: what remains is the loader's own cost."""
    return record


def per_call_us(fn: Callable[..., Any], argument: Any, calls: int = 2_000) -> float:
    """Median over 5 runs of the time of one ``fn(argument)`` call, in microseconds; the
    median CPU microseconds per call (`cpu_seconds`) goes to `LAST_CPU_US`."""
    global LAST_CPU_US
    runs, cpus = [], []
    for _ in range(5):
        cpu, start = cpu_seconds(), time.perf_counter()
        for _ in range(calls):
            fn(argument)
        runs.append((time.perf_counter() - start) / calls * 1e6)
        cpus.append((cpu_seconds() - cpu) / calls * 1e6)
    LAST_CPU_US = statistics.median(cpus)
    return statistics.median(runs)


class RangeSource:
    """`num_records` virtual records; record i is the int64 i. Has `read_batch`."""

    def __init__(self, num_records: int) -> None:
        self.num_records = num_records

    def __len__(self) -> int:
        return self.num_records

    def __getitem__(self, index: int) -> np.int64:
        return np.int64(index)

    def read_batch(self, indices: np.ndarray) -> np.ndarray:
        return np.asarray(indices, dtype=np.int64)


class RecordSource:
    """Arrays (a tuple of equal-length arrays or one array) read one record at a time:
    what grain's DataLoader and the naive split pipeline read."""

    def __init__(self, arrays: Any) -> None:
        self.arrays = arrays

    def __len__(self) -> int:
        return len(self.arrays[0] if isinstance(self.arrays, tuple) else self.arrays)

    def __getitem__(self, index: int) -> Any:
        if isinstance(self.arrays, tuple):
            return tuple(a[index] for a in self.arrays)
        return self.arrays[index]


def cifar_like(num_records: int) -> tuple[np.ndarray, np.ndarray]:
    """`num_records` random 32x32x3 uint8 images and int64 labels."""
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (num_records, 32, 32, 3), dtype=np.uint8)
    return images, rng.integers(0, 10, num_records).astype(np.int64)


# -- contenders --------------------------------------------------------------------------


def plain_tf(arrays: Any, fn: Any = None, *, shuffle_buffer: int | None = None) -> Any:
    """An endless plain tf.data pipeline: ``from_tensor_slices(arrays).shuffle(buffer)
    [.map(numpy_function(fn), AUTOTUNE)].batch(BATCH, AUTOTUNE).prefetch(AUTOTUNE)``.

    `shuffle_buffer` None shuffles the whole source (a uniform permutation, like
    resumeloader's); a smaller buffer is faster and shuffles less.
    """
    import tensorflow as tf

    first = arrays[0] if isinstance(arrays, tuple) else arrays
    buffer = len(first) if shuffle_buffer is None else shuffle_buffer
    ds = tf.data.Dataset.from_tensor_slices(arrays).shuffle(buffer, seed=SEED).repeat()
    if fn is not None:
        spec = tf.TensorSpec(first.shape[1:], tf.as_dtype(first.dtype))

        def call(x: Any) -> Any:
            y = tf.numpy_function(fn, [x], spec.dtype, stateful=False)
            return tf.ensure_shape(y, spec.shape)

        ds = ds.map(call, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.batch(BATCH, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return ds.prefetch(tf.data.AUTOTUNE)


def naive_split(arrays: Any) -> Any:
    """The common workaround (README, "Why"): a checkpointed tf.data index iterator feeding
    ``from_generator``, batched and prefetched (it loses records on restore)."""
    import tensorflow as tf

    source = RecordSource(arrays)
    indices = iter(tf.data.Dataset.range(len(source)).shuffle(len(source), seed=SEED).repeat())
    record = source[0]
    spec = tf.nest.map_structure(
        lambda a: tf.TensorSpec(np.shape(a), tf.as_dtype(np.asarray(a).dtype)), record
    )
    ds = tf.data.Dataset.from_generator(
        lambda: (source[int(i)] for i in indices), output_signature=spec
    )
    return ds.batch(BATCH, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def grain_flags() -> None:
    """Marks absl's flags parsed, as an ``absl.app`` program has them: grain's
    ``DataLoader`` with worker processes reads its flags (worker profiling) and raises
    ``UnparsedFlagAccessError`` in a plain script otherwise (grain 0.2.18)."""
    from absl import flags

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()


def grain_loader(arrays: Any, operation: Any = None, workers: int = 0) -> Iterable[Any]:
    """grain's checkpointable ``DataLoader`` over the records, `workers` processes,
    ``ReadOptions(num_threads=0)`` as grain recommends for in-memory data."""
    import grain.python as grain

    grain_flags()

    source = RecordSource(arrays)
    sampler = grain.IndexSampler(
        len(source), shard_options=grain.NoSharding(), shuffle=True, num_epochs=None, seed=SEED
    )
    operations = [] if operation is None else [operation]
    return grain.DataLoader(
        data_source=source,
        sampler=sampler,
        operations=[*operations, grain.Batch(BATCH)],
        worker_count=workers,
        read_options=grain.ReadOptions(num_threads=0),
    )


def grain_dataset(arrays: Any) -> Iterable[Any]:
    """grain's ``MapDataset`` API: ``source(...).shuffle(seed).repeat().batch(BATCH)``."""
    import grain

    return grain.MapDataset.source(RecordSource(arrays)).shuffle(seed=SEED).repeat().batch(BATCH)


def numpy_reference(arrays: Any) -> Iterator[Any]:
    """The physical reference: a NumPy permutation per epoch and one fancy-index per
    array per batch, in the consumer's thread."""
    leaves = arrays if isinstance(arrays, tuple) else (arrays,)
    rng = np.random.default_rng(SEED)
    while True:
        order = rng.permutation(len(leaves[0]))
        for start in range(0, len(order), BATCH):
            batch = order[start : start + BATCH]
            yield tuple(leaf[batch] for leaf in leaves)


def numpy_take_reference(arrays: Any) -> Iterator[Any]:
    """The NumPy loop without allocation: a permutation per epoch and one ``np.take``
    per array per batch into a batch allocated once (``mode="clip"``: unbuffered)."""
    leaves = arrays if isinstance(arrays, tuple) else (arrays,)
    rng = np.random.default_rng(SEED)
    outs = [np.empty((BATCH, *leaf.shape[1:]), leaf.dtype) for leaf in leaves]
    while True:
        order = rng.permutation(len(leaves[0]))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            batch = order[start : start + BATCH]
            for leaf, out in zip(leaves, outs, strict=True):
                np.take(leaf, batch, axis=0, out=out, mode="clip")
            yield tuple(outs)


def copy_bandwidth(size: int = 1 << 28) -> float:
    """Bytes/s of one ``memcpy`` of `size` bytes (the best of 3): no input pipeline can
    deliver records faster than this divided by their size."""
    src, dst = np.ones(size, np.uint8), np.empty(size, np.uint8)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return size / best


def parallel_capacity(count: int = 4_000) -> float:
    """How many CPUs' worth of Python work two processes get right now (2.0 on an idle
    2-core machine): the ceiling for any 2-worker speed-up measured at the same time."""
    import multiprocessing

    alone = burn_for(count)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(burn_for, [10, 10])  # start-up outside the measurement
        start = time.perf_counter()
        pool.map(burn_for, [count, count])
        together = time.perf_counter() - start
    return 2 * alone / together


def burn_for(count: int) -> float:
    """Runs `burn_python` `count` times; returns the wall time it took."""
    record = np.zeros(16, np.float32)
    start = time.perf_counter()
    for _ in range(count):
        burn_python(record)
    return time.perf_counter() - start


def script_main(run: Callable[[bool], Report], doc: str, quick_help: str) -> None:
    """The command line of a benchmark script: ``--quick`` and ``--json``; prints its
    tables and targets and writes them to ``results/<script>.json``."""
    global BUDGET_SECONDS
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    add_json_option(parser)
    args = parser.parse_args()
    BUDGET_SECONDS = 1.0 if args.quick else BUDGET_SECONDS
    timer = _results.Timer(_results.command_line(), args.quick)
    finish(run(args.quick), timer, args.json)


def add_json_option(parser: argparse.ArgumentParser) -> None:
    script = Path(sys.argv[0]).stem
    parser.add_argument("--json", type=Path, default=_results.RESULTS / f"{script}.json",
                        help="where to write the results as JSON (default: %(default)s)")


def main_with_sections(description: str, run: Callable[[bool, str], Report], sections: str,
                       quick_help: str) -> None:
    """The command line of a script whose tables are sections (``--sections ab``):
    ``--quick`` (`quick_help`; one second per measurement), ``--sections``, ``--json``;
    runs ``run(quick, sections)`` and finishes its report (`finish`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--sections", default=sections,
                        help=f"which tables, e.g. {sections[0]!r}")
    add_json_option(parser)
    args = parser.parse_args()
    global BUDGET_SECONDS
    BUDGET_SECONDS = 1.0 if args.quick else BUDGET_SECONDS
    timer = _results.Timer(_results.command_line(), args.quick)
    finish(run(args.quick, args.sections), timer, args.json)


def finish(report: Report, timer: _results.Timer, path: Path) -> None:
    """Prints the report's tables and targets (judged by the run's load: `_results.judge`);
    writes them with the run to `path`."""
    run = timer.run()
    _results.judge(report.targets, run)
    print(report.markdown)
    if report.targets:
        print()
        print(_results.targets_table(report.targets))
    written = _results.write(path, report, run)
    print(f"\nResults written to {written}.", file=sys.stderr)
