"""deploy/ against what the package needs: every task and planner option admitted and schedulable.

The needs come from the serialized package (`make package`) and the planner's catalogs; what the
cluster offers comes from deploy/flyte-binary-values.yaml (Flyte's configuration) and
deploy/gke-node-pools.sh (node pools). A bigger task, a new accelerator or a new plugin task type
fails here until deploy/ is updated.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from functools import cache
from pathlib import Path

import pytest
import yaml
from google.protobuf.json_format import MessageToDict
from kubernetes.utils import parse_quantity

from tasks.catalog import DEFAULT_OPTIONS, GPU_OPTIONS, TPU_OPTIONS, offered
from tasks.core.accelerators.cuda_check import DRIVER_FLOOR
from tasks.core.data.reading import BATCH_ROWS
from tasks.core.planning.machines import MachineType
from tasks.core.planning.planner import CatalogEntry, plan_preprocessing
from tasks.hardware import CPU_NODE, LAUNCHER_EXIT_MARGIN_S, MACHINE_FOR_GPU, TPU_GENERATIONS, Attempts
from tasks.targets import TARGETS
from tests.dependencies import REPO
from tests.unit.deploy.test_cluster_config import readme_section

DEPLOY = REPO / "deploy"
VALUES = DEPLOY / "flyte-binary-values.yaml"
POOLS = DEPLOY / "gke-node-pools.sh"

# flyteadmin's built-in task_resources limits (flyteadmin/pkg/runtime/task_resource_provider.go).
BUILTIN_LIMITS = {"cpu": "2", "memory": "1Gi", "gpu": "1"}
# Task types the default pod plugins register (flyteplugins/go/tasks/plugins/k8s/pod/plugin.go).
POD_PLUGIN_TASK_TYPES = {"container": {"container", "python-task", "raw-container"}, "sidecar": {"sidecar"}}
# Plugins that create a custom resource, which flyte-binary's ClusterRole must let them manage.
CUSTOM_RESOURCES = {"pytorch": ("kubeflow.org", "pytorchjobs")}
MANAGE = {"create", "delete", "get", "list", "watch"}
SPOT_LABEL = "cloud.google.com/gke-spot"  # GKE puts it on --spot nodes, value "true"
TPU_ACCELERATOR, TPU_TOPOLOGY = "cloud.google.com/gke-tpu-accelerator", "cloud.google.com/gke-tpu-topology"
# A table near the largest the preprocessing plan accepts on CPU_NODE (tests/unit/planning/test_planner.py).
LARGEST_TABLE = {"input_bytes": 100 * 2**30, "rows": 1_500_000_000, "columns": 100}
# GKE's default share of a spot VM's 30 s notice for ordinary pods (graceful node shutdown; GKE's
# "Spot VMs" page). Node pools extend it only through a node system configuration, GKE >= 1.35.
SPOT_POD_SHUTDOWN_S = 15
INTERRUPTIBLE_TRAINING = (
    "train_torch.train_torch",
    "train_torch.train_torch_trial",
    "train_tf.train_tf_gpu_trial",
    "train_tf.train_tf_tpu_trial",
    "train_tf.train_tf_gpu",
    "train_tf.train_tf_tpu",
)


@cache
def flyte_config() -> dict:
    """`configuration.inline`: the Flyte configuration the chart merges last."""
    return yaml.safe_load(VALUES.read_text())["configuration"]["inline"]


def k8s_plugin() -> dict:
    return flyte_config()["plugins"]["k8s"]


# --- What the package and the planner ask for ---------------------------------------------------


@dataclass
class Demand:
    """One pod's needs: a serialized task's container, or what a planner option overrides it with."""

    source: str
    requests: dict[str, str]
    limits: dict[str, str]
    accelerator: tuple[str, str] | None  # (GPU device, MIG partition or "")
    node_selector: dict[str, str]
    interruptible: bool
    nodes: int = 1

    def amount(self, name: str) -> Decimal:
        return max(parse_quantity(r.get(name, "0")) for r in (self.requests, self.limits))


def lower_keys(resources: dict | list) -> dict[str, str]:
    if isinstance(resources, list):  # a task container: [{"name": "CPU", "value": "2"}, ...]
        return {entry["name"].lower(): entry["value"] for entry in resources}
    return {name.lower(): str(value) for name, value in resources.items()}


def accelerator_of(proto) -> tuple[str, str]:
    return proto.device, proto.partition_size


def containers_of(template) -> list[tuple[dict, dict, dict]]:
    """(requests, limits, node selector) of each container a task's pod would run."""
    if template.WhichOneof("target") == "k8s_pod":
        pod = MessageToDict(template.k8s_pod.pod_spec)
        selector = pod.get("nodeSelector", {})
        resources = [container.get("resources", {}) for container in pod["containers"]]
    else:
        selector, resources = {}, [MessageToDict(template.container).get("resources", {})]
    return [(lower_keys(r.get("requests", {})), lower_keys(r.get("limits", {})), selector) for r in resources]


