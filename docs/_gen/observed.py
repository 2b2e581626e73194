"""Captures real runs of the docs' stats and profile examples into docs/_gen/observed/.

    python docs/_gen/observed.py

Runs, on this machine, the example job of docs/guides/tuning.md ("See where the time
goes"): 40 steps of `for batch in loader` with a 5 ms training step, then
``resumeloader profile`` on the same pipeline; writes what they print to
``observed/stats.txt`` and ``observed/profile.txt``, with the machine and its load.
The page shows those files (cog: ``figures.observed``); its own examples run in the
test suite. Timings differ from run to run: rerun this, then
``python docs/_gen/generate.py``, to refresh them.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

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


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    work = tempfile.mkdtemp()
    Path(work, "aug_job.py").write_text(JOB)
    os.chdir(work)
    sys.path.insert(0, work)
    import aug_job

    import resumeloader
    from resumeloader import cli

    loader = resumeloader.ResumableLoader.from_pipeline(aug_job.make())
    for step, _ in enumerate(loader, start=1):
        time.sleep(0.005)  # the training step
        if step == 40:
            break
    text = f"{loader.stats()}\n({_machine()})\n"
    OBSERVED.mkdir(exist_ok=True)
    (OBSERVED / "stats.txt").write_text(text)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        cli.main(["profile", "aug_job:make", "--batches", "40"])
    (OBSERVED / "profile.txt").write_text(f"{buffer.getvalue()}({_machine()})\n")
    print(text, buffer.getvalue(), sep="\n")


if __name__ == "__main__":
    main()
