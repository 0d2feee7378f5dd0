"""tasks/plumbing/literal_types.py keeps each boundary dataclass's Flyte literal type once built, in a subclass
of flytekit's own dataclass transformer. These tests pin what that relies on in flytekit, so that an
upgrade which changes it fails here: the transformer is the one flytekit picks for each type, its
literal types are flytekit's own, and values convert to the same literals and back."""

from __future__ import annotations

import dataclasses
import types
import typing

import pytest
from flytekit import task
from flytekit.core.context_manager import FlyteContextManager
from flytekit.core.type_engine import DataclassTransformer, TypeEngine
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile
from flytekit.types.structured import StructuredDataset

import tasks.types  # noqa: F401 - registers the boundary types
from tasks.core.training.config import TrainConfig
from tasks.plumbing.literal_types import BOUNDARY_TYPES, TRANSFORMER, LiteralTypeOnce
from tasks.types import ResourcePlan

NAMES = [t.__name__ for t in BOUNDARY_TYPES]
# Remote locations: converting them copies nothing, so two conversions give the same literal.
REMOTE = {FlyteFile: lambda: FlyteFile("s3://bucket/model.pt"),
          FlyteDirectory: lambda: FlyteDirectory("s3://bucket/tensorboard"),
          StructuredDataset: lambda: StructuredDataset(uri="s3://bucket/train")}  # fmt: skip
SIMPLE = {int: 3, float: 0.25, str: "a", bool: True}


def sample(t):
    """A value of type `t`: a dataclass whose fields all have defaults is built from them (so the test
    follows its fields as they change), any other from a sample of each field."""
    if t in SIMPLE:
        return SIMPLE[t]
    if t in REMOTE:
        return REMOTE[t]()
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return sample(next(arg for arg in args if arg is not type(None)))
    if origin is list:
        return [sample(args[0])]
    if origin is dict:
        return {sample(args[0]): sample(args[1])}
    assert dataclasses.is_dataclass(t), f"no sample for {t}"
    fields = dataclasses.fields(t)
    if all(
        f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING for f in fields
    ):
        return t()
    hints = typing.get_type_hints(t)
    return t(**{f.name: sample(hints[f.name]) for f in fields if f.init})


@pytest.mark.parametrize("boundary_type", BOUNDARY_TYPES, ids=NAMES)
def test_flytekit_picks_our_transformer_for_each_boundary_type(boundary_type):
    assert TypeEngine.get_transformer(boundary_type) is TRANSFORMER
    assert isinstance(TRANSFORMER, LiteralTypeOnce) and isinstance(TRANSFORMER, DataclassTransformer)


@pytest.fixture
def builds(monkeypatch) -> list[type]:
    """The types flytekit's dataclass transformer builds a literal type for from now on."""
    built = []
    build = DataclassTransformer.get_literal_type

    def counted(transformer, t):
        built.append(t)
        return build(transformer, t)

    monkeypatch.setattr(DataclassTransformer, "get_literal_type", counted)
    return built


@pytest.mark.parametrize("boundary_type", BOUNDARY_TYPES, ids=NAMES)
def test_the_literal_type_is_flytekits_own_built_once(boundary_type, builds):
    TypeEngine.to_literal_type(boundary_type)
    builds.clear()

    ours = TypeEngine.to_literal_type(boundary_type)
    assert not builds, f"built again: {builds}"
    assert ours == DataclassTransformer().get_literal_type(boundary_type)
    assert ours.metadata and ours.structure.dataclass_type, "the schema and the fields' types are kept"


@pytest.mark.parametrize("boundary_type", BOUNDARY_TYPES, ids=NAMES)
def test_an_optional_boundary_type_leaves_the_kept_literal_type_whole(boundary_type):
    """flytekit's union transformer tags the variant's literal type in place (evaluate's plan is
    `ResourcePlan | None`); the tag must not replace the structure of the one kept."""
    optional = TypeEngine.to_literal_type(boundary_type | None)
    assert [variant.structure.tag for variant in optional.union_type.variants][0] == TRANSFORMER.name
    assert TypeEngine.to_literal_type(boundary_type) == DataclassTransformer().get_literal_type(boundary_type)


@pytest.mark.parametrize("boundary_type", BOUNDARY_TYPES, ids=NAMES)
def test_values_convert_as_with_flytekits_transformer_and_back(boundary_type):
    ctx = FlyteContextManager.current_context()
    value = sample(boundary_type)
    literal_type = TypeEngine.to_literal_type(boundary_type)

    literal = TypeEngine.to_literal(ctx, value, boundary_type, literal_type)
    assert literal == DataclassTransformer().to_literal(ctx, value, boundary_type, literal_type)
    back = TypeEngine.to_python_value(ctx, literal, boundary_type)
    assert type(back) is boundary_type
    assert TypeEngine.to_literal(ctx, back, boundary_type, literal_type) == literal


def test_task_interfaces_take_the_kept_literal_types(builds):
    """Interfaces ask the transformer for a type's literal type each time, which the cache answers."""
    TypeEngine.to_literal_type(TrainConfig), TypeEngine.to_literal_type(ResourcePlan)
    builds.clear()

    @task
    def plan_of(hyperparameters: TrainConfig, plan: ResourcePlan | None = None) -> ResourcePlan | None:
        return plan

    assert not builds, f"built again: {builds}"
    expected = DataclassTransformer().get_literal_type(TrainConfig)
    assert plan_of.interface.inputs["hyperparameters"].type == expected
