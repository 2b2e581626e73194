"""resumeloader.keras: a fit interrupted mid-epoch and resumed equals the uninterrupted fit."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import _exits
import _keras_job as job
import _limits
import _pages
import keras
import numpy as np
import pytest
import tensorflow as tf

import resumeloader
import resumeloader.keras
from resumeloader import cli
from resumeloader.tools import harness as _harness

pytestmark = pytest.mark.usefixtures("clean_keras")

PROVING_IT = Path(__file__).resolve().parents[2] / "docs" / "guides" / "proving-it.md"

EPOCHS = 3
# name: (mode, steps_per_execution, loader options, validation)
VARIANTS = {
    "epoch-dataset": ("epoch-dataset", 1, {}, False),
    "epoch-dataset-spe3": ("epoch-dataset", 3, {}, False),
    "steps-per-epoch": ("steps", 1, {"drop_remainder": True}, False),
    "steps-per-epoch-spe2": ("steps", 2, {"drop_remainder": True}, False),
    "validation-data": ("epoch-dataset", 1, {}, True),
    "endless-dataset": ("dataset", 1, {}, False),
}
_reference_cache: dict[str, tuple[dict[int, list[int]], list[np.ndarray]]] = {}


def reference(tmp_path_factory, variant: str):
    """The uninterrupted fit of `variant` (cached per test session)."""
    if variant not in _reference_cache:
        mode, spe, options, validation = VARIANTS[variant]
        directory = tmp_path_factory.mktemp(f"reference-{variant}")
        log, weights, _ = job.fit(
            str(directory), epochs=EPOCHS, mode=mode, steps_per_execution=spe,
            loader_options=options, validation=validation,
        )
        _reference_cache[variant] = (log, weights)
    return _reference_cache[variant]


def expected_log(**loader_options) -> dict[int, list[int]]:
    """Record ids of every batch of EPOCHS epochs, from the loader alone."""
    loader = job.make_loader(num_epochs=EPOCHS, prefetch=None, **loader_options)
    return {step: (batch[0][:, 0].numpy() * job.ID_SCALE).round().astype(int).tolist()
            for step, batch in enumerate(loader)}


def assert_same_weights(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fit_uninterrupted_consumes_loader_epochs_as_keras_epochs(tmp_path_factory, variant):
    """Every optimizer step of an uninterrupted fit gets the loader's next batch."""
    log, _ = reference(tmp_path_factory, variant)
    assert log == expected_log(**VARIANTS[variant][2])


@pytest.mark.parametrize(
    ("variant", "interrupt_at"),
    [
        ("epoch-dataset", 5),
        ("epoch-dataset", 7),
        ("epoch-dataset", 10),
        ("epoch-dataset-spe3", 5),
        ("steps-per-epoch", 5),
        ("steps-per-epoch-spe2", 7),
        ("validation-data", 10),
        ("endless-dataset", 5),
    ],
    ids=[
        "mid-first-epoch",
        "epoch-boundary",
        "mid-second-epoch",
        "spe3-mid-epoch",
        "steps-per-epoch-mid-epoch",
        "steps-per-epoch-spe2-mid-epoch",
        "validation-data-mid-epoch",
        "endless-dataset-mid-epoch",
    ],
)
def test_fit_interrupted_by_exception_resumes_same_batches_and_weights(
    tmp_path, tmp_path_factory, variant, interrupt_at
):
    """A fit crashed by a callback exception, resumed in fresh objects, equals the uninterrupted."""
    mode, spe, options, validation = VARIANTS[variant]
    want_log, want_weights = reference(tmp_path_factory, variant)
    log: dict[int, list[int]] = {}
    resumed: dict[int, list[int]] = {}
    common = dict(mode=mode, steps_per_execution=spe, loader_options=options,
                  validation=validation)
    with pytest.raises(job.Interrupt):
        job.fit(str(tmp_path), epochs=EPOCHS, interrupt_at=interrupt_at, log=log, **common)
    assert max(log) >= interrupt_at - 1
    _, weights, loader = job.fit(str(tmp_path), epochs=EPOCHS, log=resumed, **common)
    # The second fit started from a checkpoint, not from step 0, and re-ran nothing new.
    assert 0 < min(resumed) <= max(log) + 1
    assert {**log, **resumed} == want_log == expected_log(**options)
    assert_same_weights(weights, want_weights)
    assert loader.epoch == EPOCHS and loader.step == 0


