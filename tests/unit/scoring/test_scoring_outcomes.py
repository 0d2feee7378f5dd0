"""What batch scoring answers and leaves behind: a row whose model outputs are not finite gets no answer
and no place in the metrics; a label column that is a feature is refused; probability columns renamed
beside an earlier scoring's are named; a failed scoring leaves no parts, and its rerun into the same
folder succeeds, while a folder of other files is still refused. The input files are never changed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from tasks.core.bundle.loading import Bundle, load_bundle
from tasks.core.data.files import DatasetError
from tasks.core.evaluation.metrics import classification_metrics
from tasks.core.evaluation.split_metrics import split_metrics
from tasks.core.scoring.piece import score_piece
from tasks.core.scoring.plan import plan_scoring
from tasks.core.scoring.records import UNFINISHED
from tasks.core.scoring.run import score_dataset
from tests.conftest import blobs_frame
from tests.floats import assert_scored_alike
from tests.unit.publish.test_publish import CLASSES, write_test_bundle

PROBABILITIES = [f"probability_{label}" for label in CLASSES]
PART_ROWS = (120, 80, 100)


@pytest.fixture(scope="module")
def bundle_folder(tmp_path_factory) -> str:
    return write_test_bundle(tmp_path_factory.mktemp("outcomes") / "bundle", seed=3)


def users(rows: int = sum(PART_ROWS)) -> pd.DataFrame:
    frame = blobs_frame(n_rows=rows, n_classes=3, seed=5)
    return frame.assign(customer_id=[f"c{i:04d}" for i in range(rows)])


def write_parts(folder: Path, frame: pd.DataFrame) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    starts = np.cumsum((0, *PART_ROWS))
    for index, (start, end) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        frame.iloc[start:end].to_parquet(folder / f"part-{index}.parquet", index=False)
    return folder


def file_bytes(path: Path) -> dict[str, bytes]:
    files = sorted(path.rglob("*")) if path.is_dir() else [path]
    return {str(file): file.read_bytes() for file in files if file.is_file()}


def names_in(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


# ---- non-finite model outputs ---------------------------------------------------------------------------

OVERFLOW_ROWS = [3, 17, 40, 41, 42, 43, 44]
HUGE = 1e6  # a raw f0 far outside training's range: the patched model overflows on it


@pytest.fixture
def overflowing_model(monkeypatch):
    """The model's logits overflow to infinity for rows whose f0 is huge: softmax gives NaN there."""
    forward = Bundle.logits

    def logits(self, inputs: np.ndarray) -> np.ndarray:
        out = forward(self, inputs)
        out[inputs[:, 0] > HUGE / 100] = np.inf
        return out

    monkeypatch.setattr(Bundle, "logits", logits)


def test_a_row_whose_model_outputs_are_not_finite_gets_a_null_answer_outside_the_metrics(
    bundle_folder, overflowing_model, tmp_path
):
    frame = users()
    frame.loc[OVERFLOW_ROWS, "f0"] = HUGE
    source = tmp_path / "users.parquet"
    frame.to_parquet(source, index=False)
    before = file_bytes(source)
    report = score_dataset(bundle_folder, str(source), str(tmp_path / "predictions"))
    predictions = pq.read_table(tmp_path / "predictions").to_pandas()
    void = predictions.index.isin(OVERFLOW_ROWS)
    assert predictions.loc[void, "prediction"].isna().all()
    assert predictions.loc[void, PROBABILITIES].isna().all().all()
    assert predictions.loc[~void, "prediction"].notna().all()
    np.testing.assert_allclose(predictions.loc[~void, PROBABILITIES].sum(axis=1), 1.0, atol=1e-5)
    assert predictions["customer_id"].tolist() == frame["customer_id"].tolist()
    answered = predictions[~void]
    truth = answered["species"].map(CLASSES.index).to_numpy()
    assert report.metrics == classification_metrics(
        truth, answered["prediction"].map(CLASSES.index).to_numpy(), CLASSES
    )
    assert report.non_finite_rows == len(OVERFLOW_ROWS) and report.metrics.n_test == len(frame) - 7
    note = next(note for note in report.notes if "not finite" in note)
    assert note.startswith("7 rows") and "users.parquet row 3, users.parquet row 17" in note
    assert "row 43" not in note, "the note names the first few rows only"
    assert file_bytes(source) == before


def test_evaluation_leaves_rows_with_non_finite_outputs_out_of_its_metrics_and_says_so(
    bundle_folder, overflowing_model, tmp_path
):
    frame = users()
    frame.loc[OVERFLOW_ROWS, "f0"] = HUGE
    split = frame.assign(species=frame["species"].map(CLASSES.index)).drop(columns="customer_id")
    split.to_parquet(tmp_path / "test.parquet", index=False)  # a test split: raw features, class codes
    bundle = load_bundle(bundle_folder)
    metrics = split_metrics(bundle, str(tmp_path / "test.parquet"), "species", CLASSES)
    answered = ~split.index.isin(OVERFLOW_ROWS)
    expected = bundle.predict(frame[answered]).tolist()
    assert metrics == replace(
        classification_metrics(split["species"][answered].to_numpy(), [CLASSES.index(p) for p in expected],
                               CLASSES),
        non_finite_rows=len(OVERFLOW_ROWS),
    )  # fmt: skip
    assert metrics.notes() and metrics.notes()[0].startswith("7 rows had non-finite model outputs")


# ---- the label column and the output's column names -----------------------------------------------------


