"""Checks on workflow inputs that run before any data is read or any accelerator is requested."""

from __future__ import annotations

import json
from collections.abc import Collection

from tasks.core.config import TrainConfig


class InputError(ValueError):
    """A workflow input that cannot work; the message names the input, the value and the fix."""


def hyperparameter_problems(config: TrainConfig) -> list[str]:
    defaults = TrainConfig()
    return [
        f"input 'hyperparameters.{name}' = {getattr(config, name)!r}: {rule}; "
        f"pass e.g. --hyperparameters '{json.dumps({name: getattr(defaults, name)}, default=vars)}'"
        for name, rule in config.problems().items()
    ]


def batch_problems(config: TrainConfig, world_size: int, train_rows: int) -> list[str]:
    """The batch against the workers it is split over and the training rows it is drawn from."""
    found = []
    per_step = world_size * config.grad_accum_steps
    if config.batch_size % per_step:
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


# The tpu target trains with TPUStrategy on its slice; any other strategy would leave the slice idle.
TPU_TARGET_STRATEGIES = ("auto", "tpu")


def tpu_target_problems(requested: str) -> list[str]:
    if requested in TPU_TARGET_STRATEGIES:
        return []
    return [
        f"input 'hyperparameters.tf_strategy' = {requested!r}: the tpu target trains with TPUStrategy on "
        f"its slice; pass 'auto' or 'tpu', or --target gpu-tf for {requested!r}"
    ]


def split_problems(val_fraction: float, test_fraction: float) -> list[str]:
    return [
        f"input '{name}' = {value!r}: must be between 0 and 0.5; pass e.g. --{name} 0.15"
        for name, value in (("val_fraction", val_fraction), ("test_fraction", test_fraction))
        if not 0 < value < 0.5
    ]


def problems(
    target: str,
    hyperparameters: TrainConfig,
    targets: Collection[str],
    val_fraction: float = 0.15,
    test_fraction: float = 0.15,
) -> list[str]:
    """Every bad input; `targets` are the valid target names (the table in tasks/targets.py)."""
    found = []
    if target not in targets:
        found.append(
            f"input 'target' = {target!r}: not one of {', '.join(targets)}; pass --target gpu or --target tpu"
        )
    if target == "tpu":
        found += tpu_target_problems(hyperparameters.tf_strategy)
    return found + hyperparameter_problems(hyperparameters) + split_problems(val_fraction, test_fraction)


def raise_for(found: list[str]) -> None:
    """Raise one InputError listing every bad input, so a user fixes them all at once."""
    if found:
        raise InputError("invalid workflow inputs:\n  " + "\n  ".join(found))
