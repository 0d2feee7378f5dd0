"""Both framework halves provide what `tasks.core.models.plugins.FrameworkModels` says they provide, with the
same parameters, so that the checks, the planner and the built-ins call either alike."""

from __future__ import annotations

import inspect

import pytest

from tasks.core.models.plugins import FRAMEWORK_MODULES, FRAMEWORKS, FrameworkModels, framework_module

FUNCTIONS = sorted(
    name
    for name, value in vars(FrameworkModels).items()
    if inspect.isfunction(value) and not name.startswith("_")
)


def parameters(function) -> list[str]:
    return [name for name in inspect.signature(function).parameters if name != "self"]


def test_the_protocol_names_the_functions_the_checks_call():
    assert set(FRAMEWORK_MODULES) == set(FRAMEWORKS)
    assert {"is_model", "trainable_count", "probe_logits", "footprint", "mlp", "cnn"} <= set(FUNCTIONS)
    assert "MODEL_TYPE" in FrameworkModels.__annotations__


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_each_framework_half_provides_every_function_with_the_protocols_parameters(framework):
    half = framework_module(framework)
    assert isinstance(half.MODEL_TYPE, str) and half.MODEL_TYPE
    for name in FUNCTIONS:
        provided = getattr(half, name, None)
        assert callable(provided), f"{half.__name__} lacks {name}"
        expected = parameters(vars(FrameworkModels)[name])
        assert parameters(provided) == expected, f"{half.__name__}.{name}{inspect.signature(provided)}"
