"""A Keras training process for the preemption test: `python -m tests.workers.keras_preemption_worker SPLITS CKPT OUT`.

SPLITS is the JSON of a SplitPaths, CKPT the checkpoint directory, OUT where to write the batches
trained per epoch and the history. It pauses after each batch so the test can signal it
mid-epoch. Exits with PREEMPTED_EXIT_CODE when training stops on SIGTERM.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import keras

from tasks.core.data.splits import SplitPaths
from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.preemption import PREEMPTED_EXIT_CODE, Preempted, PreemptionNotice
from tasks.core.training.tf_strategy import Environment
from tasks.core.training.tf_training import KerasRunOptions, train_keras

CONFIG = TrainConfig(epochs=3, batch_size=8, seed=3, model=mlp_spec([16]), checkpoint_every_steps=0)
GRACE_S = 20.0


class BatchLog(keras.callbacks.Callback):
    """[epoch, batches trained] per epoch in the order trained; optionally pauses after each batch."""

    def __init__(self, pause_s: float):
        super().__init__()
        self.pause_s = pause_s
        self.trained: list[list[int]] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.trained.append([epoch, 0])

    def on_train_batch_begin(self, batch, logs=None):  # counted here: a stop at its end follows its step
        self.trained[-1][1] += 1

    def on_train_batch_end(self, batch, logs=None):
        time.sleep(self.pause_s)


def train_and_record(splits: SplitPaths, checkpoint_dir: str, out: str, pause_s: float) -> None:
    batch_log = BatchLog(pause_s)
    try:
        with PreemptionNotice(grace_s=GRACE_S) as notice:
            options = KerasRunOptions(checkpoint_dir=checkpoint_dir, callbacks=[batch_log], preemption=notice)
            outcome = train_keras(CONFIG, splits, env=Environment(), options=options)
    except Preempted:
        Path(out).write_text(json.dumps({"trained": batch_log.trained}))
        sys.exit(PREEMPTED_EXIT_CODE)
    Path(out).write_text(
        json.dumps({"trained": batch_log.trained, "history": [asdict(e) for e in outcome.run.history]})
    )


def main(splits_json: str, checkpoint_dir: str, out: str) -> None:
    train_and_record(SplitPaths(**json.loads(splits_json)), checkpoint_dir, out, pause_s=0.05)


if __name__ == "__main__":
    main(*sys.argv[1:4])
