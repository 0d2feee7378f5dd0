"""Classification metrics, computed by scikit-learn."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ClassMetrics:
    label: str
    precision: float
    recall: float
    f1: float
    support: int
    predicted: int


@dataclass
class ClassificationMetrics:
    accuracy: float
    macro_f1: float
    confusion_matrix: list[list[int]]
    per_class: list[ClassMetrics]
    n_test: int


def classification_metrics(
    y_true: np.ndarray, y_pred: np.ndarray, class_labels: list[str]
) -> ClassificationMetrics:
    # Imported here: the result types travel to DDP workers, which never compute metrics.
    from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, precision_recall_fscore_support

    codes = list(range(len(class_labels)))
    precision, recall, f1, support = precision_recall_fscore_support(
        y_true, y_pred, labels=codes, zero_division=0
    )
    predicted = np.bincount(y_pred, minlength=len(codes))
    per_class = [
        ClassMetrics(label, float(p), float(r), float(f), int(s), int(n))
        for label, p, r, f, s, n in zip(class_labels, precision, recall, f1, support, predicted, strict=True)
    ]
    return ClassificationMetrics(
        accuracy=float(accuracy_score(y_true, y_pred)),
        macro_f1=float(f1_score(y_true, y_pred, labels=codes, average="macro", zero_division=0)),
        confusion_matrix=confusion_matrix(y_true, y_pred, labels=codes).tolist(),
        per_class=per_class,
        n_test=len(y_true),
    )
