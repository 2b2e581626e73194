"""The docs: every page's examples run, the site builds strictly, generated figures are current.

* Every ```python block of README.md and of every page under docs/ runs (tests/_pages.py),
  in order, one namespace per page, in a fresh temporary directory, in a process of
  its own (a page may install a signal handler or turn on op determinism, which would
  leak into the other tests of a shared process): a child of a fork server that
  imported TensorFlow once per test process, instead of a fresh interpreter per page
  (one page, README.md, also runs in a fresh interpreter).
* ``mkdocs build --strict`` succeeds: no broken link or anchor, no page missing from
  the nav, no docstring the API reference cannot render.
* The generated regions of the pages (benchmark tables from benchmarks/results/*.json,
  the unsafe-ops table from the guard's list) and the plots are what
  ``docs/_gen/generate.py`` makes from the current data.
* ARCHITECTURE.md's module table is what ``docs/_gen/modules.py`` makes from the module
  docstrings, and its check fails, naming that command, when the tree changes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _pages  # noqa: E402

ROOT = next(p for p in HERE.parents if (p / "pyproject.toml").exists())
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "ARCHITECTURE.md",
         *sorted(p for p in DOCS.rglob("*.md") if "_gen" not in p.parts)]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", NO_MKDOCS_2_WARNING="1")

PAGE_TIMEOUT = 600.0


class PageServer:
    """A `_pages.py --serve` process: one page at a time, each in a forked child."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "_pages.py"), "--serve"], cwd=ROOT, env=ENV, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        self.buffer = b""

    def _reply(self, deadline: float) -> dict:
        """The server's next JSON line (read unbuffered: select sees only the pipe)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            wait = max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], wait)
            data = os.read(fd, 65536) if ready else b""
            if not data:
                msg = f"The page server gave no answer in time (exit status {self.proc.poll()})."
                raise AssertionError(msg)
            self.buffer += data
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def run(self, page: Path, cwd: Path, log: Path) -> int:
        """Runs `page` in `cwd`, its output in `log`; returns the child's exit status."""
        assert self.proc.stdin is not None
        deadline = time.monotonic() + PAGE_TIMEOUT
        request = {"page": str(page), "cwd": str(cwd), "log": str(log)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = self._reply(deadline)["pid"]
        try:
            return self._reply(deadline)["returncode"]
        except AssertionError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            raise

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="session")
def page_server():
    server = PageServer()
    yield server
    server.close()


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_python_blocks_run(page, tmp_path, page_server):
    """Every python block of the page runs (doctests pass), in order, in a fresh directory."""
    expected = len(_pages.runnable(page))  # also refuses a mis-fenced or unrun example
    if expected == 0:
        return
    log = tmp_path.parent / f"{tmp_path.name}.log"

    returncode = page_server.run(page, tmp_path, log)

    output = log.read_text()
    assert returncode == 0, output[-6000:]
    assert output.splitlines()[-1] == f"{page.name}: ran {expected} blocks"


@pytest.mark.slow
def test_readme_blocks_run_in_a_fresh_interpreter(tmp_path):
    """README.md's blocks also run as ``python tests/_pages.py README.md`` (no fork server)."""
    page = ROOT / "README.md"
    result = subprocess.run(
        [sys.executable, str(HERE / "_pages.py"), str(page)],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600, check=False,
    )

    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert result.stdout.splitlines()[-1] == f"README.md: ran {len(_pages.runnable(page))} blocks"


def test_readme_is_a_short_front_door_with_the_two_quick_start_commands():
    """README.md stays under 200 lines and gives exactly the two quick-start commands."""
    text = (ROOT / "README.md").read_text()
    quick_start = text[text.index("## Quick start") :].split("```bash\n", 1)[1].split("```")[0]

    assert len(text.splitlines()) < 200
    assert quick_start.splitlines() == [
        "pip install -e . && python -m resumeloader demo",
        'pip install -e ".[test]" && python -m pytest',
    ]


