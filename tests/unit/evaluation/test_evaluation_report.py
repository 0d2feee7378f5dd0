"""What the evaluation shows at any class count (the label warnings it carries: test_pipeline)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tasks.core.evaluation.metrics import classification_metrics
from tasks.core.training.config import TrainConfig
from tasks.core.training.records import Hardware, TrainingRun
from tasks.plumbing import decks
from tasks.types import EvaluationReport


@pytest.fixture
def deck_pages(monkeypatch) -> dict[str, str]:
    pages = {}
    monkeypatch.setattr(decks, "Deck", lambda name, html: pages.__setitem__(name, html))
    return pages


def texts(page: str) -> int:
    """Text elements drawn in the page's SVG charts (matplotlib draws glyphs as paths, one group each)."""
    return page.count('id="text_')


def report_for(classes: int, rows: int = 4000) -> EvaluationReport:
    rng = np.random.default_rng(0)
    truth = rng.integers(0, classes, rows)
    predicted = np.where(rng.random(rows) < 0.7, truth, rng.integers(0, classes, rows))
    labels = [f"class-{i}" for i in range(classes)]
    run = TrainingRun("pytorch", "cpu", "cpu", 2, "gloo", "float32", "DDP", [], 1.0, 1.0, TrainConfig())
    return EvaluationReport(
        metrics=classification_metrics(truth, predicted, labels), class_labels=labels, training=run,
        billed=Hardware("cpu", 2), dataset="d",
    )  # fmt: skip


def test_a_200_class_evaluation_deck_stays_small_and_lists_the_worst_confusions(deck_pages):
    decks.evaluation_deck(report_for(200))
    page = deck_pages["Evaluation"]
    assert len(page) < 1_500_000, f"{len(page):,} characters"  # a per-cell labelled chart was 6.5 MB
    assert texts(page) < 2_000  # no text per cell of the 40,000
    assert "predicted as" in page  # the most confused pairs, as a table


def test_a_small_confusion_matrix_still_shows_its_counts(deck_pages):
    report = report_for(4, rows=200)
    decks.evaluation_deck(report)
    for row in report.metrics.confusion_matrix:
        for count in row:
            assert f"<!-- {count} -->" in deck_pages["Evaluation"]  # matplotlib names each text it draws


def test_a_1000_class_summary_shows_the_weakest_classes_and_says_where_the_rest_are():
    report = report_for(1000, rows=20_000)
    lines = report.summary().splitlines()
    assert len(lines) < 40, f"{len(lines)} lines"
    f1 = {c.label: c.f1 for c in report.metrics.per_class}
    shown = [line.split()[0] for line in lines if line.split()[0] in f1]
    assert len(shown) == 20 and max(f1[label] for label in shown) <= sorted(f1.values())[19]
    assert lines[-1].startswith("(the 20 classes of lowest F1 of 1,000")
    assert repr(report).count("macro-F1") == 1


def test_a_small_summary_lists_every_class_in_order():
    report = report_for(10, rows=500)
    labels = [line.split()[0] for line in report.summary().splitlines()[-10:]]
    assert labels == report.class_labels


def test_a_model_no_better_than_the_majority_class_is_named_so_beside_its_balanced_accuracy():
    truth = np.array([0] * 99 + [1])
    metrics = classification_metrics(truth, np.zeros(100, dtype=int), ["ok", "fraud"])
    assert (metrics.accuracy, metrics.majority_accuracy, metrics.balanced_accuracy) == (0.99, 0.99, 0.5)
    (note,) = metrics.notes()
    assert note.startswith("accuracy 0.9900 is not above 0.9900, what always answering the most frequent")
    assert "('ok')" in note and "balanced accuracy 0.5000" in note


def test_a_weighted_model_below_the_majority_class_is_judged_by_balanced_accuracy():
    """Class weighting trades the frequent class's rows for the rare one's: accuracy falls below always
    answering the frequent class while balanced accuracy rises far above a constant answer's 0.5."""
    truth = np.array([0] * 90 + [1] * 10)
    predicted = np.array([0] * 80 + [1] * 10 + [1] * 9 + [0])
    metrics = classification_metrics(truth, predicted, ["ok", "fraud"])
    assert metrics.accuracy == 0.89 and metrics.majority_accuracy == 0.9
    (note,) = metrics.notes()
    assert "has not learned" not in note
    assert f"balanced accuracy {metrics.balanced_accuracy:.4f} is above the 0.5000" in note
    assert note.endswith(f"judge it by balanced accuracy or macro-F1 ({metrics.macro_f1:.4f})")


def test_a_model_above_the_majority_class_gets_no_note_and_its_balanced_accuracy_is_the_mean_recall():
    truth = np.array([0] * 6 + [1] * 3 + [2])
    predicted = np.array([0] * 5 + [1] + [1] * 3 + [2])
    metrics = classification_metrics(truth, predicted, ["a", "b", "c"])
    assert metrics.notes() == [] and metrics.majority_accuracy == 0.6
    assert metrics.balanced_accuracy == pytest.approx((5 / 6 + 1 + 1) / 3)
    report = report_for(3, rows=300)
    assert f"balanced accuracy: {report.metrics.balanced_accuracy:.4f}  macro-F1" in report.summary()


@pytest.mark.parametrize("class_weight, shown", [("balanced", True), ("none", False)])
def test_the_summary_names_a_class_weighting_only_where_one_was_used(class_weight, shown):
    report = report_for(3, rows=90)
    report.training = replace(report.training, config=TrainConfig(class_weight=class_weight))
    assert ("class weights: balanced" in report.summary()) is shown
