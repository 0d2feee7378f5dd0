"""The options the planner ranks, and their prices: every GPU, MIG slice and TPU slice it knows, the one
price table, and the options offered (those whose node pools the cluster has). tasks/hardware.py turns
a chosen option into a task's resources and node overrides."""

from __future__ import annotations

import math
import os

from tasks.core.planning.planner import CatalogEntry
from tasks.hardware import H100_80GB, H200_141GB, gpu_share

# Illustrative on-demand prices in USD per accelerator-hour (per GPU, per TPU chip, per CPU
# worker process for local runs): the one price table. The catalogs below derive their options'
# prices from it. Override them per run: they vary by region and contract.
DEFAULT_PRICES_PER_HOUR = {
    "cpu": 0.04,
    "nvidia-l4": 0.71,
    "nvidia-tesla-t4": 0.35,
    "nvidia-tesla-a100": 2.93,
    "nvidia-a100-80gb": 3.67,
    "nvidia-h100-80gb": 9.80,
    "nvidia-h200-141gb": 10.60,
    "tpu-v5-lite-podslice": 1.20,
    "tpu-v5p-slice": 4.20,
    "tpu-v6e-slice": 2.70,
}


def whole_gpu(name: str, device: str, memory_gib: float) -> CatalogEntry:
    return CatalogEntry(name, "gpu", device, "", memory_gib, 1, DEFAULT_PRICES_PER_HOUR[device])


def mig_slice(gpu: str, device: str, partition: str, memory_gib: float) -> CatalogEntry:
    price = DEFAULT_PRICES_PER_HOUR[device] * gpu_share(partition)
    return CatalogEntry(f"{gpu}-mig-{partition}", "mig", device, partition, memory_gib, 1, price)


def tpu_slice(name: str, device: str, topology: str, memory_gib: float) -> CatalogEntry:
    chips = math.prod(int(side) for side in topology.split("x"))
    return CatalogEntry(
        name, "tpu", device, topology, memory_gib, chips, DEFAULT_PRICES_PER_HOUR[device] * chips
    )


# Every option the planner knows, with usable memory per device (MIG profiles from NVIDIA's MIG
# user guide). It ranks only those offered (GPU_CATALOG, TPU_CATALOG below).
GPU_OPTIONS = [
    mig_slice("a100", "nvidia-tesla-a100", "1g.5gb", 4.75),
    mig_slice("a100", "nvidia-tesla-a100", "2g.10gb", 9.75),
    mig_slice("a100", "nvidia-tesla-a100", "3g.20gb", 19.5),
    mig_slice("h100", H100_80GB.device, "1g.10gb", 9.75),
    mig_slice("h100", H100_80GB.device, "2g.20gb", 19.5),
    mig_slice("h100", H100_80GB.device, "3g.40gb", 39.4),
    mig_slice("h200", H200_141GB.device, "1g.18gb", 16.5),
    mig_slice("h200", H200_141GB.device, "2g.35gb", 32.5),
    mig_slice("h200", H200_141GB.device, "3g.71gb", 66.0),
    whole_gpu("l4", "nvidia-l4", 22.0),
    whole_gpu("a100-40gb", "nvidia-tesla-a100", 39.4),
    whole_gpu("a100-80gb", "nvidia-a100-80gb", 79.1),
    whole_gpu("h100-80gb", H100_80GB.device, 79.1),
    whole_gpu("h200-141gb", H200_141GB.device, 139.8),
]
TPU_OPTIONS = [
    tpu_slice("tpu-v5e-1x1", "tpu-v5-lite-podslice", "1x1", 16.0),
    tpu_slice("tpu-v5e-2x2", "tpu-v5-lite-podslice", "2x2", 16.0),
    tpu_slice("tpu-v5e-2x4", "tpu-v5-lite-podslice", "2x4", 16.0),
    tpu_slice("tpu-v6e-1x1", "tpu-v6e-slice", "1x1", 32.0),
]
# The options deploy/gke-node-pools.sh creates node pools for by default (tests/integration/test_deploy.py parses
# the script and checks). A run may be planned onto no other: a pod whose pool does not exist stays
# Pending until pod-pending-timeout fails it, attempt after attempt.
DEFAULT_OPTIONS = ("a100-mig-1g.5gb", "l4", "h100-80gb", "tpu-v5e-1x1", "tpu-v5e-2x2")
# The other options are opt-in, named (space-separated) in this variable, read wherever this module
# is imported: set it for deploy/gke-node-pools.sh, which then creates their pools too, and pass it
# to `pyflyte register --env`, which puts it in every task's container, the planning tasks' included.
EXTRA_OPTIONS_VARIABLE = "MIXEDML_EXTRA_OPTIONS"


def offered(options: list[CatalogEntry], extra: str) -> list[CatalogEntry]:
    """The default options and those `extra` names (separated by spaces or commas); an unknown name
    fails, naming the known ones."""
    named = set(extra.replace(",", " ").split())
    known = {entry.name for entry in GPU_OPTIONS + TPU_OPTIONS}
    if named - known:
        raise ValueError(
            f"{EXTRA_OPTIONS_VARIABLE}: unknown options {sorted(named - known)}; known: {sorted(known)}"
        )
    wanted = set(DEFAULT_OPTIONS) | named
    return [entry for entry in options if entry.name in wanted]


# What the planner ranks: the options whose node pools the cluster has.
EXTRA_OPTIONS = os.environ.get(EXTRA_OPTIONS_VARIABLE, "")
GPU_CATALOG = offered(GPU_OPTIONS, EXTRA_OPTIONS)
TPU_CATALOG = offered(TPU_OPTIONS, EXTRA_OPTIONS)
