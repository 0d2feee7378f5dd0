"""`make register`'s version names the tree it registers: flyteadmin refuses a changed entity under a
version it already has, so a new commit or a new uncommitted change must get a new version."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.dependencies import REPO

# Marked up to date, so `make register` neither needs nor builds the virtualenv.
STAMP = ".venv/.installed"


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A git repository holding this Makefile and the image table it reads, committed, with no git
    configuration from outside."""
    root = tmp_path / "checkout"
    (root / "tasks").mkdir(parents=True)
    shutil.copy(REPO / "Makefile", root / "Makefile")
    for module in ("__init__.py", "images.py"):
        shutil.copy(REPO / "tasks" / module, root / "tasks" / module)
    (root / "train.py").write_text("epochs = 1\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return root


def environment(root: Path) -> dict[str, str]:
    return os.environ | {
        "GIT_CEILING_DIRECTORIES": str(root.parent),  # no repository above the checkout is found
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "test", "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "test", "GIT_COMMITTER_EMAIL": "test@example.com",
    }  # fmt: skip


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, env=environment(root), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def register(root: Path, *make_args: str) -> tuple[str, set[str]]:
    """The version `make register` passes and the image tags it names, from a dry run."""
    command = ["make", "-n", "-o", STAMP, "register", *make_args]
    done = subprocess.run(command, cwd=root, env=environment(root), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.replace("\\\n", " ").splitlines()  # continued lines joined
    (command,) = [line for line in lines if " register workflows " in line]
    return re.search(r"--version (\S+)", command).group(1), set(
        re.findall(r"--image [\w-]+=\S+:(\S+)", command)
    )


def test_a_clean_tree_registers_under_its_commit_and_tags_its_images_alike(checkout):
    version, tags = register(checkout)
    assert version == git(checkout, "rev-parse", "--short=12", "HEAD")
    assert tags == {version}


def test_uncommitted_changes_get_a_version_of_their_own_the_same_for_the_same_changes(checkout):
    clean, _ = register(checkout)
    (checkout / "train.py").write_text("epochs = 2\n")
    dirty, tags = register(checkout)
    assert dirty.startswith(f"{clean}-dirty-") and tags == {dirty}
    assert register(checkout)[0] == dirty  # the same tree, the same version

    (checkout / "train.py").write_text("epochs = 3\n")
    other = register(checkout)[0]
    (checkout / "new_model.py").write_text("width = 8\n")  # an untracked file is part of the tree
    with_new_file = register(checkout)[0]
    assert len({dirty, other, with_new_file}) == 3

    (checkout / "new_model.py").unlink()
    (checkout / "train.py").write_text("epochs = 1\n")
    assert register(checkout)[0] == clean


def test_a_new_commit_gets_a_new_version_and_an_explicit_one_wins(checkout):
    first, _ = register(checkout)
    (checkout / "train.py").write_text("epochs = 2\n")
    git(checkout, "commit", "-q", "-am", "second")
    assert register(checkout)[0] not in (first, "") and "dirty" not in register(checkout)[0]
    assert register(checkout, "VERSION=v7", "TAG=images-1") == ("v7", {"images-1"})


def test_register_refuses_without_a_commit_to_name_the_version_after(tmp_path):
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    done = subprocess.run(
        ["make", "-o", STAMP, "register"],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "no git commit to name the version after; pass VERSION=" in done.stderr


def test_the_planners_extra_options_register_under_a_version_of_their_own(checkout):
    """They reach the tasks' containers without changing the tree: the same tree registered with other
    options must not reuse the version, which flyteadmin would refuse. The images keep the tree's tag."""
    plain, _ = register(checkout)
    extra, tags = register(checkout, "MIXEDML_EXTRA_OPTIONS=a100-40gb")
    assert extra.startswith(f"{plain}-settings-") and tags == {plain}
    assert register(checkout, "MIXEDML_EXTRA_OPTIONS=a100-40gb")[0] == extra
    assert register(checkout, "MIXEDML_EXTRA_OPTIONS=tpu-v6e-1x1")[0] not in (plain, extra)
    assert register(checkout, "MIXEDML_EXTRA_OPTIONS=a100-40gb", "VERSION=v7")[0] == "v7"
