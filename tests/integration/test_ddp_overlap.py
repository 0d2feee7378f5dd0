"""The DDP fast path overlaps gradient communication with the backward, and stays safe. Two gloo ranks
on CPU: a communication hook records when DDP issues each bucket's all-reduce, a gradient hook when
the backward ends; and an out-of-memory error on one rank on the fast path ends the attempt promptly,
and the retry from the last checkpoint ends as the guard's collective halving does.

Slow: each test spawns two worker processes (a few seconds each)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tasks.core.models.plugins import mlp_spec
from tasks.core.training import torch_loop
from tasks.core.training.config import TrainConfig
from tests.workers.ddp_workers import launch_local

pytestmark = pytest.mark.slow

# Large enough for several of DDP's buckets: the 512 x 512 layer's gradient alone is 1 MiB.
OVERLAP_CONFIG = TrainConfig(
    epochs=2, batch_size=32, model=mlp_spec([512, 512], 0.0), seed=5, collective_timeout_s=60
)


@pytest.fixture
def one_thread_per_rank(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def recorded(blob_splits) -> dict:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        from tests.workers.overlap_workers import train_recording_overlap

        return launch_local(train_recording_overlap, OVERLAP_CONFIG, blob_splits, nproc=2, run_id="overlap")


def test_the_first_steps_are_guarded_then_the_fast_path_runs(recorded):
    for rank in (0, 1):
        paths = [step["fast"] for step in recorded[rank]["steps"]]
        assert paths[: torch_loop.GUARDED_STEPS] == [False] * torch_loop.GUARDED_STEPS
        assert len(paths) > torch_loop.GUARDED_STEPS
        assert all(paths[torch_loop.GUARDED_STEPS :])


def test_on_the_fast_path_the_first_bucket_is_all_reduced_before_the_backward_ends(recorded):
    for rank in (0, 1):
        fast = [step for step in recorded[rank]["steps"] if step["fast"]]
        # DDP's first synced step reduces all gradients in one bucket after the backward, recording
        # the order they arrive in; from the next one on it reduces buckets built in that order.
        assert fast[0]["events"] == ["backward end", ("bucket", 0)]
        for step in fast[1:]:
            events = step["events"]
            assert "reduce" not in events
            buckets = [event for event in events if event != "backward end"]
            assert len(buckets) > 1  # several buckets
            assert events.index(("bucket", 0)) < events.index("backward end"), events


def test_on_the_fast_path_the_steps_flags_ride_in_ddps_first_bucket(recorded):
    for rank in (0, 1):
        fast_steps = sum(step["fast"] for step in recorded[rank]["steps"])
        assert recorded[rank]["flags_in_first_bucket"] == [True] * fast_steps


def test_on_the_guarded_path_no_gradient_is_reduced_before_the_backward_ends(recorded):
    for rank in (0, 1):
        for step in recorded[rank]["steps"]:
            if not step["fast"]:
                assert step["events"] == ["backward end", "reduce"]


def test_both_paths_keep_the_ranks_identical(recorded):
    for a, b in zip(recorded[0]["parameters"], recorded[1]["parameters"], strict=True):
        np.testing.assert_array_equal(a, b)
    assert recorded[0]["history"][-1].val_accuracy >= 0.9


FAILING_RANK, EVERY_STEPS = 1, 4
OOM_CONFIG = TrainConfig(
    epochs=3, batch_size=32, grad_accum_steps=2, model=mlp_spec([16], 0.0), seed=5, collective_timeout_s=30
)


def test_an_oom_on_the_fast_path_fails_promptly_and_the_retry_halves_on_the_guarded_path(
    blob_splits, tmp_path, one_thread_per_rank
):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from tests.workers.overlap_workers import train_with_oom_at_step

    failing_step = torch_loop.GUARDED_STEPS + 2  # on the fast path, between two saves
    args = (OOM_CONFIG, blob_splits, str(tmp_path), EVERY_STEPS, FAILING_RANK, failing_step)
    started = time.monotonic()
    with pytest.raises(ChildFailedError) as failed:
        launch_local(train_with_oom_at_step, *args, nproc=2, run_id="fast-oom")
    # Bounded: no rank waits in DDP's all-reduce for the collective timeout, let alone for ever.
    assert time.monotonic() - started < OOM_CONFIG.collective_timeout_s + 60
    assert "OutOfMemoryOnFastPath" in failed.value.format_msg()
    assert f"optimizer step {failing_step} with micro-batch 8" in failed.value.format_msg()

    retried = launch_local(train_with_oom_at_step, *args, nproc=2, run_id="fast-oom-retry")
    for rank in (0, 1):
        ran = retried[rank]
        resumed_at = ran["attempts"][0][0]
        assert 0 < resumed_at <= failing_step
        at_failing_step = [(micro, fast) for step, micro, fast in ran["attempts"] if step == failing_step]
        assert at_failing_step == [(8, False), (4, False)]  # replayed guarded, dropped, halved together
        assert (ran["micro_batch_size"], ran["grad_accum_steps"]) == (4, 4)  # the effective batch kept
        assert ran["optimizer_steps"] == ran["unfaulted_steps"] > failing_step
        for a, b in zip(ran["parameters"], ran["unfaulted_parameters"], strict=True):
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
    for a, b in zip(retried[0]["parameters"], retried[1]["parameters"], strict=True):
        np.testing.assert_array_equal(a, b)
