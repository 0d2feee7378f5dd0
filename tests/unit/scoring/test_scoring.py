"""Batch scoring: the streaming scorer, its checks before any scoring, raw rows of text, booleans, dates
and missing values through a bundle's encoding, and the hardware choice (the workflows run locally and
the scorer in a process of its own: tests/integration/test_scoring.py)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle.loading import load_bundle
from tasks.core.bundle.table_input import BundleError
from tasks.core.data.files import DatasetError
from tasks.core.evaluation.metrics import classification_metrics, metrics_from_confusion
from tasks.core.planning.planner import CatalogEntry
from tasks.core.scoring.cpu_or_gpu import choose_hardware
from tasks.core.scoring.output import probability_columns
from tasks.core.scoring.piece import label_key
from tasks.core.scoring.plan import plan_scoring
from tasks.core.scoring.records import GPU_MODEL_SPEEDUP, RowCost, ScoringJob, ScoringPiece, ScoringPlan
from tasks.core.scoring.run import score_dataset
from tests.conftest import blobs_frame
from tests.floats import assert_scored_alike
from tests.unit.publish.test_publish import CLASSES, messy_table, write_messy_bundle

PROBABILITIES = [f"probability_{label}" for label in CLASSES]
PART_ROWS = (250, 150, 200)


@pytest.fixture(scope="module")
def scoring_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("scoring")


@pytest.fixture(scope="module")
def bundle_folder(scoring_bundle) -> str:
    return scoring_bundle  # tests/conftest.py: the flytekit-free scorer's test reads it too


def users_table(rows: int = sum(PART_ROWS)) -> pd.DataFrame:
    """Blobs as a user holds them: an id column, the label, the features in another order."""
    frame = blobs_frame(n_rows=rows, n_classes=3, seed=5)
    frame.insert(0, "customer_id", [f"c{i:04d}" for i in range(rows)])
    return frame[["f2", "customer_id", "f0", "species", "f3", "f1"]]


def write_parts(folder: Path, frame: pd.DataFrame) -> str:
    """A folder of part files; the first with small row groups, so that it is scored in pieces."""
    folder.mkdir(parents=True)
    starts = np.cumsum((0, *PART_ROWS))
    for index, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        part = frame.iloc[start:end]
        part.to_parquet(
            folder / f"part-{index}.parquet", index=False, row_group_size=50 if index == 0 else None
        )
    return str(folder)


@pytest.fixture(scope="module")
def users_parts(scoring_parts) -> str:
    return scoring_parts


def read_predictions(folder: str) -> pd.DataFrame:
    return pq.read_table(folder).to_pandas()


def assert_scored_as_the_bundle(predictions: pd.DataFrame, bundle_uri: str) -> None:
    """One row per input row in input order, ids and labels intact, the bundle's own predictions."""
    frame, bundle = users_table(), load_bundle(bundle_uri)
    assert len(predictions) == len(frame)
    assert predictions["customer_id"].tolist() == frame["customer_id"].tolist()
    assert predictions["species"].tolist() == frame["species"].tolist()
    assert list(predictions.columns) == ["customer_id", "species", "prediction", *PROBABILITIES]
    assert predictions["prediction"].tolist() == bundle.predict(frame).tolist()
    probabilities = predictions[PROBABILITIES].to_numpy()
    assert_scored_alike(probabilities, bundle.predict_proba(frame))  # scored in batches of each part
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)


# ---- the streaming scorer ------------------------------------------------------------------------------


def test_a_folder_of_parts_is_scored_row_for_row_with_its_ids_and_metrics(
    bundle_folder, users_parts, tmp_path
):
    output = str(tmp_path / "predictions")
    report = score_dataset(bundle_folder, users_parts, output, rows_per_piece=100)
    predictions = read_predictions(output)
    assert_scored_as_the_bundle(predictions, bundle_folder)
    assert (
        report.rows == len(predictions) and report.pieces == 3 + 1 + 1
    )  # the first part in row groups of 50
    assert report.probability_columns == dict(zip(CLASSES, PROBABILITIES, strict=True))
    truth = predictions["species"].map(CLASSES.index).to_numpy()
    predicted = predictions["prediction"].map(CLASSES.index).to_numpy()
    assert report.metrics == classification_metrics(truth, predicted, CLASSES)
    assert len(set(predicted)) > 1, "an untrained model that predicts one class tests little"


