"""The training targets: the one table that lists, validates and dispatches them."""

from __future__ import annotations

from dataclasses import dataclass

from flytekit.core.python_function_task import PythonFunctionTask

from tasks.core.planner import CatalogEntry
from tasks.hardware import (
    GPU_CATALOG,
    TPU_CATALOG,
    TRAIN_GPU,
    TRAIN_GPU_MULTINODE,
    TRAIN_TPU,
    GpuTrainingProfile,
    TpuSliceProfile,
)
from tasks.train_tf import train_tf_gpu, train_tf_tpu
from tasks.train_torch import train_torch, train_torch_multinode


@dataclass(frozen=True)
class Target:
    task: PythonFunctionTask  # the training task; its image is the task's
    framework: str  # "torch" or "tensorflow"
    profile: GpuTrainingProfile | TpuSliceProfile  # the hardware it declares
    # What the planner may choose from; None: the target keeps its declared profile.
    catalog: list[CatalogEntry] | None

    @property
    def image(self) -> str:
        return self.task.container_image


TARGETS = {
    "gpu": Target(train_torch, "torch", TRAIN_GPU, GPU_CATALOG),
    "gpu-multinode": Target(train_torch_multinode, "torch", TRAIN_GPU_MULTINODE, None),
    "tpu": Target(train_tf_tpu, "tensorflow", TRAIN_TPU, TPU_CATALOG),
    "gpu-tf": Target(train_tf_gpu, "tensorflow", TRAIN_GPU, GPU_CATALOG),
}
