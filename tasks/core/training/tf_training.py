"""The TensorFlow/Keras twin of the PyTorch training loop, under a `tf.distribute` strategy."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from tasks.core.data.splits import SplitPaths, read_split
from tasks.core.models.keras_models import save_keras_artifact
from tasks.core.models.plugins import InputSpec, TrainingDiverged, build, input_spec_for
from tasks.core.training.config import (
    TrainConfig,
    class_weights,
    describe_class_weights,
    scheduled_learning_rate,
)
from tasks.core.training.precision import for_keras
from tasks.core.training.preemption import PreemptionNotice
from tasks.core.training.progress import EpochChoice, TrainingProgress, log_epoch
from tasks.core.training.records import EpochMetrics, TrainingRun
from tasks.core.training.tf_strategy import Environment, detect_environment, select_strategy

log = logging.getLogger(__name__)

TPU_STEPS_PER_EXECUTION = 32
STATE_FILE = "training_state.json"


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


@dataclass(frozen=True)
class BatchSpec:
    """How an epoch is cut into batches: `size` rows each (all replicas together), in the order a
    `seed` shuffles (or in row order), with or without the last, short batch."""

    size: int
    seed: int
    shuffle: bool
    drop_remainder: bool


def batches(
    features, labels, spec: BatchSpec, epoch: int = 0, skip: int = 0, class_weights=None
) -> tf.data.Dataset:
    """One epoch of batches gathered from in-memory arrays by row index, from its `skip`-th batch on;
    with `class_weights`, each row's class weight as its sample weight, which the loss alone takes.

    Shuffling permutes row indices once per epoch rather than passing every row through a
    full-size `shuffle` buffer (per-row host work every epoch). The permutation is a pure function
    of (seed, epoch): orders differ between epochs, a run is reproducible from its seed, and a
    resumed run skips exactly the batches the interrupted one trained. With `drop_remainder` the
    batch dimension is static, which a TPU needs to run each step without padding it.
    """
    count = len(labels)
    with tf.device("/cpu:0"):
        features, labels = tf.constant(features), tf.constant(labels)
        order = (
            epoch_permutation(count, spec.seed, epoch) if spec.shuffle else tf.range(count, dtype=tf.int64)
        )
        rows = batch_rows(order[skip * spec.size :], spec.size, spec.drop_remainder)
    gather = lambda rows: (tf.gather(features, rows), tf.gather(labels, rows))  # noqa: E731
    if class_weights is not None:
        weights = tf.constant(class_weights, tf.float32)
        unweighted = gather
        gather = lambda rows: (*unweighted(rows), tf.gather(weights, tf.gather(labels, rows)))  # noqa: E731
    return rows.map(gather, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def batch_rows(order: tf.Tensor, size: int, drop_remainder: bool) -> tf.data.Dataset:
    """`order` cut into batches of `size` row indices: the whole batches by one reshape (a dataset of
    single indices batched would cost a step per row, several per cent of an epoch), then the
    short rest, if any and not dropped."""
    whole = len(order) // size
    rows = tf.data.Dataset.from_tensor_slices(tf.reshape(order[: whole * size], [whole, size]))
    if drop_remainder or whole * size == len(order):
        return rows
    return rows.concatenate(tf.data.Dataset.from_tensors(order[whole * size :]))


@dataclass
class KerasData:
    """The splits ready to fit: `train_epoch(epoch=, skip=)` gives that epoch's batches from its
    `skip`-th on; `steps` batches of `batch` rows (all replicas together) make an epoch."""

    train_epoch: Callable[..., tf.data.Dataset]
    val_data: tf.data.Dataset
    steps: int
    batch: int


def read_keras_data(splits: SplitPaths, config: TrainConfig, replicas: int, static_shapes: bool) -> KerasData:
    """Reads the train and validation splits; with `static_shapes` (a TPU) every validation batch is full.

    A batch is one micro-batch on every replica; an epoch, whole optimizer steps of
    `grad_accum_steps` batches each, as in the torch loop (`TrainConfig.steps_per_epoch`)."""
    x, y = read_split(splits.train, splits.feature_names, splits.label_column)
    vx, vy = read_split(splits.val, splits.feature_names, splits.label_column)
    weights = None
    if not splits.regression:
        weights = class_weights(config.class_weight, np.bincount(y, minlength=splits.n_classes))
    if weights is not None:
        log.info("%s", describe_class_weights(weights))
    steps = config.steps_per_epoch(len(y)) * config.grad_accum_steps
    batch = config.micro_batch_size(replicas) * replicas
    with tf.device("/cpu:0"):  # copied into tensors once; each epoch's `fit` gathers batches from them
        x, y = tf.constant(x), tf.constant(y)
    train_spec = BatchSpec(batch, config.seed, shuffle=True, drop_remainder=True)
    train_epoch = partial(batches, x, y, train_spec, class_weights=weights)
    val_spec = BatchSpec(batch, config.seed, shuffle=False, drop_remainder=static_shapes)
    val_data = batches(vx, vy, val_spec, class_weights=weights)
    return KerasData(train_epoch, val_data, steps, batch)


def epoch_permutation(count: int, seed: int, epoch: int) -> tf.Tensor:
    seed_pair = tf.constant([seed, epoch], tf.int64)
    return tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64), seed=seed_pair)


class TrainClock(keras.callbacks.Callback):
    """Seconds spent in training steps, without validation or checkpointing."""

    def __init__(self):
        super().__init__()
        self.seconds, self._start = 0.0, None

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()

    def on_test_begin(self, logs=None):  # validation starts: this epoch's training is done
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None


def batches_done(progress: TrainingProgress, steps_per_epoch: int) -> int:
    return progress.epoch * steps_per_epoch + progress.step


def random_states(model: keras.Model) -> list:
    """The variables `save_weights` leaves out: the seed generators' states (dropout's), without
    which a resumed run would draw other dropout masks than the uninterrupted one."""
    weights = {id(variable) for variable in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


def write_checkpoint(
    model: keras.Model, directory: Path, progress: TrainingProgress, best: BestWeights | None = None
) -> None:
    """Weights (model and optimizer) and the best epoch's copy under names of their own, then the
    progress naming them: replacing the state file is the one step that commits a save, so a kill at
    any point leaves the previous checkpoint whole."""
    weights = f"epoch{progress.epoch}-step{progress.step}.weights.h5"
    model.save_weights(str(directory / weights))
    best_file = best.write(directory) if best is not None else None
    pending = directory / f"{STATE_FILE}.partial"
    seeds = [variable.numpy().tolist() for variable in random_states(model)]
    saved = {**progress.to_dict(), "weights": weights, "best_weights": best_file, "random_states": seeds}
    pending.write_text(json.dumps(saved))
    os.replace(pending, directory / STATE_FILE)
    for stale in (*directory.glob("*.weights.h5"), *directory.glob(f"*{BestWeights.SUFFIX}")):
        if stale.name not in (weights, best_file):
            stale.unlink()


@dataclass
class BestWeights:
    """A copy of the model's weights (`get_weights`: no optimizer state) at the best `epoch` so far."""

    epoch: int
    arrays: list[np.ndarray]
    SUFFIX = ".best.npz"

    @property
    def file_name(self) -> str:
        return f"epoch{self.epoch}{self.SUFFIX}"

    def write(self, directory: Path) -> str:
        """Writes the copy once per best epoch (a later save of the same best keeps the file)."""
        path = directory / self.file_name
        if not path.exists():
            pending = directory / f"{self.file_name}.partial"
            with pending.open("wb") as file:
                np.savez(file, *self.arrays)
            os.replace(pending, path)
        return self.file_name

    @classmethod
    def read(cls, directory: Path, name: str) -> BestWeights:
        with np.load(directory / name) as saved:
            arrays = [saved[f"arr_{index}"] for index in range(len(saved.files))]
        return cls(int(name.removeprefix("epoch").removesuffix(cls.SUFFIX)), arrays)


