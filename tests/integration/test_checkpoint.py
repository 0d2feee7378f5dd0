"""Preemption: a training process killed mid-epoch resumes from its checkpoint and ends exactly
where an uninterrupted run ends (CPU, fixed seed), with the same best epoch's weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from tasks.core.models.plugins import ModelSpec
from tasks.core.training.checkpoint import STATE_FILE
from tests.streaming_splits import small_row_groups
from tests.workers import checkpoint_worker

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


# Both have dropout, so the resumed run must also restore the random state; the blobs' 4 features
# are a 2x2 image to the CNN.
MODELS = {
    "mlp": ModelSpec("mlp", options={"hidden_sizes": "32,16", "dropout": 0.2}),
    "cnn": ModelSpec("cnn", "2x2", {"channels": "4,8", "dropout": 0.2}),
}
# (model, data placement, selection metric): streamed rows resume inside a shuffle window of a split of
# small row groups; the CNN's validation accuracy is best at epoch 2 (equal at 3), so the run killed in
# epoch 3 resumes to that epoch's weights from the checkpoint.
RUNS = [("mlp", "auto", "val_loss"), ("cnn", "auto", "val_accuracy"), ("mlp", "stream", "val_loss")]


def worker(splits, checkpoint_dir: str, out: Path, slow: bool, model: ModelSpec, placement: str,
           metric: str) -> list[str]:  # fmt: skip
    return [sys.executable, "-m", "tests.workers.checkpoint_worker", json.dumps(asdict(splits)), checkpoint_dir, str(out),
            "1" if slow else "0", json.dumps(asdict(model)), placement, metric]  # fmt: skip


def run(command: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def uninterrupted_here(splits, out: Path, model: ModelSpec, placement: str, metric: str) -> None:
    """The worker's run without a checkpoint, in this process: the same code and one thread, as the
    worker processes get (ENV)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        checkpoint_worker.train_and_save(splits, "", str(out), model, placement, metric)
    finally:
        torch.set_num_threads(threads)


def wait_for_mid_epoch_checkpoint(path: Path, process: subprocess.Popen, timeout_s: float = 120) -> dict:
    """The first checkpoint saved in the middle of the last of the 3 epochs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "the training process ended before it could be killed"
        if path.exists():
            state = torch.load(path, weights_only=True)
            if state["epoch"] == 2 and state["step"] > 0:
                return state
        time.sleep(0.01)
    raise AssertionError("no mid-epoch checkpoint appeared")


@pytest.mark.parametrize("model, placement, metric", RUNS)
def test_killed_and_resumed_run_matches_an_uninterrupted_run(model, placement, metric, blob_splits, tmp_path):
    spec = MODELS[model]
    splits = small_row_groups(blob_splits, tmp_path / "splits") if placement == "stream" else blob_splits
    uninterrupted_here(splits, tmp_path / "uninterrupted.pt", spec, placement, metric)

    checkpoint_dir = tmp_path / "checkpoint"
    killed = worker(splits, str(checkpoint_dir), tmp_path / "never.pt", True, spec, placement, metric)
    process = subprocess.Popen(killed, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        saved = wait_for_mid_epoch_checkpoint(checkpoint_dir / STATE_FILE, process)
        process.kill()  # SIGKILL: no chance to clean up, as with a reclaimed spot node
    finally:
        process.wait(timeout=60)
    assert process.returncode == -9
    assert not (tmp_path / "never.pt").exists()

    resumed = run(
        worker(splits, str(checkpoint_dir), tmp_path / "resumed.pt", False, spec, placement, metric)
    )
    assert "RESUMING epoch=" in resumed.stdout
    resumed_epoch = int(resumed.stdout.split("epoch=")[1].split()[0])
    assert resumed_epoch >= saved["epoch"] >= 1

    expected = torch.load(tmp_path / "uninterrupted.pt", weights_only=True)
    actual = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert actual["history"] == expected["history"]
    assert actual["optimizer_steps"] == expected["optimizer_steps"]
    assert actual["kept_epoch"] == expected["kept_epoch"] == (2 if metric == "val_accuracy" else 3)
    for name, tensor in expected["parameters"].items():
        assert torch.equal(actual["parameters"][name], tensor), name
