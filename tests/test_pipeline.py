"""Real local executions of the workflow: preprocess -> DDP training (2 gloo workers) -> evaluate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import blobs_frame
from workflows.pipeline import training_pipeline

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_default_run_on_embedded_digits_reaches_095():
    report = training_pipeline()
    assert report.accuracy >= 0.95
    assert report.macro_f1 >= 0.95
    assert report.n_test == 270 and len(report.per_class) == 10
    assert sum(map(sum, report.confusion_matrix)) == report.n_test
    assert (report.framework, report.trained_on, report.world_size) == ("pytorch", "cpu", 2)
    assert report.dataset == "embedded:sklearn-digits"


def test_own_csv_with_string_labels(tmp_path):
    path = tmp_path / "blobs.csv"
    blobs_frame(n_rows=300).to_csv(path, index=False)
    report = training_pipeline(dataset=str(path), label_column="species", epochs=5, batch_size=32)
    assert report.class_labels == ["setosa", "versicolor", "virginica"]
    assert report.accuracy >= 0.9
    assert report.dataset == str(path)


def test_bad_input_fails_the_run_naming_file_and_column(tmp_path):
    frame = blobs_frame(n_rows=60)
    frame["f1"] = frame["f1"].astype(str)
    path = tmp_path / "bad.parquet"
    frame.to_parquet(path, index=False)
    with pytest.raises(Exception) as error:
        training_pipeline(dataset=str(path), label_column="species")
    assert str(path) in str(error.value) and "'f1'" in str(error.value)


def test_embedded_data_with_another_label_column_is_explained():
    with pytest.raises(Exception, match="embedded digits dataset has label column 'label'"):
        training_pipeline(label_column="target")


def test_pyflyte_run_cli(tmp_path):
    path = tmp_path / "blobs.parquet"
    blobs_frame(n_rows=300).to_parquet(path, index=False)
    pyflyte = Path(sys.executable).with_name("pyflyte")
    command = [
        str(pyflyte), "run", "workflows/pipeline.py", "training_pipeline",
        "--dataset", str(path), "--label_column", "species", "--epochs", "3", "--hidden_sizes", json.dumps([32]),
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=REPO, capture_output=True, text=True, timeout=300, env=os.environ.copy()
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "accuracy" in result.stdout and "macro-F1" in result.stdout
