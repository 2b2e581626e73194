"""Pipeline.tf_map: a function of TensorFlow ops on each batch, inside the loader's tf.data
graph, with per-record stateless seeds; the same bytes in every way of consuming it."""

from __future__ import annotations

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf

import resumeloader.keras
from resumeloader import Pipeline, ResumableLoader, Workers, testing
from resumeloader.tfdata import graph

pytestmark = pytest.mark.usefixtures("clean_keras")

IMAGES = np.arange(23 * 4 * 4 * 3, dtype=np.uint8).reshape(23, 4, 4, 3)


def augment(batch, seeds):
    """Per-record stateless flip and noise: exact only if every record gets its own seed."""

    def one(args):
        image, seed = args
        image = tf.image.stateless_random_flip_left_right(image, seed)
        noise = tf.random.stateless_uniform(tf.shape(image), seed, maxval=0.1)
        return tf.cast(image, tf.float32) / 255.0 + noise

    return tf.map_fn(one, (batch, seeds), fn_output_signature=tf.float32)


def _pipeline() -> Pipeline:
    return Pipeline(IMAGES, seed=5).shuffle().batch(4).tf_map(augment)


def _loader(**kwargs) -> ResumableLoader:
    return ResumableLoader.from_pipeline(_pipeline(), num_epochs=2, **kwargs)


def _bytes(batches) -> list[bytes]:
    return [b.numpy().tobytes() for b in batches]


def test_tf_map_for_loop_and_dataset_give_same_bytes():
    """`for batch in loader` and dataset() run the stage the same way: identical bytes."""
    loop = _bytes(_loader())
    data = _bytes(_loader().dataset())

    assert len(loop) == 12
    assert loop == data


@pytest.mark.parametrize(
    "workers",
    [{"workers": Workers(2, kind="thread")}, {"workers": Workers(2, kind="process")}],
    ids=["threads", "processes"],
)
def test_tf_map_with_workers_gives_same_bytes(workers):
    """Workers (a lambda stage is not sent to process workers) change nothing."""
    pipeline = (
        Pipeline(IMAGES, seed=5)
        .shuffle()
        .map(lambda_free_identity)
        .batch(4)
        .tf_map(lambda batch, seeds: augment(batch, seeds))
    )
    reference = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    parallel = ResumableLoader.from_pipeline(pipeline, num_epochs=1, **workers)

    assert _bytes(parallel) == _bytes(reference)


def lambda_free_identity(record, rng):
    """A picklable record stage, so that the pipeline has a Python part for the workers."""
    return record


def test_tf_map_seeds_are_the_metadata_seed_pairs():
    """fn receives each record's stateless seed pair, the one the metadata reports."""
    pipeline = Pipeline(np.arange(10), seed=3).shuffle().batch(4).tf_map(lambda b, s: s)
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1, with_metadata=True)

    for seeds, meta in loader:
        assert seeds.numpy().tolist() == meta["seed"].numpy().tolist()


@pytest.mark.parametrize("strings", [False, True], ids=["ints", "strings"])
def test_tf_map_seeds_without_metadata_are_the_metadata_seeds_when_produced(strings):
    """Batches produced in Python (a record stage) for a loader without metadata: the
    generator hands over the seeds alone (two leaves, not five), and fn gets the same seed
    pairs, in the same order, as with metadata."""
    data = [bytes([i]) * (i + 1) for i in range(10)] if strings else np.arange(10)

    def loader(**kwargs) -> ResumableLoader:
        pipeline = Pipeline(data, seed=3).map(lambda_free_identity).shuffle().batch(4).tf_map(
            lambda b, s: s)
        return ResumableLoader.from_pipeline(pipeline, num_epochs=1, **kwargs)

    plain, labelled = loader(), loader(with_metadata=True)
    assert len(tf.nest.flatten(plain._delivery.finisher.input_spec(4))) == 2
    assert len(tf.nest.flatten(labelled._delivery.finisher.input_spec(4))) == 5
    seeds = [b.numpy().tolist() for b in plain.dataset()]
    assert seeds == [meta["seed"].numpy().tolist() for _, meta in labelled.dataset()]
    assert seeds == [s.numpy().tolist() for s in plain] and len(seeds) == 3


def test_tf_map_keeps_batch_order_under_parallel_map():
    """Batches run in parallel but come out in order: the stage sees every batch once."""
    pipeline = Pipeline(np.arange(40), seed=0).batch(4).tf_map(lambda b, s: b * 2)
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)

    assert [x for b in loader.dataset() for x in b.numpy().tolist()] == list(range(0, 80, 2))


def test_tf_map_parses_and_decodes_serialized_examples():
    """The typical use: tf.io.parse_example + decode_jpeg on a batch of serialized records."""
    records = [_example(np.full((2, 2, 3), i * 20, np.uint8), i) for i in range(5)]

    def decode(batch, seeds):
        features = tf.io.parse_example(
            batch,
            {
                "image": tf.io.FixedLenFeature((), tf.string),
                "label": tf.io.FixedLenFeature((), tf.int64),
            },
        )
        images = tf.map_fn(
            lambda x: tf.io.decode_png(x, channels=3),
            features["image"],
            fn_output_signature=tf.TensorSpec((None, None, 3), tf.uint8),
        )
        return images, features["label"]

    pipeline = Pipeline(records, seed=0).batch(5).tf_map(decode)
    (images, labels), *_ = list(ResumableLoader.from_pipeline(pipeline, num_epochs=1))

    assert labels.numpy().tolist() == [0, 1, 2, 3, 4]
    assert images.numpy()[:, 0, 0, 0].tolist() == [0, 20, 40, 60, 80]


