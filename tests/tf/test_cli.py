"""Tests of the `resumeloader` command: inspect (in-process), verify and demo (subprocesses).

`verify` exiting 0 on a resumeloader job is tested in test_kill.py, which shares that run.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import resumeloader
from resumeloader import cli

DEMO = [sys.executable, "-m", "resumeloader.tools.demo", "--epochs", "1"]


def _row(text, name):
    """The cells of the rich table row `name` in the output."""
    match = re.search(rf"{name}\s*│\s*(\S+)\s*│\s*(\S+)", text)
    assert match, text
    return match.groups()


def test_inspect_checkpoint_prints_loader_state(tmp_path, capsys):
    """inspect prints epoch, offset, step in epoch, order fields and the checkpoint number."""
    loader = resumeloader.ResumableLoader(np.arange(100), batch_size=8, seed=5, num_epochs=2)
    loader.advance(num_batches=3)
    tf.train.CheckpointManager(tf.train.Checkpoint(loader=loader), str(tmp_path), 1).save(3)
    assert cli.main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "checkpoint number: 3" in out
    assert "loader: loader" in out
    assert re.search(r"offset in epoch\s+24 of 100 records", out)
    assert re.search(r"step in epoch\s+3 \(batch_size 8", out)
    assert re.search(r"seed\s+5\n", out)
    assert re.search(r"fingerprint\s+" + loader.get_state()["fingerprint"], out)


def test_inspect_checkpoint_without_loader_returns_1(tmp_path, capsys):
    """A checkpoint without a loader state is reported, exit status 1."""
    tf.train.Checkpoint(v=tf.Variable(1.0)).save(str(tmp_path / "ckpt"))
    assert cli.main(["inspect", str(tmp_path)]) == 1
    assert "no resumeloader state found" in capsys.readouterr().out


def test_inspect_empty_directory_returns_2(tmp_path, capsys):
    """A directory without a checkpoint is a usage error naming the directory."""
    assert cli.main(["inspect", str(tmp_path)]) == 2
    assert "No checkpoint found in directory" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["verify"], "Give the training command after `--`"),
        (["verify", "--kill-at", "kill:3", "--", "true"], "'step:N', 'commit:N' or 'save:N'"),
        (["verify", "--kill-at", "step:3", "--kill-at", "save:3", "--", "true"], "distinct"),
    ],
    ids=["no-command", "bad-point", "same-step"],
)
def test_verify_bad_arguments_exit_2(argv, expected, capsys):
    """Usage errors exit with status 2 before anything runs."""
    assert cli.main(argv) == 2
    assert expected in capsys.readouterr().err


@pytest.mark.slow
def test_verify_naive_split_pipeline_exits_1(tmp_path, capsys):
    """verify catches the checkpointed index iterator + from_generator pipeline (README, "Why")."""
    argv = ["verify", "--kill-at", "step:7", "--workdir", str(tmp_path), "--", *DEMO]
    assert cli.main([*argv, "--pipeline", "naive"]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT" in out
    assert "first difference: step 5" in out


@pytest.mark.slow
def test_demo_one_kill_prints_zero_lost_identical_weights(tmp_path, capsys):
    """The demo prints 0 lost, 0 duplicated and bit-identical weights."""
    argv = ["demo", "--kills", "1", "--epochs", "1", "--seed", "1", "--workdir", str(tmp_path)]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert _row(out, "records lost") == ("-", "0")
    assert _row(out, "records duplicated") == ("-", "0")
    assert _row(out, "records moved to another step") == ("-", "0")
    assert _row(out, "SIGKILLs") == ("-", "1")
    assert _row(out, "final weights bit-identical") == ("-", "yes")


def test_cli_and_testing_import_without_tensorflow():
    """The command's own process stays light: TF loads only in the training subprocesses."""
    code = "import resumeloader.cli, resumeloader.testing, sys; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


