"""Training that diverges stops with an error naming where, on both loops and under DDP, and saves
no model; the training task then ends at once with it, restarting nothing; the model check on CPU
rows refuses non-finite logits."""

from __future__ import annotations

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


@pytest.mark.slow
def test_ddp_ranks_stop_together_when_one_ranks_loss_is_not_finite(blob_splits):
    from tests.workers.ddp_workers import launch_local, train_until_one_rank_diverges

    config = TrainConfig(epochs=3, batch_size=32, model=mlp_spec([16]), seed=5, collective_timeout_s=60)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        ranks = launch_local(train_until_one_rank_diverges, config, blob_splits, 1, 3, nproc=2,
                             run_id="diverged")  # fmt: skip
    assert ranks[0]["steps_run"] == ranks[1]["steps_run"]
    assert "epoch 1, step 3: the training loss is nan;" in ranks[1]["error"]
    assert "epoch 1, step 3: the training loss is not finite on another rank;" in ranks[0]["error"]


@pytest.mark.slow
def test_the_training_task_ends_at_once_on_divergence_with_its_message_restarting_nothing(
    blobs, write_table, tmp_path
):
    """Two local gloo workers, as `pyflyte run` trains on a CPU machine: the divergence is the task's
    error, not a failed restart of the workers (gloo's connectFullMesh on a loaded machine), and Flyte
    would not retry it."""
    from tasks.core.training.launch import WorkerFailed
    from tasks.plumbing.failures import failure_of
    from tasks.preprocess import preprocess
    from tasks.train_torch import train_torch

    prepared = preprocess(
        dataset=write_table(blobs), label_column="species", val_fraction=0.2, test_fraction=0.2, seed=0
    )
    builds = tmp_path / "builds.txt"
    model = ModelSpec("tests.unit.training.test_divergence:recorded_mlp", options={"builds": str(builds)})
    config = TrainConfig(epochs=2, batch_size=32, learning_rate=3e8, model=model)
    with pytest.raises(WorkerFailed) as error:
        train_torch(prepared=prepared, hyperparameters=config)
    assert "failed: TrainingDiverged: training diverged at epoch 1, step " in str(error.value)
    assert sorted(builds.read_text().split()) == ["0", "1"]  # each rank built its model once
    assert not failure_of(error.value).retried
