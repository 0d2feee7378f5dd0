"""The CUDA-only tests, in one module that imports no flytekit: `make gpu-check` runs them on a GPU
machine that has torch, numpy, pandas, pyarrow, scikit-learn and pytest, and nothing of Flyte.
Elsewhere each is skipped, saying it needs a CUDA GPU."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tasks.core.accelerators.cuda_check import require_cuda
from tasks.core.accelerators.rule import AcceleratorUnavailable
from tasks.core.models.memory import ESTIMATE_HIGH, ESTIMATE_LOW
from tasks.core.models.plugins import build, measure_footprint, mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.torch_step import autocast_dtype, build_optimizer
from tasks.core.training.torch_training import train
from tests.streaming_splits import small_row_groups

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.usefixtures("single_process"),
]


@pytest.fixture(scope="module")
def row_group_splits(blob_splits, tmp_path_factory):
    return small_row_groups(blob_splits, tmp_path_factory.mktemp("row-groups"))


def parameters(outcome) -> list[torch.Tensor]:
    return [p.detach().clone() for p in outcome.model.parameters()]


def test_cuda_auto_precision_prefers_native_bf16():
    expected = torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    assert autocast_dtype(torch.device("cuda"), "auto") == expected
    assert autocast_dtype(torch.device("cuda"), "fp32") is None


def test_adamw_is_fused_on_cuda():
    optimizer = build_optimizer(torch.nn.Linear(2, 2).cuda(), TrainConfig(), torch.device("cuda"))
    assert optimizer.defaults["fused"] is True


def test_the_gpu_guard_accepts_this_gpu_and_refuses_one_more_than_it_has():
    """The check a task declaring GPUs runs before training: it must pass on a real GPU, and refuse,
    saying what it found, when more GPUs are declared than the machine has."""
    found = require_cuda("1 GPU", 1)
    assert found.available and found.device_count == torch.cuda.device_count()
    if found.nvml_error is None:
        assert len(found.nvml_gpus) >= found.device_count
        assert found.driver
    with pytest.raises(AcceleratorUnavailable) as refused:
        require_cuda(f"{found.device_count + 1} GPUs", found.device_count + 1)
    assert f"{found.device_count} usable CUDA device(s)" in str(refused.value)


def test_the_run_says_it_trained_on_the_gpu_and_measured_its_peak_memory(blob_splits):
    # Enough optimizer steps to learn the blobs: two epochs (18 steps) reach about 0.57 on any device.
    outcome = train(TrainConfig(epochs=8, batch_size=32, model=mlp_spec([32])), blob_splits)
    run = outcome.run
    assert (run.device_type, run.device_name) == ("cuda", torch.cuda.get_device_name(0))
    assert run.precision == str(autocast_dtype(torch.device("cuda"), "auto")).removeprefix("torch.")
    assert run.peak_device_memory_bytes > 0
    assert run.history[-1].val_accuracy >= 0.9
    assert all(p.device.type == "cuda" for p in outcome.model.parameters())


def test_estimate_matches_cuda_max_memory_allocated():
    n_features, n_classes, hidden, micro_batch = 1024, 100, [4096, 4096], 512
    device = torch.device("cuda")
    model = build(mlp_spec(hidden, 0.1), n_features, n_classes, "pytorch").to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(micro_batch, n_features, device=device)
    y = torch.randint(0, n_classes, (micro_batch,), device=device)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(2):
        F.cross_entropy(model(x).float(), y).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    measured = torch.cuda.max_memory_allocated()
    footprint = measure_footprint(mlp_spec(hidden, 0.1), n_features, n_classes, "pytorch", precision="fp32")
    estimate = footprint.estimate(micro_batch, resident_rows=micro_batch)
    assert ESTIMATE_LOW * measured <= estimate.tensor_bytes <= ESTIMATE_HIGH * measured, (
        estimate.tensor_bytes,
        measured,
    )


def test_cuda_placements_pinned_and_copied_a_step_ahead_train_as_the_device_resident_shard(row_group_splits):
    """On CUDA host batches are pinned and the stream's copies run on a side stream, a step ahead: the
    result must not change."""
    runs = {
        placement: train(
            TrainConfig(epochs=2, batch_size=16, seed=4, data_placement=placement, shuffle_buffer_rows=50,
                        precision="fp32"),
            row_group_splits,
        )
        for placement in ("device", "host", "stream")
    }  # fmt: skip
    device = runs.pop("device")
    assert not device.run.on_cpu
    for placement, outcome in runs.items():
        assert outcome.run.history == device.run.history, placement
        for a, b in zip(parameters(outcome), parameters(device), strict=True):
            assert torch.equal(a, b), placement


def test_auto_placement_on_a_gpu_reads_its_free_memory():
    """Where no plan chose (a run on a machine other than the planned one), "auto" keeps a rank's rows
    on the GPU while they take a share of its free memory, and streams them beyond."""
    from tasks.core.training.rows import RESIDENT_SHARE, auto_placement

    device = torch.device("cuda")
    free = torch.cuda.mem_get_info(device)[0]
    row_bytes = 64 * 4 + 8
    assert auto_placement(1_000_000, 64, device) == "device"
    assert auto_placement(int(RESIDENT_SHARE * free / row_bytes * 1.5), 64, device) == "stream"
