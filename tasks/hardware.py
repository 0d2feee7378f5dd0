"""Hardware profiles: the one place that says what each stage runs on.

Tasks refer to these profiles; change a GPU type or a size here, not in the tasks.
"""

from __future__ import annotations

from dataclasses import dataclass

from flytekit import Resources
from flytekit.extras.accelerators import L4, GPUAccelerator


@dataclass(frozen=True)
class CpuProfile:
    cpu: str
    mem: str

    @property
    def resources(self) -> Resources:
        return Resources(cpu=self.cpu, mem=self.mem)


@dataclass(frozen=True)
class GpuTrainingProfile:
    accelerator: GPUAccelerator
    gpus_per_node: int
    nnodes: int
    cpu: str
    mem: str
    shared_memory: str
    # Worker processes when the task runs where there is no GPU (a laptop, CI): DDP over gloo.
    local_cpu_workers: int = 2

    @property
    def resources(self) -> Resources:
        return Resources(cpu=self.cpu, mem=self.mem, gpu=self.gpus_per_node)


PREPROCESS_CPU = CpuProfile(cpu="2", mem="4Gi")
EVALUATE_CPU = CpuProfile(cpu="1", mem="2Gi")
TRAIN_GPU = GpuTrainingProfile(
    accelerator=L4,
    gpus_per_node=1,
    nnodes=1,
    cpu="4",
    mem="16Gi",
    shared_memory="2Gi",
)
