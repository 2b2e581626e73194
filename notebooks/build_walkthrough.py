"""Builds notebooks/resume_walkthrough.ipynb from the cells below (no outputs).

The committed notebook is this script's output; edit the cells here and run
``python notebooks/build_walkthrough.py``. Cell ids are fixed so that rebuilding an
unchanged script gives a byte-identical file (tests/test_notebook.py checks it).
"""

from __future__ import annotations

import pathlib

import nbformat

NOTEBOOK = pathlib.Path(__file__).with_name("resume_walkthrough.ipynb")

CELLS: list[tuple[str, str]] = [
    (
        "md",
        """\
# Resuming a TensorFlow input pipeline at the exact record

A training job is killed (preemption, out of memory, a crash) and restarted from its
last checkpoint. What you want is simple to state: the restarted run sees exactly the
batches the uninterrupted run would have seen, from the next unconsumed one on —
nothing lost, nothing repeated, same order, same random augmentation.

This notebook measures what TensorFlow users usually get instead, explains why, and
runs the same jobs with `resumeloader`:

1. the usual workaround, interrupted and restored: which records it loses;
2. why: the producer's position versus the consumer's;
3. the same job with `resumeloader`: an identical stream;
4. Keras training interrupted mid-epoch and resumed with identical weights;
5. plots: the record streams around the restore, and the cost of restoring.

Every number below is computed when the notebook runs (the test suite executes it).""",
    ),
    (
        "code",
        """\
import os
import random
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras
import matplotlib.pyplot as plt
import numpy as np
import tensorflow as tf

import resumeloader

%matplotlib inline
CHECKPOINTS = tempfile.TemporaryDirectory(prefix="walkthrough_")  # removed at exit
WORKDIR = CHECKPOINTS.name
NUM_RECORDS, BATCH_SIZE, SEED = 64, 4, 7
CRASH_AFTER = 5      # batches trained before the last checkpoint, then the process dies
STEP_SECONDS = 0.02  # how long a training step takes; the input pipeline works meanwhile""",
    ),
    (
        "md",
        """\
## 1. The usual workaround, and what it loses

`tf.train.Checkpoint` cannot save a pipeline that contains `tf.data.Dataset.from_generator`
(`GeneratorDataset does not support checkpointing`), and a `py_function` inside `map`
saves only if you relax the checks — then its Python state is silently not saved. So
the common workaround splits the pipeline: the *order* lives in a pure-TF dataset of
record ids, whose iterator *can* be checkpointed, and your Python code runs after it,
through `from_generator` + `py_function`, followed by `batch` and `prefetch`.""",
    ),
    (
        "code",
        """\
def index_dataset():
    \"\"\"The record order: a pure-TF dataset of record ids (its iterator is checkpointable).\"\"\"
    return tf.data.Dataset.range(NUM_RECORDS).shuffle(NUM_RECORDS, seed=SEED)


def naive_pipeline(index_iterator):
    def generate():
        yield from index_iterator  # the producer takes ids from the checkpointed iterator

    def load(record_id):  # stands for your Python loading / decoding / augmentation
        return record_id

    ds = tf.data.Dataset.from_generator(generate, output_signature=tf.TensorSpec((), tf.int64))
    ds = ds.map(lambda i: tf.py_function(load, [i], tf.int64))
    return ds.batch(BATCH_SIZE).prefetch(tf.data.AUTOTUNE)""",
    ),
    (
        "md",
        """\
Checkpointing the iterator of the whole pipeline instead fails:""",
    ),
    (
        "code",
        """\
whole_pipeline = iter(naive_pipeline(iter(index_dataset())))
try:
    tf.train.Checkpoint(iterator=whole_pipeline).save(os.path.join(WORKDIR, "whole", "ckpt"))
except tf.errors.OpError as err:
    print(f"checkpointing the whole pipeline: {type(err).__name__}: "
          f"{err.message.split('}} ')[-1].split(' [Op')[0]}")
del whole_pipeline""",
    ),
    (
        "md",
        """\
So only the order is checkpointed. A job that trains for `CRASH_AFTER` batches, saves
the checkpoint and dies; then the restarted job: a fresh index iterator restored from
the checkpoint, the same pipeline on top of it, trained to the end of the epoch:""",
    ),
    (
        "code",
        """\
def naive_job():
    index_iterator = iter(index_dataset())
    checkpoint = tf.train.Checkpoint(index_iterator=index_iterator)
    before, batches = [], iter(naive_pipeline(index_iterator))
    for _ in range(CRASH_AFTER):
        before.append(next(batches).numpy().tolist())  # a training step consumes it ...
        time.sleep(STEP_SECONDS)  # ... and takes a while
    path = checkpoint.save(os.path.join(WORKDIR, "naive", "ckpt"))
    del batches  # the crash

    restored_iterator = iter(index_dataset())  # the restarted job
    tf.train.Checkpoint(index_iterator=restored_iterator).restore(path)
    after = [b.numpy().tolist() for b in naive_pipeline(restored_iterator)]
    return before, after""",
    ),
    (
        "md",
        """\
Run it, and compare with the order of an uninterrupted run:""",
    ),
    (
        "code",
        """\
naive_before, naive_after = naive_job()
uninterrupted = [int(i) for i in index_dataset()]
naive_stream = [i for batch in naive_before + naive_after for i in batch]
lost = [i for i in uninterrupted if i not in naive_stream]
print(f"uninterrupted run: {len(uninterrupted)} records; "
      f"interrupted and restored run: {len(naive_stream)} records")
print(f"naive pipeline: {len(lost)} of {NUM_RECORDS} records lost at the restore: {lost}")""",
    ),
    (
        "md",
        """\
No error, no warning: the restored run simply never trains on those records.

## 2. Why: the producer's position is not the consumer's

The checkpoint saved the position of the index iterator, which is the position of the
*producer*. But `from_generator`, `map`, `batch` and `prefetch` read ahead of the
training step, so when the checkpoint is written the producer is ahead of the
*consumer*; everything in flight is lost:

```
 index iterator ──▶ from_generator ──▶ py_function ──▶ batch ──▶ prefetch ──▶ training step
 (position SAVED)   └───────────── read ahead: in flight, not saved ──────────┘  (position TRUE)
```

The numbers of the run above:""",
    ),
    (
        "code",
        """\
consumed = CRASH_AFTER * BATCH_SIZE  # the consumer's position: the truth
saved = NUM_RECORDS - sum(map(len, naive_after))  # the producer's, as the checkpoint holds it
rows = [
    ("consumer: records the training steps consumed", consumed),
    ("producer: ids the saved index iterator had handed out", saved),
    ("in flight when the checkpoint was written = lost", saved - consumed),
]
for name, value in rows:
    print(f"{name:<55}{value:>5}")""",
    ),
    (
        "md",
        """\
How much is read ahead depends on thread timing, so the loss varies from run to run.
`tf.config.experimental.enable_op_determinism()` hides it by running this pipeline
with no read-ahead at all (and it cannot be turned off again), which is why this
notebook enables it only in part 4, where you can see that.

## 3. The same job with resumeloader

`resumeloader.ResumableLoader` takes your random-access records (an array, or anything
with `len()` and `[i]`) and your Python `map_fn(record, rng)`, and builds the same
`from_generator` → `prefetch` pipeline. Its state is a single position that the
**consumer** advances — `loader.advance()` after the step that consumed a batch — and
the order is derived from it, so whatever was read ahead is recomputed after a restore.
The `rng` handed to `map_fn` is keyed by (seed, epoch, record), so the random
augmentation is reproduced too.""",
    ),
    (
        "code",
        """\
def load(record_id, rng):  # your Python code; rng is keyed by (seed, epoch, record id)
    return {"id": record_id, "noise": np.float32(rng.normal())}  # a random augmentation


def make_loader():
    return resumeloader.ResumableLoader(
        np.arange(NUM_RECORDS), batch_size=BATCH_SIZE, seed=SEED, num_epochs=1, map_fn=load
    )""",
    ),
    (
        "md",
        """\
The same crash after `CRASH_AFTER` batches, with a `tf.train.CheckpointManager`:""",
    ),
    (
        "code",
        """\
loader = make_loader()
manager = tf.train.CheckpointManager(
    tf.train.Checkpoint(loader=loader), os.path.join(WORKDIR, "resumeloader"), max_to_keep=2
)
loader_before = []
batches = iter(loader.dataset())
for _ in range(CRASH_AFTER):
    loader_before.append(next(batches))
    time.sleep(STEP_SECONDS)
    loader.advance()  # after the step that consumed the batch
manager.save()
del batches, loader  # the crash""",
    ),
    (
        "md",
        """\
Restart: a *fresh* loader, restored from the latest checkpoint. What was checkpointed is
a few integers and the fingerprint of the order; `describe()` shows where each stage
of the pipeline comes from:""",
    ),
    (
        "code",
        """\
fresh = make_loader()
tf.train.Checkpoint(loader=fresh).restore(manager.latest_checkpoint)
print(fresh.get_state())
print(fresh.describe())""",
    ),
    (
        "code",
        """\
loader_after = list(fresh)  # iterating the loader advances it batch by batch
reference = list(make_loader())  # an uninterrupted run


def ids(batches):
    return [int(i) for b in batches for i in b["id"]]


def noise(batches):
    return np.concatenate([b["noise"].numpy() for b in batches])


loader_stream = ids(loader_before + loader_after)
lost_rl = [i for i in ids(reference) if i not in loader_stream]
repeated_rl = len(loader_stream) - len(set(loader_stream))
identical = loader_stream == ids(reference) and np.array_equal(
    noise(loader_before + loader_after), noise(reference)
)
print(f"resumeloader: {len(ids(loader_before))} records before the crash + "
      f"{len(ids(loader_after))} after = {len(loader_stream)}; "
      f"lost {len(lost_rl)}, repeated {repeated_rl}")
print(f"resumeloader: identical to the uninterrupted run (ids and augmentation): {identical}")""",
    ),
    (
        "md",
        """\
## 4. Keras: interrupted mid-epoch, resumed with identical weights

For bit-identical weights, the whole computation must be deterministic: enable op
determinism (once; it cannot be turned off) and seed Keras before building each model.""",
    ),
    (
        "code",
        """\
tf.config.experimental.enable_op_determinism()

KERAS_RECORDS, KERAS_BATCH, KERAS_EPOCHS = 256, 16, 2  # 16 batches per epoch
features = np.random.default_rng(0).normal(size=(KERAS_RECORDS, 8)).astype(np.float32)
labels = (features.sum(axis=1) > 0).astype(np.int32)


def augment(record, rng):  # random noise on the features, keyed per record
    x, y = record
    return x + rng.normal(0.0, 0.1, size=x.shape).astype(np.float32), y


def make_model():
    keras.utils.set_random_seed(SEED)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), jit_compile=False,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model""",
    ),
    (
        "md",
        """\
Op determinism also hides the loss of part 1 — by taking away the read-ahead: with it
on, tf.data runs the same naive job without reading a record before it is consumed:""",
    ),
    (
        "code",
        """\
before, after = naive_job()
stream = [i for batch in before + after for i in batch]
lost_deterministic = [i for i in uninterrupted if i not in stream]
print(f"naive pipeline with op determinism: {len(lost_deterministic)} of {NUM_RECORDS} "
      "records lost")""",
    ),
    (
        "md",
        """\
`model.fit` with `resumeloader.keras.ResumeCallback`: it restores the latest checkpoint
(model, optimizer and loader together) when `fit` starts, advances the loader as Keras
consumes batches and saves every `save_every` batches. `epoch_dataset(loader)` feeds
`fit` the rest of the loader's current epoch, so Keras epochs stay loader epochs. To
simulate a preemption, a second callback raises after a given number of batches:""",
    ),
    (
        "code",
        """\
from resumeloader.keras import ResumeCallback, epoch_dataset


class Preempted(Exception):
    pass


class Preempt(keras.callbacks.Callback):
    def __init__(self, loader, after):
        super().__init__()
        self.loader, self.after, self.batches = loader, after, 0

    def on_train_batch_end(self, batch, logs=None):
        self.batches += 1
        if self.batches == self.after:
            raise Preempted(f"preempted after {self.after} batches "
                            f"(epoch {self.loader.epoch}, step {self.loader.step})")


def fit_job(ckpt_dir, preempt_after=None):
    model = make_model()
    loader = resumeloader.ResumableLoader((features, labels), batch_size=KERAS_BATCH,
                                          seed=SEED, map_fn=augment)
    report = keras.callbacks.LambdaCallback(on_train_begin=lambda logs: print(
        f"fit starts at epoch {loader.epoch}, step {loader.step}"))
    callbacks = [ResumeCallback(loader, ckpt_dir, save_every=4), report]
    if preempt_after is not None:
        callbacks.append(Preempt(loader, preempt_after))
    model.fit(epoch_dataset(loader), epochs=KERAS_EPOCHS, verbose=0, callbacks=callbacks)
    return model""",
    ),
    (
        "code",
        """\
keras_dir = os.path.join(WORKDIR, "keras")
try:
    fit_job(keras_dir, preempt_after=23)  # mid-epoch 1; the last checkpoint is at batch 20
except Preempted as err:
    print(err)
resumed_model = fit_job(keras_dir)  # a fresh process would run exactly this
reference_model = fit_job(os.path.join(WORKDIR, "keras_reference"))  # never interrupted

pairs = list(zip(resumed_model.get_weights(), reference_model.get_weights(), strict=True))
diffs = [np.abs(a - b).max() for a, b in pairs]
same_weights = all(np.array_equal(a, b) for a, b in pairs)
print(f"Keras: max |weight difference| resumed vs uninterrupted = {max(diffs)}")
print(f"Keras: weights identical to the uninterrupted run: {same_weights}")""",
    ),
    (
        "md",
        """\
## 5. Plots

**The record stream around the restore point.** Each dot is a record id against the
training step that consumed it. On the left, the usual workaround: after the restore
(dashed line) it runs ahead of the uninterrupted order, and the records that were in
flight (crosses) are never seen. On the right, resumeloader: the restored run is the
uninterrupted run.""",
    ),
    (
        "code",
        """\
def steps_and_ids(batches):
    pairs = [(s, i) for s, batch in enumerate(batches) for i in batch]
    return np.array(pairs).T


def batched(stream):
    return [stream[k:k + BATCH_SIZE] for k in range(0, len(stream), BATCH_SIZE)]


loader_batches = [[int(i) for i in b["id"]] for b in loader_before + loader_after]
panels = [
    ("tf.data index iterator + from_generator", uninterrupted, naive_before + naive_after),
    ("resumeloader", ids(reference), loader_batches),
]
fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
for ax, (title, clean, restored) in zip(axes, panels, strict=True):
    ax.plot(*steps_and_ids(batched(clean)), "o", ms=9, mfc="none", color="gray")
    ax.plot(*steps_and_ids(restored), ".", color="C3")
    gone = [(s, i) for s, batch in enumerate(batched(clean)) for i in batch if i in lost]
    if title.startswith("tf.data") and gone:
        ax.plot(*np.array(gone).T, "x", ms=9, color="k")
    ax.axvline(CRASH_AFTER - 0.5, ls="--", color="k", lw=1)
    ax.set(title=title, xlabel="training step (batch)", xlim=(-0.5, 2 * CRASH_AFTER + 0.5))
axes[0].set_ylabel("record id")
fig.legend(["uninterrupted", "interrupted + restored", "lost"], loc="lower center", ncol=3)
fig.subplots_adjust(bottom=0.22)
plt.show()""",
    ),
    (
        "md",
        """\
**What a restore costs.** To resume at position *k* you can replay the order:
`tf.data.Dataset.skip(k)` over the shuffled, repeated index dataset, or — for a
Python `random.Random(seed).shuffle` per epoch — re-run the shuffle for every epoch
up to the current one. Both cost O(k). resumeloader computes the records at any
position directly: `set_state` + the first batch costs the same at every position (most
of it is starting the `from_generator` pipeline, so replaying wins for small *k*).""",
    ),
    (
        "code",
        """\
N, B = 20_000, 32  # records per epoch, batch size
positions = [0, 40_000, 100_000, 200_000, 400_000]
bench = resumeloader.ResumableLoader(np.arange(N), batch_size=B, seed=SEED)


def resumeloader_restore(k):
    bench.set_state(dict(bench.get_state(), epoch=k // N, offset=k % N))
    return next(iter(bench.dataset()))


def replay_shuffle(k):
    order, rng = list(range(N)), random.Random(SEED)
    for _ in range(k // N + 1):
        rng.shuffle(order)
    return order[k % N : k % N + B]


def tf_skip(k):
    ds = tf.data.Dataset.range(N).shuffle(N, seed=SEED).repeat().skip(k).batch(B)
    return next(iter(ds))


def best_ms(fn, k, repeats=2):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(k)
        times.append(1000 * (time.perf_counter() - start))
    return min(times)


methods = {"resumeloader": resumeloader_restore,
           "replay random.shuffle": replay_shuffle,
           "tf.data skip(k)": tf_skip}
for fn in methods.values():
    fn(0)  # warm up: the first call of each pays one-time costs
latency = {name: [best_ms(fn, k) for k in positions] for name, fn in methods.items()}
print(f"restore latency in ms ({N:,} records per epoch, batch {B}; best of 2)")
print(f"{'position':>10}" + "".join(f"{name:>24}" for name in latency))
for j, k in enumerate(positions):
    print(f"{k:>10,}" + "".join(f"{latency[name][j]:>24.1f}" for name in latency))""",
    ),
    (
        "code",
        """\
fig, ax = plt.subplots(figsize=(7, 3.8))
for name, values in latency.items():
    ax.plot(positions, values, "o-", label=name)
ax.set(xlabel=f"restore position (records; {N:,} per epoch)", ylabel="restore latency (ms)",
       ylim=(0, None), title="Restore latency against position")
ax.legend(fontsize=8)
plt.show()""",
    ),
    (
        "md",
        """\
## Summary

* The usual split pipeline checkpoints the producer's position; what `from_generator`,
  `map`, `batch` and `prefetch` read ahead is lost on every restore, silently.
* `resumeloader` checkpoints the consumer's position (a few integers) and derives the
  order and the augmentation from it: the restored stream is the uninterrupted stream,
  and Keras training resumed mid-epoch ends with bit-identical weights.
* A restore costs the same at any position, instead of growing with it.""",
    ),
]


def build() -> nbformat.NotebookNode:
    """The notebook, without outputs, with stable cell ids."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for number, (kind, source) in enumerate(CELLS):
        make = nbformat.v4.new_markdown_cell if kind == "md" else nbformat.v4.new_code_cell
        cell = make(source)
        cell.id = f"cell-{number:02d}"
        notebook.cells.append(cell)
    nbformat.validate(notebook)
    return notebook


def main() -> None:
    nbformat.write(build(), NOTEBOOK)
    print(f"wrote {NOTEBOOK}")


if __name__ == "__main__":
    main()
