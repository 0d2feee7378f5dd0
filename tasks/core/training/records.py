"""What a training run reports: its epochs, how it trained, and the hardware it was billed for."""

from __future__ import annotations

from dataclasses import dataclass

from tasks.core.training.config import TrainConfig


@dataclass
class EpochMetrics:
    epoch: int
    train_loss: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float
    # The validation rows the epoch's val_ metrics were measured on (0: not recorded): how far the
    # choice of epoch can trust them (`EpochChoice`).
    val_rows: int = 0


@dataclass
class TrainingRun:
    """How a model was trained. Both training loops produce it; the trained model, the evaluation
    report and the comparison carry it as it is."""

    framework: str  # "pytorch" or "tensorflow"
    device_type: str  # the family the loop ran on: "cuda", "gpu", "tpu", or "cpu" for local worker processes
    device_name: str  # as the device names itself, for reports: "NVIDIA L4", "TPU (v5 lite)", "cpu"
    world_size: int  # DDP ranks or tf.distribute replicas
    backend: str  # torch: process-group backend (nccl, gloo; "none" alone); Keras: "xla" or "default"
    precision: str
    strategy: str  # "DDP", "single-process" or the tf.distribute strategy
    history: list[EpochMetrics]
    samples_per_second: float
    train_seconds: float
    # The hyperparameters the loop ran with (the planner's accumulation and row placement applied): the
    # network trained (`config.model`) and the seed among them.
    config: TrainConfig
    peak_device_memory_bytes: int = 0  # torch.cuda.max_memory_allocated; 0 on CPU
    # The epoch (from 1) whose weights the model holds, and why that one (`EpochChoice.kept`); 0 and ""
    # for a run recorded without them.
    kept_epoch: int = 0
    kept_reason: str = ""
    # Whether the run learnt a number (a regression: its losses are squared errors, it has no accuracy).
    regression: bool = False
    # Where a run with `on_divergence: stop` diverged: TrainingDiverged's message ("" for a run that did
    # not). Its model is the weights it diverged with, for no use.
    diverged: str = ""

    @property
    def on_cpu(self) -> bool:
        """A local run on CPU worker processes: what it is billed for is not what a plan chose."""
        return self.device_type == "cpu"


@dataclass
class Hardware:
    """The accelerators a run is billed for: as declared by its task, or as the applied plan put it."""

    accelerator: str  # GPU or TPU name as the cluster knows it, or "cpu" for local worker processes
    count: int
    partition: str = ""  # MIG partition or TPU topology; "" for whole GPUs
    price_per_hour: float | None = None  # per device, from the applied plan's catalog option

    def describe(self) -> str:
        return f"{self.accelerator} {self.partition}".rstrip() + f" x{self.count}"