def test_labels_that_are_not_classes_of_the_model_are_left_out_of_the_metrics(bundle_folder, tmp_path):
    frame = users_table(40)
    frame.loc[:4, "species"] = ["unseen", None, " setosa ", "unseen", "other"]
    source = tmp_path / "users.csv"
    frame.to_csv(source, index=False)
    report = score_dataset(bundle_folder, str(source), str(tmp_path / "predictions"))
    assert report.metrics.n_test == 36, "' setosa ' is setosa, as training read it"
    assert "4 rows have a label in 'species' that is missing or not a class" in report.notes[0]
    assert "'unseen'" in report.notes[0] and "'other'" in report.notes[0]


def test_labels_match_by_value_as_training_named_the_classes():
    assert label_key(" 3 ", numeric=True) == label_key(3, numeric=True) == label_key(3.0, numeric=True) == "3"
    assert label_key("2.5", numeric=True) == label_key(2.5, numeric=True)
    assert label_key("03", numeric=False) == "03" and label_key(" a ", numeric=False) == "a"
    assert label_key(True, numeric=False) == "True"
    assert (
        label_key(None, numeric=True)
        is label_key(float("nan"), numeric=True)
        is label_key(" ", False)
        is None
    )


def test_probability_columns_are_safe_names_unique_among_the_outputs():
    names = probability_columns(["a b", "a/b", "", "é", 1], taken={"probability_a_b", "prediction"})
    assert names == ["probability_a_b_2", "probability_a_b_3", "probability_class", "probability_class_2",
                     "probability_1"]  # fmt: skip


def test_metrics_from_counts_equal_the_metrics_from_rows():
    rng = np.random.default_rng(0)
    truth, predicted = rng.integers(0, 4, 500), rng.integers(0, 4, 500)
    predicted[:3] = 3  # a class never true in some rows, and unequal supports
    confusion = np.zeros((4, 4), dtype=np.int64)
    np.add.at(confusion, (truth, predicted), 1)
    labels = ["a", "b", "c", "d"]
    assert metrics_from_confusion(confusion, labels) == classification_metrics(truth, predicted, labels)


# ---- refused before any scoring ------------------------------------------------------------------------


def wrong_format_version(bundle: Path) -> None:
    manifest = json.loads((bundle / "bundle.json").read_text())
    (bundle / "bundle.json").write_text(json.dumps({**manifest, "format_version": 99}))


