"""`resumeloader inspect` and `show` as tools: no TensorFlow unless the pipeline needs it,
rows streamed in bounded memory, full names off a terminal, quiet output; `verify`
runs one training process at a time, shows its progress, and its help stands alone."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import _limits
import numpy as np
import pytest
import tensorflow as tf
from rich.console import Console

import resumeloader
from resumeloader import cli
from resumeloader.sources import TFRecordSource
from resumeloader.tools import harness, tf_bundle
from resumeloader.tools import show as show_lib

LONG = "a-directory-name-long-enough-to-be-cut-on-a-terminal"


def _tf_checkpoint(directory, **loader_args):
    loader = resumeloader.ResumableLoader(np.arange(100), batch_size=8, seed=5, **loader_args)
    loader.advance(num_batches=3)
    tf.train.CheckpointManager(tf.train.Checkpoint(loader=loader), str(directory), 1).save()
    return loader


def _python(code, cwd, *, stdout=subprocess.PIPE, timeout=_limits.PROCESS):
    """Runs `code` in a fresh interpreter (TensorFlow not imported yet)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=timeout,
                          check=False)


def test_tf_bundle_reads_the_strings_tensorflow_reads(tmp_path):
    """The pure reader returns, for every loader-state key, the bytes TensorFlow reads."""
    _tf_checkpoint(tmp_path / "ck")
    prefix = tf.train.latest_checkpoint(str(tmp_path / "ck"))
    reader = tf.train.load_checkpoint(prefix)
    keys = [k for k in reader.get_variable_to_shape_map() if k.endswith("py_state")]

    got = tf_bundle.read_strings(prefix, lambda key: key.endswith("py_state"))

    assert keys and sorted(got) == sorted(keys)
    assert all(got[k] == reader.get_tensor(k) for k in keys)
    assert tf_bundle.read_index_file(str(tmp_path / "ck")) == prefix


def test_tf_bundle_changed_byte_is_refused_not_misread(tmp_path):
    """A flipped byte of the state's data fails its CRC32C: UnsupportedCheckpoint."""
    _tf_checkpoint(tmp_path / "ck")
    prefix = tf.train.latest_checkpoint(str(tmp_path / "ck"))
    data = tmp_path / "ck" / (prefix.rsplit("/", 1)[1] + ".data-00000-of-00001")
    raw = bytearray(data.read_bytes())
    raw[raw.index(b'"epoch"') + 2] ^= 1
    data.write_bytes(bytes(raw))

    with pytest.raises(tf_bundle.UnsupportedCheckpoint, match="CRC32C"):
        tf_bundle.read_strings(prefix, lambda key: key.endswith("py_state"))


@pytest.mark.slow
def test_inspect_reads_a_tf_checkpoint_without_importing_tensorflow(tmp_path):
    """inspect of a tf.train.Checkpoint answers without loading TensorFlow."""
    loader = _tf_checkpoint(tmp_path / "ck")
    result = _python(f"""
        import sys
        from resumeloader import cli
        status = cli.main(["inspect", {str(tmp_path / "ck")!r}])
        print("tensorflow imported:", "tensorflow" in sys.modules, "status:", status)
    """, tmp_path)

    assert result.stdout.splitlines()[-1] == "tensorflow imported: False status: 0"
    assert f"fingerprint          {loader.get_state()['fingerprint']}" in result.stdout
    assert result.stderr == ""


@pytest.mark.slow
def test_inspect_missing_path_exits_2_at_once_without_tensorflow(tmp_path):
    """A path that is no checkpoint is one error line, before any TensorFlow import."""
    result = _python(f"""
        import sys
        from resumeloader import cli
        status = cli.main(["inspect", {str(tmp_path / "nothing")!r}])
        print("tensorflow imported:", "tensorflow" in sys.modules, "status:", status)
    """, tmp_path)

    assert result.stdout.splitlines() == ["tensorflow imported: False status: 2"]
    assert result.stderr.startswith("error: No checkpoint at ")
    assert result.stderr.count("\n") == 1


