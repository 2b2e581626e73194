"""Sources without TensorFlow: what users pass is adapted to a `Source`, read the same
one record at a time and in batches; a mixture's record space is one index space."""

from __future__ import annotations

import numpy as np
import pytest

from resumeloader.sources import ArraySource, ConcatSource, IndexableSource, adapt


class _Records:
    """Any object with len() and __getitem__."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, index: int) -> np.ndarray:
        return np.array([index, -index])


@pytest.mark.parametrize(
    ("data", "kind"),
    [(np.arange(5), ArraySource), ({"x": np.arange(5), "y": np.arange(5) * 2}, ArraySource),
     (_Records(), IndexableSource)],
    ids=["array", "dict-of-arrays", "getitem-object"],
)
def test_adapt_reads_every_record_as_the_data_holds_it(data, kind):
    """Record i read through the adapted source is the data's record i."""
    source = adapt(data)
    assert isinstance(source, kind) and len(source) == 5
    first = source.read(3)
    want = data[3] if not isinstance(data, dict) else {k: v[3] for k, v in data.items()}
    if isinstance(want, dict):
        assert {k: int(v) for k, v in first.items()} == {k: int(v) for k, v in want.items()}
    else:
        np.testing.assert_array_equal(first, want)


def test_adapt_of_unreadable_object_raises_naming_what_it_needs():
    """An object without len() and __getitem__ is refused with what a source needs."""
    with pytest.raises(TypeError) as info:
        adapt(object())
    assert "Received:" in str(info.value)


def test_concat_source_locates_each_index_in_its_part():
    """A mixture's record index names its source, its lap and its record."""
    source = ConcatSource({"a": adapt(np.arange(3)), "b": adapt(np.arange(10, 14))})
    assert len(source) == 7
    assert source.locate(4) == ("b", 0, 1) and int(source.read(4)) == 11
    assert source.locate(7 + 2) == ("a", 1, 2) and int(source.read(9)) == 2
