"""`Pipeline.map_batch`: vectorised Python augmentation once per batch, with each row's
exact (seed, epoch, record) randomness, in every worker backend and across restores."""

from __future__ import annotations

import weakref

import _worker_fns
import numpy as np
import pytest
import tensorflow as tf

from resumeloader import Pipeline, ResumableLoader, Workers
from resumeloader.errors import RecordError, RecordSpecError, StateMismatchError

_IMAGES = np.arange(60 * 6, dtype=np.float32).reshape(60, 6)
_LABELS = np.arange(60, dtype=np.int64)


def _by_record(loader: ResumableLoader) -> dict[int, np.ndarray]:
    """Every delivered row keyed by its record (the label is the record index)."""
    rows = {}
    for images, labels in loader:
        for image, label in zip(images.numpy(), labels.numpy(), strict=True):
            rows[int(label)] = image
    return rows


def _pipeline(batch_size: int, fn=_worker_fns.flip_scale_batch, **options) -> Pipeline:
    return (Pipeline((_IMAGES, _LABELS), seed=3).shuffle().batch(batch_size)
            .map_batch(fn, **options))


def test_map_batch_rows_are_the_same_at_any_batch_size():
    """A row-wise fn gives each record the same bytes whatever batch it lands in."""
    small = _by_record(ResumableLoader.from_pipeline(_pipeline(4), num_epochs=1))
    large = _by_record(ResumableLoader.from_pipeline(_pipeline(16), num_epochs=1))
    assert sorted(small) == list(range(60))
    for record, row in small.items():
        np.testing.assert_array_equal(row, large[record])
    assert not all(np.array_equal(small[r], _IMAGES[r]) for r in small)  # it augmented


@pytest.mark.parametrize(
    "workers", [Workers(2, kind="thread"), Workers(2, kind="process")],
    ids=["threads", "processes"],
)
def test_map_batch_in_workers_equals_the_calling_thread(workers):
    """Workers run the stage and give the calling thread's bytes, batch by batch."""
    inline = ResumableLoader.from_pipeline(_pipeline(8), num_epochs=2)
    other = ResumableLoader.from_pipeline(_pipeline(8), num_epochs=2, workers=workers)
    for (a, x), (b, y) in zip(inline, other, strict=True):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_map_batch_dataset_equals_the_eager_loop():
    """dataset() (no gather path: the stage runs in Python) yields the loop's batches."""
    loop = [a.numpy() for a, _ in ResumableLoader.from_pipeline(_pipeline(8), num_epochs=1)]
    loader = ResumableLoader.from_pipeline(_pipeline(8), num_epochs=1)
    graph = [a.numpy() for a, _ in loader.dataset()]
    assert len(loop) == len(graph) == 8
    for a, b in zip(loop, graph, strict=True):
        np.testing.assert_array_equal(a, b)


def test_map_batch_row_generators_differ_by_epoch():
    """Epoch 1 draws new randomness for a record (not epoch 0's again)."""
    loader = ResumableLoader.from_pipeline(_pipeline(60), num_epochs=2)
    (first, labels0), (second, labels1) = list(loader)
    row0 = first.numpy()[np.argsort(labels0.numpy())]
    row1 = second.numpy()[np.argsort(labels1.numpy())]
    assert not np.array_equal(row0, row1)


def test_rowwise_map_batch_restores_with_another_batch_size_exactly():
    """Elastic resume: a state saved at batch 4 continues at batch 12, each record's
    bytes those of the uninterrupted run."""
    uninterrupted = _by_record(ResumableLoader.from_pipeline(_pipeline(4), num_epochs=1))
    saved = ResumableLoader.from_pipeline(_pipeline(4), num_epochs=1)
    seen = {}
    for step, (images, labels) in enumerate(saved):
        seen.update(zip(labels.numpy().tolist(), images.numpy(), strict=True))
        if step == 2:
            break
    resumed = ResumableLoader.from_pipeline(_pipeline(12), num_epochs=1)
    resumed.set_state(saved.get_state())
    seen.update(_by_record(resumed))
    assert sorted(seen) == list(range(60))
    for record, row in seen.items():
        np.testing.assert_array_equal(row, uninterrupted[record])


