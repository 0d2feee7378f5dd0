"""What the torch and Keras training loops share: one precision table, one learning rate schedule, one
progress record in their checkpoints, one rule for a shard too small to train, one epoch log line."""

from __future__ import annotations

import logging
import math

import keras
import numpy as np
import pytest

from tasks.core.models.plugins import mlp_spec
from tasks.core.models.precision import BF16, FP16, FP32, TABLE, for_keras, for_torch, named
from tasks.core.training.config import PRECISIONS, TrainConfig
from tasks.core.training.progress import TrainingProgress, log_epoch
from tasks.core.training.records import EpochMetrics
from tasks.core.training.tf_strategy import Environment
from tasks.core.training.tf_training import KerasRunOptions, learning_rate_schedule, train_keras


def test_the_table_names_each_precision_for_both_frameworks():
    assert [(p.torch_autocast, p.keras_policy, p.value_bytes) for p in TABLE.values()] == [
        ("bfloat16", "mixed_bfloat16", 2),
        ("float16", "mixed_float16", 2),
        (None, "float32", 4),
    ]
    assert set(PRECISIONS) == {"auto", *TABLE}  # what a user may ask for: "auto" or a name of the table
    with pytest.raises(ValueError, match="'auto' is not one of bf16, fp16, fp32"):
        named("auto")


def no_bf16_question():
    raise AssertionError("asked whether the device has native bf16 when the answer could not matter")


@pytest.mark.parametrize(
    "asked, accelerator, native, expected",
    [
        ("auto", None, no_bf16_question, FP32),  # CPU
        ("bf16", None, no_bf16_question, FP32),
        ("fp32", "A100", no_bf16_question, FP32),
        ("fp16", "A100", no_bf16_question, FP16),
        ("auto", "A100", lambda: True, BF16),
        ("bf16", "A100", lambda: True, BF16),
        ("auto", "V100", lambda: False, FP16),  # emulated bf16 is slower than fp16 with the scaler
    ],
)
def test_torch_resolves_the_asked_precision_by_the_device(asked, accelerator, native, expected):
    assert for_torch(asked, accelerator, native) == expected


def test_torch_refuses_bf16_where_the_gpu_only_emulates_it():
    with pytest.raises(ValueError, match="V100 has no native bf16 support"):
        for_torch("bf16", "V100", lambda: False)


def test_keras_resolves_the_asked_precision_by_the_strategy():
    assert for_keras("auto", "tpu", 0) == for_keras("bf16", "default", 1) == BF16
    assert for_keras("auto", "mirrored", 2) == for_keras("fp16", "default", 1) == FP16
    assert for_keras("auto", "default", 0) == for_keras("fp32", "tpu", 0) == FP32


@pytest.mark.parametrize("name", ["cosine", "constant"])
def test_both_loops_follow_one_schedule(name):
    config = TrainConfig(learning_rate=0.02, lr_schedule=name)
    keras_rates = [float(learning_rate_schedule(config, 50)(step)) for step in range(50)]
    torch_rates = [config.learning_rate_at(step, 50) for step in range(50)]
    assert keras_rates == pytest.approx(torch_rates, rel=1e-4, abs=1e-9)
    assert (torch_rates[-1] < 0.02 / 100) == (name == "cosine")
    assert torch_rates[0] == 0.02 and math.isclose(torch_rates[25], 0.01 if name == "cosine" else 0.02)


def test_the_progress_record_survives_a_checkpoint_as_a_plain_dict():
    progress = TrainingProgress(epoch=2, step=5)
    progress.history = [EpochMetrics(1, 0.9, 0.5, 1.0, 0.4), EpochMetrics(2, 0.5, 0.7, 0.6, 0.65)]
    saved = progress.to_dict()
    assert saved["history"][1] == {"epoch": 2, "train_loss": 0.5, "train_accuracy": 0.7, "val_loss": 0.6,
                                   "val_accuracy": 0.65, "val_rows": 0}  # fmt: skip
    assert TrainingProgress.from_dict(saved) == progress
    progress.finish_epoch(EpochMetrics(3, 0.4, 0.8, 0.5, 0.7))
    assert (progress.epoch, progress.step, progress.history[-1].epoch) == (3, 0, 3)


