"""`Pipeline.shuffle(block=...)`: the block order as an index stage (no TensorFlow needed)."""

from __future__ import annotations

import numpy as np
import pytest

from resumeloader import Pipeline
from resumeloader.core import blocks as core_blocks
from resumeloader.stages import blocks


@pytest.mark.parametrize(
    ("target", "mean", "per_file", "expected"),
    [
        (4 << 20, 3072.0, None, 1365),  # 4 MiB of 3 KiB records
        (4 << 20, 3072.0, [1250] * 16, 1250),  # one object per chunk
        (1 << 20, 3072.0, [1250] * 16, 250),  # a fifth of an object (1250 = 5 * 250)
        (16 << 20, 3072.0, [1250] * 15 + [7], 5000),  # four whole objects
        (4 << 20, 3072.0, [1000, 1300, 900], 1365),  # unequal files: not lined up
        (4 << 20, 3072.0, [100003] * 4, 1365),  # a prime count: no divisor near
    ],
    ids=["bytes", "one-object", "divisor", "whole-objects", "unequal", "prime"],
)
def test_resolve_chunk_lines_up_with_equal_files(target, mean, per_file, expected):
    """Bytes become records, lined up with files of equal counts within a factor of two."""
    assert blocks.resolve_chunk(target, mean, per_file) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4MiB", 4 << 20), ("8 MB", 8_000_000), ("512KiB", 512 << 10), ("100", 100), (77, 77)],
)
def test_parse_bytes_reads_units(text, expected):
    """Byte sizes: ints and strings with decimal or binary units."""
    assert blocks.parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["4 parsecs", "MiB", "-3MB", 0])
def test_parse_bytes_refuses_what_is_not_a_size(bad):
    """A size that is not one names what was received."""
    with pytest.raises(ValueError, match="block"):
        blocks.parse_bytes(bad)


def test_shuffle_block_order_fields_and_permutation():
    """The stage's order fields are the resolved chunk and window; each epoch a permutation."""
    pipeline = Pipeline(np.arange(100), seed=4).shuffle(chunk_records=10, window_chunks=3)
    fields = pipeline.order_fields()
    assert fields["blocks.chunk_records"] == 10 and fields["blocks.window_chunks"] == 3
    assert fields["blocks.algorithm"] == core_blocks.ALGORITHM
    assert "sampler.shuffle" not in fields
    order = pipeline.index_stage.indices(1, np.arange(100), seed=pipeline.seed)
    assert sorted(order.tolist()) == list(range(100))
    # the first window (30 positions) holds exactly three chunks of consecutive records
    assert len(set((order[:30] // 10).tolist())) == 3


def test_shuffle_block_calls_a_source_of_its_own_with_the_blocked_it_defines():
    """A source that overrides `blocked` without `window_chunks` (the older signature) is
    called without it; one that takes it gets the window."""
    from resumeloader.sources import ArraySource

    calls = []

    class Older(ArraySource):
        def blocked(self, block_records):
            calls.append(("older", block_records))
            return self

    class Newer(ArraySource):
        def blocked(self, block_records, *, window_chunks=1):
            calls.append(("newer", block_records, window_chunks))
            return self

    Pipeline(Older(np.arange(100)), seed=4).shuffle(chunk_records=10, window_chunks=3)
    Pipeline(Newer(np.arange(100)), seed=4).shuffle(chunk_records=10, window_chunks=3)
    assert calls == [("older", 10), ("newer", 10, 3)]


def test_shuffle_without_block_is_the_global_shuffle_again():
    """shuffle() after shuffle(block=...) is the global shuffle (its order fields)."""
    pipeline = Pipeline(np.arange(50), seed=4).shuffle(chunk_records=5).shuffle()
    assert pipeline.order_fields()["sampler.shuffle"] == 1
    assert "blocks.chunk_records" not in pipeline.order_fields()


def test_shuffle_block_needs_record_sizes_or_chunk_records():
    """A source that does not know its record sizes: the error says to pass chunk_records."""
    with pytest.raises(ValueError, match="chunk_records"):
        Pipeline(np.arange(50), seed=4).shuffle(block="1MiB")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"enabled": False, "chunk_records": 4}, "need enabled=True"),
        ({"block": "1MiB", "chunk_records": 4}, "not both"),
        ({"chunk_records": 0}, "chunk_records"),
        ({"chunk_records": 4, "window_chunks": 0}, "window_chunks"),
    ],
    ids=["disabled", "both", "zero-chunk", "zero-window"],
)
def test_shuffle_block_refuses_bad_arguments(kwargs, match):
    """Contradictory or out-of-range arguments are refused, naming them."""
    with pytest.raises(ValueError, match=match):
        Pipeline(np.arange(50), seed=4).shuffle(**kwargs)
