from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from tasks.core.bundle.loading import keras_logits
from tasks.core.data.splits import read_split
from tasks.core.models.keras_models import load_keras_artifact
from tasks.core.models.plugins import ModelSpec, build, mlp_spec
from tasks.core.models.precision import for_keras
from tasks.core.training.config import TrainConfig
from tasks.core.training.keras_data import BatchSpec, batches
from tasks.core.training.tf_strategy import Environment
from tasks.core.training.tf_training import (
    TPU_STEPS_PER_EXECUTION,
    KerasRunOptions,
    dtype_policy,
    learning_rate_schedule,
    step_compiler,
    steps_per_execution,
    train_keras,
    use_jit_compile,
)


@pytest.mark.slow
def test_trains_under_the_default_strategy_and_saves_a_keras_artifact(blob_splits, tmp_path):
    artifact = str(tmp_path / "model.npz")
    outcome = train_keras(
        TrainConfig(epochs=4, batch_size=32, seed=1), blob_splits, artifact, env=Environment()
    )
    assert (outcome.run.strategy, outcome.run.world_size, outcome.run.device_name, outcome.run.precision) == (
        "default",
        1,
        "cpu",
        "float32",
    )
    assert outcome.run.backend == "default"  # no XLA on CPU: op determinism instead
    assert [e.epoch for e in outcome.run.history] == [1, 2, 3, 4]
    assert outcome.run.history[-1].val_accuracy >= 0.95 and outcome.run.samples_per_second > 0
    features, labels = read_split(blob_splits.train, blob_splits.feature_names, blob_splits.label_column)
    model, spec = load_keras_artifact(artifact)
    assert spec == TrainConfig().model
    assert (keras_logits(model, features).argmax(axis=1) == labels).mean() >= 0.95


@pytest.mark.slow
def test_the_cnn_trains_on_a_tensorflow_target_and_evaluates_from_its_artifact(blob_splits, tmp_path):
    cnn = ModelSpec(
        "cnn", "2x2", {"channels": "16,32", "dropout": 0.0}
    )  # the blobs' 4 features as a 2x2 image
    artifact = str(tmp_path / "cnn.npz")
    outcome = train_keras(TrainConfig(epochs=10, batch_size=32, learning_rate=1e-2, seed=1, model=cnn), blob_splits, artifact,
                          env=Environment())  # fmt: skip
    assert outcome.run.config.model == cnn and outcome.run.history[-1].val_accuracy >= 0.9
    features, _ = read_split(blob_splits.val, blob_splits.feature_names, blob_splits.label_column)
    model, spec = load_keras_artifact(artifact)
    assert spec == cnn
    assert np.array_equal(
        keras_logits(model, features).argmax(axis=1), keras_logits(outcome.model, features).argmax(axis=1)
    )


@pytest.mark.parametrize("name", ["cosine", "constant"])
def test_the_keras_schedule_is_the_configs(name):
    config = TrainConfig(learning_rate=0.01, lr_schedule=name)
    schedule = learning_rate_schedule(config, total_steps=40)
    for step in (0, 10, 20, 39):
        assert float(schedule(step)) == pytest.approx(config.learning_rate_at(step, 40), rel=1e-4)
    half_way = 0.005 if name == "cosine" else 0.01
    assert config.learning_rate_at(20, 40) == pytest.approx(half_way)
    traced = tf.function(schedule, jit_compile=True)  # as an XLA-compiled step calls it
    assert float(traced(tf.constant(10, tf.int64))) == pytest.approx(float(schedule(10)))
    assert type(schedule).from_config(schedule.get_config()).get_config() == schedule.get_config()


@pytest.mark.slow
def test_same_seed_same_history_on_cpu(blob_splits):
    config = TrainConfig(epochs=2, batch_size=32, seed=4)
    first = train_keras(config, blob_splits, env=Environment())
    second = train_keras(config, blob_splits, env=Environment())
    assert first.run.history == second.run.history


def epoch_rows(seed: int) -> list[np.ndarray]:
    features, row_ids = np.arange(103 * 2, dtype="float32").reshape(103, 2), np.arange(103)
    datasets = [
        batches(features, row_ids, BatchSpec(10, seed, shuffle=True, drop_remainder=True), epoch=e)
        for e in range(3)
    ]
    return [np.concatenate([labels.numpy() for _, labels in dataset]) for dataset in datasets]


def test_shuffled_batches_cover_each_row_once_per_epoch_in_a_new_order():
    epochs = epoch_rows(seed=7)
    for rows in epochs:
        assert len(rows) == 100 and len(set(rows)) == 100  # 10 full batches, no repeats
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    again = epoch_rows(seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(epochs, again, strict=True))  # same seed, same orders
    other = epoch_rows(seed=8)
    assert not np.array_equal(epochs[0], other[0])


