"""A TensorFlow-free job that follows the recorder contract, for fast harness tests.

Its "checkpoint" is a JSON file holding the step, written atomically every
--save-every steps; step k trains on records derived from k alone. --mode breaks it:
``crash`` exits 3 after step --at; ``lose`` ignores its checkpoint when restarted;
``skip`` restarts with its data one batch ahead of its checkpoint (records lost).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from resumeloader.tools import trace as _trace


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--save-every", type=int, default=4)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--mode", choices=["ok", "crash", "lose", "skip"], default="ok")
    parser.add_argument("--at", type=int, default=10)
    args = parser.parse_args()

    recorder = _trace.TraceRecorder.from_env()
    state = Path(os.environ[_trace.ENV_CKPT_DIR]) / "state.json"
    state.parent.mkdir(parents=True, exist_ok=True)
    step = json.loads(state.read_text())["step"] if state.exists() else 0
    if step and args.mode == "lose":
        step = 0
    ahead = 1 if step and args.mode == "skip" else 0
    recorder.start(step)
    while step < args.steps:
        ids = [((step + ahead) * 4 + j) % 40 for j in range(4)]
        time.sleep(args.sleep)
        recorder.step(step, np.asarray(ids, np.float32) / 40, records=ids)
        step += 1
        if args.mode == "crash" and step == args.at + 1:
            sys.exit(3)
        if step % args.save_every == 0:
            tmp = state.with_suffix(".tmp")
            tmp.write_text(json.dumps({"step": step}))
            recorder.save_point()
            os.replace(tmp, state)
            recorder.commit(step)
    recorder.finish(weights=[np.array([step])], loss=float(step))
    recorder.close()


if __name__ == "__main__":  # pytest --doctest-modules imports this file
    main()
