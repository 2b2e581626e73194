"""A training script as users write one, for the interpreter-exit tests: TensorFlow at the
top, no ``__main__`` guard, the map_fn in ``__main__``. It consumes a few batches of a
loader and ends; the interpreter then exits with the loader's threads still producing.

    python exit_job.py {dataset,loop,fit} {0,thread,process,dask} [CHECKPOINT_DIR]

* ``dataset``: ``next()`` on an iterator of ``loader.dataset()`` (kept in a global), with
  ``loader.advance()`` after each batch;
* ``loop``: ``for batch in loader`` left by ``break``;
* ``fit``: ``model.fit(loader.dataset(), steps_per_epoch=...)`` of one epoch with a
  ResumeCallback (the endless dataset is read ahead into the next epoch).

The map_fn takes 2 ms per record, so at exit a generator is inside one (where 0.2.0 hung).
Prints ``done`` when its last line ran.
"""

import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

import resumeloader
import resumeloader.keras

consume, workers = sys.argv[1], sys.argv[2]


def augment(record, rng):
    time.sleep(0.002)
    return record + rng.normal(scale=0.1, size=record.shape).astype(np.float32)


options = {} if workers == "0" else {"workers": resumeloader.Workers(2, kind=workers)}
records = 48 if consume == "fit" else 4096
features = np.random.default_rng(0).normal(size=(records, 4)).astype(np.float32)
loader = resumeloader.ResumableLoader(features, batch_size=8, seed=0, map_fn=augment, **options)

total = tf.constant(0.0)
if consume == "dataset":
    batches = iter(loader.dataset())
    for _ in range(3):
        total += tf.reduce_sum(next(batches))
        loader.advance()
elif consume == "loop":
    for step, batch in enumerate(loader):
        total += tf.reduce_sum(batch)
        if step == 3:
            break
else:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)])
    model.compile(optimizer="sgd", loss="mse")
    directory = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp()
    callback = resumeloader.keras.ResumeCallback(loader, directory, save_every=None)
    pairs = loader.dataset().map(lambda x: (x, x))  # endless: read ahead into epoch 1
    model.fit(pairs, steps_per_epoch=loader.batches_per_epoch, epochs=1, verbose=0,
              callbacks=[callback])

print("done", flush=True)
