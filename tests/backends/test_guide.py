"""The Keras guide's "Keras on JAX and PyTorch" section runs on the backend in use.

tests/test_docs.py runs the whole page on TensorFlow (in a process of its own, where its
op determinism cannot leak into other tests); here its section runs again under
``KERAS_BACKEND=jax`` and ``torch``, in the tier's process.
"""

from __future__ import annotations

from pathlib import Path

import _pages
import keras
import pytest

ROOT = Path(__file__).resolve().parents[2]

PAGE = ROOT / "docs" / "guides" / "keras.md"
SECTION = "Keras on JAX and PyTorch"


@pytest.mark.skipif(keras.backend.backend() == "tensorflow",
                    reason="tests/test_docs.py runs the page on TensorFlow")
def test_keras_guide_backend_section_runs(tmp_path, monkeypatch):
    """Every python block of the section runs, in order, in a fresh directory."""
    monkeypatch.chdir(tmp_path)

    ran = _pages.run(PAGE, section=SECTION)

    assert ran == len(_pages.runnable(PAGE, section=SECTION)) >= 1
    assert (tmp_path / "run").is_dir()


def test_keras_guide_section_lines_end_at_the_next_heading():
    """The section ends where the next heading of its level starts."""
    lines = PAGE.read_text().splitlines()
    inside = _pages.section_lines(PAGE, SECTION)

    assert lines[inside.start - 1] == f"## {SECTION}"
    assert lines[inside.stop - 1].startswith("## ")
    assert not any(line.startswith("## ") for line in lines[inside.start : inside.stop - 1])
