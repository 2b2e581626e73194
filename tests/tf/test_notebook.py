"""notebooks/resume_walkthrough.ipynb: executed top to bottom; its live numbers are checked.

The notebook runs once per session in a Jupyter kernel (a separate process, as a user
would run it) inside a temporary directory; the tests read what it printed, so a
notebook that stops demonstrating its claims fails here instead of rotting.
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
from typing import Any

import _limits
import _once
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOK = NOTEBOOKS / "resume_walkthrough.ipynb"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Any:
    """The notebook after executing every cell in a fresh python3 kernel (once it is
    ready: nbclient waits for its first answer, up to `_limits.START`); executed once
    per test run, whatever the xdist workers that run this module's tests."""
    text = _once.once_per_run(tmp_path_factory, worker_id, "notebook", _execute)
    return nbformat.reads(text, as_version=4)


def _execute(workdir: Any) -> str:
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=_limits.PROCESS,  # per cell: a hang only
        startup_timeout=_limits.START,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()
    return nbformat.writes(notebook)


@pytest.fixture(scope="module")
def stdout(executed: Any) -> str:
    """Everything the executed notebook printed to stdout, cell after cell."""
    return "".join(
        output.get("text", "")
        for cell in executed.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "stream" and output.name == "stdout"
    )


def _number(pattern: str, text: str) -> str:
    match = re.search(pattern, text)
    assert match is not None, f"{pattern!r} not found in the notebook's output:\n{text}"
    return match.group(1)


def test_notebook_committed_file_has_no_outputs() -> None:
    """The committed notebook is stored with its outputs stripped."""
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code
    assert [cell.outputs for cell in code] == [[] for _ in code]
    assert [cell.execution_count for cell in code] == [None for _ in code]


def test_notebook_committed_file_equals_build_script_output() -> None:
    """The committed notebook is exactly what notebooks/build_walkthrough.py writes."""
    spec = importlib.util.spec_from_file_location(
        "build_walkthrough", NOTEBOOKS / "build_walkthrough.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert nbformat.writes(module.build()) + "\n" == NOTEBOOK.read_text(encoding="utf-8")


def test_notebook_every_code_cell_executed(executed: Any) -> None:
    """Every code cell ran, in order, without an error output."""
    code = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    errors = [o for cell in code for o in cell.outputs if o.output_type == "error"]
    assert errors == []


def test_notebook_whole_pipeline_checkpoint_fails(stdout: str) -> None:
    """Checkpointing the iterator of the whole from_generator pipeline raises a TF error."""
    error = _number(r"checkpointing the whole pipeline: (\w+):", stdout)
    assert error == "FailedPreconditionError"


def test_notebook_naive_pipeline_loses_records(stdout: str) -> None:
    """The split tf.data pipeline, interrupted and restored, loses at least one record."""
    lost = int(_number(r"naive pipeline: (\d+) of 64 records lost", stdout))
    assert lost > 0


def test_notebook_naive_pipeline_with_op_determinism_loses_nothing(stdout: str) -> None:
    """With op determinism on, the same naive job loses nothing, as the notebook says."""
    lost = int(_number(r"naive pipeline with op determinism: (\d+) of 64 records lost", stdout))
    assert lost == 0


def test_notebook_resumeloader_stream_identical(stdout: str) -> None:
    """The restored resumeloader stream equals the uninterrupted one, ids and augmentation."""
    summary = _number(r"resumeloader: (\d+ records before .*)", stdout)
    identical = _number(r"uninterrupted run \(ids and augmentation\): (\w+)", stdout)
    assert (summary, identical) == ("20 records before the crash + 44 after = 64; "
                                    "lost 0, repeated 0", "True")


def test_notebook_describe_shows_restored_position(stdout: str) -> None:
    """`describe()` of the restored loader prints its plan at the checkpointed position."""
    title = _number(r"(ResumableLoader: epoch \d+, step \d+, position \d+)", stdout)
    assert title == "ResumableLoader: epoch 0, step 5, position 20"


def test_notebook_keras_resumed_weights_identical(stdout: str) -> None:
    """Keras training resumed mid-epoch ends with the uninterrupted run's exact weights."""
    difference = _number(r"max \|weight difference\| resumed vs uninterrupted = (\S+)", stdout)
    identical = _number(r"weights identical to the uninterrupted run: (\w+)", stdout)
    assert (float(difference), identical) == (0.0, "True")


def test_notebook_keras_interrupted_mid_epoch(stdout: str) -> None:
    """The Keras job really was interrupted, and resumed in the middle of an epoch."""
    preempted = _number(r"(preempted after .*)\n", stdout)
    resumed_at = _number(r"preempted after .*\nfit starts at (.*)\n", stdout)
    assert (preempted, resumed_at) == ("preempted after 23 batches (epoch 1, step 7)",
                                       "epoch 1, step 4")


def test_notebook_latency_table_covers_every_position(stdout: str) -> None:
    """The restore-latency table has one row of three timings per position."""
    rows = re.findall(r"^\s*([\d,]+)((?:\s+\d+\.\d){3})$", stdout, flags=re.MULTILINE)
    assert [row[0] for row in rows] == ["0", "40,000", "100,000", "200,000", "400,000"]


def test_notebook_both_plots_rendered(executed: Any) -> None:
    """The stream plot and the latency plot are rendered as PNG images."""
    images = [
        output
        for cell in executed.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if "image/png" in output.get("data", {})
    ]
    assert len(images) == 2
