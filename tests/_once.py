"""`once_per_run`: a costly fixture value made once per test run, whatever the xdist
workers that ask for it.

A module-scoped fixture runs once per pytest-xdist worker that gets one of its tests,
and work stealing splits a module's tests among workers: the kill tests' ``resumeloader
verify`` run (a reference and four killed or resumed TensorFlow processes, ~30 s of
CPU) ran three times in one suite, the notebook's execution twice. Here the first
worker to ask makes the value under a file lock in the run's shared temporary folder
and stores it (pickled); the others wait for the lock and load it. xdist's own recipe
for session fixtures ("Making session-scoped fixtures execute only once").
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from filelock import FileLock

T = TypeVar("T")


def shared_folder(factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The temporary folder of this run that every xdist worker sees (without xdist,
    this process's own: never an earlier run's)."""
    base = factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def once_per_run(factory: pytest.TempPathFactory, worker_id: str, name: str,
                 make: Callable[[Path], T]) -> T:
    """``make(folder)``'s value, made by the first worker of this run to ask (in
    `folder`, a new folder of the shared one) and loaded by the others. An error in
    `make` is raised in the worker that ran it; the next worker to ask tries again."""
    shared = shared_folder(factory, worker_id)
    stored = shared / f"{name}.pickle"
    with FileLock(str(shared / f"{name}.lock")):
        if stored.exists():
            value: Any = pickle.loads(stored.read_bytes())
            return value
        folder = shared / f"{name}-run"
        folder.mkdir(exist_ok=True)
        value = make(folder)
        stored.write_bytes(pickle.dumps(value))
        return value
