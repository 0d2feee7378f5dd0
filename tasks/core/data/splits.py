"""Reading the prepared splits back: what the training loops and evaluation read."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tasks.core.data.files import parquet_split
from tasks.core.data.split_codes import expanded_features, split_coded, stored_columns

SPLITS = ("train", "val", "test")  # the prepared splits, in the order rows are assigned to them


def read_split(path: str, feature_names: list[str], label_column: str) -> tuple[np.ndarray, np.ndarray]:
    """A whole prepared split (a parquet file or directory) as (features float32, label codes int64):
    the standardised train and val splits the training loops read, categories expanded from their codes
    (`batch_features`)."""
    split = parquet_split(path)
    table = split.to_table(columns=[*stored_columns(split.schema, feature_names), label_column])
    return batch_features(table, feature_names), label_array(table.column(label_column).to_numpy())


def batch_features(
    batch: pa.RecordBatch | pa.Table, features: list[str], dtype: type = np.float32
) -> np.ndarray:
    """The batch's `features` (rows x features, `dtype`): read from the columns of those names, or, in a
    standardised split that stores categories as codes, expanded from those (split_codes.py). Every
    reader of a prepared split reads its features through here."""
    if coded := split_coded(batch.schema):
        return expanded_features(batch, features, coded, column_values, dtype)
    return np.column_stack([column_values(batch.column(name)).astype(dtype, copy=False) for name in features])


def column_values(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric column as numpy: decimals as float64 (numpy would hold them as Python objects)."""
    if pa.types.is_decimal(column.type):
        column = pc.cast(column, pa.float64())
    return column.to_numpy(zero_copy_only=False)


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
