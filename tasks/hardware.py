"""Hardware profiles: the one place that says what each stage runs on.

Tasks refer to these profiles; change a GPU type or a size here, not in the tasks. A training profile
holds everything its task's decorator needs (`task_options`), the hardware the task reports as
declared (`declared`), and the node overrides that move it to a planner option (`overrides_for`).
docs/accelerators.md lists what adding an accelerator family touches.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from datetime import timedelta

from flytekit import Cache, PodTemplate, Resources
from flytekit.extras.accelerators import (
    A100,
    A100_80GB,
    L4,
    V5E,
    V5P,
    V6E,
    BaseAccelerator,
    GPUAccelerator,
    MultiInstanceGPUAccelerator,
)
from kubernetes.client import V1Container, V1PodSpec, V1ResourceRequirements, V1SecurityContext, V1Toleration

from tasks.core.planning.machines import MachineType
from tasks.core.planning.planner import CatalogEntry
from tasks.core.training.launch import DEFAULT_LOCAL_CPU_WORKERS
from tasks.core.training.preemption import DEFAULT_GRACE_S
from tasks.core.training.records import Hardware
from tasks.gpudirect import with_gpudirect
from tasks.images import image

# The images (tasks/images.py says what each holds).
CPU_IMAGE = image("cpu")
ML_CPU_IMAGE = image("ml-cpu")
TORCH_GPU_IMAGE = image("torch-gpu")
TF_GPU_IMAGE = image("tf-gpu")
TPU_IMAGE = image("tpu")
# The torch GPU tasks' environment: NCCL's warnings in the log, and a failed or timed-out collective
# ends the worker rather than leave it hanging (docs/reliability.md).
TORCH_DDP_ENVIRONMENT = {"NCCL_DEBUG": "WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}
# "1" where the cluster's GPU node pools have GKE's GPUDirect networking (deploy/gpudirect/README.md):
# the multi-node pods on a machine type with GPUDirect then declare it (tasks/gpudirect.py). Read
# wherever this module is imported: set it for `pyflyte register` / `make package`.
GPUDIRECT_VARIABLE = "MIXEDML_GPUDIRECT"


def guaranteed(profile: CpuProfile | GpuTrainingProfile) -> dict:
    """Task requests equal to limits: Kubernetes' Guaranteed QoS, so a pod gets what was sized."""
    return {"requests": profile.resources, "limits": profile.resources}


class H100_80GB(MultiInstanceGPUAccelerator):
    """H100 as GKE labels its nodes (`cloud.google.com/gke-accelerator`); flytekit's H100 says
    `nvidia-h100`, which no GKE node carries. MIG profiles as NVIDIA's MIG guide lists them."""

    device = "nvidia-h100-80gb"


class H200_141GB(MultiInstanceGPUAccelerator):
    """H200 as GKE labels its nodes; flytekit 1.16 has no H200 class."""

    device = "nvidia-h200-141gb"


H100, H200 = H100_80GB().unpartitioned, H200_141GB().unpartitioned

# Compute Engine machine types (vCPUs, memory, GPUs) that the profiles and catalogs are sized for.
G2_STANDARD_8 = MachineType("g2-standard-8", 8, 32, gpus=1)  # L4
A2_HIGHGPU_1G = MachineType("a2-highgpu-1g", 12, 85, gpus=1)  # A100 40GB
A2_ULTRAGPU_1G = MachineType("a2-ultragpu-1g", 12, 170, gpus=1)  # A100 80GB
A3_HIGHGPU_8G = MachineType("a3-highgpu-8g", 208, 1872, gpus=8)  # H100 80GB
A3_ULTRAGPU_8G = MachineType("a3-ultragpu-8g", 224, 2952, gpus=8)  # H200 141GB
# The largest CPU node: deploy/gke-node-pools.sh's `cpu` pool. Preprocessing is planned within it.
CPU_NODE = MachineType("n2-standard-8", 8, 32)
# The node type each GPU model comes on, for the planner's options.
MACHINE_FOR_GPU = {
    L4.to_flyte_idl().device: G2_STANDARD_8,
    "nvidia-tesla-a100": A2_HIGHGPU_1G,
    "nvidia-a100-80gb": A2_ULTRAGPU_1G,
    H100_80GB.device: A3_HIGHGPU_8G,
    H200_141GB.device: A3_ULTRAGPU_8G,
}


@dataclass(frozen=True)
class CpuProfile:
    cpu: str
    mem: str

    @property
    def resources(self) -> Resources:
        return Resources(cpu=self.cpu, mem=self.mem)


