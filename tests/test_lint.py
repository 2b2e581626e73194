"""The tree stays ruff- and mypy-clean (as the README's development section promises)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "command",
    [[sys.executable, "-m", "ruff", "check", "."], [sys.executable, "-m", "mypy"]],
    ids=["ruff", "mypy"],
)
def test_lint_tool_reports_no_issue(command):
    """ruff check and mypy exit 0 on the repository."""
    assert shutil.which(command[0])
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
