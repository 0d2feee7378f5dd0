"""Checks on workflow inputs that run before any data is read or any accelerator is requested."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import types
import typing
from collections.abc import Collection, Mapping

from tasks.core.config import TrainConfig, micro_batch
from tasks.core.data import EMBEDDED_DIGITS_LABEL, FRACTION_RULE, bad_fractions
from tasks.core.models import ModelSpec


class InputError(ValueError):
    """A workflow input that cannot work; the message names the input, the value and the fix."""


# ---- the hyperparameters JSON, as the command line and a remote launch deliver it ----------------------

# An object of each nested config, for messages about a value of the wrong form.
EXAMPLES = {
    TrainConfig: '{"epochs": 5, "batch_size": 128}',
    ModelSpec: '{"builder": "cnn", "input_shape": "1x8x8", "options": {"channels": [32, 64]}}',
}
TYPE_NAMES = {int: "a whole number", float: "a number", str: "a string"}


def parse_hyperparameters(raw: object) -> TrainConfig:
    """The config from its JSON form, strictly: an unknown field, a value of the wrong type or one its
    rules refuse is an InputError naming it (flytekit's own decoding drops unknown keys and coerces
    2.7 to 2). A list of numbers among the model's options means the same as their comma-separated
    form."""
    raw = with_option_lists_joined(raw)
    raise_for(shape_problems(raw, TrainConfig, "hyperparameters"))
    config = build(TrainConfig, raw)
    # The values too: an integer past int64 could not even be carried to the first task.
    raise_for(hyperparameter_problems(config))
    return config


def with_option_lists_joined(raw: object) -> object:
    model = raw.get("model") if isinstance(raw, dict) else None
    options = model.get("options") if isinstance(model, dict) else None
    if not isinstance(options, dict):
        return raw
    joined = {
        name: join_numbers(value) if is_number_list(value) else value for name, value in options.items()
    }
    return {**raw, "model": {**model, "options": joined}}


def is_number_list(value: object) -> bool:
    return isinstance(value, list) and all(fits(item, float) for item in value)


def join_numbers(values: list) -> str:
    return ",".join(str(int(value)) if float(value).is_integer() else str(value) for value in values)


def shape_problems(raw: object, cls: type, path: str) -> list[str]:
    """Unknown fields and values of the wrong type in `raw`, the JSON form of dataclass `cls`."""
    if not isinstance(raw, dict):
        return [f"input '{path}' = {raw!r}: expected an object, e.g. {EXAMPLES[cls]}"]
    hints = typing.get_type_hints(cls)
    found = [unknown_field(path, name, hints) for name in raw if name not in hints]
    for name, value in raw.items():
        if name in hints:
            found += value_problems(value, hints[name], f"{path}.{name}")
    return found


def unknown_field(path: str, name: str, hints: Collection[str]) -> str:
    close = difflib.get_close_matches(str(name), hints, n=1)
    guess = f"did you mean '{close[0]}'? " if close else ""
    return f"input '{path}.{name}': unknown field; {guess}known fields: {', '.join(hints)}"


def value_problems(value: object, hint: object, path: str) -> list[str]:
    if dataclasses.is_dataclass(hint):
        return shape_problems(value, hint, path)
    if typing.get_origin(hint) is dict:
        if not isinstance(value, dict):
            return [f"input '{path}' = {value!r}: expected an object of names to values"]
        return [
            found
            for key, item in value.items()
            for found in value_problems(item, typing.get_args(hint)[1], f"{path}.{key}")
        ]
    if any(fits(value, accepted) for accepted in args(hint)):
        return []
    expected = " or ".join(TYPE_NAMES[accepted] for accepted in args(hint))
    if isinstance(value, list) and float in args(hint):
        expected += ", or a list of numbers such as [64, 32]"
    return [f"input '{path}' = {json.dumps(value)}: expected {expected}"]


def args(hint: object) -> tuple:
    """The types a field accepts: those of a union, else the type itself."""
    return typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)


def fits(value: object, accepted: type) -> bool:
    if isinstance(value, bool):  # JSON's true is not the number 1
        return accepted is bool
    if accepted is int:  # a whole float too: a JSON literal carries every number as a float
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if accepted is float:
        return isinstance(value, int | float)
    return isinstance(value, accepted)


def build(cls: type, raw: dict):
    hints = typing.get_type_hints(cls)
    return cls(**{name: convert(value, hints[name]) for name, value in raw.items()})


def convert(value: object, hint: object) -> object:
    if dataclasses.is_dataclass(hint):
        return build(hint, value)
    if typing.get_origin(hint) is dict:
        return {key: convert(item, typing.get_args(hint)[1]) for key, item in value.items()}
    if hint is int:
        return int(value)
    return float(value) if isinstance(value, int | float) and float in args(hint) else value


# ---- checks on the decoded inputs --------------------------------------------------------------------


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
        f"input '{name}' = {value!r}: {FRACTION_RULE}; pass e.g. --{name} 0.15"
        for name, value in bad_fractions(val_fraction, test_fraction).items()
    ]


def embedded_label_problems(dataset: str, label_column: str) -> list[str]:
    """Without a dataset the embedded digits are used, and their label column is fixed."""
    if dataset or label_column == EMBEDDED_DIGITS_LABEL:
        return []
    return [
        f"input 'label_column' = {label_column!r}: the embedded digits dataset has label column "
        f"'{EMBEDDED_DIGITS_LABEL}'; pass --label_column {EMBEDDED_DIGITS_LABEL}, or --dataset to use your own data"
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


def price_problems(prices: Mapping[str, float]) -> list[str]:
    """A price is USD per accelerator-hour: a finite number >= 0 (a whole number too)."""
    return [
        f"input 'prices[{name!r}]' = {price!r}: must be a finite number >= 0 (USD per accelerator-hour); "
        f"pass e.g. --prices '{json.dumps({name: 1.5})}'"
        for name, price in prices.items()
        if isinstance(price, bool) or not isinstance(price, int | float) or not 0 <= price < math.inf
    ]


def raise_for(found: list[str]) -> None:
    """Raise one InputError listing every bad input, so a user fixes them all at once."""
    if found:
        raise InputError("invalid workflow inputs:\n  " + "\n  ".join(found))
