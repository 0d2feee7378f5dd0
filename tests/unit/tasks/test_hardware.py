"""Hardware names as GKE labels them, and requests that fit the nodes they are meant for."""

from __future__ import annotations

import pytest

from tasks.catalog import DEFAULT_PRICES_PER_HOUR, GPU_OPTIONS, TPU_OPTIONS
from tasks.core.planning.machines import DAEMONSET_ALLOWANCE, MachineType
from tasks.hardware import (
    MACHINE_FOR_GPU,
    TORCH_DDP_ENVIRONMENT,
    TRAIN_GPU,
    TRAIN_GPU_MULTINODE,
    TRAIN_TPU,
    gpu_accelerator,
    node_share,
)
from tasks.targets import TARGETS


def quantity(value: str) -> float:
    """cpu "6" or memory "24Gi" as a number of cores or GiB."""
    return float(value.removesuffix("Gi"))


def test_gke_allocatable_follows_the_documented_reservations():
    node = MachineType("g2-standard-8", 8, 32)
    # CPU: 6% of core 1, 1% of core 2, 0.5% of cores 3-4, 0.25% of cores 5-8.
    assert node.allocatable_cpu == pytest.approx(8 - 0.09 - DAEMONSET_ALLOWANCE[0])
    # Memory: 25% of 4, 20% of 4, 10% of 8, 6% of 16 GiB, and the 100 MiB eviction threshold.
    assert node.allocatable_memory_gib == pytest.approx(32 - 3.56 - 100 / 1024 - DAEMONSET_ALLOWANCE[1])
    big = MachineType("a3-highgpu-8g", 208, 1872)
    assert big.allocatable_memory_gib == pytest.approx(
        1872 - (1 + 0.8 + 0.8 + 6.72 + 0.02 * 1744) - 100 / 1024 - 1
    )


def fits(machine: MachineType, cpu: float, memory_gib: float) -> bool:
    """A pod asking for `cpu` and `memory_gib` fits on one node of `machine`."""
    return cpu <= machine.allocatable_cpu and memory_gib <= machine.allocatable_memory_gib


def test_a_request_of_the_whole_machine_does_not_fit():
    four_vcpu_l4 = MachineType("g2-standard-4", 4, 16)
    assert four_vcpu_l4.allocatable_cpu == pytest.approx(3.42)
    assert round(four_vcpu_l4.allocatable_memory_gib, 1) == 12.3
    assert not fits(four_vcpu_l4, 4, 12) and not fits(four_vcpu_l4, 3, 16)
    assert fits(four_vcpu_l4, 3, 12)


@pytest.mark.parametrize(
    "profile", [TRAIN_GPU, TRAIN_GPU_MULTINODE, TRAIN_TPU], ids=["gpu", "gpu-multinode", "tpu"]
)
def test_each_training_profile_fits_the_machine_it_is_meant_for(profile):
    assert fits(profile.machine, quantity(profile.cpu), quantity(profile.mem))


def planned_pod(entry) -> tuple[float, float]:
    """(CPU, GiB) the planner's overrides request for a GPU option."""
    sized = TARGETS["gpu"].profile.overrides_for(entry)["requests"]
    return float(sized.cpu), quantity(sized.mem)


@pytest.mark.parametrize("entry", GPU_OPTIONS, ids=lambda e: e.name)
def test_as_many_pods_of_a_gpu_option_fit_on_its_node_as_the_node_has_slices(entry):
    """A pod sized for its share leaves the node's other slices (or GPUs) room for their pods."""
    cpu, memory_gib = planned_pod(entry)
    machine, share = MACHINE_FOR_GPU[entry.device], node_share(entry)
    assert fits(machine, cpu / share, memory_gib / share)
    assert cpu >= 1 and memory_gib >= 8  # room for the launcher and its worker after rounding down


def test_a_mig_slice_takes_its_share_of_the_node_not_the_whole_node():
    by_name = {entry.name: entry for entry in GPU_OPTIONS}
    slice_cpu, slice_memory = planned_pod(by_name["a100-mig-1g.5gb"])
    whole_cpu, whole_memory = planned_pod(by_name["a100-40gb"])  # the same a2-highgpu-1g node
    assert slice_cpu <= whole_cpu / 7 and slice_memory <= whole_memory / 7


