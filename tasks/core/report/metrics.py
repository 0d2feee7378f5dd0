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


# Balanced accuracy within this of a constant answer's counts as nothing learned beyond the class balance.
CHANCE_MARGIN = 0.02


@dataclass
class ClassificationMetrics:
    accuracy: float
    macro_f1: float
    confusion_matrix: list[list[int]]
    per_class: list[ClassMetrics]
    n_test: int  # the rows scored: those with finite model outputs
    non_finite_rows: int = 0  # rows left out: the model's outputs were not finite (overflowed logits)
    balanced_accuracy: float = 0.0  # the mean of the recalls of the classes these rows hold
    majority_accuracy: float = 0.0  # what always answering the most frequent class of these rows scores

    def notes(self) -> list[str]:
        found = []
        if self.non_finite_rows:
            found.append(
                f"{self.non_finite_rows:,} rows had non-finite model outputs (overflowed logits): "
                "they have no prediction and are left out of these metrics"
            )
        if self.n_test and self.per_class and self.accuracy <= self.majority_accuracy:
            found.append(self.majority_note())
        return found

    @property
    def constant_balanced_accuracy(self) -> float:
        """What always answering one class scores in balanced accuracy: 1 / the classes these rows hold."""
        return 1 / max(1, sum(1 for c in self.per_class if c.support))

    def majority_note(self) -> str:
        """Accuracy no better than the most frequent class's: a model that learned nothing, or one that
        trades that class's rows for the others' (class weighting asks for that), which balanced
        accuracy tells apart."""
        majority = max(self.per_class, key=lambda c: c.support).label
        compared = (
            f"accuracy {self.accuracy:.4f} is not above {self.majority_accuracy:.4f}, what always "
            f"answering the most frequent class ({majority!r}) scores on these rows"
        )
        if self.balanced_accuracy <= self.constant_balanced_accuracy + CHANCE_MARGIN:
            return (
                f"{compared}: the model has not learned more than the class balance "
                f"(balanced accuracy {self.balanced_accuracy:.4f})"
            )
        return (
            f"{compared}, but its balanced accuracy {self.balanced_accuracy:.4f} is above the "
            f"{self.constant_balanced_accuracy:.4f} of any constant answer: it answers the other classes at "
            f"the frequent one's expense, as class weighting asks; judge it by balanced accuracy or "
            f"macro-F1 ({self.macro_f1:.4f})"
        )


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


@dataclass
class RegressionMetrics:
    """A regression's test figures, in the label's units, beside those of the baseline that always
    answers the train split's mean: a model that learned nothing scores about the baseline's."""

    rmse: float
    mae: float
    r2: float
    baseline_rmse: float
    baseline_mae: float
    baseline_r2: float
    n_test: int  # the rows scored: those with a finite prediction
    non_finite_rows: int = 0

    def notes(self) -> list[str]:
        found = []
        if self.non_finite_rows:
            found.append(
                f"{self.non_finite_rows:,} rows had non-finite model outputs: they have no prediction and "
                "are left out of these metrics"
            )
        if self.n_test and self.rmse >= self.baseline_rmse:
            found.append(
                f"RMSE {self.rmse:.4g} is not below {self.baseline_rmse:.4g}, what always answering the train "
                "mean scores on these rows: the model has not learned more than the label's average"
            )
        return found


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