REFUSALS = {
    "missing feature": (lambda frame: frame.drop(columns="f3"), None, BundleError, ["'f3'", "users.parquet"]),
    "inf feature": (lambda frame: frame.assign(f0=frame["f0"].where(frame.index != 7, np.inf)), None,
                    DatasetError, ["'f0'", "row 7", "part-0.parquet"]),
    "text feature": (lambda frame: frame.assign(f1="many"), None, DatasetError, ["'f1'", "'many'"]),
    "prediction column": (lambda frame: frame.assign(prediction=1), None, DatasetError, ["'prediction'"]),
    "format version": (None, wrong_format_version, BundleError, ["format version 99", "bundle.json"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSALS))
def test_bad_inputs_are_refused_by_name_before_any_part_is_written(case, bundle_folder, tmp_path):
    change_data, change_bundle, error, words = REFUSALS[case]
    dataset = write_parts(
        tmp_path / "users.parquet", change_data(users_table()) if change_data else users_table()
    )
    bundle = tmp_path / "bundle"
    shutil.copytree(bundle_folder, bundle)
    if change_bundle:
        change_bundle(bundle)
    output = tmp_path / "predictions"
    with pytest.raises(error) as refused:
        score_dataset(str(bundle), dataset, str(output))
    for word in words:
        assert word in str(refused.value)
    assert not output.exists()


@pytest.mark.parametrize(
    "model, dataset, named",
    [
        ("nosuchscheme://models/blobs", None, "nosuchscheme://models/blobs"),
        ("/no/such/bundle", None, "/no/such/bundle"),
        (None, "nosuchscheme://events/day.parquet", "nosuchscheme://events/day.parquet"),
        (None, "/no/such/users.parquet", "/no/such/users.parquet"),
    ],
)
def test_an_unreadable_uri_is_refused_naming_it(model, dataset, named, bundle_folder, users_parts, tmp_path):
    with pytest.raises(ValueError, match=named):
        score_dataset(model or bundle_folder, dataset or users_parts, str(tmp_path / "predictions"))
    assert not (tmp_path / "predictions").exists()


def test_an_output_folder_that_holds_files_is_refused(bundle_folder, users_parts, tmp_path):
    (tmp_path / "predictions").mkdir()
    (tmp_path / "predictions" / "part-00000.parquet").write_bytes(b"yesterday's")
    with pytest.raises(DatasetError, match="predictions: the output folder already holds files"):
        score_dataset(bundle_folder, users_parts, str(tmp_path / "predictions"))


def test_a_bad_value_found_while_scoring_names_its_row_and_leaves_no_part(bundle_folder, tmp_path):
    frame = users_table()
    bad_row = PART_ROWS[0] + PART_ROWS[1] + 123  # row 123 of the third part
    frame.loc[bad_row, "f2"] = np.inf
    dataset = write_parts(tmp_path / "users.parquet", frame)
    output = tmp_path / "predictions"
    with pytest.raises(
        DatasetError, match=r"part-2.parquet: feature column 'f2' has an infinite value \(inf\) at row 123"
    ):
        score_dataset(bundle_folder, dataset, str(output))
    assert list(output.iterdir()) == [], "the pieces scored before the failure are removed with it"


# ---- raw rows through the bundle's encoding ------------------------------------------------------------


@pytest.fixture(scope="module")
def messy_bundle(scoring_root) -> str:
    return write_messy_bundle(scoring_root / "messy-bundle", seed=3)


def messy_rows() -> pd.DataFrame:
    """New rows of the messy table, as a user holds them: ids, the label, text, booleans, dates, nulls."""
    return messy_table(sum(PART_ROWS), seed=7).to_pandas()


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_parts_of_text_booleans_dates_and_nulls_are_scored_as_the_bundle_scores_them(messy_bundle, tmp_path):
    frame = messy_rows()
    dataset = write_parts(tmp_path / "users.parquet", frame)
    report = score_dataset(messy_bundle, dataset, str(tmp_path / "predictions"), rows_per_piece=100)
    predictions = read_predictions(str(tmp_path / "predictions"))
    bundle = load_bundle(messy_bundle)
    # The columns the encoding left out (an identifier, a constant) pass through with the label.
    assert list(predictions.columns) == ["customer_id", "region", "species", "prediction", *PROBABILITIES]
    assert predictions["customer_id"].tolist() == frame["customer_id"].tolist()
    assert predictions["prediction"].tolist() == bundle.predict(frame).tolist()
    assert_scored_alike(predictions[PROBABILITIES].to_numpy(), bundle.predict_proba(frame))
    truth = frame["species"].map(CLASSES.index).to_numpy()
    predicted = predictions["prediction"].map(CLASSES.index).to_numpy()
    assert report.metrics == classification_metrics(truth, predicted, CLASSES)
    assert report.pieces == 3 + 1 + 1 and len(set(predicted)) > 1


@pytest.mark.slow  # writes a bundle with its model exports: seconds
def test_a_csv_of_the_same_messy_rows_scores_as_the_parquet_does(messy_bundle, tmp_path):
    frame = messy_rows()
    frame.to_csv(tmp_path / "users.csv", index=False)
    score_dataset(messy_bundle, str(tmp_path / "users.csv"), str(tmp_path / "predictions"))
    predictions = read_predictions(str(tmp_path / "predictions"))
    assert_scored_alike(predictions[PROBABILITIES].to_numpy(), load_bundle(messy_bundle).predict_proba(frame))


def joined_as_numbers(part: pd.DataFrame) -> pd.DataFrame:
    return part.assign(joined=np.arange(len(part)))


MESSY_REFUSALS = {
    "a part of another type": ([1], joined_as_numbers,
                               ["part-1.parquet", "column 'joined' has type int64, but it is date32"]),
    "a part without a column": ([1], lambda part: part.drop(columns="city"), ["part-1.parquet", "lacks 'city'"]),
    "a type the model cannot read": ([0, 1, 2], joined_as_numbers,
                                     ["feature column 'joined' has type int64, which cannot be read as date"]),
}  # fmt: skip


@pytest.mark.slow  # writes a bundle with its model exports: seconds
@pytest.mark.parametrize("case", list(MESSY_REFUSALS))
def test_parts_whose_columns_the_model_cannot_read_are_refused_naming_them_before_scoring(
    case, messy_bundle, tmp_path
):
    parts, change, words = MESSY_REFUSALS[case]
    dataset = write_parts(tmp_path / "users.parquet", messy_rows())
    for index in parts:
        part = tmp_path / "users.parquet" / f"part-{index}.parquet"
        change(pd.read_parquet(part)).to_parquet(part, index=False)
    output = tmp_path / "predictions"
    with pytest.raises(DatasetError) as refused:
        score_dataset(messy_bundle, dataset, str(output))
    for word in ["users.parquet", *words]:
        assert word in str(refused.value)
    assert not output.exists()


# ---- CPU or GPU ----------------------------------------------------------------------------------------


def plan_of(rows: int, seconds_per_row: float, pieces: int = 1, model_share: float = 0.99) -> ScoringPlan:
    job = ScoringJob("bundle", "data.parquet", "", "", "out")
    cost = RowCost(total=seconds_per_row, model=seconds_per_row * model_share)
    return ScoringPlan(job, [ScoringPiece(i, f"part-{i}") for i in range(pieces)], rows, "pytorch", cost)


GPUS = [
    CatalogEntry("a100-mig-1g.5gb", "mig", "nvidia-tesla-a100", "1g.5gb", 4.75, 1, 0.42),
    CatalogEntry("a100-40gb", "gpu", "nvidia-tesla-a100", "", 39.4, 1, 2.93),
    CatalogEntry("l4", "gpu", "nvidia-l4", "", 22.0, 1, 0.71),
]


def test_a_cheap_model_scores_on_cpu_and_a_costly_one_on_the_cheapest_whole_gpu():
    cheap = choose_hardware(plan_of(1_000_000, 2e-6, pieces=4), 0.04, GPUS)
    assert cheap.device == "cpu" and cheap.cpu_cost < cheap.gpu_cost and cheap.gpu.name == "l4"
    costly = choose_hardware(plan_of(100_000_000, 5e-3, pieces=8), 0.04, GPUS)
    assert costly.device == "l4" and costly.gpu_cost < costly.cpu_cost
    assert costly.cpu_cost == pytest.approx((100_000_000 * 5e-3 + 8 * 30) * 0.04 / 3600)
    gpu_seconds_per_row = 5e-3 * 0.01 + 5e-3 * 0.99 / GPU_MODEL_SPEEDUP  # the host's share stays as it was
    assert costly.gpu_cost == pytest.approx((100_000_000 * gpu_seconds_per_row + 8 * 300) * 0.71 / 3600)
    assert "cheaper" in costly.reason and "l4" in costly.reason and "the model 99% of it" in costly.reason


def test_a_row_whose_cost_is_mostly_reading_and_writing_stays_on_cpu_however_many_rows():
    """A real GPU scored a small MLP's rows only 2x as fast as one core: the model was half the work.
    A GPU speeds up the forward pass alone, so such rows never pay for its price."""
    plan = plan_of(10**11, 3e-6, pieces=8, model_share=0.5)
    assert plan.row_cost.gpu_speedup() == pytest.approx(1 / (0.5 + 0.5 / GPU_MODEL_SPEEDUP))
    choice = choose_hardware(plan, 0.04, GPUS)
    assert choice.device == "cpu" and "2.0x a core" in choice.reason
    assert choose_hardware(replace(plan, row_cost=RowCost(3e-6, 3e-6)), 0.04, GPUS).device == "l4"


def test_the_plan_times_the_whole_row_and_the_model_within_it(bundle_folder, users_parts, tmp_path):
    cost = plan_scoring(bundle_folder, users_parts, str(tmp_path / "out")).row_cost
    assert 0 < cost.model < cost.total
    assert 1 < cost.gpu_speedup() < GPU_MODEL_SPEEDUP


def test_the_hardware_can_be_asked_for_and_a_gpu_needs_a_whole_one_in_the_catalog():
    plan = plan_of(1000, 1e-6)
    assert choose_hardware(plan, 0.04, GPUS, "gpu").device == "l4"
    assert choose_hardware(replace(plan, rows=10**12), 0.04, GPUS, "cpu").device == "cpu"
    assert choose_hardware(plan, 0.04, GPUS[:1]).device == "cpu"
    with pytest.raises(ValueError, match="no whole GPU"):
        choose_hardware(plan, 0.04, GPUS[:1], "gpu")
    with pytest.raises(ValueError, match="hardware='tpu' is not one of auto, cpu, gpu"):
        choose_hardware(plan, 0.04, GPUS, "tpu")


# ---- a GPU piece where its GPU is missing --------------------------------------------------------------


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_a_gpu_piece_on_a_cluster_node_without_its_gpu_refuses_naming_it(framework, monkeypatch):
    """As the training tasks do: never score on the host CPU where a GPU was declared."""
    from tasks.core.accelerators.rule import AcceleratorUnavailable
    from tasks.score import DEFAULT_GPU, GPU_PIECE_TASKS

    monkeypatch.setenv("FLYTE_INTERNAL_EXECUTION_ID", "f00ba4")
    job = ScoringJob("no-bundle-read", "no-data-read", "", "", "out")
    with pytest.raises(AcceleratorUnavailable, match=f"declared 1 x {DEFAULT_GPU.device} GPU"):
        GPU_PIECE_TASKS[framework].execute(job=job, piece=ScoringPiece(0, "part-0"))
