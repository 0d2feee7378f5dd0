"""What is predicted: the `auto` decision, the refusals, and a regression's prepared splits."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.files import DatasetError
from tasks.core.data.pieces import prepare_in_pieces
from tasks.core.data.prepare import prepare_dataset
from tasks.core.data.splits import read_split
from tasks.core.data.target import CLASSIFICATION, REGRESSION, decide_problem_type, quantile_bins


def decided(values, requested="auto") -> str:
    return decide_problem_type(np.asarray(values), requested, "data.csv", "y").problem_type


def test_auto_decides_from_the_label():
    rows = np.random.default_rng(0).integers(0, 300, size=442)
    assert decided(np.array(["a", "b"] * 50)) == CLASSIFICATION
    assert decided(np.array([True, False] * 50)) == CLASSIFICATION
    assert decided(np.linspace(0, 1, 100)) == REGRESSION  # fractional numbers
    assert decided(rows) == REGRESSION  # many distinct whole numbers
    assert decided(np.arange(1797) % 10) == CLASSIFICATION  # digits
    assert decided((np.arange(100_000) % 200).astype(float)) == CLASSIFICATION  # 200 values, 0.2% of rows
    assert decided(rows, "classification") == CLASSIFICATION


def test_the_decision_says_why():
    target = decide_problem_type(np.arange(442) % 214, "auto", "data.csv", "y")
    assert "214 distinct whole numbers over 442 rows" in target.reason
    assert "problem_type='classification'" in target.reason


def test_regression_on_text_or_booleans_is_refused():
    for values, kind in ((np.array(["a", "b"]), "text"), (np.array([True, False]), "booleans")):
        with pytest.raises(DatasetError, match=f"regression.*holds {kind}"):
            decided(values, "regression")
    with pytest.raises(DatasetError, match="not one of auto, classification, regression"):
        SplitConfig(problem_type="numbers")


def test_quantile_bins_are_equal_sized_even_with_ties():
    bins = quantile_bins(np.r_[np.zeros(50), np.arange(50)])
    assert np.bincount(bins).tolist() == [10] * 10


@pytest.fixture(scope="module")
def diabetes(tmp_path_factory) -> str:
    from sklearn.datasets import load_diabetes

    frame = load_diabetes(as_frame=True).frame
    path = tmp_path_factory.mktemp("diabetes") / "diabetes.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return str(path)


def test_a_regression_split_holds_the_standardised_label_fitted_on_train(diabetes, tmp_path):
    prepared = prepare_dataset(diabetes, "target", str(tmp_path), SplitConfig())
    table, frame = prepared.table, pd.read_parquet(diabetes)
    assert table.target.regression and table.class_labels == [] and table.n_outputs == 1
    assert prepared.split_paths().n_outputs == 1 and prepared.split_paths().n_classes == 0
    assert sum(table.rows.values()) == 442
    _, train_y = read_split(prepared.paths["train"], table.feature_names, "target")
    assert train_y.dtype == np.float32
    assert abs(train_y.mean()) < 1e-5 and train_y.std() == pytest.approx(1.0, abs=1e-5)
    test = pd.read_parquet(prepared.paths["test"])
    assert set(test["target"]).issubset(set(frame["target"]))  # the raw test split keeps the label as read
    # Stratified by quantile bins: the test split spans the label's range.
    assert (
        test["target"].min()
        < frame["target"].quantile(0.1)
        < frame["target"].quantile(0.9)
        < test["target"].max()
    )


def test_pieces_give_what_one_pod_gives_for_a_regression(diabetes, tmp_path):
    frame = pd.read_parquet(diabetes)
    folder = tmp_path / "parts"
    folder.mkdir()
    for index, rows in enumerate(np.array_split(np.arange(len(frame)), 3)):
        frame.iloc[rows].to_parquet(folder / f"part-{index}.parquet", index=False)
    split = SplitConfig(problem_type="regression")
    one_pod = prepare_dataset(str(folder), "target", str(tmp_path / "one"), split)
    pieces = prepare_in_pieces(str(folder), "target", str(tmp_path / "pieces"), split, 3)
    assert pieces.table.target == one_pod.table.target and pieces.table.rows == one_pod.table.rows
    for name in ("train", "val"):
        expected = read_split(one_pod.paths[name], one_pod.table.feature_names, "target")
        got = read_split(pieces.paths[name], pieces.table.feature_names, "target")
        np.testing.assert_array_equal(expected[1], got[1])
        np.testing.assert_allclose(expected[0], got[0], atol=1e-6)


def test_a_classification_of_the_same_table_is_refused_as_before_but_hints_at_regression(diabetes, tmp_path):
    with pytest.raises(DatasetError, match="problem_type='regression'"):
        prepare_dataset(diabetes, "target", str(tmp_path), SplitConfig(problem_type="classification"))


def test_a_csv_regression_split_by_time_gives_the_same_splits_in_pieces(tmp_path):
    rng = np.random.default_rng(4)
    rows = 600
    frame = pd.DataFrame({
        "day": pd.date_range("2024-01-01", periods=rows, freq="D").strftime("%Y-%m-%d"),
        "x": rng.normal(size=rows),
        "price": rng.integers(100, 5_000, rows),  # whole numbers, many distinct: a regression under auto
    })  # fmt: skip
    folder = tmp_path / "csv"
    folder.mkdir()
    for index, part in enumerate(np.array_split(np.arange(rows), 3)):
        frame.iloc[part].to_csv(folder / f"part-{index}.csv", index=False)
    split = SplitConfig(split_by="day")
    one_pod = prepare_dataset(str(folder), "price", str(tmp_path / "one"), split)
    pieces = prepare_in_pieces(str(folder), "price", str(tmp_path / "pieces"), split, 3)
    table = one_pod.table
    assert table.target.regression and table.label_kind == "integer" and pieces.table.target == table.target
    assert any("split by 'day'" in note for note in table.notes)
    test = pd.read_parquet(one_pod.paths["test"])
    assert sorted(test["price"]) == sorted(frame["price"].iloc[-len(test) :])  # the latest rows test
    for name in ("train", "val"):
        expected = read_split(one_pod.paths[name], table.feature_names, "price")[1]
        np.testing.assert_array_equal(
            expected, read_split(pieces.paths[name], table.feature_names, "price")[1]
        )