def task_demands(package) -> list[Demand]:
    demands = []
    for name, spec in sorted(package.tasks.items()):
        template = spec.template
        extended = template.extended_resources
        accelerator = (
            accelerator_of(extended.gpu_accelerator) if extended.HasField("gpu_accelerator") else None
        )
        replicas = int(MessageToDict(template.custom).get("workerReplicas", {}).get("replicas", 1))
        interruptible = template.metadata.interruptible
        for requests, limits, selector in containers_of(template):
            demand = Demand(f"task {name}", requests, limits, accelerator, selector, interruptible, replicas)
            demands.append(demand)
    return demands


def override_demand(source: str, overrides: dict, interruptible: bool) -> Demand:
    accelerator = accelerator_of(overrides["accelerator"].to_flyte_idl())
    if "pod_template" in overrides:
        pod = overrides["pod_template"].pod_spec
        (container,) = pod.containers
        requests, limits = container.resources.requests, container.resources.limits
        return Demand(
            source, lower_keys(requests), lower_keys(limits), accelerator, pod.node_selector, interruptible
        )
    sized = {}
    for kind in ("requests", "limits"):
        resources = overrides[kind]
        sized[kind] = {
            k: v for k, v in (("cpu", resources.cpu), ("memory", resources.mem), ("gpu", resources.gpu)) if v
        }
    return Demand(source, sized["requests"], sized["limits"], accelerator, {}, interruptible)


def options_of(target, extra: str) -> list[CatalogEntry]:
    """What the planner ranks for `target` when MIXEDML_EXTRA_OPTIONS is `extra`."""
    kinds = {entry.kind for entry in target.catalog}
    return offered([entry for entry in GPU_OPTIONS + TPU_OPTIONS if entry.kind in kinds], extra)


def option_demands(extra: str) -> list[Demand]:
    """A pod for every option the planner may choose for every target, with `extra` opted in."""
    return [
        override_demand(
            f"planner option {entry.name} (target {name})",
            target.profile.overrides_for(entry),
            target.task.metadata.interruptible,
        )
        for name, target in TARGETS.items()
        if target.catalog is not None
        for entry in options_of(target, extra)
    ]


def planner_demands(package) -> list[Demand]:
    """Every option for every target, every extra one included, and preprocessing sized for the
    largest table."""
    demands = option_demands(" ".join(extra_options()))
    plan = plan_preprocessing(
        LARGEST_TABLE["input_bytes"], LARGEST_TABLE["rows"], LARGEST_TABLE["columns"], BATCH_ROWS, CPU_NODE
    )
    sized = {"cpu": plan.cpu, "memory": plan.mem}
    interruptible = package.tasks["tasks.preprocess.preprocess"].template.metadata.interruptible
    demands.append(
        Demand(f"preprocess plan for {plan.input_rows} rows", sized, sized, None, {}, interruptible)
    )
    return demands


@pytest.fixture(scope="module")
def demands(flyte_package) -> dict[str, list[Demand]]:
    return {"task": task_demands(flyte_package), "planner": planner_demands(flyte_package)}


# --- What the node pools offer --------------------------------------------------------------------


@dataclass(frozen=True)
class Pool:
    name: str
    machine: str
    accelerator: dict[str, str]  # --accelerator: type, count, gpu-partition-size
    tpu_topology: str
    spot: bool
    optional: bool

    @property
    def gpu(self) -> tuple[str, str] | None:
        if not self.accelerator:
            return None
        return self.accelerator["type"], self.accelerator.get("gpu-partition-size", "")

    @property
    def tpu(self) -> tuple[str, str] | None:
        """(accelerator label value, topology) GKE gives a TPU machine type's nodes."""
        for accelerator, topologies in TPU_GENERATIONS.values():
            for topology, machine in topologies.items():
                if machine.name == self.machine:
                    return accelerator.device, topology
        return None


