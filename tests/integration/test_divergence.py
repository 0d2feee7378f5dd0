"""Divergence across processes: DDP ranks stop together when one rank's loss is not finite, and the
training task (two local gloo workers) ends at once with the divergence as its error, restarting
nothing. The single-process cases are in tests/unit/training/test_divergence.py."""

from __future__ import annotations

import pytest

from tasks.core.data.config import DataConfig
from tasks.core.data.split_config import SplitConfig
from tasks.core.models.plugins import ModelSpec, mlp_spec
from tasks.core.training.config import TrainConfig

pytestmark = pytest.mark.slow


def test_ddp_ranks_stop_together_when_one_ranks_loss_is_not_finite(blob_splits):
    from tests.workers.ddp_workers import launch_local, train_until_one_rank_diverges

    config = TrainConfig(epochs=3, batch_size=32, model=mlp_spec([16]), seed=5, collective_timeout_s=60)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        ranks = launch_local(train_until_one_rank_diverges, config, blob_splits, 1, 3, nproc=2,
                             run_id="diverged")  # fmt: skip
    assert ranks[0]["steps_run"] == ranks[1]["steps_run"]
    assert "epoch 1, step 3: the training loss is nan;" in ranks[1]["error"]
    assert "epoch 1, step 3: the training loss is not finite on another rank;" in ranks[0]["error"]


def test_on_the_fast_path_the_ranks_stop_together_at_most_one_step_after_the_loss(blob_splits):
    from tasks.core.training.torch_loop import GUARDED_STEPS
    from tests.workers.ddp_workers import launch_local, train_until_one_rank_diverges

    config = TrainConfig(epochs=3, batch_size=32, model=mlp_spec([16]), seed=5, collective_timeout_s=60)
    diverging = GUARDED_STEPS + 3  # its flag rides in DDP's first bucket, read after the next step
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        ranks = launch_local(train_until_one_rank_diverges, config, blob_splits, 1, diverging, nproc=2,
                             run_id="diverged-fast")  # fmt: skip
    assert ranks[0]["steps_run"] == ranks[1]["steps_run"]
    assert diverging <= ranks[0]["steps_run"] <= diverging + 1
    assert "the training loss is nan;" in ranks[1]["error"]
    assert "the training loss is not finite on another rank;" in ranks[0]["error"]


def test_under_on_divergence_stop_the_ranks_leave_the_loop_together_and_hand_back_their_runs(blob_splits):
    from tasks.core.training.torch_loop import GUARDED_STEPS
    from tests.workers.ddp_workers import launch_local, train_until_one_rank_diverges

    config = TrainConfig(
        epochs=3, batch_size=32, model=mlp_spec([16]), seed=5, collective_timeout_s=60, on_divergence="stop"
    )
    diverging = GUARDED_STEPS + 3  # on the fast path: the ranks then take the kept weights back together
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        ranks = launch_local(train_until_one_rank_diverges, config, blob_splits, 1, diverging, nproc=2,
                             run_id="diverged-stop")  # fmt: skip
    assert [ranks[rank]["error"] for rank in (0, 1)] == [None, None]
    assert ranks[0]["steps_run"] == ranks[1]["steps_run"] and ranks[0]["epochs"] == ranks[1]["epochs"] < 3
    assert "the training loss is not finite on another rank;" in ranks[0]["diverged"]
    assert "the training loss is nan;" in ranks[1]["diverged"]


def test_the_training_task_ends_at_once_on_divergence_with_its_message_restarting_nothing(
    blobs, write_table, tmp_path
):
    """Two local gloo workers, as `pyflyte run` trains on a CPU machine: the divergence is the task's
    error, not a failed restart of the workers (gloo's connectFullMesh on a loaded machine), and Flyte
    would not retry it."""
    from tasks.core.training.launch import WorkerFailed
    from tasks.plumbing.failures import failure_of
    from tasks.preprocess import preprocess
    from tasks.train_torch import train_torch

    prepared = preprocess(data=DataConfig(write_table(blobs), "species", split=SplitConfig(0.2, 0.2)))
    builds = tmp_path / "builds.txt"
    model = ModelSpec("tests.unit.training.test_divergence:recorded_mlp", options={"builds": str(builds)})
    config = TrainConfig(epochs=2, batch_size=32, learning_rate=3e8, model=model)
    with pytest.raises(WorkerFailed) as error:
        train_torch(prepared=prepared, hyperparameters=config)
    assert "failed: TrainingDiverged: training diverged at epoch 1, step " in str(error.value)
    assert sorted(builds.read_text().split()) == ["0", "1"]  # each rank built its model once
    assert not failure_of(error.value).retried
