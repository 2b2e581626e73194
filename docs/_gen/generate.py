"""Regenerates the docs' generated regions and plots; `--check` only tells whether they are current.

    python docs/_gen/generate.py [--check]

The regions are the cog blocks of the pages under docs/ (tables from
benchmarks/results/*.json, CPU columns included, and from the guard's list of unsafe
ops) and ARCHITECTURE.md's module table (from the module docstrings; `modules.py` makes
it alone); the plots are the SVGs of docs/assets/benchmarks/, drawn only when their
table has figures (a plot whose every figure is blank is left out, its SVG removed).
Run it after the benchmarks (`benchmarks/run_all.py`)
and commit the results files, the pages and the plots together; the test suite
(`tests/test_docs.py`) fails when they disagree.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import figures  # noqa: E402
from cogapp import Cog  # noqa: E402

DOCS = HERE.parent


def pages() -> list[Path]:
    """The pages with generated regions: under docs/, and ARCHITECTURE.md (its module table)."""
    found = sorted(p for p in DOCS.rglob("*.md") if "[[[cog" in p.read_text())
    return [*found, DOCS.parent / "ARCHITECTURE.md"]


def stale_plots() -> list[str]:
    """The plots whose SVG is missing or shows other data than the results files hold, and
    the SVGs of plots with nothing to draw (which must not exist)."""
    stale = []
    for name in figures.PLOT_DATA:
        path = figures.PLOTS / f"{name}.svg"
        if not figures.plot_points(name):
            if path.exists():
                stale.append(name)
            continue
        text = path.read_text() if path.exists() else ""
        found = re.search(r"<dc:description>data (\w+)</dc:description>", text)
        if not found or found.group(1) != figures.plot_digest(name):
            stale.append(name)
    return stale


def run_cog(check: bool) -> int:
    argv = ["cog", "-I", str(HERE), "--check" if check else "-r",
            "--check-fail-msg", "run `python docs/_gen/generate.py`", *map(str, pages())]
    return Cog().main(argv)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_plots()
        for name in stale:
            print(f"docs/assets/benchmarks/{name}.svg is stale: run "
                  "`python docs/_gen/generate.py`.", file=sys.stderr)
        return int(run_cog(check=True) != 0 or bool(stale))  # cog says 5 when stale
    import plots

    for name, draw in plots.ALL.items():
        if figures.plot_points(name):
            print(f"wrote {draw().relative_to(DOCS.parent)}")
            continue
        path = figures.PLOTS / f"{name}.svg"  # nothing to draw: no stale image either
        if path.exists():
            path.unlink()
            print(f"removed {path.relative_to(DOCS.parent)} (no figure to draw)")
    return run_cog(check=False)


if __name__ == "__main__":
    sys.exit(main())
