"""The ``resumeloader`` command: ``demo``, ``inspect``, ``show``, ``verify -- CMD ...``,
``index URL...``, ``plan MODULE:FACTORY`` and ``profile MODULE:FACTORY``.

* ``demo`` trains a small Keras model (`resumeloader.tools.demo`), SIGKILLs it at random
  steps, resumes it each time, and compares it with an uninterrupted run.
* ``inspect`` prints the loader state stored in a TF checkpoint, without your code.
* ``show`` prints the records of the batches of given steps or positions, for the
  checkpoint's run (`resumeloader.tools.show`; it builds your pipeline).
* ``verify`` does what ``demo`` does for your own training command (the contract
  is in its ``--help``); it exits 0 only when the resumed run is identical to the
  uninterrupted one, 1 when it differs, 2 on a usage error. The uninterrupted run
  ends before the first killed one starts (``--parallel``: both at once).
* ``index`` builds TFRecord offset indexes and writes them next to objects in storage
  (`resumeloader.tools.index`), so that fresh machines do not read the objects.
* ``plan`` prints what the order of your loader will read over given steps (GETs and
  bytes, read-ahead and cache) and how well it shuffles beside tf.data, without
  reading a record (`resumeloader.tools.plan`).
* ``profile`` times each stage of your pipeline for some batches without a model, names
  the bottleneck and measures the settings that keep the stream
  (`resumeloader.tools.profile`).

No command imports TensorFlow in this process unless your code needs it: ``show``
given a function that builds a `ResumableLoader` (its start-up lines are kept out of
the output), ``plan`` given a module that imports it, ``profile`` always (it runs your
loader); the training runs in subprocesses.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import sys
from collections.abc import Sequence
from typing import Any

from rich import markup
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from resumeloader import _version, errors
from resumeloader.tools import harness as harness_lib
from resumeloader.tools import report as report_lib

__all__ = ["main"]

_CONTRACT = """\
the contract your training script follows (help(resumeloader.testing.TraceRecorder)):
  recorder = resumeloader.testing.TraceRecorder.from_env()   # no-op outside verify
  restore the newest checkpoint of $RESUMELOADER_CKPT_DIR (or {ckpt_dir} in CMD)
  recorder.start(steps_done)                     # once, after restoring
  recorder.step(step, batch, records=ids)        # after every training step
  manager.save(..., options=recorder.checkpoint_options())
  recorder.commit(steps_done)                    # after every save returned
  recorder.finish(weights=model.weights, loss=loss)
a Keras fit with a ResumeCallback needs only one callback, last in the list:
  resume = resumeloader.keras.ResumeCallback(loader, os.environ["RESUMELOADER_CKPT_DIR"])
  model.fit(..., callbacks=[..., resume, resumeloader.testing.FitRecorder(resume)])
