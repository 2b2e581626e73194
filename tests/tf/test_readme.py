"""The README's Keras and Distributed training sections: their ```python blocks run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("clean_keras")

README = Path(__file__).resolve().parents[2] / "README.md"
SECTIONS = ["Keras", "Distributed training"]


def python_blocks(heading: str) -> list[str]:
    """The fenced python blocks between ``## heading`` and the next ``## `` heading."""
    text = README.read_text()
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match is not None, f"README has no '## {heading}' section"
    return re.findall(r"^```python\n(.*?)^```", match.group(1), re.M | re.S)


@pytest.mark.parametrize("heading", SECTIONS, ids=["keras", "distributed"])
def test_readme_section_python_blocks_run(heading, tmp_path, monkeypatch):
    """Every python block of the section runs, in order, in one namespace, in a fresh directory."""
    blocks = python_blocks(heading)
    assert blocks, f"'## {heading}' has no python block"
    monkeypatch.chdir(tmp_path)  # the snippets write checkpoints to relative paths
    namespace: dict[str, object] = {"__name__": f"readme_{heading.split()[0].lower()}"}
    for number, block in enumerate(blocks):
        exec(compile(block, f"README.md ## {heading} block {number}", "exec"), namespace)
