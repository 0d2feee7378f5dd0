"""The layout's rules, read from the imports in the source: no import cycle, and tasks/core free of Flyte."""

from __future__ import annotations

import graphlib
from pathlib import Path

import pytest

from tasks.plumbing.code_version import project_imports

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(
    ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    for folder in ("tasks", "workflows")
    for path in (REPO / folder).rglob("*.py")
)
IMPORTS = {module: project_imports(module) - {module} for module in MODULES}


def test_no_module_imports_itself_back_through_others():
    """Function-level imports count: a lazy import that closes a cycle still ties the two modules."""
    try:
        tuple(graphlib.TopologicalSorter(IMPORTS).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"import cycle: {' -> '.join(cycle.args[1])}")


def test_a_cycle_is_found_where_there_is_one():
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter({"a": {"b"}, "b": {"c"}, "c": {"a"}}).static_order())


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("tasks.core")])
def test_the_core_imports_only_the_core(module):
    """tasks/core runs where Flyte is not installed (a GPU machine, a user's notebook)."""
    outside = {name for name in IMPORTS[module] if not name.startswith("tasks.core")}
    assert not outside, f"{module} imports {sorted(outside)}"


def test_the_training_config_depends_only_on_leaves():
    """config crosses every task boundary: it imports the model spec it holds and two helpers, no stage."""
    assert IMPORTS["tasks.core.training.config"] <= {
        "tasks.core.messages", "tasks.core.strict_json", "tasks.core.models.plugins",
    }  # fmt: skip
