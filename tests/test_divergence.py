"""Training that diverges stops with an error naming where, on both loops and under DDP, and saves
no model; the model check on CPU rows refuses non-finite logits."""

from __future__ import annotations

import pytest

from tasks.core.config import TrainConfig
from tasks.core.models import ModelError, ModelSpec, TrainingDiverged, check_model, mlp_spec

NAN_MODEL = ModelSpec("tests.test_divergence:nan_logits")
INF_MODEL = ModelSpec("tests.test_divergence:inf_logits")


def nan_logits(spec, options):
    return scaled_linear(spec, float("nan"))


def inf_logits(spec, options):
    return scaled_linear(spec, float("inf"))


def nan_logits_keras(spec, options):
    import keras

    inputs = keras.Input(shape=(spec.n_features,))
    logits = keras.layers.Dense(spec.n_classes)(inputs)
    return keras.Model(inputs, keras.layers.Lambda(lambda x: x * float("nan"))(logits))


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
    from tasks.core.checkpoint import TrainingCheckpoint
    from tasks.core.torch_training import train

    config, where = DIVERGING[case]
    artifact = tmp_path / "model.pt"
    checkpoint = TrainingCheckpoint(str(tmp_path / "checkpoint"), config.checkpoint_every_steps)
    with pytest.raises(TrainingDiverged) as error:
        train(config, blob_splits, str(artifact), checkpoint)
    assert_names_the_step_and_the_fix(error.value, where)
    assert not artifact.exists()
    if case == "nan-logits":
        assert checkpoint.load() is None


@pytest.mark.parametrize("case", list(DIVERGING))
def test_keras_stops_on_a_non_finite_loss_and_saves_no_model(case, blob_splits, tmp_path):
    from tasks.core.tf_training import KerasRunOptions, train_keras

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


@pytest.mark.slow
def test_ddp_ranks_stop_together_when_one_ranks_loss_is_not_finite(blob_splits):
    from tests.ddp_workers import launch_local, train_until_one_rank_diverges

    config = TrainConfig(epochs=3, batch_size=32, model=mlp_spec([16]), seed=5, collective_timeout_s=60)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        ranks = launch_local(train_until_one_rank_diverges, config, blob_splits, 1, 3, nproc=2,
                             run_id="diverged")  # fmt: skip
    assert ranks[0]["steps_run"] == ranks[1]["steps_run"]
    assert "epoch 1, step 3: the training loss is nan;" in ranks[1]["error"]
    assert "epoch 1, step 3: the training loss is not finite on another rank;" in ranks[0]["error"]
