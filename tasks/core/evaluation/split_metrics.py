"""A prepared split's metrics as the bundle scores it, streamed the way scoring streams a table."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pyarrow.dataset as ds

from tasks.core.bundle.loading import Bundle, finite_rows, scored_batches
from tasks.core.data.api import iter_batches, parquet_split, row_group_fragments
from tasks.core.evaluation.metrics import (
    ClassificationMetrics,
    ConfusionCounts,
    RegressionMetrics,
    metrics_from_confusion,
    regression_metrics,
)

# ---- a prepared split's metrics ------------------------------------------------------------------------


def split_metrics(
    bundle: Bundle, path: str, label_column: str, class_labels: list[str]
) -> ClassificationMetrics:
    """The metrics of a prepared split (the raw feature columns as the input held them, class codes in
    `label_column`) as the bundle scores it: by `scored_batches`, as scoring the same rows does, streamed
    one row group at a time: memory holds a record batch and the confusion counts. Rows whose outputs are
    not finite are counted and left out, as scoring leaves them out."""
    split = parquet_split(path)
    by_row_group = [part for fragment in split.get_fragments() for part in row_group_fragments(fragment)]
    split = ds.FileSystemDataset(by_row_group, split.schema, split.format, split.filesystem)
    confusion, non_finite = ConfusionCounts(len(class_labels)), 0
    for batch, probabilities in scored_batches(bundle, split, path):
        finite = finite_rows(probabilities)
        non_finite += int((~finite).sum())
        confusion.add(batch.column(label_column).to_numpy()[finite], probabilities[finite].argmax(axis=1))
    return replace(metrics_from_confusion(confusion.counts, class_labels), non_finite_rows=non_finite)


def split_numbers(bundle: Bundle, path: str, label_column: str) -> tuple[np.ndarray, np.ndarray]:
    """A regression's (actual, predicted) on a prepared split (the raw feature columns and the label
    as read), float64, one record batch at a time; a row whose output is not finite predicts NaN."""
    split = parquet_split(path)
    actual, predicted, rows = [], [], 0
    for batch in iter_batches(split, path):
        predicted.append(bundle.predict_numbers(batch, path, rows))
        actual.append(batch.column(label_column).to_numpy(zero_copy_only=False).astype(np.float64))
        rows += batch.num_rows
    return np.concatenate(actual), np.concatenate(predicted)


def regression_split_metrics(bundle: Bundle, actual: np.ndarray, predicted: np.ndarray) -> RegressionMetrics:
    """The figures of `split_numbers`' rows; rows whose output is not finite counted and left out."""
    finite = np.isfinite(predicted)
    return regression_metrics(actual[finite], predicted[finite], bundle.target.mean, int((~finite).sum()))
