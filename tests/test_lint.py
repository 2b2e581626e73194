"""The tree stays ruff-, mypy- and import-linter-clean (the README's development section)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "command",
    [
        [sys.executable, "-m", "ruff", "check", "."],
        [sys.executable, "-m", "mypy"],
        [str(pathlib.Path(sys.executable).parent / "lint-imports")],
    ],
    ids=["ruff", "mypy", "import-linter"],
)
def test_lint_tool_reports_no_issue(command):
    """ruff check, mypy and lint-imports (the layer contracts) exit 0 on the repository."""
    assert shutil.which(command[0])
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
