"""A training job whose data is TFRecord objects in S3, for `resumeloader verify`.

The objects' URL pattern is the first argument; credentials and the endpoint come from
the standard environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ...), as a job on
a cloud machine has them. The pipeline reads the objects in the block order, parses each
record with ``tf_map`` and trains a linear model with a custom loop on
``loader.dataset()`` + ``advance()``, recording every step for the harness (the recorder
contract of docs/guides/proving-it.md). Op determinism is on.
"""

from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data", help="e.g. s3://bucket/train-*.tfrecord")
    parser.add_argument("--index-dir", required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=4)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import resumeloader
    from resumeloader.sources import TFRecordSource
    from resumeloader.testing import TraceRecorder

    tf.config.experimental.enable_op_determinism()
    recorder = TraceRecorder.from_env()

    def parse(batch: tf.Tensor, seeds: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        features = tf.io.parse_example(batch, {"x": tf.io.FixedLenFeature([4], tf.float32)})
        noise = tf.random.stateless_normal([tf.shape(batch)[0], 4], seed=seeds[0], stddev=0.1)
        x = features["x"] + noise
        return x, tf.reduce_sum(x, axis=1, keepdims=True)

    source = TFRecordSource(args.data, index_dir=args.index_dir)
    pipeline = resumeloader.Pipeline(source, seed=5).shuffle(block="4KiB").batch(8).tf_map(parse)
    loader = resumeloader.ResumableLoader.from_pipeline(
        pipeline, num_epochs=args.epochs, with_metadata=True
    )
    w = tf.Variable(tf.zeros((4, 1)))
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
