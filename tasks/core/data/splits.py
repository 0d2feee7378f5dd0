"""Reading the prepared splits back: what the training loops and evaluation read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow.dataset as ds

from tasks.core.data.files import parquet_format
from tasks.core.data.scaling import batch_features
from tasks.core.data.split_codes import stored_columns


def read_split(path: str, feature_names: list[str], label_column: str) -> tuple[np.ndarray, np.ndarray]:
    """A whole prepared split (a parquet file or directory) as (features float32, label codes int64):
    the standardised train and val splits the training loops read, categories expanded from their codes
    (`batch_features`)."""
    split = ds.dataset(path, format=parquet_format())
    table = split.to_table(columns=[*stored_columns(split.schema, feature_names), label_column])
    return batch_features(table, feature_names), label_array(table.column(label_column).to_numpy())


def label_array(values: np.ndarray) -> np.ndarray:
    """A split's labels as the loops read them: class codes int64, or a regression's standardised
    label float32."""
    return values.astype(np.float32 if values.dtype.kind == "f" else np.int64)


@dataclass
class SplitPaths:
    train: str
    val: str
    feature_names: list[str]
    label_column: str
    n_classes: int  # 0 for a regression
    regression: bool = False

    @property
    def n_outputs(self) -> int:
        """The model's output width: a logit per class, or the one predicted number."""
        return 1 if self.regression else self.n_classes