def test_pages_install_extras_from_a_checkout_as_the_readme_does():
    """Every page installs an extra as the README installs the package, from a checkout
    (``pip install -e ".[s3]"``), never as ``resumeloader[s3]`` from an index, and
    names only extras that pyproject.toml defines."""
    import re

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])
    named, wrong = set(), []
    for page in PAGES:
        text = page.read_text()
        wrong += [f"{page.name}: {m}" for m in re.findall(r"resumeloader\[\w+\]", text)]
        for group in re.findall(r'"\.\[([\w,]+)\]"', text):
            named.update(group.split(","))

    assert wrong == []
    assert named - extras == set()
    assert {"s3", "gcs", "dask", "torch", "jax", "test"} <= named


@pytest.mark.slow
def test_mkdocs_build_strict_succeeds(tmp_path):
    """`mkdocs build --strict` builds the site (into a temporary directory) without a warning."""
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600, check=False,
    )

    assert result.returncode == 0, result.stderr[-6000:]
    assert (tmp_path / "site" / "performance" / "index.html").exists()


@pytest.mark.slow
def test_mkdocs_build_strict_refuses_a_page_missing_from_nav(tmp_path):
    """A page under docs/ that `nav` does not list fails the strict build, naming it."""
    for name in ("mkdocs.yml", "ARCHITECTURE.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(DOCS, tmp_path / "docs")
    (tmp_path / "docs" / "guides" / "unlisted.md").write_text("# A guide nobody listed\n")

    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600, check=False,
    )

    assert result.returncode != 0
    assert "guides/unlisted.md" in result.stderr


@pytest.mark.slow
def test_generated_tables_and_plots_are_current():
    """The pages' generated regions and the plots match what generate.py makes from the data."""
    result = subprocess.run(
        [sys.executable, str(DOCS / "_gen" / "generate.py"), "--check"],
        cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300, check=False,
    )

    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


@pytest.mark.slow
def test_generated_check_fails_when_a_figure_changes(tmp_path):
    """One changed figure in a results file makes its page's table and its plot stale."""
    results = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", results)
    loader = json.loads((results / "bench_loader.json").read_text())
    loader["tables"][0]["rows"][0]["rate"] *= 2
    (results / "bench_loader.json").write_text(json.dumps(loader))

    result = subprocess.run(
        [sys.executable, str(DOCS / "_gen" / "generate.py"), "--check"],
        cwd=ROOT, env=dict(ENV, RESUMELOADER_BENCH_RESULTS=str(results)),
        capture_output=True, text=True, timeout=300, check=False,
    )

    assert result.returncode == 1
    assert "performance.md" in result.stdout + result.stderr
    assert "throughput.svg is stale" in result.stderr


# -- ARCHITECTURE.md's module table: made from the module docstrings -----------------------

REGENERATE_TABLE = "python docs/_gen/modules.py"


def _module_table(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(root / "docs" / "_gen" / "modules.py"), *args],
        cwd=root, env=ENV, capture_output=True, text=True, timeout=120, check=False,
    )


def _tree_copy(tmp_path: Path) -> Path:
    """The package's modules, pyproject.toml, ARCHITECTURE.md and the generator, in `tmp_path`."""
    for path in [*(ROOT / "resumeloader").rglob("*.py"), ROOT / "pyproject.toml",
                 ROOT / "ARCHITECTURE.md", DOCS / "_gen" / "modules.py"]:
        target = tmp_path / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    return tmp_path


def test_architecture_module_table_is_what_the_docstrings_make():
    """ARCHITECTURE.md's module table lists every module with its docstring's summary."""
    result = _module_table(ROOT, "--check")

    assert result.returncode == 0, (
        "ARCHITECTURE.md's module table is not what the module docstrings make (a module was "
        f"added, moved or removed, or a docstring changed): run `{REGENERATE_TABLE}`.\n"
        + (result.stdout + result.stderr)[-3000:]
    )


def _add_module(root: Path) -> str:
    (root / "resumeloader" / "core" / "novel.py").write_text('"""`Novel`: a new module."""\n')
    return "| core | `resumeloader/core/novel.py` | `Novel`: a new module |"


def _remove_module(root: Path) -> str:
    (root / "resumeloader" / "core" / "wire.py").unlink()
    return "| core | `resumeloader/core/shard.py` |"


def _edit_docstring(root: Path) -> str:
    path = root / "resumeloader" / "core" / "shard.py"
    text = path.read_text()
    path.write_text(text.replace('"""', '"""Edited summary line.\n\n', 1))
    return "| core | `resumeloader/core/shard.py` | Edited summary line |"


