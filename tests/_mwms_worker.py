"""One worker of the 2-process MultiWorkerMirroredStrategy test (run as a script).

``_mwms_worker.py INDEX PORTS WORKDIR KILL_AT``: joins a loopback cluster, trains a
one-variable model on ``loader.dataset(input_context=ctx)`` with a custom loop that
advances the loader once per global step, checkpoints every `SAVE_EVERY` steps into
its own directory, logs the records of each step, and SIGKILLs itself after step
KILL_AT (-1: never). The step advances the loader in the graph, after the batch
exists (the generator reads the position when it starts). Each run restores the
latest checkpoint first.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

NUM_RECORDS = 100
GLOBAL_BATCH = 8
NUM_EPOCHS = 2
SEED = 21
SAVE_EVERY = 4


def make_loader():
    import numpy as np

    import resumeloader

    return resumeloader.ResumableLoader(
        np.arange(NUM_RECORDS, dtype=np.int64),
        batch_size=GLOBAL_BATCH,
        seed=SEED,
        num_epochs=NUM_EPOCHS,
        drop_remainder=True,
        with_metadata=True,
    )


def main(index: int, ports: list[int], workdir: str, kill_at: int) -> None:
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
            "task": {"type": "worker", "index": index},
        }
    )
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        loader = make_loader()
        weight = tf.Variable(0.0, dtype=tf.float64)
    checkpoint = tf.train.Checkpoint(loader=loader, weight=weight)
    manager = tf.train.CheckpointManager(
        checkpoint, os.path.join(workdir, f"ckpt-{index}"), max_to_keep=2
    )
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_consumed()
    dataset = strategy.distribute_datasets_from_function(
        lambda ctx: loader.dataset(input_context=ctx)
    )
    iterator = iter(dataset)

    @tf.function
    def train_step():
        data, meta = next(iterator)
        local = strategy.run(lambda x: tf.reduce_sum(tf.cast(x, tf.float64)), args=(data,))
        # Integer-valued float64 sums are exact: any lost or repeated record shows.
        weight.assign_sub(strategy.reduce(tf.distribute.ReduceOp.SUM, local, axis=None))
        # After the batch exists: the generator reads the position when it starts.
        loader.advance(after=strategy.experimental_local_results(meta["index"]))
        return meta["index"]

    per_epoch = loader.batches_per_epoch
    with open(os.path.join(workdir, f"log-{index}.jsonl"), "a") as log:
        while not loader.exhausted:
            step = loader.epoch * per_epoch + loader.step
            indices = strategy.experimental_local_results(train_step())
            records = sorted(int(i) for part in indices for i in part.numpy())
            log.write(json.dumps({"pid": os.getpid(), "step": step, "records": records}) + "\n")
            log.flush()
            if (step + 1) % SAVE_EVERY == 0:
                manager.save()
            if step == kill_at:
                # Both workers finish step KILL_AT first: a collective must not lose a peer.
                wait_for_peer(workdir, index, f"killed-at-{step}")
                os.kill(os.getpid(), signal.SIGKILL)
    result = {"weight": float(weight.numpy()), "state": loader.get_state()}
    with open(os.path.join(workdir, f"result-{index}.json"), "w") as f:
        json.dump(result, f)
    wait_for_peer(workdir, index, "done")


def wait_for_peer(workdir: str, index: int, name: str) -> None:
    """A file barrier between the 2 workers (outside TensorFlow, whose peers may be gone)."""
    with open(os.path.join(workdir, f"{name}-{index}"), "w"):
        pass
    while not os.path.exists(os.path.join(workdir, f"{name}-{1 - index}")):
        time.sleep(0.01)


if __name__ == "__main__":
    main(int(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
