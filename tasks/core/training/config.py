"""Framework-neutral training configuration: one TrainConfig for the torch and TensorFlow loops."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

import numpy as np

from tasks.core.messages import raise_for
from tasks.core.models.plugins import ModelSpec, spec_problems
from tasks.core.planning.batches import MIN_MICRO_BATCH_SIZE, micro_batch
from tasks.core.strict_json import fits, instantiate, shape_problems

# "auto": bf16 autocast on GPUs that support it, fp16 with a grad scaler on older ones.
PRECISIONS = ("auto", "bf16", "fp16", "fp32")
# tf.distribute strategies a TensorFlow target may demand; "auto" picks the best one present.
TF_STRATEGIES = ("auto", "tpu", "multi_worker", "mirrored", "default")
# "cosine": the learning rate decays from learning_rate to 0 over the run's optimizer steps.
LR_SCHEDULES = ("cosine", "constant")
# Where the torch loop keeps its training rows: on the device, in pinned host memory, or streamed
# from the split's files; "auto" is the device unless the planner chose otherwise.
DATA_PLACEMENTS = ("auto", "device", "host", "stream")
# Which epoch's weights a run hands back: the one best by `selection_metric`, or the last one trained.
KEEP = ("best", "last")
# The validation metrics an epoch can be chosen by, and which way is better.
SELECTION_METRICS = {"val_loss": "lowest", "val_accuracy": "highest"}
# How each class's rows weigh in the loss: alike ("none"), or "balanced", scikit-learn's
# n_rows / (n_classes x class rows), counted on the train split (`class_weights`).
CLASS_WEIGHTS = ("none", "balanced")
# What a training loss that is not finite does: "fail" raises TrainingDiverged; "stop" ends the run
# there, its record saying so (`TrainingRun.diverged`): a tuning trial, which must not end the study.
ON_DIVERGENCE = ("fail", "stop")
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
    "patience": (0, 10**6),
    "train_until_epoch": (0, 10**6),
}


def range_rule(value: int, low: int, high: int) -> str:
    """The rule `value` breaks ("" if none)."""
    if value < low:
        return f"must be at least {low}"
    return f"must be at most {high:,}" if value > high else ""


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
    # the same rows in the same order (`tasks.core.training.rows.epoch_order`).
    data_placement: str = "auto"
    # Rows shuffled together: a shard of at most this many rows is fully permuted each epoch; a larger
    # one is shuffled by row group, then within windows of this many rows (what streaming holds).
    shuffle_buffer_rows: int = 1 << 18
    # The epoch whose weights the run hands back (KEEP), and the validation metric that ranks epochs.
    keep: str = "best"
    selection_metric: str = "val_loss"
    # Stop after this many epochs in a row without a better `selection_metric` (0: never stop early).
    patience: int = 0
    # CLASS_WEIGHTS: "balanced" weighs a rare class's rows up in the train and validation loss.
    class_weight: str = "none"
    # Stop after this epoch (0: after `epochs`), checkpointed, with the learning rate still scheduled over
    # `epochs`: a tuning rung, which a later run resumes from its checkpoint (docs/tuning.md). A torch
    # run given it hands its checkpoint back beside the model.
    train_until_epoch: int = 0
    # ON_DIVERGENCE: a run that diverges fails (the default) or stops with a record that says so.
    on_divergence: str = "fail"

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        """The config from `--hyperparameters` JSON, checked strictly (pyflyte run's parser calls this
        when a dataclass has it, instead of decoding leniently)."""
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
            ("keep", self.keep in KEEP, f"not one of {', '.join(KEEP)}"),
            ("selection_metric", self.selection_metric in SELECTION_METRICS,
             f"not one of {', '.join(SELECTION_METRICS)}"),
            ("class_weight", self.class_weight in CLASS_WEIGHTS, f"not one of {', '.join(CLASS_WEIGHTS)}"),
            ("train_until_epoch", self.train_until_epoch <= self.epochs, f"must be at most epochs ({self.epochs})"),
            ("on_divergence", self.on_divergence in ON_DIVERGENCE, f"not one of {', '.join(ON_DIVERGENCE)}"),
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
        """For code that builds a config itself; workflow inputs get the fuller messages of
        `tasks.core.validation`."""
        found = self.problems()
        if found:
            raise ValueError(
                "invalid TrainConfig: "
                + "; ".join(f"{name}={getattr(self, name)!r} {rule}" for name, rule in found.items())
            )

    @property
    def last_epoch(self) -> int:
        """The epoch (from 1) this run stops after: `train_until_epoch`, else `epochs`."""
        return self.train_until_epoch or self.epochs

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


def class_weights(scheme: str, train_counts: np.ndarray) -> np.ndarray | None:
    """Each class's loss weight under `scheme` (CLASS_WEIGHTS) from the train split's rows per class;
    None for "none". "balanced" is scikit-learn's n_rows / (n_classes x count): over the train rows
    the weights sum to n_rows, so a weighted loss summed and divided by the rows keeps the unweighted
    loss's scale. A class absent from the train split (which preprocessing refuses) weighs 0."""
    if scheme == "none":
        return None
    counts = np.asarray(train_counts, dtype=np.float64)
    with np.errstate(divide="ignore"):
        weights = counts.sum() / (len(counts) * counts)
    return np.where(counts > 0, weights, 0.0)