def flags(words: list[str]) -> dict[str, str]:
    return {
        word: words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else ""
        for i, word in enumerate(words)
        if word.startswith("--")
    }


# What the fake gcloud answers for the cluster's version, and the COS image GKE's map gives it.
GKE_VERSION, COS_IMAGE = "1.99.0-gke.1", "cos-999-12345-6-7"
GPU_CHIPS = ("L4", "A100", "H100", "H200")


@dataclass
class ScriptRun:
    returncode: int
    gcloud_calls: list[list[str]]
    stderr: str


def run_pools_script(tmp_path: Path, extra: str = "", latest_driver: str = "999.0.0") -> ScriptRun:
    """deploy/gke-node-pools.sh against a fake `gcloud` that records its arguments, with GKE's version
    map and COS's driver list served from files where every GPU's LATEST driver is `latest_driver`."""
    log = tmp_path / "gcloud.log"
    log.write_text("")
    fake = tmp_path / "bin" / "gcloud"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'printf \'%q \' "$@" >> "$GCLOUD_LOG"; echo >> "$GCLOUD_LOG"\n'
        f'if [[ "$*" == *currentMasterVersion* ]]; then echo {GKE_VERSION}; fi\n'
    )
    fake.chmod(0o755)
    (tmp_path / "gke-to-cos.json").write_text(
        json.dumps({"entries": [{"gke_version": GKE_VERSION, "image": COS_IMAGE}]})
    )
    drivers = "".join(
        f'gpu_driver_version_info {{ gpu_device {{ gpu_type: "NVIDIA_{chip}" }} '
        f'supported_driver_versions {{ version: "{latest_driver}" label: "LATEST" }} }}\n'
        for chip in GPU_CHIPS
    )
    (tmp_path / "12345.6.7.textproto").write_text(drivers)
    env = os.environ | {
        "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
        "GCLOUD_LOG": str(log),
        "PROJECT": "test-project",
        "PYTHON": sys.executable,
        "MIXEDML_EXTRA_OPTIONS": extra,
        "GKE_TO_COS_URL": (tmp_path / "gke-to-cos.json").as_uri(),
        "COS_DRIVERS_URL": f"{tmp_path.as_uri()}/{{build}}.textproto",
    }
    env.pop("SKIP_DRIVER_CHECK", None)
    done = subprocess.run(["bash", str(POOLS)], env=env, capture_output=True, text=True, timeout=120)
    calls = [shlex.split(line) for line in log.read_text().splitlines()]
    return ScriptRun(done.returncode, calls, done.stderr)


def created_pools(run: ScriptRun, optional: bool = False) -> list[Pool]:
    pools = []
    for call in run.gcloud_calls:
        if call[:3] != ["container", "node-pools", "create"]:
            continue
        given = flags(call[4:])
        accelerator = dict(
            item.split("=", 1) for item in given.get("--accelerator", "").split(",") if "=" in item
        )
        pools.append(
            Pool(
                call[3], given.get("--machine-type", ""), accelerator, given.get("--tpu-topology", ""),
                "--spot" in given, optional,
            )
        )  # fmt: skip
    return pools


def extra_options() -> list[str]:
    """Every planner option outside the default catalog: what MIXEDML_EXTRA_OPTIONS may name."""
    return [entry.name for entry in GPU_OPTIONS + TPU_OPTIONS if entry.name not in DEFAULT_OPTIONS]


@cache
def script_runs() -> tuple[ScriptRun, ScriptRun]:
    """The script run with its defaults, and with every extra option named."""
    with tempfile.TemporaryDirectory() as plain, tempfile.TemporaryDirectory() as extended:
        return run_pools_script(Path(plain)), run_pools_script(Path(extended), " ".join(extra_options()))


@cache
def node_pools() -> tuple[Pool, ...]:
    """The pools the script creates by default, and those it creates only for the extra options."""
    default_run, extended_run = script_runs()
    assert default_run.returncode == 0 and extended_run.returncode == 0, (default_run, extended_run)
    default = created_pools(default_run)
    names = {pool.name for pool in default}
    optional = [pool for pool in created_pools(extended_run, optional=True) if pool.name not in names]
    return tuple(default + optional)


def default_pools() -> tuple[Pool, ...]:
    return tuple(pool for pool in node_pools() if not pool.optional)


def max_nodes() -> int:
    return int(re.search(r'MAX_NODES="\$\{MAX_NODES:-(\d+)\}"', POOLS.read_text()).group(1))


