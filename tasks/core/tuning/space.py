"""The search space: what a study may vary, parsed from its JSON and checked, and a trial's values
applied to the run's TrainConfig.

The JSON is an object of keys, each a range or a list of choices:

    {"learning_rate": {"low": 1e-4, "high": 0.1, "log": true}, "batch_size": {"choices": [32, 64]},
     "epochs": {"low": 3, "high": 27}}

A key is a TrainConfig field, `model.<option>` for an option of the model's builder, or `width` and
`depth` for the built-in MLP (its `hidden_sizes`: `depth` layers of `width` units). `epochs` is the
budget: the first rung trains `low` epochs and the last `high` (tasks/core/tuning/rungs.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, replace

from tasks.core.training.config import TrainConfig

BUDGET = "epochs"
MLP_SHAPE = ("width", "depth")
MODEL_OPTION = "model."
# Fields a trial does not choose: the model is varied through its options, the rung sets the stop, and
# every trial stops where it diverges.
NOT_SEARCHED = ("model", "train_until_epoch", "on_divergence")
FIELD_TYPES = {
    f.name: type(f.default) for f in dataclasses.fields(TrainConfig) if f.name not in (*NOT_SEARCHED, BUDGET)
}
DEFAULT_SPACE = {
    "learning_rate": {"low": 1e-4, "high": 1e-1, "log": True},
    "batch_size": {"choices": [32, 64, 128, 256]},
    "width": {"choices": [16, 32, 64, 128, 256, 512]},
    "depth": {"low": 1, "high": 3},
    "dropout": {"low": 0.0, "high": 0.5},
    "weight_decay": {"low": 1e-6, "high": 1e-1, "log": True},
    "epochs": {"low": 3, "high": 27},
}
EXAMPLE = '{"learning_rate": {"low": 0.0001, "high": 0.1, "log": true}, "epochs": {"low": 3, "high": 27}}'


@dataclass
class Dimension:
    """One searched key: a range of `kind` "int" or "float" (`log`: sampled on a log scale), or choices."""

    key: str
    kind: str  # "int", "float" or "choice"
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    choices: list = field(default_factory=list)


@dataclass
class SearchSpace:
    dimensions: list[Dimension]
    min_epochs: int
    max_epochs: int


def space_json(text: str) -> dict:
    """The space as given: empty text means DEFAULT_SPACE; the dropout alias means the MLP's option."""
    raw = json.loads(text) if text.strip() else DEFAULT_SPACE
    if not isinstance(raw, dict):
        raise ValueError("the search space must be a JSON object")
    return {("model.dropout" if key == "dropout" else key): value for key, value in raw.items()}


def space_problems(text: str, base: TrainConfig) -> list[str]:
    """Every bad key of the space, each message naming it; empty when it can run."""
    try:
        raw = space_json(text)
    except ValueError as error:
        return [f"input 'search_space': {error}; pass e.g. --search_space '{EXAMPLE}'"]
    found = [problem for key, spec in raw.items() if (problem := key_problem(key, spec, base))]
    if BUDGET not in raw:
        found.append(
            f"input 'search_space' has no '{BUDGET}' key: the epoch budget, e.g. {{\"low\": 3, \"high\": 27}}"
        )
    return found


def key_problem(key: str, spec: object, base: TrainConfig) -> str:
    """What is wrong with one key of the space ("" if nothing)."""
    name = f"input 'search_space.{key}'"
    kind = key_kind(key, base)
    if kind is None:
        known = ", ".join([*FIELD_TYPES, BUDGET, *MLP_SHAPE, "model.<option>"])
        return f"{name}: unknown key; searchable keys: {known}"
    if kind.startswith("!"):
        return f"{name}: {kind[1:]}"
    rule = spec_rule(spec, kind, key == BUDGET)
    if not rule:
        rule = extremes_rule(key, dimension(key, spec, kind), base)
    return f"{name} = {json.dumps(spec)}: {rule}" if rule else ""


