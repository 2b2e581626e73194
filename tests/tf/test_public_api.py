"""Tests of the package surface: exports, lazy TensorFlow import, version."""

from __future__ import annotations

import subprocess
import sys

import pytest

import resumeloader


def test_all_sorted_and_importable():
    """__all__ is sorted and every name in it resolves."""
    assert list(resumeloader.__all__) == sorted(resumeloader.__all__)
    for name in resumeloader.__all__:
        assert getattr(resumeloader, name) is not None


def test_import_does_not_load_tensorflow():
    """`import resumeloader` and the sampler stay TensorFlow-free (workers rely on it)."""
    code = (
        "import sys, resumeloader; resumeloader.IndexSampler(10, seed=0)[3];"
        "print('tensorflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_errors_refine_builtins():
    """Library errors subclass the built-in exceptions they refine."""
    assert issubclass(resumeloader.StateMismatchError, ValueError)
    assert issubclass(resumeloader.ElasticResumeError, resumeloader.StateError)
    assert issubclass(resumeloader.RecordError, RuntimeError)
    assert issubclass(resumeloader.RecordSpecError, ValueError)


def test_unknown_attribute_raises_attribute_error():
    """A misspelt name raises AttributeError, not an import error."""
    with pytest.raises(AttributeError) as info:
        resumeloader.ResumableLoder  # noqa: B018
    assert "ResumableLoder" in str(info.value)


def test_version_is_pep440_string():
    """__version__ is a non-empty version string."""
    assert resumeloader.__version__[0].isdigit()