class Checkpointing(keras.callbacks.Callback):
    """Tracks the run's `TrainingProgress` across attempts and logs each epoch's line. Keeps a copy of
    the best epoch's weights as `choice` says (`best`). With a directory, saves the progress with the
    weights and that copy after every epoch, every `every_steps` batches and on the preemption notice,
    and hands the directory to `on_save` after each save.

    Ours rather than keras.callbacks.BackupAndRestore, which restores only the epoch (a mid-epoch
    backup re-trains the whole epoch) and, after a resume, records epoch 0 for a mid-epoch save made
    before the resumed run's first epoch end.
    """

    def __init__(self, directory: str | None, every_steps: int, steps_per_epoch: int, epochs: int,
                 on_save: Callable[[str], None] | None, preemption: PreemptionNotice | None,
                 choice: EpochChoice | None = None, regression: bool = False):  # fmt: skip
        super().__init__()
        self.regression = regression
        self.choice = choice or EpochChoice(keep="last", epochs=epochs)
        self.best: BestWeights | None = None
        self.directory = Path(directory) if directory else None
        self.every_steps, self.steps_per_epoch, self.epochs = every_steps, steps_per_epoch, epochs
        self.on_save, self.preemption = on_save, preemption
        self.progress = TrainingProgress()
        self.first_step = self.saved_step = 0
        if self.directory:
            self.directory.mkdir(parents=True, exist_ok=True)

    def restore(self, model: keras.Model) -> TrainingProgress:
        """Loads the saved weights into the compiled `model`; returns the progress to resume from."""
        path = self.directory / STATE_FILE if self.directory else None
        if path is None or not path.exists():
            return self.progress
        saved = json.loads(path.read_text())
        model.optimizer.build(model.trainable_variables)  # so that load_weights restores its variables
        model.load_weights(str(self.directory / saved["weights"]))
        for variable, value in zip(random_states(model), saved["random_states"], strict=True):
            variable.assign(value)
        if saved.get("best_weights"):
            self.best = BestWeights.read(self.directory, saved["best_weights"])
        self.progress = TrainingProgress.from_dict(saved)
        log.info("resuming from checkpoint: epoch %d, step %d", self.progress.epoch + 1, self.progress.step)
        return self.progress

    def on_epoch_begin(self, epoch, logs=None):
        self.first_step = self.saved_step = self.progress.step  # > 0 in an epoch resumed mid-way

    def step_after(self, batch: int) -> int:
        """The epoch's batches done once `batch` ends: `batch` counts from this fit's first batch and,
        under steps_per_execution, is the last of several."""
        return min(self.first_step + batch + 1, self.steps_per_epoch)

    def on_train_batch_end(self, batch, logs=None):
        self.progress.step = self.step_after(batch)
        if self.progress.step == self.steps_per_epoch:
            return  # the epoch end saves, with the validation metrics
        if self.preemption is not None and self.preemption.received:
            self.stop()
        if self.every_steps and self.progress.step - self.saved_step >= self.every_steps:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        keys = ("loss", "accuracy", "val_loss", "val_accuracy")
        # A regression has no accuracy: 0, as the torch loop counts it.
        metrics = EpochMetrics(
            epoch + 1, *(float(logs.get(key, 0.0 if "accuracy" in key else np.nan)) for key in keys)
        )
        self.progress.finish_epoch(metrics)
        if self.choice.keeps_copy(self.progress.history):
            self.best = BestWeights(metrics.epoch, self.model.get_weights())
        self.save()
        log_epoch(metrics, self.epochs, self.regression)

    def take_kept_weights(self, model: keras.Model) -> None:
        """The best epoch's weights back in `model` where a later epoch ended the run."""
        if self.choice.restores_copy(self.progress.history):
            model.set_weights(self.best.arrays)

    def save(self) -> None:
        if self.directory is None:
            return
        write_checkpoint(self.model, self.directory, self.progress, self.best)
        self.saved_step = self.progress.step
        if self.on_save:
            self.on_save(str(self.directory))

    def stop(self) -> None:
        """Saves the step reached and raises out of `fit` (after `stop_training`, Keras would still
        validate the partial epoch and end it as if complete)."""
        if self.directory is None:
            log.warning("the preemption notice came with no checkpoint directory: stopping without a save")
        self.save()
        raise self.preemption.stopped(self.progress.epoch, self.progress.step)


