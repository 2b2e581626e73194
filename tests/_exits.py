"""Many interpreter exits of scripts as users write them, timed: a fork server.

Starting an interpreter that imports TensorFlow costs ~4 s of CPU before the script's
first line, so 100 of them would take minutes of the suite. The server is a fresh
interpreter that imports TensorFlow, Keras and resumeloader once (no op run, so no
TensorFlow thread started) and forks one child per exit. The child becomes the script:
``sys.argv`` set, its code run in ``__main__`` (its own ``import tensorflow`` finds the
module loaded), and it ends like the script would, through the interpreter's
finalization, in its own process group. The server runs `parallel` children at a time
and reports, per child, the seconds from the script's ``done`` line to the end of the
process; a child (with its workers) still alive `limit` seconds after ``done`` is
reported hung and killed. `spawn` runs a script as a plain ``python script.py`` instead.

    python _exits.py JOBS.json PARALLEL LIMIT    # prints one JSON line per job
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import select
import signal
import subprocess
import sys
import time
from typing import Any

import psutil

HERE = pathlib.Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"


def _child(script: str, args: list[str], log: str) -> None:
    """In the forked child: become `script` and exit as it would (never returns)."""
    import __main__

    os.setpgid(0, 0)  # the script and its workers, killable together
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(script)
    __main__.__dict__.update(__file__=script)
    with open(script) as f:
        code = compile(f.read(), script, "exec")
    exec(code, __main__.__dict__)  # an uncaught exception exits 1, as for the script


def _start(job: dict[str, Any]) -> dict[str, Any]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        os.dup2(write, 1)
        _child(job["script"], job["args"], job["log"])
        sys.exit(0)
    os.close(write)
    return {**job, "pid": pid, "pipe": read, "out": b"", "done_at": None}


def _finished(run: dict[str, Any]) -> bool:
    pid, status = os.waitpid(run["pid"], os.WNOHANG)
    if pid == 0:
        return False
    run["returncode"] = os.waitstatus_to_exitcode(status)
    return True


def serve(jobs: list[dict[str, Any]], parallel: int, limit: float) -> None:
    """Runs `jobs` (script, args, log) `parallel` at a time; prints one result each."""
    waiting, running = list(jobs), []
    while waiting or running:
        while waiting and len(running) < parallel:
            running.append(_start(waiting.pop(0)))
        pipes = [r["pipe"] for r in running if r["pipe"] is not None]
        ready, _, _ = select.select(pipes, [], [], 0.05)
        now = time.monotonic()
        for run in list(running):
            if run["pipe"] in ready:
                data = os.read(run["pipe"], 65536)
                run["out"] += data
                if not data:
                    os.close(run["pipe"])
                    run["pipe"] = None
                if run["done_at"] is None and b"done\n" in run["out"]:
                    run["done_at"] = now
            if run["done_at"] is not None and _finished(run):
                report(run, now - run["done_at"], hung=False)
            elif run["done_at"] is not None and now - run["done_at"] > limit:
                report(run, now - run["done_at"], hung=True)
            elif run["done_at"] is None and run["pipe"] is None and _finished(run):
                report(run, None, hung=False)  # ended without its done line: a crash
            else:
                continue
            running.remove(run)


def report(run: dict[str, Any], seconds: float | None, *, hung: bool) -> None:
    if hung:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run["pid"], signal.SIGKILL)
        os.waitpid(run["pid"], 0)
        run["returncode"] = None
    if run["pipe"] is not None:
        os.close(run["pipe"])
    result = {"args": run["args"], "seconds": seconds, "hung": hung,
              "returncode": run["returncode"], "log": run["log"]}
    print(json.dumps(result), flush=True)


def run_forked(
    jobs: list[dict[str, Any]], *, workdir: pathlib.Path, parallel: int, limit: float,
    timeout: float, freeze: bool = True,
) -> list[dict[str, Any]]:
    """Runs `jobs` in a fork server (a fresh interpreter); returns their results. With
    `freeze`, the server freezes its heap (``gc.freeze``) before forking: the children
    share its pages, but their exits skip the collection over TensorFlow's objects that
    a script started as ``python script.py`` goes through (measure without it)."""
    spec = workdir / "jobs.json"
    spec.write_text(json.dumps(jobs))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import tensorflow, keras, numpy, resumeloader, resumeloader.keras; "
        f"import gc, _exits; {'gc.freeze(); ' if freeze else ''}_exits.main(sys.argv[2:])"
    )
    server = subprocess.run(
        [sys.executable, "-c", code, str(HERE), str(spec), str(parallel), str(limit)],
        capture_output=True, text=True, env=env, timeout=timeout,
    )
    results = [json.loads(line) for line in server.stdout.splitlines() if line.startswith("{")]
    assert server.returncode == 0, server.stderr[-3000:]
    return results


def spawn(script: str, args: list[str], *, limit: float, log: pathlib.Path) -> dict[str, Any]:
    """Runs ``python script ARGS`` as a user would; the seconds from ``done`` until the
    script's process and every process it started are gone; `left`: those still alive
    `limit` seconds after ``done`` (then killed); `late`: how many it started after
    ``done`` (while exiting)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    with open(log, "ab") as err:
        proc = subprocess.Popen([sys.executable, script, *args], stdout=subprocess.PIPE,
                                stderr=err, env=env, start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    done = time.monotonic()
    started = _children(proc.pid)  # e.g. Dask workers, in sessions of their own
    at_done = set(started)
    while time.monotonic() - done < limit and (
        proc.poll() is None or any(_alive(p) for p in started)
    ):
        started.extend(p for p in _children(proc.pid) if p not in started)
        time.sleep(0.01)
    seconds = time.monotonic() - done
    left = [p.pid for p in started if _alive(p)]
    hung = proc.poll() is None or bool(left)
    if hung:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        for process in started:
            with contextlib.suppress(psutil.Error):
                process.kill()
    returncode = None if proc.poll() is None else proc.returncode
    proc.wait()
    return {"args": args, "seconds": seconds, "hung": hung, "returncode": returncode,
            "log": str(log), "done": line == b"done\n", "left": left,
            "late": len(set(started) - at_done)}


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _alive(process: psutil.Process) -> bool:
    """True while `process` runs (a zombie has exited)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main(argv: list[str]) -> None:
    jobs = json.loads(pathlib.Path(argv[0]).read_text())
    serve(jobs, int(argv[1]), float(argv[2]))
