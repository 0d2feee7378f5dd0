from __future__ import annotations

import numpy as np
import pandas as pd
import pytest


def blobs_frame(n_rows: int = 300, n_features: int = 4, n_classes: int = 3, seed: int = 0) -> pd.DataFrame:
    """Well-separated Gaussian blobs: a table any working classifier learns."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, n_classes, size=n_rows)
    centers = rng.normal(scale=6.0, size=(n_classes, n_features))
    features = centers[labels] + rng.normal(size=(n_rows, n_features))
    frame = pd.DataFrame(features, columns=[f"f{i}" for i in range(n_features)])
    frame["species"] = np.array(["setosa", "versicolor", "virginica", "other"])[labels % 4]
    return frame


@pytest.fixture(scope="session", autouse=True)
def isolated_local_cache(tmp_path_factory):
    """Local runs cache preprocessing; keep the tests' cache apart from the user's."""
    from flytekit.core import local_cache

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_cache, "CACHE_LOCATION", str(tmp_path_factory.mktemp("flyte-local-cache")))
        patch.setattr(local_cache.LocalTaskCache, "_initialized", False)
        yield
    local_cache.LocalTaskCache._initialized = False


@pytest.fixture
def blobs() -> pd.DataFrame:
    return blobs_frame()


@pytest.fixture
def write_table(tmp_path):
    """Write a DataFrame as parquet or CSV and return its path."""

    def write(frame: pd.DataFrame, name: str = "data.parquet") -> str:
        path = tmp_path / name
        if name.endswith(".csv"):
            frame.to_csv(path, index=False)
        else:
            frame.to_parquet(path, index=False)
        return str(path)

    return write


@pytest.fixture(scope="session")
def blob_splits(tmp_path_factory):
    """Prepared train/val/test parquet splits of `blobs_frame`, as the training loop reads them."""
    from tasks.core.config import SplitPaths
    from tasks.core.data import SplitConfig, prepare_dataset

    root = tmp_path_factory.mktemp("blobs")
    source = root / "blobs.parquet"
    blobs_frame(n_rows=400).to_parquet(source, index=False)
    prepared = prepare_dataset(str(source), "species", str(root / "prepared"), SplitConfig(seed=0))
    return SplitPaths(
        train=prepared.paths["train"],
        val=prepared.paths["val"],
        feature_names=prepared.feature_names,
        label_column="species",
        n_classes=len(prepared.class_labels),
    )


@pytest.fixture(scope="session")
def flyte_package(tmp_path_factory):
    """`make package` once per session, parsed back into protobufs."""
    from tests.flyte_package import build_package, read_package

    return read_package(build_package(tmp_path_factory.mktemp("package")))