def test_the_cheapest_option_is_the_cheapest_to_run():
    """The price ranking the planner picks by is the ranking by what each option's pod takes of its
    node: its share of the node times the node's accelerators' price."""

    def cost_of_occupied_node(entry) -> float:
        machine = MACHINE_FOR_GPU[entry.device]
        return node_share(entry) * machine.gpus * DEFAULT_PRICES_PER_HOUR[entry.device]

    for entry in GPU_OPTIONS:
        assert entry.price_per_hour == pytest.approx(cost_of_occupied_node(entry)), entry.name
    by_price = sorted(GPU_OPTIONS, key=lambda entry: entry.price_per_hour)
    assert by_price == sorted(GPU_OPTIONS, key=cost_of_occupied_node)


@pytest.mark.parametrize("entry", TPU_OPTIONS, ids=lambda e: e.name)
def test_every_tpu_option_fits_its_tpu_vm(entry):
    profile = TRAIN_TPU.for_option(entry)
    assert fits(profile.machine, quantity(profile.cpu), quantity(profile.mem))
    assert profile.chips == entry.devices


def test_h100_and_h200_carry_gke_label_values():
    assert TRAIN_GPU_MULTINODE.device == "nvidia-h100-80gb"
    by_name = {entry.name: entry for entry in GPU_OPTIONS}
    whole = gpu_accelerator(by_name["h200-141gb"]).to_flyte_idl()
    assert (whole.device, whole.unpartitioned) == ("nvidia-h200-141gb", True)
    mig = gpu_accelerator(by_name["h100-mig-1g.10gb"]).to_flyte_idl()
    assert (mig.device, mig.partition_size) == ("nvidia-h100-80gb", "1g.10gb")
    assert gpu_accelerator(by_name["h200-mig-3g.71gb"]).to_flyte_idl().partition_size == "3g.71gb"


def test_each_target_dispatches_to_its_frameworks_task_on_an_image_for_its_hardware():
    """Validation, planning and dispatch all read the target table (tasks/targets.py). Each target's
    task is its framework's; an image serves one framework (a pod pulls one CUDA stack at most) and
    the TPU image exactly the TPU slices; the planner chooses only from the target's own hardware
    family, and a target without a catalog is multi-node, keeping the profile it declares."""
    from tasks.core.training.config import TrainConfig
    from tasks.core.validation import training_problems
    from tasks.hardware import TpuSliceProfile

    task_modules = {"pytorch": "tasks.train_torch.", "tensorflow": "tasks.train_tf."}
    frameworks_by_image: dict[str, set[str]] = {}
    for name, target in TARGETS.items():
        assert target.task.name.startswith(task_modules[target.framework]), name
        image = target.image.split(".")[2]  # "{{.image.NAME.fqn}}:..."
        frameworks_by_image.setdefault(image, set()).add(target.framework)
        on_tpu = isinstance(target.profile, TpuSliceProfile)
        assert (image == "tpu") == on_tpu, name
        if target.catalog is None:
            assert not on_tpu and target.profile.nnodes > 1, name
        else:
            kinds = {entry.kind for entry in target.catalog}
            assert kinds and kinds <= ({"tpu"} if on_tpu else {"gpu", "mig"}), (name, kinds)
    assert all(len(frameworks) == 1 for frameworks in frameworks_by_image.values()), frameworks_by_image
    assert {"pytorch", "tensorflow"} == {target.framework for target in TARGETS.values()}
    assert training_problems("cuda", TrainConfig(), TARGETS) == [
        f"input 'target' = 'cuda': not one of {', '.join(TARGETS)}; pass e.g. --target gpu"
    ]


@pytest.mark.parametrize("name", TARGETS)
def test_each_targets_task_is_decorated_with_its_profiles_task_options(name):
    """What a training task declares is its profile's, whatever the framework: one place to change."""
    target = TARGETS[name]
    task, profile = target.task, target.profile
    assert task.container_image == profile.image == target.image
    assert task.accelerator.to_flyte_idl() == profile.accelerator.to_flyte_idl()
    grace = task.pod_template.pod_spec.termination_grace_period_seconds
    assert grace == profile.attempts.termination_grace_s
    assert (task.metadata.retries, task.metadata.interruptible) == (
        profile.attempts.retries,
        profile.attempts.interruptible,
    )


