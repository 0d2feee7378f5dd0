"""Reading a `pyflyte package` archive back into Flyte's protobufs."""

from __future__ import annotations

import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from flyteidl.admin import launch_plan_pb2, task_pb2, workflow_pb2
from google.protobuf.json_format import MessageToDict

REPO = Path(__file__).resolve().parents[1]
REGISTRY, TAG = "registry.example.com/ml", "t1"
# Every scheduled launch plan complete: the launch plans carry their schedules, inputs and notifications.
SCHEDULES = REPO / "tests" / "schedules.yaml"


@dataclass
class Package:
    tasks: dict[str, task_pb2.TaskSpec] = field(default_factory=dict)  # those that run in a pod
    podless: dict[str, task_pb2.TaskSpec] = field(default_factory=dict)  # run by a propeller plugin (echo)
    workflows: dict[str, workflow_pb2.WorkflowSpec] = field(default_factory=dict)
    launch_plans: dict[str, launch_plan_pb2.LaunchPlan] = field(default_factory=dict)


def build_package(destination: Path, **settings: str) -> Path:
    """`make package`, as the README says, into `destination`; `settings` are make's variables
    (MIXEDML_GPUDIRECT="1")."""
    archive = destination / "package.tgz"
    command = ["make", "-s", "package", f"REGISTRY={REGISTRY}", f"TAG={TAG}", f"PACKAGE={archive}",
               f"SCHEDULES={SCHEDULES}", *(f"{name}={value}" for name, value in settings.items())]  # fmt: skip
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return archive


def read_package(archive: Path) -> Package:
    package = Package()
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            data = tar.extractfile(member).read()
            stem = member.name.removesuffix(".pb")
            if stem.endswith("_1"):
                spec = task_pb2.TaskSpec.FromString(data)
                runs_in = package.tasks if spec.template.WhichOneof("target") else package.podless
                runs_in[spec.template.id.name] = spec
            elif stem.endswith("_2"):
                spec = workflow_pb2.WorkflowSpec.FromString(data)
                package.workflows[spec.template.id.name] = spec
            elif stem.endswith("_3"):
                plan = launch_plan_pb2.LaunchPlan.FromString(data)
                package.launch_plans[plan.id.name] = plan
    return package


def primary_container(spec: task_pb2.TaskSpec) -> dict:
    """The task's container as a dict, whether serialized as a container or inside a pod spec."""
    template = spec.template
    if template.WhichOneof("target") == "k8s_pod":
        (container,) = MessageToDict(template.k8s_pod.pod_spec)["containers"]
        return container
    return MessageToDict(template.container)


def image_of(spec: task_pb2.TaskSpec) -> str:
    return primary_container(spec)["image"]


def requests_of(spec: task_pb2.TaskSpec) -> dict[str, str]:
    """Resource requests by lower-case name (cpu, memory, gpu), from either serialization."""
    requests = primary_container(spec)["resources"]["requests"]
    if isinstance(requests, list):
        return {entry["name"].lower(): entry["value"] for entry in requests}
    return requests


def environment_of(spec: task_pb2.TaskSpec) -> dict[str, str]:
    return {
        entry.get("key", entry.get("name")): entry["value"]
        for entry in primary_container(spec).get("env", [])
    }
