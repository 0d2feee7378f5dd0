"""Framework-neutral configuration and records shared by the torch and TensorFlow paths."""

from __future__ import annotations

from dataclasses import dataclass, field

# "auto": bf16 autocast on GPUs that support it, fp16 with a grad scaler on older ones.
PRECISIONS = ("auto", "bf16", "fp16", "fp32")


@dataclass
class ModelConfig:
    n_features: int
    n_classes: int
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 128])
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if self.n_features < 1 or self.n_classes < 2:
            raise ValueError(
                f"need >= 1 feature and >= 2 classes, got {self.n_features} and {self.n_classes}"
            )
        if any(size < 1 for size in self.hidden_sizes):
            raise ValueError(f"hidden_sizes must be positive, got {self.hidden_sizes}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")


@dataclass
class TrainConfig:
    """Hyperparameters. `batch_size` is the global batch per optimizer step, whatever the world size."""

    epochs: int = 30
    batch_size: int = 64
    learning_rate: float = 3e-3
    weight_decay: float = 1e-2
    grad_accum_steps: int = 1
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 128])
    dropout: float = 0.1
    seed: int = 0
    precision: str = "auto"
    collective_timeout_s: int = 600
    # Checkpoint every N optimizer steps as well as every epoch (0: every epoch only).
    checkpoint_every_steps: int = 0
    # The out-of-memory guard halves the micro-batch down to this size, then gives up.
    min_micro_batch_size: int = 4

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "grad_accum_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision='{self.precision}' is not one of {', '.join(PRECISIONS)}")
        if self.checkpoint_every_steps < 0:
            raise ValueError(f"checkpoint_every_steps must be >= 0, got {self.checkpoint_every_steps}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")

    def micro_batch_size(self, world_size: int) -> int:
        per_step = world_size * self.grad_accum_steps
        if self.batch_size % per_step:
            raise ValueError(
                f"batch_size={self.batch_size} must be divisible by world_size x grad_accum_steps "
                f"= {world_size} x {self.grad_accum_steps}"
            )
        return self.batch_size // per_step


@dataclass
class EpochMetrics:
    epoch: int
    train_loss: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float


@dataclass
class SplitPaths:
    train: str
    val: str
    feature_names: list[str]
    label_column: str
    n_classes: int
