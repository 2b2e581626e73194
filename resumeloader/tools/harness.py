"""`kill_and_restart`: SIGKILL a training command at chosen steps, restart it.

The command runs as a subprocess with ``RESUMELOADER_TRACE`` (a fresh trace file
per process), ``RESUMELOADER_CKPT_DIR`` (one directory shared by the killed and
restarted processes; the reference run gets its own) and, for a process that is to
be killed, ``RESUMELOADER_PAUSE_AT``. The recorder stops the process exactly at
that point and the runner sends it a real SIGKILL. The last process runs to the
end; `_report` stitches the traces and compares them with an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from resumeloader import errors
from resumeloader.tools import quiet
from resumeloader.tools import report as report_lib
from resumeloader.tools import trace as trace_lib

__all__ = ["kill_and_restart"]

_POLL_SECONDS = 0.01


@dataclasses.dataclass
class _Process:
    """One run of the command and the trace it is writing."""

    name: str
    popen: subprocess.Popen[bytes]
    trace_path: Path
    log_path: Path
    pause_at: str | None
    deadline: float
    wait_for_pause: bool = True
    trace: trace_lib.Trace = dataclasses.field(default_factory=trace_lib.Trace)
    killed: bool = False
    _offset: int = 0
    _partial: bytes = b""

    def poll_events(self) -> list[dict[str, Any]]:
        """The trace events written since the last call (complete lines only)."""
        try:
            with open(self.trace_path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        events = []
        for line in lines:
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
        for event in events:
            self.trace.add(event)
        return events

    def log_tail(self, num_lines: int = 15) -> str:
        """The last lines of the process's output (without TensorFlow's start-up lines)."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        lines = [line for line in lines if not quiet.is_startup_line(line)]
        return "\n".join(lines[-num_lines:])

    def kill_when(self, event: dict[str, Any]) -> bool:
        """True when `event` shows the process reached its kill point."""
        if self.pause_at is None:
            return False
        if self.wait_for_pause:
            return event.get("event") == "pause" and event.get("point") == self.pause_at
        return event.get("event") == "step" and event["step"] >= trace_lib.parse_point(
            self.pause_at
        )[1]

    def outcome(self) -> report_lib.RunOutcome:
        """What this process did, for the report."""
        crashed = not self.killed and self.popen.returncode != 0
        return report_lib.RunOutcome(
            name=self.name,
            trace=self.trace,
            pause_at=self.pause_at,
            killed=self.killed,
            returncode=self.popen.returncode,
            log_tail=self.log_tail() if crashed else "",
        )

    def kill(self) -> None:
        # The whole process group: a wrapper script's children die with it, as on preemption.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        self.killed = True


