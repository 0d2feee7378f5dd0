"""Reading the prepared splits back: what the training loops and evaluation read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow.dataset as ds

from tasks.core.data.files import parquet_format


def read_split(path: str, feature_names: list[str], label_column: str) -> tuple[np.ndarray, np.ndarray]:
    """A whole prepared split (a parquet file or directory) as (features float32, label codes int64):
    the standardised train and val splits the training loops read."""
    table = ds.dataset(path, format=parquet_format()).to_table(columns=[*feature_names, label_column])
    features = np.column_stack([table.column(n).to_numpy() for n in feature_names]).astype(np.float32)
    return features, table.column(label_column).to_numpy().astype(np.int64)


@dataclass
class SplitPaths:
    train: str
    val: str
    feature_names: list[str]
    label_column: str
    n_classes: int
