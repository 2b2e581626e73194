"""The package's layers: import direction, no cycles, no TensorFlow below the TF layer."""

from __future__ import annotations

import ast
import pathlib
import pkgutil
import re
import subprocess
import sys

import grimp

import resumeloader

PACKAGE = pathlib.Path(resumeloader.__file__).parent
ROOT = PACKAGE.parent
# The layers below the TensorFlow layer: importable without TensorFlow.
TF_FREE_LAYERS = ("core", "sources", "stages", "workers", "handout")


def _modules(*layers: str) -> list[str]:
    return [
        info.name
        for layer in layers
        for info in pkgutil.walk_packages([str(PACKAGE / layer)], f"resumeloader.{layer}.")
    ] + [f"resumeloader.{layer}" for layer in layers]


def test_tf_free_layers_import_no_tensorflow_in_fresh_process():
    """Every module of core, sources, stages, workers and handout imports without TensorFlow."""
    modules = [*_modules(*TF_FREE_LAYERS), "resumeloader", "resumeloader.errors"]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert len(modules) > 60
    assert "resumeloader.stages.batching.pack" in modules
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_unit_tier_collects_without_tensorflow_in_fresh_process():
    """`python -m pytest tests/unit` loads neither TensorFlow nor Keras to collect the tier
    (every unit test module and what it imports). The tier's tests run once, in this
    session; run alone, its conftest fails any test after which either got loaded (a
    lazy import inside a test), so the tier stays runnable without TensorFlow."""
    code = (
        "import sys, pytest\n"
        "status = pytest.main(['tests/unit', '-q', '-n', '0', '-p', 'no:cacheprovider',\n"
        "                      '--collect-only'])\n"
        "print(int(status), sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=170
    )
    assert result.stdout.strip().splitlines()[-1] == "0 []", result.stdout[-3000:]
    collected = [line for line in result.stdout.splitlines() if "tests collected" in line]
    assert collected and int(collected[0].split()[0]) > 300, result.stdout[-3000:]


def test_no_import_cycles_among_package_modules():
    """No module imports (directly or through others) a module that imports it back."""
    graph = grimp.build_graph("resumeloader")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported != module and graph.chain_exists(importer=imported, imported=module):
                cycles.append(f"{module} <-> {imported}")
    assert len(graph.modules) > 40
    assert cycles == []


def test_no_module_reaches_into_a_loader_private_attribute():
    """Outside the loader's own module, nothing reads `loader._...` (only public interfaces)."""
    own = PACKAGE / "tfdata" / "loader.py"
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == own:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and isinstance(node.value, (ast.Name, ast.Attribute))
                and (getattr(node.value, "id", None) or getattr(node.value, "attr", "")).endswith(
                    "loader"
                )
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno} .{node.attr}")
    assert offenders == []


def test_architecture_md_names_every_package_module():
    """ARCHITECTURE.md mentions every module of the package (it must match the tree)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    missing = [
        str(path.relative_to(ROOT))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__init__.py" and str(path.relative_to(ROOT)) not in text
    ]
    assert missing == []


def test_architecture_md_names_only_modules_that_exist():
    """Every module path ARCHITECTURE.md names is in the tree (the table matches it)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`(resumeloader/[\w/]+\.py)`", text))
    assert len(named) > 60
    assert sorted(path for path in named if not (ROOT / path).is_file()) == []
