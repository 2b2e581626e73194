"""Pipeline.batch_by_tokens: batches of at most T padded tokens, exact on resume."""

from __future__ import annotations

import _windowed as w
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumeloader import Pipeline, RecordSpecError, ResumableLoader
from resumeloader.stages.batching import tokens

pytestmark = pytest.mark.usefixtures("clean_keras")

LENGTHS = w.lengths(60, seed=6, high=30)


def _pipeline(**kwargs) -> Pipeline:
    options = {"window": 20, "mask": True}
    options.update(kwargs)
    return Pipeline(w.tokens(LENGTHS), seed=7).shuffle().batch_by_tokens(64, **options)


def _stage(max_tokens, window, boundaries=None, cap=None) -> tokens.TokenBudgetStage:
    return tokens.TokenBudgetStage(
        max_tokens, window=window, boundaries=boundaries, max_batch_size=cap, pad_value=-1,
        mask=True,
    )


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=60),
    max_tokens=st.integers(30, 200),
    boundaries=st.none() | st.lists(st.integers(1, 30), min_size=1, max_size=4, unique=True),
    cap=st.none() | st.integers(1, 10),
    seed=st.integers(0, 2**64 - 1),
)
def test_property_token_batches_hold_every_record_once_within_budget(
    lengths, max_tokens, boundaries, cap, seed
):
    """Every record of a window is in one batch, whole; each batch's padded size is at
    most max_tokens, its records at most max_batch_size, its lengths within one bucket."""
    bounds = None if boundaries is None else tuple(sorted(boundaries))
    stage = _stage(max_tokens, len(lengths), bounds, cap)
    columns = [w.tokens(lengths)]
    seen = []
    for group in stage.group(columns, w.TOKENS, seed=seed, epoch=0, window=4):
        values, mask = stage.assemble_group(columns, w.TOKENS, group)
        assert values.shape[0] * max(values.shape[1], 1) <= max_tokens
        assert cap is None or values.shape[0] <= cap
        sizes = [len(columns[0][s]) for s in group.slots.tolist()]
        if bounds is not None:
            assert len(set(np.searchsorted(bounds, sizes, side="right").tolist())) == 1
        assert w.unpad(values, mask) == [columns[0][s].tolist() for s in group.slots.tolist()]
        seen += group.slots.tolist()
    assert sorted(seen) == list(range(len(lengths)))


def test_batch_by_tokens_epoch_holds_every_record_once():
    """An epoch's batches hold each record once; each pads to at most max_tokens."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    records = []
    for values, mask in loader:
        assert values.shape[0] * values.shape[1] <= 64
        records += [w.record_of(r[0]) for r in w.unpad(values.numpy(), mask.numpy())]
    assert sorted(records) == list(range(60))
    assert loader.position == 60


def test_batch_by_tokens_position_after_each_batch_counts_its_records():
    """The position after a batch is the records of the batches so far."""
    loader = ResumableLoader.from_pipeline(_pipeline(), num_epochs=1)
    count = 0
    for values, _ in loader:
        count += values.shape[0]
        assert loader.position == count


def test_batch_by_tokens_record_longer_than_budget_raises_naming_it():
    """A record that alone exceeds max_tokens is a RecordSpecError naming it."""
    pipeline = Pipeline(w.tokens([3, 70, 2]), seed=0).batch_by_tokens(64, window=3)
    with pytest.raises(RecordSpecError, match=r"Record index 1 \(epoch 0, position 1\)") as info:
        next(iter(ResumableLoader.from_pipeline(pipeline)))
    assert "70 tokens does not fit a batch of max_tokens=64" in str(info.value)


def test_batch_by_tokens_boundaries_must_increase():
    """Boundaries that do not strictly increase are refused, as received."""
    with pytest.raises(ValueError, match="strictly increasing lengths") as info:
        _pipeline(boundaries=[8, 4])
    assert "Received: boundaries=[8, 4]" in str(info.value)


def test_batch_by_tokens_has_no_batch_size_to_change():
    """with_batch_size on a token-budget pipeline raises: its batches have no fixed size."""
    with pytest.raises(ValueError, match="no batch size to change") as info:
        _pipeline().with_batch_size(8)
    assert "max_tokens=64" in str(info.value)


def test_batch_by_tokens_order_fields_name_every_argument():
    """The budget, window, boundaries and cap are order fields of the state."""
    pipeline = _pipeline(boundaries=(10, 20), max_batch_size=9)
    state = ResumableLoader.from_pipeline(pipeline).get_state()
    assert {k: v for k, v in state.items() if k.startswith("tokens.")} == {
        "tokens.algorithm": "sorted-token-budget-v1",
        "tokens.max_tokens": 64,
        "tokens.window": 20,
        "tokens.boundaries": "10,20",
        "tokens.max_batch_size": 9,
        "tokens.pad_to": "longest",
        "tokens.pad_value": "0",
        "tokens.mask": 1,
        "tokens.truncate": 0,
    }
