"""The chain preprocess -> train -> evaluate run from the package the way pods run it: each task's
outputs.pb feeds the next, so every step crosses real serialization boundaries."""

from __future__ import annotations

import pytest
import torch

from tasks.core.config import TrainConfig
from tasks.preprocess import preprocess
from tasks.train_torch import train_torch
from tasks.types import EvaluationReport, TrainedModel
from tests.pods import literals, merged, model_parameters, output, run_like_a_pod

pytestmark = pytest.mark.slow


@pytest.fixture
def task_specs(flyte_package):
    return flyte_package.tasks


def test_preprocess_train_evaluate_as_pods(task_specs, tmp_path):
    prepared = run_like_a_pod(
        task_specs["tasks.preprocess.preprocess"],
        literals(preprocess, {"dataset": "", "label_column": "label", "val_fraction": 0.15,
                              "test_fraction": 0.15, "seed": 0}),
        tmp_path / "preprocess",
    )  # fmt: skip
    hyper = {"hyperparameters": TrainConfig(epochs=8, batch_size=64, hidden_sizes=[128])}
    trained = run_like_a_pod(
        task_specs["tasks.train_torch.train_torch"],
        merged(literals(train_torch, hyper), prepared=prepared.literals["o0"]),
        tmp_path / "train",
    )
    report_literals = run_like_a_pod(
        task_specs["tasks.evaluate.evaluate"],
        merged(prepared=prepared.literals["o0"], trained=trained.literals["o0"]),
        tmp_path / "evaluate",
    )
    report = output(report_literals, EvaluationReport)
    assert report.metrics.accuracy >= 0.9 and report.metrics.n_test == 270
    assert (report.training.framework, report.training.world_size) == ("pytorch", 2)
    model_files = list((tmp_path / "train" / "raw").rglob("model.pt"))
    assert model_files, "the model artifact was not uploaded to the raw output prefix"
    assert (tmp_path / "train" / "checkpoint" / "training_state.pt").exists(), "no checkpoint was uploaded"

    # A retry (e.g. after preemption) gets the previous attempt's checkpoint and continues from it:
    # here every epoch was done, so it trains nothing more and returns the same model.
    retried = run_like_a_pod(
        task_specs["tasks.train_torch.train_torch"],
        merged(literals(train_torch, hyper), prepared=prepared.literals["o0"]),
        tmp_path / "retry",
        previous_checkpoint=str(tmp_path / "train" / "checkpoint"),
    )
    first, second = output(trained, TrainedModel), output(retried, TrainedModel)
    assert second.run.history == first.run.history
    assert second.run.samples_per_second == 0.0 < first.run.samples_per_second  # nothing left to train
    first_state, second_state = model_parameters(first), model_parameters(second)
    assert all(torch.equal(first_state[name], second_state[name]) for name in first_state)
