"""GKE's GPUDirect networking on A3 machines: what a multi-node torch pod adds so that NCCL moves
gradients over the node's GPU NICs instead of the one primary NIC.

A3 High (`a3-highgpu-8g`) has GPUDirect-TCPX over 4 GPU NICs, A3 Mega (`a3-megagpu-8g`)
GPUDirect-TCPXO over 8. On both, Google's installer DaemonSet copies the NCCL plugin to the node, and
each pod declares what GKE's examples declare (GoogleCloudPlatform/container-engine-accelerators,
`gpudirect-tcpx/nccl-test-latest.yaml`, `gpudirect-tcpxo/nccl-test-latest.yaml`): the GPU NICs'
networks and the daemon's GPU devices as annotations, the daemon as a sidecar, and the host's plugin
folder mounted where the NCCL plugin is looked for. docs/reliability.md lists it all, with the
cluster's side in deploy/gpudirect/README.md. Any other machine type gets nothing.

The TCPXO plugin ships its NCCL settings as a profile script on the node (`nccl-env-profile.sh`,
matched to the installed plugin version): the pod names it in PROFILE_VARIABLE and the launcher
sources it before it starts the workers (`apply_node_profile`). The TCPX plugin ships none, so its
settings are the ones Google's TCPX example passes (`gpudirect-tcpx/nccl-config.yaml`, run-nccl.sh).
Both plugins run with torch's own NCCL, not the node's: each worker names it at start-up and fails on
any other (tasks/core/training/nccl_pairing.py says why that pairing).
"""

from __future__ import annotations

import copy
import os
import subprocess
from collections.abc import MutableMapping
from dataclasses import dataclass, field

from flytekit import PodTemplate
from kubernetes.client import (
    V1Capabilities,
    V1Container,
    V1EmptyDirVolumeSource,
    V1EnvVar,
    V1HostPathVolumeSource,
    V1ResourceRequirements,
    V1SecurityContext,
    V1Volume,
    V1VolumeMount,
)

from tasks.core.training.nccl_pairing import POD_LIBRARIES, STACK_VARIABLE

# The pod variable naming the node's NCCL profile script, which the launcher sources.
PROFILE_VARIABLE = "MIXEDML_NCCL_ENV_PROFILE"
# Where the installer puts the plugin on the node (GKE's examples mount it in the pod at POD_LIBRARIES).
NODE_LIBRARIES = "/home/kubernetes/bin/nvidia/lib64"
GPU_DEVICES = tuple(f"/dev/nvidia{index}" for index in range(8)) + ("/dev/nvidiactl", "/dev/nvidia-uvm")
# The daemon's share of the pod, as GKE's Autopilot TCPX example requests it; requests equal limits,
# so the pod keeps Guaranteed QoS.
DAEMON_RESOURCES = {"cpu": "1", "memory": "2Gi"}
TCPX_SOCKET = "/run/tcpx"  # the daemon's Unix sockets, in a volume the two containers share
# The daemons as GKE's examples start them; the TCPX flag's escaped quotes are the manifest's own.
TCPX_DAEMON_COMMAND = [
    "/tcpgpudmarxd/build/app/tcpgpudmarxd",
    *("--gpu_nic_preset", "a3vm"),
    *("--gpu_shmem_type", "fd"),
    *("--uds_path", TCPX_SOCKET),
    *("--setup_param", '\\"--verbose 128 2 0 \\"'),
]
# `--num_nics` is retired (gpudirect-tcpxo/README.md, "Nov 19, 2025"); Google's example passes only
# `--num_hops=2` since container-engine-accelerators commit abbe8ddf (gpudirect-tcpxo/nccl-test-latest.yaml).
TCPXO_DAEMON_SCRIPT = """set -ex
chmod 755 /fts/entrypoint_rxdm_container.sh
/fts/entrypoint_rxdm_container.sh --num_hops=2
"""


@dataclass(frozen=True)
class GpuDirectStack:
    """One GPUDirect variant: its sidecar daemon and what the training container needs beside it."""

    name: str
    daemon: V1Container
    gpu_nics: int
    daemon_devices: tuple[str, ...]
    environment: dict[str, str]  # the training container's, besides the node profile
    volumes: list[V1Volume] = field(default_factory=list)  # besides the plugin folder and /sys
    mounts: list[V1VolumeMount] = field(default_factory=list)  # the training container's, likewise


def host_volume(name: str, path: str) -> V1Volume:
    return V1Volume(name=name, host_path=V1HostPathVolumeSource(path=path))


