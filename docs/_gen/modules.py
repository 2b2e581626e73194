"""ARCHITECTURE.md's module table, made from the module docstrings; `--check` only tells if current.

    python docs/_gen/modules.py [--check]

One row per module under resumeloader/, as the tree is: its layer (the sub-package it
is in, ordered as the layers contract of pyproject.toml lists them, lowest first; a
sub-package the contract does not list comes after them; the top-level modules are
"package"), its path, and the summary of its docstring (the first paragraph, one
line in the table). The docstrings are the source: to change a row, edit the
module's docstring and run this; after adding, moving or removing a module, run
this. The test suite (`tests/test_docs.py`) fails when the table is not what the
docstrings make. `python docs/_gen/generate.py` regenerates it too.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

from cogapp import Cog

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "resumeloader"
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
COMMAND = "python docs/_gen/modules.py"
TOP = "package"


def layers() -> list[str]:
    """The layers, lowest first, from the import-linter layers contract in pyproject.toml."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for contract in config["tool"]["importlinter"]["contracts"]:
        if contract["type"] == "layers":
            return [name.removeprefix("resumeloader.") for name in reversed(contract["layers"])]
    msg = ("pyproject.toml has no import-linter layers contract. Received: none. Expected: one, "
           "the table's layer order.")
    raise LookupError(msg)


def summary(path: Path) -> str:
    """The first paragraph of the module's docstring, on one line, without a final period."""
    docstring = ast.get_docstring(ast.parse(path.read_text(), str(path)))
    if not docstring or not docstring.strip():
        msg = (f"{path.relative_to(ROOT)} has no module docstring. Received: no docstring. "
               "Expected: a docstring whose first line says what the module holds (it is the "
               f"module's row in ARCHITECTURE.md); then run `{COMMAND}`.")
        raise ValueError(msg)
    first = " ".join(docstring.strip().split("\n\n", 1)[0].split())
    return first.removesuffix(".").replace("|", "\\|")


def layer_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else TOP


def rows() -> list[tuple[str, str, str]]:
    """(layer, path, summary) of every module: the top-level ones, then the layers upward."""
    order = [TOP, *layers()]
    modules = sorted(PACKAGE.rglob("*.py"))
    found = {layer_of(path) for path in modules}
    order += sorted(found - set(order))

    def key(path: Path) -> tuple:
        return (order.index(layer_of(path)), path.parent.parts, path.name != "__init__.py",
                path.name)

    return [(layer_of(path), f"`{path.relative_to(ROOT)}`", summary(path))
            for path in sorted(modules, key=key)]


def table_text() -> str:
    lines = ["| layer | module | what it holds |", "|---|---|---|"]
    lines += [f"| {layer} | {path} | {text} |" for layer, path, text in rows()]
    return "\n".join(lines)


def table() -> None:
    """Called by cog from ARCHITECTURE.md: writes the table below the marker."""
    import cog  # the module cog provides while it runs a page's code

    # Blank lines around the table: Markdown ends the HTML comment of the marker first.
    cog.out(f"\n{table_text()}\n\n")


def run_cog(check: bool, paths: list[Path]) -> int:
    argv = ["cog", "-I", str(Path(__file__).resolve().parent), "--check" if check else "-r",
            "--check-fail-msg", f"run `{COMMAND}`", *map(str, paths)]
    return Cog().main(argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    return int(run_cog(args.check, [ARCHITECTURE]) != 0)


if __name__ == "__main__":
    sys.exit(main())
