"""Which project modules a module imports, read from the source, and a hash of the code a cache depends on."""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

PROJECT_PACKAGES = ("tasks", "workflows")
# Read as files, never imported: finding a module by import would run the modules above it.
ROOT = Path(__file__).resolve().parents[2]


def source_file(module: str) -> Path | None:
    path = ROOT.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def source_path(module: str) -> Path:
    if (path := source_file(module)) is None:
        raise ModuleNotFoundError(f"no source for project module {module!r} under {ROOT}")
    return path


def project_imports(module: str) -> set[str]:
    """The project modules `module` imports anywhere in its source, function bodies included."""
    found = set()
    for node in ast.walk(ast.parse(source_path(module).read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            found |= {name for name in submodules if source_file(name)} or {node.module}
    return {name for name in found if name.split(".")[0] in PROJECT_PACKAGES}


def imported_closure(*modules: str) -> set[str]:
    """`modules` and every project module they import, directly or not."""
    seen, todo = set(), list(modules)
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo += project_imports(module)
    return seen


def code_version(*modules: str) -> str:
    """A hash of these modules' source: editing any of them changes it."""
    digest = hashlib.sha256()
    for module in sorted(modules):
        digest.update(source_path(module).read_bytes())
    return digest.hexdigest()[:16]
