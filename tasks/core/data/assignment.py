"""Which split (train, val, test) each row goes to: stratified, seeded and checked for size."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tasks.core.data.files import DatasetError
from tasks.core.data.labels import looks_continuous
from tasks.core.messages import preview, shorten

SPLITS = ("train", "val", "test")
UNLABELLED = 255  # in an assignment, a row in no split: its label is missing
# Each held-out split needs rows, and training keeps the most of them.
FRACTION_RULE = "must be between 0 and 0.5 (exclusive)"


def bad_fractions(val_fraction: float, test_fraction: float) -> dict[str, float]:
    """The held-out fractions that break `FRACTION_RULE`, by name."""
    fractions = {"val_fraction": val_fraction, "test_fraction": test_fraction}
    return {name: value for name, value in fractions.items() if not 0.0 < value < 0.5}


@dataclass
class SplitConfig:
    val_fraction: float = 0.15
    test_fraction: float = 0.15
    seed: int = 0

    def __post_init__(self) -> None:
        for name, value in bad_fractions(self.val_fraction, self.test_fraction).items():
            raise DatasetError(f"{name}={value} {FRACTION_RULE}")


def check_split_sizes(
    codes: np.ndarray, class_labels: list[str], split: SplitConfig, uri: str, label_column: str
) -> None:
    counts = np.bincount(codes, minlength=len(class_labels))
    too_rare = [
        f"{shorten(repr(class_labels[i]))} ({counts[i]} rows)" for i in np.flatnonzero(counts < len(SPLITS))
    ]
    hint = ""
    if looks_continuous(class_labels):
        hint = (
            f"; label column '{label_column}' looks continuous ({len(class_labels):,} distinct numbers), "
            "but mixedml trains classifiers: the label must be a column of classes"
        )
    if too_rare:
        raise DatasetError(
            f"{uri}: too few rows for a stratified train/val/test split: {len(too_rare):,} of "
            f"{len(class_labels):,} classes have fewer than {len(SPLITS)} rows: {preview(too_rare)}{hint}"
        )
    for name, rows in split_rows(len(codes), split).items():
        if rows < len(class_labels):
            fix = "lower val_fraction or test_fraction" if name == "train" else f"raise {name}_fraction"
            raise DatasetError(
                f"{uri}: too few rows for the split: {split_setting(codes, class_labels, split)} leave "
                f"{rows} {name} rows for {len(class_labels):,} classes; each split needs a row of every "
                f"class: add rows or {fix}{hint}"
            )


def split_setting(codes: np.ndarray, class_labels: list[str], split: SplitConfig) -> str:
    counts = np.bincount(codes, minlength=len(class_labels))
    by_class = preview([f"{label!r}: {n}" for label, n in zip(class_labels, counts, strict=True)])
    return (
        f"{len(codes)} rows (per class: {by_class}) with val_fraction={split.val_fraction} "
        f"and test_fraction={split.test_fraction}"
    )


def checked_assignment(
    codes: np.ndarray, class_labels: list[str], split: SplitConfig, uri: str
) -> np.ndarray:
    """`assign_splits`, refused when the train split lacks a class: scikit-learn refuses some such
    splits in its own words (a rare class left one row for the second draw) and draws others."""
    setting = split_setting(codes, class_labels, split)
    try:
        assignment = assign_splits(codes, split)
    except ValueError as err:
        raise DatasetError(  # scikit-learn's own message names the class by its code
            f"{uri}: no stratified split of {setting}: the test split leaves a rare class a single row "
            "to share between train and val; add rows of the rare classes or lower test_fraction"
        ) from err
    missing = np.setdiff1d(np.arange(len(class_labels)), codes[assignment == SPLITS.index("train")])
    if len(missing):  # a model never shown a class cannot predict it
        raise DatasetError(
            f"{uri}: the train split of {setting} has no row of class "
            f"{preview([repr(class_labels[i]) for i in missing])}; add rows of that class or "
            "lower val_fraction and test_fraction"
        )
    return assignment


def val_share(split: SplitConfig) -> float:
    """The val split's share of the rows left once the test split is taken out."""
    return split.val_fraction / (1.0 - split.test_fraction)


def split_rows(n_rows: int, split: SplitConfig) -> dict[str, int]:
    """Rows each split is sure to get from `assign_splits`: scikit-learn's train_test_split rounds
    a held-out split up, so its fraction rounded down is a lower bound, and train gets the rest."""
    test = math.ceil(split.test_fraction * n_rows)
    val = math.ceil(val_share(split) * (n_rows - test))
    return {
        "val": math.floor(split.val_fraction * n_rows),
        "test": math.floor(split.test_fraction * n_rows),
        "train": n_rows - test - val,
    }


def assign_splits(codes: np.ndarray, split: SplitConfig) -> np.ndarray:
    """Deterministic stratified assignment: 0 = train, 1 = val, 2 = test, one byte per row."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(len(codes))
    rest, test = train_test_split(
        rows, test_size=split.test_fraction, stratify=codes, random_state=split.seed
    )
    _, val = train_test_split(rest, test_size=val_share(split), stratify=codes[rest], random_state=split.seed)
    assignment = np.zeros(len(codes), dtype=np.uint8)
    assignment[val] = 1
    assignment[test] = 2
    return assignment
