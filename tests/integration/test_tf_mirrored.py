"""Keras under MirroredStrategy over two logical CPU devices, in a process of its own: TensorFlow fixes
its devices when it starts, so the test process cannot split its CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest

from tasks.core.bundle.loading import keras_logits
from tasks.core.models.keras_models import load_keras_artifact

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_mirrored_strategy_with_two_logical_cpu_devices(blob_splits, tmp_path):
    command = [
        sys.executable,
        "-m",
        "tests.workers.tf_mirrored_worker",
        json.dumps(asdict(blob_splits)),
        str(tmp_path / "m.npz"),
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["strategy"], summary["replicas"]) == ("mirrored", 2)
    assert len(summary["devices"]) == 2
    assert summary["val_accuracy"] >= 0.9
    features = np.zeros((2, len(blob_splits.feature_names)), dtype=np.float32)
    assert keras_logits(load_keras_artifact(str(tmp_path / "m.npz"))[0], features).argmax(axis=1).shape == (
        2,
    )
