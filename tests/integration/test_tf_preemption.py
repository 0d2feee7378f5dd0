"""Preemption of Keras training: SIGTERM mid-epoch saves the step reached and exits within the grace
budget, and a retried run trains exactly the batches that were left (CPU, fixed seed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from tasks.core.data.splits import read_split
from tasks.core.training.keras_callbacks import STATE_FILE
from tasks.core.training.keras_data import BatchSpec, batches, epoch_permutation
from tasks.core.training.preemption import PREEMPTED_EXIT_CODE
from tests.workers.keras_preemption_worker import CONFIG, GRACE_S, train_and_record

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def test_an_epochs_order_is_a_function_of_the_seed_and_the_epoch():
    def order(seed: int, epoch: int) -> np.ndarray:
        return epoch_permutation(50, seed, epoch).numpy()

    assert np.array_equal(order(3, 2), order(3, 2)) and sorted(order(3, 2)) == list(range(50))
    assert not np.array_equal(order(3, 2), order(3, 1)) and not np.array_equal(order(3, 2), order(4, 2))
    features, row_ids = np.zeros((50, 1), dtype="float32"), np.arange(50)
    rest = batches(
        features, row_ids, BatchSpec(5, seed=3, shuffle=True, drop_remainder=True), epoch=2, skip=4
    )
    np.testing.assert_array_equal(np.concatenate([y for _, y in rest]), order(3, 2)[20:])


def slow_worker(splits, checkpoint_dir: Path, out: Path) -> list[str]:
    """The worker pausing after each batch, so that it can be signalled mid-epoch."""
    return [sys.executable, "-m", "tests.workers.keras_preemption_worker", json.dumps(asdict(splits)),
            str(checkpoint_dir), str(out)]  # fmt: skip


def wait_for_the_first_epoch_end(state: Path, process: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the training process ended before it could be signalled"
        if state.exists() and json.loads(state.read_text())["epoch"] >= 1:
            return
        time.sleep(0.01)
    raise AssertionError("no epoch-end checkpoint appeared")


def signal_mid_epoch(command: list[str], state: Path, log: Path) -> tuple[int, float]:
    """Sends SIGTERM a few batches into the second epoch; returns the exit code and the seconds from
    the signal to the exit."""
    with log.open("w") as output:
        process = subprocess.Popen(command, cwd=REPO, env=ENV, stdout=output, stderr=output)
        try:
            wait_for_the_first_epoch_end(state, process)
            time.sleep(0.3)
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=GRACE_S + 30)
            return process.returncode, time.monotonic() - signalled
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()


def test_sigterm_saves_the_step_reached_and_the_retry_trains_the_rest(blob_splits, tmp_path):
    labels = read_split(blob_splits.train, blob_splits.feature_names, blob_splits.label_column)[1]
    steps = len(labels) // CONFIG.batch_size
    checkpoint, log = tmp_path / "checkpoint", tmp_path / "interrupted.log"
    command = slow_worker(blob_splits, checkpoint, tmp_path / "interrupted.json")
    code, seconds = signal_mid_epoch(command, checkpoint / STATE_FILE, log)
    assert code == PREEMPTED_EXIT_CODE, log.read_text()[-3000:]
    assert seconds < GRACE_S and "grace budget ran out" not in log.read_text()  # not the watchdog's exit
    saved = json.loads((checkpoint / STATE_FILE).read_text())
    assert saved["epoch"] >= 1 and 0 < saved["step"] < steps  # mid-epoch: only the notice saves there
    trained = json.loads((tmp_path / "interrupted.json").read_text())["trained"]
    assert trained[-1] == [saved["epoch"], saved["step"]]

    # The retry reads nothing of the interrupted process but its checkpoint files, so it runs here,
    # where TensorFlow is loaded already.
    train_and_record(blob_splits, str(checkpoint), str(tmp_path / "resumed.json"), pause_s=0.0)
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    later_epochs = [[epoch, steps] for epoch in range(saved["epoch"] + 1, CONFIG.epochs)]
    assert resumed["trained"] == [[saved["epoch"], steps - saved["step"]], *later_epochs]
    assert [record["epoch"] for record in resumed["history"]] == list(range(1, CONFIG.epochs + 1))
    # The epochs finished before the interruption, as recorded then.
    assert resumed["history"][: saved["epoch"]] == saved["history"]
