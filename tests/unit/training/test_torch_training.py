from __future__ import annotations

import pytest
import torch

from tasks.core.models.plugins import mlp_spec
from tasks.core.models.torch_models import load_torch_artifact
from tasks.core.training import torch_training
from tasks.core.training.config import TrainConfig
from tasks.core.training.torch_ddp import DistributedContext
from tasks.core.training.torch_step import StepSums, Totals, autocast_dtype, build_optimizer, evaluate_shard
from tasks.core.training.torch_training import train

pytestmark = pytest.mark.usefixtures("single_process")


def parameters(outcome) -> list[torch.Tensor]:
    return [p.detach().clone() for p in outcome.model.parameters()]


def test_trains_a_separable_problem_and_writes_the_artifact(blob_splits, tmp_path):
    artifact = tmp_path / "model.pt"
    outcome = train(TrainConfig(epochs=5, batch_size=32, model=mlp_spec([32])), blob_splits, str(artifact))
    assert [e.epoch for e in outcome.run.history] == [1, 2, 3, 4, 5]
    assert outcome.run.history[-1].val_accuracy >= 0.95
    assert outcome.run.history[-1].train_loss < outcome.run.history[0].train_loss
    assert outcome.run.samples_per_second > 0
    assert (outcome.run.device_name, outcome.run.world_size, outcome.run.backend, outcome.run.precision) == (
        "cpu",
        1,
        "none",
        "float32",
    )
    model, spec = load_torch_artifact(str(artifact))
    assert spec == mlp_spec([32]) and model[0].in_features == 4


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_the_loop_follows_the_learning_rate_schedule(schedule, blob_splits, monkeypatch):
    rates, real_step = [], torch_training.LoopState.optimizer_step

    def recording_step(state, *args):
        rates.append(state.optimizer.param_groups[0]["lr"])
        return real_step(state, *args)

    monkeypatch.setattr(torch_training.LoopState, "optimizer_step", recording_step)
    config = TrainConfig(epochs=2, batch_size=32, lr_schedule=schedule)
    outcome = train(config, blob_splits)
    total = outcome.optimizer_steps
    assert rates == pytest.approx([config.learning_rate_at(step, total) for step in range(total)])
    assert (rates[-1] < config.learning_rate / 10) == (schedule == "cosine")


def test_same_seed_same_parameters_and_history(blob_splits):
    config = TrainConfig(epochs=2, batch_size=16, seed=3)
    first, second = train(config, blob_splits), train(config, blob_splits)
    assert first.run.history == second.run.history
    for a, b in zip(parameters(first), parameters(second), strict=True):
        assert torch.equal(a, b)
    third = train(TrainConfig(epochs=2, batch_size=16, seed=4), blob_splits)
    assert not all(torch.equal(a, b) for a, b in zip(parameters(first), parameters(third), strict=True))


def test_gradient_accumulation_matches_the_full_batch(blob_splits):
    common = dict(epochs=2, batch_size=32, model=mlp_spec([16], 0.0), seed=1)
    full = train(TrainConfig(**common, grad_accum_steps=1), blob_splits)
    accumulated = train(TrainConfig(**common, grad_accum_steps=4), blob_splits)
    for a, b in zip(parameters(full), parameters(accumulated), strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_batch_must_divide_over_workers_and_accumulation():
    with pytest.raises(ValueError, match="divisible"):
        TrainConfig(batch_size=30, grad_accum_steps=4).micro_batch_size(world_size=2)
    assert TrainConfig(batch_size=64, grad_accum_steps=2).micro_batch_size(world_size=2) == 16


@pytest.mark.parametrize(
    "kwargs, match",
    [({"epochs": 0}, "epochs"), ({"batch_size": -1}, "batch_size"), ({"precision": "fp8"}, "precision")],
)
def test_config_validation(kwargs, match):
    config = TrainConfig(**kwargs)  # building a config never raises; validate() does
    assert match in config.problems()
    with pytest.raises(ValueError, match=match):
        config.validate()


def test_batch_larger_than_the_shard_is_refused(blob_splits):
    with pytest.raises(ValueError, match="lower batch_size"):
        train(TrainConfig(epochs=1, batch_size=4096), blob_splits)


def test_cpu_always_trains_in_full_precision():
    for precision in ("auto", "bf16", "fp16", "fp32"):
        assert autocast_dtype(torch.device("cpu"), precision) is None


def test_a_gpu_that_only_emulates_bf16_trains_in_fp16(monkeypatch):
    # A pre-Ampere GPU: bf16 "supported" only through emulation.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla V100-SXM2-16GB")
    cuda = torch.device("cuda")
    assert autocast_dtype(cuda, "auto") == torch.float16
    with pytest.raises(ValueError, match="Tesla V100-SXM2-16GB has no native bf16 support"):
        autocast_dtype(cuda, "bf16")


def test_adamw_is_not_fused_on_cpu():
    optimizer = build_optimizer(torch.nn.Linear(2, 2), TrainConfig(), torch.device("cpu"))
    assert not optimizer.defaults["fused"]


def test_totals_count_exactly_past_what_float32_can():
    assert torch.tensor(2.0**24) + 1 == 2.0**24  # what a float32 counter would do
    totals = Totals(torch.device("cpu"), loss_sum=2.0**25, correct=2**25)
    logits, labels = torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.tensor([1, 1])  # one right, one wrong
    step = StepSums()
    step.add(torch.tensor(0.125), logits, labels)  # the step's mean loss over its 2 rows
    totals.add_step(step, rows=2)
    totals.add(torch.tensor(0.25), logits, labels)  # an evaluation batch's summed loss
    single = DistributedContext(rank=0, world_size=1, device=torch.device("cpu"), backend="none")
    assert totals.all_reduced(n_rows=2**25 + 3, ctx=single) == (2.0**25 + 0.5, 2**25 + 2, 2**25 + 3)


def test_evaluation_reads_its_totals_back_once(monkeypatch):
    torch.manual_seed(0)
    model, x, y = torch.nn.Linear(4, 3), torch.randn(50, 4), torch.randint(0, 3, (50,))
    with torch.no_grad():
        logits = model(x)
    expected = (
        torch.nn.functional.cross_entropy(logits, y).item(),
        (logits.argmax(1) == y).float().mean().item(),
    )
    transfers = []
    real_tolist = torch.Tensor.tolist

    def no_item(self):
        raise AssertionError("a per-batch .item() syncs the host with the device")

    def counted_tolist(self):
        transfers.append(self.shape)
        return real_tolist(self)

    monkeypatch.setattr(torch.Tensor, "item", no_item)
    monkeypatch.setattr(torch.Tensor, "tolist", counted_tolist)
    single = DistributedContext(rank=0, world_size=1, device=torch.device("cpu"), backend="none")
    loss, accuracy = evaluate_shard(
        model, zip(x.split(8), y.split(8), strict=True), single, dtype=None
    )  # 7 batches
    monkeypatch.undo()
    assert transfers == [torch.Size([3])]
    assert (loss, accuracy) == pytest.approx(expected)
