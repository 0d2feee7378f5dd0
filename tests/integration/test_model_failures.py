"""Model problems are refused as such, naming the builder reference: a model with nothing to train
(before the memory probe, whose backward would fail on it), and a model that fails to build only on
the DDP workers, after planning."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.core.models.plugins import ModelError, ModelSpec, measure_footprint


def frozen_linear(spec, options):
    import torch

    model = torch.nn.Linear(spec.n_features, spec.n_classes)
    model.requires_grad_(False)
    return model


def parameterless(spec, options):
    import torch

    class FixedProjection(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("weights", torch.ones(spec.n_features, spec.n_classes))

        def forward(self, rows):
            return rows @ self.weights

    return FixedProjection()


def frozen_linear_keras(spec, options):
    import keras

    inputs = keras.Input(shape=(spec.n_features,))
    model = keras.Model(inputs, keras.layers.Dense(spec.n_classes)(inputs))
    model.trainable = False
    return model


@pytest.mark.parametrize(
    ("builder", "framework"),
    [
        ("tests.integration.test_model_failures:frozen_linear", "pytorch"),
        ("tests.integration.test_model_failures:parameterless", "pytorch"),
        ("tests.integration.test_model_failures:frozen_linear", "tensorflow"),
    ],
)
@pytest.mark.parametrize("precision", ["fp32", "auto"])
def test_a_model_with_nothing_to_train_is_refused_naming_the_reference(builder, framework, precision):
    with pytest.raises(ModelError) as error:
        measure_footprint(ModelSpec(builder), n_features=4, n_classes=3, framework=framework,
                          precision=precision)  # fmt: skip
    assert str(error.value).startswith(f"model {builder!r} has no trainable parameters")


def test_a_set_up_error_is_raised_naming_the_rank_with_its_cause_chained():
    import torch

    from tasks.core.training.torch_ddp import DistributedContext, SetUpFailed, agreed_set_up

    alone = DistributedContext(rank=0, world_size=1, device=torch.device("cpu"), backend="none")
    assert agreed_set_up(lambda: "ready", alone) == "ready"
    cause = KeyError("label")

    def missing_column():
        raise cause

    with pytest.raises(
        SetUpFailed, match=r"^rank 0 of 1 failed before training: KeyError: 'label'$"
    ) as error:
        agreed_set_up(missing_column, alone)
    assert error.value.__cause__ is cause


def fails_on_rank_1(spec, options):
    """Builds everywhere but on DDP rank 1, as a builder needing what only some workers lack; appends
    a line to the file `options["builds"]` for each build on a worker."""
    import os

    if "RANK" in os.environ:
        with open(str(options["builds"]), "a") as builds:
            builds.write(f"{os.environ['RANK']}\n")
    if os.environ.get("RANK") == "1":
        raise RuntimeError("CUDA kernels for this layer are missing on this worker")
    return frozen_linear(spec, options).requires_grad_(True)


@pytest.mark.slow
def test_the_training_task_fails_once_without_retry_naming_the_rank_that_failed(blobs, write_table, tmp_path):
    from tasks.core.data.config import DataConfig
    from tasks.core.data.split_config import SplitConfig
    from tasks.core.training.config import TrainConfig
    from tasks.preprocess import preprocess
    from tasks.train_torch import train_torch

    dataset = write_table(blobs)
    original = Path(dataset).read_bytes()
    prepared = preprocess(data=DataConfig(dataset, "species", split=SplitConfig(0.2, 0.2)))
    builds = tmp_path / "builds.txt"
    model = ModelSpec(
        "tests.integration.test_model_failures:fails_on_rank_1", options={"builds": str(builds)}
    )
    with pytest.raises(ValueError) as error:
        train_torch(prepared=prepared, hyperparameters=TrainConfig(epochs=1, batch_size=32, model=model))
    # Rank 1's own error, whichever rank torch elastic would have reported: not a connection lost to it.
    message = str(error.value)
    assert "rank 1 of 2 failed before training: ModelError: model " in message
    assert "'tests.integration.test_model_failures:fails_on_rank_1' failed to build" in message
    assert "CUDA kernels for this layer are missing on this worker" in message
    assert sorted(builds.read_text().split()) == ["0", "1"]  # one attempt: torch elastic restarted nothing
    assert Path(dataset).read_bytes() == original
