"""Two gloo ranks on CPU decide alike: early stopping ends both at the same epoch with the same best
weights, and a run interrupted after its best epoch resumes to the same best weights.

Slow: it spawns the two worker processes, once for all three runs (uninterrupted, interrupted,
resumed), as only separate processes can form a process group."""

from __future__ import annotations

import pytest
import torch

from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tests.workers.best_epoch_workers import ddp_train_interrupted_and_resumed
from tests.workers.ddp_workers import launch_local

pytestmark = pytest.mark.slow

# Epoch 3's loss is the lowest; epochs 4-6 are no better, so patience 3 stops the run after epoch 6.
LOSSES = [0.9, 0.8, 0.5, 0.6, 0.7, 0.55, 0.4, 0.3]


@pytest.fixture(scope="module")
def ranks(blob_splits, tmp_path_factory):
    config = TrainConfig(epochs=8, patience=3, batch_size=32, seed=5, model=mlp_spec([16], 0.1),
                         collective_timeout_s=120)  # fmt: skip
    checkpoint = str(tmp_path_factory.mktemp("best_epoch_checkpoint"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        run = ddp_train_interrupted_and_resumed
        return launch_local(
            run, config, blob_splits, LOSSES, checkpoint, (4, 3), nproc=2, run_id="best-epoch"
        )


def assert_same_state(first: dict, second: dict) -> None:
    assert first.keys() == second.keys()
    for name, tensor in first.items():
        assert torch.equal(tensor, second[name]), name


def test_early_stopping_stops_every_rank_at_the_same_epoch_with_the_same_best_weights(ranks):
    first, second = ranks[0]["uninterrupted"], ranks[1]["uninterrupted"]
    assert [epoch["epoch"] for epoch in first["history"]] == [1, 2, 3, 4, 5, 6]
    assert first["history"] == second["history"]
    assert first["optimizer_steps"] == second["optimizer_steps"]
    assert first["kept"] == second["kept"] and first["kept"][0] == 3
    assert_same_state(first["state"], second["state"])


def test_a_resumed_ddp_run_keeps_the_same_best_weights_on_every_rank(ranks):
    for rank in (0, 1):
        assert ranks[rank]["saved_at"] == (4, 2)  # mid-epoch 5, after the best epoch, 3
        expected, resumed = ranks[rank]["uninterrupted"], ranks[rank]["resumed"]
        assert resumed["history"] == expected["history"]
        assert resumed["kept"] == expected["kept"]
        assert_same_state(resumed["state"], expected["state"])
