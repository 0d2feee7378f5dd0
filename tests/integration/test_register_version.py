"""`make register`'s version names the tree it registers: flyteadmin refuses a changed entity under a
version it already has, so a new commit or a new uncommitted change must get a new version. The images
`make push` builds are tagged by what goes into them, so that `make register` names the images pushed
even after an edit outside them (deploy/schedules.yaml, between `make push` and `make register`)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.dependencies import REPO

# Marked up to date, so `make register` neither needs nor builds the virtualenv.
STAMP = ".venv/.installed"


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A git repository holding this Makefile, what it reads to name versions and tags, a module the
    images hold (tasks/train.py) and a settings file they do not (deploy/schedules.yaml), committed,
    with no git configuration from outside."""
    root = tmp_path / "checkout"
    (root / "tasks").mkdir(parents=True)
    (root / "deploy").mkdir()
    for path in ("Makefile", "Dockerfile", ".dockerignore", "deploy/image-tag.sh", "tasks/__init__.py",
                 "tasks/images.py"):  # fmt: skip
        shutil.copy(REPO / path, root / path)
    (root / "tasks" / "train.py").write_text("epochs = 1\n")
    (root / "deploy" / "schedules.yaml").write_text("launch_plans: {}\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return root


def environment(root: Path, **settings: str) -> dict[str, str]:
    """No git configuration and none of the registration settings from outside, but `settings`."""
    outside = {name: value for name, value in os.environ.items() if not name.startswith("MIXEDML_")}
    return outside | settings | {
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


def dry_run(root: Path, target: str, *make_args: str, **settings: str) -> list[str]:
    """The commands `make -n target` prints, continued lines joined."""
    command = ["make", "-n", "-o", STAMP, target, *make_args]
    done = subprocess.run(
        command, cwd=root, env=environment(root, **settings), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.replace("\\\n", " ").splitlines()


def register_command(root: Path, *make_args: str, **settings: str) -> str:
    (command,) = [
        line for line in dry_run(root, "register", *make_args, **settings) if " register workflows " in line
    ]
    return command


def register(root: Path, *make_args: str, **settings: str) -> tuple[str, set[str]]:
    """The version `make register` passes and the image tags it names, from a dry run."""
    command = register_command(root, *make_args, **settings)
    return re.search(r"--version (\S+)", command).group(1), set(
        re.findall(r"--image [\w-]+=\S+:(\S+)", command)
    )


def pushed(root: Path, *make_args: str) -> set[str]:
    """The tags `make push` builds and pushes the images under, from a dry run."""
    lines = dry_run(root, "push", *make_args)
    built = [tag for line in lines for tag in re.findall(r"docker build .* -t \S+:(\S+) ", line)]
    pushed = [tag for line in lines for tag in re.findall(r"docker push \S+:(\S+) ", line)]
    assert built and pushed, lines
    return set(built + pushed)


def test_a_clean_tree_registers_under_its_commit_and_the_images_pushed(checkout):
    version, tags = register(checkout)
    assert version == git(checkout, "rev-parse", "--short=12", "HEAD")
    assert tags == pushed(checkout) and len(tags) == 1


def test_the_tag_names_exactly_what_the_build_reads(checkout):
    """The tag is the tree of the Dockerfile, .dockerignore and what .dockerignore admits: git lists it
    back, and nothing outside the images is in it."""
    (tag,) = pushed(checkout)
    listed = git(checkout, "ls-tree", "-r", "--name-only", tag).split()
    assert sorted(listed) == [".dockerignore", "Dockerfile", "tasks/__init__.py", "tasks/images.py",
                              "tasks/train.py"]  # fmt: skip


def test_editing_the_schedules_after_push_keeps_the_images_and_changes_the_version(checkout):
    """The README's order: `make push`, edit deploy/schedules.yaml, `make register`."""
    version, _ = register(checkout)
    (tag,) = pushed(checkout)
    (checkout / "deploy" / "schedules.yaml").write_text("launch_plans: {nightly_retrain: {}}\n")
    edited, tags = register(checkout)
    assert edited.startswith(f"{version}-dirty-")
    assert tags == pushed(checkout) == {tag}
    (checkout / "notes.txt").write_text("not in any image\n")  # untracked, outside the images
    assert register(checkout)[0] not in (version, edited) and pushed(checkout) == {tag}


def test_a_change_to_what_the_images_hold_changes_the_tag_and_the_version(checkout):
    version, _ = register(checkout)
    (tag,) = pushed(checkout)
    (checkout / "tasks" / "train.py").write_text("epochs = 2\n")
    edited, tags = register(checkout)
    assert edited.startswith(f"{version}-dirty-") and tags == pushed(checkout)
    assert tags.isdisjoint({tag, version, edited})
    (checkout / "tasks" / "new_model.py").write_text("width = 8\n")  # untracked, but the build copies it
    assert pushed(checkout).isdisjoint(tags | {tag})
    (checkout / ".dockerignore").write_text((checkout / ".dockerignore").read_text() + "!deploy/\n")
    assert pushed(checkout).isdisjoint(tags | {tag})  # admitting deploy/ puts the schedules in the images


def test_the_same_content_gets_the_same_tag_on_any_commit(checkout):
    first = pushed(checkout)
    (checkout / "tasks" / "train.py").write_text("epochs = 2\n")
    (checkout / "deploy" / "schedules.yaml").write_text("launch_plans: {nightly_retrain: {}}\n")
    uncommitted, tags = register(checkout)
    git(checkout, "commit", "-q", "-am", "second")
    committed, tags_committed = register(checkout)
    assert "dirty" not in committed and committed != uncommitted and tags_committed == tags != first
    (checkout / "tasks" / "train.py").write_text("epochs = 1\n")
    git(checkout, "commit", "-q", "-am", "third: the first commit's images again")
    assert pushed(checkout) == register(checkout)[1] == first


def test_uncommitted_changes_get_a_version_of_their_own_the_same_for_the_same_changes(checkout):
    clean, _ = register(checkout)
    (checkout / "tasks" / "train.py").write_text("epochs = 2\n")
    dirty, tags = register(checkout)
    assert dirty.startswith(f"{clean}-dirty-")
    assert register(checkout) == (dirty, tags)  # the same tree, the same version and tag

    (checkout / "tasks" / "train.py").write_text("epochs = 3\n")
    other = register(checkout)[0]
    (checkout / "new_model.py").write_text("width = 8\n")  # an untracked file is part of the tree
    with_new_file = register(checkout)[0]
    assert len({dirty, other, with_new_file}) == 3

    (checkout / "new_model.py").unlink()
    (checkout / "tasks" / "train.py").write_text("epochs = 1\n")
    assert register(checkout)[0] == clean


def test_a_new_commit_gets_a_new_version_and_an_explicit_one_wins(checkout):
    first, _ = register(checkout)
    (checkout / "tasks" / "train.py").write_text("epochs = 2\n")
    git(checkout, "commit", "-q", "-am", "second")
    assert register(checkout)[0] not in (first, "") and "dirty" not in register(checkout)[0]
    assert register(checkout, "VERSION=v7", "TAG=images-1") == ("v7", {"images-1"})
    assert pushed(checkout, "TAG=images-1") == {"images-1"}


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
    options must not reuse the version, which flyteadmin would refuse. The images keep their tag."""
    plain, images = register(checkout)
    extra, tags = register(checkout, "MIXEDML_EXTRA_OPTIONS=a100-40gb")
    assert extra.startswith(f"{plain}-settings-") and tags == images
    assert register(checkout, "MIXEDML_EXTRA_OPTIONS=a100-40gb")[0] == extra
    assert register(checkout, "MIXEDML_EXTRA_OPTIONS=tpu-v6e-1x1")[0] not in (plain, extra)
    assert register(checkout, "MIXEDML_EXTRA_OPTIONS=a100-40gb", "VERSION=v7")[0] == "v7"


def test_gpudirect_reaches_every_task_and_registers_under_a_version_of_its_own(checkout):
    """`MIXEDML_GPUDIRECT=1 make register` on a registered tree changes the multi-node task's pod template
    and every task's environment: under the tree's version flyteadmin would refuse it."""
    plain, images = register(checkout)
    assert "MIXEDML_GPUDIRECT" not in register_command(checkout)
    on, tags = register(checkout, MIXEDML_GPUDIRECT="1")  # from the environment, as the docs write it
    assert on.startswith(f"{plain}-settings-") and tags == images
    assert '--env MIXEDML_GPUDIRECT="1"' in register_command(checkout, MIXEDML_GPUDIRECT="1")
    assert register(checkout, "MIXEDML_GPUDIRECT=1")[0] == on  # or on make's command line
    extra = register(checkout, "MIXEDML_EXTRA_OPTIONS=a100-40gb")[0]
    both = register(checkout, "MIXEDML_EXTRA_OPTIONS=a100-40gb", "MIXEDML_GPUDIRECT=1")[0]
    assert len({plain, on, extra, both}) == 4
    package = " ".join(dry_run(checkout, "package", "MIXEDML_GPUDIRECT=1"))
    assert '--env MIXEDML_GPUDIRECT="1"' in package


def test_registration_runs_the_code_the_images_hold(checkout):
    """`pyflyte register` uploads the tree by default (--copy all), and every pod first unpacks it into
    --destination-dir, /root unless set, which the images' user cannot write: each task would fail before
    it ran. The images hold the code, tagged by it, so `make register` copies none: read here as
    pyflyte's own command line reads the flags."""
    from flytekit.clis.sdk_in_container.register import register as register_command_line
    from flytekit.constants import CopyFileDetection

    words = shlex.split(register_command(checkout))
    arguments = words[words.index("register") + 1 :]
    parsed = register_command_line.make_context("register", arguments).params
    assert parsed["copy"] == CopyFileDetection.NO_COPY, parsed
    users = re.findall(r"^USER (\S+)", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert users and "root" not in users  # why an upload into /root would fail
