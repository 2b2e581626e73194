"""The demo's training job: a small Keras model on built-in data, checkpointed, traced.

Run as ``python -m resumeloader.tools.demo`` (by ``resumeloader demo`` / the harness):
it restores the latest checkpoint of ``RESUMELOADER_CKPT_DIR`` if there is one,
trains with a custom loop on a `ResumableLoader` (random augmentation in
``map_fn``, batch, prefetch), saves every few steps with a `CheckpointManager`,
and records every step with a `TraceRecorder`. Op determinism is enabled, so two
runs that see the same batches end with bit-identical weights.

``--pipeline naive`` trains the same model on the common workaround (docs/getting-started.md, "Why")
instead: a checkpointed iterator over a TF index dataset fed through
``from_generator`` + ``map(py_function)`` + ``batch`` + ``prefetch``, with the
augmentation drawing from one NumPy generator. It loses records on restore (the
generator reads ahead of the saved iterator), which ``resumeloader demo --naive``
and the tests show. It runs without op determinism: with it, tf.data does not read
ahead and the loss disappears (at a cost to every op).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["augment", "build_model", "make_data", "train"]

PIPELINES = ("resumeloader", "naive")

IMAGE_SIZE = 12
NUM_CLASSES = 4


def make_data(num_records: int, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Noisy 12x12 images of 4 bar patterns (uint8) and their labels; no download.

    A pure function of its arguments.

    Examples:
        >>> images, labels = make_data(8)
        >>> images.shape, images.dtype.name, labels[:4].tolist()
        ((8, 12, 12), 'uint8', [0, 1, 2, 3])
    """
    rng = np.random.default_rng(seed)
    labels = np.arange(num_records) % NUM_CLASSES
    templates = np.zeros((NUM_CLASSES, IMAGE_SIZE, IMAGE_SIZE), np.float32)
    templates[0, 4:8, :] = 1.0  # horizontal bar
    templates[1, :, 4:8] = 1.0  # vertical bar
    templates[2][np.eye(IMAGE_SIZE, dtype=bool)] = 1.0  # diagonal
    templates[3, 2:10, 2:10] = 1.0  # square
    noise = rng.normal(0.0, 0.35, size=(num_records, IMAGE_SIZE, IMAGE_SIZE))
    images = np.clip((templates[labels] + noise) * 200.0 + 20.0, 0, 255).astype(np.uint8)
    return images, labels.astype(np.int32)


def augment(record: Any, rng: np.random.Generator) -> tuple[np.ndarray, np.int32]:
    """Random flip, shift by up to 2 pixels and noise; `rng` is keyed per record."""
    image, label = record
    x = image.astype(np.float32) / 255.0
    if rng.random() < 0.5:
        x = x[:, ::-1]
    x = np.roll(x, shift=tuple(rng.integers(-2, 3, size=2)), axis=(0, 1))
    x = x + rng.normal(0.0, 0.05, size=x.shape).astype(np.float32)
    return x[..., None].astype(np.float32), np.int32(label)


def build_model() -> tuple[Any, Any, Any]:
    """The demo's Keras CNN, its built Adam optimizer and a compiled training step."""
    import keras
    import tensorflow as tf

    model = keras.Sequential(
        [
            keras.Input((IMAGE_SIZE, IMAGE_SIZE, 1)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(NUM_CLASSES),
        ]
    )
    optimizer = keras.optimizers.Adam(1e-2)
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def train_step(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return model, optimizer, train_step


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m resumeloader.tools.demo")
    parser.add_argument("--ckpt-dir", default=os.environ.get("RESUMELOADER_CKPT_DIR"))
    parser.add_argument("--pipeline", choices=PIPELINES, default="resumeloader")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--records", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--save-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _resumeloader_pipeline(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """(batches of ((x, y), record ids), trackable to checkpoint, after-step hook)."""
    from resumeloader.tfdata import loader as loader_lib

    loader = loader_lib.ResumableLoader(
        make_data(args.records, seed=args.seed),
        batch_size=args.batch_size,
        seed=args.seed,
        num_epochs=args.epochs,
        map_fn=augment,
        with_metadata=True,
    )
    batches = (((x, y), meta["index"]) for (x, y), meta in loader.dataset())
    return batches, loader, loader.advance


def _naive_pipeline(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The same, as the common workaround: the generator reads ahead of the saved iterator."""
    import tensorflow as tf

    images, labels = make_data(args.records, seed=args.seed)
    shared_rng = np.random.default_rng(args.seed)  # Python state: never checkpointed

    def load(index: Any) -> tuple[np.ndarray, np.int32, Any]:
        i = int(index)
        x, y = augment((images[i], labels[i]), shared_rng)
        return x, y, index

    indices = tf.data.Dataset.range(args.records).shuffle(args.records, seed=args.seed)
    iterator = iter(indices.repeat(args.epochs))
    ds = (
        tf.data.Dataset.from_generator(
            lambda: (yield from iterator), output_signature=tf.TensorSpec((), tf.int64)
        )
        .map(lambda i: tf.py_function(load, [i], (tf.float32, tf.int32, tf.int64)))
        .map(lambda x, y, i: ((tf.ensure_shape(x, (IMAGE_SIZE, IMAGE_SIZE, 1)), y), i))
        .batch(args.batch_size)
        .prefetch(tf.data.AUTOTUNE)
    )
    return iter(ds), iterator, lambda: None


def train(argv: Sequence[str] | None = None) -> None:
    """Trains (or resumes) the demo job; see the module docstring."""
    args = _parse(argv)
    if not args.ckpt_dir:
        raise SystemExit("--ckpt-dir (or RESUMELOADER_CKPT_DIR) is required")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from resumeloader.tools import trace as trace_lib

    if args.pipeline == "resumeloader":
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(args.seed)
    recorder = trace_lib.TraceRecorder.from_env()
    make = _resumeloader_pipeline if args.pipeline == "resumeloader" else _naive_pipeline
    batches, data_state, after_step = make(args)
    model, optimizer, train_step = build_model()
    step = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, data=data_state, step=step)
    manager = tf.train.CheckpointManager(checkpoint, args.ckpt_dir, max_to_keep=2)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_consumed()

    recorder.start(int(step.numpy()))
    loss = float("nan")
    for (x, y), ids in batches:
        loss = float(train_step(x, y))
        after_step()
        done = int(step.assign_add(1).numpy())
        recorder.step(done - 1, (x, y), records=ids)
        if done % args.save_every == 0:
            manager.save(checkpoint_number=done, options=recorder.checkpoint_options())
            recorder.commit(done)
    recorder.finish(weights=model.weights, loss=loss)
    recorder.close()


if __name__ == "__main__":
    train()