class StopOnDivergence(keras.callbacks.Callback):
    """Raises `TrainingDiverged` at the first batch whose loss is not finite. Listed before the
    tracker (`train_keras`), so no checkpoint of the diverged model is saved. (Keras's own
    TerminateOnNaN ends training quietly, and the run would be reported as a result.)"""

    def __init__(self, tracker: Checkpointing, learning_rate: float):
        super().__init__()
        self.tracker, self.learning_rate = tracker, learning_rate

    def on_train_batch_end(self, batch, logs=None):
        loss = float((logs or {}).get("loss", 0.0))
        if not math.isfinite(loss):
            step = self.tracker.step_after(batch)
            raise TrainingDiverged.at(self.tracker.progress.epoch + 1, step, loss, self.learning_rate)


def notice_to_heed(preemption: PreemptionNotice | None, strategy_kind: str) -> PreemptionNotice | None:
    """MultiWorkerMirroredStrategy workers would have to agree to stop; one stopping alone hangs the rest."""
    if preemption is not None and strategy_kind == "multi_worker":
        log.warning(
            "the preemption notice is not acted on under MultiWorkerMirroredStrategy; "
            "checkpoints are saved on the usual schedule"
        )
        return None
    return preemption


def board(log_dir: str | None) -> list[keras.callbacks.Callback]:
    """TensorBoard scalars per epoch (loss and accuracy for train and validation)."""
    return [keras.callbacks.TensorBoard(log_dir, update_freq="epoch", write_graph=False)] if log_dir else []


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
) -> None:
    """One `fit` per epoch, on that epoch's order from the batch the tracker reached, until the last
    epoch or an early stop (`EpochChoice.stops_early`), with `callbacks` in their order (the
    divergence guard before the `tracker`, so a diverged model is never saved).
    (A stream of epochs under `steps_per_epoch` would let an epoch's last multi-step execution on a
    TPU run into the next epoch; Keras's TensorBoard closes its writers after each fit, hence a fresh one.)"""
    for epoch in range(tracker.progress.epoch, tracker.epochs):
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
    trained in this attempt.
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
        tracker = Checkpointing(options.checkpoint_dir, config.checkpoint_every_steps, data.steps, config.epochs,
                                options.on_checkpoint, notice, EpochChoice.of(config), splits.regression)  # fmt: skip
        resumed_at = batches_done(tracker.restore(model), data.steps)
        start = time.perf_counter()
        clock = TrainClock()
        guard = StopOnDivergence(tracker, config.learning_rate)
        every_fit = [guard, tracker, clock, *(options.callbacks or [])]
        fit_epochs(model, tracker, data, every_fit, options.log_dir)
        tracker.take_kept_weights(model)
        seconds = time.perf_counter() - start
    if artifact_path:
        save_keras_artifact(model, config.model, input_spec, artifact_path)

    samples = (batches_done(tracker.progress, data.steps) - resumed_at) * data.batch
    kept_epoch, kept_reason = tracker.choice.kept(tracker.progress.history)
    log.info("kept epoch %d: %s", kept_epoch, kept_reason)
    run = TrainingRun(
        framework="tensorflow",
        model=config.model,
        config=config,
        device=describe_device(kind, env),
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
    )
    return KerasOutcome(run=run, model=model)
