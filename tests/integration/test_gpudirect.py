"""GKE's GPUDirect networking where processes are started (tasks/gpudirect.py): the variable read
where tasks.hardware is imported, at registration and in the pods registration puts it in, and the
node's NCCL profile sourced by a shell before the launcher plans any worker (what each pod declares:
tests/unit/deploy/test_gpudirect.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from flyteidl.admin import task_pb2
from flyteidl.core import dynamic_job_pb2, tasks_pb2

from tasks.core.planning.planner import PreprocessPlan
from tasks.gpudirect import PROFILE_VARIABLE, apply_node_profile
from tasks.hardware import GPUDIRECT_VARIABLE
from tasks.right_sizing import train_on_target
from tests.conftest import POD_HYPERPARAMETERS
from tests.flyte_package import REPO, build_package, environment_of, read_package
from tests.pods import literals, merged, pod_command, pod_environment


@pytest.mark.slow  # a fresh interpreter: the variable is read when tasks.hardware is imported
def test_the_cluster_turns_gpudirect_on_at_registration():
    """MIXEDML_GPUDIRECT=1 where the tasks are serialized puts the multi-node profile's pods on it (its
    task is decorated with the profile's options: tests/unit/tasks/test_hardware.py); only that one."""
    probe = (
        "from tasks.hardware import TRAIN_GPU, TRAIN_GPU_MULTINODE as multinode; "
        "print(sorted(multinode.pod_template().annotations or {}), TRAIN_GPU.gpudirect)"
    )
    registering = {**os.environ, GPUDIRECT_VARIABLE: "1"}
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=registering, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "networking.gke.io/interfaces" in result.stdout
    assert "devices.gke.io/container.tcpx-daemon" in result.stdout
    assert result.stdout.split()[-1] == "False"  # the single-node profile is never on it


GPUDIRECT_ANNOTATION = "networking.gke.io/interfaces"
MULTINODE = "tasks.train_torch.train_torch_multinode"


@pytest.fixture(scope="module")
def gpudirect_package(tmp_path_factory):
    """`make package MIXEDML_GPUDIRECT=1`, parsed back."""
    return read_package(
        build_package(tmp_path_factory.mktemp("gpudirect-package"), **{GPUDIRECT_VARIABLE: "1"})
    )


@pytest.mark.heavy  # a second package, registered with an optional setting: the deploy scenario
@pytest.mark.slow
def test_registering_with_gpudirect_puts_the_variable_in_every_tasks_container(
    gpudirect_package, flyte_package
):
    """`make package`/`make register` pass it with `--env`, so every pod imports tasks.hardware as the
    registering process did; without it, no task carries it."""
    assert {
        name: environment_of(spec).get(GPUDIRECT_VARIABLE) for name, spec in gpudirect_package.tasks.items()
    } == {name: "1" for name in flyte_package.tasks}
    assert not any(GPUDIRECT_VARIABLE in environment_of(spec) for spec in flyte_package.tasks.values())
    assert GPUDIRECT_ANNOTATION in gpudirect_package.tasks[MULTINODE].template.k8s_pod.metadata.annotations


def launched_multinode_task(spec, inputs, workdir: Path) -> tasks_pb2.TaskTemplate:
    """Runs a dynamic's command as its pod does, the container's environment from `spec` (and no
    MIXEDML_GPUDIRECT from this process), and returns the multi-node task as the dynamic serialized it
    for propeller (its futures.pb)."""
    command = pod_command(spec, inputs, workdir)
    outside = {name: value for name, value in pod_environment().items() if name != GPUDIRECT_VARIABLE}
    result = subprocess.run(command, cwd=REPO, env=outside | environment_of(spec), capture_output=True,
                            text=True, timeout=600)  # fmt: skip
    printed = result.stdout[-3000:] + result.stderr[-3000:]
    futures = workdir / "outputs" / "futures.pb"
    assert result.returncode == 0 and futures.exists(), printed
    launched = dynamic_job_pb2.DynamicJobSpec.FromString(futures.read_bytes()).tasks
    (template,) = [template for template in launched if template.id.name == MULTINODE]
    return template