def _example(image: np.ndarray, label: int) -> bytes:
    feature = {
        "image": tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[tf.io.encode_png(image).numpy()])
        ),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_tf_map_element_spec_is_the_function_output():
    """The loader's element spec is what fn returns; describe() shows the stage."""
    loader = _loader()

    assert loader.element_spec == tf.TensorSpec((None, 4, 4, 3), tf.float32)
    assert next(iter(loader.dataset())).shape == (4, 4, 4, 3)
    assert "tf_map" in loader.describe()
    assert "augment(batch, seeds)" in loader.describe()
    assert graph.spec_text(loader.element_spec) == "float32[None,4,4,3]"


def test_tf_map_before_batch_raises_value_error():
    """A tensor stage runs on batches: before .batch() it is refused."""
    with pytest.raises(ValueError) as info:
        Pipeline(IMAGES, seed=0).tf_map(augment)

    assert "must come after the batch stage" in str(info.value)


def test_tf_map_not_callable_raises_type_error():
    """A non-callable fn is refused when the pipeline is built."""
    with pytest.raises(TypeError) as info:
        Pipeline(IMAGES, seed=0).batch(2).tf_map("augment")

    assert "`fn` must be callable" in str(info.value)


def test_tf_map_input_context_runs_on_each_replica_batch():
    """With distributed input the stage runs on each replica's batch, with its records' seeds."""
    pipeline = Pipeline(np.arange(16), seed=2).shuffle().batch(8, drop_remainder=True)
    pipeline = pipeline.tf_map(lambda b, s: (b, s[:, 1]))
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=1)
    context = tf.distribute.InputContext(
        num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=2
    )

    parts = list(loader.dataset(input_context=context))

    assert [b.shape[0] for b, _ in parts] == [4, 4, 4, 4]
    for records, seed_index in parts:
        assert records.numpy().tolist() == seed_index.numpy().tolist()


def test_tf_map_resumes_identically():
    """Random augmentation in the stage is exact after restores (both restore paths):
    mid-epoch, at the epoch boundary and in the second epoch (the conformance suite
    adds every default break point)."""
    testing.assert_resumes_identically(_loader, num_steps=8, break_points=[3, 6, 8])


def test_tf_map_keras_fit_trains_on_stage_output(tmp_path):
    """Keras fit on epoch_dataset of a pipeline with a stage that pads ragged tokens."""
    tokens = [np.arange(1, n + 2, dtype=np.int64) for n in range(12)]
    data = {"tokens": tokens, "label": np.arange(12, dtype=np.float32)}
    pipeline = Pipeline(data, seed=0).shuffle().batch(4)
    pipeline = pipeline.tf_map(lambda b, s: (b["tokens"].to_tensor(shape=(None, 16)), b["label"]))
    loader = ResumableLoader.from_pipeline(pipeline, num_epochs=2)
    model = keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Embedding(20, 2),
            keras.layers.Flatten(),
            keras.layers.Dense(1),
        ]
    )
    model.compile(optimizer="sgd", loss="mse")

    resume = resumeloader.keras.ResumeCallback(loader, tmp_path / "ckpt")
    history = model.fit(
        resumeloader.keras.epoch_dataset(loader), epochs=2, callbacks=[resume], verbose=0
    )

    assert len(history.history["loss"]) == 2
    assert loader.exhausted


def test_tf_map_loop_after_set_state_on_same_loader_restarts_there():
    """The loop's reused tf.data pipeline starts at the position of each new loop."""
    loader = _loader()
    first = [b.numpy().tobytes() for b in itertools.islice(loader, 3)]
    state = loader.get_state()
    rest = [b.numpy().tobytes() for b in itertools.islice(loader, 2)]

    loader.set_state(state)
    again = [b.numpy().tobytes() for b in itertools.islice(loader, 2)]
    loader.set_state(dict(state, offset=0))
    restart = [b.numpy().tobytes() for b in itertools.islice(loader, 3)]

    assert again == rest
    assert restart == first


def _fail_at_three(record, rng):
    if int(record) == 3:
        raise ValueError("bad record 3")
    return record


@pytest.mark.parametrize("way", ["for-loop", "dataset"])
def test_tf_map_pipeline_record_error_surfaces_with_message(way):
    """A failing map_fn before a tensor stage surfaces as tf.data's error with the message."""
    pipeline = Pipeline(np.arange(8), seed=0).map(_fail_at_three).batch(4)
    loader = ResumableLoader.from_pipeline(pipeline.tf_map(lambda b, s: b * 2), num_epochs=1)

    with pytest.raises(tf.errors.OpError) as info:
        list(loader) if way == "for-loop" else list(loader.dataset())

    assert "record index 3 (epoch 0, position 3)" in str(info.value)
    assert "bad record 3" in str(info.value)
    assert loader.position == 0
