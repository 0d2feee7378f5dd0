"""GKE's GPUDirect networking: what a multi-node torch pod on an A3 machine declares, that every other
GPU pod declares none of it, and that the launcher loads the node's NCCL profile before any worker
starts (tasks/gpudirect.py, docs/reliability.md)."""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import replace

import pytest
from flytekit import task
from flytekit.configuration import ImageConfig, SerializationSettings
from flytekit.tools.translator import get_serializable
from google.protobuf.json_format import MessageToDict

from tasks.core.planning.machines import MachineType
from tasks.core.training.nccl_pairing import STACK_VARIABLE
from tasks.gpudirect import NODE_LIBRARIES, POD_LIBRARIES, PROFILE_VARIABLE, apply_node_profile
from tasks.hardware import (
    A2_ULTRAGPU_1G,
    A3_HIGHGPU_8G,
    A3_ULTRAGPU_8G,
    G2_STANDARD_8,
    TORCH_DDP_ENVIRONMENT,
    TRAIN_GPU,
    TRAIN_GPU_MULTINODE,
    GpuTrainingProfile,
)

A3_MEGAGPU_8G = MachineType("a3-megagpu-8g", 208, 1872, gpus=8)
SETTINGS = SerializationSettings(
    image_config=ImageConfig.from_images("r/cpu:v1", {"torch-gpu": "r/torch-gpu:v1", "cpu": "r/cpu:v1"})
)


def serialized_pod(profile: GpuTrainingProfile) -> dict:
    """The pod part of the spec the cluster receives for a torch task declared with `profile`:
    {"metadata": ..., "podSpec": ...}, as in tests/integration/test_serialization.py."""
    from tasks.train_torch import elastic

    decorated = task(task_config=elastic(profile), **profile.task_options())(train)
    return MessageToDict(get_serializable(OrderedDict(), SETTINGS, decorated).template.to_flyte_idl().k8s_pod)


def train(steps: int) -> int:
    """The task function each profile decorates here."""
    return steps


def on(machine: MachineType) -> GpuTrainingProfile:
    return replace(TRAIN_GPU_MULTINODE, machine=machine, gpudirect=True)


def primary(pod: dict) -> dict:
    (container,) = pod["podSpec"]["containers"]
    assert container["name"] == "primary"
    return container


def environment(container: dict) -> dict[str, str]:
    return {entry["name"]: entry["value"] for entry in container.get("env", [])}


def mounts(container: dict) -> dict[str, str]:
    """Mount path -> volume name."""
    return {mount["mountPath"]: mount["name"] for mount in container.get("volumeMounts", [])}


def host_paths(pod: dict) -> dict[str, str]:
    """Volume name -> host path, for the hostPath volumes."""
    volumes = pod["podSpec"].get("volumes", [])
    return {volume["name"]: volume["hostPath"]["path"] for volume in volumes if "hostPath" in volume}


@pytest.fixture(scope="module")
def tcpx_pod() -> dict:
    return serialized_pod(on(A3_HIGHGPU_8G))


@pytest.fixture(scope="module")
def tcpxo_pod() -> dict:
    return serialized_pod(on(A3_MEGAGPU_8G))


@pytest.mark.parametrize(
    "name, daemon, nics",
    [("tcpx", "tcpx-daemon", 4), ("tcpxo", "tcpxo-daemon", 8)],
    ids=["a3-high", "a3-mega"],
)
def test_a_gpudirect_pod_declares_the_gpu_nics_and_the_daemons_devices(request, name, daemon, nics):
    annotations = request.getfixturevalue(f"{name}_pod")["metadata"]["annotations"]
    assert annotations["networking.gke.io/default-interface"] == "eth0"
    interfaces = json.loads(annotations["networking.gke.io/interfaces"])
    assert interfaces[0] == {"interfaceName": "eth0", "network": "default"}
    assert interfaces[1:] == [{"interfaceName": f"eth{n}", "network": f"vpc{n}"} for n in range(1, nics + 1)]
    devices = annotations[f"devices.gke.io/container.{daemon}"].splitlines()
    assert [f"- path: /dev/nvidia{gpu}" for gpu in range(8)] == devices[:8]
    assert {"- path: /dev/nvidiactl", "- path: /dev/nvidia-uvm"} <= set(devices)


@pytest.mark.parametrize("name, daemon", [("tcpx", "tcpx-daemon"), ("tcpxo", "tcpxo-daemon")])
def test_the_daemon_is_a_native_sidecar_with_the_nodes_plugin_folder(request, name, daemon):
    """A sidecar init container that restarts always ends when the training container does, so the
    pod, and with it the PyTorchJob, can complete; a plain second container would keep it running."""
    pod = request.getfixturevalue(f"{name}_pod")
    (sidecar,) = pod["podSpec"]["initContainers"]
    assert (sidecar["name"], sidecar["restartPolicy"]) == (daemon, "Always")
    assert "NET_ADMIN" in sidecar["securityContext"]["capabilities"]["add"]
    assert sidecar["resources"]["requests"] == sidecar["resources"]["limits"]  # Guaranteed QoS kept
    volumes = host_paths(pod)
    assert volumes[mounts(sidecar)[POD_LIBRARIES]] == NODE_LIBRARIES
    assert volumes[mounts(sidecar)["/hostsysfs"]] == "/sys"
    assert volumes[mounts(sidecar)["/hostprocsysfs"]] == "/proc/sys"


