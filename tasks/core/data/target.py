"""What a run predicts: a class (classification) or a number (regression), decided from the label.

`auto` decides from the label's values: text and booleans are classes; numbers with a fractional part
are a quantity; whole numbers are classes when few distinct values repeat over many rows (digits,
ratings, codes), a quantity when they are many (prices, ages, counts). The decision and its reason go
into the report, so that a user can override it with an explicit `problem_type`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tasks.core.data.files import DatasetError

AUTO, CLASSIFICATION, REGRESSION = "auto", "classification", "regression"
PROBLEM_TYPES = (AUTO, CLASSIFICATION, REGRESSION)
# Whole-number labels are a quantity under `auto` when they hold more than this many distinct values
# and those are at least `DISTINCT_SHARE` of the rows: 10 digits over 1797 rows stay classes, 214
# values over 442 rows (or 3,000 prices over 100,000 rows) are a quantity.
MAX_AUTO_CLASSES = 20
DISTINCT_SHARE = 0.01
# A regression's split is stratified by this many quantile bins of the label, so that every split
# covers its range; fewer where the rows are few (at least `ROWS_PER_BIN` rows a bin).
QUANTILE_BINS = 10
ROWS_PER_BIN = 10


@dataclass
class Target:
    """What the label is to the model. For a regression, the train split's mean and (population)
    standard deviation of the label: the model learns the standardised label and answers in its units."""

    problem_type: str = CLASSIFICATION
    reason: str = ""  # why `auto` decided so, or that the user asked for it
    mean: float = 0.0
    std: float = 1.0

    @property
    def regression(self) -> bool:
        return self.problem_type == REGRESSION

    def standardised(self, values: np.ndarray) -> np.ndarray:
        return ((values - self.mean) / self.std).astype(np.float32)

    def in_label_units(self, outputs: np.ndarray) -> np.ndarray:
        return outputs.astype(np.float64) * self.std + self.mean

    def describe(self) -> str:
        return f"predicting a {'number' if self.regression else 'class'} ({self.problem_type}): {self.reason}"


def decide_problem_type(values: np.ndarray, requested: str, uri: str, label_column: str) -> Target:
    """The problem `requested` (auto, classification, regression) for labels `values` (the labelled
    rows), with its reason; a regression asked of labels that are not numbers is refused. `requested` is
    one of PROBLEM_TYPES: `SplitConfig` holds no other."""
    numeric = values.dtype.kind in "iuf"
    if requested == REGRESSION:
        if not numeric:
            kind = "booleans" if values.dtype.kind == "b" else "text"
            raise DatasetError(
                f"{uri}: problem_type='regression' needs a label of numbers, but label column "
                f"'{label_column}' holds {kind}; use problem_type='classification' (or 'auto')"
            )
        return Target(REGRESSION, "problem_type='regression' was asked for")
    if requested == CLASSIFICATION:
        return Target(CLASSIFICATION, "problem_type='classification' was asked for")
    return Target(*auto_decision(values, numeric))


def auto_decision(values: np.ndarray, numeric: bool) -> tuple[str, str]:
    if not numeric:
        kind = "booleans" if values.dtype.kind == "b" else "text"
        return CLASSIFICATION, f"auto: the label holds {kind}"
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    if values.dtype.kind == "f" and not np.all(np.mod(finite, 1) == 0):
        return REGRESSION, "auto: the label holds numbers with a fractional part"
    distinct, rows = len(np.unique(finite)), len(values)
    counted = f"{distinct:,} distinct whole numbers over {rows:,} rows"
    if distinct > MAX_AUTO_CLASSES and distinct >= DISTINCT_SHARE * rows:
        return REGRESSION, (
            f"auto: {counted} (more than {MAX_AUTO_CLASSES}, and at least {DISTINCT_SHARE:.0%} of the rows); "
            "set problem_type='classification' if they are classes"
        )
    return CLASSIFICATION, (
        f"auto: {counted} (at most {MAX_AUTO_CLASSES}, or under {DISTINCT_SHARE:.0%} of the rows); "
        "set problem_type='regression' if they are quantities"
    )


def regression_values(values: np.ndarray, uri: str, label_column: str) -> np.ndarray:
    """The labels as float64, refused where one is infinite: no mean or loss holds it."""
    numbers = values.astype(np.float64)
    infinite = np.flatnonzero(~np.isfinite(numbers))
    if len(infinite):
        raise DatasetError(
            f"{uri}: label column '{label_column}' has {len(infinite):,} infinite values; a regression "
            "needs finite labels: drop or fix those rows"
        )
    if len(numbers) and numbers.min() == numbers.max():
        raise DatasetError(
            f"{uri}: label column '{label_column}' holds a single value ({numbers[0]:g}); "
            "there is nothing to predict"
        )
    return numbers


def fitted_target(target: Target, train_values: np.ndarray, uri: str, label_column: str) -> Target:
    """`target` with the train split's mean and standard deviation of the label (regression only)."""
    if not target.regression:
        return target
    std = float(train_values.std())
    if not std > 0:
        raise DatasetError(
            f"{uri}: label column '{label_column}' is constant over the train split; "
            "a regression needs labels that vary"
        )
    return Target(target.problem_type, target.reason, float(train_values.mean()), std)


def quantile_bins(values: np.ndarray) -> np.ndarray:
    """Each value's quantile bin by rank (ties broken by row order), 0..bins-1: equal-sized strata
    however many values repeat."""
    bins = max(1, min(QUANTILE_BINS, len(values) // ROWS_PER_BIN))
    ranks = np.empty(len(values), dtype=np.int64)
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks * bins // max(len(values), 1)
