"""Classification and regression metrics, computed by scikit-learn, whole or summed piece by piece."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.core.bundle.metric_records import ClassificationMetrics, ClassMetrics, RegressionMetrics


def classification_metrics(
    y_true: np.ndarray, y_pred: np.ndarray, class_labels: list[str]
) -> ClassificationMetrics:
    # Imported here: the result types travel to DDP workers, which never compute metrics.
    from sklearn.metrics import confusion_matrix

    codes = list(range(len(class_labels)))
    return metrics_from_confusion(confusion_matrix(y_true, y_pred, labels=codes), class_labels)


class ConfusionCounts:
    """The confusion counts (true class by row, predicted by column) added batch by batch: what a
    streamed scoring or evaluation holds instead of its rows."""

    def __init__(self, n_classes: int) -> None:
        self.counts = np.zeros((n_classes, n_classes), dtype=np.int64)

    def add(self, truth: np.ndarray, predicted: np.ndarray) -> None:
        """One batch's class codes, each in `range(n_classes)`."""
        n = len(self.counts)
        self.counts += np.bincount(truth * n + predicted, minlength=n * n).reshape(n, n)


def metrics_from_confusion(confusion: np.ndarray, class_labels: list[str]) -> ClassificationMetrics:
    """The metrics from the confusion counts (true class by row, predicted by column): what a streamed
    scoring sums piece by piece, each (true, predicted) pair weighted by its count."""
    from sklearn.metrics import f1_score, precision_recall_fscore_support

    codes = list(range(len(class_labels)))
    truth, predicted = (axis.ravel() for axis in np.indices(confusion.shape))
    weights = confusion.ravel()
    kept = weights > 0
    pairs = dict(y_true=truth[kept], y_pred=predicted[kept], labels=codes, sample_weight=weights[kept])
    precision, recall, f1, support = precision_recall_fscore_support(**pairs, zero_division=0)
    per_class = [
        ClassMetrics(label, float(p), float(r), float(f), int(s), int(n))
        for label, p, r, f, s, n in zip(
            class_labels, precision, recall, f1, support, confusion.sum(axis=0), strict=True
        )
    ]
    total = int(confusion.sum())
    present = support > 0
    return ClassificationMetrics(
        accuracy=float(np.trace(confusion) / total),
        macro_f1=float(f1_score(**pairs, average="macro", zero_division=0)),
        confusion_matrix=confusion.tolist(),
        per_class=per_class,
        n_test=total,
        balanced_accuracy=float(recall[present].mean()) if present.any() else 0.0,
        majority_accuracy=float(support.max() / total) if total else 0.0,
    )


def regression_metrics(
    actual: np.ndarray, predicted: np.ndarray, train_mean: float, non_finite_rows: int = 0
) -> RegressionMetrics:
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    baseline = np.full(len(actual), train_mean)

    def figures(answers: np.ndarray) -> tuple[float, float, float]:
        if len(actual) < 2:
            return 0.0, 0.0, 0.0  # no spread to measure; n_test says so
        rmse = float(np.sqrt(mean_squared_error(actual, answers)))
        return rmse, float(mean_absolute_error(actual, answers)), float(r2_score(actual, answers))

    return RegressionMetrics(*figures(predicted), *figures(baseline), len(actual), non_finite_rows)


@dataclass
class RegressionSums:
    """What `RegressionMetrics` are made of, as sums that pieces of a table add up exactly: rows, the
    labels' sum and sum of squares, and the squared and absolute errors of the model and of the
    train-mean baseline."""

    rows: int = 0
    label_sum: float = 0.0
    label_squares: float = 0.0
    squared_errors: float = 0.0
    absolute_errors: float = 0.0
    baseline_squared_errors: float = 0.0
    baseline_absolute_errors: float = 0.0

    @classmethod
    def of(cls, actual: np.ndarray, predicted: np.ndarray, train_mean: float) -> RegressionSums:
        errors, baseline = predicted - actual, train_mean - actual
        return cls(
            len(actual), float(actual.sum()), float(np.square(actual).sum()),
            float(np.square(errors).sum()), float(np.abs(errors).sum()),
            float(np.square(baseline).sum()), float(np.abs(baseline).sum()),
        )  # fmt: skip

    def merge(self, other: RegressionSums) -> RegressionSums:
        return RegressionSums(*(a + b for a, b in zip(self.as_tuple(), other.as_tuple(), strict=True)))

    def as_tuple(self) -> tuple:
        return (self.rows, self.label_sum, self.label_squares, self.squared_errors, self.absolute_errors,
                self.baseline_squared_errors, self.baseline_absolute_errors)  # fmt: skip

    def metrics(self, non_finite_rows: int = 0) -> RegressionMetrics:
        n = max(self.rows, 1)
        spread = self.label_squares - self.label_sum**2 / n  # the total sum of squares about the mean

        def figures(squared: float, absolute: float) -> tuple[float, float, float]:
            r2 = 1.0 - squared / spread if spread > 0 else 0.0
            return float(np.sqrt(squared / n)), absolute / n, r2

        model = figures(self.squared_errors, self.absolute_errors)
        baseline = figures(self.baseline_squared_errors, self.baseline_absolute_errors)
        return RegressionMetrics(*model, *baseline, self.rows, non_finite_rows)
