"""A multi-node PyTorchJob: the pods without rank 0 wait for rank 0's outputs, and a rendezvous that
times out is retried (the job's clean-pod policy: tests/test_serialization.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
from flytekit.core.base_task import IgnoreOutputs
from flytekit.exceptions.user import FlyteRecoverableException
from flytekitplugins.kfpytorch.task import PytorchElasticFunctionTask

from tasks.core.job_completion import RankZeroSilent, wait_for_rank_zero, written_by_rank_zero
from tests.flyte_package import REPO
from tests.test_launch import TASK_INPUTS

# Each process prints the wall-clock time at which it did its part.
RANK_ZERO_POD = """
import os, sys, time
time.sleep(float(sys.argv[2]))
partial = os.path.join(sys.argv[1], "outputs.pb.partial")
open(partial, "wb").write(b"literals")
os.replace(partial, os.path.join(sys.argv[1], "outputs.pb"))
print(time.time())
"""
WAITING_POD = """
import sys, time
from tasks.core.job_completion import wait_for_rank_zero
wait_for_rank_zero(sys.argv[1], timeout_s=60, poll_s=0.05)
print(time.time())
"""


def start(script: str, *args) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *map(str, args)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )


def finished_at(process: subprocess.Popen) -> float:
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 0
    return float(stdout.strip().splitlines()[-1])


def test_the_pod_without_rank_0_exits_only_after_rank_0_wrote_its_outputs(tmp_path):
    waiting = start(WAITING_POD, tmp_path)
    rank_zero = start(RANK_ZERO_POD, tmp_path, 1.5)
    written, waited_until = finished_at(rank_zero), finished_at(waiting)
    assert waited_until >= written


def test_an_error_document_from_rank_0_also_ends_the_wait(tmp_path):
    (tmp_path / "error-3f2a.pb").write_bytes(b"error")  # propeller's distributed error aggregation naming
    assert wait_for_rank_zero(str(tmp_path), timeout_s=1, poll_s=0.01).endswith("error-3f2a.pb")


def test_rank_0_that_writes_nothing_fails_the_waiting_pod_once_the_time_is_up(tmp_path):
    now = iter(range(100))
    with pytest.raises(RankZeroSilent, match="wrote neither outputs.pb nor an error document"):
        wait_for_rank_zero(str(tmp_path), timeout_s=3, clock=lambda: next(now), sleep=lambda _: None)
    assert written_by_rank_zero(str(tmp_path)) is None


def test_the_task_waits_for_rank_0_when_the_plugin_ignores_this_pod_s_outputs(monkeypatch, tmp_path):
    """The kfpytorch plugin raises IgnoreOutputs on a node whose workers hold no rank 0; the task waits
    before letting it through, and does not wait for a preemption (IgnoreOutputs from SignalException)."""
    import flytekit

    from tasks.train_torch import train_torch_multinode

    waited = []
    monkeypatch.setattr(
        PytorchElasticFunctionTask, "_execute", lambda self, **kwargs: (_ for _ in ()).throw(IgnoreOutputs())
    )
    monkeypatch.setattr(
        flytekit, "current_context", lambda: type("Context", (), {"output_metadata_prefix": str(tmp_path)})
    )
    monkeypatch.setattr(
        "tasks.train_torch.wait_for_rank_zero", lambda prefix, timeout_s: waited.append((prefix, timeout_s))
    )
    with pytest.raises(IgnoreOutputs):
        train_torch_multinode._launch_stopping_on_signal()
    assert waited == [(str(tmp_path), train_torch_multinode.task_config.rank_zero_outputs_timeout_s)]


@pytest.mark.slow
def test_a_rendezvous_that_times_out_is_a_recoverable_error(monkeypatch):
    """Two nodes declared inside a PyTorchJob (PET_NNODES set), and only this one arrives."""
    from tasks.train_torch import train_torch_multinode

    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.delenv("FLYTE_INTERNAL_EXECUTION_ID", raising=False)
    short = {"timeout": 2, "join_timeout": 2, "read_timeout": 2}
    monkeypatch.setattr(
        train_torch_multinode, "_task_config", replace(train_torch_multinode.task_config, rdzv_configs=short)
    )
    with pytest.raises(
        FlyteRecoverableException, match="RendezvousTimeoutError.*2 node.s. were to join within 2 s"
    ):
        train_torch_multinode.execute(**TASK_INPUTS)
