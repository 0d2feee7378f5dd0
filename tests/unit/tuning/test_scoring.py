"""A trial's metric: scikit-learn's on the validation split, of a torch or a Keras model's artifact."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.core.data.splits import read_split
from tasks.core.training.config import TrainConfig
from tasks.core.tuning.scoring import metric_of, trial_metric

# Rows of classes 0, 0, 1, 2 predicted 0, 1, 1, 1: class 2 is never predicted, class 3 never appears.
LOGITS = np.array([[2.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 2.0, 0, 0], [0, 2.0, 0, 0]], dtype=np.float32)
TRUTH = np.array([0, 0, 1, 2])


def test_macro_f1_averages_the_classes_in_the_truth_or_the_predictions():
    # F1 of class 0: 2 x 1 / (2 + 1); class 1: 2 x 1 / (1 + 3); class 2: 0. Class 3 is in neither.
    assert metric_of("val_macro_f1", LOGITS, TRUTH, 1.0) == pytest.approx((2 / 3 + 1 / 2 + 0) / 3)
    # A class predicted but absent from the truth counts too, at F1 0.
    assert metric_of("val_macro_f1", LOGITS[:2], TRUTH[:2], 1.0) == pytest.approx((2 / 3 + 0) / 2)


def test_accuracy_and_the_rmse_in_the_labels_units():
    assert metric_of("val_accuracy", LOGITS, TRUTH, 1.0) == pytest.approx(0.5)
    outputs, truth = np.array([[0.0], [1.0]], dtype=np.float32), np.array([0.0, 3.0])
    assert metric_of("val_rmse", outputs, truth, 2.0) == pytest.approx(np.sqrt(2.0) * 2.0)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_a_trials_model_is_scored_from_its_artifact_whichever_framework_trained_it(
    framework, blob_splits, tmp_path
):
    config = TrainConfig(epochs=1, batch_size=32, learning_rate=3e-2, seed=1)
    artifact = str(tmp_path / "model")
    features, truth = read_split(blob_splits.val, blob_splits.feature_names, blob_splits.label_column)
    if framework == "tensorflow":
        from tasks.core.training.tf_strategy import Environment
        from tasks.core.training.tf_training import train_keras

        outcome = train_keras(config, blob_splits, artifact, env=Environment())
        predicted = np.asarray(outcome.model(features)).argmax(axis=1)
    else:
        import torch

        from tasks.core.training.torch_training import train

        outcome = train(config, blob_splits, artifact)
        with torch.no_grad():
            predicted = outcome.model(torch.from_numpy(features)).numpy().argmax(axis=1)
    assert outcome.run.framework == framework
    accuracy = trial_metric("val_accuracy", lambda: artifact, blob_splits, outcome.run, 1.0)
    assert accuracy == pytest.approx(float(np.mean(predicted == truth)))
    assert 0.0 < trial_metric("val_macro_f1", lambda: artifact, blob_splits, outcome.run, 1.0) <= 1.0


def test_val_loss_is_the_kept_epochs_and_fetches_no_model_file():
    from tasks.core.training.records import EpochMetrics, TrainingRun

    history = [EpochMetrics(epoch, 1.0 / epoch, 0.5, 0.9 / epoch, 0.5, 10) for epoch in (1, 2, 3)]
    run = TrainingRun("pytorch", "cpu", "cpu", 1, "none", "float32", "single-process", history, 1.0, 1.0,
                      TrainConfig(), kept_epoch=2)  # fmt: skip

    def not_fetched() -> str:
        raise AssertionError("the model file was fetched for a metric the run already holds")

    assert trial_metric("val_loss", not_fetched, None, run, 1.0) == pytest.approx(0.45)