def describe_class_weights(weights: np.ndarray | None, class_labels: list[str] | None = None) -> str:
    """The weighting as a line says it, e.g. "class weights balanced: 0.526 ('a'), 10 ('b')"; classes
    by their codes where no labels are given (the training loops know the codes alone)."""
    if weights is None:
        return "class weights: none"
    labels = (
        [repr(label) for label in class_labels]
        if class_labels
        else [f"class {c}" for c in range(len(weights))]
    )
    shown = [f"{weight:.3g} ({label})" for weight, label in zip(weights, labels, strict=True)]
    return "class weights balanced: " + ", ".join(shown[:10]) + (", ..." if len(shown) > 10 else "")


def scheduled_learning_rate(schedule: str, peak: float, step, total_steps: int, cos=math.cos):
    """The rate at step `step` (from 0) of `total_steps`: `peak` throughout ("constant"), or from
    `peak` down to 0 along a half cosine ("cosine"). `step` may be a tensor, with `cos` its
    framework's cosine: the Keras optimizer computes the rate on its own step counter."""
    if schedule == "constant":
        return peak
    return peak * 0.5 * (1 + cos(math.pi * step / total_steps))


# ---- the hyperparameters JSON, as the command line and a remote launch deliver it ----------------------

# An object of each nested config, for messages about a value of the wrong form.
EXAMPLES = {
    TrainConfig: '{"epochs": 5, "batch_size": 128}',
    ModelSpec: '{"builder": "cnn", "input_shape": "1x8x8", "options": {"channels": [32, 64]}}',
}


def parse_hyperparameters(raw: object) -> TrainConfig:
    """The config from its JSON form, strictly: an unknown field, a value of the wrong type or one its
    rules refuse is an InputError naming it (flytekit's own decoding drops unknown keys and coerces
    2.7 to 2). A list of numbers among the model's options means the same as their comma-separated
    form."""
    raw = with_option_lists_joined(raw)
    raise_for(shape_problems(raw, TrainConfig, "hyperparameters", EXAMPLES))
    config = instantiate(TrainConfig, raw)
    # The values too: an integer past int64 could not even be carried to the first task.
    raise_for(hyperparameter_problems(config))
    return config


def with_option_lists_joined(raw: object) -> object:
    model = raw.get("model") if isinstance(raw, dict) else None
    options = model.get("options") if isinstance(model, dict) else None
    if not isinstance(options, dict):
        return raw
    joined = {
        name: join_numbers(value) if is_number_list(value) else value for name, value in options.items()
    }
    return {**raw, "model": {**model, "options": joined}}


def is_number_list(value: object) -> bool:
    return isinstance(value, list) and all(fits(item, float) for item in value)


def join_numbers(values: list) -> str:
    return ",".join(str(int(value)) if float(value).is_integer() else str(value) for value in values)


def hyperparameter_problems(config: TrainConfig) -> list[str]:
    defaults = TrainConfig()
    return [
        f"input 'hyperparameters.{name}' = {getattr(config, name)!r}: {rule}; "
        f"pass e.g. --hyperparameters '{json.dumps({name: getattr(defaults, name)}, default=vars)}'"
        for name, rule in config.problems().items()
    ]
