"""The out-of-memory guard: a step that raises the real CUDA OOM error is retried with half the
micro-batch and twice the accumulation, so the effective batch and the step count do not change."""

from __future__ import annotations

import pytest
import torch

from tasks.core import torch_training
from tasks.core.config import TrainConfig
from tasks.core.models import ModelSpec, mlp_spec


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def failing_until(micro_size: int, monkeypatch) -> list[int]:
    """Replace the optimizer step with one that runs out of memory above `micro_size` rows."""
    real_step = torch_training.optimizer_step
    attempts: list[int] = []

    def step(model, optimizer, scaler, x, y, rows, micro, ctx, dtype):
        attempts.append(micro)
        if micro > micro_size:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {micro} rows (simulated)"
            )
        return real_step(model, optimizer, scaler, x, y, rows, micro, ctx, dtype)

    monkeypatch.setattr(torch_training, "optimizer_step", step)
    return attempts


# Without dropout, so the guarded run computes what the baseline does.
MODELS = {"mlp": mlp_spec([16], 0.0), "cnn": ModelSpec("cnn", "2x2", {"channels": "4,8", "dropout": 0.0})}


@pytest.mark.parametrize("model", list(MODELS))
def test_oom_halves_the_micro_batch_and_keeps_the_effective_batch(model, blob_splits, monkeypatch):
    config = TrainConfig(epochs=2, batch_size=32, model=MODELS[model], seed=3)
    baseline = torch_training.train(config, blob_splits)
    attempts = failing_until(8, monkeypatch)
    guarded = torch_training.train(config, blob_splits)

    assert attempts[:3] == [32, 16, 8]  # two simulated OOMs on the first step, then it runs
    assert set(attempts[3:]) == {8}  # the smaller micro-batch is kept
    assert (guarded.micro_batch_size, guarded.grad_accum_steps) == (8, 4)
    assert guarded.optimizer_steps == baseline.optimizer_steps == 2 * (blob_splits_rows(blob_splits) // 32)
    for a, b in zip(baseline.model.parameters(), guarded.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_oom_below_the_minimum_micro_batch_gives_up_clearly(blob_splits, monkeypatch):
    failing_until(0, monkeypatch)
    config = TrainConfig(epochs=1, batch_size=32, min_micro_batch_size=8)
    with pytest.raises(RuntimeError, match="CUDA out of memory at step 0 even with micro-batch 8"):
        torch_training.train(config, blob_splits)


def blob_splits_rows(splits) -> int:
    from tasks.core.data import read_split

    return len(read_split(splits.train, splits.feature_names, splits.label_column)[1])
