"""On a cluster a GPU training task trains on its GPUs or fails, naming what it expected and found;
locally it keeps its CPU fallback (every local pipeline test runs it)."""

from __future__ import annotations

import pytest

from tasks.core.accelerators import AcceleratorUnavailable, on_flyte_cluster
from tasks.core.cuda_check import CudaFindings, require_cuda
from tests.pods import refused_like_a_pod

# A GKE node with the default driver branch and PyPI's torch, a CUDA 13.0 build: NVML counts the GPU,
# CUDA refuses it.
OLD_DRIVER = CudaFindings(
    torch_version="2.13.0",
    cuda_build="13.0",
    available=False,
    device_count=0,
    nvml_gpus=["NVIDIA L4"],
    driver="550.90.07",
)


def test_a_driver_older_than_the_cuda_build_needs_is_refused_naming_both():
    with pytest.raises(AcceleratorUnavailable) as refused:
        require_cuda("1 x nvidia-l4 GPU", 1, OLD_DRIVER)
    message = str(refused.value)
    assert "declared 1 x nvidia-l4 GPU for torch 2.13.0 built for CUDA 13.0" in message
    assert "needs NVIDIA driver >= 580.65.06" in message
    assert "CUDA is not usable; NVIDIA driver 550.90.07 reports 1 GPU(s): NVIDIA L4" in message
    assert "never falls back to the host CPU" in message


def test_fewer_usable_gpus_than_declared_is_refused():
    four = CudaFindings("2.13.0", "13.0", True, 4, ["NVIDIA H100 80GB HBM3"] * 4, "580.82.07")
    assert require_cuda("4 x nvidia-h100-80gb GPU", 4, four) is four
    with pytest.raises(
        AcceleratorUnavailable, match="4 usable CUDA device.s.; NVIDIA driver 580.82.07 reports 4"
    ):
        require_cuda("8 x nvidia-h100-80gb GPU", 8, four)


def test_a_container_without_a_driver_says_so():
    no_driver = CudaFindings(
        "2.13.0", "13.0", False, 0, [], None, "NVMLError_LibraryNotFound: NVML Shared Library Not Found"
    )
    assert "no NVIDIA driver is reachable (NVML: NVMLError_LibraryNotFound" in no_driver.describe()


def test_only_a_pod_that_propeller_started_counts_as_a_cluster():
    assert on_flyte_cluster({"FLYTE_INTERNAL_EXECUTION_ID": "f00ba4"})
    assert not on_flyte_cluster({})


@pytest.mark.slow
def test_the_serialized_gpu_task_refuses_the_host_cpu_as_a_cluster_pod(train_spec, train_inputs, tmp_path):
    """The torch task's own command, as a pod on a node without CUDA (this machine): it fails before
    the launcher plans any worker or reads the splits."""
    printed, error = refused_like_a_pod(train_spec, train_inputs, tmp_path / "pod")
    assert "declared 1 x nvidia-l4 GPU (its pod requests nvidia.com/gpu)" in error
    assert "(a CPU build, without CUDA)" in error and "CUDA is not usable" in error
    assert "no GPU found; training with" not in printed  # the local fallback's launch note
    assert not (tmp_path / "pod" / "checkpoint").exists()
