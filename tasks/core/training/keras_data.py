"""The Keras loop's rows: the train and validation splits read once, and each epoch's batches drawn by a
seeded permutation, static shapes where the strategy needs them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import tensorflow as tf

from tasks.core.data.splits import SplitPaths, read_split
from tasks.core.training.config import TrainConfig, class_weights, describe_class_weights

log = logging.getLogger(__name__)


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
    val_rows: int  # the rows the validation metrics are measured on


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
    val_rows = len(vy) // batch * batch if static_shapes else len(vy)
    return KerasData(train_epoch, val_data, steps, batch, val_rows)


def epoch_permutation(count: int, seed: int, epoch: int) -> tf.Tensor:
    seed_pair = tf.constant([seed, epoch], tf.int64)
    return tf.random.experimental.stateless_shuffle(tf.range(count, dtype=tf.int64), seed=seed_pair)