# Seconds a preempted pod keeps after its workers' grace budget, for the launcher to exit.
LAUNCHER_EXIT_MARGIN_S = 5
# Each training task's trial copy (`*_trial`, which tuning runs) is cached under this version and its
# inputs (the data, its config, the checkpoint it resumes): a rerun of a study reuses its finished
# trials. Change it when training changes its results. On the task, not the node: propeller reads the
# cache settings of a node's task template only (flytepropeller/pkg/controller/nodes/task/cache.go,
# IsCacheable, tag v1.16.8), and flytekit's local runs do too.
TRIAL_CACHE = Cache(version="tuning-trial-3")


@dataclass(frozen=True)
class Attempts:
    """How Flyte runs and retries a training task (docs/reliability.md says why these values).

    `retries` is the task's budget for every retryable failure: on a cluster set up with
    deploy/flyte-binary-values.yaml (`ignore-retry-cause`) a preemption, a lost node, an out-of-memory
    kill, `timeout` expiry, a recoverable worker error or a failed PyTorchJob each spend one.
    `timeout` bounds each attempt, from its start (a pod stuck Pending counts); propeller fails the
    node for good at twice this since it was first queued, whatever retries are left.
    `preemption_grace_s` is the budget from SIGTERM to a saved checkpoint; the pod's
    terminationGracePeriodSeconds is this plus LAUNCHER_EXIT_MARGIN_S.
    `interruptible` lets the task run on spot capacity, where the cluster maps it there.
    """

    retries: int = 2
    timeout: timedelta = timedelta(hours=12)
    preemption_grace_s: int = DEFAULT_GRACE_S
    interruptible: bool = True

    @property
    def termination_grace_s(self) -> int:
        return self.preemption_grace_s + LAUNCHER_EXIT_MARGIN_S

    def task_options(self) -> dict:
        """@task arguments: interruptible, retries, timeout."""
        return {"interruptible": self.interruptible, "retries": self.retries, "timeout": self.timeout}


@dataclass(frozen=True)
class GpuTrainingProfile:
    accelerator: GPUAccelerator | MultiInstanceGPUAccelerator
    gpus_per_node: int
    nnodes: int
    cpu: str
    mem: str
    shared_memory: str
    machine: MachineType  # the node type it is sized for: cpu and mem fit its allocatable
    image: str  # the GPU image of the framework that trains on it
    environment: dict[str, str] = field(default_factory=dict)  # the task container's variables
    # Worker processes when the task runs where there is no GPU (a laptop, CI): DDP over gloo.
    local_cpu_workers: int = DEFAULT_LOCAL_CPU_WORKERS
    # Seconds to wait for every node to join; multi-node runs wait for node scale-up and image pulls.
    rendezvous_timeout_s: int = 900
    # Worker-group restarts torch elastic makes after a worker fails: none. A restarted worker would
    # resume from the previous attempt's checkpoint, and a deterministic error would repeat; a failure
    # ends the attempt at once and Flyte retries the transient ones (docs/reliability.md).
    max_restarts: int = 0
    attempts: Attempts = Attempts()
    # The pods use GKE's GPUDirect networking where `machine` has it (tasks/gpudirect.py): only
    # multi-node pods, which use all of a node's GPUs and NICs, and only where the pools have it.
    gpudirect: bool = False

    @property
    def resources(self) -> Resources:
        return Resources(cpu=self.cpu, mem=self.mem, gpu=str(self.gpus_per_node))

    @property
    def device(self) -> str:
        return self.accelerator.to_flyte_idl().device

    def describe(self) -> str:
        return f"{self.gpus_per_node} x {self.device} GPU"

    def declared(self, gpus: int) -> Hardware:
        """What a run on `gpus` of this profile's GPUs reports, and is billed for without a plan."""
        return Hardware(self.device, gpus)

    def pod_template(self) -> PodTemplate:
        """The grace period, and GPUDirect networking where the profile uses it: resources,
        accelerator and shared memory come from the task."""
        template = PodTemplate(
            primary_container_name="primary",
            pod_spec=V1PodSpec(
                containers=[], termination_grace_period_seconds=self.attempts.termination_grace_s
            ),
        )
        return with_gpudirect(template, self.machine.name) if self.gpudirect else template

    def task_options(self) -> dict:
        """@task arguments: image, Guaranteed resources, GPU, shared memory, pod template, attempts."""
        return dict(
            container_image=self.image,
            **guaranteed(self),
            accelerator=self.accelerator,
            shared_memory=self.shared_memory,
            pod_template=self.pod_template(),
            environment=dict(self.environment),
            **self.attempts.task_options(),
        )

    def overrides_for(self, choice: CatalogEntry) -> dict:
        """Node overrides that put the task on a planner option from the GPU catalog."""
        return gpu_option_overrides(choice)