def machine(pool: Pool) -> MachineType | None:
    known = [*MACHINE_FOR_GPU.values(), CPU_NODE]
    known += [m for _, topologies in TPU_GENERATIONS.values() for m in topologies.values()]
    return next((m for m in known if m.name == pool.machine), None)


def placement(demand: Demand) -> str:
    if demand.amount("gpu") or demand.amount("nvidia.com/gpu"):
        device, partition = demand.accelerator or ("any GPU", "")
        return f"{device} {partition}".strip()
    if demand.amount("google.com/tpu"):
        return f"TPU {demand.node_selector.get(TPU_ACCELERATOR)} {demand.node_selector.get(TPU_TOPOLOGY)}"
    return "CPU"


def serves(pool: Pool, demand: Demand) -> bool:
    gpus = max(demand.amount("gpu"), demand.amount("nvidia.com/gpu"))
    if gpus:
        return pool.gpu == demand.accelerator and int(pool.accelerator.get("count", "1")) >= gpus
    if demand.amount("google.com/tpu"):
        return pool.tpu == (demand.node_selector.get(TPU_ACCELERATOR), demand.node_selector.get(TPU_TOPOLOGY))
    return pool.gpu is None and pool.tpu is None


def fits(pool: Pool, demand: Demand) -> bool:
    size = machine(pool)
    memory_gib = float(demand.amount("memory")) / 2**30
    if size is None:
        return False
    return float(demand.amount("cpu")) <= size.allocatable_cpu and memory_gib <= size.allocatable_memory_gib


def unscheduled(demand: Demand, pools: tuple[Pool, ...]) -> str | None:
    """Why no node pool would take this pod; None when one would."""
    usable = [pool for pool in pools if serves(pool, demand) and fits(pool, demand)]
    needed = {"spot": True, "on-demand": False} if demand.interruptible else {"on-demand": False}
    missing = [kind for kind, spot in needed.items() if not any(pool.spot == spot for pool in usable)]
    cpu, memory = demand.amount("cpu"), demand.requests.get("memory", "?")
    if missing:
        wanted = f"{placement(demand)} with room for {cpu} CPU, {memory}"
        return f"{demand.source}: no pool for {wanted}; needs {' and '.join(missing)}"
    if demand.nodes > max_nodes():
        return f"{demand.source}: needs {demand.nodes} nodes, MAX_NODES is {max_nodes()}"
    return None


# --- Flyte configuration --------------------------------------------------------------------------


def test_default_plugins_for_task_types_are_enabled():
    plugins = flyte_config()["tasks"]["task-plugins"]
    not_enabled = set(plugins["default-for-task-types"].values()) - set(plugins["enabled-plugins"])
    assert not not_enabled, f"propeller refuses to start: default plugins {not_enabled} are not enabled"


def rbac_allows(group: str, resource: str) -> bool:
    rules = yaml.safe_load(VALUES.read_text())["rbac"]["extraRules"]
    return any(
        group in rule["apiGroups"] and resource in rule["resources"] and set(rule["verbs"]) >= MANAGE
        for rule in rules
    )


def test_plugins_may_manage_their_custom_resources():
    enabled = set(flyte_config()["tasks"]["task-plugins"]["enabled-plugins"])
    for plugin, (group, resource) in CUSTOM_RESOURCES.items():
        if plugin in enabled:
            assert rbac_allows(group, resource), (
                f"plugin {plugin}: rbac.extraRules must allow {MANAGE} on {group}/{resource}"
            )


def test_propeller_uses_gkes_node_labels_and_spot_taint():
    k8s = k8s_plugin()
    assert k8s["gpu-device-node-label"] == "cloud.google.com/gke-accelerator"
    assert k8s["gpu-partition-size-node-label"] == "cloud.google.com/gke-gpu-partition-size"
    taint = re.search(r"--node-taints (\S+)=(\S+):(\w+)", POOLS.read_text()).groups()
    assert taint == (SPOT_LABEL, "true", "NoSchedule")
    assert {"key": SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"} in k8s[
        "interruptible-tolerations"
    ]
    assert k8s["interruptible-node-selector-requirement"] == {
        "key": SPOT_LABEL,
        "operator": "In",
        "values": ["true"],
    }
    assert k8s["non-interruptible-node-selector-requirement"] == {
        "key": SPOT_LABEL,
        "operator": "DoesNotExist",
    }


