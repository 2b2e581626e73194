"""RSS and time with TensorFlow's malloc patch kept or undone (issue 24.1's decision).

    python benchmarks/malloc_rss.py            # the four cases, each in a fresh process
    python benchmarks/malloc_rss.py REGIME WORKLOAD   # one case: tf|restored loader|generator

Each case imports TensorFlow and iterates a ``from_generator`` dataset (TensorFlow sets
glibc's M_MMAP_THRESHOLD to 128 KiB: its patch); ``restored`` then raises the mmap
threshold to 32 MiB (glibc's dynamic maximum) and the trim threshold to 64 MiB. Workloads:
``loader``: 20,000 CIFAR-like records, 3 epochs of ``for batch in loader`` and 3 of
``dataset()`` + ``advance()``; ``generator``: a user's ``from_generator`` yielding 3,000
NumPy arrays of 64 KiB to 4 MiB (the kind of job TensorFlow's patch was added for). Prints
one JSON line per case: seconds, RSS at the start, peak RSS (VmHWM) and RSS at the end, MiB.
"""

import ctypes
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def status(field):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(field + ":")).split()[1]) / 1024


def case(regime, workload):
    import numpy as np
    import tensorflow as tf

    import resumeloader


    # TensorFlow's patch, as every job gets it.
    spec = tf.TensorSpec((), tf.int32)
    for _ in tf.data.Dataset.from_generator(lambda: iter([0]), output_signature=spec):
        pass
    if regime == "restored":
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 32 << 20)   # M_MMAP_THRESHOLD: glibc's dynamic maximum
        libc.mallopt(-1, 64 << 20)   # M_TRIM_THRESHOLD
    base = status("VmRSS")
    start = time.perf_counter()
    if workload == "loader":
        images = np.random.default_rng(0).integers(0, 255, (20_000, 32, 32, 3), dtype=np.uint8)
        labels = np.arange(20_000, dtype=np.int64)
        base = status("VmRSS")
        def loader_of():
            return resumeloader.ResumableLoader(
                (images, labels), batch_size=128, seed=0, num_epochs=3)

        loader = loader_of()
        n = 0
        for _batch in loader:
            n += 1
        loader = loader_of()
        for _batch in loader.dataset():
            loader.advance()
            n += 1
    else:  # a user's from_generator of variable-size Python-made arrays (TF's reason)
        rng = np.random.default_rng(0)
        sizes = rng.integers(64 << 10, 4 << 20, 3000)
        def gen():
            for s in sizes:
                yield np.ones(int(s) // 4, np.float32)
        ds = tf.data.Dataset.from_generator(
            gen, output_signature=tf.TensorSpec((None,), tf.float32)).prefetch(4)
        n = 0
        for _x in ds:
            n += 1
    print(json.dumps({"regime": regime, "workload": workload, "items": n,
                      "seconds": round(time.perf_counter() - start, 2),
                      "rss_start_mib": round(base), "peak_mib": round(status("VmHWM")),
                      "rss_end_mib": round(status("VmRSS"))}))


def main():
    if len(sys.argv) == 3:
        case(sys.argv[1], sys.argv[2])
        return
    for workload in ("loader", "generator"):
        for regime in ("tf", "restored"):
            subprocess.run([sys.executable, __file__, regime, workload], check=True, timeout=600,
                           stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
