"""The Dockerfile, checked statically: stages, users, pins, and that each image has what its tasks import
and no training framework they do not."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import pkgutil
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from flytekit.core.base_task import PythonTask
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import tasks
from tasks.compare import compare
from tasks.core.accelerators.nvidia_driver import GKE_DRIVER_LIBRARY_DIR
from tasks.evaluate import evaluate
from tasks.images import IMAGES
from tasks.preprocess import preprocess
from tasks.right_sizing import prepare_data, train_on_target
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
TARGETS = tuple(IMAGES)  # the Dockerfile stages, as tasks/images.py names them
# The names each training framework's code imports.
FRAMEWORK_IMPORTS = {"torch": {"torch"}, "tensorflow": {"tensorflow", "keras"}}
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


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


@functools.cache
def pip_commands(stage: str) -> tuple[tuple[str, ...], ...]:
    """The arguments of each `pip install` in the stage and its bases, in order, shell variables expanded."""
    commands = []
    for name in stage_chain(stage):
        for instruction, arguments in stages()[name]:
            if instruction != "RUN":
                continue
            variables = shell_variables(arguments)
            for command in re.split(r"&&|;", arguments):
                words = shlex.split(expand(command, variables))
                if words[:2] == ["pip", "install"]:
                    commands.append(tuple(words[2:]))
    return tuple(commands)


def expand(command: str, variables: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)[^}]*\}", lambda match: variables[match.group(1)], command)


def shell_variables(run_arguments: str) -> dict[str, str]:
    """The variables a RUN assigns (`NAME=$(...)`), evaluated in the repository as the build does."""
    assignments = [part.strip() for part in run_arguments.split("&&") if re.match(r"\s*\w+=", part)]
    names = [assignment.split("=", 1)[0] for assignment in assignments]
    if not names:
        return {}
    script = " && ".join(assignments + [f'echo "${name}"' for name in names])
    output = subprocess.run(["sh", "-c", script], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return dict(zip(names, output.splitlines(), strict=True))


def pip_requirements(stage: str) -> list[str]:
    """Everything `pip install`ed in the stage and its bases, '.[extras]' expanded from pyproject."""
    return [requirement for words in pip_commands(stage) for requirement in install_targets(words)]


def install_targets(words: tuple[str, ...]) -> list[str]:
    targets, skip_next = [], False
    for word in words:
        if skip_next:
            skip_next = False
        elif word in ("-c", "-f", "-r", "--constraint", "--find-links", "--index-url", "--extra-index-url"):
            skip_next = True
        elif word.startswith("-"):
            continue
        elif word.startswith("."):
            extras = re.match(r"\.(?:\[(.*)\])?$", word).group(1)
            targets += project_requirements(extras.split(",") if extras else [])
        else:
            targets.append(word)
    return targets


def constraint_pins() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().split()
    return {
        canonicalize_name(name): version
        for name, version in (line.split("==", 1) for line in lines if "==" in line)
    }


def release_installed(requirement: Requirement, words: tuple[str, ...]) -> str | None:
    """The release a `pip install <words>` gets for `requirement`: its own == pin, else constraints.txt's."""
    exact = [spec.version.split("+")[0] for spec in requirement.specifier if spec.operator == "=="]
    if exact:
        return exact[0]
    return constraint_pins().get(canonicalize_name(requirement.name)) if "constraints.txt" in words else None


def provided(stage: str) -> set[str]:
    return requirement_closure(pip_requirements(stage))


def image_target(task) -> str:
    match = re.fullmatch(
        r"\{\{\.image\.([\w-]+)\.fqn\}\}:\{\{\.image\.[\w-]+\.version\}\}", task.container_image or ""
    )
    assert match, f"{task.name} does not use a named image: {task.container_image!r}"
    return match.group(1)


def frameworks_carried(stage: str) -> set[str]:
    return {
        framework for framework, names in FRAMEWORK_IMPORTS.items() if provided(stage) & distributions(names)
    }


def distributions(import_names: set[str]) -> set[str]:
    return set().union(*map(distributions_for, import_names))


