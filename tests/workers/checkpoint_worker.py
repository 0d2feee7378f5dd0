"""A training process for the kill-and-resume test:
`python -m tests.workers.checkpoint_worker SPLITS CKPT OUT SLOW MODEL [PLACEMENT [METRIC]]`.

SPLITS is the JSON of a SplitPaths, CKPT a checkpoint directory ("" for none), OUT where to save
the final parameters and history, SLOW "1" to pause after each step so the test can kill it
mid-epoch, MODEL the JSON of the ModelSpec to train, PLACEMENT the config's data placement (streamed
rows shuffle in windows of 50, so that a resume lands inside a window), METRIC the validation metric
that chooses the epoch kept (the config's `selection_metric`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict

import torch

from tasks.core.data.splits import SplitPaths
from tasks.core.models.plugins import ModelSpec
from tasks.core.training import torch_training
from tasks.core.training.checkpoint import TrainingCheckpoint
from tasks.core.training.config import TrainConfig


def slow_down() -> None:
    real_step = torch_training.LoopState.optimizer_step

    def step(*args, **kwargs):
        result = real_step(*args, **kwargs)
        time.sleep(0.03)
        return result

    torch_training.LoopState.optimizer_step = step


def train_and_save(
    splits: SplitPaths, checkpoint_dir: str, out: str, model: ModelSpec, placement: str = "auto",
    metric: str = "val_loss",
) -> None:  # fmt: skip
    config = TrainConfig(epochs=3, batch_size=16, seed=7, model=model, data_placement=placement,
                         selection_metric=metric)  # fmt: skip
    if placement == "stream":
        config.shuffle_buffer_rows = 50
    checkpoint = TrainingCheckpoint(checkpoint_dir, every_steps=2) if checkpoint_dir else None
    if checkpoint is not None and (state := checkpoint.load()) is not None:
        print(f"RESUMING epoch={state['epoch']} step={state['step']}", flush=True)
    outcome = torch_training.train(config, splits, checkpoint=checkpoint)
    torch.save(
        {"parameters": dict(outcome.model.state_dict()), "history": [asdict(e) for e in outcome.run.history],
         "optimizer_steps": outcome.optimizer_steps, "kept_epoch": outcome.run.kept_epoch},
        out,
    )  # fmt: skip


def main(
    splits_json: str, checkpoint_dir: str, out: str, slow: str, model_json: str, placement: str, metric: str
) -> None:
    if slow == "1":
        slow_down()
    splits, model = SplitPaths(**json.loads(splits_json)), ModelSpec(**json.loads(model_json))
    train_and_save(splits, checkpoint_dir, out, model, placement, metric)


if __name__ == "__main__":
    main(*sys.argv[1:6], *(sys.argv[6:7] or ["auto"]), *(sys.argv[7:8] or ["val_loss"]))
