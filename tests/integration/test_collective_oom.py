"""The out-of-memory guard under DDP is collective: when one rank runs out of memory in its backward,
every rank drops the step and halves its micro-batch with it, so the run goes on in step. Two gloo
ranks on CPU; rank 1 raises CUDA's out-of-memory error inside autograd, mid-step."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.core.models.plugins import mlp_spec
from tasks.core.training.config import TrainConfig
from tasks.core.training.votes import gradient_buckets
from tests.workers.ddp_workers import launch_local
from tests.workers.oom_workers import TEST_BUCKET_BYTES, train_with_and_without_oom

FAILING_RANK = 1
# 2 ranks x 2 accumulation steps x 8 rows: the 4th backward is step 1's second micro-batch.
FAILING_BACKWARD = 4
CONFIG = TrainConfig(
    epochs=2, batch_size=32, grad_accum_steps=2, model=mlp_spec([16], 0.0), seed=5, collective_timeout_s=60
)


@pytest.fixture(scope="module")
def ranks(blob_splits) -> dict:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        return launch_local(
            train_with_and_without_oom, CONFIG, blob_splits, FAILING_RANK, FAILING_BACKWARD,
            nproc=2, run_id="collective-oom",
        )  # fmt: skip


@pytest.mark.slow
def test_one_ranks_oom_drops_the_step_on_every_rank(ranks):
    for rank in (0, 1):
        faulted = ranks[rank]["faulted"]
        assert faulted["raised"] == (rank == FAILING_RANK)
        # Step 0 at 8 rows, step 1 dropped at 8 by both ranks, then every attempt at 4.
        assert faulted["attempts"][:3] == [8, 8, 4]
        assert set(faulted["attempts"][2:]) == {4}
        assert len(faulted["attempts"]) == faulted["optimizer_steps"] + 1


@pytest.mark.slow
def test_the_ranks_halve_together_and_keep_the_effective_batch_and_step_count(ranks):
    for rank in (0, 1):
        unfaulted, faulted = ranks[rank]["unfaulted"], ranks[rank]["faulted"]
        assert (unfaulted["micro_batch_size"], unfaulted["grad_accum_steps"]) == (8, 2)
        assert (faulted["micro_batch_size"], faulted["grad_accum_steps"]) == (4, 4)
        assert faulted["optimizer_steps"] == unfaulted["optimizer_steps"] > 0


@pytest.mark.slow
def test_the_faulted_run_ends_where_the_unfaulted_run_ends(ranks):
    for a, b in zip(ranks[0]["faulted"]["parameters"], ranks[1]["faulted"]["parameters"], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(ranks[0]["unfaulted"]["parameters"], ranks[0]["faulted"]["parameters"], strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    unfaulted, faulted = ranks[0]["unfaulted"]["history"], ranks[0]["faulted"]["history"]
    assert [e.train_loss for e in faulted] == pytest.approx([e.train_loss for e in unfaulted], rel=1e-4)
    assert [e.val_accuracy for e in faulted] == [e.val_accuracy for e in unfaulted]


@pytest.mark.slow
def test_gradients_stay_views_of_ddps_buckets(ranks):
    # One storage for all four parameters' gradients: no second gradient copy beside DDP's bucket.
    assert ranks[0]["faulted"]["gradient_storages"] == 1


@pytest.mark.slow
def test_gradients_are_averaged_over_the_ranks(ranks):
    before = [ranks[rank]["averaged"]["before"] for rank in (0, 1)]
    assert not np.array_equal(before[0][0], before[1][0])
    for rank in (0, 1):
        for index, got in enumerate(ranks[rank]["averaged"]["after"]):
            np.testing.assert_allclose(got, (before[0][index] + before[1][index]) / 2, rtol=1e-6)


def test_gradient_buckets_respect_the_limit_and_keep_the_order():
    import torch

    tensors = [
        torch.zeros(12),
        torch.zeros(4),
        torch.zeros(8),
        torch.zeros(2),
        torch.zeros(3, dtype=torch.int64),
    ]
    buckets = gradient_buckets(tensors, TEST_BUCKET_BYTES)
    assert [[len(t) for t in bucket] for bucket in buckets] == [[12], [4, 8], [2], [3]]  # int64 apart
    assert all(a is b for a, b in zip([t for bucket in buckets for t in bucket], tensors, strict=True))
    assert gradient_buckets([torch.zeros(100)], TEST_BUCKET_BYTES)[0][0].numel() == 100  # too large: alone
