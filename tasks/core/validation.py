"""Checks on workflow inputs that run before any data is read or any accelerator is requested."""

from __future__ import annotations

import difflib
import json
from collections.abc import Collection, Mapping
from dataclasses import asdict
from typing import Protocol

from tasks.core.data.config import DataConfig, input_problems
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


def data_problems(data: DataConfig) -> list[str]:
    """The data input against its one table of rules (tasks/core/data/config.py)."""
    return input_problems(asdict(data))


def publish_problems(publish_to: str) -> list[str]:
    """Where the trained bundle is to be published, checked before training rather than after it: a
    local prefix that is a file or cannot be written, or a scheme no installed filesystem serves."""
    problem = prefix_problem(publish_to) if publish_to else ""
    return (
        [f"input 'publish_to' = {publish_to!r}: {problem}; pass e.g. --publish_to models/churn"]
        if problem
        else []
    )


class TargetRules(Protocol):
    """What validation asks of a training target (the table in tasks/targets.py)."""

    def config_problems(self, config: TrainConfig) -> list[str]: ...


def training_problems(
    target: str, hyperparameters: TrainConfig, targets: Mapping[str, TargetRules]
) -> list[str]:
    """Every bad input; `targets` is the targets table, each target with its own rules."""
    found = (
        targets[target].config_problems(hyperparameters)
        if target in targets
        else [target_problem(target, targets)]
    )
    return found + hyperparameter_problems(hyperparameters)


def target_problem(target: str, names: Collection[str]) -> str:
    suggestion = (difflib.get_close_matches(target, names, n=1) or list(names))[0]
    return f"input 'target' = {target!r}: not one of {', '.join(names)}; pass e.g. --target {suggestion}"


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
