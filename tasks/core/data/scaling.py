"""Standardisation: per-feature moments of the train rows' encoded features, the scaler fitted on them,
and its checks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from tasks.core.data.encoding import FittedEncoding, check_columns
from tasks.core.data.files import DatasetError
from tasks.core.data.moments import FeatureMoments
from tasks.core.data.reading import iter_batches
from tasks.core.data.split_codes import SplitLayout, code_type, is_coded
from tasks.core.data.splits import SPLITS


@dataclass
class ScalerStats:
    """Per-feature standardisation fitted on the training split: x' = (x - mean) / scale."""

    mean: list[float]
    scale: list[float]


def standardise(raw: np.ndarray, scaler: ScalerStats) -> np.ndarray:
    """Raw float64 features as the model's float32 input: computed in float64, cast once, so the
    prepared splits and the bundle's loader give the model bit-identical rows."""
    scaled = raw - np.asarray(scaler.mean, dtype=np.float64)
    scaled /= np.asarray(scaler.scale, dtype=np.float64)
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf: check_standardised names it
        return scaled.astype(np.float32)


def standardised_features(
    encoding: FittedEncoding,
    batch: pa.RecordBatch,
    scaler: ScalerStats,
    features: list[str],
    first_row: int,
    uri: str,
) -> np.ndarray:
    """The batch's rows encoded and standardised, features x rows (float32): what `standardise` gives
    of `encoding.transform`, bit for bit, written in one pass (`FittedEncoding.transform_scaled`).
    A value beyond float32's range is refused as `check_standardised` refuses it."""
    mean, scale = np.asarray(scaler.mean, dtype=np.float64), np.asarray(scaler.scale, dtype=np.float64)
    with np.errstate(over="ignore"):  # refused by name below
        scaled = encoding.transform_scaled(batch, mean, scale, first_row, uri)
    if not np.isfinite(scaled).all():
        raw = encoding.transform(batch, first_row, uri)
        check_standardised(standardise(raw, scaler), raw, features, first_row, uri)
    return scaled


def split_columns(
    encoding: FittedEncoding,
    batch: pa.RecordBatch,
    scaler: ScalerStats,
    layout: SplitLayout,
    first_row: int,
    uri: str,
) -> list[np.ndarray]:
    """The batch's rows as a standardised split stores them (`layout`): each float32 feature column of
    `standardised_features`, bit for bit, but a categorical feature as one column of codes
    (split_codes.py). A value beyond float32's range is refused as `standardised_features` refuses it."""
    check_columns(batch.schema.names, [column.name for column in encoding.columns], uri)
    mean, scale = np.asarray(scaler.mean, dtype=np.float64), np.asarray(scaler.scale, dtype=np.float64)
    columns, start = [], 0
    for column in encoding.columns:
        part = slice(start, start + column.encoder.width())
        start = part.stop
        if is_coded(column):
            codes = column.category_codes(batch.column(column.name), first_row, uri)
            columns.append(codes.astype(code_type(column.encoder.width()).to_pandas_dtype()))
            continue
        block = np.empty((part.stop - part.start, batch.num_rows), dtype=np.float32)
        with np.errstate(over="ignore"):  # refused by name below
            column.write_scaled(batch.column(column.name), mean[part], scale[part], block, first_row, uri)
        columns += list(block)
    if not all_finite(columns, layout):
        standardised_features(encoding, batch, scaler, encoding.encoded_names(), first_row, uri)
    return columns


def all_finite(columns: list[np.ndarray], layout: SplitLayout) -> bool:
    """Every stored float and every value a code column expands to within float32's range."""
    floats = (column for column in columns if column.dtype.kind == "f")
    expanded = (values for f in layout.coded.values() for values in (f.off, f.on))
    return all(np.isfinite(values).all() for values in (*floats, *expanded))


def train_moments(
    dataset: ds.Dataset, uri: str, encoding: FittedEncoding, assignment: np.ndarray
) -> FeatureMoments:
    """The moments of the train rows' encoded features (`encoding.transform`, `encoded_moments`), merged
    batch by batch. `assignment` holds the splits of the dataset's rows; their values were checked as the
    encoding's statistics were gathered."""
    moments = FeatureMoments.empty(len(encoding.encoded_names()))
    columns = [column.name for column in encoding.columns]
    offset = 0
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing statistic is refused by name later
        for batch in iter_batches(dataset, uri, columns=columns):
            in_train = assignment[offset : offset + batch.num_rows] == SPLITS.index("train")
            offset += batch.num_rows
            if in_train.any():
                moments = moments.merge(encoded_moments(encoding, batch.filter(pa.array(in_train)), uri))
    return moments


