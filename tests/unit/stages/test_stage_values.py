"""Stages are checked frozen values: each refuses what its builder method refuses, with the
same message; order fields come from the field declarations; they pickle. No TensorFlow."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from resumeloader import Pipeline
from resumeloader.stages import (
    BucketStage,
    FixedBatchStage,
    MapStage,
    PackStage,
    PaddedBatchStage,
    PlainBatchStage,
    SamplerStage,
    TFMapStage,
    TokenBudgetStage,
    WindowedBatchStage,
)

_SEQUENCES = {"tokens": [np.arange(n) for n in (3, 1, 4, 2)]}

# (the stage made directly, the same arguments through the builder method)
CASES = [
    (lambda: FixedBatchStage(0), lambda p: p.batch(0)),
    (lambda: FixedBatchStage(-3), lambda p: p.batch(-3)),
    (lambda: FixedBatchStage("2"), lambda p: p.batch("2")),
    (lambda: FixedBatchStage(True), lambda p: p.batch(True)),
    (lambda: FixedBatchStage(2, drop_remainder=1), lambda p: p.batch(2, drop_remainder=1)),
    (lambda: PaddedBatchStage(2, pad_to=0), lambda p: p.padded_batch(2, pad_to=0)),
    (lambda: PaddedBatchStage(2, mask="yes"), lambda p: p.padded_batch(2, mask="yes")),
    (lambda: BucketStage(3, window=8), lambda p: p.bucket_by_length(3, window=8)),
    (lambda: BucketStage(2, window=0), lambda p: p.bucket_by_length(2, window=0)),
    (lambda: PackStage(0, window=0, batch_size=2), lambda p: p.pack(0, window=0, batch_size=2)),
    (lambda: PackStage(8, window=0, batch_size=2), lambda p: p.pack(8, window=0, batch_size=2)),
    (lambda: PackStage({"tokens": None}, window=4, batch_size=2),
     lambda p: p.pack({"tokens": None}, window=4, batch_size=2)),
    (lambda: TokenBudgetStage(8, window=4, boundaries=(5, 3)),
     lambda p: p.batch_by_tokens(8, window=4, boundaries=(5, 3))),
    (lambda: TokenBudgetStage(8, window=4, boundaries=5),
     lambda p: p.batch_by_tokens(8, window=4, boundaries=5)),
    (lambda: TokenBudgetStage(8, window=4, max_batch_size=0),
     lambda p: p.batch_by_tokens(8, window=4, max_batch_size=0)),
    (lambda: MapStage(3), lambda p: p.map(3)),
    (lambda: TFMapStage(None), lambda p: p.tf_map(None)),
]
IDS = ["batch-zero", "batch-negative", "batch-str", "batch-bool", "drop-int", "pad_to-zero",
       "mask-str", "window-not-multiple", "window-zero", "pack-zero", "pack-window-zero",
       "pack-length-none", "boundaries-decreasing", "boundaries-int", "max_batch_size-zero",
       "map-not-callable", "tf_map-not-callable"]


@pytest.mark.parametrize(("make", "build"), CASES, ids=IDS)
def test_stage_refuses_what_its_builder_refuses_with_the_same_message(make, build):
    """Made directly (as for `Pipeline.apply`) or by the builder: the same error."""
    with pytest.raises((TypeError, ValueError)) as direct:
        make()
    with pytest.raises((TypeError, ValueError)) as built:
        build(Pipeline(_SEQUENCES, seed=0))
    assert type(direct.value) is type(built.value)
    assert str(direct.value) == str(built.value)
    assert "Received:" in str(direct.value)


def test_stage_is_a_frozen_value_that_pickles():
    """A stage cannot be changed, compares by value and survives pickling."""
    stage = BucketStage(2, window=8, pad_to={"tokens": 6}, mask=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        stage.window = 4  # type: ignore[misc]
    assert stage == BucketStage(2, window=8, pad_to={"tokens": 6}, mask=True)
    assert pickle.loads(pickle.dumps(stage)) == stage
    assert stage.resized(4) == BucketStage(4, window=8, pad_to={"tokens": 6}, mask=True)


@pytest.mark.parametrize(
    ("stage", "fields"),
    [
        (FixedBatchStage(4), {}),
        (SamplerStage(10, shuffle=True),
         {"algorithm": "feistel-radix-mul-r4-v1", "shuffle": 1}),
        (PaddedBatchStage(3, pad_to=5, mask=True),
         {"pad_to": "5", "pad_value": "0", "mask": 1, "truncate": 0}),
        (BucketStage(2, window=6, pad_value={"b": 1, "a": -1}),
         {"algorithm": "sorted-chunks-v1", "window": 6, "batch_size": 2, "pad_to": "longest",
          "pad_value": "a:-1,b:1", "mask": 0, "truncate": 0}),
        (TokenBudgetStage(64, window=20, boundaries=[10, 20], max_batch_size=9, mask=True),
         {"algorithm": "sorted-token-budget-v1", "max_tokens": 64, "window": 20,
          "boundaries": "10,20", "max_batch_size": 9, "pad_to": "longest", "pad_value": "0",
          "mask": 1, "truncate": 0}),
        (PackStage(64, window=30, batch_size=3),
         {"algorithm": "first-fit-decreasing-v1", "length": "64", "window": 30,
          "batch_size": 3, "pad_value": "0"}),
    ],
    ids=["batch", "sampler", "padded_batch", "bucket", "tokens", "pack"],
)
def test_stage_order_fields_are_those_of_0_2(stage, fields):
    """The order fields derived from the declarations are the ones 0.2 wrote by hand."""
    assert stage.order_fields() == fields


def test_batch_stages_have_one_of_two_bases():
    """Plain stages cut consecutive positions; windowed ones group windows."""
    plain = (FixedBatchStage(2), PaddedBatchStage(2))
    windowed = (BucketStage(2, window=4), TokenBudgetStage(8, window=4), PackStage(8, window=4,
                                                                                   batch_size=2))
    assert all(isinstance(s, PlainBatchStage) and s.window is None for s in plain)
    assert all(isinstance(s, WindowedBatchStage) and s.window == 4 for s in windowed)
