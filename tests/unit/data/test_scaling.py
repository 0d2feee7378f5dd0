"""scaling.py: standardisation fitted on the train rows only, in float64: extreme magnitudes are
standardised, and refused by column only where they cannot be represented."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from benchmarks.tables import Churn
from tasks.core.data.column_kinds import DATE, KINDS, propose_kinds
from tasks.core.data.encoding import EncodingStats, batch_stats
from tasks.core.data.files import DatasetError
from tasks.core.data.moments import FeatureMoments
from tasks.core.data.scaling import (
    ScalerStats,
    check_standardised,
    encoded_moments,
    standardise,
    train_scaler,
)
from tests.conftest import blobs_frame
from tests.unit.data.tables import prepare, prepare_unchanged, refusal, split_features, split_frames


def test_scaler_is_fitted_on_train_only(blobs, write_table, tmp_path):
    blobs.loc[:, "f1"] = blobs["f1"] * 10 + 100
    prepared = prepare(write_table(blobs), tmp_path)
    frames = split_frames(prepared)
    train = frames["train"][prepared.table.feature_names].to_numpy()
    np.testing.assert_allclose(train.mean(axis=0), 0.0, atol=1e-5)
    np.testing.assert_allclose(train.std(axis=0), 1.0, atol=1e-4)
    whole_data_mean = blobs[prepared.table.feature_names].mean().to_numpy()
    assert not np.allclose(prepared.table.scaler.mean, whole_data_mean, rtol=0, atol=1e-6)


# --- extreme magnitudes: standardised in float64, refused by name only when unrepresentable --------


def scaled(column: str, factor: float) -> Callable[[pd.DataFrame], pd.DataFrame]:
    return lambda frame: frame.assign(**{column: frame[column] * factor})


def lone_value(value: float) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """f0 zero but in one row: in training its variance overflows; elsewhere the training rows'
    scale of 1 leaves it beyond float32's range. Refused either way."""
    return lambda frame: frame.assign(f0=np.where(frame.index == 17, value, 0.0))


PREPARED_MAGNITUDES = {
    "tiny values": scaled("f0", 1e-46),
    "huge values": scaled("f1", 1e39),
    "a tiny constant": lambda frame: frame.assign(f2=1e-46),
    "a huge constant": lambda frame: frame.assign(f3=1e39),
    "a constant near float64's limit": lambda frame: frame.assign(f3=1e300),
}


@pytest.mark.parametrize("case", sorted(PREPARED_MAGNITUDES))
def test_extreme_magnitudes_are_standardised(tmp_path, case):
    path = tmp_path / "data.parquet"
    PREPARED_MAGNITUDES[case](blobs_frame()).to_parquet(path, index=False)
    prepared = prepare_unchanged(path, tmp_path)
    train = split_features(prepared, "train")
    assert np.isfinite(train).all() and np.isfinite(prepared.table.scaler.scale).all()
    varies = train.std(axis=0) > 0
    np.testing.assert_allclose(train.std(axis=0)[varies], 1.0, rtol=1e-4)
    np.testing.assert_array_equal(train[:, ~varies], 0.0)  # a constant column
    np.testing.assert_array_equal(np.asarray(prepared.table.scaler.scale)[~varies], 1.0)  # as scikit-learn


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_column_of_17_digit_ids_is_standardised_by_its_spread(tmp_path, suffix):
    """Hundreds apart about 1e16: scikit-learn's rounding bound took their variance for rounding and
    left them unscaled, inputs of +-500 that drowned the other features."""
    frame = blobs_frame().assign(id=12_345_678_901_234_567 + np.arange(len(blobs_frame())))
    path = tmp_path / f"data{suffix}"
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path, index=False)
    prepared = prepare(str(path), tmp_path)
    train = split_features(prepared, "train")[:, prepared.table.feature_names.index("id")]
    assert prepared.table.scaler.scale[prepared.table.feature_names.index("id")] > 1.0
    assert abs(train).max() < 2.0
    np.testing.assert_allclose(train.std(), 1.0, rtol=1e-4)


