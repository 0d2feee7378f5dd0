"""The epoch a run hands back: the best by a validation metric (or the last), early stopping after
`patience` epochs without a better one, and both kept through a checkpoint and a resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tasks.core.evaluation.metrics import classification_metrics
from tasks.core.models.plugins import mlp_spec
from tasks.core.models.torch_models import load_torch_artifact
from tasks.core.training.checkpoint import TrainingCheckpoint
from tasks.core.training.config import TrainConfig, parse_hyperparameters
from tasks.core.training.progress import EpochChoice
from tasks.core.training.records import EpochMetrics, Hardware, TrainingRun
from tasks.core.training.torch_training import train
from tasks.types import EvaluationReport
from tests.workers.best_epoch_workers import scripted_val_loss, train_interrupted_and_resumed


def history(val_losses: list[float], val_accuracies: list[float] | None = None) -> list[EpochMetrics]:
    accuracies = val_accuracies or [0.5] * len(val_losses)
    return [
        EpochMetrics(epoch, 1.0, 0.5, loss, accuracy)
        for epoch, (loss, accuracy) in enumerate(zip(val_losses, accuracies, strict=True), start=1)
    ]


def test_the_best_epoch_is_the_earliest_of_the_lowest_loss_or_the_highest_accuracy():
    runs = history([0.9, 0.5, 0.7, 0.5, math.nan], [0.6, 0.8, 0.9, 0.9, 0.95])
    assert EpochChoice(metric="val_loss").best_epoch(runs) == 2  # epoch 4 only ties it
    assert EpochChoice(metric="val_accuracy").best_epoch(runs) == 5
    assert EpochChoice(metric="val_loss").best_epoch(history([math.nan, math.inf])) == 0


def test_the_run_stops_after_patience_epochs_without_a_better_metric():
    choice = EpochChoice(patience=2, epochs=10)
    assert not choice.stops_early(history([0.9, 0.5, 0.6]))
    assert choice.stops_early(history([0.9, 0.5, 0.6, 0.5]))  # equal is no better
    assert not EpochChoice(patience=0, epochs=10).stops_early(history([0.5, 0.6, 0.7, 0.8]))
    assert not EpochChoice(patience=2, epochs=4).stops_early(history([0.9, 0.5, 0.6, 0.7]))  # the last epoch
    assert choice.stops_early(history([math.nan, math.nan]))  # no epoch with a finite loss counts as better


def test_the_kept_epoch_and_its_reason():
    runs = history([0.9, 0.1161, 0.3, 0.4])
    assert EpochChoice(epochs=4).kept(runs) == (2, "best val_loss 0.1161 at epoch 2 of 4")
    assert EpochChoice(keep="last", epochs=4).kept(runs) == (4, "the last epoch (keep: last)")
    assert EpochChoice(patience=2, epochs=30).kept(runs) == (
        2,
        "best val_loss 0.1161 at epoch 2 of 4; early stopping after epoch 4 of 30: "
        "no better val_loss for 2 epochs",
    )
    assert EpochChoice(epochs=2).kept(history([math.nan, math.nan])) == (
        2,
        "the last epoch: no epoch had a finite val_loss",
    )


def test_the_copy_is_taken_at_each_new_best_and_restored_only_when_a_later_epoch_ends_the_run():
    best = EpochChoice()
    assert best.keeps_copy(history([0.9, 0.5])) and not best.keeps_copy(history([0.5, 0.9]))
    assert best.restores_copy(history([0.5, 0.9])) and not best.restores_copy(history([0.9, 0.5]))
    last = EpochChoice(keep="last")
    assert not last.keeps_copy(history([0.9, 0.5])) and not last.restores_copy(history([0.5, 0.9]))


@pytest.mark.parametrize(
    "fields, name, rule",
    [
        ({"keep": "worst"}, "keep", "not one of best, last"),
        ({"selection_metric": "f1"}, "selection_metric", "not one of val_loss, val_accuracy"),
        ({"patience": -1}, "patience", "must be at least 0"),
    ],
)
def test_the_choice_is_validated_like_the_other_hyperparameters(fields, name, rule):
    assert TrainConfig(**fields).problems() == {name: rule}
    with pytest.raises(ValueError, match=f"hyperparameters.{name}"):
        parse_hyperparameters(fields)


def test_the_choice_parses_from_the_hyperparameters_json():
    config = parse_hyperparameters({"keep": "last", "selection_metric": "val_accuracy", "patience": 3})
    assert (config.keep, config.selection_metric, config.patience) == ("last", "val_accuracy", 3)
    assert (TrainConfig().keep, TrainConfig().selection_metric, TrainConfig().patience) == (
        "best",
        "val_loss",
        0,
    )


# Epoch 3's loss is the lowest; epochs 4-6 are no better, so patience 3 stops the run after epoch 6.
LOSSES = [0.9, 0.8, 0.5, 0.6, 0.7, 0.55, 0.4, 0.3]
# A constant rate: the weights after epoch 3 do not depend on how many epochs the run has.
CONFIG = dict(batch_size=32, seed=2, lr_schedule="constant", model=mlp_spec([16], 0.1))


@pytest.mark.usefixtures("single_process")
def test_the_run_stops_early_and_hands_back_the_best_epochs_weights(blob_splits, tmp_path, monkeypatch):
    scripted_val_loss(LOSSES, monkeypatch.setattr)
    artifact = tmp_path / "model.pt"
    outcome = train(TrainConfig(epochs=8, patience=3, **CONFIG), blob_splits, str(artifact))
    assert [epoch.epoch for epoch in outcome.run.history] == [1, 2, 3, 4, 5, 6]
    assert (outcome.run.kept_epoch, outcome.run.kept_reason) == (
        3,
        "best val_loss 0.5000 at epoch 3 of 6, over 61 validation rows; "
        "early stopping after epoch 6 of 8: no better val_loss for 3 epochs",
    )
    three_epochs = train(TrainConfig(epochs=3, keep="last", **CONFIG), blob_splits)
    saved, _ = load_torch_artifact(str(artifact))
    states = (three_epochs.model.state_dict(), outcome.model.state_dict(), saved.state_dict())
    for expected, kept, in_artifact in zip(*(state.values() for state in states), strict=True):
        assert torch.equal(kept, expected) and torch.equal(in_artifact, expected)


@pytest.mark.usefixtures("single_process")
def test_keep_last_hands_back_the_last_epoch(blob_splits, monkeypatch):
    scripted_val_loss(LOSSES, monkeypatch.setattr)
    last = train(TrainConfig(epochs=4, keep="last", **CONFIG), blob_splits)
    best = train(TrainConfig(epochs=4, **CONFIG), blob_splits)
    assert (last.run.kept_epoch, best.run.kept_epoch) == (4, 3)
    assert last.run.history == best.run.history
    changed = [
        not torch.equal(a, b) for a, b in zip(last.model.parameters(), best.model.parameters(), strict=True)
    ]
    assert any(changed)


@pytest.mark.usefixtures("single_process")
def test_a_run_resumed_after_the_best_epoch_keeps_the_same_best_weights(blob_splits, tmp_path, monkeypatch):
    scripted_val_loss(LOSSES, monkeypatch.setattr)
    config = TrainConfig(epochs=8, patience=3, **CONFIG)
    runs = train_interrupted_and_resumed(config, blob_splits, str(tmp_path), (4, 3), monkeypatch.setattr)
    expected, resumed = runs["uninterrupted"], runs["resumed"]
    assert runs["saved_at"] == (4, 2)  # mid-epoch 5, after the best epoch, 3
    assert resumed["kept"] == expected["kept"] and resumed["kept"][0] == 3
    assert resumed["history"] == expected["history"] and len(resumed["history"]) == 6
    for name, tensor in expected["state"].items():
        assert torch.equal(resumed["state"][name], tensor), name


@pytest.mark.usefixtures("single_process")
def test_a_run_resumed_after_its_early_stop_trains_no_further(blob_splits, tmp_path, monkeypatch):
    scripted_val_loss(LOSSES, monkeypatch.setattr)
    config = TrainConfig(epochs=8, patience=3, **CONFIG)
    first = train(config, blob_splits, checkpoint=TrainingCheckpoint(str(tmp_path)))
    again = train(config, blob_splits, checkpoint=TrainingCheckpoint(str(tmp_path)))
    assert again.optimizer_steps == first.optimizer_steps  # not one step more
    assert again.run.history == first.run.history and again.run.kept_epoch == 3
    for a, b in zip(first.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_the_report_says_which_epoch_was_kept_and_why():
    reason = "best val_loss 0.1161 at epoch 9 of 30"
    run = TrainingRun("pytorch", "cpu", "cpu", 1, "none", "float32", "single-process", [], 1.0, 1.0,
                      TrainConfig(), kept_epoch=9, kept_reason=reason)  # fmt: skip
    labels = np.array([0, 1, 1])
    report = EvaluationReport(classification_metrics(labels, labels, ["a", "b"]), ["a", "b"], run,
                              Hardware("cpu", 1), "d")  # fmt: skip
    assert f"kept epoch 9: {reason}" in report.summary().splitlines()
    run.kept_epoch = 0  # a run recorded without it
    assert "kept epoch" not in report.summary()