def test_not_rowwise_map_batch_refuses_a_state_of_another_batch_size():
    """A batch-mixing fn depends on the batch size: it is an order field, and a state
    saved with another one is refused, naming it."""
    saved = ResumableLoader.from_pipeline(
        _pipeline(4, _worker_fns.mix_rows_batch_pair, rowwise=False), num_epochs=1)
    next(iter(saved))
    other = ResumableLoader.from_pipeline(
        _pipeline(6, _worker_fns.mix_rows_batch_pair, rowwise=False), num_epochs=1)
    with pytest.raises(StateMismatchError, match=r"map_batch\.batch_size"):
        other.set_state(saved.get_state())
    assert saved.get_state()["map_batch.batch_size"] == 4


def test_not_rowwise_map_batch_refuses_several_input_pipelines():
    """Distributed input over two pipelines would split the batch the fn mixes."""
    loader = ResumableLoader.from_pipeline(
        _pipeline(4, _worker_fns.mix_rows_batch_pair, rowwise=False), num_epochs=1)
    with pytest.raises(ValueError, match="not row-wise"):
        loader.dataset(input_context=tf.distribute.InputContext(2, 0, 2))


def _raises_on_record_with_label_7(batch, rngs):
    if 7 in batch[1]:
        raise ArithmeticError("bad batch")
    return batch


def _drops_a_row(batch, rngs):
    return batch[0][1:], batch[1][1:]


def test_map_batch_error_names_the_batch_and_chains_the_cause():
    loader = ResumableLoader.from_pipeline(
        _pipeline(5, _raises_on_record_with_label_7), num_epochs=1)
    with pytest.raises(RecordError, match="`map_batch` function raised ArithmeticError") as info:
        list(loader)
    assert isinstance(info.value.__cause__, ArithmeticError)
    assert info.value.epoch == 0


def test_map_batch_result_with_other_rows_is_refused():
    loader = ResumableLoader.from_pipeline(_pipeline(5, _drops_a_row), num_epochs=1)
    with pytest.raises(RecordSpecError, match="`map_batch` function returned a batch"):
        next(iter(loader))


def test_map_batch_output_signature_describes_a_changed_row():
    """A fn that changes a row's shape and dtype says so in `output_signature`."""

    def pool(batch, rngs):
        images, labels = batch
        return images.reshape(len(images), 3, 2).mean(axis=2), labels

    signature = (tf.TensorSpec((3,), tf.float32), tf.TensorSpec((), tf.int64))
    loader = ResumableLoader.from_pipeline(
        _pipeline(5, pool, output_signature=signature), num_epochs=1)
    images, labels = next(iter(loader))
    assert images.shape == (5, 3)
    np.testing.assert_allclose(images.numpy(), _IMAGES[labels.numpy()].reshape(5, 3, 2)
                               .mean(axis=2))


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda p: p.map_batch(_worker_fns.augment_batch), "add `.batch"),
        (lambda p: p.batch(4).tf_map(lambda b, s: b).map_batch(_worker_fns.augment_batch),
         "before the `tf_map`"),
        (lambda p: p.bucket_by_length(4, window=8).map_batch(_worker_fns.augment_batch),
         "plain batch stage"),
    ],
    ids=["unbatched", "after-tf_map", "windowed-batch-stage"],
)
def test_map_batch_placement_is_checked(build, match):
    with pytest.raises(ValueError, match=match):
        build(Pipeline(_IMAGES, seed=0))


def test_map_batch_function_must_be_callable():
    with pytest.raises(TypeError, match="`fn` must be callable"):
        Pipeline(_IMAGES, seed=0).batch(4).map_batch(3)


# -- out=True: the function writes into recycled aligned memory handed over uncopied --

_WIDE = np.arange(64 * 2048, dtype=np.float32).reshape(64, 2048) % 97  # 128 KiB batches
_WIDE_SIGNATURE = (tf.TensorSpec((2048,), tf.float32), tf.TensorSpec((), tf.int64))


