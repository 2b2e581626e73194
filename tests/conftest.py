"""Setup shared by every tier: the order of the tests. No TensorFlow here: the unit tier
(tests/unit) runs without it; the TensorFlow tier's setup is tests/tf/conftest.py."""

from __future__ import annotations

import gc
import signal

import _dask
import _limits
import pytest
from _objstore_fixtures import gcs_store, s3_store, store  # noqa: F401 (session fixtures)

# Ctrl-C as in a terminal. A test run started as a shell's background job (`cmd &`,
# `setsid`, some CI runners) inherits SIGINT ignored, and Python keeps an inherited
# SIG_IGN: no Ctrl-C test could then press Ctrl-C, in this process or in the processes
# it starts. Python's own handler here also gives them the default disposition (a caught
# signal is reset to the default in an exec'd process).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Modules whose every test starts TensorFlow subprocesses; with the tests marked
# `slow`, they run first.
_SLOW_MODULES = {"test_kill.py", "test_notebook.py", "test_faults.py"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Runs the subprocess tests first (the order within each group kept): with two
    xdist workers stealing work, the suite then ends on short tests on both workers
    instead of one worker finishing a long kill test while the other idles. Each of
    them without a timeout of its own gets `_limits.SLOW_TEST`."""

    def slow(item: pytest.Item) -> bool:
        return item.get_closest_marker("slow") is not None or item.path.name in _SLOW_MODULES

    for item in items:
        if slow(item) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(_limits.SLOW_TEST))
    items.sort(key=lambda item: not slow(item))


def pytest_ignore_collect(collection_path, config):
    """conftest.py files hold no tests: they are not collected as doctest modules, which
    would import each as the one module name `conftest` that the tiers' conftests share
    (pytest then refuses the second as an import-file mismatch)."""
    return True if collection_path.name == "conftest.py" else None


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freezes the garbage collector's heap once the tests are imported (TensorFlow, Keras
    and the test modules: ~450,000 objects that live as long as the process). A
    collection then walks only what the tests made: the ``gc.collect()`` of Keras'
    ``clear_session`` after every test of a Keras module (the `clean_keras` fixture)
    cost ~0.2 s of CPU over that heap, and Python's own full collections as much."""
    gc.collect()
    gc.freeze()


@pytest.fixture(scope="session", autouse=True)
def _dask_clusters():
    """Stops the session's Dask clusters (`_dask.local`, `_dask.cli`) at the end, if a
    test started them."""
    yield
    _dask.stop()
