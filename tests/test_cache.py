"""Preprocessing is cached on its inputs, the data's fingerprint and the code's version."""

from __future__ import annotations

import pytest

from tasks import preprocess as preprocess_module
from tasks.core.config import TrainConfig
from tests.conftest import blobs_frame
from workflows.pipeline import training_pipeline

pytestmark = pytest.mark.slow


@pytest.fixture
def preprocess_calls(monkeypatch) -> list[str]:
    """Records each time the preprocessing body really runs."""
    calls: list[str] = []
    real = preprocess_module.prepare_dataset

    def counting(uri, *args, **kwargs):
        calls.append(uri)
        return real(uri, *args, **kwargs)

    monkeypatch.setattr(preprocess_module, "prepare_dataset", counting)
    return calls


def test_rerun_hits_the_cache_and_changed_data_recomputes(tmp_path, preprocess_calls):
    path = tmp_path / "blobs.parquet"
    blobs_frame(n_rows=240, seed=1).to_parquet(path, index=False)
    run = dict(
        dataset=str(path), label_column="species", hyperparameters=TrainConfig(epochs=2, batch_size=32)
    )

    first = training_pipeline(**run)
    second = training_pipeline(**run)
    assert preprocess_calls == [str(path)]  # the second run reused the cached splits
    assert second.metrics.n_test == first.metrics.n_test

    blobs_frame(n_rows=300, seed=2).to_parquet(path, index=False)  # same URI, new contents
    third = training_pipeline(**run)
    assert preprocess_calls == [str(path), str(path)]
    assert third.metrics.n_test != first.metrics.n_test


def test_a_different_split_is_not_served_from_the_cache(tmp_path, preprocess_calls):
    path = tmp_path / "blobs.parquet"
    blobs_frame(n_rows=240, seed=3).to_parquet(path, index=False)
    for seed in (0, 1):
        hyperparameters = TrainConfig(epochs=1, batch_size=32, seed=seed)
        training_pipeline(dataset=str(path), label_column="species", hyperparameters=hyperparameters)
    assert len(preprocess_calls) == 2


def test_cache_version_follows_the_preprocessing_code():
    from tasks.preprocess import PREPROCESS_CODE_VERSION, code_version, preprocess

    assert preprocess.metadata.cache and preprocess.metadata.cache_version == PREPROCESS_CODE_VERSION
    assert code_version("tasks.core.data", "tasks.preprocess") == PREPROCESS_CODE_VERSION
    assert code_version("tasks.core.data") != PREPROCESS_CODE_VERSION
