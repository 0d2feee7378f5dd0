"""Two gloo workers on CPU: the ranks stay in sync and each trains on its own shard."""

from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np
import pytest

from tasks.core.training.config import TrainConfig
from tests.workers.ddp_workers import launch_local, train_and_report

pytestmark = pytest.mark.slow


@contextmanager
def one_thread_per_rank():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        yield


@pytest.fixture(scope="session")  # session: its tests share one worker but may not run in a row
def two_rank_results(blob_splits):
    config = TrainConfig(epochs=3, batch_size=32, seed=5, collective_timeout_s=120)
    with one_thread_per_rank():
        return launch_local(train_and_report, config, blob_splits, nproc=2)


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


@pytest.mark.heavy  # a failure scenario: another worker group per case
@pytest.mark.parametrize("how", ["raise", "die"])
def test_a_failing_rank_fails_the_whole_run_promptly_naming_rank_and_cause(blob_splits, how):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from tests.workers.ddp_workers import train_with_failing_rank

    config = TrainConfig(epochs=50, batch_size=32, seed=5, collective_timeout_s=60)
    started = time.monotonic()
    with one_thread_per_rank(), pytest.raises(ChildFailedError) as error:
        launch_local(train_with_failing_rank, config, blob_splits, 1, how, nproc=2, run_id=f"fail-{how}")
    elapsed = time.monotonic() - started
    message = error.value.format_msg()
    assert "rank      : 1" in message
    if how == "raise":
        assert "bad data on the shard of rank 1" in message
    else:
        assert "Signal 9 (SIGKILL)" in message
    # Bounded: the agent tears the group down instead of letting rank 0 wait in its all-reduce.
    # 50 epochs would take far longer than this; the bound is the collective timeout plus start-up.
    assert elapsed < config.collective_timeout_s + 60, elapsed
