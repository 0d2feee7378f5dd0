"""The training targets: the one table that lists, validates and dispatches them."""

from __future__ import annotations

from dataclasses import dataclass

from flytekit.core.python_function_task import PythonFunctionTask

from tasks.catalog import GPU_CATALOG, TPU_CATALOG
from tasks.core.planning.planner import CatalogEntry
from tasks.core.training.config import TrainConfig
from tasks.core.training.tf_strategy import tpu_target_problems
from tasks.hardware import (
    TRAIN_GPU,
    TRAIN_GPU_MULTINODE,
    TRAIN_TF_GPU,
    TRAIN_TPU,
    TpuSliceProfile,
    TrainingProfile,
)
from tasks.train_tf import train_tf_gpu, train_tf_gpu_trial, train_tf_tpu, train_tf_tpu_trial
from tasks.train_torch import (
    train_torch,
    train_torch_multinode,
    train_torch_multinode_trial,
    train_torch_trial,
)


@dataclass(frozen=True)
class Target:
    task: PythonFunctionTask  # the training task, decorated with its profile's task options
    trial_task: PythonFunctionTask  # the same, cached: what tuning trials run (tasks/tune.py)
    framework: str  # "pytorch" or "tensorflow", as the training runs and model bundles name it
    profile: TrainingProfile  # the hardware it declares, its image, and its planned overrides
    # What the planner may choose from; None: the target keeps its declared profile.
    catalog: list[CatalogEntry] | None

    @property
    def image(self) -> str:
        return self.profile.image

    def config_problems(self, config: TrainConfig) -> list[str]:
        """The target's own rules on the hyperparameters: a TPU slice trains with TPUStrategy."""
        on_tpu = isinstance(self.profile, TpuSliceProfile)
        return tpu_target_problems(config.tf_strategy) if on_tpu else []


TARGETS = {
    "gpu": Target(train_torch, train_torch_trial, "pytorch", TRAIN_GPU, GPU_CATALOG),
    "gpu-multinode": Target(
        train_torch_multinode, train_torch_multinode_trial, "pytorch", TRAIN_GPU_MULTINODE, None
    ),
    "tpu": Target(train_tf_tpu, train_tf_tpu_trial, "tensorflow", TRAIN_TPU, TPU_CATALOG),
    "gpu-tf": Target(train_tf_gpu, train_tf_gpu_trial, "tensorflow", TRAIN_TF_GPU, GPU_CATALOG),
}
