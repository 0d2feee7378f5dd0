"""The test split's figures, as a bundle's manifest records them once evaluation adds them: the record
types alone; tasks/core/evaluation/metrics.py computes them."""

from __future__ import annotations

from dataclasses import dataclass


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
