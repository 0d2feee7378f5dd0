"""target.py: what is predicted: the `auto` decision and its reason, the refusals, the quantile bins a
regression is stratified by, and a regression's label standardised on the train rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tasks.core.data.assignment import SplitConfig
from tasks.core.data.files import DatasetError
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
