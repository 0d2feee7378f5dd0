"""The out-of-memory guard: a step that raises the real CUDA OOM error is dropped and retried with
half the micro-batch and twice the accumulation, so the effective batch and the step count do not
change. Under DDP the ranks do this together: tests/integration/test_collective_oom.py."""

from __future__ import annotations

import pytest
import torch

from tasks.core.models.plugins import ModelSpec, mlp_spec
from tasks.core.training import torch_step, torch_training
from tasks.core.training.config import TrainConfig
from tests.workers.oom_workers import build_with_oom_in_backward

pytestmark = pytest.mark.usefixtures("single_process")


def failing_until(micro_size: int, monkeypatch) -> list[int]:
    """Make every step attempt run out of memory before its first forward above `micro_size` rows."""
    real_accumulate = torch_training.LoopState.accumulate_gradients
    attempts: list[int] = []

    def accumulate(state, batch, micro, totals):
        attempts.append(micro)
        if micro > micro_size:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {micro} rows (simulated)"
            )
        return real_accumulate(state, batch, micro, totals)

    monkeypatch.setattr(torch_training.LoopState, "accumulate_gradients", accumulate)
    return attempts


def out_of_memory_in_backward(number: int, monkeypatch) -> list[int]:
    """Make the `number`-th backward through the first layer's output raise the OOM error inside
    autograd: after the later layers' gradients, and earlier micro-batches' of the same step, were
    accumulated. Returns the micro-batch size of every such backward."""
    backwards: list[int] = []
    build = build_with_oom_in_backward(torch_training.build, number, backwards)
    monkeypatch.setattr(torch_training, "build", build)
    return backwards


# Without dropout, so the guarded run computes what the baseline does.
MODELS = {"mlp": mlp_spec([16], 0.0), "cnn": ModelSpec("cnn", "2x2", {"channels": "4,8", "dropout": 0.0})}


def assert_same_parameters(a, b) -> None:
    for first, second in zip(a.model.parameters(), b.model.parameters(), strict=True):
        torch.testing.assert_close(first, second, atol=1e-5, rtol=1e-4)


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
    assert_same_parameters(baseline, guarded)


def test_an_oom_in_backward_mid_step_drops_the_gradients_already_accumulated(blob_splits, monkeypatch):
    config = TrainConfig(epochs=2, batch_size=32, grad_accum_steps=2, model=MODELS["mlp"], seed=3)
    baseline = torch_training.train(config, blob_splits)
    backwards = out_of_memory_in_backward(4, monkeypatch)  # step 1, second micro-batch of 16
    guarded = torch_training.train(config, blob_splits)

    assert backwards[:6] == [16, 16, 16, 16, 8, 8]  # step 1 dropped after its second backward, then retried
    assert (guarded.micro_batch_size, guarded.grad_accum_steps) == (8, 4)
    assert guarded.optimizer_steps == baseline.optimizer_steps
    # Had the first micro-batch's gradients been kept, step 1 would have counted them twice.
    assert_same_parameters(baseline, guarded)


def test_oom_below_the_minimum_micro_batch_gives_up_clearly(blob_splits, monkeypatch):
    failing_until(0, monkeypatch)
    config = TrainConfig(epochs=1, batch_size=32, min_micro_batch_size=8)
    with pytest.raises(RuntimeError, match="CUDA out of memory at step 0 even with micro-batch 8") as error:
        torch_training.train(config, blob_splits)
    assert "(minimum 8); use a larger accelerator or a smaller model" in str(error.value)
    assert isinstance(error.value.__cause__, torch.OutOfMemoryError)


def test_a_rank_that_gives_up_for_another_ranks_oom_says_so():
    micro = torch_step.MicroBatch(size=16, minimum=8)
    micro.halve(None, step=3, per_step=32)
    assert micro.size == 8
    with pytest.raises(
        RuntimeError, match=r"at step 3 even with micro-batch 8 \(minimum 8\) on another rank"
    ):
        micro.halve(None, step=3, per_step=32)


def blob_splits_rows(splits) -> int:
    from tasks.core.data.splits import read_split

    return len(read_split(splits.train, splits.feature_names, splits.label_column)[1])