REFUSED_MAGNITUDES = {
    "differences that underflow": (scaled("f0", 1e-170), "differ by too little"),
    "values whose variance overflows": (scaled("f0", 1e200), "too large"),
    "a lone huge value": (lone_value(1e300), "rescale the column"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_MAGNITUDES))
def test_unrepresentable_magnitudes_are_refused_by_column(tmp_path, case):
    mutate, expected = REFUSED_MAGNITUDES[case]
    path = tmp_path / "data.parquet"
    mutate(blobs_frame()).to_parquet(path, index=False)
    message = refusal(path, tmp_path)
    assert f"{path}: feature column 'f0'" in message and expected in message


def test_a_standardised_value_beyond_float32_names_the_column_and_row():
    raw = np.array([[0.0, 1.0], [2.0, 1e39]])
    with np.errstate(over="ignore"):
        values = standardise(raw, ScalerStats(mean=[0.0, 0.0], scale=[1.0, 1.0]))
    with pytest.raises(DatasetError, match=r"in.csv: feature column 'g' at row 11 holds 1e\+39"):
        check_standardised(values, raw, ["f", "g"], 10, "in.csv")


# --- the encoded features' moments, from the columns' statistics ------------------------------------


def churn_table(rows: int) -> pa.Table:
    """The churn table (text with gaps and a long tail, numbers with gaps, a boolean with gaps, a
    timestamp with gaps), a constant number with gaps, a boolean without any and free text with gaps
    (names mostly distinct whose words recur, taken for text)."""
    rng = np.random.default_rng(7)
    table = Churn(seed=7).chunk(rng, rows).drop_columns(["label"])
    constant = pa.array(np.where(rng.random(rows) < 0.1, np.nan, 3.25), from_pandas=True)
    words = rng.choice(["red", "green", "blue", "big", "small", "old"], size=(rows, 3))
    names = [
        f"{a} {b}-{c} {code}" for (a, b, c), code in zip(words, rng.integers(0, 10**6, rows), strict=True)
    ]
    return (
        table.append_column("fixed", constant)
        .append_column("flag", pa.array(rng.random(rows) < 0.3))
        .append_column("note", pa.array(names, mask=rng.random(rows) < 0.1))
    )


@pytest.mark.parametrize("batches", [1, 7])
def test_the_moments_from_statistics_are_those_of_the_encoded_rows(batches):
    """The moments `train_scaler` standardises with, from the statistics one pass merged, in any
    batching, against those of the encoded rows themselves."""
    table = churn_table(5_000)
    kinds = propose_kinds(table.schema, table.column_names, sample=table.to_batches()[0])
    stats = EncodingStats.empty(kinds)
    for chunk in np.array_split(np.arange(table.num_rows), batches):
        stats = stats.merge(batch_stats(kinds, table.take(chunk)))
    encoding = stats.fit()
    assert {column.kind for column in encoding.columns} == set(KINDS)
    assert any(column.encoder.indicator for column in encoding.columns if column.kind == DATE)
    want = FeatureMoments.of(encoding.transform(table))
    got = encoded_moments(stats, encoding)
    assert got.count == want.count == table.num_rows
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.m2, want.m2, rtol=1e-9, atol=1e-9)
    np.testing.assert_array_equal(got.low, want.low)
    np.testing.assert_array_equal(got.high, want.high)


def test_a_number_whose_squares_overflow_is_refused_after_merging():
    """A variance that overflows float64 is refused by column, also where each batch's own fitted."""
    values = pa.table({"big": [1e200, -1e200, 3e200, 0.0]})
    kinds = propose_kinds(values.schema, ["big"])
    stats = batch_stats(kinds, values.slice(0, 2)).merge(batch_stats(kinds, values.slice(2)))
    assert stats.columns["big"].m2 == np.inf
    with pytest.raises(DatasetError, match="feature column 'big' holds values too large to standardise"):
        train_scaler(stats, stats.fit(), "data.parquet")