@functools.cache
def check_images_script():
    """deploy/check_images.py, imported without running it (it is a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("check_images", REPO / "deploy" / "check_images.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_stage_per_image_and_every_image_used():
    assert set(stages()) - {"base"} == set(TARGETS) == {image_target(task) for task in TASKS}


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


def test_base_image_is_pinned():
    images = [arguments.split("=", 1)[1] for instruction, arguments in instructions() if instruction == "ARG"]
    assert images and all(re.search(r":\d+\.\d+\.\d+", image) for image in images), images


@pytest.mark.parametrize("target", TARGETS)
def test_each_framework_build_gets_the_release_constraints_txt_pins(target):
    """tensorflow and tensorflow-tpu at the tensorflow-cpu pin, torch at the torch pin: the release the tests run."""
    expected = {"torch": constraint_pins()["torch"], "tensorflow-cpu": constraint_pins()["tensorflow-cpu"]}
    for words in pip_commands(target):
        for requirement in map(Requirement, install_targets(words)):
            if (framework := canonical(requirement.name)) in expected:
                assert release_installed(requirement, words) == expected[framework], (
                    target,
                    str(requirement),
                )


@pytest.mark.slow  # reads the image's dependency closure: seconds
@pytest.mark.parametrize("target", ["cpu", "ml-cpu"])
def test_cpu_images_carry_no_cuda_libraries(target):
    cuda = {
        name for name in provided(target) if name.startswith(("nvidia-", "cuda-")) and name != "nvidia-ml-py"
    }
    assert not cuda
    # PyPI's Linux torch pulls CUDA: the first install that names torch takes the CPU build from its own index.
    torch_installs = [
        words
        for words in pip_commands(target)
        if "torch" in {canonical(Requirement(r).name) for r in install_targets(words)}
    ]
    if torch_installs:
        first = torch_installs[0]
        assert "--index-url" in first and first[first.index("--index-url") + 1] == PYTORCH_CPU_INDEX, first
        assert all(str(Requirement(r).specifier).endswith("+cpu") for r in install_targets(first)), first


@pytest.mark.slow  # reads the image's dependency closure: seconds
@pytest.mark.parametrize("target", ["torch-gpu", "tf-gpu", "tpu"])
def test_each_accelerator_image_carries_one_framework(target):
    assert len(frameworks_carried(target)) == 1, frameworks_carried(target)


@pytest.mark.slow  # reads the image's dependency closure: seconds
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


@pytest.mark.slow  # reads the image's dependency closure: seconds
@pytest.mark.parametrize("target", TARGETS)
def test_each_image_carries_no_framework_its_tasks_do_not_import(target):
    imported = set().union(
        *(third_party_imports(task.name.rsplit(".", 1)[0]) for task in TASKS if image_target(task) == target)
    )
    needed = {framework for framework, names in FRAMEWORK_IMPORTS.items() if names & imported}
    assert frameworks_carried(target) <= needed, (
        f"none of the {target} image's tasks import {frameworks_carried(target) - needed}"
    )


@pytest.mark.parametrize("target", TARGETS)
def test_images_check_resolves_what_each_stage_installs(target):
    script = check_images_script()
    image = script.images()[target]
    dockerfile_sources = {
        word for words in pip_commands(target) for option, word in zip(words, words[1:], strict=False)
        if option in ("--index-url", "--extra-index-url", "-f", "--find-links")
    }  # fmt: skip
    assert list(script.images()) == list(TARGETS)
    assert {str(Requirement(r)) for r in script.install_set(image)} == {
        str(Requirement(r)) for r in pip_requirements(target)
    }
    assert {image.index, image.find_links} - {""} == dockerfile_sources


def test_dockerignore_sends_only_what_the_images_need():
    rules = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert rules[0] == "*"  # ignore everything, then allow
    allowed = {rule[1:] for rule in rules if rule.startswith("!")}
    assert {"pyproject.toml", "constraints.txt", "tasks/", "workflows/", "examples/"} <= allowed
    copied = {arguments.split()[0] for _, arguments in instructions() if _ == "COPY"}
    assert copied <= {"pyproject.toml", "tasks", "workflows", "examples"}


def test_the_images_that_build_models_have_the_example_model_so_a_run_can_name_it():
    with_examples = {name for name, steps in stages().items() if ("COPY", "examples ./examples") in steps}
    assert {"ml-cpu", "torch-gpu", "tf-gpu", "tpu"} <= with_examples


def environment(stage: str) -> dict[str, str]:
    """The ENV variables the stage and its bases set (KEY=value form)."""
    found = {}
    for name in stage_chain(stage):
        for instruction, arguments in stages()[name]:
            if instruction == "ENV":
                found.update(word.split("=", 1) for word in shlex.split(arguments))
    return found


def test_the_tpu_image_loads_libtpu_s_pjrt_plugin_before_tensorflow_starts():
    """Set in the image, so they are there before any import of TensorFlow; the library path is the
    link a RUN makes to the libtpu.so the tensorflow-tpu install brought, or the build fails."""
    variables = environment("tpu")
    assert variables["PJRT_DEVICE"] == "TPU"
    assert variables["NEXT_PLUGGABLE_DEVICE_USE_C_API"] == "true"
    library = variables["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"]
    links = [
        arguments
        for instruction, arguments in stages()["tpu"]
        if instruction == "RUN" and library in arguments
    ]
    assert links and "libtpu/libtpu.so" in links[0] and f"test -e {library}" in links[0]
    assert not {"PJRT_DEVICE", "TF_PLUGGABLE_DEVICE_LIBRARY_PATH"} & environment("tf-gpu").keys()


def test_the_tf_gpu_image_gets_the_cuda_release_tensorflow_was_tested_with():
    """TensorFlow 2.20's and-cuda extra accepts any CUDA 12 wheel from 12.5 on; the image takes the
    tested CUDA 12.5 / cuDNN 9.3 build (tensorflow.org/install/source, tested build configurations)."""
    assert constraint_pins()["tensorflow-cpu"].startswith("2.20.")
    cuda12 = {name: version for name, version in constraint_pins().items() if name.endswith("-cu12")}
    assert cuda12["nvidia-cudnn-cu12"].startswith("9.3.")
    assert cuda12["nvidia-cuda-runtime-cu12"].startswith("12.5.")
    assert all(version.startswith(("12.5.", "9.3.", "11.", "10.", "2.")) for version in cuda12.values()), (
        cuda12
    )
    tensorflow_installs = [
        words for words in pip_commands("tf-gpu") if any("and-cuda" in word for word in words)
    ]
    assert tensorflow_installs and all("constraints.txt" in words for words in tensorflow_installs)


@functools.cache
def all_tasks() -> tuple[PythonTask, ...]:
    """Every Flyte task that runs in a pod the project's task modules define, whether or not a test
    names it (an echo runs in propeller)."""
    found = {}
    for module in pkgutil.iter_modules(tasks.__path__, "tasks."):
        for value in vars(importlib.import_module(module.name)).values():
            if (
                isinstance(value, PythonTask)
                and value.name.startswith("tasks.")
                and value.task_type != "echo"
            ):
                found[value.name] = value
    return tuple(found.values())


def gpu_task_stages() -> set[str]:
    """The stages of the images that tasks requesting GPUs run in."""
    return {image_target(task) for task in all_tasks() if task.resources.requests.gpu}


def finds_the_gke_driver(stage: str) -> None:
    """GKE mounts the driver at /usr/local/nvidia and sets no variable (tasks/core/accelerators/nvidia_driver.py):
    the image puts its libraries on the library path and nvidia-smi on PATH, after the virtualenv."""
    variables = environment(stage)
    assert GKE_DRIVER_LIBRARY_DIR in variables.get("LD_LIBRARY_PATH", "").split(":"), (stage, variables)
    path = variables.get("PATH", "").split(":")
    driver_bin = str(Path(GKE_DRIVER_LIBRARY_DIR).parent / "bin")
    assert driver_bin in path and path.index("$PATH") < path.index(driver_bin), (stage, path)


def test_every_image_a_gpu_task_runs_in_finds_the_driver_where_gke_mounts_it():
    stages_of_gpu_tasks = gpu_task_stages()
    assert stages_of_gpu_tasks  # the project has GPU tasks, so this checks something
    for stage in stages_of_gpu_tasks:
        finds_the_gke_driver(stage)


def test_the_tpu_image_installs_under_the_libtpu_pin_and_images_check_holds_it_to_that():
    """tensorflow-tpu 2.20.0 asks libtpu~=0.0.14, which any later 0.0.x satisfies; constraints.txt pins
    the release TensorFlow 2.20 was released with, and `make images-check` fails on any other."""
    assert "libtpu" in constraint_pins()
    installs_tensorflow_tpu = [
        words
        for words in pip_commands("tpu")
        if "tensorflow-tpu" in {canonicalize_name(Requirement(r).name) for r in install_targets(words)}
    ]
    assert installs_tensorflow_tpu and all("constraints.txt" in words for words in installs_tensorflow_tpu)
    assert "libtpu" in check_images_script().images()["tpu"].exact


def resolved(**versions: str) -> list[dict]:
    """A pip --report's install list with these packages at these versions."""
    return [{"metadata": {"name": name, "version": version}} for name, version in versions.items()]