@pytest.mark.parametrize("change", [_add_module, _remove_module, _edit_docstring],
                         ids=["module-added", "module-removed", "docstring-edited"])
def test_module_table_check_fails_naming_the_command_until_it_is_rerun(tmp_path, change):
    """A changed tree makes `--check` fail naming the command; running it brings the table up."""
    root = _tree_copy(tmp_path)
    expected_row = change(root)

    stale = _module_table(root, "--check")
    regenerated = _module_table(root)
    current = _module_table(root, "--check")

    assert stale.returncode == 1
    assert REGENERATE_TABLE in stale.stdout + stale.stderr
    assert regenerated.returncode == 0, regenerated.stderr[-3000:]
    assert current.returncode == 0
    table = (root / "ARCHITECTURE.md").read_text()
    assert expected_row in table
    assert ("| core | `resumeloader/core/wire.py` |" in table) == (change is not _remove_module)


def test_module_table_refuses_a_module_without_a_docstring(tmp_path):
    """A module without a docstring stops the generator, naming the module and the command."""
    root = _tree_copy(tmp_path)
    (root / "resumeloader" / "core" / "bare.py").write_text("X = 1\n")

    result = _module_table(root)

    assert result.returncode != 0
    assert "resumeloader/core/bare.py has no module docstring" in result.stderr
    assert REGENERATE_TABLE in result.stderr


def test_module_table_groups_modules_by_layer_lowest_first():
    """Rows run package, then the layers of the import-linter contract from core upward."""
    result = _module_table(ROOT, "--check")
    table = (ROOT / "ARCHITECTURE.md").read_text()
    layers = re.findall(r"^\| (\w+) \| `resumeloader/", table, flags=re.MULTILINE)

    assert result.returncode == 0
    order = list(dict.fromkeys(layers))
    assert order[:3] == ["package", "core", "sources"]
    assert order.index("tfdata") < order.index("integrations") < order.index("tools")
    assert layers == sorted(layers, key=order.index)


# -- the page runner itself: it fails when it should ----------------------------------------


def _page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(textwrap.dedent(text))
    return path


def test_page_runner_runs_blocks_in_order_in_one_namespace(tmp_path, monkeypatch):
    """Later blocks see earlier blocks' names (doctests' too); ```py blocks are not run."""
    monkeypatch.chdir(tmp_path)
    page = _page(tmp_path, """\
        ```python
        x = 2
        ```
        ```py
        raise RuntimeError("shown only")
        ```
        ```python
        >>> y = x * 21
        >>> y
        42

        ```
        ```python
        assert y == 42
        ```
        """)

    assert _pages.run(page) == 3


def test_page_runner_failing_script_block_raises_with_the_page_line(tmp_path, monkeypatch):
    """A script block that raises fails the page; the traceback names the page's line."""
    monkeypatch.chdir(tmp_path)
    page = _page(tmp_path, "text\n\n```python\nx = 1\nraise ValueError('broken example')\n```\n")

    with pytest.raises(ValueError, match="broken example") as info:
        _pages.run(page)

    assert info.traceback[-1].lineno + 1 == 5


def test_page_runner_failing_doctest_fails(tmp_path, monkeypatch):
    """A doctest whose output differs fails the page."""
    monkeypatch.chdir(tmp_path)
    page = _page(tmp_path, "```python\n>>> 1 + 1\n3\n\n```\n")

    with pytest.raises(AssertionError, match="1 of 1 doctest examples failed"):
        _pages.run(page)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("```python3\nx = 1\n```\n", "would not run"),
        ("```pycon\n>>> 1\n1\n```\n", "would not run"),
        (">>> 1 + 1\n2\n", "outside a ```python block"),
        ("```python\nx = 1\n", "never closed"),
    ],
    ids=["python3-fence", "pycon-fence", "bare-prompt", "open-fence"],
)
def test_page_runner_refuses_examples_that_would_not_run(tmp_path, text, message):
    """Another spelling of a python fence, a bare `>>>` or an open fence is refused."""
    with pytest.raises(_pages.PageError, match=message):
        _pages.blocks(_page(tmp_path, text))