def _wide(fn, out=False, **loader) -> ResumableLoader:
    pipeline = (Pipeline((_WIDE, _LABELS[:1].repeat(64) * 0 + np.arange(64)), seed=3)
                .shuffle().batch(16).map_batch(fn, output_signature=_WIDE_SIGNATURE, out=out))
    return ResumableLoader.from_pipeline(pipeline, num_epochs=2, **loader)


class _Recording:
    """`flip_scale_into`, recording the address of every `out` it was given."""

    def __init__(self) -> None:
        self.given: list[int] = []

    def __call__(self, batch, rngs, out):
        self.given.append(out[0].ctypes.data)
        assert out[0].ctypes.data % 64 == 0 and out[0].shape == (len(batch[1]), 2048)
        return _worker_fns.flip_scale_into(batch, rngs, out)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_map_batch_out_gives_the_same_stream_without_a_copy(prefetch):
    """out=True changes no value; each batch's tensor is the `out` it was given."""
    plain = [(a.numpy(), b.numpy()) for a, b in _wide(_worker_fns.flip_scale_batch)]
    fn = _Recording()
    kept = list(_wide(fn, out=True, prefetch=prefetch))  # every tensor alive at once

    assert len(kept) == len(plain) == 8
    for (a, b), (x, y) in zip(plain, kept, strict=True):
        np.testing.assert_array_equal(a, x.numpy())
        np.testing.assert_array_equal(b, y.numpy())
    assert [np.asarray(x).ctypes.data for x, _ in kept] == fn.given  # the same memory
    assert len(set(fn.given)) == 8  # no memory reused while its tensor lives


class _Keeping:
    """Writes into `out` and keeps it (or a view of it, or the batch it returns); on
    the next call it overwrites what it kept with -1."""

    def __init__(self, keep) -> None:
        self.keep = keep
        self.kept: list = []

    def __call__(self, batch, rngs, out):
        for old in self.kept:
            old = old() if isinstance(old, weakref.ref) else old
            np.asarray(old[0] if isinstance(old, tuple) else old)[...] = -1
        result = _worker_fns.flip_scale_into(batch, rngs, out)
        self.kept.append(self.keep(out, result))
        return result


@pytest.mark.parametrize(
    "keep",
    [lambda out, result: out[0], lambda out, result: out[0][:3],
     lambda out, result: result, lambda out, result: out,
     lambda out, result: weakref.ref(out[0])],
    ids=["array", "view", "result", "out", "weak-reference"],
)
def test_map_batch_out_kept_by_the_function_is_copied(keep):
    """An `out` the function still references after it returns is not handed over:
    overwriting it later changes no batch already handed out."""
    plain = [a.numpy() for a, _ in _wide(_worker_fns.flip_scale_batch)]
    kept = [a for a, _ in _wide(_Keeping(keep), out=True)]
    for a, x in zip(plain, kept, strict=True):
        np.testing.assert_array_equal(a, x.numpy())


@pytest.mark.parametrize(
    "workers", [Workers(2, kind="thread"), Workers(2, kind="process")],
    ids=["threads", "processes"],
)
def test_map_batch_out_in_workers_and_dataset_equals_the_loop(workers):
    loop = [a.numpy() for a, _ in _wide(_worker_fns.flip_scale_into, out=True)]
    other = [a.numpy() for a, _ in _wide(_worker_fns.flip_scale_into, out=True,
                                          workers=workers)]
    graph = [a.numpy() for a, _ in _wide(_worker_fns.flip_scale_into, out=True).dataset()]
    assert len(loop) == len(other) == len(graph) == 8
    for a, b, c in zip(loop, other, graph, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_map_batch_out_refuses_an_output_that_is_not_fixed_numeric():
    strings = (tf.TensorSpec((), tf.string), tf.TensorSpec((), tf.int64))
    pipeline = (Pipeline((_IMAGES, _LABELS), seed=3).batch(4)
                .map_batch(_worker_fns.flip_scale_into, output_signature=strings, out=True))
    with pytest.raises(ValueError, match=r"out=True.*fixed-shape numeric.*\[0\]"):
        next(iter(ResumableLoader.from_pipeline(pipeline, num_epochs=1)))