def _spawn(
    command: Sequence[str],
    *,
    name: str,
    workdir: Path,
    ckpt_dir: Path,
    env: Mapping[str, str] | None,
    pause_at: str | None,
    timeout: float,
    pause: bool,
) -> _Process:
    trace_path = workdir / f"{name}.trace.jsonl"
    log_path = workdir / f"{name}.log"
    full_env = {"TF_CPP_MIN_LOG_LEVEL": "2", **os.environ, **(env or {})}
    full_env[trace_lib.ENV_TRACE] = str(trace_path)
    full_env[trace_lib.ENV_CKPT_DIR] = str(ckpt_dir)
    full_env.pop(trace_lib.ENV_PAUSE_AT, None)
    if pause_at is not None and pause:
        full_env[trace_lib.ENV_PAUSE_AT] = pause_at
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    args = [a.replace("{ckpt_dir}", str(ckpt_dir)).replace("{trace}", str(trace_path))
            for a in command]
    with open(log_path, "wb") as log:
        try:
            popen = subprocess.Popen(
                args, env=full_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as err:
            msg = f"Cannot start the training command {args!r}: {err}"
            raise errors.HarnessError(msg) from err
    return _Process(
        name, popen, trace_path, log_path, pause_at, time.monotonic() + timeout, pause
    )


def _watch(
    procs: list[_Process],
    on_event: Callable[[str, dict[str, Any]], None] | None,
    *,
    until: _Process | None = None,
) -> None:
    """Polls `procs` until `until` (or every one) ended, killing each at its kill point.

    On any error (a timeout, an exception in `on_event`, Ctrl-C) every process still
    running is killed: they run in their own sessions and would outlive the harness.
    """
    try:
        while True:
            for proc in procs:
                _poll(proc, on_event)
            waited = [until] if until is not None else procs
            if all(p.killed or p.popen.returncode is not None for p in waited):
                return
            time.sleep(_POLL_SECONDS)
    except BaseException:
        for proc in procs:
            if proc.popen.poll() is None:
                proc.kill()
        raise


def _poll(proc: _Process, on_event: Callable[[str, dict[str, Any]], None] | None) -> None:
    if proc.killed or proc.popen.returncode is not None:
        return
    exited = proc.popen.poll() is not None  # before reading: the read then gets every event
    for event in proc.poll_events():
        if not proc.killed and not exited and proc.kill_when(event):
            proc.kill()
        if on_event is not None:  # after the kill: a pause event means it is dead
            on_event(proc.name, event)
    if not (proc.killed or exited) and time.monotonic() > proc.deadline:
        msg = (
            f"The training command ({proc.name}) did not finish within the timeout. "
            f"Last lines of its output ({proc.log_path}):\n{proc.log_tail()}"
        )
        raise errors.HarnessError(msg)


def check_points(kill_points: Sequence[str | int]) -> list[str]:
    """The kill points as ``kind:step`` strings sorted by step; ValueError if malformed."""
    points = [f"step:{p}" if isinstance(p, int) else str(p) for p in kill_points]
    parsed = sorted((trace_lib.parse_point(p)[1], p) for p in points)
    steps = [step for step, _ in parsed]
    if len(set(steps)) != len(steps):
        msg = f"Kill points must be at distinct steps. Received: {points}."
        raise ValueError(msg)
    return [p for _, p in parsed]


def kill_and_restart(
    command: Sequence[str],
    *,
    kill_points: Sequence[str | int] | None = None,
    kills: int = 3,
    seed: int | None = None,
    workdir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 600.0,
    pause: bool = True,
    parallel: bool = False,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
) -> report_lib.ResumeReport:
    """Runs `command` uninterrupted and killed-and-restarted, and compares the two.

    The command must follow the recorder contract (see `TraceRecorder`): record
    every step, call ``commit(step)`` after each checkpoint save, and resume from
    the newest checkpoint of ``RESUMELOADER_CKPT_DIR``. ``{ckpt_dir}`` and
    ``{trace}`` in `command` are replaced by those paths.

    Args:
        command: the training command, e.g. ``[sys.executable, "train.py"]``.
        kill_points: where to kill, in order: ``"step:k"`` (right after step k),
            ``"commit:k"`` (right after the checkpoint of steps 0..k-1 was saved),
            ``"save:k"`` (inside that save, before the manager records it) or
            ``"mark:NAME:k"`` (at the script's ``recorder.mark(NAME)`` once k steps
            ran, e.g. during validation); an int k means ``"step:k"``. Points must lie
            at distinct steps. When None, `kills` random steps are chosen once the
            reference run's length is known.
        kills: the number of random kill points when `kill_points` is None.
        seed: seeds the random kill points.
        workdir: where traces (``<name>.trace.jsonl``), logs (``<name>.log``) and
            checkpoints (``reference-ckpt/``, ``resumed-ckpt/``) go; a new temporary
            directory, which is kept, when None.
        env: extra environment variables for the command.
        timeout: seconds each process may run.
        pause: True (exact): the recorder stops the process at its kill point and it
            is killed there. False: the process runs on and is killed as soon as the
            harness sees the trace reach the point's step (only ``step:k`` is
            meaningful; the kill lands a little later, wherever the process is, e.g.
            inside a save).
        parallel: run the uninterrupted process alongside the killed and restarted
            ones (given `kill_points`): about half the time, but two training
            processes at once, each with its memory, CPU and GPU share (and workers).
            By default the uninterrupted run ends before the first attempt starts.
        on_event: called with (process name, trace event) as events arrive, e.g. for
            progress; for a ``pause`` event the process has been killed already.
            Process names are ``reference`` and ``attempt-0``, ``attempt-1``, ...

    Returns:
        A `ResumeReport`; ``report.identical`` is True only when the stitched
        resumed run trained on exactly the reference's batches (record ids and
        bytes), reached the same final weights digest, and no process crashed.

    Raises:
        ValueError: malformed kill points, ``kills < 0`` or a non-empty `workdir`.
        HarnessError: the command cannot be started, or a process exceeded `timeout`
            (every process still running is killed first).
    """
    # Checked before anything is created; random points are drawn below.
    points = check_points(kill_points) if kill_points is not None else None
    if kills < 0:
        msg = f"`kills` must be >= 0. Received: kills={kills!r}."
        raise ValueError(msg)
    work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="resume-"))
    work.mkdir(parents=True, exist_ok=True)
    if any(work.iterdir()):
        msg = (
            f"The harness needs an empty work directory: checkpoints or traces left in it "
            f"would be resumed from. Received: workdir={os.fspath(work)!r} (not empty)."
        )
        raise ValueError(msg)

    def start(name: str, ckpt_dir: str, pause_at: str | None) -> _Process:
        return _spawn(command, name=name, workdir=work, ckpt_dir=work / ckpt_dir, env=env,
                      pause_at=pause_at, timeout=timeout, pause=pause)

    procs = [start("reference", "reference-ckpt", None)]
    if points is None or not parallel:
        _watch(procs, on_event)
    if points is None:
        candidates = range(max(len(procs[0].trace.steps) - 1, 0))
        drawn = sorted(random.Random(seed).sample(candidates, min(kills, len(candidates))))
        points = check_points(drawn)
    attempts: list[_Process] = []
    for index in range(len(points) + 1):
        pause_at = points[index] if index < len(points) else None
        attempts.append(start(f"attempt-{index}", "resumed-ckpt", pause_at))
        procs.append(attempts[-1])
        _watch(procs, on_event, until=attempts[-1])
        if not attempts[-1].killed:
            break
    _watch(procs, on_event)
    return report_lib.build(
        procs[0].outcome(), [a.outcome() for a in attempts], workdir=os.fspath(work)
    )
