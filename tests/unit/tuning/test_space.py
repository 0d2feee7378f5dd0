"""The search space: parsed, checked key by key, and applied to a trial's TrainConfig."""

from __future__ import annotations

import json

import pytest

from tasks.core.models.plugins import ModelSpec
from tasks.core.training.config import TrainConfig
from tasks.core.tuning.checks import tuning_problems
from tasks.core.tuning.space import DEFAULT_SPACE, apply_params, parse_space, space_problems
from tasks.core.tuning.study import TuningSettings

BUDGET = {"epochs": {"low": 1, "high": 3}}


def problems_of(space: dict, base: TrainConfig | None = None) -> list[str]:
    return space_problems(json.dumps({**BUDGET, **space}), base or TrainConfig())


def test_the_default_space_is_valid_and_searches_the_mlp_and_the_optimizer():
    assert space_problems("", TrainConfig()) == []
    space = parse_space("", TrainConfig())
    assert {d.key for d in space.dimensions} == {
        "learning_rate", "batch_size", "width", "depth", "model.dropout", "weight_decay",
    }  # fmt: skip
    assert (space.min_epochs, space.max_epochs) == (3, 27)
    learning_rate = next(d for d in space.dimensions if d.key == "learning_rate")
    assert learning_rate.log and learning_rate.kind == "float"
    assert DEFAULT_SPACE["epochs"] == {"low": 3, "high": 27}


@pytest.mark.parametrize(
    "space, key, words",
    [
        ({"learnin_rate": {"low": 0.1, "high": 1}}, "search_space.learnin_rate", "unknown key"),
        ({"learning_rate": {"low": 0.1, "high": 0.01}}, "search_space.learning_rate", "inverted range"),
        ({"weight_decay": {"low": 0.1, "high": 0.1}}, "search_space.weight_decay", "empty range"),
        ({"batch_size": {"choices": []}}, "search_space.batch_size", "empty choices"),
        ({"batch_size": {"low": 8.5, "high": 64}}, "search_space.batch_size", "whole numbers"),
        ({"learning_rate": {"low": 0, "high": 1, "log": True}}, "search_space.learning_rate", "log scale"),
        ({"epochs": {"low": 0, "high": 3}}, "search_space.epochs", "must be positive"),
        ({"epochs": {"low": 5, "high": 3}}, "search_space.epochs", "inverted range"),
        ({"batch_size": {"choices": [0, 64]}}, "search_space.batch_size", "the value 0"),
        ({"lr_schedule": {"choices": ["cosine", "linear"]}}, "search_space.lr_schedule", "'linear'"),
    ],
)
def test_a_bad_key_is_refused_by_name(space, key, words):
    found = problems_of(space)
    assert len(found) == 1 and f"'{key}'" in found[0] and words in found[0], found


def test_a_space_without_a_budget_is_refused():
    found = space_problems('{"learning_rate": {"low": 0.001, "high": 0.1}}', TrainConfig())
    assert len(found) == 1 and "'epochs'" in found[0]


def test_width_and_depth_are_for_the_mlp_alone():
    cnn = TrainConfig(model=ModelSpec("cnn", "1x8x8"))
    found = problems_of({"width": {"choices": [16]}}, cnn)
    assert len(found) == 1 and "'search_space.width'" in found[0] and "mlp" in found[0]


def test_a_trials_values_shape_its_config():
    base = TrainConfig(model=ModelSpec("mlp", options={"hidden_sizes": "32,16"}))
    config = apply_params(base, {"learning_rate": 0.01, "batch_size": 32, "width": 64, "model.dropout": 0.3})
    assert config.learning_rate == 0.01 and config.batch_size == 32
    assert config.model.options == {"hidden_sizes": "64,64", "dropout": 0.3}
    assert apply_params(base, {"depth": 3}).model.options["hidden_sizes"] == "32,32,32"
    assert base.model.options == {"hidden_sizes": "32,16"}  # the base is left as it was


@pytest.mark.parametrize(
    "settings, problem_type, key",
    [
        (TuningSettings(trials=4, concurrency=5), "auto", "'concurrency'"),
        (TuningSettings(trials=0, concurrency=1), "auto", "'trials'"),
        (TuningSettings(trials=4, concurrency=0), "auto", "'concurrency'"),
        (TuningSettings(reduction_factor=1), "auto", "'reduction_factor'"),
        (TuningSettings(metric="val_rmse"), "classification", "'metric'"),
        (TuningSettings(metric="val_macro_f1"), "regression", "'metric'"),
        (TuningSettings(metric="f1"), "auto", "'metric'"),
    ],
)
def test_bad_settings_are_refused_by_name(settings, problem_type, key):
    found = tuning_problems(settings, TrainConfig(), problem_type)
    assert len(found) == 1 and key in found[0], found