def key_kind(key: str, base: TrainConfig) -> str | None:
    """A known key's kind (int, float, str or any), "!" and the reason for one this model cannot search,
    None for an unknown key."""
    if key == BUDGET:
        return "int"
    if key in MLP_SHAPE:
        return (
            "int"
            if base.model.builder == "mlp"
            else f"!only for the built-in mlp, not {base.model.builder!r}"
        )
    if key.startswith(MODEL_OPTION) and len(key) > len(MODEL_OPTION):
        return "any"
    kind = FIELD_TYPES.get(key)
    return {int: "int", float: "float", str: "str"}.get(kind) if kind else None


def spec_rule(spec: object, kind: str, budget: bool) -> str:
    """The rule a key's range or choices break ("" if none)."""
    if not isinstance(spec, dict) or not ({"low", "high"} <= spec.keys() or "choices" in spec):
        return 'must be {"low": ..., "high": ...} (optionally "log": true) or {"choices": [...]}'
    if "choices" in spec:
        if budget:
            return 'the budget is a range of epochs: {"low": ..., "high": ...}'
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            return "empty choices: give at least one value"
        return (
            ""
            if kind in ("any", "str") or all(is_number(c, kind) for c in choices)
            else f"choices must be {kind}s"
        )
    low, high = spec["low"], spec["high"]
    if kind == "str" or not (is_number(low, kind) and is_number(high, kind)):
        return f"low and high must be {'numbers' if kind in ('any', 'float') else 'whole numbers'}"
    if low > high:
        return f"inverted range: low {low} is above high {high}"
    if low == high and not budget:
        return f"empty range: low and high are both {low}; fix the value in --hyperparameters instead"
    if budget and low < 1:
        return "the epoch budget must be positive: low at least 1"
    return "log scale needs low > 0" if spec.get("log") and low <= 0 else ""


def is_number(value: object, kind: str) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return False
    return kind != "int" or float(value).is_integer()


def dimension(key: str, spec: dict, kind: str) -> Dimension:
    if "choices" in spec:
        return Dimension(key, "choice", choices=list(spec["choices"]))
    number = "int" if kind == "int" else "float"
    return Dimension(key, number, spec["low"], spec["high"], bool(spec.get("log", False)))


def extremes_rule(key: str, dim: Dimension, base: TrainConfig) -> str:
    """The rule of TrainConfig (or the model's builder) a value at either end of the range, or a choice,
    breaks: found here, before a trial would fail on it."""
    if key == BUDGET:
        return ""
    values = dim.choices if dim.kind == "choice" else [dim.low, dim.high]
    for value in values:
        problems = apply_params(base, {key: value}).problems()
        if problems:
            field_name, rule = next(iter(problems.items()))
            return f"the value {value!r} gives {field_name} that {rule}"
    return ""


def parse_space(text: str, base: TrainConfig) -> SearchSpace:
    """The space, once `space_problems` found nothing."""
    raw = space_json(text)
    budget = raw[BUDGET]
    dims = [dimension(key, spec, key_kind(key, base)) for key, spec in raw.items() if key != BUDGET]
    return SearchSpace(dims, int(budget["low"]), int(budget["high"]))


def apply_params(base: TrainConfig, params: dict) -> TrainConfig:
    """The trial's config: `base` with the trial's values; `width` and `depth` shape the MLP."""
    fields = {key: cast(key, value) for key, value in params.items() if key in FIELD_TYPES}
    options = {
        key.removeprefix(MODEL_OPTION): option_value(value)
        for key, value in params.items()
        if key.startswith(MODEL_OPTION)
    }
    if any(key in params for key in MLP_SHAPE):
        current = str(base.model.options.get("hidden_sizes", "256,128")).split(",")
        width = int(params.get("width", current[0]))
        depth = int(params.get("depth", len(current)))
        options["hidden_sizes"] = ",".join([str(width)] * depth)
    model = replace(base.model, options={**base.model.options, **options}) if options else base.model
    return replace(base, **fields, model=model)


def cast(key: str, value):
    kind = FIELD_TYPES[key]
    return int(value) if kind is int else float(value) if kind is float else value


def option_value(value):
    """A builder option as ModelSpec holds it: numbers as floats, anything else as text."""
    return float(value) if is_number(value, "float") else str(value)