def _bad_index(tmp_path, kind):
    directory = tmp_path / "ckpt"
    tf.train.CheckpointManager(tf.train.Checkpoint(v=tf.Variable(1.0)), str(directory), 1).save()
    index = directory / "checkpoint"
    if kind == "garbage":
        index.write_text("garbage {{{")
    elif kind == "binary":
        index.write_bytes(b"\xff\xfe\x00\x01")
    else:
        index.write_text('model_checkpoint_path: "ckpt-7"\n')
    return directory


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("garbage", "cannot be read"), ("binary", "cannot be read"), ("dangling", "does not exist")],
    ids=["garbage-text", "binary", "dangling"],
)
def test_inspect_bad_index_file_exits_2_naming_it(tmp_path, capsys, kind, expected):
    """An unreadable or dangling `checkpoint` index file is named as such, in one line."""
    directory = _bad_index(tmp_path, kind)
    assert cli.main(["inspect", str(directory)]) == 2
    err = capsys.readouterr().err
    assert f"checkpoint index file {str(directory / 'checkpoint')!r}" in err
    assert expected in err
    assert "No checkpoint found" not in err
    assert err.count("\n") == 1


def test_inspect_directory_name_with_glob_characters_prints_state(tmp_path, capsys):
    """A checkpoint directory named like a glob pattern (``run[1]``) is read as it is."""
    loader = resumeloader.ResumableLoader(np.arange(100), batch_size=8, seed=5, num_epochs=2)
    loader.advance(num_batches=2)
    directory = tmp_path / "run[1]*?"
    tf.train.CheckpointManager(tf.train.Checkpoint(loader=loader), str(directory), 1).save(2)
    assert cli.main(["inspect", str(directory)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"offset in epoch\s+16 of 100 records", out)


class _NestedState(tf.train.experimental.PythonState):
    """A PythonState whose JSON is nested 100,000 levels deep (a tampered checkpoint)."""

    def serialize(self):
        return "[" * 100_000 + "]" * 100_000

    def deserialize(self, string_value):
        del string_value


def test_inspect_deeply_nested_json_exits_1_as_corrupted_state(tmp_path, capsys):
    """Deeply nested JSON under a py_state key is a corrupted state, not a RecursionError."""
    tf.train.Checkpoint(loader=_NestedState()).save(str(tmp_path / "ckpt"))
    assert cli.main(["inspect", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "checkpoint holds a corrupted loader state" in out
    assert "nested too deeply" in out


@pytest.mark.parametrize(
    "where", ["a-file", "under-a-file"], ids=["workdir-is-a-file", "workdir-uncreatable"]
)
def test_verify_unusable_workdir_exits_2_with_one_line(tmp_path, capsys, where):
    """--workdir naming a file, or a path that cannot be created, is a one-line usage error."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    workdir = blocker if where == "a-file" else blocker / "sub"
    assert cli.main(["verify", "--workdir", str(workdir), "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"Received: --workdir {str(workdir)!r}" in err


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5"])
def test_verify_timeout_not_positive_finite_exits_2(capsys, value):
    """--timeout nan (or inf, 0, negative) is a usage error, not a disabled timeout."""
    assert cli.main(["verify", "--timeout", value, "--", "true"]) == 2
    assert "--timeout must be a positive number of seconds" in capsys.readouterr().err


def test_inspect_relative_directory_prints_state(tmp_path, capsys, monkeypatch):
    """`inspect d` and `inspect ./d/` from d's parent read d's checkpoint (0.2.0 looked for
    ``./d/./d/ckpt-1``)."""
    loader = resumeloader.ResumableLoader(np.arange(100), batch_size=8, seed=5, num_epochs=2)
    loader.advance(num_batches=2)
    tf.train.CheckpointManager(tf.train.Checkpoint(loader=loader), str(tmp_path / "d"), 1).save()
    monkeypatch.chdir(tmp_path)
    for argument in ("d", "./d/"):
        assert cli.main(["inspect", argument]) == 0, capsys.readouterr().err
        out = capsys.readouterr().out
        assert re.search(r"offset in epoch\s+16 of 100 records", out)
        assert "checkpoint number: 1" in out


class _ForgedState(tf.train.experimental.PythonState):
    """A loader state (fingerprint and all) whose order field holds terminal escapes."""

    def serialize(self):
        from resumeloader.core import state

        evil = "\x1b]0;pwned\x07\x1b[2J"
        order = {"pipeline.seed": 0, "source.num_records": 10, "evil.field": evil}
        return state.to_json(state.make(order, epoch=0, offset=0, shard_count=1, batch_size=1))

    def deserialize(self, string_value):
        del string_value


def test_inspect_escapes_terminal_sequences_of_a_forged_state(tmp_path, capsys):
    """A state's strings (and the key it is under) are printed escaped, never raw to the
    terminal: ``\x1b]0;...`` would retitle the window, ``\x1b[2J`` clear the screen."""
    tf.train.Checkpoint(**{"loader\x1b[31m": _ForgedState()}).save(str(tmp_path / "ckpt"))
    assert cli.main(["inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;pwned\\x07\\x1b[2J" in out
    assert "loader\\x1b[31m" in out



_SHOW_MODULE = '''
import numpy as np
import resumeloader

def make_loader():
    web, code = np.arange(100, 160), np.arange(1000, 1020)
    pipeline = resumeloader.Pipeline.mix(
        {"web": web, "code": code}, weights={"web": 3, "code": 1}, seed=2
    ).amend(40, weights={"web": 1, "code": 1}).skip(64, 80)
    return resumeloader.ResumableLoader.from_pipeline(pipeline.batch(8), num_epochs=2)

def make_other():
    return resumeloader.Pipeline.mix(
        {"web": np.arange(100, 160), "code": np.arange(1000, 1020)},
        weights={"web": 3, "code": 1}, seed=2).batch(8)
'''


def _show_checkpoint(tmp_path, monkeypatch):
    (tmp_path / "show_job.py").write_text(_SHOW_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "show_job", raising=False)
    sys.path.insert(0, str(tmp_path))
    import show_job

    sys.path.remove(str(tmp_path))
    loader = show_job.make_loader()
    loader.advance(num_batches=9)  # past the change and the skip: position 88
    tf.train.CheckpointManager(tf.train.Checkpoint(loader=loader), str(tmp_path / "ck"), 1).save(9)
    return loader


def test_show_prints_the_records_of_steps_as_json_lines_and_a_table(tmp_path, capsys,
                                                                   monkeypatch):
    """show --json prints records_at of each step; the table has one row per record."""
    loader = _show_checkpoint(tmp_path, monkeypatch)
    argv = ["show", str(tmp_path / "ck"), "--pipeline", "show_job:make_loader"]
    assert cli.main([*argv, "--steps", "6:9", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == [batch.to_json() for batch in loader.records_at(range(6, 9))]
    first = json.loads(lines[0])
    assert first["step"] == 6 and first["records"][0]["source"] in ("web", "code")
    assert cli.main([*argv, "--positions", "88"]) == 0
    out = capsys.readouterr().out
    assert "checkpoint at position 88" in out
    for record in loader.records_at(positions=88)[0].records:
        assert re.search(rf"\b{record['index']}\b.*\b{record['source']}\b", out)


def test_show_with_a_pipeline_whose_past_differs_exits_2_naming_the_amendment(
    tmp_path, capsys, monkeypatch
):
    """A pipeline lacking the run's amendment is refused: exit 2, the amendment named."""
    _show_checkpoint(tmp_path, monkeypatch)
    argv = ["show", str(tmp_path / "ck"), "--pipeline", "show_job:make_other", "--steps", "2"]
    assert cli.main(argv) == 2
    assert "missing here: the checkpoint's mixture change at 40" in capsys.readouterr().err