environment set for each process: RESUMELOADER_TRACE, RESUMELOADER_CKPT_DIR,
RESUMELOADER_PAUSE_AT (kill point), TF_CPP_MIN_LOG_LEVEL=2 unless set.
the uninterrupted run ends before the first killed one starts (--parallel: both at
once, about half the time for twice the memory, CPU and GPU share).
"""
_DEMO_RECORDS = 512
_DEMO_BATCH = 32


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resumeloader", description="Prove that training resumes at the exact record."
    )
    parser.add_argument("--version", action="version", version=_version.__version__)
    sub = parser.add_subparsers(dest="action", required=True)
    demo = sub.add_parser("demo", help="kill and resume a small Keras job, compare (< 1 min)")
    demo.add_argument("--kills", type=int, default=3, help="SIGKILLs at random steps (3)")
    demo.add_argument("--seed", type=int, default=0, help="seeds the data, model and kills (0)")
    demo.add_argument("--epochs", type=int, default=2, help="epochs of 16 steps (2)")
    demo.add_argument("--workdir", help="keep checkpoints, traces and logs here")
    demo.add_argument(
        "--naive",
        action="store_true",
        help="then kill the same job on the common workaround (checkpointed index "
        "iterator + from_generator) at the same steps, for comparison",
    )
    inspect = sub.add_parser("inspect", help="print the loader state stored in a checkpoint")
    inspect.add_argument("checkpoint", help="a checkpoint directory or prefix")
    show = sub.add_parser(
        "show",
        help="print the records of the batches of given steps (table or JSON lines)",
        description="Restores the checkpoint's loader state into the loader your "
        "function builds and prints the records of each batch asked for (default: the "
        "next one), without computing the batches before them.",
    )
    show.add_argument("checkpoint", help="a checkpoint directory or prefix")
    show.add_argument(
        "--pipeline", required=True, metavar="MODULE:FUNCTION",
        help="a function returning your ResumableLoader or Pipeline",
    )
    show.add_argument("--steps", metavar="N|START:STOP",
                      help="batches numbered from position 0, with the batch size in force")
    show.add_argument("--positions", metavar="P|START:STOP",
                      help="the batch starting at P, or every batch from START until STOP")
    show.add_argument("--batch-size", type=int, default=None,
                      help="the batch size of that part of the run (elastic runs)")
    show.add_argument("--key", help="the loader's key in the checkpoint, if it holds several")
    show.add_argument(
        "--format", choices=("table", "tsv", "json"), default=None, dest="output_format",
        help="table (aligned columns; the default), tsv (tab-separated, with a header) or "
        "json (one JSON line per batch). Rows stream as they are found",
    )
    show.add_argument("--json", action="store_true", help="the same as --format json")
    show.add_argument(
        "--wide", action="store_true",
        help="on a terminal, do not shorten long file names to fit its width (they are "
        "never shortened when the output goes to a file or a pipe)",
    )
    verify = sub.add_parser(
        "verify",
        help="kill and restart YOUR training command, compare",
        description="Runs the command uninterrupted and SIGKILLed-and-restarted; exits 0 "
        "only when the resumed run trained on identical batches (1: different, 2: error).",
        epilog=_CONTRACT,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    verify.add_argument("--kills", type=int, default=3, help="SIGKILLs at random steps (3)")
    verify.add_argument(
        "--kill-at",
        action="append",
        metavar="POINT",
        help="kill at step:N, commit:N, save:N or mark:NAME:N instead (repeatable)",
    )
    verify.add_argument(
        "--no-pause",
        action="store_true",
        help="do not stop the job at its kill point: SIGKILL it as soon as the trace "
        "reaches the step, wherever it is by then",
    )
    verify.add_argument(
        "--parallel",
        action="store_true",
        help="run the uninterrupted process alongside the killed ones (with --kill-at): "
        "about half the time, but two training processes at once",
    )
    verify.add_argument("--seed", type=int, default=None, help="seeds the random kill steps")
    verify.add_argument("--workdir", help="keep checkpoints, traces and logs here")
    verify.add_argument("--timeout", type=float, default=600.0, help="seconds per process")
    verify.add_argument("command", nargs=argparse.REMAINDER, help="-- python train.py ...")
    plan = sub.add_parser(
        "plan",
        help="what your order will read (GETs, bytes, cache) and how well it shuffles",
        description="Builds your loader or pipeline and computes, without reading any "
        "record, what the batches of the given steps read: per shard and group of steps, "
        "the objects or files touched, the GETs and bytes after merging and caching, the "
        "local reads, the read-ahead and cache they need; and the order's shuffle score "
        "beside tf.data's list_files + interleave + shuffle(buffer) at the given settings.",
    )
    plan.add_argument("factory", metavar="MODULE:FACTORY",
                      help="a function returning your ResumableLoader or Pipeline")
    plan.add_argument("--steps", metavar="N|START:STOP",
                      help="batches numbered from position 0 (default: the first epoch)")
    plan.add_argument("--every", type=int, metavar="K", help="steps per row (default: 10 rows)")
    plan.add_argument("--shards", metavar="all|I,J,...", help="which shards (default: all)")
    plan.add_argument("--shard-count", type=int, metavar="N",
                      help="plan N shards (default: the loader's shard count)")
    plan.add_argument("--buffer", type=int, default=10_000, metavar="N",
                      help="tf.data shuffle buffer compared with (10000)")
    plan.add_argument("--cycle-length", type=int, metavar="N",
                      help="tf.data interleave cycle_length (default: files, at most the cores)")
    plan.add_argument("--block-length", type=int, default=1, metavar="N",
                      help="tf.data interleave block_length (1)")
    plan.add_argument("--json", action="store_true", help="one JSON object per line")
    index = sub.add_parser(
        "index",
        help="build TFRecord indexes, written next to objects in storage (sidecars)",
        description="Builds the offset index of every TFRecord file or object named and "
        "writes it next to each object (URL + '.rlidx'), so that a TFRecordSource on any "
        "machine reads the sidecar instead of the object. Credentials and endpoints come "
        "from the standard environment (AWS_ENDPOINT_URL, AWS_*, "
        "GOOGLE_APPLICATION_CREDENTIALS, STORAGE_EMULATOR_HOST).",
    )
    index.add_argument("paths", nargs="+", help="URLs (s3://, gs://, ...), globs, or files")
    index.add_argument("--index-dir", help="where local files' indexes go (the default cache)")
    profile = sub.add_parser(
        "profile",
        help="time each stage of your pipeline, name the bottleneck, measure settings",
        description="Builds your loader or pipeline, consumes --batches batches without a "
        "model with every batch timed, and prints each stage's cost per record, the records/s "
        "it allows and the bottleneck; then measures the worker kinds and counts and prefetch "
        "depths on fresh loaders of the same pipeline (and the block order for data in "
        "storage) and recommends the fastest measured setting.",
    )
    profile.add_argument("factory", metavar="MODULE:FACTORY",
                         help="a function returning your ResumableLoader or Pipeline")
    profile.add_argument("--batches", type=int, default=50, metavar="N",
                         help="batches profiled (50)")
    profile.add_argument("--trial-batches", type=int, default=None, metavar="N",
                         help="batches timed per setting tried (default: half of --batches, "
                         ">= 10)")
    profile.add_argument("--no-tune", action="store_true",
                         help="only the per-stage table: try no settings")
    profile.add_argument("--json", action="store_true", help="one JSON object")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command line; returns the exit status."""
    args = _parser().parse_args(argv)
    # TensorFlow's informational lines, should a command load it (show, for a pipeline
    # that needs it): they are no answer to the command.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # No markup by default: messages and log tails may contain [brackets].
    out = Console(highlight=False, markup=False)
    err = Console(stderr=True, highlight=False, markup=False)
    try:
        if args.action == "inspect":
            from resumeloader.tools import inspect as inspect_lib

            return inspect_lib.main(args.checkpoint, out)
        if args.action == "show":
            from resumeloader.tools import show as show_lib

            if args.json and args.output_format not in (None, "json"):
                msg = f"--json contradicts --format {args.output_format}."
                raise ValueError(msg)
            return show_lib.main(
                args.checkpoint, out, pipeline=args.pipeline, steps=args.steps,
                positions=args.positions, batch_size=args.batch_size, key=args.key,
                output_format="json" if args.json else args.output_format or "table",
                wide=args.wide,
            )
        if args.action == "plan":
            from resumeloader.tools import plan as plan_tool

            return plan_tool.main(
                args.factory, out, steps=args.steps, every=args.every, shards=args.shards,
                shard_count=args.shard_count, as_json=args.json, buffer_size=args.buffer,
                cycle_length=args.cycle_length, block_length=args.block_length,
            )
        if args.action == "index":
            from resumeloader.tools import index as index_tool

            return index_tool.main(args.paths, out, index_dir=args.index_dir, err=err)
        if args.action == "profile":
            from resumeloader.tools import profile as profile_tool

            if args.batches < 2:
                msg = f"--batches must be at least 2. Received: --batches {args.batches}."
                raise ValueError(msg)
            return profile_tool.main(
                args.factory, out, batches=args.batches, tune=not args.no_tune,
                trial_batches=args.trial_batches, as_json=args.json,
            )
        _check_workdir(args.workdir)
        if args.action == "demo":
            return _demo(args, out, err)
        return _verify(args, out, err)
    except BrokenPipeError:
        # The reader stopped reading (`| head`): stop quietly, as other tools do, and
        # keep the interpreter from complaining when it flushes standard output at exit.
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (ValueError, OSError, errors.HarnessError) as error:
        # One line, exit status 2: 1 means "the resumed run differs" and nothing else.
        text = " ".join(str(error).split())
        err.print(f"[red]error:[/] {markup.escape(text)}", markup=True, soft_wrap=True)
        return 2


