"""No hang at interpreter exit: scripts as users write them (TensorFlow imported at the
top, no ``__main__`` guard) that consumed a loader through ``dataset()``, a ``for`` loop
or Keras ``fit``, with 0, thread or process workers, exit within seconds.

In 0.2.0 about 1 exit in 3 of these scripts hung forever (1 in 8-12 of scripts whose
map_fn is faster): a TensorFlow thread running the generator was terminated by CPython's
finalization inside its ``py_func``, and the main thread waited for it while destroying
the iterator (`resumeloader.core.exiting`).
"""

from __future__ import annotations

import collections
import itertools

import _exits
import _limits
import pytest

pytestmark = pytest.mark.slow

CONSUMERS = ("dataset", "loop", "fit")
WORKERS = ("0", "thread", "process")
# 45 exits, 5 of each of the 9 kinds (until 0.4: 100, at least 11 of each; then 63; each
# step ~10 s of CI time less). The hang this guards against struck about 1 exit in 3 of
# these scripts (a 2 ms map_fn) in 0.2.0: 5 exits of a kind miss it with probability
# (2/3)**5 < 14%, the 45 together with (2/3)**45 < 1e-7; a hang 4 times rarer (1 in 12, a
# faster map_fn) is missed by all 45 with probability < 2%. The exit benchmark
# (benchmarks/faults.py --cases exit) runs 100 more exits after ``dataset()``, on every
# kind of workers, twice.
NUM_EXITS = 45
PARALLEL = 4
# Seconds from a script's last line to the end of its process (and workers) beyond which
# the exit counts as hung (their times: benchmarks/faults.py).
LIMIT = _limits.EXIT


def _job(tmp_path, number: int, consumer: str, workers: str) -> dict:
    return {"script": str(_exits.SCRIPTS / "exit_job.py"),
            "args": [consumer, workers, str(tmp_path / f"ckpt-{number}")],
            "log": str(tmp_path / f"{number}.log")}


def _describe(results: list[dict]) -> str:
    return "\n".join(
        f"{' '.join(r['args'][:2])}: "
        f"{'HUNG' if r['hung'] else r['seconds']} (exit {r['returncode']}, log {r['log']})"
        for r in results
    )


def test_exit_after_dataset_loop_or_fit_never_hangs_45_times(tmp_path):
    """45 exits, 4 at a time, 5 of every consumer with every kind of workers: none takes
    more than LIMIT seconds after the script's last line, each exits with status 0."""
    combos = itertools.cycle(itertools.product(CONSUMERS, WORKERS))
    jobs = [_job(tmp_path, n, *next(combos)) for n in range(NUM_EXITS)]

    results = _exits.run_forked(jobs, workdir=tmp_path, parallel=PARALLEL, limit=LIMIT,
                                timeout=_limits.SLOW_TEST - 60)

    assert len(results) == NUM_EXITS
    bad = [r for r in results if r["hung"] or r["returncode"] != 0]
    assert not bad, f"{len(bad)} of {NUM_EXITS} exits hung or failed:\n{_describe(bad)}"
    kinds = collections.Counter(tuple(r["args"][:2]) for r in results)
    assert len(kinds) == len(CONSUMERS) * len(WORKERS)
    assert set(kinds.values()) == {NUM_EXITS // len(kinds)}, kinds


def test_exit_of_plain_interpreter_after_dataset_does_not_hang(tmp_path):
    """The script started as ``python exit_job.py dataset 0`` (no fork server: the case
    that hung most often in 0.2.0) exits too."""
    result = _exits.spawn(str(_exits.SCRIPTS / "exit_job.py"),
                          ["dataset", "0", str(tmp_path / "ckpt")], limit=LIMIT,
                          log=tmp_path / "stderr.log")

    assert result["done"], (tmp_path / "stderr.log").read_text()[-2000:]
    assert not result["hung"] and result["returncode"] == 0, _describe([result])


@pytest.mark.parametrize("consumer", ["dataset", "loop"])
def test_exit_without_close_on_local_dask_cluster_leaves_nothing(tmp_path, consumer):
    """``python exit_job.py CONSUMER dask``: a script that consumed a loader on a local Dask
    cluster (2 worker processes) and ends without ``close()`` exits, and so does every
    process of its cluster; none is started while it exits."""
    result = _exits.spawn(str(_exits.SCRIPTS / "exit_job.py"),
                          [consumer, "dask", str(tmp_path / "ckpt")], limit=LIMIT,
                          log=tmp_path / "stderr.log")

    assert result["done"], (tmp_path / "stderr.log").read_text()[-2000:]
    assert not result["hung"] and result["returncode"] == 0, _describe([result])
    assert (result["left"], result["late"]) == ([], 0)