def test_inspect_reads_a_resume_callback_file_checkpoint(tmp_path, capsys):
    """A ckpt-N directory (JAX, PyTorch backends) or the directory holding them: its
    loader.json is the state shown."""
    loader = resumeloader.ResumableLoader(np.arange(100), batch_size=8, seed=5)
    loader.advance(num_batches=3)
    (tmp_path / "ckpt-7").mkdir()
    (tmp_path / "ckpt-7" / "loader.json").write_text(json.dumps(loader.get_state()))

    assert cli.main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "checkpoint number: 7" in out and "step in epoch        3" in out


_PIPELINE = """\
import numpy as np
from resumeloader import Pipeline


def pipeline():
    return Pipeline(np.arange(1_000_000), seed=3).shuffle().batch(32)


def loader():
    import resumeloader
    return resumeloader.ResumableLoader.from_pipeline(pipeline())
"""


def _show_job(tmp_path):
    """A module with a Pipeline function and a loader one, and a checkpoint of it."""
    (tmp_path / "show_job.py").write_text(_PIPELINE)
    sys.path.insert(0, str(tmp_path))
    try:
        import show_job
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("show_job", None)  # each test has its own
    made = show_job.loader()
    made.advance(num_batches=5)
    (tmp_path / "ck" / "ckpt-1").mkdir(parents=True)
    (tmp_path / "ck" / "ckpt-1" / "loader.json").write_text(json.dumps(made.get_state()))
    return made


@pytest.mark.slow
def test_show_any_range_into_a_closed_pipe_streams_in_bounded_memory(tmp_path):
    """``show --steps 0:1000000000 | head``: the first rows come at once, the command
    ends quietly when the reader goes, without TensorFlow, in bounded memory."""
    _show_job(tmp_path)
    # The peak resident memory of this process image (VmHWM; ru_maxrss would count the
    # parent's, inherited through fork and exec).
    code = """
        import sys
        from resumeloader import cli
        status = cli.main(["show", "ck", "--pipeline", "show_job:pipeline",
                           "--steps", "0:1000000000"])
        with open("/proc/self/status") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
        print("tensorflow imported:", "tensorflow" in sys.modules, "status:", status,
              "rss_mb_under_500:", peak < 500 * 1024, file=sys.stderr)
    """
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stderr is not None
    head = [child.stdout.readline() for _ in range(10)]
    child.stdout.close()
    child.wait(timeout=_limits.PROCESS)

    assert head[0].startswith("records of the batches asked for")
    assert head[1].split() == list(show_lib._COLUMNS)
    assert [line.split()[0] for line in head[2:]] == ["0"] * 8  # step 0's records
    assert child.stderr.read().splitlines() == [
        "tensorflow imported: False status: 0 rss_mb_under_500: True"
    ]


@pytest.mark.slow
def test_show_of_a_loader_function_prints_no_tensorflow_startup_lines(tmp_path):
    """A function returning a ResumableLoader loads TensorFlow; its start-up lines are
    kept out of the command's output (stderr stays empty)."""
    _show_job(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "resumeloader", "show", "ck", "--pipeline",
         "show_job:loader", "--steps", "5", "--format", "tsv"],
        cwd=tmp_path, capture_output=True, text=True, timeout=_limits.PROCESS, check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == 1 + 32


def _file_job(tmp_path):
    """A TFRecord source in a long directory name, and a checkpoint of its loader."""
    sys.modules.pop("file_job", None)  # another test's
    directory = tmp_path / LONG
    directory.mkdir()
    for i in range(2):
        with tf.io.TFRecordWriter(str(directory / f"part-{i}.tfrecord")) as writer:
            for j in range(5):
                writer.write(f"{i}-{j}".encode())
    (tmp_path / "file_job.py").write_text(textwrap.dedent(f"""
        from resumeloader import Pipeline
        from resumeloader.sources import TFRecordSource

        def pipeline():
            return Pipeline(TFRecordSource({str(directory / '*.tfrecord')!r}), seed=0).batch(4)

        def finite():
            import resumeloader
            return resumeloader.ResumableLoader.from_pipeline(pipeline(), num_epochs=1)
    """))
    source = TFRecordSource(str(directory / "*.tfrecord"))
    loader = resumeloader.ResumableLoader.from_pipeline(
        resumeloader.Pipeline(source, seed=0).batch(4)
    )
    (tmp_path / "ck" / "ckpt-1").mkdir(parents=True)
    (tmp_path / "ck" / "ckpt-1" / "loader.json").write_text(json.dumps(loader.get_state()))
    return str(directory)