def test_fit_resumed_mid_epoch_starts_in_the_loader_epoch(tmp_path):
    """A resumed fit starts at the Keras epoch of the loader's epoch, not at epoch 0."""
    with pytest.raises(job.Interrupt):
        job.fit(str(tmp_path), epochs=EPOCHS, interrupt_at=10)
    epochs_begun = []
    loader = job.make_loader()
    model = job.make_model({})
    record = keras.callbacks.LambdaCallback(on_epoch_begin=lambda e, logs: epochs_begun.append(e))
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path), save_every=2)
    model.fit(resumeloader.keras.epoch_dataset(loader), epochs=EPOCHS, verbose=0,
              callbacks=[callback, record])
    assert epochs_begun == [1, 2]


def test_fit_called_again_after_return_continues_with_next_epochs(tmp_path, tmp_path_factory):
    """fit(epochs=1) then fit(epochs=3) on the same objects equals one fit(epochs=3)."""
    want_log, want_weights = reference(tmp_path_factory, "epoch-dataset")
    log: dict[int, list[int]] = {}
    loader = job.make_loader()
    model = job.make_model(log)
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path), save_every=None)
    dataset = resumeloader.keras.epoch_dataset(loader)
    model.fit(dataset, epochs=1, verbose=0, callbacks=[callback])
    assert loader.epoch == 1
    model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=[callback])
    assert log == want_log
    assert_same_weights(model.get_weights(), want_weights)


def test_fit_again_on_same_objects_after_exception_rolls_back_to_checkpoint(
    tmp_path, tmp_path_factory
):
    """Re-running fit in the same process after a crash (e.g. a notebook) equals no crash."""
    want_log, want_weights = reference(tmp_path_factory, "epoch-dataset")
    log: dict[int, list[int]] = {}
    loader = job.make_loader()
    model = job.make_model(log)
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path), save_every=2)
    dataset = resumeloader.keras.epoch_dataset(loader)
    with pytest.raises(job.Interrupt):
        model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=[callback, job.InterruptAt(10)])
    assert loader.position == 40 + 3 * 6  # 10 steps ran; the last save was after 9
    before = dict(log)
    log.clear()
    model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=[callback])
    assert min(log) == 9  # rolled back to the checkpoint: the 10th step runs again
    assert {**before, **log} == want_log
    assert_same_weights(model.get_weights(), want_weights)


def test_fit_finite_loader_stops_when_exhausted(tmp_path):
    """fit with more epochs than a finite loader has stops after the loader's last epoch."""
    log, _, loader = job.fit(str(tmp_path), epochs=5, loader_options={"num_epochs": 2})
    assert loader.exhausted
    assert log == {k: v for k, v in expected_log().items() if k < 2 * loader.batches_per_epoch}


def test_fit_user_checkpoint_manager_is_used(tmp_path):
    """With the user's CheckpointManager the callback saves through it and restores from it."""
    loader = job.make_loader()
    model = job.make_model({})
    model.optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, loader=loader)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=None)
    callback = resumeloader.keras.ResumeCallback(loader, manager, save_every=3)
    model.fit(resumeloader.keras.epoch_dataset(loader), epochs=1, verbose=0, callbacks=[callback])
    # 7 batches: saves after 3 and 6, at the epoch end.
    assert len(manager.checkpoints) == 3
    fresh = job.make_loader()
    tf.train.Checkpoint(loader=fresh).read(manager.checkpoints[0]).expect_partial()
    assert fresh.position == 3 * 6
    # A new fit through another manager on the directory restores: only epoch 1 runs.
    loader = job.make_loader()
    model = job.make_model({})
    model.optimizer.build(model.trainable_variables)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, loader=loader)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=None)
    batches: list[int] = []
    count = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
    callbacks = [resumeloader.keras.ResumeCallback(loader, manager, save_every=3), count]
    model.fit(resumeloader.keras.epoch_dataset(loader), epochs=2, verbose=0, callbacks=callbacks)
    assert len(batches) == loader.batches_per_epoch
    assert loader.epoch == 2


