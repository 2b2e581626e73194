"""In-memory arrays without map_fn are gathered in tf.data: same stream as the generic path."""

from __future__ import annotations

import numpy as np
import pytest

import resumeloader


class _Records:
    """The same arrays behind __len__/__getitem__, which takes the generic path."""

    def __init__(self, source):
        self.source = source

    def __len__(self):
        return len(np.asarray(self.source["x"] if isinstance(self.source, dict) else self.source))

    def __getitem__(self, index):
        if isinstance(self.source, dict):
            return {key: value[index] for key, value in self.source.items()}
        return self.source[index]


_X = np.arange(23 * 3, dtype=np.float32).reshape(23, 3)
_COLUMNS = {"x": _X, "label": np.arange(23, dtype=np.int64) % 5}

CASES = {
    "array": (_X, {}),
    "dict-metadata": (_COLUMNS, {"with_metadata": True}),
    "drop-remainder-shard": (_X, {"drop_remainder": True, "shard_index": 1, "shard_count": 2}),
    "no-shuffle-uint8": (np.arange(23 * 2, dtype=np.uint8).reshape(23, 2), {"shuffle": False}),
    # 250 records in batches of 3: several 16-batch chunks, one spanning the epoch boundary.
    "chunks-across-epochs": (np.arange(250, dtype=np.int32), {"batch_size": 3}),
}


def _stream(loader):
    return [np.concatenate([np.ravel(a) for a in _leaves(batch)]) for batch in loader]


def _leaves(batch):
    if isinstance(batch, tuple):
        return [*_leaves(batch[0]), *_leaves(batch[1])]
    if isinstance(batch, dict):
        return [batch[key].numpy().astype(np.float64) for key in sorted(batch)]
    return [batch.numpy().astype(np.float64)]


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_array_source_stream_equals_generic_path(case):
    """Gathered batches equal, record for record, those of the per-record Python path."""
    source, options = CASES[case]
    kwargs = {"batch_size": 4, "seed": 9, "num_epochs": 2, **options}
    gathered = resumeloader.ResumableLoader(source, **kwargs)
    generic = resumeloader.ResumableLoader(_Records(source), **kwargs)
    assert "tf.gather" in gathered.describe() and "tf.gather" not in generic.describe()
    assert gathered.dataset().element_spec == generic.element_spec == gathered.element_spec
    got, want = _stream(gathered.dataset()), _stream(generic.dataset())
    assert len(got) == len(want) > 0
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_array_source_restore_mid_epoch_continues_exactly():
    """A restored gathering loader continues with the next batch of the full stream."""
    full = [b.numpy() for b in resumeloader.ResumableLoader(_X, batch_size=4, seed=2, num_epochs=2)]
    first = resumeloader.ResumableLoader(_X, batch_size=4, seed=2, num_epochs=2)
    head = [b.numpy() for _, b in zip(range(7), first.dataset(), strict=False)]
    first.advance(7)
    resumed = resumeloader.ResumableLoader(_X, batch_size=4, seed=2, num_epochs=2)
    resumed.set_state(first.get_state())
    tail = [b.numpy() for b in resumed.dataset()]
    assert len(head + tail) == len(full)
    for a, b in zip(head + tail, full, strict=True):
        np.testing.assert_array_equal(a, b)


def test_array_source_spec_mismatch_still_raises_record_spec_error():
    """An output_signature that the arrays do not match takes the checking path."""
    import tensorflow as tf

    loader = resumeloader.ResumableLoader(
        _X, batch_size=4, seed=0, output_signature=tf.TensorSpec((3,), tf.float64)
    )
    assert loader.describe().count("tf.gather") == 0  # the checking path, not the gather one
    with pytest.raises(resumeloader.RecordSpecError) as excinfo:
        next(iter(loader))
    assert "float64[3]" in str(excinfo.value)
