"""The Flyte literal types of the dataclasses that cross task boundaries, built once per process.

flytekit builds a dataclass's literal type (a JSON schema of the whole nested dataclass, plus a
literal type per field) again wherever an interface names it: for every task and workflow at import,
and again when a workflow or a dynamic runs. With these dataclasses at every task boundary, that was
most of the type engine's share of a local run. tasks/types.py registers them where it defines its
own, so every module that names a boundary type has them; values convert exactly as with flytekit's own dataclass transformer
(tests/unit/plumbing/test_literal_types.py pins what this relies on), except that the hyperparameters and the data input are
checked strictly on the way in (tests/unit/core/test_validation.py), the hyperparameters on the way out too.
"""

from __future__ import annotations

import copy
import json
import typing

import msgpack
from flytekit.core.context_manager import FlyteContext
from flytekit.core.type_engine import MESSAGEPACK, DataclassTransformer, DictTransformer, TypeEngine
from flytekit.models.literals import Literal
from flytekit.models.types import LiteralType
from google.protobuf import json_format

from tasks.core.data.config import DataConfig, decoded_data
from tasks.core.evaluation.compare import HardwareComparison, RunSummary
from tasks.core.messages import raise_for
from tasks.core.planning.planner import PreprocessPlan
from tasks.core.training.config import TrainConfig, hyperparameter_problems, parse_hyperparameters

# The core dataclasses that cross task boundaries; tasks/types.py adds its own (`register_boundary_types`).
# The dataclasses nested in these are built with them.
CORE_BOUNDARY_TYPES = (TrainConfig, DataConfig, PreprocessPlan, RunSummary, HardwareComparison)
# The inputs a user types, decoded strictly by their own parsers (flytekit's decoding drops unknown keys).
STRICT_PARSERS = {TrainConfig: parse_hyperparameters, DataConfig: decoded_data}


class LiteralTypeOnce(DataclassTransformer):
    """flytekit's dataclass transformer, keeping each type's literal type once built."""

    def __init__(self):
        super().__init__()
        self._literal_types: dict[type, LiteralType] = {}

    def get_literal_type(self, t: type) -> LiteralType:
        if t not in self._literal_types:
            self._literal_types[t] = super().get_literal_type(t)
        # A copy: flytekit's union transformer replaces the structure of the literal type it is given
        # (flytekit.core.type_engine._add_tag_to_type), which must not reach the one kept here.
        return copy.copy(self._literal_types[t])

    def to_literal(self, ctx: FlyteContext, python_val, python_type: type, expected: LiteralType) -> Literal:
        if python_type is TrainConfig:  # named here: encoding an integer past int64 fails with no name
            raise_for(hyperparameter_problems(python_val))
        return super().to_literal(ctx, python_val, python_type, expected)

    def to_python_value(self, ctx: FlyteContext, lv: Literal, expected_python_type: type):
        """The hyperparameters and the data input from their raw form, so that a literal from any source
        (the command line, a remote launch) is checked strictly rather than decoded leniently."""
        if parse := STRICT_PARSERS.get(expected_python_type):
            return parse(raw_value(lv))
        return super().to_python_value(ctx, lv, expected_python_type)


def raw_value(lv: Literal) -> object:
    """A dataclass literal as plain JSON values: msgpack bytes, or the older JSON struct."""
    binary = lv.scalar.binary
    if binary:
        if binary.tag != MESSAGEPACK:
            raise TypeError(f"unsupported binary format {binary.tag!r} for a dataclass literal")
        return msgpack.loads(binary.value, strict_map_key=False)
    return json.loads(json_format.MessageToJson(lv.scalar.generic))


TRANSFORMER = LiteralTypeOnce()
BOUNDARY_TYPES: list[type] = []  # as registered


def register_boundary_types(*task_types: type) -> None:
    """Every boundary dataclass, the core ones and `task_types`, converted by `TRANSFORMER`."""
    for boundary_type in (*task_types, *CORE_BOUNDARY_TYPES):
        TypeEngine.register_additional_type(TRANSFORMER, boundary_type)
        BOUNDARY_TYPES.append(boundary_type)


class WholeNumbersAsFloats(DictTransformer):
    """flytekit's dict transformer for `dict[str, float]` (the comparison's prices), taking a whole
    number as the float it means: flytekit refuses `{"cpu": 1}` for a float value."""

    async def async_to_literal(self, ctx, python_val, python_type, expected) -> Literal:
        if isinstance(python_val, dict):
            python_val = {
                key: float(value) if type(value) is int else value for key, value in python_val.items()
            }
        return await super().async_to_literal(ctx, python_val, python_type, expected)


# As a workflow declares it, and as flytekit rebuilds it from a registered interface.
for prices_type in (dict[str, float], typing.Dict[str, float]):  # noqa: UP006
    TypeEngine.register_additional_type(WholeNumbersAsFloats(), prices_type)
