"""The lines TensorFlow and JAX print while they load, kept out of the command's output.

Importing TensorFlow 2.21 writes to the process's standard error, from C++ and before
``TF_CPP_MIN_LOG_LEVEL`` takes effect, absl's "All log messages before
absl::InitializeLog() is called are written to STDERR" and a few ``I0000`` lines
(oneDNN, CUDA drivers, CPU instructions) — twice, once per copy of its runtime
libraries. A training script cannot avoid them; the ``resumeloader`` command can:
`startup_filtered` runs a block (an import that may load TensorFlow) with file
descriptor 2 captured, then writes back every line except those (`STARTUP`), so
warnings and errors still show.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["STARTUP", "is_startup_line", "startup_filtered"]

#: What TensorFlow (and JAX, which bundles the same runtime pieces) print as they load.
STARTUP = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|^[IWE]\d{4} [\d:.]+ +\d+ (port|cudart_stub|cpu_feature_guard|cuda_platform|"
    r"cuda_executor|cuda_diagnostics)\.cc:\d+\]"
    r"|^To enable the following instructions: "
)


def is_startup_line(line: str) -> bool:
    """True for a line TensorFlow or JAX print while loading, whatever the program does."""
    return STARTUP.search(line) is not None


@contextlib.contextmanager
def startup_filtered() -> Iterator[None]:
    """Runs the block with standard error (fd 2) captured; writes it back without the
    start-up lines afterwards (also when the block raises)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [
                line for line in captured.read().decode(errors="replace").splitlines(True)
                if not is_startup_line(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
