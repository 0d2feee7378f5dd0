"""A multi-node PyTorchJob: the pods without rank 0 wait for rank 0's outputs (read through flytekit's
storage settings) and Deck, and a rendezvous that times out is retried (the job's clean-pod policy:
tests/integration/test_serialization.py)."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import fsspec
import pytest
from flytekit.core.base_task import IgnoreOutputs
from flytekit.exceptions.user import FlyteRecoverableException
from flytekitplugins.kfpytorch.task import PytorchElasticFunctionTask

from tasks.core.training.job_completion import (
    DECK_FILE,
    RankZeroSilent,
    wait_for_rank_zero,
    written_by_rank_zero,
)
from tests.unit.training.test_launch import TASK_INPUTS

LOCAL = fsspec.filesystem("file")


def test_an_error_document_from_rank_0_also_ends_the_wait(tmp_path):
    (tmp_path / "error-3f2a.pb").write_bytes(b"error")  # propeller's distributed error aggregation naming
    assert wait_for_rank_zero(LOCAL, str(tmp_path), timeout_s=1, poll_s=0.01).endswith("error-3f2a.pb")


def test_rank_0_that_writes_nothing_fails_the_waiting_pod_once_the_time_is_up(tmp_path):
    now = iter(range(100))
    with pytest.raises(RankZeroSilent, match="wrote neither outputs.pb nor an error document"):
        wait_for_rank_zero(LOCAL, str(tmp_path), timeout_s=3, clock=lambda: next(now), sleep=lambda _: None)
    assert written_by_rank_zero(LOCAL, str(tmp_path)) is None


def test_after_the_outputs_the_wait_goes_on_for_rank_0_s_deck_but_not_past_its_time(tmp_path):
    """flytekit uploads the Deck after the outputs; this pod's exit completes the job, and the operator
    then deletes rank 0's pod if it still runs."""
    (tmp_path / "outputs.pb").write_bytes(b"literals")
    polls, now = [], iter(range(100))

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 3:
            (tmp_path / DECK_FILE).write_text("<html>")

    found = wait_for_rank_zero(
        LOCAL, str(tmp_path), 5, deck_timeout_s=60, clock=lambda: next(now), sleep=sleep
    )
    assert found.endswith("outputs.pb") and len(polls) == 3
    (tmp_path / DECK_FILE).unlink()
    waits = []
    wait_for_rank_zero(LOCAL, str(tmp_path), 5, deck_timeout_s=4, clock=lambda: next(now), sleep=waits.append)
    assert 0 < len(waits) <= 4


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
    monkeypatch.setattr("tasks.train_torch.wait_for_rank_zero", lambda *args: waited.append(args))
    with pytest.raises(IgnoreOutputs):
        train_torch_multinode._launch_stopping_on_signal()
    config = train_torch_multinode.task_config
    ((_, prefix, timeout_s, deck_timeout_s),) = waited
    assert (prefix, timeout_s, deck_timeout_s) == (
        str(tmp_path),
        config.rank_zero_outputs_timeout_s,
        config.rank_zero_deck_timeout_s,
    )


def test_the_wait_reads_s3_through_flytekit_s_storage_settings(monkeypatch):
    """On MinIO or the demo cluster the output prefix is s3:// at FLYTE_AWS_ENDPOINT, with its keys:
    the filesystem the task hands the wait carries them (no request is made)."""
    from flytekit.bin.entrypoint import setup_execution

    from tasks.train_torch import train_torch_multinode

    endpoint = "http://minio.flyte.svc:9000"
    monkeypatch.setenv("FLYTE_AWS_ENDPOINT", endpoint)
    monkeypatch.setenv("FLYTE_AWS_ACCESS_KEY_ID", "minio")
    monkeypatch.setenv("FLYTE_AWS_SECRET_ACCESS_KEY", "miniostorage")
    waited = []
    monkeypatch.setattr("tasks.train_torch.wait_for_rank_zero", lambda *args: waited.append(args))
    prefix = "s3://my-s3-bucket/metadata/propeller/n2/data/0"
    with setup_execution("s3://my-s3-bucket/raw", output_metadata_prefix=prefix):
        train_torch_multinode.wait_for_rank_zero_outputs()
    ((filesystem, waited_on, *_),) = waited
    assert waited_on == prefix and "s3" in filesystem.protocol
    assert filesystem.storage_options["client_kwargs"]["endpoint_url"] == endpoint
    assert (filesystem.storage_options["key"], filesystem.storage_options["secret"]) == (
        "minio",
        "miniostorage",
    )


@pytest.mark.parametrize("rank_zero_wrote", [True, False], ids=["outputs-written", "nothing-written"])
def test_sigterm_while_waiting_exits_quietly_once_rank_0_wrote_else_as_preempted(
    rank_zero_wrote, monkeypatch, tmp_path
):
    """The operator deletes the running pods of a completed job (cleanPodPolicy Running): this pod then
    writes no error beside rank 0's outputs. Before rank 0 wrote, the node is going away: exit 143."""
    import flytekit

    from tasks.train_torch import train_torch_multinode

    monkeypatch.setattr(
        flytekit, "current_context", lambda: type("Context", (), {"output_metadata_prefix": str(tmp_path)})
    )

    def deleted_while_waiting(filesystem, prefix, *args):
        if rank_zero_wrote:
            (tmp_path / "outputs.pb").write_bytes(b"literals")
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr("tasks.train_torch.wait_for_rank_zero", deleted_while_waiting)
    handler = signal.getsignal(signal.SIGTERM)
    if rank_zero_wrote:
        train_torch_multinode.wait_for_rank_zero_outputs()
    else:
        with pytest.raises(SystemExit) as stopped:
            train_torch_multinode.wait_for_rank_zero_outputs()
        assert stopped.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is handler


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
    with pytest.raises(FlyteRecoverableException) as error:
        train_torch_multinode.execute(**TASK_INPUTS)
    assert "error=RendezvousTimeoutError: " in str(error.value)
    assert "(retried: a node did not join the rendezvous in time" in str(error.value)
    assert "2 node(s) were to join within 2 s" in str(error.value)  # the error's own message, kept


def test_a_ddp_worker_reads_the_splits_in_place_with_flytekit_s_storage_settings(monkeypatch):
    """The workers read their rows of the splits by URI in tasks/core, through fsspec: in the worker
    the task makes flytekit's settings fsspec's defaults first (no request is made)."""
    import fsspec.config
    from flytekit.bin.entrypoint import setup_execution

    from tasks.core.data.files import filesystem_for
    from tasks.plumbing.storage import flyte_storage_as_fsspec_defaults

    endpoint = "http://minio.flyte.svc:9000"
    monkeypatch.setenv("FLYTE_AWS_ENDPOINT", endpoint)
    monkeypatch.setattr(fsspec.config, "conf", {})
    split = "s3://my-s3-bucket/data/train"
    assert "client_kwargs" not in filesystem_for(split)[0].storage_options
    with setup_execution("s3://my-s3-bucket/raw"):
        flyte_storage_as_fsspec_defaults()
    assert filesystem_for(split)[0].storage_options["client_kwargs"]["endpoint_url"] == endpoint
