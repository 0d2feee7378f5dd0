"""The TensorFlow/Keras twin of the PyTorch training loop, under a `tf.distribute` strategy."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from tasks.core.config import EpochMetrics, ModelConfig, SplitPaths, TrainConfig
from tasks.core.data import read_split
from tasks.core.tf_strategy import Environment, detect_environment, select_strategy

log = logging.getLogger(__name__)

TPU_STEPS_PER_EXECUTION = 32


@dataclass
class KerasOutcome:
    history: list[EpochMetrics]
    samples_per_second: float
    train_seconds: float
    device: str
    replicas: int
    strategy: str
    precision: str
    model: keras.Model


def precision_policy(strategy_kind: str, gpu_count: int, precision: str) -> str:
    """Keras dtype policy: bf16 on TPU, fp16 on GPU (bf16 if asked), float32 on CPU or when fp32 is asked."""
    if precision == "fp32":
        return "float32"
    if strategy_kind == "tpu":
        return "mixed_bfloat16"
    if gpu_count == 0:
        return "float32"
    return "mixed_bfloat16" if precision == "bf16" else "mixed_float16"


@contextmanager
def dtype_policy(name: str):
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def build_keras_mlp(config: ModelConfig) -> keras.Model:
    """Same architecture as the torch MLP; the logits layer stays float32 under mixed precision."""
    inputs = keras.Input(shape=(config.n_features,), name="features")
    x = inputs
    for width in config.hidden_sizes:
        x = keras.layers.Dense(width, activation="relu")(x)
        x = keras.layers.Dropout(config.dropout)(x)
    logits = keras.layers.Dense(config.n_classes, dtype="float32", name="logits")(x)
    return keras.Model(inputs, logits, name="mlp")


def batches(features, labels, batch: int, seed: int, shuffle: bool, drop_remainder: bool) -> tf.data.Dataset:
    """Batches gathered from in-memory arrays by row index.

    Shuffling permutes row indices once per epoch rather than passing every row through a
    full-size `shuffle` buffer (per-row host work every epoch). Each pass over the dataset (each
    epoch) draws a new key from a seeded stream, so orders differ between epochs but a run is
    reproducible from its seed.
    """
    count = len(labels)
    with tf.device("/cpu:0"):
        features, labels = tf.constant(features), tf.constant(labels)
    stop = count - count % batch if drop_remainder else count
    starts = tf.data.Dataset.range(0, stop, batch)
    if shuffle:
        keys = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).take(1)
        orders = keys.map(lambda key: epoch_order(count, key, seed))
        rows = orders.flat_map(lambda order: starts.map(lambda start: order[start : start + batch]))
        rows = rows.apply(tf.data.experimental.assert_cardinality(starts.cardinality()))
    else:
        rows = starts.map(lambda start: tf.range(start, tf.minimum(start + batch, count)))
    gather = lambda rows: (tf.gather(features, rows), tf.gather(labels, rows))  # noqa: E731
    return rows.map(gather, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def epoch_order(count: int, key, seed: int) -> tf.Tensor:
    seed_pair = tf.stack([key, tf.constant(seed, tf.int64)])
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


class EpochLog(keras.callbacks.Callback):
    def __init__(self, epochs: int):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        log.info(
            "epoch %d/%d train_loss=%.4f train_acc=%.4f val_loss=%.4f val_acc=%.4f",
            epoch + 1, self.epochs, logs.get("loss", np.nan), logs.get("accuracy", np.nan),
            logs.get("val_loss", np.nan), logs.get("val_accuracy", np.nan),
        )  # fmt: skip


class EpochRecords(keras.callbacks.Callback):
    """Keeps the per-epoch history across attempts (Keras's History only sees the current one)
    and publishes the checkpoint after BackupAndRestore has written it."""

    def __init__(self, directory: Path, on_save: Callable[[str], None] | None):
        super().__init__()
        self.path, self.on_save = directory / "history.json", on_save
        self.records = json.loads(self.path.read_text()) if self.path.exists() else []

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        keys = ("loss", "accuracy", "val_loss", "val_accuracy")
        self.records.append([epoch + 1, *(float(logs.get(key, np.nan)) for key in keys)])
        self.path.write_text(json.dumps(self.records))
        if self.on_save:
            self.on_save(str(self.path.parent))


def resumable(checkpoint_dir: str | None, every_steps: int, on_save) -> list[keras.callbacks.Callback]:
    """BackupAndRestore (model, optimizer, epoch and step) plus the history, in `checkpoint_dir`."""
    if not checkpoint_dir:
        return []
    directory = Path(checkpoint_dir)
    directory.mkdir(parents=True, exist_ok=True)
    backup = keras.callbacks.BackupAndRestore(
        str(directory / "backup"), save_freq=every_steps or "epoch", delete_checkpoint=False
    )
    return [backup, EpochRecords(directory, on_save)]


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


def compile_model(model: keras.Model, config: TrainConfig, strategy_kind: str, gpu_count: int) -> None:
    optimizer = keras.optimizers.AdamW(
        learning_rate=config.learning_rate,
        weight_decay=config.weight_decay,
        gradient_accumulation_steps=config.grad_accum_steps if config.grad_accum_steps > 1 else None,
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=use_jit_compile(strategy_kind, gpu_count),
        steps_per_execution=steps_per_execution(strategy_kind),
    )


def train_keras(
    config: TrainConfig,
    splits: SplitPaths,
    artifact_path: str | None = None,
    strategy: str = "auto",
    allow_fallback: bool = False,
    env: Environment | None = None,
    resolver_factory: Callable | None = None,
    checkpoint_dir: str | None = None,
    on_checkpoint: Callable[[str], None] | None = None,
    callbacks: list | None = None,
    log_dir: str | None = None,
) -> KerasOutcome:
    """Train the Keras MLP; `config.batch_size` is the global batch (per-replica x replicas)."""
    env = env or detect_environment()
    dist_strategy, kind = select_strategy(strategy, allow_fallback, env, resolver_factory)
    replicas = dist_strategy.num_replicas_in_sync
    micro_batch = config.micro_batch_size(replicas) * replicas  # global batch fed per step
    keras.utils.set_random_seed(config.seed)
    if kind == "default" and env.gpu_count == 0:
        tf.config.experimental.enable_op_determinism()

    x, y = read_split(splits.train, splits.feature_names, splits.label_column)
    vx, vy = read_split(splits.val, splits.feature_names, splits.label_column)
    if len(y) < micro_batch:
        raise ValueError(
            f"{len(y)} training rows are fewer than one global batch ({micro_batch}); lower batch_size"
        )
    static_shapes = kind == "tpu"
    train_data = batches(x, y, micro_batch, config.seed, shuffle=True, drop_remainder=True)
    val_data = batches(vx, vy, micro_batch, config.seed, shuffle=False, drop_remainder=static_shapes)

    policy = precision_policy(kind, env.gpu_count, config.precision)
    model_config = ModelConfig(
        len(splits.feature_names), splits.n_classes, config.hidden_sizes, config.dropout
    )
    log.info(
        "keras: %s, %d replicas x %d rows per step, policy %s",
        kind,
        replicas,
        micro_batch // replicas,
        policy,
    )
    with dtype_policy(policy), dist_strategy.scope():
        model = build_keras_mlp(model_config)
        compile_model(model, config, kind, env.gpu_count)
        start = time.perf_counter()
        clock = TrainClock()
        checkpointing = resumable(checkpoint_dir, config.checkpoint_every_steps, on_checkpoint)
        fit = model.fit(train_data, validation_data=val_data, epochs=config.epochs, verbose=0, shuffle=False,
                        callbacks=[clock, *checkpointing, EpochLog(config.epochs), *board(log_dir), *(callbacks or [])])  # fmt: skip
        seconds = time.perf_counter() - start
    if artifact_path:
        model.save(artifact_path)

    epochs_run = len(fit.history.get("loss", []))
    samples = (len(y) // micro_batch) * micro_batch * epochs_run
    if checkpointing:
        history = [EpochMetrics(*record) for record in checkpointing[-1].records]
    else:
        keys = ("loss", "accuracy", "val_loss", "val_accuracy")
        history = [EpochMetrics(i + 1, *(float(fit.history[k][i]) for k in keys)) for i in range(epochs_run)]
    return KerasOutcome(
        history=history,
        samples_per_second=samples / clock.seconds if clock.seconds > 0 else 0.0,
        train_seconds=seconds,
        device=describe_device(kind, env),
        replicas=replicas,
        strategy=kind,
        precision=policy,
        model=model,
    )


def predict_keras(path: str, features: np.ndarray, batch_size: int = 8192) -> np.ndarray:
    model = keras.models.load_model(path)
    return model.predict(features, batch_size=batch_size, verbose=0).argmax(axis=1)