def test_images_check_flags_a_libtpu_other_than_the_pin():
    script = check_images_script()
    tpu, pins = script.images()["tpu"], script.pins()
    assert script.pin_mismatches(tpu, resolved(libtpu=pins["libtpu"]), pins) == []
    assert script.pin_mismatches(tpu, resolved(libtpu="0.0.52"), pins) == [
        f"libtpu resolved to 0.0.52, not its pin {pins['libtpu']}"
    ]
    assert script.pin_mismatches(tpu, resolved(numpy="2.4.6"), pins) == [
        f"libtpu resolved to nothing, not its pin {pins['libtpu']}"
    ]
    unpinned = {name: version for name, version in pins.items() if name != "libtpu"}
    assert script.pin_mismatches(tpu, resolved(libtpu="0.0.52"), unpinned) == [
        "libtpu has no pin in constraints.txt"
    ]


def test_images_check_fails_the_tpu_image_when_the_resolver_picks_another_libtpu(monkeypatch, capsys):
    """`check` itself, with pip's answer given, so no package index is asked."""
    script = check_images_script()
    report = json.dumps({"install": resolved(libtpu="0.0.52", **{"tensorflow-tpu": "2.20.0"})})
    answer = subprocess.CompletedProcess([], 0, stdout=report, stderr="")
    monkeypatch.setattr(script, "unreachable", lambda url: "")
    monkeypatch.setattr(script.subprocess, "run", lambda *args, **kwargs: answer)
    assert script.check("tpu", script.images()["tpu"]) == "FAILED"
    assert "libtpu resolved to 0.0.52" in capsys.readouterr().out
