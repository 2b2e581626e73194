"""Fault injection around `scripts/fault_job.py`: start it, wait for a line, signal it,
measure how it exits and what it leaves behind, resume it and compare the records.

Used by `test_faults.py` (bounded, a few cases) and by `benchmarks/faults.py` (the
table). Every wait has a bound: a job that does not do what is expected fails the
caller instead of hanging it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import pathlib
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time

import _limits
import psutil

from resumeloader import IndexSampler

JOB = pathlib.Path(__file__).parent / "scripts" / "fault_job.py"
NUM_RECORDS, NUM_EPOCHS = 96, 2
#: How long one ``py-spy dump`` of a process left behind may take (TensorFlow's
#: processes are large; the machine may be loaded).
DUMP_SECONDS = 60.0
#: The end of the job's stderr.log shown when a process was left behind.
STDERR_TAIL = 4000


def reference() -> list[int]:
    """The records an uninterrupted run of the job consumes, in order."""
    sampler = IndexSampler(NUM_RECORDS, seed=1, shuffle=True, num_epochs=NUM_EPOCHS)
    return [sampler[i] for i in range(NUM_RECORDS * NUM_EPOCHS)]


def shm_entries() -> dict[str, int]:
    """Name -> size of every entry in /dev/shm."""
    sizes = {}
    for name in os.listdir("/dev/shm"):
        try:
            sizes[name] = os.stat(os.path.join("/dev/shm", name)).st_size
        except FileNotFoundError:
            continue
    return sizes


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie has exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Job:
    """One run of the fault job in its own process group (like a terminal's job)."""

    def __init__(
        self,
        workdir: pathlib.Path,
        *options: str,
        stdin_script: bool = False,
        wrapper: tuple[str, ...] = (),
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.shm_before = shm_entries()
        log = open(workdir / "stderr.log", "a")  # noqa: SIM115 - closed in finish()
        if stdin_script:  # the script read from stdin: `python - WORKDIR ...`
            command = [sys.executable, "-", str(workdir), *options]
            stdin = open(JOB)  # noqa: SIM115
        else:
            command = [sys.executable, str(JOB), str(workdir), *options]
            stdin = subprocess.DEVNULL
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
        # A terminal's job gets Ctrl-C. Started from a shell's background job, the tests
        # ignore SIGINT, and so would the job (Python keeps an inherited SIG_IGN).
        ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        self.proc = subprocess.Popen(
            [*wrapper, *command], stdin=stdin, stdout=subprocess.PIPE, stderr=log, text=True,
            start_new_session=True, env=env, preexec_fn=_default_sigint if ignored else None,
        )
        self._log = log
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def wait_for(self, prefix: str, timeout: float = _limits.START) -> str:
        """The first line starting with `prefix`; AssertionError after `timeout` or at exit."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                msg = f"no line {prefix!r} within {timeout} s: {self.output}"
                raise AssertionError(msg) from None
            if line is None:
                raise AssertionError(f"exited before {prefix!r}: {self.output}")
            self.output.append(line)
            if line.startswith(prefix):
                return line

    def stuck(self, timeout: float = _limits.START) -> None:
        """Waits until the job's main thread sleeps in 5 looks 20 ms apart (a stalled
        job's main thread waits for its next batch; `waits.get` wakes it every 0.1 s). A
        press is then the user's Ctrl-C on a job that stopped moving: it lands in the
        loader's wait. (Sent right after "stalling", it could land in the loop's body,
        still running on the batches made before the stall, and be lost there as
        without the loader: raised in a type check TensorFlow's op dispatcher runs from
        C++ (``batch[:, 0]``), which drops it. 4 jobs of 80 on a loaded machine went on
        waiting; none of 50 pressed once stuck.)"""
        process = psutil.Process(self.proc.pid)  # its status is its main thread's
        deadline, asleep = time.monotonic() + timeout, 0
        while asleep < 5:
            if time.monotonic() > deadline:
                msg = f"the job's main thread did not block within {timeout} s: {self.output}"
                raise AssertionError(msg)
            time.sleep(0.02)
            try:
                sleeping = process.status() == psutil.STATUS_SLEEPING
            except psutil.NoSuchProcess:
                raise AssertionError(f"the job exited before it blocked: {self.output}") from None
            asleep = asleep + 1 if sleeping else 0

    def pids(self) -> list[int]:
        """The job's process and all its descendants, now."""
        root = psutil.Process(self.proc.pid)
        return [self.proc.pid, *(p.pid for p in root.children(recursive=True))]

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def finish(self, pids: list[int], timeout: float = _limits.EXIT) -> Outcome:
        """Waits until every process of `pids` is gone; what the job left behind."""
        start = time.monotonic()
        deadline = start + timeout
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            self.proc.poll()  # reaps our own child
            time.sleep(0.01)
        seconds = time.monotonic() - start
        left = [p for p in pids if alive(p)]
        where = self._where(left) if left else ""
        for pid in left:  # a bounded test never leaves a process behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._log.close()
        while True:
            try:
                line = self.lines.get(timeout=5)
            except queue.Empty:
                break
            if line is None:
                break
            self.output.append(line)
        # Other processes on the machine use /dev/shm too: count what is named after a
        # job process (resumeloader's blocks, in 0.1 and in the file fallback: rl<pid>_...).
        prefixes = tuple(f"rl{p}_" for p in pids)
        leaked = {
            n: s
            for n, s in shm_entries().items()
            if n not in self.shm_before and n.startswith(prefixes)
        }
        return Outcome(self.proc.returncode, seconds, left, leaked, list(self.output), where)

    def _where(self, pids: list[int]) -> str:
        """Where each process of `pids` is (a ``py-spy dump`` of its Python threads, taken
        before it is killed), and the tail of the job's stderr: what a test that finds
        a process left behind shows."""
        spy = shutil.which("py-spy", path=f"{pathlib.Path(sys.executable).parent}{os.pathsep}"
                           f"{os.environ.get('PATH', '')}")
        parts = []
        for pid in pids:
            if spy is None:
                parts.append(f"process {pid} left; no py-spy to show where it is")
                continue
            try:
                dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True,
                                      text=True, timeout=DUMP_SECONDS)
                text = dump.stdout + dump.stderr
            except subprocess.TimeoutExpired:
                text = f"(py-spy dump took more than {DUMP_SECONDS} s)"
            parts.append(f"process {pid} left, py-spy dump:\n{text}")
        self._log.flush()
        log = pathlib.Path(self._log.name)
        tail = log.read_text(errors="replace")[-STDERR_TAIL:] if log.exists() else ""
        parts.append(f"the job's stderr ({log}), its end:\n{tail}")
        return "\n".join(parts)


@dataclasses.dataclass
class Outcome:
    returncode: int | None
    seconds: float
    processes_left: list[int]
    shm_left: dict[str, int]
    output: list[str]
    #: Where the processes left were (py-spy dumps, the job's stderr), or "".
    where: str = ""

    @property
    def exited(self) -> bool:
        return not self.processes_left


def records(workdir: pathlib.Path) -> list[int]:
    """The records the job consumed, from its saved state."""
    path = workdir / "state.json"
    return json.loads(path.read_text())["records"] if path.exists() else []


def lost_and_duplicated(got: list[int]) -> tuple[int, int]:
    """Records of the reference missing from `got`, and records in excess."""
    want, have = collections.Counter(reference()), collections.Counter(got)
    return sum((want - have).values()), sum((have - want).values())


def resume(workdir: pathlib.Path, *options: str, wrapper: tuple[str, ...] = ()) -> Outcome:
    """Runs the job again, without faults, to its end (it resumes from its state)."""
    job = Job(workdir, *options, "--stall", "none", wrapper=wrapper)
    job.wait_for("done", timeout=_limits.PROCESS)
    return job.finish([job.proc.pid])
