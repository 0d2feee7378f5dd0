"""Every kind of bad input fails the workflow on CPU, before training, with one clear message."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch.distributed.launcher.api

from tasks import train_torch as train_torch_module
from tasks.core.config import TrainConfig
from tests.conftest import blobs_frame
from workflows.pipeline import training_pipeline

pytestmark = pytest.mark.slow


def write(tmp_path: Path, name: str, mutate=None) -> str:
    frame = blobs_frame(n_rows=120)
    if mutate:
        frame = mutate(frame)
    path = tmp_path / name
    frame.to_csv(path, index=False) if name.endswith(".csv") else frame.to_parquet(path, index=False)
    return str(path)


def garbage(tmp_path: Path) -> str:
    path = tmp_path / "broken.parquet"
    path.write_bytes(b"this is not parquet at all" * 10)
    return str(path)


def set_value(column: str, value):
    def mutate(frame):
        frame.loc[7, column] = value
        return frame

    return mutate


# name -> (dataset factory, extra inputs, fragments the message must contain)
CASES = {
    "bad URI": (
        lambda t: "nosuchfs://bucket/data.parquet",
        {},
        ["nosuchfs://bucket/data.parquet", "cannot open"],
    ),
    "missing file": (lambda t: str(t / "absent.parquet"), {}, ["absent.parquet", "no such file"]),
    "unreadable file": (garbage, {}, ["broken.parquet", "cannot be read as parquet"]),
    "wrong format": (
        lambda t: write(t, "data.parquet").replace(".parquet", ".xlsx"),
        {},
        ["file format", ".csv"],
    ),
    "label column missing": (
        lambda t: write(t, "d.parquet"),
        {"label_column": "kind"},
        ["label column 'kind'"],
    ),
    "non-numeric feature": (
        lambda t: write(t, "d.parquet", lambda f: f.assign(f2=f["f2"].astype(str))),
        {},
        ["'f2'", "not a number"],
    ),
    "NaN feature": (
        lambda t: write(t, "d.csv", set_value("f1", np.nan)),
        {},
        ["'f1'", "missing value", "row 7"],
    ),
    "inf feature": (
        lambda t: write(t, "d.parquet", set_value("f3", np.inf)),
        {},
        ["'f3'", "non-finite", "row 7"],
    ),
    "too few rows": (lambda t: write(t, "d.parquet", lambda f: f.iloc[:15]), {}, ["too few rows"]),
    "single class": (lambda t: write(t, "d.parquet", lambda f: f.assign(species="a")), {}, ["single class"]),
    "zero epochs": (
        lambda t: write(t, "d.parquet"),
        {"hyperparameters": TrainConfig(epochs=0)},
        ["input 'hyperparameters.epochs' = 0", "--hyperparameters '{\"epochs\": 30}'"],
    ),
    "negative batch": (
        lambda t: write(t, "d.parquet"),
        {"hyperparameters": TrainConfig(batch_size=-8)},
        ["input 'hyperparameters.batch_size' = -8"],
    ),
    "batch not divisible by accumulation": (
        lambda t: write(t, "d.parquet"),
        {"hyperparameters": TrainConfig(epochs=2, batch_size=64, grad_accum_steps=3)},
        ["input 'hyperparameters.grad_accum_steps' = 3", "divide batch_size (64)"],
    ),
    "batch not divisible over the workers": (
        lambda t: write(t, "d.parquet"),
        {"hyperparameters": TrainConfig(epochs=2, batch_size=63), "plan_resources": False},
        ["input 'hyperparameters.batch_size' = 63", "over 2 workers", '"batch_size": 62'],
    ),
    "batch larger than the training rows": (
        lambda t: write(t, "d.parquet"),
        {"hyperparameters": TrainConfig(epochs=2, batch_size=4096)},
        ["input 'hyperparameters.batch_size' = 4096", "larger than the 84 training rows"],
    ),
    "unknown target": (
        lambda t: write(t, "d.parquet"),
        {"target": "cuda"},
        ["input 'target' = 'cuda'", "gpu, "],
    ),
}


@pytest.fixture
def no_training(monkeypatch):
    """Fail loudly if any case gets as far as training."""

    def refuse(*args, **kwargs):
        raise AssertionError("training started although the input was bad")

    monkeypatch.setattr(train_torch_module, "train_with_ddp", refuse)
    monkeypatch.setattr(torch.distributed.launcher.api, "elastic_launch", refuse)  # no worker process either


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_fails_before_training_with_a_clear_message(case, tmp_path, no_training):
    make_dataset, extra, fragments = CASES[case]
    dataset = make_dataset(tmp_path)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    inputs = {
        "dataset": dataset,
        "label_column": "species",
        "hyperparameters": TrainConfig(epochs=2),
        **extra,
    }
    with pytest.raises(Exception) as error:
        training_pipeline(**inputs)
    message = str(error.value)
    assert "training started" not in message
    for fragment in fragments:
        assert fragment in message, message
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing modified
