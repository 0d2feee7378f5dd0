"""The driver libraries an image must find on GKE: the probe, and the TensorFlow GPU guard naming them.
(The torch guard's are in test_accelerator_guard.py.)"""

from __future__ import annotations

import ctypes

import pytest
import tensorflow as tf

from tasks.core.accelerators import nvidia_driver
from tasks.core.accelerators.nvidia_driver import DRIVER_LIBRARIES, driver_libraries
from tasks.core.accelerators.rule import AcceleratorUnavailable
from tasks.core.training.tf_strategy import require_gpus
from tests.unit.accelerators.test_accelerators import loader_without

CUDA_BUILD = {"is_cuda_build": True, "cuda_version": "12.5.1", "cudnn_version": "9"}


def test_libraries_mounted_where_gke_puts_them_but_off_the_library_path_are_named_there(
    monkeypatch, tmp_path
):
    for name in DRIVER_LIBRARIES:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setattr(nvidia_driver, "GKE_DRIVER_LIBRARY_DIR", str(tmp_path))
    monkeypatch.setattr(ctypes, "CDLL", loader_without(*DRIVER_LIBRARIES))
    found = driver_libraries({"LD_LIBRARY_PATH": "/opt/venv/lib"})
    assert found.in_gke_dir == DRIVER_LIBRARIES
    assert f"(LD_LIBRARY_PATH=/opt/venv/lib); they are there, under {tmp_path}, which is not on it" in (
        found.describe()
    )


def test_libraries_that_load_need_no_words(monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", loader_without())
    assert driver_libraries({}).describe() == ""


@pytest.fixture
def tensorflow_cuda_build_seeing_no_gpu(monkeypatch):
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: [])
    monkeypatch.setattr(tf.sysconfig, "get_build_info", lambda: CUDA_BUILD)


def test_the_tf_gpu_guard_names_the_driver_libraries_it_cannot_load(
    tensorflow_cuda_build_seeing_no_gpu, monkeypatch
):
    monkeypatch.setattr(ctypes, "CDLL", loader_without(*DRIVER_LIBRARIES))
    with pytest.raises(AcceleratorUnavailable) as refused:
        require_gpus("1 x nvidia-l4 GPU", 1, environ={})
    message = str(refused.value)
    assert "declared 1 x nvidia-l4 GPU but TensorFlow sees no GPU (built for CUDA 12.5.1" in message
    assert (
        "the NVIDIA driver libraries libcuda.so.1, libnvidia-ml.so.1 cannot be loaded: they were not "
        "found on the library path (LD_LIBRARY_PATH is unset)"
    ) in message
    assert "GKE mounts them at /usr/local/nvidia/lib64 without setting LD_LIBRARY_PATH" in message


def test_the_tf_gpu_guard_does_not_blame_libraries_that_load(
    tensorflow_cuda_build_seeing_no_gpu, monkeypatch
):
    monkeypatch.setattr(ctypes, "CDLL", loader_without())
    with pytest.raises(AcceleratorUnavailable) as refused:
        require_gpus("1 x nvidia-l4 GPU", 1, environ={})
    assert "the node's NVIDIA driver must support that CUDA version)" in str(refused.value)
    assert "cannot be loaded" not in str(refused.value)
