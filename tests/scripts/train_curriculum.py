"""A curriculum training job for `resumeloader verify`: mixture weights change mid-run
and a range of batches is skipped (the loss-spike recipe), both at fixed positions.

It follows the recorder contract (docs/guides/proving-it.md) like ``train_mix.py``:
restores the latest checkpoint of ``RESUMELOADER_CKPT_DIR``, trains a linear model with
a custom loop on ``loader.dataset()`` + ``advance()``, saves every 5 steps and records
every step with the records' mixture keys. The web:code weights go from 7:3 to 1:1 at
position 96 (step 6 of batches of 16) and positions [176, 240) (4 batches) are
skipped; op determinism is on, so identical batches give identical weights.
"""

from __future__ import annotations

import os

from train_mix import noisy, sources


def main() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import resumeloader
    from resumeloader.testing import TraceRecorder

    tf.config.experimental.enable_op_determinism()
    recorder = TraceRecorder.from_env()
    pipeline = (
        resumeloader.Pipeline.mix(sources(), weights={"web": 0.7, "code": 0.3}, seed=5)
        .amend(96, weights={"web": 1, "code": 1})
        .skip(176, 240)
        .map(noisy)
        .batch(16)
    )
    loader = resumeloader.ResumableLoader.from_pipeline(
        pipeline, num_epochs=2, with_metadata=True
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
        if done % 5 == 0:
            manager.save(done, options=recorder.checkpoint_options())
            recorder.commit(done)
    recorder.finish(weights=[w], loss=loss)
    recorder.close()


if __name__ == "__main__":  # pytest --doctest-modules imports this file
    main()
