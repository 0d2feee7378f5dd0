"""The epoch log and the Training Deck's learning curves, for a classification and for a regression."""

from __future__ import annotations

import logging

import pytest

from tasks.core.training.progress import log_epoch
from tasks.core.training.records import EpochMetrics
from tasks.plumbing.decks import learning_curves

HISTORY = [EpochMetrics(1, 0.9, 0.6, 0.8, 0.65), EpochMetrics(2, 0.5, 0.8, 0.6, 0.75)]


@pytest.mark.parametrize(
    "regression, shown, absent",
    [(False, ["train accuracy", "val accuracy", "cross-entropy"], ["squared error"]),
     (True, ["squared error of the standardised label", "train loss"], ["accuracy"])],
)  # fmt: skip
def test_a_regression_s_curves_show_its_squared_error_and_no_accuracy(regression, shown, absent):
    page = learning_curves(HISTORY, regression)
    assert all(text in page for text in shown)
    assert not any(text in page for text in absent)


def test_a_regression_s_epoch_line_names_its_squared_errors_and_no_accuracy(caplog):
    with caplog.at_level(logging.INFO, logger="tasks.core.training.progress"):
        log_epoch(HISTORY[1], 5, regression=True)
        log_epoch(HISTORY[1], 5)
    regression_line, classification_line = (record.getMessage() for record in caplog.records)
    assert regression_line == "epoch 2/5 train_mse=0.5000 val_mse=0.6000"
    assert "train_acc=0.8000" in classification_line and "val_acc=0.7500" in classification_line
