"""Framework-neutral configuration and records shared by the torch and TensorFlow paths."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from tasks.core.models import ModelSpec, spec_problems

# "auto": bf16 autocast on GPUs that support it, fp16 with a grad scaler on older ones.
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
# tf.distribute strategies a TensorFlow target may demand; "auto" picks the best one present.
TF_STRATEGIES = ("auto", "tpu", "multi_worker", "mirrored", "default")
# "cosine": the learning rate decays from learning_rate to 0 over the run's optimizer steps.
LR_SCHEDULES = ("cosine", "constant")
# Where the torch loop keeps its training rows: on the device, in pinned host memory, or streamed
# from the split's files; "auto" is the device unless the planner chose otherwise.
DATA_PLACEMENTS = ("auto", "device", "host", "stream")
# Each integer field's range: the seed is numpy's; the others fit int64 arithmetic and timedelta with room.
INT_RANGES = {
    "epochs": (1, 10**6),
    "batch_size": (1, 10**9),
    "grad_accum_steps": (1, 10**6),
    "seed": (0, 2**32 - 1),
    "checkpoint_every_steps": (0, 10**9),
    "collective_timeout_s": (1, 7 * 24 * 3600),  # a week
    "min_micro_batch_size": (1, 10**9),
    "shuffle_buffer_rows": (1, 10**9),
}

# `TrainConfig.min_micro_batch_size` by default, which the planner's `Workload` also defaults to.
MIN_MICRO_BATCH_SIZE = 4


def range_rule(value: int, low: int, high: int) -> str:
    """The rule `value` breaks ("" if none)."""
    if value < low:
        return f"must be at least {low}"
    return f"must be at most {high:,}" if value > high else ""


def micro_batch(batch_size: int, workers: int, grad_accum_steps: int) -> int | None:
    """Each worker's micro-batch when the global batch splits evenly over `workers` x `grad_accum_steps`
    accumulation steps, else None: the training loops give every micro-batch the same number of rows."""
    per_step = workers * grad_accum_steps
    return batch_size // per_step if per_step > 0 and batch_size % per_step == 0 else None


@dataclass
class TrainConfig:
    """The hyperparameters: the one config that crosses the task boundaries, from the workflow input
    to both training loops. `batch_size` is the global batch per optimizer step, whatever the world
    size. `problems()` holds every rule; the workflows check it before any accelerator is requested."""

    epochs: int = 30
    batch_size: int = 64
    learning_rate: float = 3e-3
    lr_schedule: str = "cosine"
    weight_decay: float = 1e-2
    grad_accum_steps: int = 1
    # Which network to train: a built-in ("mlp", "cnn") or "package.module:builder", with its options.
    model: ModelSpec = field(default_factory=ModelSpec)
    seed: int = 0
    precision: str = "auto"
    # TensorFlow targets only: which tf.distribute strategy to use, or demand.
    tf_strategy: str = "auto"
    # Checkpoint every N optimizer steps as well as every epoch (0: every epoch only).
    checkpoint_every_steps: int = 0
    collective_timeout_s: int = 600
    # The smallest micro-batch: the planner lowers it no further to fit a device, and the
    # out-of-memory guard halves it down to this size, then gives up.
    min_micro_batch_size: int = MIN_MICRO_BATCH_SIZE
    # The torch loop's placement of its training rows (DATA_PLACEMENTS); every placement trains on
    # the same rows in the same order (`tasks.core.shards.epoch_order`).
    data_placement: str = "auto"
    # Rows shuffled together: a shard of at most this many rows is fully permuted each epoch; a larger
    # one is shuffled by row group, then within windows of this many rows (what streaming holds).
    shuffle_buffer_rows: int = 1 << 18

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        """The config from `--hyperparameters` JSON, checked strictly (pyflyte run's parser calls this
        when a dataclass has it, instead of decoding leniently)."""
        from tasks.core.validation import parse_hyperparameters  # validation builds on this module

        return parse_hyperparameters(json.loads(text))

    def problems(self) -> dict[str, str]:
        """What is wrong, by field name; empty when the config can run. A field breaking two rules
        shows the first: its range before what depends on it."""
        ranges = [(name, range_rule(getattr(self, name), *bounds)) for name, bounds in INT_RANGES.items()]
        rules = [(name, not rule, rule) for name, rule in ranges] + [
            ("learning_rate", math.isfinite(self.learning_rate) and self.learning_rate > 0, "must be a finite number > 0"),
            ("weight_decay", math.isfinite(self.weight_decay) and self.weight_decay >= 0, "must be a finite number >= 0"),
            ("grad_accum_steps", micro_batch(self.batch_size, 1, self.grad_accum_steps) is not None,
             f"must divide batch_size ({self.batch_size}) evenly"),
            ("lr_schedule", self.lr_schedule in LR_SCHEDULES, f"not one of {', '.join(LR_SCHEDULES)}"),
            ("precision", self.precision in PRECISIONS, f"not one of {', '.join(PRECISIONS)}"),
            ("tf_strategy", self.tf_strategy in TF_STRATEGIES, f"not one of {', '.join(TF_STRATEGIES)}"),
            ("data_placement", self.data_placement in DATA_PLACEMENTS, f"not one of {', '.join(DATA_PLACEMENTS)}"),
        ]  # fmt: skip
        found: dict[str, str] = {}
        for name, ok, rule in rules:
            if not ok:
                found.setdefault(name, rule)
        if problem := spec_problems(self.model) or self.option_problems():
            found["model"] = problem
        return found

    def option_problems(self) -> str:
        options = self.model.options
        bad = [
            name for name, value in options.items() if isinstance(value, float) and not math.isfinite(value)
        ]
        return f"options {', '.join(bad)} must be finite numbers" if bad else ""

    def validate(self) -> None:
        """For code that builds a config itself; workflow inputs get the fuller message of
        `tasks.core.validation.validate_run`."""
        found = self.problems()
        if found:
            raise ValueError(
                "invalid TrainConfig: "
                + "; ".join(f"{name}={getattr(self, name)!r} {rule}" for name, rule in found.items())
            )

    def learning_rate_at(self, step: int, total_steps: int) -> float:
        """The rate for optimizer step `step` (from 0) of `total_steps`: a function of the step
        alone, so a resumed run continues the schedule from its checkpointed step."""
        return scheduled_learning_rate(self.lr_schedule, self.learning_rate, step, total_steps)

    def micro_batch_size(self, world_size: int) -> int:
        size = micro_batch(self.batch_size, world_size, self.grad_accum_steps)
        if size is None:
            raise ValueError(
                f"batch_size={self.batch_size} must be divisible by world_size x grad_accum_steps "
                f"= {world_size} x {self.grad_accum_steps}"
            )
        return size

    def steps_per_epoch(self, rows: int, world_size: int = 1) -> int:
        """The optimizer steps of an epoch over `rows` training rows on each of `world_size` workers:
        a step takes `micro_batch_size` x `grad_accum_steps` rows from each, the rows left over wait
        for the next epoch's order. A shard too small for one step is refused."""
        micro = self.micro_batch_size(world_size)
        if rows < micro * self.grad_accum_steps:
            held = f"each of {world_size} workers holds {rows}" if world_size > 1 else f"only {rows}"
            raise ValueError(
                f"{held} training rows, fewer than one optimizer step "
                f"({micro} x {self.grad_accum_steps}); lower batch_size"
            )
        return rows // (micro * self.grad_accum_steps)


