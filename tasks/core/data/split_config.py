"""How a prepared table is split: the settings preprocessing takes and the table records, and their
rules. A leaf of the data package, so a reader of prepared tables (serving, evaluation) need not load
the split itself."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.core.data.files import DatasetError
from tasks.core.data.input_rules import InputRule, broken, described
from tasks.core.data.target import AUTO, PROBLEM_TYPES

# Each held-out split needs rows, and training keeps the most of them.
FRACTION_RULE = "must be between 0 and 0.5 (exclusive)"
MAX_SEED = 2**32 - 1  # numpy's


def fraction_rule(name: str) -> InputRule:
    return InputRule(name, lambda fields: "" if 0.0 < fields[name] < 0.5 else FRACTION_RULE, lambda _: 0.15)


# Each field's rule, on its value alone; `DataConfig` adds those that read other inputs.
SPLIT_RULES = (
    fraction_rule("val_fraction"),
    fraction_rule("test_fraction"),
    InputRule(
        "seed", lambda fields: "" if 0 <= fields["seed"] <= MAX_SEED else f"must be from 0 to {MAX_SEED:,}",
        lambda _: 0,
    ),
    InputRule(
        "problem_type",
        lambda fields: "" if fields["problem_type"] in PROBLEM_TYPES else f"not one of {', '.join(PROBLEM_TYPES)}",
        lambda _: AUTO,
    ),
)  # fmt: skip


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
    problem_type: str = AUTO

    def __post_init__(self) -> None:
        """Code that builds a split itself is refused here; a run's inputs are checked, by the same
        rules, before any data is read (`DataConfig`)."""
        found = broken(SPLIT_RULES, vars(self))
        if found:
            raise DatasetError("; ".join(described(vars(self), name, rule) for name, rule in found.items()))