def test_only_the_torch_tasks_get_the_nccl_environment():
    environments = {name: target.task.environment for name, target in TARGETS.items()}
    assert environments["gpu"] == environments["gpu-multinode"] == TORCH_DDP_ENVIRONMENT
    assert environments["gpu-tf"] == environments["tpu"] == {}


def test_a_profile_declares_its_hardware_in_a_record_and_in_words():
    from tasks.core.training.records import Hardware

    assert TRAIN_TPU.declared(1) == Hardware("tpu-v5-lite-podslice", 4, "2x2")  # billed whole
    assert TRAIN_GPU.declared(1) == Hardware("nvidia-l4", 1)
    assert TRAIN_TPU.describe() == "a TPU v5e 2x2 slice (4 chips, tpu-v5-lite-podslice)"
    assert TRAIN_GPU_MULTINODE.describe() == "8 x nvidia-h100-80gb GPU"


@pytest.mark.parametrize("entry", TPU_OPTIONS, ids=lambda e: e.name)
def test_a_tpu_option_moves_the_task_to_its_slice(entry):
    overrides = TARGETS["tpu"].profile.overrides_for(entry)
    accelerator = overrides["accelerator"].to_flyte_idl()
    assert (accelerator.device, accelerator.partition_size) == (entry.device, entry.partition)
    pod = overrides["pod_template"].pod_spec
    assert pod.node_selector["cloud.google.com/gke-tpu-topology"] == entry.partition
    assert pod.containers[0].resources.limits["google.com/tpu"] == str(entry.devices)
    assert "requests" not in overrides  # the pod template carries them; flytekit would replace them


def test_a_gpu_profile_refuses_a_tpu_option_naming_it():
    with pytest.raises(ValueError, match="planner option tpu-v5e-1x1 is a tpu option, not a GPU"):
        TRAIN_GPU.overrides_for(TPU_OPTIONS[0])


def test_catalog_prices_come_from_the_one_price_table():
    """A price is stated once: options cost their devices (or their MIG share) at the table's price."""
    from tasks.catalog import DEFAULT_PRICES_PER_HOUR, GPU_OPTIONS, TPU_OPTIONS
    from tasks.hardware import MIG_COMPUTE_SLICES

    for entry in GPU_OPTIONS + TPU_OPTIONS:
        per_device = DEFAULT_PRICES_PER_HOUR[entry.device]
        share = int(entry.partition.split("g.")[0]) / MIG_COMPUTE_SLICES if entry.kind == "mig" else 1
        assert entry.price_per_hour == pytest.approx(per_device * entry.devices * share), entry.name
    (two_by_two,) = [entry for entry in TPU_OPTIONS if entry.name == "tpu-v5e-2x2"]
    assert (two_by_two.devices, two_by_two.price_per_hour) == (4, pytest.approx(4.80))


@pytest.mark.parametrize("entry", [None, *TPU_OPTIONS], ids=lambda e: e.name if e else "declared")
def test_the_tpu_container_runs_as_root_without_privileged_mode(entry):
    """As GKE's TPU examples run it: the image's uid 1000 has no documented access to the TPU devices,
    and GKE 1.28 and later need no privileged mode (docs/tensorflow-tpu.md, "The TPU devices")."""
    from collections import OrderedDict

    from flytekit import task
    from flytekit.configuration import ImageConfig, SerializationSettings
    from flytekit.tools.translator import get_serializable
    from google.protobuf.json_format import MessageToDict

    profile = TRAIN_TPU if entry is None else TRAIN_TPU.for_option(entry)

    def train(steps: int) -> int:
        return steps

    settings = SerializationSettings(image_config=ImageConfig.from_images("r/tpu:v1", {"tpu": "r/tpu:v1"}))
    spec = get_serializable(OrderedDict(), settings, task(**profile.task_options())(train)).template
    (primary,) = MessageToDict(spec.to_flyte_idl().k8s_pod.pod_spec)["containers"]
    assert primary["securityContext"] == {"runAsUser": 0, "runAsGroup": 0}
