"""A training job on a 70/30 mixture of two in-memory sources, for `resumeloader verify`.

It follows the recorder contract of the README ("Proving it on your own job"):
restores the latest checkpoint of ``RESUMELOADER_CKPT_DIR``, trains a linear model
with a custom loop on ``loader.dataset()`` + ``advance()`` (a ``map_fn`` adds keyed
noise), saves every --save-every steps and records every step with the records'
mixture keys. Op determinism is on, so identical batches give identical weights.
"""

from __future__ import annotations

import argparse
import os

import numpy as np


def sources() -> dict[str, dict[str, np.ndarray]]:
    """ "web" (300 records) and "code" (90): features and a target, no download."""
    rng = np.random.default_rng(0)
    made = {}
    for name, size, scale in (("web", 300, 1.0), ("code", 90, -2.0)):
        x = rng.normal(size=(size, 8)).astype(np.float32)
        made[name] = {"x": x, "y": (scale * x.sum(axis=1, keepdims=True)).astype(np.float32)}
    return made


def noisy(record: dict[str, np.ndarray], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The features with noise from the record's keyed generator, and the target."""
    return record["x"] + rng.normal(0.0, 0.1, size=8).astype(np.float32), record["y"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import resumeloader
    from resumeloader.testing import TraceRecorder

    tf.config.experimental.enable_op_determinism()
    recorder = TraceRecorder.from_env()
    pipeline = (
        resumeloader.Pipeline.mix(sources(), weights={"web": 0.7, "code": 0.3}, seed=3)
        .map(noisy)
        .batch(16)
    )
    loader = resumeloader.ResumableLoader.from_pipeline(
        pipeline, num_epochs=args.epochs, with_metadata=True
    )
    w = tf.Variable(tf.zeros((8, 1)))
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(w=w, loader=loader, step=step)
    manager = tf.train.CheckpointManager(checkpoint, os.environ["RESUMELOADER_CKPT_DIR"], 3)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_consumed()

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((x @ w - y) ** 2)
        w.assign_sub(0.05 * tape.gradient(loss, w))
        return loss

    recorder.start(int(step))
    loss = float("nan")
    for (x, y), meta in loader.dataset():
        loss = float(train_step(x, y))
        loader.advance()
        done = int(step.assign_add(1))
        recorder.step(done - 1, (x, y), records=meta["index"])
        if done % args.save_every == 0:
            manager.save(done, options=recorder.checkpoint_options())
            recorder.commit(done)
    recorder.finish(weights=[w], loss=loss)
    recorder.close()


if __name__ == "__main__":  # pytest --doctest-modules imports this file
    main()
