"""A training loop for fault injection, written the way worker processes must survive:
no ``if __name__ == "__main__":`` guard, TensorFlow imported at the top, and the
``map_fn`` and source defined here, in ``__main__``.

``python fault_job.py WORKDIR [options]`` consumes 2 epochs of 96 records (batches of
8; record i is filled with i) and after every batch saves ``{"loader": state,
"records": ids consumed so far}`` to WORKDIR/state.json atomically; started again, it
resumes from that file. It prints ``start PID`` first, ``batch K`` after each batch,
``stalling PID`` when the map_fn or the source reaches record --stall-at (then sleeps
for an hour) and ``done ...`` at the end, each line flushed. With --sigint-from-stall
the stalled thread (not the main one) then sends SIGINT to itself once the main thread
is blocked waiting for it: Python's C handler runs in the stalled thread, as when the
signal lands just before the main thread's wait blocks. With --press-in-gc-callback
FILE the job, after batch 5 and once FILE exists, gets a Ctrl-C in a garbage-collector
callback of the main thread (as a SIGINT arriving while the main thread collects: its
KeyboardInterrupt is raised in JAX's callback, and CPython only reports it). With
--tf-flag, column 1 of each record says whether the process that made it had imported
TensorFlow. With --worker-type dask, a local Dask cluster of --workers processes makes
the batches.
"""

import argparse
import gc
import json
import os
import pathlib
import signal
import sys
import threading
import time

import numpy as np
import tensorflow as tf

import resumeloader

parser = argparse.ArgumentParser()
parser.add_argument("workdir", type=pathlib.Path)
parser.add_argument("--workers", type=int, default=2)
parser.add_argument("--worker-type", default="process", choices=["thread", "process", "dask"])
parser.add_argument("--prefetch", type=int, default=2)
parser.add_argument("--consume", choices=["loop", "dataset"], default="loop")
parser.add_argument("--stall", choices=["none", "map", "source"], default="none")
parser.add_argument("--stall-at", type=int, default=40)
parser.add_argument("--timeout", type=float, default=None)
parser.add_argument("--record-floats", type=int, default=4)
parser.add_argument("--step-seconds", type=float, default=0.0)
parser.add_argument("--tf-flag", action="store_true", help="column 1: TensorFlow imported")
parser.add_argument("--sigint-from-stall", action="store_true")
parser.add_argument("--press-in-gc-callback", type=pathlib.Path, default=None)
args = parser.parse_args()


def say(line):
    """One whole line in one write: the map_fn thread and the loop never interleave."""
    os.write(sys.stdout.fileno(), f"{line}\n".encode())


say(f"start {os.getpid()}")  # a worker re-running this script would print it

NUM_RECORDS, BATCH = 96, 8
STALL, STALL_AT, FLOATS, TF_FLAG = args.stall, args.stall_at, args.record_floats, args.tf_flag


def stall_here(index):
    if index == STALL_AT:
        say(f"stalling {os.getpid()}")
        if args.sigint_from_stall:
            interrupt_when_main_thread_blocks()
        time.sleep(3600)


def interrupt_when_main_thread_blocks():
    """SIGINT to this thread once the main thread is blocked in a call (the same
    instruction of the same frame at 3 looks 10 ms apart): the main thread can raise
    KeyboardInterrupt only when that call returns by itself."""
    if threading.current_thread() is threading.main_thread():
        raise RuntimeError("--sigint-from-stall needs a stall outside the main thread")
    main = threading.main_thread().ident
    seen, same = None, 0
    while same < 3:
        time.sleep(0.01)
        frame = sys._current_frames()[main]
        where = (frame, frame.f_lasti)
        same = same + 1 if where == seen else 0
        seen = where
    del frame, seen, where
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)


def map_fn(record, rng):
    if STALL == "map":
        stall_here(int(record))
    out = np.full(FLOATS, record, np.float32)
    if TF_FLAG:
        out[1] = "tensorflow" in sys.modules
    return out


class Source:
    def __len__(self):
        return NUM_RECORDS

    def __getitem__(self, index):
        if STALL == "source":
            stall_here(index)
        return np.int64(index)


loader = resumeloader.ResumableLoader(
    Source(), batch_size=BATCH, seed=1, num_epochs=2, map_fn=map_fn,
    workers=resumeloader.Workers(
        args.workers, kind=args.worker_type if args.workers else None, timeout=args.timeout
    ),
    prefetch=args.prefetch,
)
path = args.workdir / "state.json"
saved = json.loads(path.read_text()) if path.exists() else {"loader": None, "records": []}
if saved["loader"] is not None:
    loader.set_state(saved["loader"])
records = saved["records"]
tf_batches = 0


def consumed(batch):
    global tf_batches
    time.sleep(args.step_seconds)
    tf_batches += bool(TF_FLAG and batch[:, 1].numpy().any())
    records.extend(int(i) for i in batch[:, 0].numpy())
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"loader": loader.get_state(), "records": records}))
    os.replace(tmp, path)
    say(f"batch {len(records) // BATCH}")
    if args.press_in_gc_callback is not None and len(records) // BATCH == 5:
        press_in_gc_callback(args.press_in_gc_callback)


def press_in_gc_callback(ready):
    """Once `ready` exists: SIGINT raised in a gc callback at the end of a collection of
    the main thread; its KeyboardInterrupt is reported "ignored", and the loop goes on."""
    while not ready.exists():
        time.sleep(0.01)

    def press(phase, info):
        if phase == "stop":
            gc.callbacks.remove(press)
            signal.raise_signal(signal.SIGINT)

    say("pressing")
    gc.callbacks.append(press)
    gc.collect()


if args.consume == "loop":
    for batch in loader:
        consumed(batch)
else:
    for batch in loader.dataset():
        loader.advance()
        consumed(batch)
say(f"done; workers that imported TensorFlow: {tf_batches}; TF {tf.__version__}")