def test_batches_pair_features_with_their_labels_and_keep_the_remainder_when_asked():
    features = np.arange(103 * 2, dtype="float32").reshape(103, 2)
    data = batches(features, np.arange(103), BatchSpec(10, seed=0, shuffle=True, drop_remainder=True))
    for x, y in data:
        np.testing.assert_array_equal(x.numpy(), features[y.numpy()])
    in_order = batches(features, np.arange(103), BatchSpec(10, seed=0, shuffle=False, drop_remainder=False))
    sizes = [len(y) for _, y in in_order]
    assert sizes == [10] * 10 + [3]
    np.testing.assert_array_equal(np.concatenate([y for _, y in in_order]), np.arange(103))


def test_full_batches_have_the_static_shape_a_tpu_compiles_once():
    features = np.zeros((103, 2), dtype="float32")
    full = batches(features, np.arange(103), BatchSpec(10, seed=0, shuffle=True, drop_remainder=True), skip=3)
    assert [spec.shape.as_list() for spec in full.element_spec] == [[10, 2], [10]]
    with_remainder = batches(
        features, np.arange(103), BatchSpec(10, seed=0, shuffle=False, drop_remainder=False)
    )
    assert [spec.shape.as_list() for spec in with_remainder.element_spec] == [[None, 2], [None]]


@pytest.mark.parametrize(
    "kind, gpus, precision, expected",
    [
        ("tpu", 0, "auto", "mixed_bfloat16"),
        ("mirrored", 2, "auto", "mixed_float16"),
        ("mirrored", 2, "bf16", "mixed_bfloat16"),
        ("default", 1, "auto", "mixed_float16"),
        ("default", 0, "auto", "float32"),
        ("tpu", 0, "fp32", "float32"),
    ],
)
def test_precision_policy(kind, gpus, precision, expected):
    assert for_keras(precision, kind, gpus).keras_policy == expected


def test_logits_stay_float32_under_mixed_precision():
    with dtype_policy("mixed_float16"):
        model = build(mlp_spec([4]), 3, 2, "tensorflow")
    assert model.layers[1].compute_dtype == "float16"
    assert model.get_layer("logits").compute_dtype == "float32"
    assert keras.mixed_precision.global_policy().name == "float32"  # restored


def test_steps_per_execution_only_batches_steps_on_tpu():
    assert steps_per_execution("tpu") == TPU_STEPS_PER_EXECUTION > 1
    assert steps_per_execution("mirrored") == steps_per_execution("default") == 1


def test_xla_on_a_single_gpu_and_left_to_the_strategy_otherwise():
    assert use_jit_compile("default", gpu_count=1)
    assert not use_jit_compile("default", gpu_count=0)  # CPU: op determinism instead
    assert not any(use_jit_compile(kind, 4) for kind in ("tpu", "mirrored", "multi_worker"))


def test_the_run_records_xla_only_where_xla_compiles_the_step():
    assert step_compiler("tpu", gpu_count=0) == step_compiler("default", gpu_count=1) == "xla"
    assert step_compiler("default", gpu_count=0) == "default"
    assert step_compiler("mirrored", gpu_count=4) == step_compiler("multi_worker", gpu_count=2) == "default"


def test_global_batch_must_split_over_replicas(blob_splits):
    with pytest.raises(ValueError, match="divisible"):
        TrainConfig(batch_size=33).micro_batch_size(2)


class Preempted(keras.callbacks.Callback):
    """Stops the run the hard way after `epochs` epochs, as a reclaimed node would."""

    def __init__(self, epochs: int):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epochs:
            raise RuntimeError("node preempted")


class EpochCounter(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.started: list[int] = []

    def on_epoch_begin(self, epoch, logs=None):
        self.started.append(epoch + 1)


@pytest.mark.slow
def test_tf_resumes_from_its_backup_after_preemption(blob_splits, tmp_path):
    config = TrainConfig(epochs=4, batch_size=32, seed=6)
    checkpoint = str(tmp_path / "checkpoint")
    uploads: list[str] = []
    options = KerasRunOptions(checkpoint_dir=checkpoint, on_checkpoint=uploads.append,
                              callbacks=[Preempted(epochs=2)])  # fmt: skip
    with pytest.raises(RuntimeError, match="node preempted"):
        train_keras(config, blob_splits, env=Environment(), options=options)
    assert uploads == [checkpoint, checkpoint]  # published after each completed epoch

    counter = EpochCounter()
    options = KerasRunOptions(checkpoint_dir=checkpoint, callbacks=[counter])
    resumed = train_keras(config, blob_splits, env=Environment(), options=options)
    assert counter.started == [3, 4]  # epochs 1-2 were not trained again
    assert [e.epoch for e in resumed.run.history] == [1, 2, 3, 4]
    uninterrupted = train_keras(config, blob_splits, env=Environment())
    assert resumed.run.history[:2] == uninterrupted.run.history[:2]  # same seed, same first epochs
    assert resumed.run.history[-1].val_accuracy >= 0.9