def test_resume_callback_manager_without_loader_raises(tmp_path):
    """A CheckpointManager that does not track the loader is refused at construction."""
    loader = job.make_loader()
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(), str(tmp_path), max_to_keep=1)
    with pytest.raises(ValueError, match="does not track the loader") as info:
        resumeloader.keras.ResumeCallback(loader, manager)
    assert "loader=ResumableLoader(" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"checkpoint": 3}, TypeError, "checkpoint=3"),
        ({"save_every": 0}, ValueError, "save_every"),
        ({"loader": "data"}, TypeError, "loader='data'"),
    ],
    ids=["bad-checkpoint", "zero-save-every", "not-a-loader"],
)
def test_resume_callback_invalid_arguments_raise(tmp_path, kwargs, error, match):
    """Invalid constructor arguments raise errors naming the argument and value."""
    arguments = {"loader": job.make_loader(), "checkpoint": str(tmp_path), **kwargs}
    with pytest.raises(error) as info:
        resumeloader.keras.ResumeCallback(**arguments)
    assert match in str(info.value)


def test_fit_steps_per_epoch_not_an_epoch_raises(tmp_path):
    """steps_per_epoch other than the loader's batches per epoch is refused before training."""
    loader = job.make_loader()
    model = job.make_model({})
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path))
    with pytest.raises(ValueError, match="steps_per_epoch=5") as info:
        model.fit(loader.dataset(), steps_per_epoch=5, epochs=1, verbose=0, callbacks=[callback])
    assert "loader.batches_per_epoch=7" in str(info.value)
    assert loader.position == 0


def test_fit_steps_per_execution_not_dividing_epoch_with_steps_raises(tmp_path):
    """With steps_per_epoch, a steps_per_execution that would cross epochs is refused."""
    loader = job.make_loader()
    model = job.make_model({}, steps_per_execution=2)
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path))
    with pytest.raises(ValueError, match="steps_per_execution=2") as info:
        model.fit(loader.dataset(), steps_per_epoch=7, epochs=1, verbose=0, callbacks=[callback])
    assert "batches per epoch=7" in str(info.value)


def test_fit_after_resumed_fit_without_callback_starts_at_its_initial_epoch(tmp_path):
    """The initial epoch set for a resumed fit does not leak into a later plain fit."""
    loader = job.make_loader()
    model = job.make_model({})
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path))
    dataset = resumeloader.keras.epoch_dataset(loader)
    model.fit(dataset, epochs=1, verbose=0, callbacks=[callback])
    resumed = model.fit(dataset, epochs=2, verbose=0, callbacks=[callback])
    assert resumed.epoch == [1]
    data = job.source()
    history = model.fit(data["x"], data["y"], epochs=1, verbose=0)
    assert history.epoch == [0]


def test_fit_initial_epoch_not_the_loader_epoch_raises(tmp_path):
    """An initial_epoch that is not the loader's epoch is refused before any step."""
    loader = job.make_loader()
    model = job.make_model({})
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path))
    with pytest.raises(ValueError, match="Keras epoch 2 does not match the loader's epoch 0"):
        model.fit(resumeloader.keras.epoch_dataset(loader), initial_epoch=2, epochs=3,
                  verbose=0, callbacks=[callback])
    assert int(model.optimizer.iterations.numpy()) == 0


def test_epoch_dataset_not_a_loader_raises():
    """epoch_dataset refuses anything but a ResumableLoader."""
    with pytest.raises(TypeError, match="loader=") as info:
        resumeloader.keras.epoch_dataset([1, 2])
    assert "[1, 2]" in str(info.value)


