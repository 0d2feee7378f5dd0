"""The Flyte literal types of the dataclasses that cross task boundaries, built once per process.

flytekit builds a dataclass's literal type (a JSON schema of the whole nested dataclass, plus a
literal type per field) again wherever an interface names it: for every task and workflow at import,
and again when a workflow or a dynamic runs. With these dataclasses at every task boundary, that was
most of the type engine's share of a local run. Task modules import this module before they define
their tasks; values convert exactly as with flytekit's own dataclass transformer
(tests/test_literal_types.py pins what this relies on).
"""

from __future__ import annotations

import copy

from flytekit.core.type_engine import DataclassTransformer, TypeEngine
from flytekit.models.types import LiteralType

from tasks.core.compare import HardwareComparison, RunSummary
from tasks.core.config import TrainConfig
from tasks.core.planner import PreprocessPlan
from tasks.types import EvaluationReport, PreparedData, ResourcePlan, TrainedModel

# The dataclasses nested in these are built with them.
BOUNDARY_TYPES = (PreparedData, TrainedModel, ResourcePlan, EvaluationReport, TrainConfig, PreprocessPlan,
                  RunSummary, HardwareComparison)  # fmt: skip


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


def build_literal_types_once(types: tuple[type, ...]) -> LiteralTypeOnce:
    transformer = LiteralTypeOnce()
    for boundary_type in types:
        TypeEngine.register_additional_type(transformer, boundary_type)
    return transformer


TRANSFORMER = build_literal_types_once(BOUNDARY_TYPES)
