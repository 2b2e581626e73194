"""In-memory arrays without map_fn are gathered in tf.data: same stream as the generic path."""

from __future__ import annotations

import itertools
import subprocess
import sys

import _limits
import numpy as np
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import Shard


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


def _placed(array, misalignment):
    """A copy of `array` whose data starts `misalignment` bytes past a 64-byte boundary."""
    raw = np.empty(array.nbytes + 128, np.uint8)
    start = -raw.ctypes.data % 64 + misalignment
    placed = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    placed[...] = array
    return placed


def _read_only(array):
    array = array.copy()
    array.flags.writeable = False
    return array


_X = np.arange(23 * 3, dtype=np.float32).reshape(23, 3)
_COLUMNS = {"x": _X, "label": np.arange(23, dtype=np.int64) % 5}

CASES = {
    "array": (_X, {}),
    "dict-metadata": (_COLUMNS, {"with_metadata": True}),
    "drop-remainder-shard": (_X, {"drop_remainder": True, "shard": Shard(1, 2)}),
    "no-shuffle-uint8": (np.arange(23 * 2, dtype=np.uint8).reshape(23, 2), {"shuffle": False}),
    # 250 records in batches of 3: several 16-batch chunks, one spanning the epoch boundary.
    "chunks-across-epochs": (np.arange(250, dtype=np.int32), {"batch_size": 3}),
    # Read in place, or gathered by NumPy when TensorFlow cannot address the array.
    "aligned-in-place": (_placed(_X, 0), {}),
    "unaligned-numpy-gathered": (_placed(_X, 16), {}),
    "strided-view-numpy-gathered": (
        np.arange(23 * 6, dtype=np.float32).reshape(23, 6)[:, ::2], {}),
    "read-only-numpy-gathered": (_read_only(_X), {}),
    "big-endian-numpy-gathered": (np.arange(23 * 2, dtype=">i4").reshape(23, 2), {}),
    "dict-mixed-alignment": ({"x": _placed(_X, 0), "b": _placed(_X[:, 0], 8)}, {}),
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
    text, plain = gathered.describe(), generic.describe()
    assert "tf.gather" not in plain and "by NumPy" not in plain
    # in place (tf.gather) or, for an array TensorFlow cannot address, by NumPy: said so
    assert ("by NumPy" in text) if "numpy-gathered" in case else ("tf.gather" in text
                                                                  or "by NumPy" in text)
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


# 17,000,000 records of 16 float32: 1.01 GiB, past the 1 GiB at which the gather path
# used to switch off.
_GIB_ROWS = 17_000_000


def _virtual_zeros(rows, width):
    """A 64-byte aligned float32 array whose pages stay virtual until written (calloc)."""
    size = rows * width * 4
    raw = np.zeros(size + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + size].view(np.float32).reshape(rows, width)


def test_array_source_above_1_gib_gathers_the_generic_stream():
    """An array above 1 GiB takes the gather path; its batches equal the generic path's."""
    big = _virtual_zeros(_GIB_ROWS, 16)
    options = {"batch_size": 64, "seed": 3, "num_epochs": 1, "with_metadata": True}
    generic = resumeloader.ResumableLoader(_Records(big), **options)
    # Mark only the records the first 20 batches (two chunks) read: few pages touched.
    for _, meta in itertools.islice(generic.dataset(), 20):
        index = meta["index"].numpy()
        big[index] = index[:, None] + np.arange(16, dtype=np.float32)
    gathered = resumeloader.ResumableLoader(big, **options)
    assert "tf.gather" in gathered.describe()
    got = list(itertools.islice(gathered.dataset(), 20))
    want = list(itertools.islice(generic.dataset(), 20))
    assert len(got) == len(want) == 20
    for (batch, meta), (expected, expected_meta) in zip(got, want, strict=True):
        np.testing.assert_array_equal(meta["index"].numpy(), expected_meta["index"].numpy())
        np.testing.assert_array_equal(batch.numpy(), expected.numpy())
        assert batch.numpy()[:, 0].tolist() == meta["index"].numpy().astype(np.float32).tolist()


_MEMORY_CODE = """
import sys
import numpy as np
import resumeloader

def status(field):
    # VmHWM is this process's own peak (ru_maxrss would include the parent's at fork).
    with open("/proc/self/status") as lines:
        line = next(line for line in lines if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024

where, rows = sys.argv[1], int(sys.argv[2])
num_loaders = int(sys.argv[3]) if len(sys.argv) > 3 else 1
warm = resumeloader.ResumableLoader(np.zeros((300, 16), np.float32), batch_size=128, seed=0)
for _ in zip(range(3), warm.dataset()):
    pass
if where == "aligned":
    raw = np.empty(rows * 64 + 128, np.uint8)
    start = -raw.ctypes.data % 64
    data = raw[start : start + rows * 64].view(np.float32).reshape(rows, 16)
    data[...] = 1.5
else:  # a real .npy file: np.load's array starts 16 bytes past a 64-byte boundary
    np.save(where, np.full((rows, 16), 1.5, np.float32))
    data = np.load(where)
    assert data.ctypes.data % 64, "np.load gave an aligned array: nothing tested"
before = status("VmRSS")
loaders = [resumeloader.ResumableLoader(data, batch_size=4096, seed=0, num_epochs=2)
           for _ in range(num_loaders)]
for loader in loaders:
    for _ in loader.dataset():  # two epochs through one iterator
        pass
    for _ in loader.dataset(rest_of_epoch=True):  # and a second iterator
        pass
peak = status("VmHWM")
print((peak - before) / data.nbytes)
"""


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads the peak RSS from /proc (Linux)")
@pytest.mark.parametrize("where", ["aligned", "npy"], ids=["aligned-in-place", "np-load-file"])
def test_array_source_dataset_peak_memory_bounded(where, tmp_path):
    """dataset() over 183 MB of arrays, aligned or as np.load reads a .npy file (16 bytes
    off alignment), adds at most 0.3 times their size to peak RSS with one loader and
    then a second over the same array: no copy of the array (0.3 copied an unaligned
    array whole, 0.2 once per loader). (The peak is never lower than after the first
    loader alone, so this bounds a single loader's too: that case's own run went.)"""
    where = where if where == "aligned" else str(tmp_path / "data.npy")
    result = subprocess.run(
        [sys.executable, "-c", _MEMORY_CODE, where, "3000000", "2"],
        capture_output=True,
        text=True,
        timeout=_limits.PROCESS,
        check=True,
    )
    added = float(result.stdout.strip().splitlines()[-1])
    assert added <= 0.3, f"peak RSS grew by {added:.2f}x the data"


def test_array_source_np_load_file_stream_equals_generic_path(tmp_path):
    """An array read from a .npy file by np.load (wherever it lands) gives the generic
    path's stream through dataset() and the for-loop."""
    path = tmp_path / "images.npy"
    np.save(path, np.arange(300 * 8, dtype=np.float32).reshape(300, 8))
    data = np.load(path)
    options = {"batch_size": 16, "seed": 4, "num_epochs": 1}
    want = _stream(resumeloader.ResumableLoader(_Records(data), **options).dataset())
    for got in (_stream(resumeloader.ResumableLoader(data, **options).dataset()),
                _stream(resumeloader.ResumableLoader(data, **options))):
        assert len(got) == len(want) > 0
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_array_source_eager_loop_equals_generic_path(case):
    """``for batch in loader`` over arrays (chunks gathered by NumPy in the loop's thread,
    each batch a view of its chunk) hands out the per-record path's batches: values,
    dtypes and shapes, and the same position after each."""
    source, options = CASES[case]
    kwargs = {"batch_size": 4, "seed": 9, "num_epochs": 2, **options}

    def run(loader):
        out = []
        for batch in loader:
            specs = tf.nest.map_structure(lambda t: (t.dtype, tuple(t.shape)), batch)
            out.append((_leaves(batch), specs, loader.position))
        return out

    got = run(resumeloader.ResumableLoader(source, **kwargs))
    want = run(resumeloader.ResumableLoader(_Records(source), **kwargs))
    assert len(got) == len(want) > 0
    for (a, spec_a, end_a), (b, spec_b, end_b) in zip(got, want, strict=True):
        assert (spec_a, end_a) == (spec_b, end_b)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
