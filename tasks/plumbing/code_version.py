"""Which project modules a module imports, read from the source, and a hash of the code a cache depends on;
the source hash and git commit of the code running here, for the provenance a model bundle records."""

from __future__ import annotations

import ast
import hashlib
import subprocess
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


def source_tree_hash(root: Path = ROOT) -> str:
    """sha256 of the project's sources, every .py file under tasks/ and workflows/: their names relative
    to `root` and their contents. It identifies the code wherever it runs, a checkout or an image."""
    digest = hashlib.sha256()
    for package in PROJECT_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def git_checkout(root: Path = ROOT) -> tuple[str, bool] | None:
    """The commit the checkout at `root` is at, and whether it has uncommitted changes (tracked, or
    untracked and not ignored); None where `root` is no git checkout (an image) or git cannot say."""
    if not (root / ".git").exists():
        return None
    try:
        commit = git(root, "rev-parse", "HEAD")
        changes = git(root, "status", "--porcelain", "--untracked-files=normal")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit, bool(changes)


def git(root: Path, *arguments: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *arguments], capture_output=True, text=True, check=True, timeout=30
    )
    return done.stdout.strip()
