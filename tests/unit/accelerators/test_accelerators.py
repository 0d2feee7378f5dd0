"""On a cluster a GPU training task trains on its GPUs or fails, naming what it expected and found;
locally it keeps its CPU fallback (every local pipeline test runs it)."""

from __future__ import annotations

import ctypes

import pytest

from tasks.core.accelerators.cuda_check import CudaFindings, cuda_findings, require_cuda
from tasks.core.accelerators.nvidia_driver import DRIVER_LIBRARIES, DriverLibraries
from tasks.core.accelerators.rule import AcceleratorUnavailable, on_flyte_cluster

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


@pytest.fixture
def torch_without_cuda(monkeypatch):
    """torch as a CUDA 13.0 build that finds no usable GPU, whatever this machine has."""
    import torch

    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def loader_without(*missing: str):
    """ctypes.CDLL that fails, as dlopen does, for the named driver libraries and finds the others,
    whether or not this machine has a driver."""
    real = ctypes.CDLL

    def load(name, *args, **kwargs):
        if name in missing:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return object() if name in DRIVER_LIBRARIES else real(name, *args, **kwargs)

    return load


def test_a_cuda_build_that_cannot_load_the_driver_libraries_is_refused_naming_the_library_path(
    torch_without_cuda, monkeypatch
):
    """GKE mounts the driver at /usr/local/nvidia/lib64 and sets no LD_LIBRARY_PATH: an image that
    does not set it finds neither library, and the refusal says so."""
    monkeypatch.setattr(ctypes, "CDLL", loader_without(*DRIVER_LIBRARIES))
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    with pytest.raises(AcceleratorUnavailable) as refused:
        require_cuda("1 x nvidia-l4 GPU", 1)
    message = str(refused.value)
    assert "CUDA is not usable" in message
    assert (
        "the NVIDIA driver libraries libcuda.so.1, libnvidia-ml.so.1 cannot be loaded: they were not "
        "found on the library path (LD_LIBRARY_PATH is unset)"
    ) in message
    assert "GKE mounts them at /usr/local/nvidia/lib64 without setting LD_LIBRARY_PATH" in message


def test_only_the_libraries_that_fail_to_load_are_named(torch_without_cuda, monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", loader_without("libcuda.so.1"))
    monkeypatch.setenv("LD_LIBRARY_PATH", "/opt/elsewhere")
    findings = cuda_findings()
    assert findings.libraries.unloadable == ("libcuda.so.1",)
    assert "libraries libcuda.so.1 cannot be loaded" in findings.describe()
    assert "(LD_LIBRARY_PATH=/opt/elsewhere)" in findings.describe()


def test_a_driver_whose_libraries_load_is_not_blamed_on_the_library_path(torch_without_cuda, monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", loader_without())
    findings = cuda_findings()
    assert not findings.available and findings.libraries.unloadable == ()
    assert "cannot be loaded" not in findings.describe()


def test_a_cpu_build_is_not_blamed_on_the_driver_libraries():
    libraries = DriverLibraries(unloadable=DRIVER_LIBRARIES)
    cpu_build = CudaFindings("2.13.0", None, False, 0, [], None, "NVMLError_LibraryNotFound", libraries)
    assert "(a CPU build, without CUDA)" in cpu_build.describe()
    assert "cannot be loaded" not in cpu_build.describe()


def test_only_a_pod_that_propeller_started_counts_as_a_cluster():
    assert on_flyte_cluster({"FLYTE_INTERNAL_EXECUTION_ID": "f00ba4"})
    assert not on_flyte_cluster({})
