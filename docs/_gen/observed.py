"""Captures real runs of the docs' stats and profile examples into docs/_gen/observed/.

    python docs/_gen/observed.py [stats] [profile] [auto] [log]

Runs, on this machine, the example job of docs/guides/tuning.md ("See where the time
goes"): 40 steps of `for batch in loader` with a 5 ms training step (``stats``), then
``resumeloader profile`` on the same pipeline (``profile``), the same loader with
``Workers("auto")`` until it decides (``auto``: its INFO line) and with
``log_stats(2)`` for a few seconds (``log``: its first line); writes what they print to
``observed/<name>.txt``, with the machine and its load (all four without arguments).
The page shows those files (cog: ``figures.observed``); its own examples run in the
test suite. Timings differ from run to run: rerun this, then
``python docs/_gen/generate.py``, to refresh them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OBSERVED = HERE / "observed"

JOB = '''
import numpy as np
from resumeloader import Pipeline

IMAGES = np.random.default_rng(0).integers(0, 256, (2_048, 32, 32, 3), dtype=np.uint8)


def augment(image, rng):
    if rng.random() < 0.5:
        image = image[:, ::-1]
    noise = rng.normal(0.0, 8.0, image.shape)
    return (np.clip(image + noise, 0, 255) / 255).astype(np.float32)


def make():
    return Pipeline(IMAGES, seed=0).shuffle().map(augment).batch(64)
'''


def _machine() -> str:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} CPUs, load average (1 / 5 / 15 min) {load}"


class _Lines(logging.Handler):
    """Keeps the messages logged to it."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def _logged(name: str) -> Any:
    """The INFO messages of logger `name` within it."""
    logger, handler = logging.getLogger(name), _Lines()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def stats(make: Any) -> str:
    import resumeloader

    loader = resumeloader.ResumableLoader.from_pipeline(make())
    for step, _ in enumerate(loader, start=1):
        time.sleep(0.005)  # the training step
        if step == 40:
            break
    return f"{loader.stats()}\n"


def profile(make: Any) -> str:
    from resumeloader import cli

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        cli.main(["profile", "aug_job:make", "--batches", "40"])
    return buffer.getvalue()


def auto(make: Any) -> str:
    """The INFO line of `Workers("auto")`'s first decision on the job."""
    import resumeloader

    with _logged("resumeloader.workers") as lines:
        loader = resumeloader.ResumableLoader.from_pipeline(
            make(), workers=resumeloader.Workers("auto"))
        with loader:
            for _ in loader:
                time.sleep(0.005)
                if loader.stats().decisions:
                    break
    decided = [line for line in lines if line.startswith("Workers('auto')")]
    return f"{decided[0]}\n"


def log(make: Any) -> str:
    """The first line `log_stats(2)` logs while the job trains."""
    import resumeloader

    with _logged("resumeloader.stats") as lines:
        loader = resumeloader.ResumableLoader.from_pipeline(make())
        loader.log_stats(2)
        with loader:
            for _ in loader:
                time.sleep(0.005)
                if lines:
                    break
        loader.log_stats(None)
    return f"{lines[0]}\n"


CAPTURES = {"stats": stats, "profile": profile, "auto": auto, "log": log}


def main(argv: list[str] | None = None) -> None:
    names = (sys.argv[1:] if argv is None else argv) or list(CAPTURES)
    unknown = sorted(set(names) - set(CAPTURES))
    if unknown:
        msg = f"Unknown captures {unknown}. Choose from {sorted(CAPTURES)}."
        raise SystemExit(msg)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    work = tempfile.mkdtemp()
    Path(work, "aug_job.py").write_text(JOB)
    os.chdir(work)
    sys.path.insert(0, work)
    import aug_job

    OBSERVED.mkdir(exist_ok=True)
    for name in names:
        text = f"{CAPTURES[name](aug_job.make)}({_machine()})\n"
        (OBSERVED / f"{name}.txt").write_text(text)
        print(text)


if __name__ == "__main__":
    main()