@pytest.mark.slow
def test_fit_killed_by_sigkill_resumes_same_batches_and_weights(tmp_path, tmp_path_factory):
    """A fit SIGKILLed mid-epoch in a subprocess and restarted equals the uninterrupted fit
    (both processes forked in turn from one warm interpreter that imported TensorFlow)."""
    want_log, want_weights = reference(tmp_path_factory, "epoch-dataset")
    ckpt, output = tmp_path / "ckpt", tmp_path / "result.json"
    args = [str(ckpt), str(output), str(EPOCHS)]
    jobs = [{"script": job.__file__, "args": [*args, "10"], "log": str(tmp_path / "killed.log")},
            {"script": job.__file__, "args": args, "log": str(tmp_path / "resumed.log")}]
    killed, resumed = _exits.run_forked(jobs, workdir=tmp_path, parallel=1,
                                        limit=_limits.EXIT, timeout=2 * _limits.PROCESS)
    assert killed["returncode"] == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-2000:]
    assert resumed["returncode"] == 0, (tmp_path / "resumed.log").read_text()[-2000:]
    result = json.loads(output.read_text())
    log = {int(k): v for k, v in result["log"].items()}
    first = min(log)
    assert first == 9  # saves at steps 2, 4, 6, 7 (epoch end), 9: killed at 10, mid-epoch 1
    assert log == {k: v for k, v in want_log.items() if k >= first}
    assert_same_weights([np.asarray(w, np.float32) for w in result["weights"]], want_weights)


def mirrored_fit(directory, strategy, *, mode, interrupt_at=None, batches=None):
    """A plain model trained under `strategy` from a loader created in its scope."""
    batches = [] if batches is None else batches
    with strategy.scope():
        loader = job.make_loader(batch_size=8, drop_remainder=True)
        model = keras.Sequential([
            keras.Input((job.FEATURES,)),
            keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(3)),
        ])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    callbacks = [
        resumeloader.keras.ResumeCallback(loader, str(directory), save_every=2),
        keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b)),
    ]
    if interrupt_at is not None:
        callbacks.append(job.InterruptAt(interrupt_at))
    if mode == "input-context":
        x = strategy.distribute_datasets_from_function(
            lambda ctx: loader.dataset(input_context=ctx)
        )
        kwargs = {"steps_per_epoch": loader.batches_per_epoch}
    else:
        x, kwargs = resumeloader.keras.epoch_dataset(loader), {}
    model.fit(x, epochs=EPOCHS, callbacks=callbacks, verbose=0, shuffle=False, **kwargs)
    return model.get_weights(), loader


@pytest.mark.parametrize("mode", ["epoch-dataset", "input-context"])
def test_fit_mirrored_strategy_interrupted_resumes_same_weights(tmp_path, mode):
    """Under MirroredStrategy (2 replicas) a fit resumed mid-epoch equals the uninterrupted one."""
    devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
    strategy = tf.distribute.MirroredStrategy(devices)
    want, _ = mirrored_fit(tmp_path / "reference", strategy, mode=mode)
    with pytest.raises(job.Interrupt):
        mirrored_fit(tmp_path / "run", strategy, mode=mode, interrupt_at=7)
    batches: list[int] = []
    got, loader = mirrored_fit(tmp_path / "run", strategy, mode=mode, batches=batches)
    assert 0 < len(batches) < EPOCHS * loader.batches_per_epoch  # it resumed mid-run
    assert_same_weights(got, want)
    assert (loader.epoch, loader.step) == (EPOCHS, 0)


# -- callbacks with their own state ----------------------------------------------------

STOP_EPOCHS = 10


def early_stopping():
    """Stops at the end of epoch 5 of this job (training loss, best at epoch 4)."""
    return keras.callbacks.EarlyStopping(
        monitor="loss", patience=1, min_delta=0.05, restore_best_weights=True
    )


def fit_with(directory, before, *, interrupt_at=None, log=None):
    """A fit of the test job with `before` ahead of the ResumeCallback; (log, weights, history)."""
    log = {} if log is None else log
    history: list[keras.callbacks.History] = []
    _, weights, _ = job.fit(
        str(directory), epochs=STOP_EPOCHS, before=before, interrupt_at=interrupt_at,
        log=log, history=history,
    )
    return log, weights, history[0]


def test_fit_early_stopping_before_resume_callback_stops_training(tmp_path):
    """[EarlyStopping, ResumeCallback]: EarlyStopping stops the fit at its epoch."""
    stopper = early_stopping()

    _, _, history = fit_with(tmp_path, [stopper])

    assert history.epoch == [0, 1, 2, 3, 4, 5]
    assert (stopper.stopped_epoch, stopper.best_epoch) == (5, 4)