def encoded_moments(encoding: FittedEncoding, batch: pa.RecordBatch, uri: str) -> FeatureMoments:
    """`FeatureMoments.of(encoding.transform(batch))`, bit for bit, without building the one-hot columns
    in float64: those come from each categorical column's codes (`category_moments`), the others from
    their encoded block. numpy sums each column of a matrix of two or more columns row after row
    (one column alone pairwise), so a block's sums are those of the whole matrix."""
    widths = [column.encoder.width() for column in encoding.columns]
    if sum(widths) < 2 or not batch.num_rows or not any(map(is_coded, encoding.columns)):
        return FeatureMoments.of(encoding.transform(batch, source=uri))
    stats = np.empty((4, sum(widths)))  # mean, m2, low, high
    starts = np.cumsum([0, *widths])
    dense = [index for index, column in enumerate(encoding.columns) if not is_coded(column)]
    if dense:
        block = FittedEncoding([encoding.columns[index] for index in dense], {}).transform(batch, source=uri)
        at = np.concatenate([np.arange(starts[index], starts[index + 1]) for index in dense])
        stats[:, at] = moment_rows(FeatureMoments.of(np.pad(block, ((0, 0), (0, 1)))))[:, : len(at)]
    for index, column in enumerate(encoding.columns):
        if is_coded(column):
            codes = column.category_codes(batch.column(column.name), 0, uri)
            stats[:, starts[index] : starts[index + 1]] = category_moments(codes, widths[index])
    return FeatureMoments(batch.num_rows, *stats)


def moment_rows(moments: FeatureMoments) -> np.ndarray:
    return np.stack([moments.mean, moments.m2, moments.low, moments.high])


def category_moments(codes: np.ndarray, width: int) -> np.ndarray:
    """The mean, m2, low and high of the one-hot columns of `codes`, as `FeatureMoments.of` computes
    them: a column's sum is its count of ones (exact), and each squared deviation one of two values."""
    rows = len(codes)
    counts = np.bincount(codes, minlength=width).astype(np.float64)
    mean = counts / rows
    squares = np.empty((rows, width))
    squares[:] = np.square(0.0 - mean)
    squares[np.arange(rows), codes] = np.square(1.0 - mean)[codes]
    return np.stack([mean, squares.sum(axis=0), (counts == rows).astype(float), (counts > 0).astype(float)])


def fitted_scaler(moments: FeatureMoments, features: list[str], uri: str) -> ScalerStats:
    """The standardisation the train rows' moments give, refused by column where float64 cannot hold it."""
    constant = moments.constant
    check_scaler(moments.mean, moments.variance, constant, features, uri)
    # A column constant in training standardises to exactly 0: its value as the mean (a running mean
    # of 1e39s is off by rounding) and scale 1, as scikit-learn's StandardScaler scales a column whose
    # variance is within rounding of 0.
    with np.errstate(over="ignore", invalid="ignore"):
        scale = np.where(constant | near_constant(moments), 1.0, np.sqrt(moments.variance))
    return ScalerStats(mean=np.where(constant, moments.low, moments.mean).tolist(), scale=scale.tolist())


def near_constant(moments: FeatureMoments) -> np.ndarray:
    """scikit-learn's bound on the rounding error of a computed variance (Chan, Golub and LeVeque)."""
    eps, count = np.finfo(np.float64).eps, moments.count
    with np.errstate(over="ignore"):
        return moments.variance <= count * eps * moments.variance + (count * moments.mean * eps) ** 2


def check_scaler(
    mean: np.ndarray, var: np.ndarray, constant: np.ndarray, features: list[str], uri: str
) -> None:
    """Statistics float64 cannot hold: values so large that their mean or variance overflows, or
    differences so small that the variance underflows (a scale of 0 would make the column constant)."""
    for index, name in enumerate(features):
        if constant[index]:  # standardises to 0 whatever its value
            continue
        if not (np.isfinite(mean[index]) and np.isfinite(var[index])):
            raise DatasetError(
                f"{uri}: feature column '{name}' holds values too large to standardise (their mean or "
                "variance overflows float64); rescale the column, e.g. divide it by a power of ten"
            )
        if var[index] < np.finfo(np.float64).tiny:
            raise DatasetError(
                f"{uri}: feature column '{name}' holds values that differ by too little to standardise "
                f"(their variance {var[index]:.3g} underflows float64); rescale the column, e.g. "
                "multiply it by a power of ten"
            )


def check_standardised(
    scaled: np.ndarray, raw: np.ndarray, features: list[str], first_row: int, uri: str
) -> None:
    """Every standardised value within float32's range, which is what the model reads."""
    if np.isfinite(scaled).all():
        return
    row, column = np.argwhere(~np.isfinite(scaled))[0]
    raise DatasetError(
        f"{uri}: feature column '{features[column]}' at row {first_row + row} holds {raw[row, column]:.6g}, "
        "which standardised by the training rows' mean and scale is beyond float32's range; "
        "rescale the column or drop the row"
    )
