"""Both loops learn a number: scikit-learn's diabetes table, its label standardised on the train split;
the validation loss is the mean squared error in those units, so 1 - val_loss is about the val R²."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.splits import SplitPaths, read_split
from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.torch_step import mean_loss
from tasks.core.training.torch_training import train

CONFIG = TrainConfig(epochs=40, batch_size=32, model=mlp_spec([32]), seed=0)


@pytest.fixture(scope="module")
def diabetes_splits(tmp_path_factory) -> SplitPaths:
    from sklearn.datasets import load_diabetes

    root = tmp_path_factory.mktemp("diabetes")
    pq.write_table(
        pa.Table.from_pandas(load_diabetes(as_frame=True).frame, preserve_index=False), root / "d.parquet"
    )
    return prepare_dataset(str(root / "d.parquet"), "target", str(root / "out"), SplitConfig()).split_paths()


def val_r2(splits: SplitPaths, predict) -> float:
    x, y = read_split(splits.val, splits.feature_names, splits.label_column)
    predicted = predict(x)
    return 1.0 - float(np.mean((predicted - y) ** 2) / np.var(y))


def test_a_float_label_takes_the_squared_error_and_a_code_the_cross_entropy():
    logits = torch.tensor([[0.5], [2.0]])
    assert mean_loss(logits, torch.tensor([1.5, 2.0]), None).item() == pytest.approx(0.5)
    classes = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    assert mean_loss(classes, torch.tensor([0, 1]), None).item() == pytest.approx(0.1269, abs=1e-4)


@pytest.mark.usefixtures("single_process")
def test_the_torch_loop_learns_the_number(diabetes_splits):
    outcome = train(CONFIG, diabetes_splits)
    model = outcome.model.eval()
    with torch.no_grad():
        r2 = val_r2(diabetes_splits, lambda x: model(torch.from_numpy(x))[:, 0].numpy())
    kept = min(epoch.val_loss for epoch in outcome.run.history)
    assert r2 > 0.3 and r2 == pytest.approx(1.0 - kept * 1.0, abs=0.2)
    assert all(epoch.train_accuracy == 0.0 for epoch in outcome.run.history)  # none to count
    assert outcome.run.regression  # the Deck and the log then show squared errors, no accuracy


@pytest.mark.slow
def test_the_keras_loop_learns_the_number(diabetes_splits, tmp_path):
    from tasks.core.models.keras_models import load_keras_artifact
    from tasks.core.training.tf_strategy import Environment
    from tasks.core.training.tf_training import train_keras

    artifact = str(tmp_path / "model.npz")
    outcome = train_keras(CONFIG, diabetes_splits, artifact, env=Environment())
    model, _ = load_keras_artifact(artifact)
    r2 = val_r2(diabetes_splits, lambda x: np.asarray(model(x, training=False))[:, 0])
    assert r2 > 0.3
    assert all(epoch.val_accuracy == 0.0 for epoch in outcome.run.history)
    assert outcome.run.regression


@pytest.mark.usefixtures("single_process")
def test_a_streamed_regression_trains_as_one_held_in_memory(diabetes_splits, tmp_path):
    """Streaming reads the float label from the split's row groups as the in-memory placement does;
    a checkpointed run resumed after its last epoch hands back the same history."""
    from dataclasses import replace

    from tasks.core.training.checkpoint import TrainingCheckpoint

    config = replace(CONFIG, epochs=3)
    held = train(replace(config, data_placement="device"), diabetes_splits).run.history
    streamed = train(replace(config, data_placement="stream"), diabetes_splits).run.history
    assert [e.val_loss for e in streamed] == pytest.approx([e.val_loss for e in held], rel=1e-5)
    checkpoint = TrainingCheckpoint(str(tmp_path / "checkpoint"))
    first = train(config, diabetes_splits, checkpoint=checkpoint).run.history
    resumed = train(
        config, diabetes_splits, checkpoint=TrainingCheckpoint(str(tmp_path / "checkpoint"))
    ).run.history
    assert [e.val_loss for e in resumed] == [e.val_loss for e in first]


def test_the_planner_sizes_a_regression_s_one_output():
    from tasks.core.models.plugins import measure_footprint

    footprint = measure_footprint(mlp_spec([32]), 10, 1, "pytorch", "fp32")
    classes = measure_footprint(mlp_spec([32]), 10, 3, "pytorch", "fp32")
    assert 0 < footprint.state_bytes < classes.state_bytes  # 32 x 1 + 1 output weights, not 32 x 3 + 3