@pytest.mark.parametrize(
    "interrupt_at", [31, 38, 42], ids=["mid-epoch-4", "mid-stop-epoch", "last-batch"]
)
def test_fit_early_stopping_interrupted_and_resumed_stops_at_the_same_epoch(
    tmp_path, interrupt_at
):
    """A fit with EarlyStopping interrupted and resumed stops at the same epoch, same weights."""
    want_log, want_weights, want = fit_with(tmp_path / "reference", [early_stopping()])
    log: dict[int, list[int]] = {}
    with pytest.raises(job.Interrupt):
        fit_with(tmp_path / "run", [early_stopping()], interrupt_at=interrupt_at, log=log)
    stopper = early_stopping()

    resumed_log, weights, resumed = fit_with(tmp_path / "run", [stopper])

    assert {**log, **resumed_log} == want_log
    assert resumed.epoch[-1] == want.epoch[-1] == stopper.stopped_epoch == 5
    # The resumed epoch's logs average all its batches, those before the interruption too.
    assert resumed.history["loss"][0] == want.history["loss"][resumed.epoch[0]]
    assert_same_weights(weights, want_weights)


def test_fit_stopped_by_early_stopping_and_resumed_trains_no_more(tmp_path):
    """A fit that EarlyStopping ended, started again on its checkpoint, trains nothing."""
    _, want_weights, first = fit_with(tmp_path, [early_stopping()])
    assert first.epoch[-1] == 5 < STOP_EPOCHS - 1

    log, weights, history = fit_with(tmp_path, [early_stopping()])

    assert history.epoch == [] and log == {}
    assert_same_weights(weights, want_weights)


def _plateau_callbacks(directory):
    return [
        keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=1,
                                          min_delta=0.5),
        keras.callbacks.ModelCheckpoint(str(directory / "best.weights.h5"), monitor="loss",
                                        save_best_only=True, save_weights_only=True),
    ]


def test_fit_reduce_lr_and_model_checkpoint_state_resumed(tmp_path):
    """ReduceLROnPlateau's counters and ModelCheckpoint's best value survive a resume."""
    reference = _plateau_callbacks(tmp_path)
    want_log, want_weights, _ = fit_with(tmp_path / "reference", reference)
    log: dict[int, list[int]] = {}
    with pytest.raises(job.Interrupt):
        fit_with(tmp_path / "run", _plateau_callbacks(tmp_path), interrupt_at=45, log=log)
    resumed = _plateau_callbacks(tmp_path)

    resumed_log, weights, _ = fit_with(tmp_path / "run", resumed)

    assert {**log, **resumed_log} == want_log
    plateau, best = resumed[0], resumed[1]
    assert (plateau.wait, plateau.cooldown_counter, plateau.best) == (
        reference[0].wait, reference[0].cooldown_counter, reference[0].best
    )
    assert best.best == reference[1].best
    assert_same_weights(weights, want_weights)


@pytest.mark.parametrize(
    "callback",
    [early_stopping, lambda: keras.callbacks.ReduceLROnPlateau(monitor="loss")],
    ids=["early-stopping", "reduce-lr"],
)
def test_fit_stateful_callback_after_resume_callback_raises(tmp_path, callback):
    """A stateful callback after ResumeCallback in `callbacks` is refused before training."""
    loader = job.make_loader()
    model = job.make_model({})
    resume = resumeloader.keras.ResumeCallback(loader, str(tmp_path))

    with pytest.raises(ValueError, match="Put ResumeCallback after") as info:
        model.fit(resumeloader.keras.epoch_dataset(loader), epochs=1, verbose=0,
                  callbacks=[resume, callback()])

    assert type(callback()).__name__ in str(info.value)
    assert int(model.optimizer.iterations.numpy()) == 0