def go_duration(text: str) -> timedelta:
    units = {"h": "hours", "m": "minutes", "s": "seconds"}
    parts = re.findall(r"(\d+)([hms])", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"not a Go duration: {text}"
    return sum((timedelta(**{units[unit]: int(n)}) for n, unit in parts), timedelta())


def test_pending_pods_time_out_after_a_node_scale_up_and_before_the_task_timeout():
    pending = go_duration(k8s_plugin()["pod-pending-timeout"])
    assert timedelta(minutes=10) <= pending < Attempts().timeout


@pytest.mark.slow
def test_task_types_have_an_enabled_plugin(flyte_package):
    plugins = flyte_config()["tasks"]["task-plugins"]
    by_type = {t: plugin for plugin, types in POD_PLUGIN_TASK_TYPES.items() for t in types}
    by_type |= plugins["default-for-task-types"]
    enabled = set(plugins["enabled-plugins"])
    unhandled = [
        f"task {name}: type '{spec.template.type}'"
        for name, spec in sorted((flyte_package.tasks | flyte_package.podless).items())
        if by_type.get(spec.template.type) not in enabled
    ]
    assert not unhandled, (
        f"{unhandled} would fall back to a plain pod: enable its plugin and map it in tasks.task-plugins "
        f"({VALUES.name}), and install its operator"
    )
    assert by_type.get("pytorch") == "pytorch", (
        "default-for-task-types must map pytorch to the pytorch plugin"
    )


@pytest.mark.slow
def test_task_resource_limits_admit_every_task_and_planner_option(demands):
    configured = flyte_config().get("task_resources", {}).get("limits", {})
    limits = {name: str(value) for name, value in (BUILTIN_LIMITS | configured).items()}
    too_big = [
        f"{demand.source}: {name} {kind} {value} > task_resources.limits.{name} {limits[name]}"
        for demand in demands["task"] + demands["planner"]
        for kind, resources in (("request", demand.requests), ("limit", demand.limits))
        for name, value in resources.items()
        if name in limits and parse_quantity(value) > parse_quantity(limits[name])
    ]
    assert not too_big, "flyteadmin would reject or propeller clamp:\n" + "\n".join(too_big)


@pytest.mark.slow
def test_cron_schedules_fire_in_utc(flyte_package):
    cron = [
        name
        for name, plan in sorted(flyte_package.launch_plans.items())
        if plan.spec.entity_metadata.schedule.WhichOneof("ScheduleExpression")
        in ("cron_schedule", "cron_expression")
    ]
    assert cron, "the package has scheduled launch plans"
    local = flyte_config()["scheduler"]["workflowExecutor"]["local"]
    assert local.get("useUTCTz") is True, f"{cron} would fire in the scheduler's local time zone"


# --- Node pools -----------------------------------------------------------------------------------


def test_pools_use_the_machine_types_the_profiles_are_sized_for():
    wrong = []
    for pool in node_pools():
        if pool.gpu and MACHINE_FOR_GPU[pool.gpu[0]].name != pool.machine:
            wrong.append(
                f"{pool.name}: {pool.gpu[0]} on {pool.machine}, not {MACHINE_FOR_GPU[pool.gpu[0]].name}"
            )
        elif pool.gpu and int(pool.accelerator["count"]) != MACHINE_FOR_GPU[pool.gpu[0]].gpus:
            wrong.append(f"{pool.name}: {pool.accelerator['count']} GPUs, not all of {pool.machine}'s")
        elif machine(pool) is None:
            wrong.append(f"{pool.name}: machine type {pool.machine} unknown to tasks/hardware.py")
    assert not wrong, wrong


def test_the_cpu_pool_is_the_node_preprocessing_is_planned_within():
    (cpu,) = [pool for pool in node_pools() if pool.name == "cpu"]
    assert cpu.machine == CPU_NODE.name
    assert f"this machine's allocatable memory, {int(CPU_NODE.allocatable_memory_gib)}Gi" in POOLS.read_text()


def test_single_host_tpu_pools_pass_no_topology_and_gke_labels_it_from_the_machine_type():
    """GKE refuses --tpu-topology on single-host TPU pools; every slice tasks/catalog.py offers is one."""
    tpu_pools = [pool for pool in node_pools() if pool.tpu]
    assert tpu_pools and not [pool.name for pool in tpu_pools if pool.tpu_topology]
    assert "--tpu-topology" not in POOLS.read_text().split("set -euo pipefail")[1]


def script_driver_floor() -> tuple[str, str]:
    """(CUDA build of the torch-gpu image's torch, the driver floor) as the script states them."""
    text = POOLS.read_text()
    cuda = re.search(r"torch 2\.\d+ is PyPI's CUDA (\d+\.\d+) build", text).group(1)
    return cuda, re.search(r"^DRIVER_FLOOR=([\d.]+)$", text, re.MULTILINE).group(1)


def test_gpu_pools_install_the_latest_driver_at_the_floor_the_training_task_checks():
    gpu_pools = [pool for pool in node_pools() if pool.gpu]
    assert gpu_pools and {pool.accelerator.get("gpu-driver-version") for pool in gpu_pools} == {"latest"}
    cuda, floor = script_driver_floor()
    assert DRIVER_FLOOR[cuda] == floor, "the floor the script enforces is the one the training task checks"


def test_no_gpu_pool_is_created_where_latest_installs_a_driver_below_the_floor(tmp_path):
    """`latest` is the driver COS labels LATEST on the cluster's GKE version: one below the floor stops
    the script before its first GPU pool; at the floor, every GPU pool is created."""
    _, floor = script_driver_floor()
    major, minor, patch = floor.split(".")
    below = f"{major}.{minor}.{int(patch) - 1:02d}"
    (tmp_path / "below").mkdir()
    refused = run_pools_script(tmp_path / "below", latest_driver=below)
    assert refused.returncode != 0
    assert not [pool for pool in created_pools(refused) if pool.gpu], "a GPU pool below the floor"
    assert f"NVIDIA driver {below}" in refused.stderr and floor in refused.stderr
    (tmp_path / "at").mkdir()
    accepted = run_pools_script(tmp_path / "at", latest_driver=floor)
    assert accepted.returncode == 0, accepted.stderr
    assert [pool.name for pool in created_pools(accepted)] == [pool.name for pool in default_pools()]


def test_the_driver_look_up_reads_cos_driver_lists_and_refuses_gpus_it_lists_no_driver_for():
    sys.path.insert(0, str(DEPLOY))
    try:
        from gke_driver_floor import cos_build, latest_driver
    finally:
        sys.path.remove(str(DEPLOY))
    listing = """# COS's gpu_driver_versions.textproto
    gpu_driver_version_info: {
      gpu_device: { gpu_type: "NVIDIA_H100_80GB" }
      supported_driver_versions: { version: "570.172.08" label: "DEFAULT" }
      supported_driver_versions: { version: "580.95.05" label: "LATEST" }
    }
    gpu_driver_version_info: {
      gpu_device: { gpu_type: "NVIDIA_H100_MEGA_80GB" }
      supported_driver_versions: { version: "580.82.07" label: "LATEST" }
    }"""
    assert latest_driver(listing, "nvidia-h100-80gb") == "580.82.07"  # the lowest of the chip's types
    assert latest_driver(listing, "nvidia-l4") is None
    mapping = {"entries": [{"gke_version": "1.34.1-gke.2", "image": "cos-121-18867-199-28"}]}
    assert cos_build("1.34.1-gke.2", mapping) == "18867.199.28"
    with pytest.raises(LookupError, match="1.30.0-gke.1"):
        cos_build("1.30.0-gke.1", mapping)


def test_a_driver_look_up_that_fails_warns_and_leaves_the_refusal_to_the_tasks_gpu_guard(tmp_path):
    """GKE may move or reshape the published files: only a driver known to be below the floor stops."""
    gone = tmp_path / "missing.json"
    environment = os.environ | {"GKE_TO_COS_URL": gone.as_uri()}
    command = [sys.executable, str(DEPLOY / "gke_driver_floor.py"), "1.34.1-gke.2", "nvidia-l4", "580.65.06"]
    done = subprocess.run(command, env=environment, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "warning: could not tell which driver" in done.stderr and "580.65.06" in done.stderr


@pytest.mark.slow
def test_every_task_has_a_default_node_pool(demands):
    default_pools = tuple(pool for pool in node_pools() if not pool.optional)
    problems = [p for demand in demands["task"] if (p := unscheduled(demand, default_pools))]
    assert not problems, f"{POOLS.name}:\n" + "\n".join(problems)


@pytest.mark.slow
def test_the_multinode_pytorchjob_runs_on_demand_and_the_other_training_tasks_spot_first(
    flyte_package, demands
):
    """A PyTorchJob whose pods wait for capacity stays Created, which propeller reports as Queued
    (kfoperators/common/common_operator.go, GetPhaseInfo; the operator counts only Running pods
    active), and pod-pending-timeout applies to plain pods alone (pod/plugin.go, DemystifyPending): on
    spot without capacity its first attempt would wait out the task's timeout, 12 h. The single-node
    tasks are plain pods, so theirs move on demand after pod-pending-timeout."""
    interruptible = {
        name for name, spec in flyte_package.tasks.items() if spec.template.metadata.interruptible
    }
    assert interruptible == {f"tasks.{name}" for name in INTERRUPTIBLE_TRAINING}
    assert node_config()["ignore-retry-cause"] and node_config()["interruptible-failure-threshold"] == 1
    jobs = [demand for demand in demands["task"] if demand.nodes > 1]  # the task and its trial copy
    assert len(jobs) == 2
    assert all(not job.interruptible and unscheduled(job, default_pools()) is None for job in jobs)


@pytest.mark.slow
def test_training_pods_save_within_the_share_of_the_spot_notice_gke_gives_them(flyte_package):
    """The kubelet kills a spot node's ordinary pods SPOT_POD_SHUTDOWN_S after the notice, whatever
    their terminationGracePeriodSeconds: the checkpoint budget and the launcher's exit fit in it."""
    assert "--system-config-from-file" not in POOLS.read_text(), (
        "the pools extend the shutdown grace: read it here"
    )
    grace = {
        name: MessageToDict(spec.template.k8s_pod.pod_spec).get("terminationGracePeriodSeconds")
        for name, spec in flyte_package.tasks.items()
        if spec.template.metadata.interruptible
    }
    assert set(grace) == {f"tasks.{name}" for name in INTERRUPTIBLE_TRAINING}, grace
    assert all(seconds and seconds <= SPOT_POD_SHUTDOWN_S for seconds in grace.values()), grace
    assert Attempts().preemption_grace_s + LAUNCHER_EXIT_MARGIN_S <= SPOT_POD_SHUTDOWN_S


@pytest.mark.slow
def test_every_planner_option_has_a_node_pool_default_or_optional(demands):
    problems = [p for demand in demands["planner"] if (p := unscheduled(demand, node_pools()))]
    assert not problems, f"{POOLS.name}:\n" + "\n".join(problems)


def test_every_option_the_planner_ranks_by_default_has_a_default_pool():
    """The catalogs the planner ranks (TARGETS', with no extra options named) hold only options the
    script creates pools for by default, on demand and, for the interruptible tasks, on spot."""
    demands = [
        override_demand(
            f"planner option {entry.name} (target {name})",
            target.profile.overrides_for(entry),
            target.task.metadata.interruptible,
        )
        for name, target in TARGETS.items()
        for entry in target.catalog or []
    ]
    assert demands
    problems = [p for demand in demands if (p := unscheduled(demand, default_pools()))]
    assert not problems, f"{POOLS.name}:\n" + "\n".join(problems)


def test_the_optional_pools_are_those_of_the_extra_options():
    extra = option_demands(" ".join(extra_options()))
    optional = [pool for pool in node_pools() if pool.optional]
    unused = [pool.name for pool in optional if not any(serves(pool, d) and fits(pool, d) for d in extra)]
    assert optional and not unused, f"pools created for no extra option: {unused}"


@pytest.mark.slow
def test_the_default_run_of_every_target_is_planned_onto_a_default_pool():
    """The planner's own choice for the workflow's default inputs on the default data."""
    from tasks.core.data.fingerprint import dataset_fingerprint
    from tasks.preprocess import preprocess
    from tasks.right_sizing import EMBEDDED_FINGERPRINT, plan_report, size_preprocessing, workload
    from workflows.pipeline import training_pipeline

    inputs = training_pipeline.python_interface.default_inputs_as_kwargs
    data, config = inputs["data"], inputs["hyperparameters"]
    preprocess_plan, _ = size_preprocessing(data.dataset, data.label_column)
    fingerprint = dataset_fingerprint(data.dataset) if data.dataset else EMBEDDED_FINGERPRINT
    prepared = preprocess(data=data, dataset_fingerprint=fingerprint)
    problems = []
    for name, target in TARGETS.items():
        report = plan_report(
            name, workload(prepared, name, config), preprocess_plan, inputs["plan_resources"]
        )
        if target.catalog is None:
            assert not report.applied, name
            continue
        choice = report.training.choice
        source = f"target {name}: the default run's plan, {choice.name}"
        demand = override_demand(
            source, target.profile.overrides_for(choice), target.task.metadata.interruptible
        )
        if problem := unscheduled(demand, default_pools()):
            problems.append(problem)
    assert not problems, f"{POOLS.name}:\n" + "\n".join(problems)


# --- Spot first, then on demand -------------------------------------------------------------------

# Propeller's NodeConfig defaults (flytepropeller/pkg/controller/config/config.go, tag v1.16.8).
PROPELLER_NODE_DEFAULTS = {
    "ignore-retry-cause": False,
    "interruptible-failure-threshold": -1,
    "default-max-attempts": 1,
    "max-node-retries-system-failures": 3,
}


def node_config() -> dict:
    return PROPELLER_NODE_DEFAULTS | flyte_config().get("propeller", {}).get("node-config", {})


def above_threshold(failures: int, max_attempts: int, threshold: int) -> bool:
    """isAboveInterruptibleFailureThreshold, flytepropeller/pkg/controller/nodes/node_exec_context.go."""
    return failures >= threshold if threshold > 0 else failures >= max_attempts + threshold


def attempts_on_spot_without_capacity(retries: int) -> tuple[int, int]:
    """(attempts that wait on spot, attempts in all) of an interruptible task when spot has no capacity.
    Each spot attempt ends Pending past pod-pending-timeout, a retryable *user* failure, which is never
    a system failure (BuildNodeExecutionContext in node_exec_context.go; isEligibleForRetry in
    executor.go). Max attempts: retries + 1, or default-max-attempts without retries
    (computeRetryStrategy, flytepropeller/pkg/compiler/transformers/k8s/utils.go)."""
    node = node_config()
    threshold = node["interruptible-failure-threshold"]
    max_attempts = retries + 1 if retries else node["default-max-attempts"]
    for attempt in range(max_attempts):
        if node["ignore-retry-cause"]:
            on_demand = attempt > 0 and above_threshold(attempt, max_attempts, threshold)
        else:  # only system failures count, and a pending pod is none
            on_demand = above_threshold(0, node["max-node-retries-system-failures"] + 1, threshold)
        if on_demand:
            return attempt, max_attempts
    return max_attempts, max_attempts


@pytest.mark.slow
def test_without_spot_capacity_training_runs_on_demand_after_the_wait_the_docs_state(flyte_package):
    pending = go_duration(k8s_plugin()["pod-pending-timeout"])
    waits = {}
    for name, spec in sorted(flyte_package.tasks.items()):
        metadata = spec.template.metadata
        if metadata.interruptible:
            on_spot, attempts = attempts_on_spot_without_capacity(metadata.retries.retries)
            assert on_spot < attempts, f"{name}: all {attempts} attempts wait for spot capacity and fail"
            waits[name] = pending * on_spot
    assert set(waits) == {f"tasks.{name}" for name in INTERRUPTIBLE_TRAINING}
    (wait,) = set(waits.values())
    stated = re.search(r"waits (\d+) minutes", (REPO / "docs" / "planning.md").read_text())
    assert stated and timedelta(minutes=int(stated.group(1))) == wait, "docs/planning.md states the wait"


def test_a_node_without_retries_runs_once():
    """Propeller gives a node whose `retries` is 0 default-max-attempts attempts (computeRetryStrategy,
    flytepropeller/pkg/compiler/transformers/k8s/utils.go; isEligibleForRetry, executor.go). Above 1,
    a @dynamic that launches a training (retries 0) would rerun its timed-out child that many times."""
    assert flyte_config()["propeller"]["node-config"]["default-max-attempts"] == 1


def test_readme_prepares_the_cluster_in_order():
    section = readme_section("Run on a Flyte cluster")
    steps = [
        "deploy/gke-node-pools.sh",
        "training-operator",
        "-f deploy/flyte-binary-values.yaml",
        "docker build",
    ]
    positions = [section.find(step) for step in steps]
    assert -1 not in positions and positions == sorted(positions), dict(zip(steps, positions, strict=True))
    pinned = r"manifests/overlays/standalone\?ref=(v1\.\d+\.\d+)"
    operator = re.findall(pinned, (DEPLOY / "training-operator.md").read_text())
    assert operator and set(re.findall(pinned, section)) == set(operator), (
        "one pinned training operator release"
    )
