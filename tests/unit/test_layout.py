"""The layout's rules, read from the imports in the source: no import cycle, tasks/core free of Flyte and in
layers, and no module too long to hold in one's head."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

from tasks.plumbing.code_version import project_imports, source_path

REPO = Path(__file__).resolve().parents[2]
MODULES = sorted(
    ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
    for folder in ("tasks", "workflows")
    for path in (REPO / folder).rglob("*.py")
)
IMPORTS = {module: project_imports(module) - {module} for module in MODULES}
# tasks/core's packages (and its top-level modules), bottom to top, in the pipeline's order: a module
# imports only its own layer and those below it. The shared leaves first, the input checks that span
# every stage last.
LAYERS = (
    "tasks.core.messages",
    "tasks.core.strict_json",
    "tasks.core.accelerators",
    "tasks.core.data",
    "tasks.core.models",
    "tasks.core.planning",
    "tasks.core.training",
    "tasks.core.tuning",
    "tasks.core.bundle",
    "tasks.core.evaluation",
    "tasks.core.publish",
    "tasks.core.scoring",
    "tasks.core.validation",
)
MAX_LINES = 450
MAX_PARAMETERS = 7  # of a function, self and cls not counted: more is a config wanting its dataclass
MAX_BODY_LINES = 60  # of a function's body, its docstring included


def layer(module: str) -> int:
    """The index in LAYERS of the layer `module` belongs to; tasks.core's own __init__ is below them all."""
    if module == "tasks.core":
        return -1
    return next((i for i, name in enumerate(LAYERS) if module == name or module.startswith(name + ".")), None)


def upward_imports(imports: dict[str, set[str]]) -> list[str]:
    """Every import of a tasks/core module from one in a lower layer, as "importer -> imported"."""
    return [
        f"{module} -> {name}"
        for module, names in sorted(imports.items())
        if module.startswith("tasks.core")
        for name in sorted(names)
        if name.startswith("tasks.core") and layer(name) > layer(module)
    ]


def test_no_module_imports_itself_back_through_others():
    """Function-level imports count: a lazy import that closes a cycle still ties the two modules."""
    try:
        tuple(graphlib.TopologicalSorter(IMPORTS).static_order())
    except graphlib.CycleError as cycle:
        pytest.fail(f"import cycle: {' -> '.join(cycle.args[1])}")


def test_a_cycle_is_found_where_there_is_one():
    with pytest.raises(graphlib.CycleError):
        tuple(graphlib.TopologicalSorter({"a": {"b"}, "b": {"c"}, "c": {"a"}}).static_order())


def test_every_core_module_is_in_a_layer():
    """A new package of tasks/core takes its place in LAYERS."""
    assert all(layer(module) is not None for module in MODULES if module.startswith("tasks.core"))


def test_no_package_imports_one_above_it():
    """Function-level imports count: a lazy import upward ties the lower layer to the higher one all the same."""
    assert upward_imports(IMPORTS) == []


def test_an_upward_import_is_found_where_there_is_one():
    imports = {
        "tasks.core.data.reading": {"tasks.core.messages"},
        "tasks.core.models.plugins": {"tasks.core.training.config"},
        "tasks.core.scoring.plan": {"tasks.core.bundle.loading", "tasks.core.scoring.records"},
    }
    assert upward_imports(imports) == ["tasks.core.models.plugins -> tasks.core.training.config"]


def test_the_layers_count_function_level_imports():
    """`project_imports` reads imports anywhere in a module, a function body's included."""
    assert "tasks.core.models.keras_models" in project_imports("tasks.core.bundle.loading")


@pytest.mark.parametrize("module", MODULES)
def test_no_module_is_over_the_line_limit(module):
    """A module longer than MAX_LINES holds more than one thing: cut it where its parts divide."""
    lines = len(source_path(module).read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines, over {MAX_LINES}"


@pytest.mark.parametrize("module", [m for m in MODULES if m.startswith("tasks.core")])
def test_the_core_imports_only_the_core(module):
    """tasks/core runs where Flyte is not installed (a GPU machine, a user's notebook)."""
    outside = {name for name in IMPORTS[module] if not name.startswith("tasks.core")}
    assert not outside, f"{module} imports {sorted(outside)}"


def test_the_training_config_depends_only_on_leaves():
    """config crosses every task boundary: it imports the model spec it holds, the batch split rule and two
    helpers, no stage."""
    assert IMPORTS["tasks.core.training.config"] <= {
        "tasks.core.messages", "tasks.core.strict_json", "tasks.core.models.plugins", "tasks.core.planning.batches",
    }  # fmt: skip


def functions(source: str) -> list[tuple[str, int, int]]:
    """Each function (def or async def, nested ones too) as its name, its parameters but self and cls,
    and the lines of its body."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            named = [
                *arguments.posonlyargs,
                *arguments.args,
                *arguments.kwonlyargs,
                arguments.vararg,
                arguments.kwarg,
            ]
            parameters = [a.arg for a in named if a is not None and a.arg not in ("self", "cls")]
            found.append((node.name, len(parameters), node.end_lineno - node.body[0].lineno + 1))
    return found


def oversized(source: str, max_parameters: int = MAX_PARAMETERS) -> list[str]:
    return [
        f"{name}: {parameters} parameters, {lines} lines"
        for name, parameters, lines in functions(source)
        if parameters > max_parameters or lines > MAX_BODY_LINES
    ]


def parameter_limit(module: str) -> int:
    """A workflow's parameters are its command line, where flat flags for the common inputs are what a
    user types; every function under tasks/ keeps to MAX_PARAMETERS."""
    return MAX_PARAMETERS if module.startswith("tasks") else 10**6


@pytest.mark.parametrize("module", MODULES)
def test_no_function_takes_too_many_parameters_or_runs_too_long(module):
    """A function past MAX_PARAMETERS wants its inputs grouped in a config; one past MAX_BODY_LINES
    holds steps that want names of their own."""
    assert oversized(source_path(module).read_text(), parameter_limit(module)) == []


def test_an_oversized_function_is_found_where_there_is_one():
    long_body = "\n".join(f"    x{i} = {i}" for i in range(MAX_BODY_LINES + 1))
    source = (
        "class C:\n    def ok(self, a, b, c, d, e, f, g):\n        pass\n"
        "async def wide(a, b, c, d, e, f, g, *rest):\n    pass\n"
        f"def long():\n{long_body}\n"
    )
    assert oversized(source) == [
        f"wide: {MAX_PARAMETERS + 1} parameters, 1 lines",
        f"long: 0 parameters, {MAX_BODY_LINES + 1} lines",
    ]
