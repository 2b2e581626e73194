"""Instructions executed by a measured part of a Python process, counted by Valgrind.

A CPU-time ratio of two near-equal contenders (a switch on and off) on a shared
machine moves by a few percent between runs; the instructions a part executes do
not. `counted` runs a script under ``valgrind --tool=callgrind`` with the counting
off, switches it on (``callgrind_control -i on``) when the script says it is ready,
and off when it says it is done: the total is the measured part's, every thread of
the process included. A fixed script (a loader built and warmed up, then N batches)
gives the same count to within a fraction of a percent in every run. Without
``valgrind`` on the PATH nothing is counted (`available`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

__all__ = ["available", "counted"]

READY, DONE = "READY", "DONE"


def available() -> bool:
    """Whether Valgrind's callgrind and its control tool are installed."""
    return bool(shutil.which("valgrind") and shutil.which("callgrind_control"))


def _line(process: subprocess.Popen[str], want: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"the counted script ended before printing {want}")
        if line.strip() == want:
            return
    raise RuntimeError(f"the counted script did not print {want} within {timeout:.0f} s")


def counted(args: list[str], *, timeout: float = 900.0, keep: str | None = None) -> int:
    """Instructions the script ``python args...`` executes between printing READY (it
    then waits for a line on its stdin) and printing DONE (it then waits for its stdin
    to close). Its string hashes are seeded alike in every run (``PYTHONHASHSEED=0``:
    a dict's collisions, and so its lookups' instructions, depend on them). `keep`: a
    path to keep callgrind's profile at (for ``callgrind_annotate``)."""
    with tempfile.TemporaryDirectory() as root:
        log = os.path.join(root, "callgrind.log")
        out = keep or os.path.join(root, "out")
        process = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--log-file={log}",
             f"--callgrind-out-file={out}", sys.executable, *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        assert process.stdin is not None
        try:
            _line(process, READY, timeout)
            subprocess.run(["callgrind_control", "-i", "on", str(process.pid)], check=True,
                           capture_output=True, timeout=60)
            process.stdin.write("go\n")
            process.stdin.flush()
            _line(process, DONE, timeout)
            subprocess.run(["callgrind_control", "-i", "off", str(process.pid)], check=True,
                           capture_output=True, timeout=60)
            process.stdin.close()
            process.wait(timeout=timeout)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        with open(log) as file:
            found = re.findall(r"Collected\s*:\s*(\d+)", file.read())
        if not found:
            raise RuntimeError(f"callgrind reported no count (log {log})")
        return int(found[-1])
