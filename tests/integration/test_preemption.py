"""The preemption notice: the ranks agree to stop after the same step, and the grace budget is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from tasks.core.training.checkpoint import STATE_FILE
from tasks.core.training.config import TrainConfig
from tasks.core.training.preemption import PREEMPTED_EXIT_CODE, PreemptionNotice
from tests.workers.ddp_workers import launch_local, train_until_one_rank_is_signalled


def test_the_notice_is_recorded_and_the_previous_handler_restored():
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionNotice(grace_s=30) as notice:
        assert not notice.received
        os.kill(os.getpid(), signal.SIGTERM)
        assert notice.received
        error = notice.stopped(epoch=2, step=7)
    assert signal.getsignal(signal.SIGTERM) is before
    assert (error.epoch, error.step) == (2, 7)
    assert "epoch 3, step 7" in str(error)


def test_a_non_positive_grace_budget_is_rejected():
    with pytest.raises(ValueError, match="grace budget must be > 0 seconds, got 0"):
        PreemptionNotice(grace_s=0)


def test_a_save_that_overruns_the_grace_budget_ends_the_process_with_the_preempted_code():
    script = textwrap.dedent("""
        import os, signal, time
        from tasks.core.training.preemption import PreemptionNotice
        with PreemptionNotice(grace_s=1) as notice:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # a save that never finishes
    """)
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == PREEMPTED_EXIT_CODE, result.stderr
    assert time.monotonic() - started < 20
    assert "grace budget ran out before the checkpoint was saved" in result.stderr


@pytest.mark.slow
def test_a_notice_on_one_rank_stops_every_rank_after_the_same_step(blob_splits, tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = TrainConfig(epochs=20, batch_size=16, seed=2, collective_timeout_s=60)
    results = launch_local(
        train_until_one_rank_is_signalled, config, blob_splits, str(tmp_path), 1, nproc=2, run_id="notice"
    )
    assert results[0] == results[1], results  # same epoch, same step: no rank left in a collective
    assert results[0]["epoch"] == 0 and results[0]["steps_run"] in (5, 6)  # the vote is read one step later
    saved = torch.load(tmp_path / STATE_FILE, weights_only=True)
    assert (saved["epoch"], saved["step"]) == (results[0]["epoch"], results[0]["step"])