@pytest.mark.heavy  # a dynamic's pod per setting, one of them on a second package
@pytest.mark.slow
@pytest.mark.parametrize("registered_with_gpudirect", [True, False])
def test_the_dynamic_launches_the_multi_node_task_with_gpudirect_as_registered(
    registered_with_gpudirect, request, flyte_package, prepared_by_a_pod, tmp_path
):
    """propeller runs the tasks a dynamic serializes in its own pod, not the registered ones: the pod
    template there must be the one registration chose."""
    package = request.getfixturevalue("gpudirect_package") if registered_with_gpudirect else flyte_package
    values = {"preprocess_plan": PreprocessPlan(1, 1, 1, "1", "1Gi"), "target": "gpu-multinode",
              "hyperparameters": POD_HYPERPARAMETERS, "plan_resources": False}  # fmt: skip
    inputs = literals(train_on_target, values)
    spec = package.tasks["tasks.right_sizing.train_on_target"]
    launched = launched_multinode_task(spec, merged(inputs, prepared=prepared_by_a_pod), tmp_path / "dynamic")
    assert (GPUDIRECT_ANNOTATION in launched.k8s_pod.metadata.annotations) is registered_with_gpudirect
    launched_environment = environment_of(task_pb2.TaskSpec(template=launched))
    assert (GPUDIRECT_VARIABLE in launched_environment) is registered_with_gpudirect  # and its pods on
    assert (
        launched.k8s_pod.metadata.annotations
        == package.tasks[MULTINODE].template.k8s_pod.metadata.annotations
    )


PROFILE = """echo "the profile's own output"
export NCCL_PROTO=Simple
NCCL_ALGO=Ring,Tree
NCCL_DEBUG=INFO
"""


def test_the_node_profile_is_sourced_into_the_environment_the_workers_inherit(tmp_path):
    """Exported or plain assignments alike; what the shell sets of itself (SHLVL, PWD) is not copied."""
    script = tmp_path / "nccl-env-profile.sh"
    script.write_text(PROFILE)
    environ = {PROFILE_VARIABLE: str(script), "NCCL_DEBUG": "WARN", "PATH": "/usr/bin:/bin"}
    changed = apply_node_profile(environ)
    assert changed == {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring,Tree", "NCCL_DEBUG": "INFO"}
    assert environ == {PROFILE_VARIABLE: str(script), "PATH": "/usr/bin:/bin", **changed}


def test_a_failing_profile_fails_the_launch_with_its_error(tmp_path):
    script = tmp_path / "nccl-env-profile.sh"
    script.write_text("echo 'no plugin here' >&2\nfalse\n")
    with pytest.raises(RuntimeError, match="no plugin here"):
        apply_node_profile({PROFILE_VARIABLE: str(script), "PATH": "/usr/bin:/bin"})


def test_the_launcher_loads_the_profile_before_it_plans_the_workers(tmp_path, monkeypatch):
    """The launch reads the profile first: what plan_launch, and after it every worker, sees has it."""
    import tasks.train_torch as train_torch

    class Planned(Exception):
        pass

    seen = {}

    def plan_launch(*args, **kwargs):
        seen.update(NCCL_PROTO=train_torch.os.environ.get("NCCL_PROTO"))
        raise Planned

    script = tmp_path / "nccl-env-profile.sh"
    script.write_text("export NCCL_PROTO=Simple\n")
    monkeypatch.setenv(PROFILE_VARIABLE, str(script))
    monkeypatch.setenv("NCCL_PROTO", "unset by the test")  # so that monkeypatch restores it
    monkeypatch.setattr(train_torch, "plan_launch", plan_launch)
    with pytest.raises(Planned):
        train_torch.train_torch_multinode._launch_fitted()
    assert seen == {"NCCL_PROTO": "Simple"}