def _check_workdir(workdir: str | None) -> None:
    """Creates `workdir` now, so that a bad one is a usage error before anything runs."""
    if workdir is None:
        return
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        msg = f"--workdir must be a directory. Received: --workdir {workdir!r} (a file)."
        raise ValueError(msg)
    try:
        os.makedirs(workdir, exist_ok=True)
    except OSError as error:
        msg = (
            f"--workdir cannot be created: {error.strerror or error}. "
            f"Received: --workdir {workdir!r}."
        )
        raise ValueError(msg) from error


def _demo(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.kills < 0 or args.epochs < 1:
        msg = f"Need --kills >= 0 and --epochs >= 1. Received: {args.kills}, {args.epochs}."
        raise ValueError(msg)
    total = args.epochs * math.ceil(_DEMO_RECORDS / _DEMO_BATCH)
    steps = sorted(random.Random(args.seed).sample(range(1, total - 1), min(args.kills, total - 2)))
    command = [sys.executable, "-m", "resumeloader.tools.demo", "--epochs", str(args.epochs),
               "--seed", str(args.seed), "--records", str(_DEMO_RECORDS),
               "--batch-size", str(_DEMO_BATCH)]
    out.print(
        f"Training a small Keras CNN on {_DEMO_RECORDS} generated images for {args.epochs} "
        f"epochs ({total} steps, batch {_DEMO_BATCH}, random augmentation in map_fn, "
        f"prefetch, checkpoint every 5 steps), op determinism on.\n"
        f"Run 1 uninterrupted; run 2 killed with SIGKILL after steps {steps} and resumed.",
        soft_wrap=True,
    )
    # A small job of known size: both runs at once fit any machine, in half the time.
    report = _run(command, err, kill_points=steps, total=total, workdir=args.workdir,
                  parallel=True)
    _print_report(report, out, "resumeloader: uninterrupted vs. killed and resumed")
    if args.naive:
        out.print(
            "\nThe same job on the common workaround: a checkpointed iterator over a TF "
            "index dataset + from_generator + map(py_function) + batch + prefetch "
            "(op determinism off), killed at the same steps:",
            soft_wrap=True,
        )
        workdir = None if args.workdir is None else f"{args.workdir}/naive"
        naive = _run([*command, "--pipeline", "naive"], err, kill_points=steps, total=total,
                     workdir=workdir, parallel=True)
        _print_report(naive, out, "common workaround: uninterrupted vs. killed and resumed")
    return 0 if report.identical else 1


def _verify(args: argparse.Namespace, out: Console, err: Console) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        msg = "Give the training command after `--`, e.g. `resumeloader verify -- python train.py`."
        raise ValueError(msg)
    if args.kills < 0:
        msg = f"--kills must be >= 0. Received: {args.kills}."
        raise ValueError(msg)
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        msg = f"--timeout must be a positive number of seconds. Received: {args.timeout}."
        raise ValueError(msg)
    if args.kill_at:
        harness_lib.check_points(args.kill_at)  # before the progress display starts
    report = _run(
        command,
        err,
        kill_points=args.kill_at,
        kills=args.kills,
        seed=args.seed,
        workdir=args.workdir,
        timeout=args.timeout,
        pause=not args.no_pause,
        parallel=args.parallel,
    )
    _print_report(report, out)
    return 0 if report.identical else 1


def _run(command: list[str], err: Console, *, total: int | None = None, **kwargs: Any) -> Any:
    """Runs the harness with a progress display on `err`: one bar for the uninterrupted
    run, one for the killed and restarted processes (which process, how many kills)."""
    points = kwargs.get("kill_points")
    planned = len(points) if points else kwargs.get("kills", 3)
    with Progress(
        TextColumn("{task.description:<42}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("steps"),
        TimeElapsedColumn(),
        console=err,
        transient=False,
    ) as progress:
        reference = progress.add_task("uninterrupted", total=total)
        resumed = progress.add_task("killed + resumed: waiting", total=total, start=False)
        seen = {"processes": 0, "kills": 0}

        def describe(what: str = "") -> str:
            return (
                f"killed + resumed: process {seen['processes']}, "
                f"{seen['kills']}/{planned} SIGKILLs{what}"
            )

        def on_event(name: str, event: dict[str, Any]) -> None:
            kind = event.get("event")
            if name == "reference":
                if kind == "step":
                    progress.update(reference, completed=event["step"] + 1)
                elif kind == "end":
                    steps = event["step"]
                    progress.update(reference, total=steps, completed=steps,
                                    description="uninterrupted: done")
                    if total is None:
                        progress.update(resumed, total=steps)
                return
            if kind == "start":
                seen["processes"] += 1
                progress.start_task(resumed)
                progress.update(resumed, completed=event["step"], description=describe())
            elif kind == "step":
                progress.update(resumed, completed=event["step"] + 1)
            elif kind == "pause":
                seen["kills"] += 1
                progress.update(resumed, description=describe())
            elif kind == "end":
                progress.update(resumed, description=describe(": done"))

        report = harness_lib.kill_and_restart(command, on_event=on_event, **kwargs)
        for task, done in ((reference, report.reference_steps), (resumed, report.resumed_steps)):
            progress.update(task, total=total or done, completed=done)
    return report


def _print_report(
    report: report_lib.ResumeReport,
    out: Console,
    title: str = "uninterrupted vs. killed and resumed",
) -> None:
    table = Table(title=title)
    table.add_column("")
    table.add_column("uninterrupted", justify="right")
    table.add_column("killed + resumed", justify="right")
    for row in report.rows():
        table.add_row(*row)
    out.print(table)
    for line in report.details():
        out.print(line, soft_wrap=True, markup=False)
    if not report.identical:
        verdict = "[red]DIFFERENT[/]: the resumed run is not the uninterrupted one (see above)"
    elif report.weights_identical:
        verdict = "[green]IDENTICAL[/]: same batches, same order, same bytes, same final weights"
    else:
        verdict = "[green]IDENTICAL[/]: same batches, same order, same bytes"
    out.print(verdict, markup=True)