PREPROCESS_CPU = CpuProfile(cpu="2", mem="4Gi")
# The small CPU pod of the tasks that plan, check, collect or copy rather than compute.
SMALL_CPU = CpuProfile(cpu="1", mem="2Gi")
# `retries` of the tasks that do not train (docs/reliability.md, "The choices per task"). Propeller
# reads `retries: 0` as unset and gives the task default-max-attempts attempts, 1 in deploy/'s values.
# A CPU task runs on demand, where a node is seldom lost; its failures are mostly deterministic.
CPU_RETRIES = 1
# A map task's piece rewrites only its own part, and a run has many pieces: a lost pod costs one retry.
PIECE_RETRIES = 2
# A @dynamic that plans and launches a sub-workflow. Propeller retries it when a child times out,
# rerunning the child with all its retries (dynamic_workflow.go), so it gets none of its own.
LAUNCHER_RETRIES = 0
TRAIN_GPU = GpuTrainingProfile(
    accelerator=L4,
    gpus_per_node=1,
    nnodes=1,
    cpu="6",
    mem="24Gi",
    shared_memory="2Gi",
    machine=G2_STANDARD_8,
    image=TORCH_GPU_IMAGE,
    environment=TORCH_DDP_ENVIRONMENT,
)
# The TensorFlow GPU task's: the same GPUs, in TensorFlow's image.
TRAIN_TF_GPU = replace(TRAIN_GPU, image=TF_GPU_IMAGE, environment={})
# nnodes > 1 makes the training task a Kubeflow PyTorchJob with one worker replica per node.
TRAIN_GPU_MULTINODE = GpuTrainingProfile(
    accelerator=H100,
    gpus_per_node=8,
    nnodes=2,
    cpu="64",
    mem="512Gi",
    shared_memory="64Gi",
    machine=A3_HIGHGPU_8G,
    image=TORCH_GPU_IMAGE,
    environment=TORCH_DDP_ENVIRONMENT,
    rendezvous_timeout_s=1800,
    # On demand, unlike the single-node tasks: a PyTorchJob whose pods wait for spot capacity stays
    # Created, which propeller reports as Queued, and pod-pending-timeout applies to plain pods only,
    # so its first attempt would wait out the 12 h timeout (docs/reliability.md). One retry more than
    # theirs: twice the nodes to lose, and GPU VMs stop for host maintenance.
    attempts=Attempts(retries=3, interruptible=False),
    gpudirect=os.environ.get(GPUDIRECT_VARIABLE, "") == "1",
)


# GKE's TPU node label values, the flytekit accelerator for each, and the single-host
# topologies (one pod = one TPU VM) with the machine type GKE runs each on. Multi-host slices need
# one pod per host and are not offered.
TPU_GENERATIONS = {
    "v5e": (
        V5E,
        {
            "1x1": MachineType("ct5lp-hightpu-1t", 24, 48),
            "2x2": MachineType("ct5lp-hightpu-4t", 112, 192),
            "2x4": MachineType("ct5lp-hightpu-8t", 224, 384),
        },
    ),
    "v5p": (V5P, {"2x2x1": MachineType("ct5p-hightpu-4t", 208, 448)}),
    "v6e": (
        V6E,
        {
            "1x1": MachineType("ct6e-standard-1t", 44, 176),
            "2x2": MachineType("ct6e-standard-4t", 180, 720),
            "2x4": MachineType("ct6e-standard-8t", 180, 1440),
        },
    ),
}
TPU_GENERATION_OF = {accelerator.device: name for name, (accelerator, _) in TPU_GENERATIONS.items()}
TPU_TAINT_KEY = "google.com/tpu"


