"""Checks on workflow inputs that run before any data is read or any accelerator is requested."""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Mapping
from typing import Protocol

from tasks.core.data.column_kinds import CATEGORICAL, DROP, KINDS
from tasks.core.data.prepare import EMBEDDED_DIGITS_LABEL
from tasks.core.data.split_config import FRACTION_RULE, bad_fractions
from tasks.core.data.target import problem_type_problems
from tasks.core.planning.batches import micro_batch
from tasks.core.publish.prefixes import prefix_problem
from tasks.core.training.config import TrainConfig, hyperparameter_problems


def batch_problems(config: TrainConfig, world_size: int, train_rows: int) -> list[str]:
    """The batch against the workers it is split over and the training rows it is drawn from."""
    found = []
    per_step = world_size * config.grad_accum_steps
    if micro_batch(config.batch_size, world_size, config.grad_accum_steps) is None:
        fits = max(per_step, config.batch_size // per_step * per_step)
        found.append(
            f"input 'hyperparameters.batch_size' = {config.batch_size}: does not split evenly over "
            f"{world_size} workers x {config.grad_accum_steps} accumulation steps; pass a multiple of "
            f"{per_step}, e.g. --hyperparameters '{json.dumps({'batch_size': fits})}'"
        )
    if config.batch_size > train_rows:
        found.append(
            f"input 'hyperparameters.batch_size' = {config.batch_size}: larger than the {train_rows:,} "
            f"training rows, so not one optimizer step fits in an epoch; pass at most {train_rows:,}"
        )
    return found


FORCED_KINDS = (*KINDS, DROP)  # what the column_kinds input may give a column


def column_kind_problems(column_kinds: Mapping[str, str]) -> list[str]:
    """Each forced kind must be one the preprocessing knows; whether the column exists and reads as that
    kind is preprocessing's to say, with the data."""
    return [
        f"input 'column_kinds[{name!r}]' = {kind!r}: not one of {', '.join(FORCED_KINDS)}; "
        f"pass e.g. --column_kinds '{json.dumps({name: CATEGORICAL})}'"
        for name, kind in column_kinds.items()
        if kind not in FORCED_KINDS
    ]


def publish_problems(publish_to: str) -> list[str]:
    """Where the trained bundle is to be published, checked before training rather than after it: a
    local prefix that is a file or cannot be written, or a scheme no installed filesystem serves."""
    problem = prefix_problem(publish_to) if publish_to else ""
    return (
        [f"input 'publish_to' = {publish_to!r}: {problem}; pass e.g. --publish_to models/churn"]
        if problem
        else []
    )


def split_problems(val_fraction: float, test_fraction: float) -> list[str]:
    return [
        f"input '{name}' = {value!r}: {FRACTION_RULE}; pass e.g. --{name} 0.15"
        for name, value in bad_fractions(val_fraction, test_fraction).items()
    ]


def split_by_problems(split_by: str, label_column: str) -> list[str]:
    """The column a time-ordered split goes by; its kind and values are checked when the data is read."""
    if split_by and split_by == label_column:
        return [
            f"input 'split_by' = {split_by!r}: is the label column; name a column of dates, times or "
            "numbers to split by, or leave it empty for a stratified random split"
        ]
    return []


def embedded_label_problems(dataset: str, label_column: str) -> list[str]:
    """Without a dataset the embedded digits are used, and their label column is fixed."""
    if dataset or label_column == EMBEDDED_DIGITS_LABEL:
        return []
    return [
        f"input 'label_column' = {label_column!r}: the embedded digits dataset has label column "
        f"'{EMBEDDED_DIGITS_LABEL}'; pass --label_column {EMBEDDED_DIGITS_LABEL}, or --dataset to use your own data"
    ]


class TargetRules(Protocol):
    """What validation asks of a training target (the table in tasks/targets.py)."""

    def config_problems(self, config: TrainConfig) -> list[str]: ...


def problems(
    target: str,
    hyperparameters: TrainConfig,
    targets: Mapping[str, TargetRules],
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
) -> list[str]:
    """Every bad input; `targets` is the targets table, each target with its own rules."""
    found = (
        targets[target].config_problems(hyperparameters)
        if target in targets
        else [target_problem(target, targets)]
    )
    return found + hyperparameter_problems(hyperparameters) + split_problems(val_fraction, test_fraction)


def target_problem(target: str, names: Collection[str]) -> str:
    suggestion = (difflib.get_close_matches(target, names, n=1) or list(names))[0]
    return f"input 'target' = {target!r}: not one of {', '.join(names)}; pass e.g. --target {suggestion}"


def problem_type_input_problems(problem_type: str) -> list[str]:
    problem = problem_type_problems(problem_type)
    return [f"input 'problem_type' = {problem_type!r}: {problem}"] if problem else []


def regression_problems(config: TrainConfig) -> list[str]:
    """Hyperparameters a regression cannot honour, checked once the prepared data says what is
    predicted and before any accelerator is requested."""
    found = []
    if config.selection_metric == "val_accuracy":
        found.append(
            "input 'hyperparameters.selection_metric' = 'val_accuracy': a regression has no accuracy; "
            "its epochs are chosen by val_loss (the mean squared error of the standardised label)"
        )
    if config.class_weight != "none":
        found.append(
            f"input 'hyperparameters.class_weight' = {config.class_weight!r}: a regression has no classes "
            "to weigh; leave it 'none'"
        )
    return found
