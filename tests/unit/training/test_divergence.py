"""Training that diverges stops with an error naming where, on both loops and under DDP, and saves
no model; the training task then ends at once with it, restarting nothing; the model check on CPU
rows refuses non-finite logits."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from tasks.core.models.plugins import ModelError, ModelSpec, TrainingDiverged, check_model, mlp_spec
from tasks.core.training.config import TrainConfig

NAN_MODEL = ModelSpec("tests.unit.training.test_divergence:nan_logits")
INF_MODEL = ModelSpec("tests.unit.training.test_divergence:inf_logits")


def nan_logits(spec, options):
    return scaled_linear(spec, float("nan"))


def inf_logits(spec, options):
    return scaled_linear(spec, float("inf"))


def nan_logits_keras(spec, options):
    import keras

    inputs = keras.Input(shape=(spec.n_features,))
    logits = keras.layers.Dense(spec.n_classes)(inputs)
    return keras.Model(inputs, keras.layers.Lambda(lambda x: x * float("nan"))(logits))


def recorded_mlp(spec, options):
    """The built-in MLP, appending the DDP worker's rank to the file `options["builds"]` on each build."""
    import os

    from tasks.core.models.plugins import build

    if "RANK" in os.environ:
        with open(str(options["builds"]), "a") as builds:
            builds.write(f"{os.environ['RANK']}\n")
    return build(mlp_spec([16]), spec.n_features, spec.n_classes, "pytorch")


def scaled_linear(spec, factor: float):
    import torch

    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(spec.n_features, spec.n_classes)

        def forward(self, rows):
            return self.linear(rows) * factor

    return Scaled()


@pytest.mark.parametrize(
    ("model", "framework"),
    [(NAN_MODEL, "pytorch"), (INF_MODEL, "pytorch"), (NAN_MODEL, "tensorflow")],
)
def test_the_model_check_refuses_non_finite_logits_naming_the_model(model, framework):
    with pytest.raises(ModelError) as error:
        check_model(model, n_features=4, n_classes=3, framework=framework)
    assert str(error.value).startswith(f"model {model.builder!r} gave NaN or infinite logits")


def test_the_model_check_passes_a_finite_model():
    check_model(mlp_spec([8]), n_features=4, n_classes=3, framework="pytorch")


DIVERGING = {
    # A model whose logits are NaN diverges at its first step: not even that step is checkpointed.
    "nan-logits": (
        TrainConfig(epochs=2, batch_size=32, model=NAN_MODEL, checkpoint_every_steps=1),
        "epoch 1, step 1:",
    ),
    "learning-rate-1e9": (
        TrainConfig(epochs=2, batch_size=32, learning_rate=1e9, model=mlp_spec([16])),
        "epoch 1, step ",
    ),
}


def assert_names_the_step_and_the_fix(error: TrainingDiverged, where: str) -> None:
    message = str(error)
    assert where in message and "the training loss is" in message
    assert "lower learning_rate" in message and "precision 'fp32'" in message


@pytest.mark.parametrize("case", list(DIVERGING))
def test_torch_stops_on_a_non_finite_loss_and_saves_no_model(case, blob_splits, tmp_path):
    from tasks.core.training.checkpoint import TrainingCheckpoint
    from tasks.core.training.torch_training import train

    config, where = DIVERGING[case]
    artifact = tmp_path / "model.pt"
    checkpoint = TrainingCheckpoint(str(tmp_path / "checkpoint"), config.checkpoint_every_steps)
    with pytest.raises(TrainingDiverged) as error:
        train(config, blob_splits, str(artifact), checkpoint)
    assert_names_the_step_and_the_fix(error.value, where)
    assert not artifact.exists()
    if case == "nan-logits":
        assert checkpoint.load() is None


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DIVERGING))
def test_keras_stops_on_a_non_finite_loss_and_saves_no_model(case, blob_splits, tmp_path):
    from tasks.core.training.tf_training import KerasRunOptions, train_keras

    config, where = DIVERGING[case]
    artifact, checkpoint = tmp_path / "model.npz", tmp_path / "checkpoint"
    with pytest.raises(TrainingDiverged) as error:
        train_keras(
            config, blob_splits, str(artifact), options=KerasRunOptions(checkpoint_dir=str(checkpoint))
        )
    assert_names_the_step_and_the_fix(error.value, where)
    assert not artifact.exists()
    if case == "nan-logits":
        assert not any(checkpoint.glob("*.weights.h5"))


def not_fetched() -> str:
    raise AssertionError("a diverged run's model file was fetched")


def assert_stopped_with_a_record_that_says_so(run, splits, where: str) -> None:
    """The run handed back instead of raising: its record names the step, the tuning metric of its
    model is not a number whatever the metric, and no bundle is written from it."""
    from tasks.core.bundle.manifest import BundleRecord
    from tasks.core.training.records import Hardware
    from tasks.core.tuning.scoring import trial_metric

    assert run.diverged.startswith(f"training diverged at {where}") and run.history == []
    for metric in ("val_accuracy", "val_macro_f1", "val_loss"):
        assert math.isnan(trial_metric(metric, not_fetched, splits, run, 1.0))
    with pytest.raises(ValueError, match="the run has no model to bundle: training diverged at epoch 1"):
        BundleRecord.of(None, run, Hardware("cpu", 1), "")


@pytest.mark.parametrize("case", list(DIVERGING))
def test_torch_with_on_divergence_stop_hands_back_a_run_that_says_it_diverged(case, blob_splits, tmp_path):
    from tasks.core.training.torch_training import train

    config, where = DIVERGING[case]
    artifact = str(tmp_path / "model.pt")
    run = train(replace(config, on_divergence="stop"), blob_splits, artifact).run
    assert_stopped_with_a_record_that_says_so(run, blob_splits, where)


@pytest.mark.slow
def test_keras_with_on_divergence_stop_hands_back_a_run_that_says_it_diverged(blob_splits, tmp_path):
    from tasks.core.training.tf_training import train_keras

    config, where = DIVERGING["nan-logits"]
    artifact = str(tmp_path / "model.npz")
    run = train_keras(replace(config, on_divergence="stop"), blob_splits, artifact).run
    assert_stopped_with_a_record_that_says_so(run, blob_splits, where)


def test_on_divergence_is_fail_or_stop():
    assert TrainConfig().on_divergence == "fail"
    assert TrainConfig(on_divergence="skip").problems() == {"on_divergence": "not one of fail, stop"}
