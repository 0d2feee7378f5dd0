"""A real local run of the workflow on a regression table: scikit-learn's diabetes (442 rows, a
numeric target with 214 distinct values), decided as a regression by `auto`."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.table_input import BundleError
from tasks.core.data.config import DataConfig
from tasks.core.data.split_config import SplitConfig
from tasks.core.messages import InputError
from tasks.core.training.config import TrainConfig
from workflows.pipeline import training_pipeline

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def diabetes(tmp_path_factory) -> str:
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True).frame
    path = tmp_path_factory.mktemp("diabetes") / "diabetes.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return str(path)


@pytest.fixture(scope="module")
def diabetes_run(diabetes):
    return training_pipeline(data=DataConfig(diabetes, "target"), hyperparameters=TrainConfig(epochs=60))


def test_auto_trains_a_regression_that_beats_the_train_mean(diabetes_run):
    report = diabetes_run.report
    assert report.metrics is None and report.class_labels == []
    metrics = report.regression
    assert report.target.regression and "214 distinct whole numbers over 442 rows" in report.target.reason
    assert metrics.n_test == 67 and metrics.r2 > 0.3
    assert metrics.rmse < metrics.baseline_rmse and abs(metrics.baseline_r2) < 0.05
    summary = report.summary()
    assert "predicting a number (regression)" in summary and "R²" in summary and "train mean" in summary
    assert (report.training.framework, report.training.world_size) == ("pytorch", 2)


def test_the_bundle_predicts_numbers_in_the_label_s_units_and_refuses_probabilities(diabetes_run, diabetes):
    folder = Path(diabetes_run.model.path)
    manifest = json.loads((folder / "bundle.json").read_text())
    assert manifest["target"]["problem_type"] == "regression" and manifest["files"]["onnx"] == "model.onnx"
    assert manifest["regression_metrics"]["r2"] == pytest.approx(diabetes_run.report.regression.r2)
    card = (folder / "MODEL_CARD.md").read_text()
    assert "A number: column `target`" in card and "always the train mean" in card
    bundle = load_bundle(str(folder))
    rows = pd.read_parquet(diabetes)
    predicted = bundle.predict(rows)
    assert predicted.dtype.kind == "f" and len(predicted) == len(rows)
    assert 25 <= predicted.mean() <= 346  # within the label's range, not standardised units
    with pytest.raises(BundleError, match="predicts a number.*use predict"):
        bundle.predict_proba(rows)


def test_the_tensorflow_target_trains_the_regression_asked_for(diabetes):
    outputs = training_pipeline(
        data=DataConfig(diabetes, "target", split=SplitConfig(problem_type="regression")),
        target="gpu-tf",
        hyperparameters=TrainConfig(epochs=40, batch_size=32),
    )
    report = outputs.report
    assert report.training.framework == "tensorflow" and report.target.reason.startswith("problem_type=")
    assert report.regression.r2 > 0.3
    manifest = json.loads((Path(outputs.model.path) / "bundle.json").read_text())
    assert {"onnx", "saved_model"} <= set(manifest["files"])


def test_a_regression_with_val_accuracy_is_refused_before_training(diabetes):
    with pytest.raises(InputError, match="a regression has no accuracy"):
        training_pipeline(
            data=DataConfig(diabetes, "target"),
            hyperparameters=TrainConfig(selection_metric="val_accuracy"),
        )
