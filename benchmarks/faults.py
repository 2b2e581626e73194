"""Fault injection: kills, stalls and Ctrl-Cs against a real training job, in subprocesses.

    python benchmarks/faults.py [--cases NAME ...] [--quick] [--json PATH]

The job (tests/scripts/fault_job.py) is written the way worker processes must
survive: no ``if __name__ == "__main__":`` guard, TensorFlow imported at the top, its
``map_fn`` and source defined in ``__main__``. It consumes 2 epochs of 96 records
(batches of 8), saving its loader state and the records it consumed after every batch.
Each case starts it in its own process group (as a terminal does), injects the fault,
and measures until every process of the job (the parent and its workers) is gone:

* outcome: how the job ended (``exited (...)``), or ``HUNG`` if any process of it was
  still alive after 60 s (then killed);
* seconds to exit: from the fault (or the stall, for timeouts) to the last process gone;
* processes left, /dev/shm bytes left: what outlived the job (entries named after a job
  process; resumeloader's blocks are anonymous and never have a name);
* records lost / duplicated: the job is then restarted without faults and runs to the
  end; its records are compared with the uninterrupted order (`IndexSampler`).

The ``ctrl-c, plain TensorFlow`` row is a reference: a script that only imports
TensorFlow and sleeps, interrupted the same way (TensorFlow's own exit time).

Two more kinds of rows (issue 19):

* a Keras fit as people write it (tests/_keras_phases.py: two outputs with compiled
  metrics, validation data, EarlyStopping, ReduceLROnPlateau, ModelCheckpoint,
  CSVLogger, ResumeCallback saving every 4 of 8 batches) SIGKILLed once in one phase of
  an epoch by ``kill_and_restart`` and restarted: records lost or duplicated and
  "resumed exactly" from the harness report (same batches, same final weights, same
  stopping epoch) and the CSVLogger rows (one per epoch, equal to the uninterrupted
  run's);
* plain exits (tests/scripts/exit_job.py, forked one at a time by the tests' fork
  server, whose heap is not frozen: each child exits as a fresh ``python script.py``
  would): a script takes 3 batches of ``dataset()`` with 0, thread or process workers
  and ends without ``close()``; seconds from its last line to its end (median and
  slowest), ``HUNG`` if one was still alive after 60 s; beside it the same server's
  exit of a script that only runs a TensorFlow op, as the reference. Measured twice:
  on the machine as it is, then beside 2 CPU-bound processes (``while True: pass``).
  The same script on a local Dask cluster runs as ``python exit_job.py dataset dask``
  (a few times: each one starts its cluster), until every process of it is gone.

``--quick`` runs the reference row, one fault case, one Keras phase and 9 exits of
each kind, to check that everything works.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the job and its runner are shared with the tests

sys.path.insert(0, str(ROOT / "benchmarks"))

import _common  # noqa: E402
import _exits  # noqa: E402
import _faults  # noqa: E402
import _keras_phases  # noqa: E402
import _results  # noqa: E402
from _results import Column, Report, Table, Target  # noqa: E402

from resumeloader.tools import harness  # noqa: E402

# A private mount namespace whose /dev/shm is a 16 MiB tmpfs (Docker's default is 64).
SMALL_SHM = (
    "unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"', "sh"
)


def _kill_group(job: _faults.Job) -> list[int]:
    job.wait_for("batch 5")
    pids = job.pids()
    job.signal_group(signal.SIGKILL)
    return pids


def _kill_parent_in_stall(job: _faults.Job) -> list[int]:
    job.wait_for("stalling")
    time.sleep(0.3)
    pids = job.pids()
    os.kill(job.proc.pid, signal.SIGKILL)
    return pids


def _kill_one_worker(job: _faults.Job) -> list[int]:
    job.wait_for("batch 5")
    pids = job.pids()
    os.kill(pids[-1], signal.SIGKILL)
    return pids


def _ctrl_c_in_stall(job: _faults.Job) -> list[int]:
    job.wait_for("stalling")
    time.sleep(0.3)
    pids = job.pids()
    job.signal_group(signal.SIGINT)
    return pids


def _ctrl_c_mid_epoch(job: _faults.Job) -> list[int]:
    job.wait_for("batch 5", timeout=240)  # a local Dask cluster starts first
    pids = job.pids()
    job.signal_group(signal.SIGINT)
    return pids


def _stall_only(job: _faults.Job) -> list[int]:
    job.wait_for("stalling")
    return job.pids()


Fault = Callable[[_faults.Job], list[int]]
PROCESSES = ("--workers", "2", "--worker-type", "process")
THREADS = ("--workers", "2", "--worker-type", "thread")
# name -> (fault, job options, command wrapper)
CASES: dict[str, tuple[Fault, tuple[str, ...], tuple[str, ...]]] = {
    "SIGKILL process group mid-epoch, 2 process workers, 2 MiB batches": (
        _kill_group, (*PROCESSES, "--record-floats", "65536", "--step-seconds", "0.05"), ()
    ),
    "SIGKILL parent while a worker stalls in map_fn": (
        _kill_parent_in_stall, (*PROCESSES, "--stall", "map"), ()
    ),
    "SIGKILL one worker mid-epoch": (
        _kill_one_worker, (*PROCESSES, "--step-seconds", "0.05"), ()
    ),
    "Ctrl-C, source stalls, 0 workers + prefetch thread": (
        _ctrl_c_in_stall, ("--workers", "0", "--prefetch", "2", "--stall", "source"), ()
    ),
    "Ctrl-C, map_fn stalls, 2 thread workers": (
        _ctrl_c_in_stall, (*THREADS, "--stall", "map"), ()
    ),
    "Ctrl-C, map_fn stalls, 2 process workers": (
        _ctrl_c_in_stall, (*PROCESSES, "--stall", "map"), ()
    ),
    "Ctrl-C, map_fn stalls, dataset(), 2 process workers, worker_timeout=2": (
        _ctrl_c_in_stall, (*PROCESSES, "--stall", "map", "--consume", "dataset",
                           "--timeout", "2"), ()
    ),
    "map_fn stalls, 2 process workers, worker_timeout=2 (no signal)": (
        _stall_only, (*PROCESSES, "--stall", "map", "--timeout", "2"), ()
    ),
    "map_fn stalls, 2 thread workers, worker_timeout=2 (no signal)": (
        _stall_only, (*THREADS, "--stall", "map", "--timeout", "2"), ()
    ),
    "Ctrl-C, map_fn stalls, local Dask cluster of 2 workers": (
        _ctrl_c_in_stall, ("--workers", "2", "--worker-type", "dask", "--stall", "map"), ()
    ),
    "Ctrl-C mid-epoch, dataset(), local Dask cluster of 2 workers": (
        _ctrl_c_mid_epoch, ("--workers", "2", "--worker-type", "dask", "--consume", "dataset",
                            "--step-seconds", "0.05"), ()
    ),
    "32 MiB batches, /dev/shm of 16 MiB (Docker-like), SIGKILL group": (
        _kill_group, (*PROCESSES, "--record-floats", "1048576"), SMALL_SHM
    ),
}


def _outcome(returncode: int | None) -> str:
    if returncode is None:
        return "HUNG"
    if returncode < 0:
        return f"exited ({signal.Signals(-returncode).name})"
    return f"exited (status {returncode})"


COLUMNS = [
    Column("case", "case"), Column("outcome", "outcome"),
    Column("seconds", "seconds to exit", ".2f"), Column("processes", "processes left", "d"),
    Column("shm", "/dev/shm bytes left", "d"), Column("lost", "records lost", "d"),
    Column("duplicated", "records duplicated", "d"), Column("exact", "resumed exactly"),
]


def run_case(name: str, workdir: pathlib.Path) -> dict[str, object]:
    fault, options, wrapper = CASES[name]
    job = _faults.Job(workdir, *options, wrapper=wrapper)
    pids = fault(job)
    outcome = job.finish(pids, timeout=60)
    resumed = _faults.resume(workdir, *options, wrapper=wrapper)
    lost, duplicated = _faults.lost_and_duplicated(_faults.records(workdir))
    exact = _faults.records(workdir) == _faults.reference() and resumed.returncode == 0
    status = _outcome(outcome.returncode) if outcome.exited else "HUNG"
    return {
        "case": name, "outcome": status, "seconds": outcome.seconds,
        "processes": len(outcome.processes_left), "shm": sum(outcome.shm_left.values()),
        "lost": lost, "duplicated": duplicated, "exact": "yes" if exact else "NO",
    }


def baseline() -> dict[str, object]:
    """Ctrl-C on a script that imports TensorFlow and sleeps: TensorFlow's own exit time."""
    code = (
        "import time, tensorflow as tf; tf.constant(1); print('ready', flush=True); "
        "time.sleep(3600)"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True, env=env)
    assert proc.stdout is not None
    proc.stdout.readline()
    time.sleep(0.3)
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=60)
    seconds = time.monotonic() - start
    return {"case": "reference: Ctrl-C, plain TensorFlow script sleeping",
            "outcome": _outcome(proc.returncode), "seconds": seconds, "processes": 0, "shm": 0,
            "lost": "-", "duplicated": "-", "exact": "-"}


