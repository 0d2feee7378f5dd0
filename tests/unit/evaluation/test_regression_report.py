"""A regression's figures, its report and Deck, and its report crossing a task boundary."""

from __future__ import annotations

import numpy as np
import pytest
from flytekit import FlyteContextManager
from flytekit.core.type_engine import TypeEngine

from tasks.core.data.target import REGRESSION, Target
from tasks.core.evaluation.metrics import regression_metrics
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware, TrainingRun
from tasks.plumbing import decks
from tasks.types import EvaluationReport


def regression_report(predicted_noise: float = 0.3) -> EvaluationReport:
    rng = np.random.default_rng(0)
    actual = rng.normal(100.0, 20.0, 500)
    predicted = actual + rng.normal(0.0, 20.0 * predicted_noise, 500)
    run = TrainingRun("pytorch", "cpu", "cpu", 2, "gloo", "float32", "DDP", [], 1.0, 1.0, TrainConfig())
    return EvaluationReport(
        metrics=None, class_labels=[], training=run, billed=Hardware("cpu", 2), dataset="d",
        regression=regression_metrics(actual, predicted, train_mean=101.0),
        target=Target(REGRESSION, "auto: the label holds numbers with a fractional part", 101.0, 20.0),
    )  # fmt: skip


def test_the_figures_are_scikit_learns_beside_the_train_mean_s():
    actual, predicted = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.5, 2.0, 2.5, 5.0])
    metrics = regression_metrics(actual, predicted, train_mean=2.0)
    assert metrics.rmse == pytest.approx(np.sqrt((0.25 + 0 + 0.25 + 1) / 4))
    assert metrics.mae == pytest.approx(0.5) and metrics.r2 == pytest.approx(1 - 1.5 / 5)
    assert metrics.baseline_mae == pytest.approx(1.0) and metrics.baseline_r2 == pytest.approx(1 - 6 / 5)
    assert metrics.notes() == []
    assert "not below" in regression_metrics(actual, np.full(4, 9.0), train_mean=2.0).notes()[0]


def test_the_summary_says_what_was_predicted_and_shows_both_rows():
    summary = regression_report().summary()
    assert "predicting a number (regression): auto: the label holds numbers" in summary
    assert "RMSE" in summary and "R²" in summary and "baseline (the train mean)" in summary
    assert "accuracy" not in summary


def test_the_deck_shows_the_model_against_the_train_mean(monkeypatch):
    pages = {}
    monkeypatch.setattr(decks, "Deck", lambda name, html: pages.__setitem__(name, html))
    decks.evaluation_deck(regression_report())
    page = pages["Evaluation"]
    assert "Test metrics (regression)" in page and "train mean" in page and "confusion" not in page
    assert "<svg" not in page  # no rows, no charts
    actual = np.random.default_rng(1).normal(size=5_000)
    predicted = actual + 0.1
    predicted[3] = np.nan  # no answer: left out of the charts
    decks.evaluation_deck(regression_report(), (actual, predicted))
    charted = pages["Evaluation"]
    assert charted.count("<svg") == 2 and "predicted against actual" in charted and "residuals" in charted


def test_a_regression_report_crosses_a_task_boundary():
    ctx = FlyteContextManager.current_context()
    report = regression_report()
    literal_type = TypeEngine.to_literal_type(EvaluationReport)
    literal = TypeEngine.to_literal(ctx, report, EvaluationReport, literal_type)
    back = TypeEngine.to_python_value(ctx, literal, EvaluationReport)
    assert back.metrics is None and back.regression == report.regression and back.target == report.target
