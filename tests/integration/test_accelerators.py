"""On a cluster a GPU training task trains on its GPUs or fails: the packaged torch task run as a pod on
a node without CUDA (tests/unit/accelerators/test_accelerators.py has the checks themselves)."""

from __future__ import annotations

import pytest

from tests.pods import refused_like_a_pod


@pytest.mark.slow
def test_the_serialized_gpu_task_refuses_the_host_cpu_as_a_cluster_pod(train_spec, train_inputs, tmp_path):
    """The torch task's own command, as a pod on a node without CUDA (this machine): it fails before
    the launcher plans any worker or reads the splits."""
    printed, error = refused_like_a_pod(train_spec, train_inputs, tmp_path / "pod")
    assert "declared 1 x nvidia-l4 GPU (its pod requests nvidia.com/gpu)" in error
    assert "(a CPU build, without CUDA)" in error and "CUDA is not usable" in error
    assert "no GPU found; training with" not in printed  # the local fallback's launch note
    assert not (tmp_path / "pod" / "checkpoint").exists()