def daemon_container(name: str, image: str, command: list[str], args: list[str] | None,
                     capabilities: list[str], mounts: list[V1VolumeMount]) -> V1Container:  # fmt: skip
    """A native sidecar (an init container that restarts always): it starts before the training
    container and is stopped when that one exits, so the pod, and the PyTorchJob, can complete."""
    return V1Container(
        name=name,
        image=image,
        command=command,
        args=args,
        restart_policy="Always",
        security_context=V1SecurityContext(capabilities=V1Capabilities(add=capabilities)),
        volume_mounts=[
            V1VolumeMount(name="gpudirect-libraries", mount_path=POD_LIBRARIES),
            V1VolumeMount(name="gpudirect-sys", mount_path="/hostsysfs"),
            V1VolumeMount(name="gpudirect-proc-sys", mount_path="/hostprocsysfs"),
            *mounts,
        ],
        env=[V1EnvVar(name="LD_LIBRARY_PATH", value=POD_LIBRARIES)],
        resources=V1ResourceRequirements(requests=DAEMON_RESOURCES, limits=DAEMON_RESOURCES),
    )


def tcpx() -> GpuDirectStack:
    """A3 High: the daemon's flags and image as in `gpudirect-tcpx/nccl-test-latest.yaml`; NCCL's
    settings as `gpudirect-tcpx/nccl-config.yaml` passes them (plugin v3.1.9, the installer's)."""
    socket = V1VolumeMount(name="gpudirect-tcpx-socket", mount_path=TCPX_SOCKET)
    daemon = daemon_container(
        "tcpx-daemon",
        "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpx/tcpgpudmarxd-dev:v2.0.12",
        TCPX_DAEMON_COMMAND,
        None,
        ["NET_ADMIN"],
        [socket],
    )
    nics = "eth1,eth2,eth3,eth4"
    environment = {
        "LD_LIBRARY_PATH": POD_LIBRARIES,
        STACK_VARIABLE: "tcpx",
        "NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX": TCPX_SOCKET,
        "NCCL_SOCKET_IFNAME": "eth0",
        "NCCL_GPUDIRECTTCPX_CTRL_DEV": "eth0",
        "NCCL_GPUDIRECTTCPX_SOCKET_IFNAME": nics,
        "NCCL_ALGO": "Ring,Tree",
        "NCCL_PROTO": "Simple",
        "NCCL_CROSS_NIC": "0",
        "NCCL_NET_GDR_LEVEL": "PIX",
        "NCCL_P2P_PXN_LEVEL": "0",
        "NCCL_DYNAMIC_CHUNK_SIZE": "524288",
        "NCCL_P2P_NET_CHUNKSIZE": "524288",
        "NCCL_P2P_PCI_CHUNKSIZE": "524288",
        "NCCL_P2P_NVL_CHUNKSIZE": "1048576",
        "NCCL_BUFFSIZE": "4194304",
        "NCCL_NSOCKS_PERTHREAD": "4",
        "NCCL_SOCKET_NTHREADS": "1",
        "NCCL_GPUDIRECTTCPX_TX_BINDINGS": "eth1:8-21,112-125;eth2:8-21,112-125;eth3:60-73,164-177;eth4:60-73,164-177",
        "NCCL_GPUDIRECTTCPX_RX_BINDINGS": "eth1:22-35,126-139;eth2:22-35,126-139;eth3:74-87,178-191;eth4:74-87,178-191",
        "NCCL_GPUDIRECTTCPX_PROGRAM_FLOW_STEERING_WAIT_MICROS": "500000",
    }
    volumes = [V1Volume(name="gpudirect-tcpx-socket", empty_dir=V1EmptyDirVolumeSource())]
    return GpuDirectStack("tcpx", daemon, 4, GPU_DEVICES, environment, volumes, [socket])


def tcpxo() -> GpuDirectStack:
    """A3 Mega: the daemon as in `gpudirect-tcpxo/nccl-test-latest.yaml`; NCCL's settings from the
    node's profile, as `gpudirect-tcpxo/README.md` ("NCCL configs") says to load them."""
    daemon = daemon_container(
        "tcpxo-daemon",
        "us-docker.pkg.dev/gce-ai-infra/gpudirect-tcpxo/tcpgpudmarxd-dev:v1.0.21",
        ["/bin/sh", "-c"],
        [TCPXO_DAEMON_SCRIPT],
        ["NET_ADMIN", "NET_BIND_SERVICE"],
        [],
    )
    environment = {
        "LD_LIBRARY_PATH": POD_LIBRARIES,
        STACK_VARIABLE: "tcpxo",
        "NCCL_LIB_DIR": POD_LIBRARIES,
        "NCCL_FASTRAK_LLCM_DEVICE_DIRECTORY": "/dev/aperture_devices",
        PROFILE_VARIABLE: f"{POD_LIBRARIES}/nccl-env-profile.sh",
    }
    aperture = V1VolumeMount(name="gpudirect-aperture-devices", mount_path="/dev/aperture_devices")
    volumes = [host_volume("gpudirect-aperture-devices", "/dev/aperture_devices")]
    devices = GPU_DEVICES + ("/dev/dmabuf_import_helper",)
    return GpuDirectStack("tcpxo", daemon, 8, devices, environment, volumes, [aperture])


# The machine types with GPUDirect, by Compute Engine name.
STACK_FOR_MACHINE = {"a3-highgpu-8g": tcpx(), "a3-megagpu-8g": tcpxo()}


