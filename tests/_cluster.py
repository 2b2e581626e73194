"""Runs the worker scripts of the multi-worker tests as a 2-process loopback cluster."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def free_ports(count: int) -> list[int]:
    """Ports on 127.0.0.1 that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_workers(
    script: str | Path, *args: str, timeout: float = 120
) -> list[subprocess.CompletedProcess]:
    """Runs ``script INDEX PORTS *args`` for 2 workers until both end or die."""
    ports = json.dumps(free_ports(2))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "CUDA_VISIBLE_DEVICES": "",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), ports, *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(2)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results
