"""Preprocessing is cached on its inputs, the data's fingerprint and the code's version.

Checked at the task that owns the cache key, `prepare_data` (it fingerprints the data and calls the
cached `preprocess`), so no training runs; every workflow, the comparison included, prepares its
data through it (test_package checks the wiring).
"""

from __future__ import annotations

import shutil

import pytest
from flytekit.types.structured import StructuredDataset

from tasks import preprocess as preprocess_module
from tasks.core.data.config import DataConfig
from tasks.core.data.split_config import SplitConfig
from tasks.core.training.config import TrainConfig
from tasks.plumbing.storage import dataset_uri, require_local_copies
from tasks.right_sizing import prepare_data
from tests.conftest import blobs_frame

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


def prepare(path, split_seed=0, **hyperparameters):
    prepared, _ = prepare_data(
        data=DataConfig(str(path), "species", split=SplitConfig(seed=split_seed)), target="gpu",
        hyperparameters=TrainConfig(**hyperparameters), plan_resources=True,
    )  # fmt: skip
    return prepared


def test_rerun_hits_the_cache_and_changed_data_recomputes(tmp_path, preprocess_calls):
    path = tmp_path / "blobs.parquet"
    blobs_frame(n_rows=240, seed=1).to_parquet(path, index=False)

    first = prepare(path)
    second = prepare(path, epochs=2, learning_rate=0.01, seed=1)  # training's settings, its seed too, keep it
    assert preprocess_calls == [str(path)]  # the second preparation reused the cached splits
    assert second.table.rows == first.table.rows and sum(first.table.rows.values()) == 240

    blobs_frame(n_rows=300, seed=2).to_parquet(path, index=False)  # same URI, new contents
    third = prepare(path)
    assert preprocess_calls == [str(path), str(path)]
    assert sum(third.table.rows.values()) == 300


def test_a_different_split_is_not_served_from_the_cache(tmp_path, preprocess_calls):
    path = tmp_path / "blobs.parquet"
    blobs_frame(n_rows=240, seed=3).to_parquet(path, index=False)
    for seed in (0, 1):
        prepare(path, split_seed=seed)
    assert len(preprocess_calls) == 2


def test_cache_version_follows_the_code_that_shapes_the_splits_and_no_other():
    from tasks.plumbing.code_version import code_version
    from tasks.preprocess import PREPROCESS_CODE_VERSION, SPLIT_SHAPING_MODULES

    assert code_version(*SPLIT_SHAPING_MODULES) == PREPROCESS_CODE_VERSION
    assert {"tasks.preprocess", "tasks.core.data.prepare", "tasks.core.data.reading"} <= SPLIT_SHAPING_MODULES
    shaping_less_one = SPLIT_SHAPING_MODULES - {"tasks.core.data.scaling"}
    assert code_version(*shaping_less_one) != PREPROCESS_CODE_VERSION
    # Editing training, the bundle, publishing, scoring or the Flyte plumbing leaves users' cached splits alone.
    assert not {
        m
        for m in SPLIT_SHAPING_MODULES
        if m.startswith(
            (
                "tasks.core.training",
                "tasks.core.bundle",
                "tasks.core.publish",
                "tasks.core.scoring",
                "tasks.plumbing",
            )
        )
    }
    tasks = (
        preprocess_module.preprocess,  # one pod, and each step of the pieces
        preprocess_module.assign_piece_splits,
        preprocess_module.piece_encoding_stats,
        preprocess_module.fit_piece_encoding,
        preprocess_module.fit_piece_scaler,
        preprocess_module.write_piece_splits,
        preprocess_module.collect_piece_splits,
    )
    for task in tasks:
        assert task.metadata.cache and task.metadata.cache_version == PREPROCESS_CODE_VERSION, task.name


def test_a_cached_split_whose_files_were_removed_fails_before_any_worker_starts(
    tmp_path, preprocess_calls, monkeypatch
):
    """A cached preparation outlives the temporary folder holding its splits (a reboot, a cleaner):
    training refuses it at the launcher, naming the split and the way out, instead of every rank
    failing on a missing file and elastic restarting the group."""
    import torch.distributed.launcher.api as launcher

    from tasks.train_torch import train_torch

    path = tmp_path / "blobs.parquet"
    blobs_frame(n_rows=240, seed=4).to_parquet(path, index=False)
    train_split = dataset_uri(prepare(path).train)
    shutil.rmtree(train_split)
    stale = prepare(path)
    assert len(preprocess_calls) == 1 and dataset_uri(stale.train) == train_split  # served from the cache

    launches = []
    monkeypatch.setattr(launcher, "elastic_launch", lambda config, entrypoint: launches.append(config))
    with pytest.raises(FileNotFoundError) as gone:
        train_torch.execute(prepared=stale, hyperparameters=TrainConfig(batch_size=32))
    assert launches == []
    assert f"the train split at {train_split} is gone" in str(gone.value)
    assert "--overwrite-cache" in str(gone.value)
    with pytest.raises(FileNotFoundError, match="the train split at .* is gone"):
        stale.local_splits()  # what a worker or the TensorFlow task reads


def test_remote_splits_are_not_checked_or_fetched_before_the_launch(tmp_path, monkeypatch):
    """Only the local split is checked; the remote one is neither looked up nor downloaded (the bucket
    does not exist: touching it would fail)."""
    from flytekit.core.data_persistence import FileAccessProvider

    fetched = []
    for method in ("get", "get_data", "download", "download_directory", "exists"):
        monkeypatch.setattr(FileAccessProvider, method, lambda *args, _m=method, **kw: fetched.append(_m))
    remote = StructuredDataset(uri="s3://no-such-bucket/prepared/train")
    present, gone = tmp_path / "val", tmp_path / "test"
    present.mkdir()

    require_local_copies({"train split": remote, "val split": StructuredDataset(uri=str(present))})
    with pytest.raises(FileNotFoundError, match=f"the test split at {gone} is gone"):
        require_local_copies({"train split": remote, "test split": StructuredDataset(uri=str(gone))})
    assert fetched == []
