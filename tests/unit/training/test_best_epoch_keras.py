"""The Keras loop keeps the best epoch too: early stopping, the best weights in the model and its
artifact, and the same best weights after a resume from its checkpoint."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tasks.core.data.splits import read_split
from tasks.core.models.keras_models import load_keras_artifact
from tasks.core.training import tf_training
from tasks.core.training.config import TrainConfig
from tasks.core.training.tf_strategy import Environment
from tasks.core.training.tf_training import KerasRunOptions, train_keras

pytestmark = pytest.mark.slow

# Epoch 2's loss is the lowest; epochs 3 and 4 are no better, so patience 2 stops the run after epoch 4.
LOSSES = [0.9, 0.5, 0.6, 0.7, 0.4, 0.3]
CONFIG = TrainConfig(epochs=6, batch_size=32, seed=3, patience=2)


@pytest.fixture
def scripted_val_loss(monkeypatch):
    """Epoch e's validation loss (from 0) reads LOSSES[e] for every callback after the tracker's."""
    real = tf_training.Checkpointing.on_epoch_end

    def on_epoch_end(tracker, epoch, logs=None):
        logs["val_loss"] = LOSSES[epoch]
        real(tracker, epoch, logs)

    monkeypatch.setattr(tf_training.Checkpointing, "on_epoch_end", on_epoch_end)


class WeightsByEpoch(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.weights: dict[int, list[np.ndarray]] = {}

    def on_epoch_end(self, epoch, logs=None):
        self.weights[epoch + 1] = self.model.get_weights()


class Interrupted(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == 3:
            raise RuntimeError("node preempted")


def assert_same(first: list[np.ndarray], second: list[np.ndarray]) -> None:
    assert len(first) == len(second) > 0
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.usefixtures("scripted_val_loss")
def test_keras_stops_early_and_hands_back_the_best_epochs_weights(blob_splits, tmp_path):
    recorded, artifact = WeightsByEpoch(), str(tmp_path / "model.npz")
    outcome = train_keras(CONFIG, blob_splits, artifact, env=Environment(),
                          options=KerasRunOptions(callbacks=[recorded]))  # fmt: skip
    assert [epoch.epoch for epoch in outcome.run.history] == [1, 2, 3, 4]
    assert outcome.run.kept_epoch == 2
    assert outcome.run.kept_reason.endswith(
        "early stopping after epoch 4 of 6: no better val_loss for 2 epochs"
    )
    val_rows = len(read_split(blob_splits.val, blob_splits.feature_names, blob_splits.label_column)[1])
    assert {epoch.val_rows for epoch in outcome.run.history} == {val_rows}  # what the choice trusts
    assert f"at epoch 2 of 4, over {val_rows:,} validation rows;" in outcome.run.kept_reason
    assert_same(outcome.model.get_weights(), recorded.weights[2])
    assert_same(load_keras_artifact(artifact)[0].get_weights(), recorded.weights[2])


@pytest.mark.usefixtures("scripted_val_loss")
def test_keras_resumed_after_the_best_epoch_keeps_the_same_best_weights(blob_splits, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    with pytest.raises(RuntimeError, match="node preempted"):
        interrupted = KerasRunOptions(checkpoint_dir=checkpoint, callbacks=[Interrupted()])
        train_keras(CONFIG, blob_splits, env=Environment(), options=interrupted)
    resumed = train_keras(
        CONFIG, blob_splits, env=Environment(), options=KerasRunOptions(checkpoint_dir=checkpoint)
    )
    uninterrupted = train_keras(CONFIG, blob_splits, env=Environment())
    assert resumed.run.kept_epoch == uninterrupted.run.kept_epoch == 2
    assert len(resumed.run.history) == len(uninterrupted.run.history) == 4
    assert_same(resumed.model.get_weights(), uninterrupted.model.get_weights())
