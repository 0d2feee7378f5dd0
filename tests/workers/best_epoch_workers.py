"""Runs for the best-epoch tests: a torch loop whose validation loss follows a script, so that the
best epoch and the early stop are known in advance, and the DDP worker that trains, is interrupted
and resumes (importable by spawned children)."""

from __future__ import annotations

import contextlib
from dataclasses import asdict
from typing import Any

import torch


def scripted_val_loss(losses: list[float], patch=setattr) -> None:
    """From here on, epoch e's validation loss (from 0) reads `losses[e]` on every rank; the real
    validation still runs, with its collectives, and its accuracy stands. `patch` sets the attributes
    (a test's `monkeypatch.setattr`, to undo them)."""
    from tasks.core.training import torch_training

    real_train_epoch, real_evaluate = torch_training.LoopState.train_epoch, torch_training.evaluate_shard
    current = {"epoch": 0}

    def train_epoch(state, epoch):
        current["epoch"] = epoch
        return real_train_epoch(state, epoch)

    def evaluate_shard(*args, **kwargs):
        _, accuracy = real_evaluate(*args, **kwargs)
        return losses[current["epoch"]], accuracy

    patch(torch_training.LoopState, "train_epoch", train_epoch)
    patch(torch_training, "evaluate_shard", evaluate_shard)


class Interrupted(Exception):
    pass


def interrupt_at_step(step: int, patch=setattr) -> None:
    """The `step`-th optimizer step from here on (from 1) raises `Interrupted` before it trains, on every
    rank alike, as a run killed there would stop."""
    from tasks.core.training import torch_training

    real_step, calls = torch_training.LoopState.optimizer_step, []

    def optimizer_step(*args, **kwargs):
        calls.append(1)
        if len(calls) == step:
            raise Interrupted(f"interrupted at optimizer step {step}")
        return real_step(*args, **kwargs)

    patch(torch_training.LoopState, "optimizer_step", optimizer_step)


def result(outcome) -> dict[str, Any]:
    run = outcome.run
    return {
        "history": [asdict(epoch) for epoch in run.history],
        "kept": (run.kept_epoch, run.kept_reason),
        "state": {name: tensor.detach().clone() for name, tensor in outcome.model.state_dict().items()},
        "optimizer_steps": outcome.optimizer_steps,
    }


def train_interrupted_and_resumed(
    config, splits, checkpoint_dir: str, interrupted_in: tuple[int, int], patch=setattr
) -> dict[str, Any]:
    """Trains three times: uninterrupted; then with a checkpoint every 2 steps, interrupted at the
    step `interrupted_in` = (epoch, step), both from 0; then resumed from that checkpoint. Returns the
    uninterrupted and the resumed runs' results, and where the checkpoint resumed from was saved."""
    from tasks.core.training import torch_training
    from tasks.core.training.checkpoint import TrainingCheckpoint
    from tasks.core.training.torch_ddp import shutdown_distributed
    from tasks.core.training.torch_training import train

    real_step = torch_training.LoopState.optimizer_step
    try:
        uninterrupted = result(train(config, splits))
        steps_per_epoch = uninterrupted["optimizer_steps"] // len(uninterrupted["history"])
        checkpoint = TrainingCheckpoint(checkpoint_dir, every_steps=2)
        epoch, step = interrupted_in
        interrupt_at_step(epoch * steps_per_epoch + step + 1, patch)
        with contextlib.suppress(Interrupted):  # the caller checks where the checkpoint was saved
            train(config, splits, checkpoint=checkpoint)
        patch(torch_training.LoopState, "optimizer_step", real_step)
        saved = torch.load(checkpoint.path, weights_only=True)
        resumed = result(train(config, splits, checkpoint=checkpoint))
    finally:
        shutdown_distributed()
    return {"uninterrupted": uninterrupted, "resumed": resumed, "saved_at": (saved["epoch"], saved["step"])}


def ddp_train_interrupted_and_resumed(
    config, splits, losses, checkpoint_dir, interrupted_in
) -> dict[str, Any]:
    scripted_val_loss(losses)
    return train_interrupted_and_resumed(config, splits, checkpoint_dir, interrupted_in)
