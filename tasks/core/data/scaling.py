"""Standardisation: per-feature moments of the train rows' encoded features, from the columns'
statistics; the scaler fitted on them, and its checks."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from tasks.core.data.column_stats import ColumnStats
from tasks.core.data.encoding import ColumnEncoding, EncodingStats, FittedEncoding, check_columns
from tasks.core.data.files import DatasetError
from tasks.core.data.kind_records import RECORDS
from tasks.core.data.moments import FeatureMoments
from tasks.core.data.split_codes import SplitLayout, code_type, is_coded

# Units in the last place of a feature's mean within which its spread is taken as rounding (`near_constant`).
MEAN_ROUNDING_ULPS = 4


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


def encoded_moments(stats: EncodingStats, encoding: FittedEncoding) -> FeatureMoments:
    """The moments of the train rows' encoded features (`encoding.transform`), from the columns'
    statistics (column_stats.py) rather than another pass over the rows: within float64 rounding of
    `FeatureMoments.of(encoding.transform(train_rows))`. A categorical column beyond `COUNT_CAP`
    distinct values counts its vocabulary's values within the summary's bound (`CategoryStats`)."""
    return FeatureMoments.joined(
        [part for column in encoding.columns for part in column_moments(column, stats.columns[column.name])]
    )


def column_moments(column: ColumnEncoding, stats: ColumnStats) -> list[FeatureMoments]:
    """The moments of each of the column's encoded features, from its statistics."""
    encoder = column.encoder
    indicator = [FeatureMoments.of_counts([0, 1], [stats.count, stats.missing])] if encoder.indicator else []
    return [*RECORDS[column.kind].moments(encoder, stats), *indicator]


def train_scaler(stats: EncodingStats, encoding: FittedEncoding, uri: str) -> ScalerStats:
    """The standardisation of the encoded features that the train rows' statistics give. A category's
    one-hot columns stay 0 and 1 (mean 0, scale 1), as scikit-learn's pipelines leave a OneHotEncoder's
    output: standardised, a value in 2 of 1,400 train rows becomes 26 where it is present, an input a
    network fits those rows by (on 2,000-row tables of long-tailed categories the default network's mean
    test accuracy over three splits rose from 0.603 to 0.676 and from 0.689 to 0.708 without it;
    docs/benchmarks.md#tuning)."""
    scaler = fitted_scaler(encoded_moments(stats, encoding), encoding.encoded_names(), uri)
    kept = np.concatenate(
        [
            np.full(column.encoder.width(), not RECORDS[column.kind].standardised)
            for column in encoding.columns
        ]
    )
    mean, scale = np.asarray(scaler.mean), np.asarray(scaler.scale)
    return ScalerStats(np.where(kept, 0.0, mean).tolist(), np.where(kept, 1.0, scale).tolist())


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
    """A variance within its rounding error of 0. scikit-learn's bound (Chan, Golub and LeVeque) takes
    the mean's error to grow with the rows, (count * mean * eps)**2; here every mean comes from an exact
    sum, rounded once, and squared deviations are taken from it, so the error stays within a few units
    in the mean's last place whatever the count: with the larger bound, 1,000 distinct 17-digit ids
    (a spread of hundreds about 1e16) were taken as constant and scaled by 1."""
    eps, count = np.finfo(np.float64).eps, moments.count
    with np.errstate(over="ignore"):
        rounding = (MEAN_ROUNDING_ULPS * moments.mean * eps) ** 2
        return moments.variance <= count * eps * moments.variance + rounding


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
