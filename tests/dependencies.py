"""Which installed distributions a module needs, and which an install command provides.

Both are computed from source and package metadata, so the Dockerfile can be checked without
building it.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata as metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tasks.plumbing.code_version import source_file as module_file

REPO = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = {"tasks", "workflows"}
# Builds of one framework that import under the same name; this machine has the CPU build.
SAME_FRAMEWORK = {"tensorflow": "tensorflow-cpu", "tensorflow-tpu": "tensorflow-cpu"}


def canonical(name: str) -> str:
    name = canonicalize_name(name)
    return SAME_FRAMEWORK.get(name, name)


def optional_imports(tree: ast.AST) -> set[int]:
    """ids of import nodes inside `try` blocks that handle their absence (ImportError/Exception)."""
    optional = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            handled = {getattr(h.type, "id", None) for h in node.handlers}
            if handled & {"ImportError", "ModuleNotFoundError", "Exception"}:
                optional |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return optional


def imported_modules(path: Path) -> set[str]:
    """Every module imported anywhere in the file, function bodies included, unless the import
    sits in a `try` that copes with the module being absent."""
    found = set()
    tree = ast.parse(path.read_text())
    skip = optional_imports(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def third_party_imports(module: str) -> set[str]:
    """Top-level third-party import names reachable from `module` through project imports."""
    seen, pending, external = set(), [module], set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        path = module_file(current)
        if path is None:
            continue
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top in PROJECT_PACKAGES:
                pending.append(name)
            elif top not in sys.stdlib_module_names and top != "__future__":
                external.add(top if top != "flytekitplugins" else name)
    return external


@functools.cache
def installed_distributions() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distributions_for(import_name: str) -> set[str]:
    if import_name.startswith("flytekitplugins."):
        return {canonical("flytekitplugins-" + import_name.split(".")[1])}
    return {canonical(d) for d in installed_distributions().get(import_name, [])}


def requirement_closure(requirements: list[str]) -> set[str]:
    return set(cached_closure(tuple(requirements)))


@functools.cache
def cached_closure(requirements: tuple[str, ...]) -> frozenset[str]:
    """Distributions installed by `pip install <requirements>`, from the metadata on this machine."""
    closure, pending = set(), [Requirement(r) for r in requirements]

    while pending:
        requirement = pending.pop()
        name = canonical(requirement.name)
        key = (name, tuple(sorted(requirement.extras)))
        if key in closure:
            continue
        closure.add(key)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in requires:
            dependency = Requirement(line)
            environments = [{"extra": extra} for extra in requirement.extras] or [{"extra": ""}]
            if dependency.marker is None or any(dependency.marker.evaluate(env) for env in environments):
                pending.append(dependency)
    return frozenset(name for name, _ in closure)


def project_requirements(extras: list[str]) -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"])
    for extra in extras:
        requirements += project["optional-dependencies"][extra]
    return requirements
