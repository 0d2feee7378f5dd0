"""Real local executions of the workflow: preprocess -> DDP training (2 gloo workers) -> evaluate."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from tasks.core.data.config import DataConfig
from tasks.core.messages import InputError
from tasks.core.models.plugins import ModelSpec, mlp_spec
from tasks.core.planning.planner import PlanError
from tasks.core.training.config import TrainConfig
from tasks.targets import TARGETS
from tests.conftest import COMPARISON_HYPERPARAMETERS, blobs_frame
from tests.run_bundles import assert_scores_as_evaluate_did
from workflows.comparison import hardware_comparison
from workflows.pipeline import training_pipeline

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def default_digits_run():
    """The bare `training_pipeline()`: the built-in MLP on the embedded digits."""
    return training_pipeline()


def test_default_run_on_embedded_digits_reaches_095(default_digits_run):
    report = default_digits_run.report
    metrics = report.metrics
    assert metrics.accuracy >= 0.95
    assert metrics.macro_f1 >= 0.95
    assert metrics.n_test == 270 and len(metrics.per_class) == 10
    assert sum(map(sum, metrics.confusion_matrix)) == metrics.n_test
    run = report.training
    assert (run.framework, run.device_type, run.device_name, run.world_size) == ("pytorch", "cpu", "cpu", 2)
    assert report.dataset == "embedded:sklearn-digits"
    plan = report.resource_plan
    choice = plan.training.choice
    assert plan.applied and choice.name == "a100-mig-1g.5gb" and choice.device == "nvidia-tesla-a100"
    assert plan.training.effective_batch_size == 64 and plan.preprocess.input_rows == 1797


def test_the_bundle_scores_the_users_rows_as_evaluate_did(default_digits_run, tmp_path):
    """Torch: the run's bundle, loaded without flytekit, predicts the raw test rows (columns shuffled,
    id columns added) exactly as the report counted them."""
    report = default_digits_run.report
    assert_scores_as_evaluate_did(default_digits_run.model.path, report.metrics.accuracy, tmp_path)


def test_a_local_run_s_bundle_lasts_in_the_local_models_folder_not_in_flytekit_s_temporary_ones(
    default_digits_run,
):
    folder = Path(default_digits_run.model.path)
    assert folder.parent == Path(os.environ["MIXEDML_LOCAL_MODELS"])  # the session's, set by conftest
    assert (folder / "bundle.json").is_file()


@pytest.mark.heavy  # a second full run, of another model on another target
def test_the_cnn_on_the_multinode_target_is_clamped_to_one_node_beats_the_mlp_and_reaches_098(
    default_digits_run,
):
    """The multinode target run locally: one node of two DDP workers, as for the MLP. The run asks for
    the int8 export too, which evaluation decides on and records, kept or not."""
    cnn = ModelSpec("cnn", "1x8x8")
    outputs = training_pipeline(
        target="gpu-multinode", hyperparameters=TrainConfig(model=cnn), int8_export=True
    )
    report = outputs.report
    assert (report.training.framework, report.training.world_size) == ("pytorch", 2)
    assert report.metrics.accuracy >= 0.98
    assert report.metrics.accuracy > default_digits_run.report.metrics.accuracy
    assert report.training.config.model == cnn and "model: cnn 1x8x8" in report.summary()
    manifest = json.loads((Path(outputs.model.path) / "bundle.json").read_text())
    check = manifest["export_checks"]["onnx_int8"]
    assert check["kept"] == ("onnx_int8" in manifest["files"])
    assert f"int8 ONNX export {'kept' if check['kept'] else 'not kept'}: {check['why']}" in report.notes
    assert check["fp32"] == pytest.approx(report.metrics.accuracy)  # the same raw test rows
    assert manifest["files"]["model_card"] == "MODEL_CARD.md" and "MODEL_CARD.md" in manifest["digests"]


@pytest.fixture
def training_tasks_run(monkeypatch) -> list[str]:
    """The targets whose training task started; a started one stops there instead of training."""
    started: list[str] = []

    def start(name: str):
        started.append(name)
        raise AssertionError(f"the {name} training task started")

    for name, target in TARGETS.items():
        monkeypatch.setattr(target.task, "execute", lambda *args, _name=name, **kwargs: start(_name))
    return started


def test_embedded_data_with_another_label_column_is_explained(training_tasks_run):
    with pytest.raises(ValueError, match="embedded digits dataset has label column 'label'"):
        training_pipeline(data=DataConfig(label_column="target"))
    assert training_tasks_run == []


def test_a_model_too_large_for_the_catalog_fails_before_training(training_tasks_run):
    with pytest.raises(PlanError, match="no accelerator in the catalog fits this model"):
        training_pipeline(hyperparameters=TrainConfig(model=mlp_spec([98304, 98304]), epochs=1))
    assert training_tasks_run == []


def test_hardware_comparison_trains_both_from_the_same_data(comparison_run):
    comparison = comparison_run.comparison
    names = [row.run.name for row in comparison.rows]
    assert names == ["gpu (pytorch)", "tpu (tensorflow)"]
    frameworks = [row.run.training.framework for row in comparison.rows]
    assert frameworks == ["pytorch", "tensorflow"]
    assert [row.run.training.config.model for row in comparison.rows] == [
        COMPARISON_HYPERPARAMETERS.model
    ] * 2
    for row in comparison.rows:
        assert row.run.accuracy >= 0.9
        assert row.price_per_hour == 0.5

        assert row.cost_usd == pytest.approx(row.accelerator_hours * 0.5)
    assert comparison.cheapest in names and comparison.fastest in names
    tensorflow = comparison.rows[1].run.training  # the tpu target, run locally on CPU
    assert (tensorflow.strategy, tensorflow.device_type) == ("default", "cpu")


def test_the_tensorflow_run_s_bundle_scores_the_users_rows_as_evaluate_did(comparison_run, tmp_path):
    accuracy = comparison_run.comparison.rows[1].run.accuracy
    assert_scores_as_evaluate_did(comparison_run.tpu_model.path, accuracy, tmp_path)
    files = json.loads(Path(comparison_run.tpu_model.path, "bundle.json").read_text())["files"]
    assert {"weights", "saved_model"} <= files.keys()


def test_comparison_checks_its_inputs_as_the_pipeline_does(training_tasks_run):
    with pytest.raises(InputError, match="input 'hyperparameters.epochs' = 0: must be at least 1"):
        hardware_comparison(hyperparameters=TrainConfig(epochs=0))
    assert training_tasks_run == []


@pytest.fixture(scope="session")  # session: its tests share one worker but may not run in a row
def scheduled_run_on_a_users_csv(tmp_path_factory):
    """The nightly launch plan's workflow on yesterday's partition: a CSV as users keep them, whose
    string labels carry stray spaces and differ only by case, beside a text column, a boolean and a
    date with blanks, an id and a number with gaps. Returns the report and the Deck pages written."""
    from datetime import datetime

    from tasks.plumbing import decks
    from workflows.launch_plans import scheduled_training

    root = tmp_path_factory.mktemp("events")
    (root / "dt=2026-11-21").mkdir()
    frame = blobs_frame(n_rows=300)
    frame["answer"] = frame.pop("species").map({"setosa": "yes", "versicolor": "YES ", "virginica": " no"})
    rows = np.arange(len(frame))
    frame.loc[rows % 17 == 3, "f0"] = np.nan  # blank cells in a number column
    frame["city"] = np.array(["Berlin", "Hamburg", "Munich", ""], dtype=object)[rows % 4]
    frame["member"] = np.array(["true", "false", ""], dtype=object)[rows % 3]
    frame["signup"] = [("" if i % 13 == 5 else f"2026-{1 + i % 12:02d}-{1 + i % 28:02d}") for i in rows]
    frame["customer"] = [f"c{i:05d}" for i in rows]
    frame.to_csv(root / "dt=2026-11-21" / "data.csv", index=False)
    pages = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decks, "Deck", lambda name, html: pages.__setitem__(name, html))
        outputs = scheduled_training(
            kickoff_time=datetime(2026, 11, 22, 2, 0),
            dataset_template=str(root / "dt={yesterday}" / "data.csv"),
            data=DataConfig(label_column="answer"),
            hyperparameters=TrainConfig(epochs=3, batch_size=32),
        )
    return outputs.report, pages, root / "dt=2026-11-21" / "data.csv"


def test_scheduled_training_reads_the_partition_of_its_kickoff_day(scheduled_run_on_a_users_csv):
    report, _, partition = scheduled_run_on_a_users_csv
    assert report.dataset == str(partition)
    assert report.metrics.accuracy >= 0.9


def test_a_users_csv_with_text_booleans_dates_and_gaps_trains_as_is(scheduled_run_on_a_users_csv):
    """Evaluation scored the raw test rows through the bundle: the accuracy of the first test is theirs."""
    report, pages, _ = scheduled_run_on_a_users_csv
    deck = pages["Dataset profile"]
    for column, kind in (
        ("city", "categorical"),
        ("member", "boolean"),
        ("signup", "date"),
        ("f0", "numeric"),
    ):
        assert re.search(rf"<td>{column}</td><td>{kind}</td>", deck), (column, kind)
    assert re.search(r"<td>customer</td><td>left out</td>", deck)
    assert any("'customer'" in note for note in report.notes), report.notes


def test_own_csv_keeps_string_labels_stripped_and_case_sensitive(scheduled_run_on_a_users_csv):
    report, _, _ = scheduled_run_on_a_users_csv
    assert report.class_labels == ["YES", "no", "yes"]  # surrounding whitespace stripped, case kept


def test_labels_differing_only_by_case_are_warned_in_the_report_and_its_deck(scheduled_run_on_a_users_csv):
    report, pages, _ = scheduled_run_on_a_users_csv
    (warning,) = [note for note in report.notes if "differ only by case" in note]
    assert "'YES'" in warning and "'yes'" in warning
    assert "differ only by case" in pages["Evaluation"]
