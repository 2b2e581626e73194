"""Golden vectors beyond the sampler: map_fn generators and a whole augmented loader stream.

Changing any of these values is a breaking change: a resumed run would see other
augmentations than the run that saved the checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import resumeloader

LOADER_DIGEST = "68ece07842db7abab63507d14979e1380c2efab3d2c7078a3b0c3d4d90d3bf00"

_STREAM_CODE = """
import hashlib, numpy as np, resumeloader as rl
images = (np.arange(50 * 3 * 4 * 4) % 251).astype(np.uint8).reshape(50, 4, 4, 3)
def augment(record, rng):
    image = record["image"]
    if rng.random() < 0.5:
        image = image[:, ::-1]
    return {"image": image, "label": record["label"],
            "noise": rng.normal(size=2).astype(np.float32)}
loader = rl.ResumableLoader({"image": images, "label": np.arange(50)}, batch_size=8, seed=11,
                            map_fn=augment, num_epochs=2)
digest = hashlib.sha256()
for batch in loader:
    for key in sorted(batch):
        digest.update(batch[key].numpy().tobytes())
print(digest.hexdigest())
"""


def test_record_rng_raw_stream_pinned():
    """The Philox stream of (seed, epoch, record) is pinned bit for bit."""
    raw = resumeloader.record_rng(7, 3, 12345).bit_generator.random_raw(4).tolist()
    assert raw == [
        7389255621106908487, 14807162725025886259, 7073283904656256018, 14070270774524353822,
    ]


def test_record_rng_draws_pinned():
    """Integer and float draws of a record generator are pinned."""
    rng = resumeloader.record_rng(2**64 - 1, 0, 0)
    assert rng.integers(0, 1000, 5).tolist() == [941, 4, 5, 472, 379]
    assert rng.random(2).tolist() == [0.12609005834690756, 0.7777088162380503]


def test_record_rng_keys_independent():
    """Neighbouring seeds, epochs and records give different streams."""
    draws = {
        tuple(resumeloader.record_rng(*key).bit_generator.random_raw(2).tolist())
        for key in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 1)]
    }
    assert len(draws) == 5


def test_loader_stream_digest_pinned_in_fresh_process():
    """Two epochs of an augmented loader hash to the pinned digest in a new interpreter."""
    env = dict(os.environ, PYTHONHASHSEED="4242", TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", _STREAM_CODE], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == LOADER_DIGEST


# The state 0.2 wrote for the loader below: 0.3 adds `source.identity` (a sampled digest of
# the array) and with it the fingerprint; a 0.2 state must still restore.
_STATE_0_2 = {
    "batch_size": 4,
    "epoch": 0,
    "fingerprint": "4b489a11f3880228",
    "offset": 12,
    "pipeline.seed": 1,
    "row": 0,
    "sampler.algorithm": "feistel-radix-mul-r4-v1",
    "sampler.shuffle": 1,
    "shard_count": 1,
    "shards.layout": "strided-v1",
    "source.num_records": 23,
    "version": 2,
}


def _pinned_loader() -> resumeloader.ResumableLoader:
    return resumeloader.ResumableLoader(np.arange(23), batch_size=4, seed=1, num_epochs=2)


def test_state_json_pinned():
    """The state a loader writes is pinned field for field (the checkpoint format, version 2)."""
    loader = _pinned_loader()
    loader.advance(3)
    assert json.loads(loader.serialize()) == {
        **_STATE_0_2,
        "fingerprint": "01c2ac99115ff841",
        "source.identity": "sampled-v1:4e316fade7afd696571e4b6abae5e5d5",
    }


def test_state_json_of_0_2_restores_same_position_and_stream():
    """The pinned 0.2 state (no content identity) restores at its position, same batches."""
    expected = _pinned_loader()
    expected.advance(3)
    loader = _pinned_loader()

    with pytest.warns(UserWarning, match="source.identity"):
        loader.set_state(_STATE_0_2)

    assert loader.position == expected.position == 12
    assert [b.numpy().tolist() for b in loader] == [b.numpy().tolist() for b in expected]
