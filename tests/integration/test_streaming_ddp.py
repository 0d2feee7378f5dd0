"""Streamed rows under DDP: two gloo ranks on CPU end with the parameters the device placement
gives, and each rank reads only the rows it trains on."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.core.training.config import TrainConfig
from tests.integration.test_ddp import one_thread_per_rank
from tests.streaming_splits import small_row_groups
from tests.workers.ddp_workers import launch_local, train_recording_reads

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(blob_splits, tmp_path_factory):
    splits = small_row_groups(blob_splits, tmp_path_factory.mktemp("ddp-row-groups"))
    results = {}
    for placement in ("device", "stream"):
        config = TrainConfig(
            epochs=2, batch_size=32, seed=5, collective_timeout_s=120,
            data_placement=placement, shuffle_buffer_rows=40,
        )  # fmt: skip
        with one_thread_per_rank():
            results[placement] = launch_local(
                train_recording_reads, config, splits, nproc=2, run_id=placement
            )
    return results


def test_streamed_and_device_rows_end_with_the_same_parameters(runs):
    for rank in (0, 1):
        streamed, device = runs["stream"][rank], runs["device"][rank]
        assert streamed["history"] == device["history"]
        for a, b in zip(streamed["parameters"], device["parameters"], strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("placement", ["device", "stream"])
def test_each_rank_reads_only_the_rows_it_trains_on(runs, placement):
    read = [set(runs[placement][rank]["read_rows"]) for rank in (0, 1)]
    trained = [set(runs[placement][rank]["shard_rows"]) for rank in (0, 1)]
    assert read[0] and read[1] and not read[0] & read[1]
    assert read == trained
