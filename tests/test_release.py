"""The release notes: the version matches the changelog, and the changelog stays for users.

CHANGELOG.md says what changed for users, one to three short lines an entry, newest
version first; why and what was measured go to docs/decisions.md. No TensorFlow here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from resumeloader import _version

ROOT = Path(__file__).resolve().parents[1]
CHANGELOG = ROOT / "CHANGELOG.md"
MAX_BYTES = 30 * 1024
HEADING = re.compile(r"^## \[(\d+)\.(\d+)\.(\d+)\] - (.+)$", re.MULTILINE)
# Internal tracker references ("issue 24", "issues 12 and 15", "#31") and machine loads
# ("load 7.8", "load average 3", "shared machine") belong nowhere in the user's notes.
INTERNAL = [
    (re.compile(r"\bissues? \d+", re.IGNORECASE), "an internal issue reference"),
    (re.compile(r"(?<![\w&])#\d+\b"), "an internal issue reference"),
    (re.compile(r"\bload (average )?[\d~]", re.IGNORECASE), "a machine load"),
    (re.compile(r"\b(shared|loaded|idle) machine\b", re.IGNORECASE), "a machine load"),
]


def _text() -> str:
    return CHANGELOG.read_text(encoding="utf-8")


def _entries(text: str) -> list[tuple[int, list[str]]]:
    """Each list entry as (its first line number, its lines): a `- ` line and its indented rest."""
    entries: list[tuple[int, list[str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("- "):
            entries.append((number, [line]))
        elif line.startswith("  ") and line.strip() and entries:
            entries[-1][1].append(line)
    return entries


def test_version_equals_the_newest_changelog_heading():
    """`__version__` is the version of CHANGELOG.md's first `## [X.Y.Z]` heading."""
    newest = HEADING.search(_text())

    assert newest is not None
    assert _version.__version__ == ".".join(newest.groups()[:3])


def test_changelog_headings_are_newest_first_and_only_the_newest_unreleased():
    """Versions descend, through the notes of the versions before 0.3 kept in the docs;
    every heading but the first has a date (YYYY-MM-DD)."""
    early = (ROOT / "docs" / "early-history.md").read_text(encoding="utf-8")
    headings = HEADING.findall(_text() + "\n" + early)
    versions = [tuple(int(part) for part in heading[:3]) for heading in headings]

    assert len(versions) >= 4
    assert versions == sorted(versions, reverse=True)
    undated = [h for h in headings[1:] if not re.match(r"\d{4}-\d{2}-\d{2}\b", h[3])]
    assert undated == []


def test_changelog_stays_under_30_kb():
    """CHANGELOG.md is at most 30 KB: entries say what changed, the reasons live elsewhere."""
    size = len(_text().encode("utf-8"))

    assert size <= MAX_BYTES, (
        f"CHANGELOG.md is {size} bytes, over {MAX_BYTES}: shorten entries to what changed for "
        "users; move reasons and measurements to docs/decisions.md."
    )


@pytest.mark.parametrize(("pattern", "what"), INTERNAL, ids=["issue", "hash", "load", "machine"])
def test_changelog_has_no_internal_references_or_machine_loads(pattern, what):
    """No line of CHANGELOG.md names an internal issue or a machine load."""
    found = [f"line {number}: {line.strip()}"
             for number, line in enumerate(_text().splitlines(), start=1)
             if pattern.search(line)]

    assert found == [], f"CHANGELOG.md holds {what} (users cannot use it):\n" + "\n".join(found)


def test_changelog_entries_are_one_to_three_short_lines():
    """Every entry is at most 3 lines of at most 100 characters."""
    entries = _entries(_text())
    too_long = [f"line {number}: {lines[0][:60]}..." for number, lines in entries
                if len(lines) > 3 or any(len(line) > 100 for line in lines)]

    assert len(entries) > 100
    assert too_long == [], (
        "CHANGELOG.md entries longer than 3 lines of 100 characters (say what changed for users "
        "and what to do; reasons and measurements go to docs/decisions.md):\n" + "\n".join(too_long)
    )


def test_changelog_entry_reader_counts_continuation_lines():
    """The entry reader gives an entry its indented lines, so the length check can fail."""
    text = "## [1.0.0] - 2026-01-01\n\n### Added\n- one\n  two\n  three\n  four\n- five\n"

    assert _entries(text) == [(4, ["- one", "  two", "  three", "  four"]), (8, ["- five"])]


def _declared() -> set[str]:
    """Every distribution pyproject.toml names: dependencies and every extra."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = [*project["dependencies"],
                    *(r for extra in project["optional-dependencies"].values() for r in extra)]
    return {_normal(re.match(r"[A-Za-z0-9._-]+", r).group(0)) for r in requirements}


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_package_the_library_imports_is_declared():
    """Each top-level package imported anywhere in resumeloader/ (lazily too) is a
    distribution named in pyproject.toml: its dependencies or an extra."""
    import ast
    import importlib.metadata
    import sys

    imported: dict[str, str] = {}
    for path in sorted((ROOT / "resumeloader").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0
                     and node.module else [])
            for name in names:
                imported.setdefault(name.split(".")[0], str(path.relative_to(ROOT)))
    distributions = importlib.metadata.packages_distributions()
    declared = _declared()
    missing = {
        module: where for module, where in imported.items()
        if module not in sys.stdlib_module_names and module != "resumeloader"
        and not any(_normal(d) in declared for d in distributions.get(module, [module]))
    }
    assert len(imported) > 20  # the scan saw the library's imports
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
