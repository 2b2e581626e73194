"""The package's layers: import direction, no cycles, no TensorFlow below the TF layer."""

from __future__ import annotations

import ast
import pathlib
import pkgutil
import subprocess
import sys

import grimp

import resumeloader

PACKAGE = pathlib.Path(resumeloader.__file__).parent
# The layers below the TensorFlow layer: importable without TensorFlow.
TF_FREE_LAYERS = ("core", "sources", "stages", "workers")


def _modules(*layers: str) -> list[str]:
    names = []
    for layer in layers:
        path = PACKAGE / layer
        names.append(f"resumeloader.{layer}")
        names += [
            f"resumeloader.{layer}.{info.name}" for info in pkgutil.iter_modules([str(path)])
        ]
    return names


def test_tf_free_layers_import_no_tensorflow_in_fresh_process():
    """Every module of core, sources, stages and workers imports without TensorFlow or Keras."""
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
    assert len(modules) > 20
    assert result.stdout.strip().splitlines()[-1] == "[]"


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
    text = (PACKAGE.parent / "ARCHITECTURE.md").read_text()
    missing = [
        str(path.relative_to(PACKAGE.parent))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "__init__.py" and str(path.relative_to(PACKAGE.parent)) not in text
    ]
    assert missing == []
