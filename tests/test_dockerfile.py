"""The Dockerfile, checked statically: stages, users, pins, and that each image has what its tasks import."""

from __future__ import annotations

import re
import shlex

import pytest

from tasks.compare import compare
from tasks.evaluate import evaluate
from tasks.planner import prepare_data, train_on_target
from tasks.preprocess import preprocess
from tasks.schedule import dataset_partition
from tasks.train_tf import train_tf_gpu, train_tf_tpu
from tasks.train_torch import train_torch, train_torch_multinode
from tests.dependencies import (
    REPO,
    canonical,
    distributions_for,
    project_requirements,
    requirement_closure,
    third_party_imports,
)

TASKS = [
    preprocess, evaluate, compare, dataset_partition, train_torch, train_torch_multinode, train_tf_gpu, train_tf_tpu,
    prepare_data, train_on_target,
]  # fmt: skip
TARGETS = ("cpu", "gpu", "tpu")


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO / "Dockerfile").read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def stages() -> dict[str, list[tuple[str, str]]]:
    result, current = {}, None
    for instruction, arguments in instructions():
        if instruction == "FROM":
            match = re.match(r"(\S+)\s+AS\s+(\S+)", arguments, re.IGNORECASE)
            current = match.group(2)
            result[current] = [(instruction, arguments)]
        elif current:
            result[current].append((instruction, arguments))
    return result


def stage_chain(name: str) -> list[str]:
    """The stage and the stages it is built FROM, base first."""
    all_stages = stages()
    chain = [name]
    while (parent := all_stages[chain[0]][0][1].split()[0]) in all_stages:
        chain.insert(0, parent)
    return chain


def pip_requirements(stage: str) -> list[str]:
    """Everything `pip install`ed in the stage and its bases, '.[extras]' expanded from pyproject."""
    requirements = []
    for name in stage_chain(stage):
        for instruction, arguments in stages()[name]:
            if instruction != "RUN":
                continue
            for command in re.split(r"&&|;", arguments):
                words = shlex.split(command)
                if words[:2] != ["pip", "install"]:
                    continue
                requirements += install_targets(words[2:])
    return requirements


def install_targets(words: list[str]) -> list[str]:
    targets, skip_next = [], False
    for word in words:
        if skip_next:
            skip_next = False
        elif word in ("-c", "-f", "-r", "--constraint", "--find-links", "--index-url"):
            skip_next = True
        elif word.startswith("-"):
            continue
        elif word.startswith("."):
            extras = re.match(r"\.(?:\[(.*)\])?$", word).group(1)
            targets += project_requirements(extras.split(",") if extras else [])
        else:
            targets.append(re.sub(r"\$\{\w+\}", "0", word))
    return targets


def provided(stage: str) -> set[str]:
    return requirement_closure(pip_requirements(stage))


def image_target(task) -> str:
    match = re.fullmatch(
        r"\{\{\.image\.(\w+)\.fqn\}\}:\{\{\.image\.\w+\.version\}\}", task.container_image or ""
    )
    assert match, f"{task.name} does not use a named image: {task.container_image!r}"
    return match.group(1)


def test_one_stage_per_hardware_target():
    assert set(TARGETS) <= set(stages())


@pytest.mark.parametrize("target", TARGETS)
def test_final_user_is_not_root(target):
    users = [
        arguments
        for name in stage_chain(target)
        for instruction, arguments in stages()[name]
        if instruction == "USER"
    ]
    assert users, f"stage {target} never sets USER"
    assert users[-1].split(":")[0] not in ("root", "0")


def test_base_images_and_framework_versions_are_pinned():
    for instruction, arguments in instructions():
        if instruction == "ARG" and "IMAGE" in arguments:
            image = arguments.split("=", 1)[1]
            assert re.search(r":\d+\.\d+\.\d+", image), f"unpinned base image {image}"
    for target in TARGETS:
        for requirement in pip_requirements(target):
            if canonical(requirement.split("[")[0].split("=")[0]) in ("tensorflow-cpu", "torch"):
                assert "==" in requirement or requirement.startswith(("torch>", "tensorflow-cpu>")), (
                    requirement
                )


def test_cpu_image_has_neither_torch_nor_tensorflow():
    assert not provided("cpu") & {"torch", "tensorflow-cpu", "keras"}


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.name)
def test_each_image_installs_what_its_tasks_import(task):
    target = image_target(task)
    available = provided(target)
    module = task.name.rsplit(".", 1)[0]
    missing = {
        name: distributions_for(name)
        for name in third_party_imports(module)
        if not distributions_for(name) & available
    }
    assert not missing, f"{task.name} runs in the {target} image, which lacks {missing}"


def test_dockerignore_sends_only_what_the_images_need():
    rules = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert rules[0] == "*"  # ignore everything, then allow
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    assert {"pyproject.toml", "constraints.txt", "tasks/", "workflows/"} <= allowed
    copied = {arguments.split()[0] for _, arguments in instructions() if _ == "COPY"}
    assert copied <= {"pyproject.toml", "tasks", "workflows"}
