"""Two gloo workers on CPU: the ranks stay in sync and each trains on its own shard."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.core.config import TrainConfig
from tests.ddp_workers import launch_local, train_and_report

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_rank_results(blob_splits, monkeypatch_module):
    config = TrainConfig(epochs=3, batch_size=32, seed=5, collective_timeout_s=120)
    return launch_local(train_and_report, config, blob_splits, nproc=2)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield patch


def test_both_ranks_ran_with_gloo(two_rank_results):
    assert sorted(two_rank_results) == [0, 1]
    for rank, result in two_rank_results.items():
        assert (result["rank"], result["world_size"], result["backend"]) == (rank, 2, "gloo")


def test_ranks_end_with_identical_parameters(two_rank_results):
    first, second = two_rank_results[0]["parameters"], two_rank_results[1]["parameters"]
    assert len(first) == len(second) > 0
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


def test_each_rank_trained_on_a_different_shard(two_rank_results):
    rows = [set(two_rank_results[r]["shard_rows"]) for r in (0, 1)]
    assert rows[0] and rows[1]
    assert not rows[0] & rows[1]


def test_ranks_report_the_same_global_history(two_rank_results):
    assert two_rank_results[0]["history"] == two_rank_results[1]["history"]
    assert two_rank_results[0]["history"][-1].val_accuracy >= 0.9