# The phases of an epoch of the Keras job (8 steps per epoch) -> its kill point.
KERAS_PHASES = {
    "mid-epoch": "step:11",
    "at its last batch (the save due there waits for the epoch end)": "step:15",
    "during validation": "mark:validation:16",
    "inside another callback's on_epoch_end": "mark:epoch_end:16",
    "during the epoch-end checkpoint write": "save:16",
}


def keras_phase(phase: str, workdir: pathlib.Path) -> dict[str, object]:
    """The Keras job SIGKILLed once at `phase` and restarted, against its reference."""
    point = KERAS_PHASES[phase]
    report = harness.kill_and_restart(
        [sys.executable, _keras_phases.__file__, "outputs"], kill_points=[point],
        workdir=workdir, timeout=600, env={"TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    rows = [_keras_phases.csv_rows(str(workdir / d)) for d in ("reference-ckpt", "resumed-ckpt")]
    once: dict[str, dict[str, str]] = {}
    same_rows = all(once.setdefault(r["epoch"], r) == r for r in rows[1])
    same_rows = same_rows and list(once.values()) == rows[0]
    exact = report.identical and same_rows
    return {
        "case": f"Keras fit (2 outputs, metrics, validation, 4 callbacks) SIGKILLed {phase} "
                f"({point})",
        "outcome": "killed, restarted", "seconds": "-", "processes": "-", "shm": "-",
        "lost": report.records_lost, "duplicated": report.records_duplicated,
        "exact": "yes" if exact else "NO",
    }


@contextlib.contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` CPU-bound processes (``while True: pass``) running until the block ends."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _summary(name: str, picked: list[dict[str, object]]) -> dict[str, object]:
    """A row of exits: how many ended, hung or failed; median and slowest seconds."""
    hung = sum(bool(r["hung"]) for r in picked)
    times = sorted(float(r["seconds"]) for r in picked  # type: ignore[arg-type]
                   if not r["hung"] and r["seconds"] is not None)
    failed = sum(r["returncode"] not in (0, None) for r in picked)
    outcome = f"{len(picked) - hung - failed} exited (status 0)"
    outcome += f", {hung} HUNG" if hung else ""
    outcome += f", {failed} failed" if failed else ""
    seconds = f"{times[len(times) // 2]:.2f} median, {times[-1]:.2f} slowest" if times else "-"
    return {"case": name, "outcome": outcome, "seconds": seconds, "processes": hung,
            "shm": "-", "lost": "-", "duplicated": "-", "exact": "-",
            "slowest": times[-1] if times and not hung else None}


def exit_loop(count: int, dask_count: int, workdir: pathlib.Path, *,
              hogs: int) -> list[dict[str, object]]:
    """`count` exits after ``dataset()`` without ``close()`` (0/thread/process workers,
    in turn) and of a plain TensorFlow script, through the fork server one at a time;
    `dask_count` of the same script on a local Dask cluster; beside `hogs` CPU-bound
    processes."""
    workdir.mkdir(parents=True, exist_ok=True)
    plain = workdir / "plain.py"
    plain.write_text("import tensorflow as tf\ntf.constant(1.0) + 1\nprint('done', flush=True)\n")
    kinds = ("0", "thread", "process")
    jobs = [{"script": str(_exits.SCRIPTS / "exit_job.py"),
             "args": ["dataset", kinds[n % len(kinds)], str(workdir / f"ckpt-{n}")],
             "log": str(workdir / f"{n}.log")} for n in range(count)]
    jobs += [{"script": str(plain), "args": [], "log": str(workdir / f"plain-{n}.log")}
             for n in range(max(3, count // 9))]
    beside = f"beside {hogs} CPU-bound processes" if hogs else "machine as it is"
    with cpu_hogs(hogs):
        results = _exits.run_forked(jobs, workdir=workdir, parallel=1, limit=60.0,
                                    timeout=3600, freeze=False)
        dask = [_exits.spawn(str(_exits.SCRIPTS / "exit_job.py"),
                             ["dataset", "dask", str(workdir / f"dask-{n}")], limit=60.0,
                             log=workdir / f"dask-{n}.log") for n in range(dask_count)]
    for result in dask:  # hung: a process of the cluster outlived the script too
        result["hung"] = result["hung"] or bool(result["left"])
    return [
        _summary(f"exit after dataset() without close(), 0/thread/process workers "
                 f"(x{count}), {beside}", [r for r in results if r["args"]]),
        _summary(f"reference: exit of a TensorFlow script that ran one op (same fork "
                 f"server), {beside}", [r for r in results if not r["args"]]),
        _summary(f"exit after dataset() without close(), local Dask cluster of 2 workers "
                 f"(python exit_job.py, x{dask_count}), {beside}", dask),
    ]


def run(cases: list[str] | None, quick: bool = False) -> Report:
    """The table of every case whose name contains one of `cases` (all if None); with
    `quick`, one fault case, one Keras phase and 18 exits."""
    names = [n for n in CASES if not cases or any(c in n for c in cases)]
    if shutil.which("unshare") is None or os.geteuid() != 0:
        names = [n for n in names if not CASES[n][2]]  # needs root and unshare
    phases = [p for p in KERAS_PHASES if not cases or any(c in p for c in cases)]
    exits = not cases or any("exit" in c for c in cases)
    if quick:
        names, phases = names[:1], phases[:1]
    exit_rows: list[dict[str, object]] = []
    start = _results.load_average()
    table = Table(
        "faults", "Fault injection: what each fault leaves behind", "faults.py",
        "Each fault injected into `tests/scripts/fault_job.py` (2 epochs of 96 records, "
        "batches of 8, its loader state saved after every batch); the job then restarted "
        "and run to the end.",
        COLUMNS, note=f"Python {sys.version.split()[0]}",
    )
    table.add(**baseline())
    with tempfile.TemporaryDirectory(prefix="resumeloader-faults-") as tmp:
        for index, name in enumerate(names):
            table.add(**run_case(name, pathlib.Path(tmp) / str(index)))
            print(" | ".join(map(str, table.rows[-1].values())), file=sys.stderr, flush=True)
        for index, phase in enumerate(phases):
            table.add(**keras_phase(phase, pathlib.Path(tmp) / f"keras-{index}"))
            print(" | ".join(map(str, table.rows[-1].values())), file=sys.stderr, flush=True)
        if exits:
            for hogs in (0, 2):
                exit_rows += exit_loop(9 if quick else 100, 2 if quick else 5,
                                       pathlib.Path(tmp) / f"exits-{hogs}", hogs=hogs)
        for row in exit_rows:
            row = dict(row)
            del row["slowest"]
            table.add(**row)
            print(" | ".join(map(str, table.rows[-1].values())), file=sys.stderr, flush=True)
    return Report([table.finish(start)], _exit_targets(exit_rows))


def _exit_targets(rows: list[dict[str, object]]) -> list[Target]:
    """The slowest exit after ``dataset()`` without ``close()``: <= 2 s on the machine as
    it is, <= 10 s beside 2 CPU-bound processes (a hang counts as not measured)."""
    targets = []
    for row in rows:
        case = str(row["case"])
        if case.startswith("reference"):
            continue
        bound = 10.0 if "CPU-bound" in case else 2.0
        slowest = row["slowest"]
        targets.append(Target(f"slowest {case}", slowest, bound,  # type: ignore[arg-type]
                              unit=" s", at_most=True))
    return targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", nargs="*", help="substrings of the case names to run")
    parser.add_argument("--quick", action="store_true",
                        help="one fault case, one Keras phase, 18 exits: checks it all runs")
    _common.add_json_option(parser)
    args = parser.parse_args()
    timer = _results.Timer(_results.command_line(), quick=args.quick)
    _common.finish(run(args.cases, args.quick), timer, args.json)


if __name__ == "__main__":
    main()
