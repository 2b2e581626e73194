"""How long the tests wait before they call something hung, in one place.

Each limit is far above what the awaited thing takes on a 2-core machine at load 20
(the suite beside other work: every process gets a tenth of a core or less, and a
step of 3 s takes 30 s or more), so that only a real hang trips it. A limit detects
hangs; it never checks speed (the benchmarks measure times: benchmarks/faults.py).
Tests that are not `slow` have pytest-timeout's limit from ``pyproject.toml``.
"""

from __future__ import annotations

#: pytest-timeout's limit for a test that starts TensorFlow subprocesses (marked
#: `slow`; tests/conftest.py), its module fixtures included: 6 TensorFlow processes in
#: turn take about 1 minute on an idle 2-core machine.
SLOW_TEST = 1800.0
#: One TensorFlow process, from its start to its end (10-30 s idle).
PROCESS = 600.0
#: Until a process's first lines or a server's readiness (TensorFlow's import, a Dask
#: cluster's workers joining: about 5 s idle).
START = 300.0
#: From a script's last line, or a signal, until every process of it is gone (about
#: 1 s idle; 30 s at load 20 in 0.3).
EXIT = 120.0