@dataclass(frozen=True)
class TpuSliceProfile:
    generation: str
    topology: str
    cpu: str
    mem: str
    attempts: Attempts = Attempts()
    image: str = TPU_IMAGE

    def __post_init__(self) -> None:
        if self.generation not in TPU_GENERATIONS:
            raise ValueError(f"TPU generation '{self.generation}' is not one of {', '.join(TPU_GENERATIONS)}")
        topologies = TPU_GENERATIONS[self.generation][1]
        if self.topology not in topologies:
            raise ValueError(
                f"TPU {self.generation} topology '{self.topology}' is not a single-host slice; "
                f"use one of {', '.join(topologies)}"
            )

    @property
    def accelerator(self) -> MultiInstanceGPUAccelerator:
        return TPU_GENERATIONS[self.generation][0].partitioned(self.topology)

    @property
    def gke_accelerator(self) -> str:
        return self.accelerator.device

    @property
    def machine(self) -> MachineType:
        return TPU_GENERATIONS[self.generation][1][self.topology]

    @property
    def chips(self) -> int:
        return math.prod(int(side) for side in self.topology.split("x"))

    def describe(self) -> str:
        return f"a TPU {self.generation} {self.topology} slice ({self.chips} chips, {self.gke_accelerator})"

    def declared(self, replicas: int) -> Hardware:
        """What a run on this slice reports, and is billed for without a plan: the whole slice, which
        is allocated whole whatever replicas the run used."""
        return Hardware(self.gke_accelerator, self.chips, self.topology)

    def pod_template(self) -> PodTemplate:
        """What GKE needs to place the pod on a TPU node, even without an accelerator mapping in Flyte.

        The task must not also set requests/limits: flytekit would replace these resources.
        """
        resources = {"cpu": self.cpu, "memory": self.mem, TPU_TAINT_KEY: str(self.chips)}
        return PodTemplate(
            primary_container_name="primary",
            pod_spec=V1PodSpec(
                containers=[
                    V1Container(
                        name="primary",
                        resources=V1ResourceRequirements(requests=resources, limits=resources),
                        # As root, the user of GKE's TPU examples (their images set none): GKE documents
                        # TPU access without privileged mode from 1.28 for those, and nothing for the tpu
                        # image's uid 1000 (docs/tensorflow-tpu.md, "The TPU devices").
                        security_context=V1SecurityContext(run_as_user=0, run_as_group=0),
                    )
                ],
                node_selector={
                    "cloud.google.com/gke-tpu-accelerator": self.gke_accelerator,
                    "cloud.google.com/gke-tpu-topology": self.topology,
                },
                tolerations=[V1Toleration(key=TPU_TAINT_KEY, operator="Exists", effect="NoSchedule")],
                termination_grace_period_seconds=self.attempts.termination_grace_s,
            ),
        )

    def task_options(self) -> dict:
        """@task arguments: image, TPU, pod template, attempts; no requests/limits (`pod_template`)."""
        return dict(
            container_image=self.image,
            accelerator=self.accelerator,
            pod_template=self.pod_template(),
            **self.attempts.task_options(),
        )

    def for_option(self, choice: CatalogEntry) -> TpuSliceProfile:
        """This profile on the slice a planner option from the TPU catalog names."""
        return replace(self, generation=TPU_GENERATION_OF[choice.device], topology=choice.partition)

    def overrides_for(self, choice: CatalogEntry) -> dict:
        """Node overrides that put the task on a planner option from the TPU catalog."""
        planned = self.for_option(choice)
        return {"accelerator": planned.accelerator, "pod_template": planned.pod_template()}


# What a training target declares, and what its task's decorator and planned overrides come from.
TrainingProfile = GpuTrainingProfile | TpuSliceProfile
TRAIN_TPU = TpuSliceProfile(generation="v5e", topology="2x2", cpu="8", mem="32Gi")

MIG_COMPUTE_SLICES = 7  # a GPU's MIG compute slices; a MIG slice is priced and sized by its share


def gpu_share(partition: str) -> float:
    """The part of one GPU an option uses: a MIG partition ("<compute slices>g.<memory>gb", as NVIDIA
    names it) its compute slices' share, a whole GPU ("") all of it."""
    return int(partition.split("g.")[0]) / MIG_COMPUTE_SLICES if partition else 1.0


# The GPUs with MIG partitions, by device name.
MIG_GPUS = {
    "nvidia-tesla-a100": A100,
    "nvidia-a100-80gb": A100_80GB,
    H100_80GB.device: H100,
    H200_141GB.device: H200,
}


def gpu_accelerator(entry: CatalogEntry) -> BaseAccelerator:
    """The flytekit accelerator for a GPU catalog option: a MIG partition or a whole GPU."""
    base = MIG_GPUS.get(entry.device)
    if entry.kind == "mig":
        return base.partitioned(entry.partition)
    if entry.kind != "gpu":
        raise ValueError(f"planner option {entry.name} is a {entry.kind} option, not a GPU")
    return base.unpartitioned if base is not None else GPUAccelerator(entry.device)


def node_share(entry: CatalogEntry) -> float:
    """The part of its node a GPU option's pod occupies: its GPUs' share of the machine's GPUs."""
    return entry.devices * gpu_share(entry.partition) / MACHINE_FOR_GPU[entry.device].gpus


def gpu_option_resources(entry: CatalogEntry) -> Resources:
    """A GPU option's pod: CPU and memory in proportion to its node share, so that as many such pods
    fit on one node as the node has slices (or GPUs) of its kind, and none strands the others."""
    cpu, memory_gib = MACHINE_FOR_GPU[entry.device].share(node_share(entry))
    return Resources(cpu=f"{cpu:g}", mem=f"{memory_gib}Gi", gpu=str(entry.devices))


def gpu_option_overrides(entry: CatalogEntry) -> dict:
    """Node overrides that put a GPU task (training or scoring) on a GPU catalog option."""
    accelerator = gpu_accelerator(entry)
    sized = gpu_option_resources(entry)
    return {"accelerator": accelerator, "requests": sized, "limits": sized}
