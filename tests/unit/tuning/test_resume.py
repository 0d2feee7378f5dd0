"""A promoted trial resumed from its checkpoint equals the same trial trained without the break: a
rung stops the run (`train_until_epoch`) with the learning rate scheduled over the whole budget."""

from __future__ import annotations

import pytest
import torch

from tasks.core.models.plugins import ModelSpec
from tasks.core.training.checkpoint import TrainingCheckpoint
from tasks.core.training.config import TrainConfig
from tasks.core.training.torch_training import train

pytestmark = pytest.mark.slow
# Dropout, so that the resumed run must restore the random state too; cosine over all 3 epochs.
CONFIG = TrainConfig(
    epochs=3, batch_size=16, seed=7, model=ModelSpec("mlp", options={"hidden_sizes": "32", "dropout": 0.2})
)


def test_a_promoted_trial_resumed_from_its_checkpoint_equals_it_trained_without_the_break(
    blob_splits, tmp_path
):
    whole = train(CONFIG, blob_splits)
    checkpoint = str(tmp_path / "trial")
    rung = train(
        TrainConfig(**{**vars(CONFIG), "train_until_epoch": 1}),
        blob_splits,
        checkpoint=TrainingCheckpoint(checkpoint),
    )
    assert len(rung.run.history) == 1
    resumed = train(
        TrainConfig(**{**vars(CONFIG), "train_until_epoch": 3}),
        blob_splits,
        checkpoint=TrainingCheckpoint(checkpoint),
    )
    assert resumed.run.history == whole.run.history
    assert resumed.optimizer_steps == whole.optimizer_steps
    for name, tensor in whole.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], tensor), name
