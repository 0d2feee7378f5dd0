"""The profile of the torch training loop that `make gpu-check` prints for a figure that missed its goal."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from benchmarks.gpu_profile import (
    BUSY_LOW,
    MANY_LAUNCHES_PER_STEP,
    MATMUL_OPS,
    OpTime,
    ProfileSummary,
    count_launches,
    device_intervals,
    epoch_device_idle,
    host_sync_calls,
    loop_parts,
    profile_training,
    union_length,
)
from tasks.core.models.plugins import mlp_spec
from tasks.core.training import ranges, torch_training
from tasks.core.training.config import TrainConfig

TINY = TrainConfig(epochs=1, batch_size=32, model=mlp_spec([16]))


@pytest.fixture(scope="module")
def cpu_profile(blob_splits, tmp_path_factory):
    if torch.cuda.is_available():
        pytest.skip("profiles the CPU run; the CUDA run has its own test")
    return profile_training(TINY, blob_splits, trace_dir=tmp_path_factory.mktemp("trace"), name="tiny")


@pytest.mark.slow
def test_a_cpu_run_profile_counts_the_runs_steps_and_times(cpu_profile, blob_splits):
    assert cpu_profile.optimizer_steps == torch_training.train(TINY, blob_splits).optimizer_steps
    assert cpu_profile.optimizer_steps > 0
    assert cpu_profile.wall_s > 0
    assert not cpu_profile.on_device
    assert cpu_profile.device_busy_s == 0 and cpu_profile.device_busy_fraction == 0
    assert cpu_profile.kernel_launches_per_step == 0
    # The loop reads its loss back once a step at least.
    assert cpu_profile.host_syncs_per_step >= 1


def test_a_cpu_run_verdict_does_not_claim_a_busy_device(cpu_profile):
    verdict = cpu_profile.verdict()
    assert verdict.startswith("host only")
    assert "busy" not in verdict and "device-bound" not in verdict


def test_a_cpu_run_top_operators_include_the_matmuls(cpu_profile):
    names = [op.name for op in cpu_profile.top_ops]
    assert 0 < len(names) <= 10
    assert {"aten::addmm", "aten::mm", "aten::linear"} & set(names)
    times = [op.self_ms for op in cpu_profile.top_ops]
    assert times == sorted(times, reverse=True) and times[0] > 0
    assert 0 < cpu_profile.matmul_share < 1


def test_the_trace_is_written_as_chrome_trace_json(cpu_profile):
    with open(cpu_profile.trace_path) as trace:
        events = json.load(trace)["traceEvents"]
    assert cpu_profile.trace_path.endswith("tiny.json")
    assert any(event.get("name") == "aten::addmm" for event in events)


def item_reads(count: int, device: str) -> int:
    """The host syncs counted in a profile of a snippet that calls `.item()` `count` times."""
    values = torch.arange(4.0, device=device)
    on_device = device == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_device else [])]
    with profile(activities=activities) as prof:
        for _ in range(count):
            values.sum().item()
    return len(host_sync_calls(prof.events(), on_device))


def test_host_syncs_count_item_calls_on_cpu():
    assert item_reads(5, "cpu") == 5
    assert item_reads(0, "cpu") == 0


def event(name: str, start: float, end: float, device_type=DeviceType.CPU, annotation: bool = False):
    return SimpleNamespace(
        name=name,
        time_range=SimpleNamespace(start=start, end=end),
        device_type=device_type,
        is_user_annotation=annotation,
    )


def test_a_launch_made_through_the_driver_counts_once():
    events = [
        event("cudaLaunchKernel", 0, 10),
        event("cuLaunchKernel", 2, 5),  # inside the runtime call above
        event("cuLaunchKernelEx", 20, 25),
        event("cudaLaunchKernelExC", 30, 31),
        event("aten::addmm", 0, 40),
        event("cudaMemcpyAsync", 32, 33),
    ]
    assert count_launches(events) == 3


def test_on_cuda_only_the_runtimes_waits_count_as_host_syncs():
    events = [
        event("aten::_local_scalar_dense", 0, 10),  # a .item(): counted by the wait inside it
        event("cudaMemcpyAsync", 1, 2),
        event("cudaStreamSynchronize", 3, 9),
        event("cuStreamSynchronize", 4, 8),  # the same wait, through the driver
        event("aten::_local_scalar_dense", 20, 21),  # a CPU tensor's .item(): no wait
        event("cudaMemcpy", 30, 35),  # a blocking copy
        event("cudaEventSynchronize", 40, 41),
    ]
    assert len(host_sync_calls(events, on_device=True)) == 3
    assert len(host_sync_calls(events, on_device=False)) == 2


def test_device_busy_time_merges_overlapping_intervals():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert union_length([(5, 6), (0, 10), (2, 3)]) == 10
    assert union_length([]) == 0


def test_device_intervals_leave_out_annotations_and_host_events():
    events = [
        event("gemm_kernel", 0, 2, DeviceType.CUDA),
        event("Memcpy HtoD", 3, 4, DeviceType.CUDA),
        event("Optimizer.step#AdamW.step", 0, 100, DeviceType.CUDA, annotation=True),
        event("aten::addmm", 0, 50),
    ]
    assert device_intervals(events) == [(0, 2), (3, 4)]


def summary(busy_fraction: float, launches: float, syncs: float, matmul_share: float = 0.8) -> ProfileSummary:
    return ProfileSummary(
        optimizer_steps=100,
        wall_s=2.0,
        device_busy_s=2.0 * busy_fraction,
        kernel_launches_per_step=launches,
        host_syncs_per_step=syncs,
        host_sync_wait_s=0.1,
        matmul_share=matmul_share,
        top_ops=[OpTime("aten::addmm", 300, 812.5), OpTime("aten::add_", 900, 40.25)],
        on_device=True,
    )


def test_the_verdict_says_launch_bound_for_an_idle_device_and_many_launches():
    verdict = summary(0.35, 240, 1).verdict()
    assert verdict.startswith("launch-bound")
    assert "35%" in verdict and "240 kernel launches a step" in verdict
    assert summary(BUSY_LOW - 0.01, MANY_LAUNCHES_PER_STEP, 0).verdict().startswith("launch-bound")


def test_the_verdict_says_host_syncs_for_an_idle_device_that_waits_each_step():
    verdict = summary(0.3, 12, 3).verdict()
    assert verdict.startswith("host syncs: 3.0 per step")
    assert "waits in them 5% of the time" in verdict and "busy 30%" in verdict


def test_the_verdict_blames_the_host_for_an_idle_device_with_few_launches_and_no_syncs():
    assert summary(0.3, 12, 0).verdict().startswith("host-bound")


def test_the_verdict_says_device_bound_for_a_busy_device():
    compute = summary(0.93, 240, 3).verdict()
    assert compute.startswith("device-bound, compute")
    assert "93%" in compute and "aten::addmm" in compute
    assert summary(BUSY_LOW, 240, 3, matmul_share=0.2).verdict().startswith("device-bound, memory bandwidth")


def test_text_and_json_carry_the_numbers():
    found = summary(0.35, 240, 1.5)
    text = found.text()
    assert text.splitlines()[0] == found.verdict()
    numbers = (
        "100 optimizer steps",
        "2.00 s",
        "0.700 s",
        "35%",
        "240.0 kernel launches",
        "1.5 host syncs",
        "0.100 s",
    )
    assert all(number in text for number in numbers), text
    assert "aten::addmm" in text and "812.50 ms" in text and "900 calls" in text
    report = json.loads(json.dumps(found.to_json()))
    assert report["optimizer_steps"] == 100 and report["device_busy_fraction"] == pytest.approx(0.35)
    assert report["kernel_launches_per_step"] == 240 and report["host_syncs_per_step"] == 1.5
    assert report["host_sync_wait_fraction"] == pytest.approx(0.05)
    assert report["top_ops"][0] == {"name": "aten::addmm", "calls": 300, "self_ms": 812.5}
    assert report["verdict"] == found.verdict()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_run_profile_sees_the_device_work(blob_splits):
    found = profile_training(TINY, blob_splits)
    assert found.on_device and found.optimizer_steps > 0
    assert 0 < found.device_busy_fraction <= 1
    assert found.kernel_launches_per_step > 0
    assert found.top_ops and found.top_ops[0].self_ms > 0
    assert {op.name for op in found.top_ops} & MATMUL_OPS
    assert ranges.TRAIN_EPOCH in {op.name for op in found.loop_parts}
    assert 0 <= found.epoch_device_idle_s <= found.wall_s


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_host_syncs_count_item_calls_on_cuda():
    item_reads(1, "cuda")  # warm up: the first call initialises CUDA
    # The profiler synchronises the device as it stops: a difference leaves that out.
    assert item_reads(5, "cuda") - item_reads(0, "cuda") == 5


def test_a_cpu_run_profile_times_the_loops_marked_parts(cpu_profile):
    parts = {op.name: op for op in cpu_profile.loop_parts}
    assert set(parts) == {ranges.TRAIN_EPOCH, ranges.EPOCH_ORDER, ranges.EPOCH_END}
    assert all(op.calls == TINY.epochs for op in parts.values())
    # The order and the epoch's end are parts of the timed epoch.
    epoch = parts[ranges.TRAIN_EPOCH].self_ms
    assert 0 < parts[ranges.EPOCH_ORDER].self_ms + parts[ranges.EPOCH_END].self_ms < epoch
    assert "loop parts, host time: train epoch 1 x" in cpu_profile.text()


def test_the_device_idle_time_of_an_epoch_is_what_no_device_work_covers():
    events = [
        event(ranges.TRAIN_EPOCH, 10, 110),
        event(ranges.EPOCH_ORDER, 10, 40),
        event("gemm_kernel", 0, 20, DeviceType.CUDA),  # before the epoch from 10 on
        event("gemm_kernel", 40, 70, DeviceType.CUDA),
        event("Memcpy HtoD", 60, 80, DeviceType.CUDA),
        event("gemm_kernel", 100, 130, DeviceType.CUDA),
    ]
    # Covered: 10-20, 40-80, 100-110 = 60 of the epoch's 100.
    assert epoch_device_idle(events) == 40
    assert loop_parts(events) == [OpTime(ranges.TRAIN_EPOCH, 1, 0.1), OpTime(ranges.EPOCH_ORDER, 1, 0.03)]