@pytest.mark.parametrize(
    ("terminal", "wide", "cut"),
    [(False, False, False), (True, False, True), (True, True, False)],
    ids=["file-or-pipe", "terminal", "terminal-wide"],
)
def test_show_table_shortens_file_names_only_on_a_terminal(tmp_path, monkeypatch, terminal,
                                                          wide, cut):
    """Written to a file or pipe the table has every full file name; on a narrow
    terminal they are cut in the middle, unless --wide."""
    directory = _file_job(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    buffer = io.StringIO()
    out = Console(file=buffer, force_terminal=terminal, width=80)

    status = show_lib.main("ck", out, pipeline="file_job:pipeline", steps="0:2",
                           positions=None, batch_size=None, wide=wide)

    text = buffer.getvalue()
    assert status == 0
    assert (directory in text) is not cut
    assert ("…" in text) is cut
    assert len(text.splitlines()) == 2 + 8


def test_show_tsv_and_json_have_full_names_and_a_finite_run_ends_at_its_end(
    tmp_path, monkeypatch, capsys
):
    """--format tsv: a header and one line per record, file names whole; a range past
    the end of a finite run stops at its last batch."""
    directory = _file_job(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))

    assert cli.main(["show", "ck", "--pipeline", "file_job:pipeline", "--steps", "0:9",
                     "--format", "tsv"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split("\t") == list(show_lib._COLUMNS)
    assert len(lines) == 1 + 3 * 10  # 3 epochs of batches of 4, 4, 2: every step asked for
    assert all(directory in line.split("\t")[7] for line in lines[1:])

    assert cli.main(["show", "ck", "--pipeline", "file_job:finite", "--steps", "0:100",
                     "--json"]) == 0
    batches = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [b["step"] for b in batches] == [0, 1, 2]  # 10 records in batches of 4
    assert batches[-1]["records"][-1]["file"].startswith(directory)


COUNTER = [sys.executable, str(Path(__file__).parents[1] / "scripts" / "train_counter.py")]


def test_verify_runs_the_uninterrupted_job_before_the_killed_one(tmp_path):
    """By default the uninterrupted process ends before the first killed one starts:
    never two training processes at once."""
    events = []

    report = harness.kill_and_restart(
        COUNTER, kill_points=["step:5"], workdir=tmp_path,
        on_event=lambda name, event: events.append((name, event["event"])),
    )

    assert report.identical, str(report)
    reference_end = events.index(("reference", "end"))
    first_attempt = next(i for i, (name, _) in enumerate(events) if name != "reference")
    assert reference_end < first_attempt
    assert events[first_attempt] == ("attempt-0", "start")


def test_verify_shows_progress_of_both_runs_on_stderr(tmp_path, capsys):
    """The progress display names each run, the process and the kills; the report goes
    to stdout."""
    argv = ["verify", "--kill-at", "step:5", "--workdir", str(tmp_path), "--", *COUNTER]

    assert cli.main(argv) == 0

    captured = capsys.readouterr()
    assert "uninterrupted: done" in captured.err
    assert "killed + resumed: process 2, 1/1 SIGKILLs: done" in captured.err
    assert "24/24 steps" in captured.err
    assert "IDENTICAL" in captured.out and "IDENTICAL" not in captured.err


def test_verify_help_shows_the_keras_recipe_and_no_repository_path(capsys):
    """``verify --help`` gives the recorder contract and the Keras recipe in full, and
    points to nothing that only a checkout of the repository has."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["verify", "--help"])

    out = capsys.readouterr().out
    assert exited.value.code == 0
    assert "FitRecorder(resume)" in out and "ResumeCallback(loader" in out
    assert "--parallel" in out
    for path in ("tests/", "docs/", "scripts/", "notebooks/", "benchmarks/"):
        assert path not in out
