"""Batch memory in a real process: recycled, never reused while a batch is alive, and no
page faults per batch once TensorFlow's malloc patch is applied."""

from __future__ import annotations

import gc
import resource

import numpy as np
import pytest
import tensorflow as tf

from resumeloader import ResumableLoader, Workers
from resumeloader.core import buffers


def _apply_tensorflow_malloc_patch() -> None:
    """Iterates a ``from_generator`` dataset: TensorFlow then sets malloc's mmap
    threshold to 128 KiB for the whole process (once), as every real job gets it."""
    dataset = tf.data.Dataset.from_generator(
        lambda: iter([np.zeros(3)]), output_signature=tf.TensorSpec((3,), tf.float64))
    for _ in dataset:
        pass


def _cifar(num_records: int) -> tuple[np.ndarray, np.ndarray]:
    images = np.random.default_rng(3).integers(0, 256, (num_records, 32, 32, 3), np.uint8)
    return images, np.arange(num_records, dtype=np.int64)


@pytest.mark.parametrize(
    "workers", [Workers(), Workers(2, kind="thread"), Workers(1, kind="process")],
    ids=["inline", "threads", "process"],
)
def test_a_batch_buffer_is_not_reused_while_its_tensor_lives(workers):
    """Tensors of early batches keep their bytes while later batches recycle buffers."""
    images, labels = _cifar(2048)
    # 8 epochs: the inline loop's chunks grow to 21 batches, so same-size ones recur.
    loader = ResumableLoader((images, labels), batch_size=128, seed=4, num_epochs=8,
                             workers=workers)
    reused_before = buffers.POOL.reused
    kept = []
    for step, (image, label) in enumerate(loader):
        if step in (0, 7):
            kept.append((image, label))
        del image, label
    gc.collect()
    assert buffers.POOL.reused > reused_before  # the other batches' buffers came back
    for image, label in kept:
        np.testing.assert_array_equal(image.numpy(), images[label.numpy()])


def test_eager_loop_maps_no_fresh_memory_per_batch_after_tensorflows_patch():
    """``for batch in loader`` over CIFAR-like arrays: under one minor page fault per
    batch in steady state once TensorFlow's patch is applied (0.2 took ~290: three
    fresh 384 KiB regions per batch)."""
    _apply_tensorflow_malloc_patch()
    images, labels = _cifar(8192)
    loader = ResumableLoader((images, labels), batch_size=128, seed=0)
    batches = iter(loader)
    for _ in range(20):  # warm-up: the pool fills, prefetch starts
        next(batches)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    count = 200
    for _ in range(count):
        next(batches)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / count
    batches.close()
    assert faults < 5, f"{faults:.1f} minor page faults per batch"