def interfaces_annotation(gpu_nics: int) -> str:
    """The pod's NICs: eth0 on the default network, ethN on network vpcN, as GKE's examples name them
    (deploy/gpudirect/README.md creates networks by those names)."""
    entries = ['{"interfaceName":"eth0","network":"default"}']
    entries += [f'{{"interfaceName":"eth{n}","network":"vpc{n}"}}' for n in range(1, gpu_nics + 1)]
    return "[" + ",".join(entries) + "]"


def annotations(stack: GpuDirectStack) -> dict[str, str]:
    devices = "".join(f"- path: {path}\n" for path in stack.daemon_devices)
    return {
        "networking.gke.io/default-interface": "eth0",
        "networking.gke.io/interfaces": interfaces_annotation(stack.gpu_nics),
        f"devices.gke.io/container.{stack.daemon.name}": devices,
    }


def primary_with(container: V1Container, stack: GpuDirectStack) -> V1Container:
    """The training container with the stack's variables and mounts; flytekit fills in the rest."""
    primary = copy.deepcopy(container)
    stack_env = [V1EnvVar(name=name, value=value) for name, value in stack.environment.items()]
    primary.env = [*(primary.env or []), *stack_env]
    libraries = V1VolumeMount(name="gpudirect-libraries", mount_path=POD_LIBRARIES)
    primary.volume_mounts = [*(primary.volume_mounts or []), libraries, *stack.mounts]
    # No IPC_LOCK, which Google's TCPX example adds to a container running as root: this image runs as
    # uid 1000, and `capabilities.add` leaves a non-root process no effective capability (no ambient
    # capabilities: kubernetes/kubernetes#56374, kubernetes/enhancements#2763, both open), while file
    # capabilities on python would make the loader ignore LD_LIBRARY_PATH, where the plugin is. Google's
    # TCPX Autopilot and TCPXO examples run their NCCL container without it.
    return primary


def with_gpudirect(template: PodTemplate, machine_type: str) -> PodTemplate:
    """`template` with the GPUDirect networking of `machine_type`'s nodes; unchanged for a machine
    type without GPUDirect."""
    stack = STACK_FOR_MACHINE.get(machine_type)
    if stack is None:
        return template
    spec, name = template.pod_spec, template.primary_container_name
    primary = next((c for c in spec.containers if c.name == name), V1Container(name=name))
    others = [c for c in spec.containers if c.name != name]
    volumes = [
        host_volume("gpudirect-libraries", NODE_LIBRARIES),
        host_volume("gpudirect-sys", "/sys"),
        host_volume("gpudirect-proc-sys", "/proc/sys"),
        *stack.volumes,
    ]
    pod_spec = copy.deepcopy(spec)
    pod_spec.containers = [primary_with(primary, stack), *others]
    pod_spec.init_containers = [*(spec.init_containers or []), copy.deepcopy(stack.daemon)]
    pod_spec.volumes = [*(spec.volumes or []), *volumes]
    return PodTemplate(
        pod_spec=pod_spec,
        primary_container_name=name,
        labels=template.labels,
        annotations={**(template.annotations or {}), **annotations(stack)},
    )


def profile_environment(script: str, environ: MutableMapping[str, str]) -> dict[str, str]:
    """The variables that sourcing `script` in a shell with `environ` sets or changes."""
    if not os.path.isfile(script):
        raise FileNotFoundError(
            f"{PROFILE_VARIABLE} names {script}, which this node does not have: GPUDirect's NCCL "
            "installer DaemonSet has not run on it (deploy/gpudirect/README.md)"
        )
    # The shell's environment before and after the script, so that what the shell sets itself
    # (SHLVL, PWD) cancels out, the second `env` not being the last command, which bash would exec;
    # `set -a` exports what the script assigns without `export`.
    command = ["bash", "-c", 'set -a; env -0; printf "\\0"; . "$0" >&2 || exit; env -0; exit', script]
    sourced = subprocess.run(command, env=dict(environ), capture_output=True)
    if sourced.returncode != 0:
        raise RuntimeError(f"sourcing {script} failed: {sourced.stderr.decode()[-2000:]}")
    before, after = (variables(part) for part in sourced.stdout.decode().split("\0\0", 1))
    return {name: value for name, value in after.items() if name != "_" and before.get(name) != value}


def variables(listing: str) -> dict[str, str]:
    """`env -0` output as a dict."""
    return dict(entry.split("=", 1) for entry in listing.split("\0") if "=" in entry)


def apply_node_profile(environ: MutableMapping[str, str]) -> dict[str, str]:
    """Sources the node's NCCL profile into `environ` where the pod names one (PROFILE_VARIABLE), so
    that the workers the launcher starts inherit its settings; returns what changed."""
    script = environ.get(PROFILE_VARIABLE)
    if not script:
        return {}
    changed = profile_environment(script, environ)
    environ.update(changed)
    return changed