def test_fit_with_backup_and_restore_raises(tmp_path):
    """BackupAndRestore with ResumeCallback is refused: it would restart the epoch."""
    loader = job.make_loader()
    model = job.make_model({})
    callbacks = [keras.callbacks.BackupAndRestore(str(tmp_path / "backup")),
                 resumeloader.keras.ResumeCallback(loader, str(tmp_path / "ckpt"))]

    with pytest.raises(ValueError, match="replaces BackupAndRestore"):
        model.fit(resumeloader.keras.epoch_dataset(loader), epochs=1, verbose=0,
                  callbacks=callbacks)
    assert loader.position == 0


def test_fit_epoch_mismatch_message_names_the_epoch(tmp_path):
    """The epoch-mismatch error prints the epoch's value, not a placeholder."""
    loader = job.make_loader()
    model = job.make_model({})
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path))

    with pytest.raises(ValueError, match="initial_epoch") as info:
        model.fit(resumeloader.keras.epoch_dataset(loader), initial_epoch=1, epochs=2,
                  verbose=0, callbacks=[callback])

    assert "Received: epoch=1," in str(info.value) and "{epoch}" not in str(info.value)


def _guide_script() -> str:
    """The complete Keras script of docs/guides/proving-it.md ("A Keras fit")."""
    [block] = _pages.runnable(PROVING_IT, section="A Keras fit")
    return block.text


def test_proving_it_keras_script_needs_at_most_15_lines_for_verify():
    """The guide's Keras script marks what verify needs beyond the training script: at
    most 15 lines, the recorder last in `callbacks`."""
    script = _guide_script()
    marked = [line for line in script.splitlines() if "# for verify" in line]

    assert 1 <= len(marked) <= 15, marked
    assert any("FitRecorder(resume)])" in line for line in marked)


@pytest.mark.slow
def test_verify_proving_it_keras_script_killed_twice_is_identical(tmp_path):
    """`resumeloader verify` on the guide's Keras script (EarlyStopping) killed twice
    reports IDENTICAL."""
    script = tmp_path / "train.py"
    script.write_text(_guide_script())
    reports = []
    harness = _harness.kill_and_restart

    def spy(command, **kwargs):
        reports.append(harness(command, **kwargs))
        return reports[-1]

    # Mid-epoch 6 (saved EarlyStopping state and metrics matter) and mid-epoch 7, the
    # epoch at whose end the uninterrupted run stops (56 steps of 7 per epoch).
    argv = ["verify", "--workdir", str(tmp_path / "verify"), "--kill-at=step:45",
            "--kill-at=step:52", "--timeout", str(_limits.PROCESS), "--", sys.executable,
            str(script)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_harness, "kill_and_restart", spy)
        status = cli.main(argv)
    (report,) = reports

    assert status == 0, str(report)
    assert report.identical, str(report)
    assert (report.reference_steps, report.resumed_steps, report.processes) == (56, 56, 3)
    assert report.weights_identical is True
    assert report.resumed_loss == report.reference_loss


def test_fit_resumes_from_checkpoint_without_callback_state(tmp_path):
    """A checkpoint of model, optimizer and loader only (as 0.1 wrote) still resumes the fit."""
    loader = job.make_loader()
    model = job.make_model({})
    model.optimizer.build(model.trainable_variables)
    loader.advance(3)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer, loader=loader)
    tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=1).save()
    batches: list[int] = []
    fresh = job.make_loader()
    count = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: batches.append(b))
    callback = resumeloader.keras.ResumeCallback(fresh, str(tmp_path))

    job.make_model({}).fit(resumeloader.keras.epoch_dataset(fresh), epochs=1, verbose=0,
                           callbacks=[callback, count])

    assert len(batches) == fresh.batches_per_epoch - 3
    assert fresh.epoch == 1


def test_fit_dataset_of_finite_loader_without_steps_raises(tmp_path):
    """fit(loader.dataset()) of a 2-epoch loader: Keras sees all its batches as one epoch."""
    loader = job.make_loader(num_epochs=2)
    model = job.make_model({})
    callback = resumeloader.keras.ResumeCallback(loader, str(tmp_path))

    with pytest.raises(ValueError, match="epoch_dataset") as info:
        model.fit(loader.dataset(), epochs=2, verbose=0, callbacks=[callback])

    assert "steps_per_epoch=14" in str(info.value)
    assert loader.position == 0