@pytest.mark.parametrize("name", ["tcpx", "tcpxo"])
def test_the_training_container_finds_the_plugin_and_keeps_its_own_settings(request, name):
    pod = request.getfixturevalue(f"{name}_pod")
    container = primary(pod)
    assert host_paths(pod)[mounts(container)[POD_LIBRARIES]] == NODE_LIBRARIES
    variables = environment(container)
    assert variables["LD_LIBRARY_PATH"] == POD_LIBRARIES
    assert variables[STACK_VARIABLE] == name  # what each worker checks its NCCL against
    assert TORCH_DDP_ENVIRONMENT.items() <= variables.items()  # the task's own, unioned by flytekit
    assert container["resources"]["limits"]["gpu"] == "8"  # the task's resources still fill it in


def test_tcpx_passes_googles_settings_and_shares_the_daemons_socket(tcpx_pod):
    """TCPX's plugin ships no profile: the pod carries the settings of Google's TCPX example, and
    NCCL looks for the daemon's sockets where the shared volume is mounted in both containers."""
    container, (sidecar,) = primary(tcpx_pod), tcpx_pod["podSpec"]["initContainers"]
    variables = environment(container)
    assert variables["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "eth1,eth2,eth3,eth4"
    assert variables["NCCL_GPUDIRECTTCPX_CTRL_DEV"] == variables["NCCL_SOCKET_IFNAME"] == "eth0"
    socket_dir = variables["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"]
    uds_path = sidecar["command"][sidecar["command"].index("--uds_path") + 1]
    assert socket_dir == uds_path
    assert mounts(container)[socket_dir] == mounts(sidecar)[uds_path]
    assert PROFILE_VARIABLE not in variables


def test_tcpxo_names_the_nodes_profile_and_mounts_the_aperture_devices(tcpxo_pod):
    container = primary(tcpxo_pod)
    variables = environment(container)
    assert variables[PROFILE_VARIABLE] == f"{POD_LIBRARIES}/nccl-env-profile.sh"
    assert variables["NCCL_LIB_DIR"] == POD_LIBRARIES
    assert variables["NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY"] == "/dev/aperture_devices"
    assert host_paths(tcpxo_pod)[mounts(container)["/dev/aperture_devices"]] == "/dev/aperture_devices"
    devices = tcpxo_pod["metadata"]["annotations"]["devices.gke.io/container.tcpxo-daemon"]
    assert "- path: /dev/dmabuf_import_helper" in devices.splitlines()


@pytest.mark.parametrize(
    "profile",
    [
        TRAIN_GPU,
        on(G2_STANDARD_8),
        on(A2_ULTRAGPU_1G),
        on(A3_ULTRAGPU_8G),
        replace(on(A3_HIGHGPU_8G), gpudirect=False),
    ],
    ids=["declared-l4", "l4-node", "a100-node", "a3-ultra-node", "a3-high-without-gpudirect"],
)
def test_a_pod_without_gpudirect_declares_none_of_it(profile):
    """A plain GKE GPU pool, and an A3 High pool whose cluster has not set GPUDirect up, get only the
    grace period and the task's own settings."""
    pod = serialized_pod(profile)
    assert "metadata" not in pod or not pod["metadata"].get("annotations")
    assert "initContainers" not in pod["podSpec"] and "volumes" not in pod["podSpec"]
    container = primary(pod)
    assert environment(container) == TORCH_DDP_ENVIRONMENT
    assert "volumeMounts" not in container and "securityContext" not in container


def test_no_profile_named_changes_nothing():
    environ = {"NCCL_DEBUG": "WARN"}
    assert apply_node_profile(environ) == {} and environ == {"NCCL_DEBUG": "WARN"}


def test_a_named_profile_the_node_lacks_fails_naming_the_installer(tmp_path):
    environ = {PROFILE_VARIABLE: str(tmp_path / "absent.sh")}
    with pytest.raises(FileNotFoundError, match="installer DaemonSet has not run"):
        apply_node_profile(environ)


@pytest.mark.parametrize("name", ["tcpx", "tcpxo"])
def test_the_training_container_asks_for_no_capability(request, name):
    """IPC_LOCK in `capabilities.add` would give the image's uid 1000 nothing (tasks/gpudirect.py,
    `primary_with`, says why it is left out)."""
    assert "securityContext" not in primary(request.getfixturevalue(f"{name}_pod"))


def test_the_tcpxo_daemon_passes_only_the_flags_googles_example_passes(tcpxo_pod):
    """`--num_nics` is retired (gpudirect-tcpxo/README.md, "Nov 19, 2025"); Google's example has passed
    only `--num_hops=2` since container-engine-accelerators commit abbe8ddf."""
    (sidecar,) = tcpxo_pod["podSpec"]["initContainers"]
    (script,) = sidecar["args"]
    (entrypoint,) = [
        line for line in script.splitlines() if line.startswith("/fts/entrypoint_rxdm_container.sh")
    ]
    assert entrypoint.split()[1:] == ["--num_hops=2"]
