"""Machine types and what a pod can ask for on them: GKE's node allocatable.

GKE reserves part of each node for the kubelet and the OS; a pod that asks for the machine's full
vCPUs or memory never schedules. The reservations follow GKE's documented formula for Standard
clusters ("Node allocatable resources"): CPU, 6% of the first core, 1% of the next, 0.5% of the next
2 and 0.25% of the rest; memory, 25% of the first 4 GiB, 20% of the next 4, 10% of the next 8, 6% of
the next 112 and 2% of the rest, plus a 100 MiB eviction threshold. DaemonSets (logging, the GPU
device plugin, kube-proxy) take some of what is left, hence DAEMONSET_ALLOWANCE.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# (cores or GiB up to which a rate applies, the rate); the last rate applies to the rest.
CPU_RESERVED = ((1, 0.06), (2, 0.01), (4, 0.005), (float("inf"), 0.0025))
MEMORY_RESERVED = ((4, 0.25), (8, 0.20), (16, 0.10), (128, 0.06), (float("inf"), 0.02))
EVICTION_THRESHOLD_GIB = 100 / 1024
# What system DaemonSets are assumed to request on every node: vCPU, GiB.
DAEMONSET_ALLOWANCE = (0.5, 1.0)
# A share of a node is requested in tenths of a vCPU and whole GiB.
CPU_STEP = 0.1


def reserved(amount: float, tiers: tuple[tuple[float, float], ...]) -> float:
    total, floor = 0.0, 0.0
    for ceiling, rate in tiers:
        total += max(0.0, min(amount, ceiling) - floor) * rate
        floor = ceiling
    return total


@dataclass(frozen=True)
class MachineType:
    """A Compute Engine machine type: vCPUs, memory and GPUs as its documentation lists them."""

    name: str
    vcpus: int
    memory_gib: float
    gpus: int = 0  # GPUs attached to each VM of this type

    @property
    def allocatable_cpu(self) -> float:
        """vCPUs a pod can request: allocatable minus the DaemonSet allowance."""
        return self.vcpus - reserved(self.vcpus, CPU_RESERVED) - DAEMONSET_ALLOWANCE[0]

    @property
    def allocatable_memory_gib(self) -> float:
        """GiB a pod can request: allocatable minus the DaemonSet allowance."""
        kept = reserved(self.memory_gib, MEMORY_RESERVED) + EVICTION_THRESHOLD_GIB
        return self.memory_gib - kept - DAEMONSET_ALLOWANCE[1]

    def share(self, fraction: float) -> tuple[float, int]:
        """(vCPUs, GiB) of allocatable for a pod that occupies `fraction` of the node, rounded down so
        that 1 / `fraction` such pods fit on one node."""
        steps = math.floor(self.allocatable_cpu * fraction / CPU_STEP)
        return round(steps * CPU_STEP, 1), math.floor(self.allocatable_memory_gib * fraction)
