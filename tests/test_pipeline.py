"""Real local executions of the workflow: preprocess -> DDP training (2 gloo workers) -> evaluate."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks.core.config import TrainConfig
from tests.conftest import blobs_frame
from workflows.comparison import hardware_comparison
from workflows.pipeline import training_pipeline

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_default_run_on_embedded_digits_reaches_095():
    report = training_pipeline()
    metrics = report.metrics
    assert metrics.accuracy >= 0.95
    assert metrics.macro_f1 >= 0.95
    assert metrics.n_test == 270 and len(metrics.per_class) == 10
    assert sum(map(sum, metrics.confusion_matrix)) == metrics.n_test
    run = report.training
    assert (run.framework, run.device, run.world_size) == ("pytorch", "cpu", 2)
    assert report.dataset == "embedded:sklearn-digits"
    plan = report.resource_plan
    choice = plan.training.choice
    assert plan.applied and choice.name == "a100-mig-1g.5gb" and choice.device == "nvidia-tesla-a100"
    assert plan.training.effective_batch_size == 64 and plan.preprocess.input_rows == 1797


def test_own_csv_with_string_labels(tmp_path):
    path = tmp_path / "blobs.csv"
    blobs_frame(n_rows=300).to_csv(path, index=False)
    report = training_pipeline(
        dataset=str(path), label_column="species", hyperparameters=TrainConfig(epochs=5, batch_size=32)
    )
    assert report.class_labels == ["setosa", "versicolor", "virginica"]
    assert report.metrics.accuracy >= 0.9
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


def test_tpu_target_runs_tensorflow_locally_on_cpu_and_reports_the_strategy():
    report = training_pipeline(target="tpu")
    assert report.metrics.accuracy >= 0.95
    run = report.training
    assert (run.framework, run.strategy, run.device) == ("tensorflow", "default", "cpu")


def test_unknown_target_lists_the_valid_ones():
    with pytest.raises(
        Exception, match="input 'target' = 'cuda': not one of gpu, gpu-multinode, tpu, gpu-tf"
    ):
        training_pipeline(target="cuda", hyperparameters=TrainConfig(epochs=1))


def test_a_model_too_large_for_the_catalog_fails_before_training():
    with pytest.raises(Exception, match="no accelerator in the catalog fits this model") as error:
        training_pipeline(hyperparameters=TrainConfig(hidden_sizes=[98304, 98304], epochs=1))
    assert "train_torch" not in str(error.value)


def test_hardware_comparison_trains_both_from_the_same_data():
    comparison = hardware_comparison(hyperparameters=TrainConfig(epochs=5), prices={"cpu": 0.5})
    names = [row.run.name for row in comparison.rows]
    assert names == ["gpu (pytorch)", "tpu (tensorflow)"]
    frameworks = [row.run.training.framework for row in comparison.rows]
    assert frameworks == ["pytorch", "tensorflow"]
    for row in comparison.rows:
        assert row.run.accuracy >= 0.9
        assert row.price_per_hour == 0.5
        assert row.cost_usd == pytest.approx(row.accelerator_hours * 0.5)
    assert comparison.cheapest in names and comparison.fastest in names


def test_comparison_checks_its_inputs_as_the_pipeline_does():
    with pytest.raises(Exception, match="input 'hyperparameters.epochs' = 0: must be at least 1"):
        hardware_comparison(hyperparameters=TrainConfig(epochs=0))


def test_a_comparison_over_a_file_rewritten_in_place_trains_on_the_new_content(tmp_path):
    path = tmp_path / "data.parquet"
    learnable = blobs_frame(n_rows=300)
    learnable.to_parquet(path, index=False)
    ten_epochs = TrainConfig(epochs=10)
    before = hardware_comparison(dataset=str(path), label_column="species", hyperparameters=ten_epochs)
    assert all(row.run.accuracy >= 0.9 for row in before.rows)

    shuffled = learnable.assign(species=learnable["species"].sample(frac=1.0, random_state=1).to_numpy())
    shuffled.to_parquet(path, index=False)  # same URI, new content: labels no longer follow the features
    after = hardware_comparison(dataset=str(path), label_column="species", hyperparameters=ten_epochs)
    assert all(row.run.accuracy < 0.75 for row in after.rows), [row.run.accuracy for row in after.rows]


def test_multinode_target_is_clamped_to_one_node_locally():
    report = training_pipeline(target="gpu-multinode", hyperparameters=TrainConfig(epochs=3))
    assert (report.training.framework, report.training.world_size) == ("pytorch", 2)
    assert report.metrics.accuracy >= 0.9


def test_scheduled_training_reads_the_partition_of_its_kickoff_day(tmp_path):
    from datetime import datetime

    from workflows.launch_plans import scheduled_training

    partition = tmp_path / "dt=2026-11-21"
    partition.mkdir()
    blobs_frame(n_rows=300).to_parquet(partition / "data.parquet", index=False)
    report = scheduled_training(
        kickoff_time=datetime(2026, 11, 22, 2, 0),
        dataset_template=str(tmp_path / "dt={yesterday}" / "data.parquet"),
        label_column="species",
        hyperparameters=TrainConfig(epochs=3),
    )
    assert report.dataset == str(partition / "data.parquet")
    assert report.metrics.accuracy >= 0.9
