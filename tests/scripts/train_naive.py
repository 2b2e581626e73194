"""The naive split pipeline of DESIGN.md, traced for the harness: it loses records on resume.

A checkpointed iterator over a pure-TF index dataset (shuffle + repeat) is fed through
``from_generator`` + ``map(py_function(augment))`` + ``batch`` + ``prefetch``. The
generator reads ahead of what training consumed, so the saved iterator position is
ahead of the truth. Same model, data and recorder protocol as `resumeloader._demo`.
"""

from __future__ import annotations

import argparse
import os

import keras
import numpy as np
import tensorflow as tf

from resumeloader import _demo, _trace

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--records", type=int, default=512)
parser.add_argument("--save-every", type=int, default=5)
args = parser.parse_args()

# No op determinism: with it, tf.data runs the generator without read-ahead (DESIGN.md).
keras.utils.set_random_seed(0)
recorder = _trace.TraceRecorder.from_env()
images, labels = _demo.make_data(args.records)
augment_rng = np.random.default_rng(0)  # Python state: never in the checkpoint


def augment(index):
    i = int(index)
    x, y = _demo.augment((images[i], labels[i]), augment_rng)
    return x, y, index


indices = tf.data.Dataset.range(args.records).shuffle(args.records, seed=0).repeat(args.epochs)
index_iterator = iter(indices)
ds = (
    tf.data.Dataset.from_generator(
        lambda: (yield from index_iterator), output_signature=tf.TensorSpec((), tf.int64)
    )
    .map(lambda i: tf.py_function(augment, [i], (tf.float32, tf.int32, tf.int64)))
    .map(lambda x, y, i: (tf.ensure_shape(x, (12, 12, 1)), tf.ensure_shape(y, ()), i))
    .batch(32)
    .prefetch(tf.data.AUTOTUNE)
)
model, optimizer, train_step = _demo.build_model()
step = tf.Variable(0, dtype=tf.int64, trainable=False)
checkpoint = tf.train.Checkpoint(
    model=model, optimizer=optimizer, indices=index_iterator, step=step
)
manager = tf.train.CheckpointManager(
    checkpoint, os.environ[_trace.ENV_CKPT_DIR], max_to_keep=2
)
if manager.latest_checkpoint:
    checkpoint.restore(manager.latest_checkpoint)
recorder.start(int(step.numpy()))
loss = float("nan")
for x, y, index in ds:
    loss = float(train_step(x, y))
    done = int(step.assign_add(1).numpy())
    recorder.step(done - 1, (x, y), records=index)
    if done % args.save_every == 0:
        manager.save(checkpoint_number=done, options=recorder.checkpoint_options())
        recorder.commit(done)
recorder.finish(weights=model.weights, loss=loss)
recorder.close()
