"""The TensorFlow/Keras twin of the PyTorch training loop, under a `tf.distribute` strategy."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

import keras
import tensorflow as tf

from tasks.core.data.splits import SplitPaths
from tasks.core.models.keras_models import save_keras_artifact
from tasks.core.models.plugins import InputSpec, build, input_spec_for
from tasks.core.models.precision import for_keras
from tasks.core.training.config import TrainConfig, scheduled_learning_rate
from tasks.core.training.keras_callbacks import (
    Checkpointing,
    StopOnDivergence,
    TrainClock,
    batches_done,
    board,
    notice_to_heed,
)
from tasks.core.training.keras_data import KerasData, read_keras_data
from tasks.core.training.preemption import PreemptionNotice
from tasks.core.training.progress import EpochChoice, ending_on_divergence
from tasks.core.training.records import TrainingRun
from tasks.core.training.tf_strategy import Environment, detect_environment, select_strategy

log = logging.getLogger(__name__)

TPU_STEPS_PER_EXECUTION = 32


@dataclass
class KerasOutcome:
    run: TrainingRun
    model: keras.Model


@contextmanager
def dtype_policy(name: str):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def device_type(strategy_kind: str) -> str:
    """The family of devices the replicas run on, as `TrainingRun.device_type` records it."""
    if strategy_kind == "tpu":
        return "tpu"
    return "gpu" if tf.config.list_physical_devices("GPU") else "cpu"


def describe_device(strategy_kind: str, env: Environment) -> str:
    if strategy_kind == "tpu":
        kind = tf.config.list_logical_devices("TPU")
        return f"TPU ({kind[0].device_type if kind else 'slice'})"
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        return tf.config.experimental.get_device_details(gpus[0]).get("device_name", "GPU")
    return "cpu"


def steps_per_execution(strategy_kind: str) -> int:
    """TPUs run several steps per host round trip; elsewhere one step keeps callbacks timely."""
    return TPU_STEPS_PER_EXECUTION if strategy_kind == "tpu" else 1


def use_jit_compile(strategy_kind: str, gpu_count: int) -> bool:
    """XLA for single-GPU training. A TPU compiles every step with XLA anyway; Keras cannot
    jit_compile under Mirrored/MultiWorkerMirrored (each replica's variables live on another
    device); and on CPU we enable op determinism instead, which Keras does not combine with XLA."""
    return strategy_kind == "default" and gpu_count > 0


def step_compiler(strategy_kind: str, gpu_count: int) -> str:
    """What compiles the training step, as the run records it: "xla" on a TPU (always) or under
    `jit_compile`, else "default" (TensorFlow's own graph runtime)."""
    return "xla" if strategy_kind == "tpu" or use_jit_compile(strategy_kind, gpu_count) else "default"


def compile_model(
    model: keras.Model,
    config: TrainConfig,
    strategy_kind: str,
    gpu_count: int,
    total_steps: int,
    regression: bool = False,
) -> None:
    """`total_steps`: the batches of the whole run, over which the learning rate schedule runs. A
    regression learns its standardised label by the mean squared error, and has no accuracy."""
    optimizer = keras.optimizers.AdamW(
        learning_rate=learning_rate_schedule(config, total_steps),
        weight_decay=config.weight_decay,
        gradient_accumulation_steps=config.grad_accum_steps if config.grad_accum_steps > 1 else None,
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.MeanSquaredError()
        if regression
        else keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[] if regression else [keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=use_jit_compile(strategy_kind, gpu_count),
        steps_per_execution=steps_per_execution(strategy_kind),
    )


@keras.saving.register_keras_serializable(package="mixedml")
class ConfigSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """`TrainConfig.learning_rate_at`, computed in the step on the optimizer's iteration counter: the
    counter is saved with the optimizer's weights, so a resumed run continues the schedule."""

    def __init__(self, schedule: str, learning_rate: float, total_steps: int):
        self.schedule, self.learning_rate, self.total_steps = schedule, learning_rate, total_steps

    def __call__(self, step):
        step = keras.ops.cast(step, "float32")
        rate = scheduled_learning_rate(
            self.schedule, self.learning_rate, step, self.total_steps, keras.ops.cos
        )
        return keras.ops.cast(rate, "float32")

    def get_config(self) -> dict:
        return {
            "schedule": self.schedule,
            "learning_rate": self.learning_rate,
            "total_steps": self.total_steps,
        }


def learning_rate_schedule(config: TrainConfig, total_steps: int) -> ConfigSchedule:
    return ConfigSchedule(config.lr_schedule, config.learning_rate, total_steps)


def fit_epochs(
    model: keras.Model,
    tracker: Checkpointing,
    data: KerasData,
    callbacks: list,
    log_dir: str | None,
    last_epoch: int,
) -> None:
    """One `fit` per epoch, on that epoch's order from the batch the tracker reached, until
    `last_epoch` (`TrainConfig.last_epoch`: a tuning rung stops before the run's `epochs`, over which
    the learning rate is still scheduled) or an early stop (`EpochChoice.stops_early`), with
    `callbacks` in their order (the divergence guard before the `tracker`, so a diverged model is
    never saved).
    (A stream of epochs under `steps_per_epoch` would let an epoch's last multi-step execution on a
    TPU run into the next epoch; Keras's TensorBoard closes its writers after each fit, hence a fresh one.)"""
    for epoch in range(tracker.progress.epoch, last_epoch):
        if tracker.choice.stops_early(tracker.progress.history):  # a resumed run too
            return
        train = data.train_epoch(epoch=epoch, skip=tracker.progress.step)
        model.fit(train, validation_data=data.val_data, initial_epoch=epoch, epochs=epoch + 1, verbose=0,
                  shuffle=False, callbacks=[*callbacks, *board(log_dir)])  # fmt: skip
        if model.stop_training:  # a callback ended training early
            return


@dataclass
class KerasRunOptions:
    """A run's optional services. With `checkpoint_dir`, training resumes from the epoch and step
    saved there and saves to it, handing it to `on_checkpoint` after each save. `callbacks` join
    every `fit`; `log_dir` receives TensorBoard scalars; on the `preemption` notice the run saves
    the step reached and raises `Preempted`. `resolver_factory` finds the TPU (tests pass their own)."""

    checkpoint_dir: str | None = None
    on_checkpoint: Callable[[str], None] | None = None
    callbacks: list = field(default_factory=list)
    log_dir: str | None = None
    preemption: PreemptionNotice | None = None
    resolver_factory: Callable | None = None


def build_compiled(
    config: TrainConfig, input_spec: InputSpec, kind: str, gpu_count: int, steps: int
) -> keras.Model:
    """The model `config.model` names, compiled for `steps` batches per epoch. Call under the
    strategy's scope and the dtype policy."""
    model = build(config.model, input_spec.n_features, input_spec.n_classes, "tensorflow")
    compile_model(model, config, kind, gpu_count, config.epochs * steps, input_spec.regression)
    return model


def train_keras(
    config: TrainConfig,
    splits: SplitPaths,
    artifact_path: str | None = None,
    strategy: str = "auto",
    env: Environment | None = None,
    options: KerasRunOptions | None = None,
    allow_fallback: bool = False,
) -> KerasOutcome:
    """Train the Keras model `config.model` names; `config.batch_size` is the global batch (per-replica x replicas).

    The history has one record per epoch across attempts (see `KerasRunOptions` for resuming and
    preemption); the train loss and accuracy of an epoch resumed mid-way cover only the batches
    trained in this attempt. With `config.train_until_epoch` the run stops after that epoch, its
    checkpoint saved, and a run given the same checkpoint continues it (a tuning rung).
    """
    config.validate()  # as the workflow did already; a direct caller's config gets the same message
    options = options or KerasRunOptions()
    env = env or detect_environment()
    dist_strategy, kind = select_strategy(strategy, allow_fallback, env, options.resolver_factory)
    replicas = dist_strategy.num_replicas_in_sync
    keras.utils.set_random_seed(config.seed)
    if kind == "default" and env.gpu_count == 0:
        tf.config.experimental.enable_op_determinism()
    data = read_keras_data(splits, config, replicas, static_shapes=kind == "tpu")
    policy = for_keras(config.precision, kind, env.gpu_count).keras_policy
    input_spec = input_spec_for(config.model, len(splits.feature_names), splits.n_outputs)
    log.info("keras: %s, %d replicas x %d rows per step, policy %s",
             kind, replicas, data.batch // replicas, policy)  # fmt: skip
    with dtype_policy(policy), dist_strategy.scope():
        model = build_compiled(config, input_spec, kind, env.gpu_count, data.steps)
        notice = notice_to_heed(options.preemption, kind)
        tracker = Checkpointing(options.checkpoint_dir, config.checkpoint_every_steps, data.steps,
                                options.on_checkpoint, notice, EpochChoice.of(config), splits.regression)  # fmt: skip
        tracker.val_rows = data.val_rows
        resumed_at = batches_done(tracker.restore(model), data.steps)
        start = time.perf_counter()
        clock = TrainClock()
        guard = StopOnDivergence(tracker, config.learning_rate)
        every_fit = [guard, tracker, clock, *(options.callbacks or [])]
        with ending_on_divergence(config) as diverged:
            fit_epochs(model, tracker, data, every_fit, options.log_dir, config.last_epoch)
        tracker.take_kept_weights(model)
        seconds = time.perf_counter() - start
    if artifact_path:
        save_keras_artifact(model, config.model, input_spec, artifact_path)

    samples = (batches_done(tracker.progress, data.steps) - resumed_at) * data.batch
    kept_epoch, kept_reason = tracker.choice.kept(tracker.progress.history)
    log.info("kept epoch %d: %s", kept_epoch, kept_reason)
    run = TrainingRun(
        framework="tensorflow",
        config=config,
        device_type=device_type(kind),
        device_name=describe_device(kind, env),
        world_size=replicas,
        backend=step_compiler(kind, env.gpu_count),
        precision=policy,
        strategy=kind,
        history=tracker.progress.history,
        samples_per_second=samples / clock.seconds if clock.seconds > 0 else 0.0,
        train_seconds=seconds,
        kept_epoch=kept_epoch,
        kept_reason=kept_reason,
        regression=splits.regression,
        diverged="".join(diverged),
    )
    return KerasOutcome(run=run, model=model)
