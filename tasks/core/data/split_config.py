"""How a prepared table is split: the settings preprocessing takes and the table records. A leaf of the
data package, so a reader of prepared tables (serving, evaluation) need not load the split itself."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.core.data.files import DatasetError
from tasks.core.data.target import problem_type_problems

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
    # A column of dates, times or numbers to split by (`time_assignment`): the earliest rows train, the
    # latest test. Empty: a stratified random split.
    split_by: str = ""
    # What is predicted (tasks/core/data/target.py): it decides what the random split stratifies by,
    # the classes or the label's quantile bins.
    problem_type: str = "auto"

    def __post_init__(self) -> None:
        for name, value in bad_fractions(self.val_fraction, self.test_fraction).items():
            raise DatasetError(f"{name}={value} {FRACTION_RULE}")
        if problem_type_problems(self.problem_type):
            raise DatasetError(problem_type_problems(self.problem_type))