def test_one_epoch_line_for_both_loops(caplog):
    with caplog.at_level(logging.INFO, logger="tasks.core.training.progress"):
        log_epoch(EpochMetrics(2, 0.51234, 0.75, 0.6, 0.7), epochs=5)
    assert caplog.messages == ["epoch 2/5 train_loss=0.5123 train_acc=0.7500 val_loss=0.6000 val_acc=0.7000"]


def test_one_rule_for_a_shard_too_small_for_an_optimizer_step():
    config = TrainConfig(batch_size=64, grad_accum_steps=2)
    assert config.steps_per_epoch(rows=200, world_size=2) == 6  # 16 rows a micro-batch, 2 of them a step
    assert config.steps_per_epoch(rows=64) == 1
    too_few = r"each of 2 workers holds 31 training rows, fewer than one optimizer step \(16 x 2\); lower"
    with pytest.raises(ValueError, match=too_few):
        config.steps_per_epoch(rows=31, world_size=2)
    with pytest.raises(ValueError, match=r"only 63 training rows, fewer than one optimizer step \(32 x 2\)"):
        config.steps_per_epoch(rows=63)


@pytest.mark.parametrize("framework", ["pytorch", "tensorflow"])
def test_both_loops_refuse_a_shard_too_small_for_an_optimizer_step(framework, blob_splits, monkeypatch):
    config = TrainConfig(epochs=1, batch_size=4096)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="fewer than one optimizer step .*; lower batch_size"):
        if framework == "pytorch":
            from tasks.core.training.torch_training import train

            train(config, blob_splits)
        else:
            train_keras(config, blob_splits, env=Environment())


class KilledAt(keras.callbacks.Callback):
    """Ends the run the hard way after batch `batch` of epoch `epoch` (both from 0)."""

    def __init__(self, epoch: int, batch: int):
        super().__init__()
        self.epoch, self.batch, self.current = epoch, batch, 0

    def on_epoch_begin(self, epoch, logs=None):
        self.current = epoch

    def on_train_batch_end(self, batch, logs=None):
        if (self.current, batch) == (self.epoch, self.batch):
            raise RuntimeError("node reclaimed")


@pytest.mark.slow
def test_a_keras_run_resumed_mid_epoch_ends_bit_identical(blob_splits, tmp_path):
    """The resumed run restores the weights, the optimizer's step counter (which drives the
    schedule), the dropout masks' seed state and its place in the epoch's order."""
    config = TrainConfig(epochs=3, batch_size=32, seed=2, model=mlp_spec([16], 0.2), checkpoint_every_steps=2)
    uninterrupted = train_keras(config, blob_splits, env=Environment())
    checkpoint = str(tmp_path / "checkpoint")
    with pytest.raises(RuntimeError, match="node reclaimed"):
        killed = KerasRunOptions(checkpoint_dir=checkpoint, callbacks=[KilledAt(1, 4)])
        train_keras(config, blob_splits, env=Environment(), options=killed)
    resumed = train_keras(
        config, blob_splits, env=Environment(), options=KerasRunOptions(checkpoint_dir=checkpoint)
    )
    for mine, theirs in zip(resumed.model.get_weights(), uninterrupted.model.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    assert resumed.run.history[0] == uninterrupted.run.history[0]
    assert resumed.model.optimizer.iterations.numpy() == uninterrupted.model.optimizer.iterations.numpy()


def test_the_torch_loop_reads_what_differs_by_device_from_one_family_record(monkeypatch):
    import torch

    from tasks.core.training.devices import CPU, CUDA, family_of, local_family
    from tasks.core.training.torch_ddp import DistributedContext

    assert family_of(torch.device("cuda", 0)) is CUDA and family_of(torch.device("cpu")) is CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert local_family() is CPU
    ctx = DistributedContext(rank=0, world_size=1, device=torch.device("cpu"), backend="none")
    assert ctx.family is CPU and (CPU.backend, CUDA.backend) == ("gloo", "nccl")
    assert CPU.deterministic and not CPU.fused_adamw and not CPU.autocasts
    assert CPU.peak_memory(ctx.device) == 0 and CPU.rng_state(ctx.device).numel() == 0
    CPU.set_rng_state(CPU.rng_state(ctx.device), ctx.device)  # nothing to restore, and no error