def test_a_label_column_that_is_a_feature_is_refused_naming_it_before_the_parts_are_read(
    bundle_folder, tmp_path
):
    dataset = write_parts(tmp_path / "users.parquet", users())
    (dataset / "part-2.parquet").write_bytes(b"not parquet: never read")
    before = file_bytes(dataset)
    with pytest.raises(DatasetError, match="label column 'f2' is a feature the model reads"):
        score_dataset(bundle_folder, str(dataset), str(tmp_path / "predictions"), label_column="f2")
    assert file_bytes(dataset) == before
    assert not (tmp_path / "predictions").exists()


def test_probability_columns_renamed_beside_an_earlier_scorings_are_named_in_the_report(
    bundle_folder, tmp_path
):
    earlier = users().assign(probability_setosa=0.5, probability_virginica=0.25)
    source = tmp_path / "scored.parquet"
    earlier.to_parquet(source, index=False)
    report = score_dataset(bundle_folder, str(source), str(tmp_path / "predictions"))
    predictions = pq.read_table(tmp_path / "predictions").to_pandas()
    assert report.probability_columns["setosa"] == "probability_setosa_2"
    assert report.probability_columns["versicolor"] == "probability_versicolor"
    assert predictions["probability_setosa"].eq(0.5).all(), "the earlier column passes through"
    note = next(note for note in report.notes if "already has columns" in note)
    assert "probability_setosa_2 (not probability_setosa)" in note
    assert "probability_virginica_2 (not probability_virginica)" in note and "versicolor" not in note


# ---- a failed scoring and its rerun ---------------------------------------------------------------------


def with_inf_in_the_second_part(frame: pd.DataFrame) -> pd.DataFrame:
    broken = frame.copy()
    broken.loc[PART_ROWS[0] + 11, "f3"] = np.inf
    return broken


def test_a_failed_scoring_removes_its_parts_and_the_fixed_rerun_fills_the_same_folder(
    bundle_folder, tmp_path
):
    dataset, output = tmp_path / "users.parquet", tmp_path / "predictions"
    write_parts(dataset, with_inf_in_the_second_part(users()))
    before = file_bytes(dataset)
    with pytest.raises(DatasetError, match="part-1.parquet: feature column 'f3'"):
        score_dataset(bundle_folder, str(dataset), str(output))
    assert file_bytes(dataset) == before
    assert not output.exists() or names_in(output) == []
    write_parts(dataset, users())
    report = score_dataset(bundle_folder, str(dataset), str(output))
    assert report.rows == sum(PART_ROWS)
    assert names_in(output) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]


def test_a_rerun_replaces_the_parts_of_a_scoring_whose_pieces_failed_elsewhere(bundle_folder, tmp_path):
    """As on Flyte, where each piece runs in its own pod: the first piece's part stays when the second
    fails, beside the plan's unfinished mark. The rerun replaces them; a finished scoring clears the mark."""
    dataset, output = tmp_path / "users.parquet", tmp_path / "predictions"
    write_parts(dataset, with_inf_in_the_second_part(users()))
    plan = plan_scoring(bundle_folder, str(dataset), str(output))
    score_piece(plan.job, plan.pieces[0])
    with pytest.raises(DatasetError, match="part-1.parquet"):
        score_piece(plan.job, plan.pieces[1])
    assert names_in(output) == [UNFINISHED, "part-00000.parquet"]
    write_parts(dataset, users())
    report = score_dataset(bundle_folder, str(dataset), str(output))
    assert report.rows == sum(PART_ROWS)
    assert names_in(output) == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    predictions = pq.read_table(output).to_pandas()
    assert_scored_alike(
        predictions[PROBABILITIES].to_numpy(), load_bundle(bundle_folder).predict_proba(users())
    )


OTHER_FILES = {
    "a stranger's part": ["part-00000.parquet"],
    "a finished scoring": ["part-00000.parquet", "part-00001.parquet"],
    "an unfinished mark beside other files": [UNFINISHED, "part-00000.parquet", "notes.txt"],
    "an unfinished scoring of another dataset": [UNFINISHED, "part-00000.parquet"],
    "an unfinished mark in a subfolder": [f"day=1/{UNFINISHED}", "day=1/part-00000.parquet"],
}


@pytest.mark.parametrize("case", list(OTHER_FILES))
def test_an_output_folder_holding_other_files_is_still_refused_and_left_as_it_was(
    case, bundle_folder, tmp_path
):
    dataset = write_parts(tmp_path / "users.parquet", users())
    output = tmp_path / "predictions"
    for name in OTHER_FILES[case]:
        (output / name).parent.mkdir(parents=True, exist_ok=True)
        (output / name).write_bytes(b"someone else's")
    before = file_bytes(output)
    with pytest.raises(DatasetError, match="predictions: the output folder already holds files"):
        score_dataset(bundle_folder, str(dataset), str(output))
    assert file_bytes(output) == before


def test_a_scoring_whose_accuracy_is_no_better_than_the_majority_class_says_so(bundle_folder, tmp_path):
    frame = users().assign(species=CLASSES[0])  # one class only: always answering it is right
    source = tmp_path / "users.parquet"
    frame.to_parquet(source, index=False)
    report = score_dataset(bundle_folder, str(source), str(tmp_path / "predictions"))
    assert report.metrics.majority_accuracy == 1.0
    note = next(note for note in report.notes if "most frequent class" in note)
    assert f"({CLASSES[0]!r})" in note
    assert f"balanced accuracy: {report.metrics.balanced_accuracy:.4f}" in report.summary()
