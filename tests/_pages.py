"""The code examples of a Markdown page, run as the docs promise (tests/test_docs.py).

    python tests/_pages.py PAGE.md

Every fenced ```` ```python ```` block of the page runs, in order, in one namespace
(``__name__ == "__main__"``, as in a user's script), in the current directory: a block
with ``>>>`` prompts as a doctest (``ELLIPSIS``, ``NORMALIZE_WHITESPACE``), any other as
a script. A ```` ```py ```` block is shown, not run. Tracebacks and doctest reports name
the page's own line numbers. The last line printed is a summary the test checks
(``ran N blocks``); the exit status is 1 at the first block that fails.

    python tests/_pages.py --serve    # a fork server (tests/test_docs.py)

Starting an interpreter that imports TensorFlow costs ~4 s of CPU, once per page. The
server imports TensorFlow, Keras and resumeloader once (no op run, so no TensorFlow
thread started) and forks one child per page it is asked for on its standard input
(a JSON line: page, directory, log). The child runs the page as above, in the page's
directory, its output in the log, in a process (group) of its own, and ends through
the interpreter's finalization like a script; the server answers with a JSON line
(the child's pid when it starts, its exit status when it ends).

`blocks` also refuses what would let an example go silently unrun: another spelling
of Python on a fence (``python3``, ``pycon``, ...), a ``>>>`` prompt outside a python
fence, a fence left open.
"""

from __future__ import annotations

import dataclasses
import doctest
import json
import os
import re
import sys
from pathlib import Path

RUN, SHOWN = "python", "py"
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^\s`]*)")


class PageError(ValueError):
    """A page whose code blocks are not written the way the runner can run them."""


@dataclasses.dataclass
class Block:
    language: str
    text: str
    line: int  # the page's line number of the block's first line of code

    @property
    def doctest(self) -> bool:
        return any(line.lstrip().startswith(">>>") for line in self.text.splitlines())


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of the page at `path`, checked (see the module docstring)."""
    found: list[Block] = []
    lines = path.read_text().splitlines()
    number = 0
    while number < len(lines):
        match = _FENCE.match(lines[number])
        if not match:
            if lines[number].lstrip().startswith(">>>"):
                msg = (f"{path}:{number + 1}: a `>>>` example outside a ```python block is not "
                       f"run. Received: {lines[number].strip()!r}.")
                raise PageError(msg)
            number += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        language = match["info"].lstrip("{.").rstrip("}").lower()
        if re.fullmatch(r"py.*|python.*|ipython.*", language) and language not in (RUN, SHOWN):
            msg = (f"{path}:{number + 1}: code fenced as {language!r} would not run. Fence it "
                   f"```python (it runs in the test suite) or ```py (shown only, say why in "
                   f"the prose).")
            raise PageError(msg)
        start, number = number + 1, number + 1
        closing = re.compile(rf"^ {{0,{indent + 3}}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        while number < len(lines) and not closing.match(lines[number]):
            number += 1
        if number == len(lines):
            msg = f"{path}:{start}: a code fence opened here is never closed."
            raise PageError(msg)
        body = "\n".join(line[indent:] for line in lines[start:number])
        found.append(Block(language, body + "\n", start + 1))
        number += 1
    return found


def section_lines(path: Path, title: str) -> range:
    """The line numbers (1-based) of the page's section headed `title` (``## title`` at
    any level), up to the next heading of the same or a higher level."""
    lines = path.read_text().splitlines()
    heading = re.compile(r"^(#{1,6}) +(.*?) *$")
    start = level = None
    fence = None  # the fence of the code block the line is in (a `#` there is code)
    for number, line in enumerate(lines, 1):
        opened = _FENCE.match(line)
        if opened is not None and (fence is None or opened["fence"].startswith(fence)):
            fence = opened["fence"] if fence is None else None
            continue
        match = heading.match(line) if fence is None else None
        if match is None:
            continue
        if start is None and match[2] == title:
            start, level = number, len(match[1])
        elif start is not None and level is not None and len(match[1]) <= level:
            return range(start, number)
    if start is None:
        msg = f"{path}: no section headed {title!r}."
        raise PageError(msg)
    return range(start, len(lines) + 1)


def runnable(path: Path, section: str | None = None) -> list[Block]:
    """The page's python blocks (those of the section headed `section`, if given)."""
    found = [block for block in blocks(path) if block.language == RUN]
    if section is None:
        return found
    inside = section_lines(path, section)
    return [block for block in found if block.line in inside]


def run(path: Path, section: str | None = None) -> int:
    """Runs the page's python blocks (or those of one section, in a namespace of their
    own); returns how many ran (raises at the first failure)."""
    namespace: dict[str, object] = {"__name__": "__main__", "__file__": str(path)}
    parser = doctest.DocTestParser()
    todo = runnable(path, section)
    for number, block in enumerate(todo, 1):
        name = f"{path.name} block {number} (line {block.line})"
        if block.doctest:
            test = parser.get_doctest(block.text, namespace, name, str(path), block.line - 1)
            test.globs = namespace  # DocTest copies its globals: share the page's instead
            runner = doctest.DocTestRunner(optionflags=FLAGS)
            runner.run(test, out=sys.stdout.write, clear_globs=False)
            if runner.failures:
                msg = f"{name}: {runner.failures} of {runner.tries} doctest examples failed."
                raise AssertionError(msg)
        else:
            # Padded so that a traceback names the page's line numbers.
            exec(compile("\n" * (block.line - 1) + block.text, str(path), "exec"), namespace)
    return len(todo)


def main() -> None:
    path = Path(sys.argv[1]).resolve()
    count = run(path)
    print(f"{path.name}: ran {count} blocks")


def serve() -> None:
    """The fork server: one child per request line, answered in order (module docstring)."""
    import gc

    import keras  # noqa: F401 - loaded once, for every child
    import tensorflow  # noqa: F401

    import resumeloader
    import resumeloader.keras  # noqa: F401

    gc.freeze()  # the children share the server's objects' pages
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child becomes the page's script
            os.setpgid(0, 0)
            fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            os.chdir(request["cwd"])
            sys.stdin = open(os.devnull)  # noqa: SIM115 - the child's for its life
            sys.argv = [__file__, request["page"]]
            main()  # an exception exits 1 with its traceback in the log, as a script
            sys.exit(0)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        serve()
    else:
        main()