def scheduled_learning_rate(schedule: str, peak: float, step, total_steps: int, cos=math.cos):
    """The rate at step `step` (from 0) of `total_steps`: `peak` throughout ("constant"), or from
    `peak` down to 0 along a half cosine ("cosine"). `step` may be a tensor, with `cos` its
    framework's cosine: the Keras optimizer computes the rate on its own step counter."""
    if schedule == "constant":
        return peak
    return peak * 0.5 * (1 + cos(math.pi * step / total_steps))


@dataclass
class EpochMetrics:
    epoch: int
    train_loss: float
    train_accuracy: float
    val_loss: float
    val_accuracy: float


@dataclass
class TrainingRun:
    """How a model was trained. Both training loops produce it; the trained model, the evaluation
    report and the comparison carry it as it is."""

    framework: str  # "pytorch" or "tensorflow"
    device: str  # "cuda", "tpu", "gpu" or "cpu": where the loop ran
    world_size: int  # DDP ranks or tf.distribute replicas
    backend: str  # torch: process-group backend (nccl, gloo; "none" alone); Keras: "xla" or "default"
    precision: str
    strategy: str  # "DDP", "single-process" or the tf.distribute strategy
    history: list[EpochMetrics]
    samples_per_second: float
    train_seconds: float
    peak_device_memory_bytes: int = 0  # torch.cuda.max_memory_allocated; 0 on CPU
    model: ModelSpec = field(default_factory=ModelSpec)  # the network trained


@dataclass
class Hardware:
    """The accelerators a run is billed for: as declared by its task, or as the applied plan put it."""

    accelerator: str  # GPU or TPU name as the cluster knows it, or "cpu" for local worker processes
    count: int
    partition: str = ""  # MIG partition or TPU topology; "" for whole GPUs
    price_per_hour: float | None = None  # per device, from the applied plan's catalog option

    def describe(self) -> str:
        return f"{self.accelerator} {self.partition}".rstrip() + f" x{self.count}"


@dataclass
class SplitPaths:
    train: str
    val: str
    feature_names: list[str]
    label_column: str
    n_classes: int
