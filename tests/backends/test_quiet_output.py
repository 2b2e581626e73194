"""A correct Keras fit prints nothing of resumeloader's or about it: no warning that
``shuffle=True`` is ignored, no tf.data error (op determinism's NodeDef error on a
parallel map included), nothing at exit (a real run, with TensorFlow's default log
level)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import keras
import pytest

ROOT = Path(__file__).resolve().parents[2]
# What TensorFlow and JAX print while they load, whatever the program does
# (docs/guides/keras.md, "What a run prints").
STARTUP = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|^[IWE]\d{4} [\d:.]+ +\d+ (port|cudart_stub|cpu_feature_guard|cuda_platform|"
    r"cuda_executor|cuda_diagnostics)\.cc:\d+\]"
    r"|^To enable the following instructions: "
    r"|^I\d{4} [\d:.]+ +\d+ generator_dataset_op\.cc:\d+\] Memory patch applied"
)

SCRIPT = textwrap.dedent("""
    import keras, numpy as np
    import resumeloader, resumeloader.keras

    if keras.backend.backend() == "tensorflow":  # op determinism: sequential tf.data maps
        import tensorflow as tf
        tf.config.experimental.enable_op_determinism()
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(96, 4)).astype("float32")
    data = {"x": x, "y": x.sum(axis=1, keepdims=True)}
    validation = (data["x"][:16], data["y"][:16])
    if keras.backend.backend() == "tensorflow":
        # Keras' own adapter of validation arrays maps in parallel, which op determinism
        # makes TensorFlow log an error for (docs/guides/keras.md, What a run prints).
        validation = tf.data.Dataset.from_tensor_slices(validation).batch(8)

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 4:
                raise KeyboardInterrupt

    def fit(directory, *extra, steps=False, epochs=2, arrays=False):
        if arrays:  # gathered in the tf.data graph, no Python per record
            loader = resumeloader.ResumableLoader((data["x"], data["y"]), batch_size=8, seed=0)
        else:
            loader = resumeloader.ResumableLoader(
                data, batch_size=8, seed=0, map_fn=lambda r, rng: (r["x"], r["y"]))
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse", metrics=["mae"])
        resume = resumeloader.keras.ResumeCallback(loader, directory, save_every=2)
        if steps:
            x, kwargs = loader.dataset(), {"steps_per_epoch": loader.batches_per_epoch}
        else:
            x, kwargs = resumeloader.keras.epoch_dataset(loader), {}
        model.fit(x, epochs=epochs, verbose=0, callbacks=[resume, *extra],
                  validation_data=validation, **kwargs)

    try:
        fit("run", Crash())
    except KeyboardInterrupt:
        pass
    fit("run")                      # resumed mid-epoch
    fit("steps", steps=True)        # loader.dataset() with steps_per_epoch
    fit("arrays", arrays=True)      # arrays without map_fn
    print("done")
""")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_fit_resumed_and_with_steps_prints_nothing_but_framework_startup(tmp_path):
    """stdout is the script's own line; stderr holds only what TensorFlow/JAX print as
    they load (never a warning, a tf.data error or an error at exit)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["KERAS_BACKEND"] = keras.backend.backend()
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=540, check=False)

    assert result.returncode == 0, result.stderr[-4000:]
    assert result.stdout == "done\n"
    noise = [line for line in result.stderr.splitlines() if not STARTUP.search(line)]
    assert noise == []
